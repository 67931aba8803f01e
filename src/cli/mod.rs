//! The `clinstream` command line: parsing (clap), dispatch, and the tools that are not the worker — `produce`
//! (events onto a topic), `search`, `bench`, `docs` (explain, the errors table), `kg materialize`. The top layer:
//! it may use every module below; nothing imports it. Start-up errors are reported with context (this is the
//! only place that uses `anyhow`); exit statuses are documented in docs/errors.md.

pub mod bench;
pub mod docs;
pub mod produce;
pub mod search;
pub mod serve_bench;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::app::{self, RunOptions};
use crate::config::Settings;
use crate::source::file::Input;

/// Exit status when the run finished but dead-lettered at least one event.
const EXIT_DEAD_LETTERS: u8 = 3;

#[derive(Parser)]
#[command(name = "clinstream", version, about = "Clinical notes (FHIR DocumentReference) to structured data")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Process DocumentReference events: from files, directories or stdin into DIR (--input), or from Kafka
    /// into the output topics (no --input, `kafka.enabled = true`; runs until SIGTERM/SIGINT).
    Run {
        /// Configuration file (TOML), layered over the built-in defaults; CLINSTREAM__* env vars override it.
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        /// NDJSON / Bundle / Bulk-FHIR file, a directory, or `-` for stdin. Repeatable.
        #[arg(long, short, num_args = 1..)]
        input: Vec<String>,
        /// Output directory (notes.ndjson, dead_letters.ndjson).
        #[arg(long, short, default_value = "out")]
        out: PathBuf,
        /// Write note text into the outputs (off by default: outputs hold offsets, not PHI).
        #[arg(long)]
        include_text: bool,
        /// Do not draw a progress bar.
        #[arg(long)]
        no_progress: bool,
        /// Text stages only: no chunk embedding and no vector store (same as `embed.enabled = false`).
        #[arg(long)]
        no_embed: bool,
    },
    /// Search the indexed chunks (dense + BM25 fused by RRF) in the configured store — by default the embedded
    /// store that `clinstream run` writes (`store.path`, relative to the working directory).
    Search {
        /// What to look for.
        #[arg(long, short)]
        query: String,
        /// Only this patient's chunks (the FHIR reference as indexed, e.g. `Patient/123`).
        #[arg(long)]
        patient: Option<String>,
        /// Only chunks of this section (canonical name, e.g. `assessment_and_plan`).
        #[arg(long)]
        section: Option<String>,
        #[arg(long, short = 'k', default_value_t = 5)]
        top: usize,
        /// Print the hits with their whole payload as JSON lines.
        #[arg(long)]
        json: bool,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Serve the query API (`POST /v1/context`, `POST /v1/search`, /metrics, /healthz, /readyz) on `serve.addr`
    /// over the configured store; runs until SIGTERM/SIGINT. Auth: `serve.api_keys` (docs/read-side.md).
    Serve {
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// The CLEAR context for a question about one patient, from the configured store: what `POST /v1/context`
    /// answers, computed by the same code. Prints note text (you asked for it); logs never do.
    Context {
        /// The patient reference as the notes carry it (`Patient/123`) or a bare id.
        #[arg(long)]
        patient: String,
        #[arg(long, short)]
        question: String,
        /// Token budget (default `serve.default_budget_tokens`).
        #[arg(long)]
        budget: Option<usize>,
        /// Only notes on or after / before this day (YYYY-MM-DD).
        #[arg(long)]
        since: Option<String>,
        #[arg(long)]
        until: Option<String>,
        /// Only notes of this type (repeatable).
        #[arg(long = "type")]
        document_types: Vec<String>,
        /// Only mentions in this section (canonical name; repeatable).
        #[arg(long = "section")]
        sections: Vec<String>,
        /// The CLEAR windows only: do not fill the rest of the budget with chunks (`serve.fill`).
        #[arg(long)]
        no_fill: bool,
        /// Print the response as JSON (the API's body).
        #[arg(long)]
        json: bool,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Publish DocumentReference events (NDJSON, Bundles, Bulk-FHIR, `-` for stdin) onto a Kafka topic, keyed by
    /// resource id, using the `kafka.*` connection settings.
    Produce {
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, short, required = true, num_args = 1..)]
        input: Vec<String>,
        /// Topic (default: the first of `kafka.topics`).
        #[arg(long, short)]
        topic: Option<String>,
        /// Create the worker's topics first (as `kafka.create_topics` does).
        #[arg(long)]
        create_topics: bool,
    },
    /// Inspect the configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Measure extraction quality on a labelled set.
    Eval {
        #[command(subcommand)]
        command: EvalCommand,
    },
    /// Show what the text stages make of a piece of text: sections, mentions with assertions, variable labels.
    /// For tuning vocabularies and variable definitions; prints the text you give it.
    Explain {
        /// The text (or `-` to read stdin).
        #[arg(long)]
        text: String,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Benchmark helpers (see bench/run.sh and `make bench`).
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Knowledge-graph tools.
    Kg {
        #[command(subcommand)]
        command: KgCommand,
    },
    /// Vocabulary tools.
    Vocab {
        #[command(subcommand)]
        command: VocabCommand,
    },
    /// Print the query service's OpenAPI document (docs/openapi.json), generated from the code.
    Openapi,
    /// List the error codes with their dispositions.
    Errors {
        /// Print as a Markdown table (docs/errors.md).
        #[arg(long)]
        markdown: bool,
    },
}

#[derive(Subcommand)]
enum EvalCommand {
    /// NegEx / genConText kit: concept-in-sentence pairs with negation, temporality and experiencer labels.
    Negex {
        /// The kit's TSV (report, concept, sentence, negation, temporality, experiencer).
        #[arg(long)]
        pairs: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Print each misclassified pair to stderr (development aid; the kit is de-identified).
        #[arg(long)]
        show_errors: bool,
    },
    /// Open-i chest X-ray reports against NegBio labels (cardiomegaly, effusion, pneumonia, pneumothorax, edema).
    Openi {
        #[arg(long)]
        reports: PathBuf,
        #[arg(long)]
        labels: PathBuf,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Print each misclassified report to stderr (development aid).
        #[arg(long)]
        show_errors: bool,
    },
    /// Clinical questions over patients' records (../shared/eval/qa): per strategy at the same token budget,
    /// evidence recall, answer accuracy, isolation violations and context tokens (the set's README defines them).
    Qa {
        /// DocumentReference NDJSON (the patients' notes).
        #[arg(long)]
        documents: PathBuf,
        /// Questions JSONL (`patient`, `question`, `variable`, `answer`, `evidence`).
        #[arg(long)]
        questions: PathBuf,
        /// Context budget in tokens (the embedding model's tokenizer).
        #[arg(long, default_value_t = 1024)]
        budget: usize,
        /// Comma-separated: clear (windows, then the nearest chunks in what they leave of the budget: what `serve`
        /// answers by default), clear-windows (the windows only), dense, bm25, hybrid.
        #[arg(long, default_value = "clear,clear-windows,dense,bm25,hybrid", value_delimiter = ',')]
        strategy: Vec<String>,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Where the label embeddings are cached (per model and label list).
        #[arg(long, default_value = ".cache")]
        cache_dir: PathBuf,
        /// Print each wrong answer or missed evidence to stderr (development aid on the public set).
        #[arg(long)]
        show_errors: bool,
        /// Chunks for dense, bm25 and hybrid: `words` (sentences packed to about 100 words) or `index` (the
        /// indexer's chunks and vectors under `chunking.*`, e.g. CLINSTREAM__CHUNKING__SEOS_VECTORS=composed).
        #[arg(long, default_value = "words", value_parser = ["words", "index"])]
        chunks: String,
    },
    /// Knowledge graph against Synthea's coded conditions and medications (a baseline, no target).
    KgSynthea {
        /// A Synthea bulk-FHIR export directory (DocumentReference, Condition, MedicationRequest .000.ndjson).
        #[arg(long)]
        fhir: PathBuf,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// SDOH-NLI smoking and alcohol statements.
    Sdoh {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long)]
        json: bool,
        /// Print each misjudged statement to stderr (development aid).
        #[arg(long)]
        show_errors: bool,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Time the text stages on a CSV of notes (MTSamples: column `transcription`) and print JSON.
    Text {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, default_value = "transcription")]
        column: String,
        #[arg(long)]
        limit: Option<usize>,
        /// Threads for the all-cores run (default: one per core).
        #[arg(long)]
        threads: Option<usize>,
        /// Also write the variables' target terms (JSON) for the medSpaCy side of the comparison.
        #[arg(long)]
        targets_out: Option<PathBuf>,
    },
    /// How cost grows with note length: text stages and indexing per note for real notes (median, p90, p99,
    /// longest) and synthetic notes made by concatenation; peak memory; the CLEAR context against its budget (JSON).
    Growth {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, default_value = "transcription")]
        column: String,
        /// Synthetic note lengths in CLEAR tokens (comma-separated).
        #[arg(long, value_delimiter = ',', default_values_t = [10_000usize, 20_000, 40_000, 65_000])]
        synthetic: Vec<usize>,
        /// Text stages only (no embedding).
        #[arg(long)]
        no_index: bool,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Embedding tokens/s inside the worker (handle, batching thread) against a bare ONNX Runtime loop over the
    /// same model, inputs, batch plan and threads; prints JSON with the ratio. Uses the `embed.*` settings
    /// (`--config` or CLINSTREAM__EMBED__EXECUTION_PROVIDER=cuda for the GPU).
    Embed {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, default_value = "transcription")]
        column: String,
        /// Notes to take from the CSV.
        #[arg(long, default_value_t = 200)]
        limit: usize,
        /// Alternating runs of each side; the best of each is kept.
        #[arg(long, default_value_t = 2)]
        runs: usize,
        /// Sweep: token budgets per batch to try (comma-separated; default: `embed.batch_tokens`). With a sweep the
        /// output is one JSON object per line, one per combination.
        #[arg(long, value_delimiter = ',')]
        batch_tokens: Vec<usize>,
        /// Sweep: inputs per batch at most (comma-separated; default: `embed.max_batch`).
        #[arg(long, value_delimiter = ',')]
        max_batch: Vec<usize>,
        /// Also embed the first N inputs with the fp32 `model.onnx` on the CPU provider and report the per-vector
        /// cosine (a CUDA or fp16 run against the reference).
        #[arg(long, default_value_t = 0)]
        check_cpu: usize,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Query-service latency over HTTP: indexes `--documents` into the embedded store (and a new collection on
    /// `--url`, a Qdrant server), then sends the questions as /v1/context and /v1/search from 1 and 8 clients;
    /// prints p50/p99 and requests/s per store, route and clients, with the ratios (JSON).
    Serve {
        #[arg(long)]
        documents: PathBuf,
        #[arg(long)]
        questions: PathBuf,
        #[arg(long, env = "QDRANT_URL")]
        url: Option<String>,
        /// Questions sent per run.
        #[arg(long, default_value_t = 600)]
        requests: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        clients: Vec<usize>,
        /// Keep the embedded store in this directory and the server's collection under a fixed name, and reuse
        /// each when it was fully indexed before (skips re-indexing there).
        #[arg(long)]
        keep: Option<PathBuf>,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// SEOS's vector modes side by side (`chunking.seos_vectors`: groups, sentences, composed) on the same notes:
    /// notes/s through units, shifts, plan and chunk vectors, embedded tokens per note token, and agreement with
    /// the exact method (`groups`): shared chunk starts, identical plans, cosine of the same chunk's vectors (JSON).
    /// Mode `fixed` runs fixed-size chunks beside them (`chunking.strategy = fixed`: the chunks alone are embedded).
    /// Each mode's embedding bound comes from its own model inputs through the bare ONNX Runtime loop.
    Seos {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, default_value = "transcription")]
        column: String,
        #[arg(long, default_value_t = 200)]
        limit: usize,
        #[arg(long, value_delimiter = ',', default_value = "groups,sentences,composed")]
        modes: Vec<String>,
        /// Alternating runs of each mode; the best time of each is kept.
        #[arg(long, default_value_t = 2)]
        runs: usize,
        /// Only each mode's embedding bound (its notes chunked once, its model inputs through the bare loop; no
        /// `groups` reference, no comparisons): to measure a bound right beside an end-to-end run.
        #[arg(long)]
        bound_only: bool,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Store writes as the indexer makes them (`store::Writer`), grouped (`store.group_points`) and one document at
    /// a time side by side, on the worker's runtime: documents/s on a fresh embedded store per setting (with
    /// `store.shards` shards), and with `--url` on a Qdrant server (a new collection, dropped afterwards); prints
    /// JSON with each setting's ratio to the ungrouped one.
    Store {
        /// Real notes (MTSamples: column `transcription`): the worker's own payloads, windows and BM25 vectors with
        /// fixed chunks and placeholder dense vectors; without it, synthetic documents of `--chunks` + `--windows`.
        #[arg(long)]
        csv: Option<PathBuf>,
        #[arg(long, default_value = "transcription")]
        column: String,
        #[arg(long, default_value_t = 3000)]
        docs: usize,
        /// Chunk points per document (dense + sparse vectors).
        #[arg(long, default_value_t = 12)]
        chunks: usize,
        /// Window points per document (no vectors).
        #[arg(long, default_value_t = 24)]
        windows: usize,
        /// Documents writing at once (the worker's `pipeline.in_flight`).
        #[arg(long, default_value_t = 256)]
        concurrency: usize,
        /// `store.group_points` settings to compare (0 = ungrouped).
        #[arg(long, value_delimiter = ',', default_value = "0,2048")]
        groups: Vec<usize>,
        #[arg(long, env = "QDRANT_URL")]
        url: Option<String>,
        /// Alternating runs of every setting; the best of each is kept.
        #[arg(long, default_value_t = 2)]
        runs: usize,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Recall of int8 scalar quantization against exact search on a Qdrant server: stores the sentence groups of
    /// `--notes` notes in a new int8 collection, then compares the top `--top` of held-out queries under exact
    /// search, HNSW, and HNSW on int8 vectors with and without rescoring; prints JSON.
    Quantization {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, default_value = "transcription")]
        column: String,
        /// The Qdrant server (gRPC), e.g. http://127.0.0.1:6334.
        #[arg(long, env = "QDRANT_URL")]
        url: String,
        #[arg(long, default_value_t = 300)]
        notes: usize,
        #[arg(long, default_value_t = 200)]
        queries: usize,
        #[arg(long, default_value_t = 10)]
        top: usize,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum VocabCommand {
    /// The variables' embedding expansion: for each CLEAR variable, the lexicon concepts of its kind nearest to its
    /// labels by the configured model (cosine ≥ --min, at most --max each), as TSV (data/variables/expansion.tsv).
    Expand {
        #[arg(long, default_value_t = 0.7)]
        min: f32,
        #[arg(long, default_value_t = 50)]
        max: usize,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum KgCommand {
    /// Apply knowledge-graph deltas in order and write the resulting graph (graph.json, graph.graphml).
    Materialize {
        /// kg.ndjson written by `clinstream run` in file mode.
        #[arg(long, required_unless_present = "topic", conflicts_with = "topic")]
        input: Option<PathBuf>,
        /// A Kafka topic of Avro deltas (`clinstream.kg.v1`), read from the beginning to its current end with the
        /// `kafka.*` connection settings.
        #[arg(long)]
        topic: Option<String>,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, short)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (defaults ← file ← environment), secrets redacted.
    Print {
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// Parses the command line and runs the command; the exit status of `clinstream`.
pub fn main() -> ExitCode {
    match real_main(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", as `{:#}` does, except that a cause the message before it already ends
/// with is left out: our typed errors name their I/O cause in their own message ("could not write X: Invalid
/// argument") and also expose it as `source()`, which `{:#}` printed twice.
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

fn real_main(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config, input, out, include_text, no_progress, no_embed } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            if no_embed {
                settings.embed.enabled = false;
            }
            crate::telemetry::init_logging(&settings.log)?;
            let runtime = runtime(&settings)?;
            if input.is_empty() {
                anyhow::ensure!(
                    settings.kafka.enabled,
                    "nothing to read: give --input PATH (files) or set kafka.enabled = true (see docs/kafka.md)"
                );
                let summary = runtime
                    .block_on(async { app::run_kafka(&settings, shutdown_signal()).await })
                    .context("the worker halted")?;
                print!("{summary}");
                return Ok(ExitCode::SUCCESS);
            }
            let opts = RunOptions {
                inputs: input.iter().map(|i| Input::parse(i)).collect(),
                out_dir: out,
                include_text,
                progress: !no_progress,
            };
            let summary = runtime
                .block_on(async { app::run_files(&settings, opts, shutdown_signal()).await })
                .context("the run halted")?;
            print!("{summary}");
            Ok(if summary.dead_lettered() > 0 { ExitCode::from(EXIT_DEAD_LETTERS) } else { ExitCode::SUCCESS })
        }
        Command::Produce { config, input, topic, create_topics } => {
            let settings = Settings::load(config.as_deref()).context("loading configuration")?;
            crate::telemetry::init_logging(&settings.log)?;
            let topic = topic
                .or_else(|| settings.kafka.topics.iter().find(|t| !t.starts_with('^')).cloned())
                .context("no --topic and no literal topic in kafka.topics")?;
            let inputs: Vec<Input> = input.iter().map(|i| Input::parse(i)).collect();
            let summary = runtime(&settings)?.block_on(async {
                if create_topics {
                    crate::kafka::admin::ensure_topics(&settings.kafka).await?;
                }
                produce::produce(&settings, &inputs, &topic).await
            })?;
            println!(
                "sent {} events to {topic} ({} without an id key, {} over 16 MiB skipped, {} over the broker's \
                 message size limit not sent)",
                summary.sent, summary.without_key, summary.skipped_oversized, summary.too_large
            );
            // Like `run`: finished, but not everything went through.
            Ok(if summary.too_large > 0 { ExitCode::from(EXIT_DEAD_LETTERS) } else { ExitCode::SUCCESS })
        }
        Command::Search { query, patient, section, top, json, config } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            settings.log.level = "warn".into();
            crate::telemetry::init_logging(&settings.log)?;
            let hits = runtime(&settings)?.block_on(search::search(
                &settings,
                &query,
                patient.as_deref(),
                section.as_deref(),
                top.max(1),
            ))?;
            print!("{}", search::render(&hits, json));
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { config } => {
            let settings = Settings::load(config.as_deref()).context("loading configuration")?;
            crate::telemetry::init_logging(&settings.log)?;
            let runtime = runtime(&settings)?;
            runtime
                .block_on(async { app::run_service(&settings, shutdown_signal()).await })
                .context("the query service stopped")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Context {
            patient,
            question,
            budget,
            since,
            until,
            document_types,
            sections,
            no_fill,
            json,
            config,
        } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            settings.log.level = "warn".into();
            crate::telemetry::init_logging(&settings.log)?;
            let request = crate::serve::ContextRequest {
                patient,
                question,
                budget_tokens: budget,
                since,
                until,
                document_types,
                sections,
                fill: no_fill.then_some(false),
            };
            let response = runtime(&settings)?.block_on(search::context(&settings, &request))?;
            print!("{}", search::render_context(&response, json));
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { command: ConfigCommand::Print { config } } => {
            let settings = Settings::load(config.as_deref()).context("loading configuration")?;
            print!("{}", settings.redacted_toml());
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { command: EvalCommand::Negex { pairs, json, show_errors } } => {
            let r = crate::eval::negex::run(&pairs, show_errors).context("evaluating on the NegEx kit")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "negation   P {:.3}  R {:.3}  F1 {:.3}  (tp {} fp {} fn {})",
                    r.negation.precision,
                    r.negation.recall,
                    r.negation.f1,
                    r.negation.tp,
                    r.negation.fp,
                    r.negation.fn_
                );
                println!("temporality accuracy {:.3}", r.temporality.accuracy);
                println!("experiencer accuracy {:.3}", r.experiencer.accuracy);
                println!("n {}  (concept not found: {})", r.n, r.concept_not_found);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { command: EvalCommand::Openi { reports, labels, config, json, show_errors } } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let r =
                crate::eval::openi::run(&pipeline, &reports, &labels, show_errors).context("evaluating on Open-i")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (v, p) in &r.per_variable {
                    println!(
                        "{v:<18} P {:.3}  R {:.3}  F1 {:.3}  (tp {} fp {} fn {})",
                        p.precision, p.recall, p.f1, p.tp, p.fp, p.fn_
                    );
                }
                println!("macro F1 {:.3}  n {}", r.macro_f1, r.n);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval {
            command:
                EvalCommand::Qa { documents, questions, budget, strategy, config, json, cache_dir, show_errors, chunks },
        } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            for s in &strategy {
                anyhow::ensure!(
                    ["clear", "clear-windows", "dense", "bm25", "hybrid"].contains(&s.as_str()),
                    "unknown strategy `{s}` (clear, clear-windows, dense, bm25, hybrid)"
                );
            }
            let r = runtime(&settings)?.block_on(async {
                let embedder = crate::embed::Embedder::start_async(&settings.embed).await.context("embedding model")?;
                let chunker = match chunks.as_str() {
                    "index" => Some(
                        crate::index::Chunker::new(&settings, embedder.clone(), pipeline.compiled())
                            .map_err(|e| anyhow::anyhow!("{e}"))?,
                    ),
                    _ => None,
                };
                let window = settings.clear.window_words;
                let run = crate::eval::qa::QaRun {
                    documents: &documents,
                    questions: &questions,
                    budget_tokens: budget,
                    window_words: window,
                    strategies: &strategy,
                    label_cache: &cache_dir,
                    show_errors,
                    chunker: chunker.as_ref(),
                };
                crate::eval::qa::run(&pipeline, &embedder, &run).await.context("evaluating question answering")
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("{} documents, {} patients, budget {} tokens", r.documents, r.patients, r.budget_tokens);
                for s in &r.strategies {
                    println!(
                        "{:<13} evidence recall {:.3} ({} with evidence)  accuracy {:.3}  isolation violations {}  \
                         tokens mean {:.0} max {} (over budget {}){}",
                        s.strategy,
                        s.evidence_recall,
                        s.with_evidence,
                        s.answer_accuracy,
                        s.isolation_violations,
                        s.mean_tokens,
                        s.max_tokens,
                        s.over_budget,
                        if s.strategy.starts_with("clear") {
                            format!("  unaligned {}", s.unaligned)
                        } else {
                            String::new()
                        }
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { command: EvalCommand::KgSynthea { fhir, config } } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let r = crate::eval::kg_synthea::run(&pipeline, &fhir).context("checking the graph against Synthea")?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { command: EvalCommand::Sdoh { csv, config, json, show_errors } } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let r = crate::eval::sdoh::run(&pipeline, &csv, show_errors).context("evaluating on SDOH-NLI")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (h, s) in &r.per_hypothesis {
                    println!("{h:<48} accuracy {:.3}  (n {})", s.accuracy, s.n);
                }
                println!("accuracy {:.3}  n {}", r.accuracy, r.n);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain { text, config } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let text = if text == "-" { std::io::read_to_string(std::io::stdin())? } else { text };
            print!("{}", docs::explain(&pipeline, text));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command: BenchCommand::Embed { csv, column, limit, runs, batch_tokens, max_batch, check_cpu, config },
        } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = bench::events(&csv, &column, Some(limit)).context("reading the corpus")?;
            if batch_tokens.is_empty() && max_batch.is_empty() {
                let r = bench::embed(&settings, &pipeline, &events, runs, check_cpu)?;
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(ExitCode::SUCCESS);
            }
            let budgets = if batch_tokens.is_empty() { vec![settings.embed.batch_tokens] } else { batch_tokens };
            let sizes = if max_batch.is_empty() { vec![settings.embed.max_batch] } else { max_batch };
            for &b in &budgets {
                for &m in &sizes {
                    let mut s = settings.clone();
                    s.embed.batch_tokens = b;
                    s.embed.max_batch = m;
                    let r = bench::embed(&s, &pipeline, &events, runs, check_cpu)?;
                    println!("{}", serde_json::to_string(&r)?);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command: BenchCommand::Serve { documents, questions, url, requests, clients, keep, config },
        } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            settings.log.level = "warn".into();
            crate::telemetry::init_logging(&settings.log)?;
            let r = serve_bench::run(
                &settings,
                &documents,
                &questions,
                url.as_deref(),
                requests,
                &clients,
                keep.as_deref(),
            )?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { command: BenchCommand::Seos { csv, column, limit, modes, runs, bound_only, config } } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = bench::events(&csv, &column, Some(limit)).context("reading the corpus")?;
            if bound_only {
                println!("{}", serde_json::to_string_pretty(&bench::bounds(&settings, &pipeline, &events, &modes)?)?);
                return Ok(ExitCode::SUCCESS);
            }
            let r = bench::seos(&settings, &pipeline, &events, &modes, runs)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { command: BenchCommand::Quantization { csv, column, url, notes, queries, top, config } } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            // The stored notes, then enough further notes for the held-out queries.
            let events = bench::events(&csv, &column, Some(notes + 50)).context("reading the corpus")?;
            let r = bench::quantization(&settings, &pipeline, &events, notes, queries, top, &url)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            command: BenchCommand::Store { csv, column, docs, chunks, windows, concurrency, groups, url, runs, config },
        } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = match &csv {
                Some(csv) => bench::events(csv, &column, Some(docs)).context("reading the corpus")?,
                None => Vec::new(),
            };
            let real = csv.is_some().then_some((&pipeline, events.as_slice()));
            let r = bench::store(&settings, real, docs, chunks, windows, concurrency, &groups, url.as_deref(), runs)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { command: BenchCommand::Growth { csv, column, synthetic, no_index, config } } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let r = bench::growth(&settings, &pipeline, &csv, &column, &synthetic, !no_index)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { command: BenchCommand::Text { csv, column, limit, threads, targets_out } } => {
            let (settings, pipeline) = pipeline(None)?;
            if let Some(path) = targets_out {
                std::fs::write(&path, serde_json::to_string(&bench::target_terms(&pipeline))?)?;
            }
            let events = bench::events(&csv, &column, limit).context("reading the corpus")?;
            let threads = threads.unwrap_or_else(|| settings.worker_threads());
            let r = bench::text(&pipeline, &events, threads, settings.clear.token_budget);
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Kg { command: KgCommand::Materialize { input, topic, config, out } } => {
            let deltas: Vec<crate::model::KgDelta> = match (input, topic) {
                (Some(input), _) => {
                    let text =
                        std::fs::read_to_string(&input).with_context(|| format!("reading {}", input.display()))?;
                    let mut deltas = Vec::new();
                    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                        deltas.push(serde_json::from_str(line).with_context(|| {
                            format!("{}: line {} is not a knowledge-graph delta", input.display(), i + 1)
                        })?);
                    }
                    deltas
                }
                (None, Some(topic)) => {
                    let settings = Settings::load(config.as_deref()).context("loading configuration")?;
                    produce::read_kg_topic(&settings, &topic)?
                }
                (None, None) => anyhow::bail!("give --input FILE or --topic T"),
            };
            let mut graph = crate::kg::Graph::default();
            let (mut applied, mut ignored) = (0, 0);
            for delta in &deltas {
                if graph.apply(delta) { applied += 1 } else { ignored += 1 }
            }
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            std::fs::write(out.join("graph.json"), serde_json::to_string_pretty(&graph.to_json())?)?;
            std::fs::write(out.join("graph.graphml"), graph.to_graphml())?;
            println!(
                "applied {applied} deltas ({ignored} ignored as stale or replaced): {} nodes, {} edges -> {}",
                graph.node_count(),
                graph.edge_count(),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Errors { markdown } => {
            print!("{}", docs::errors_table(markdown));
            Ok(ExitCode::SUCCESS)
        }
        Command::Vocab { command: VocabCommand::Expand { min, max, config } } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            settings.log.level = "warn".into();
            settings.clear.expansion_min_score = 0.0; // expand from the variables as defined
            crate::telemetry::init_logging(&settings.log)?;
            let pipeline = crate::stages::Pipeline::new(&settings)?;
            let rt = runtime(&settings)?;
            let lines = rt.block_on(async {
                let embedder = crate::embed::Embedder::start_async(&settings.embed).await?;
                let index =
                    crate::serve::label_index(&pipeline, &embedder, std::path::Path::new(&settings.serve.cache_dir))
                        .await?;
                let (lexicon, variables) = (pipeline.lexicon(), pipeline.variables());
                let mut out = format!(
                    "# clinstream vocab expand --min {min} --max {max}: model {}, lexicon {}\n",
                    embedder.info().name,
                    lexicon.version()
                );
                for (v, c, score) in index.expansions(lexicon, variables, min, max) {
                    let concept = lexicon.concept(c);
                    out.push_str(&format!(
                        "{}\t{}\t{score:.4}\t{}\n",
                        variables[v].name(),
                        concept.id,
                        concept.preferred
                    ));
                }
                Ok::<_, anyhow::Error>(out)
            })?;
            print!("{lines}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Openapi => {
            println!("{}", serde_json::to_string_pretty(&crate::serve::api::openapi())?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The worker's async runtime: `pipeline.async_threads` async threads, a blocking pool (the CPU-bound stages) of
/// one thread per `pipeline.workers` and one more.
pub(crate) fn runtime(settings: &Settings) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.async_threads())
        .max_blocking_threads(settings.worker_threads() + 1)
        .thread_name("clinstream")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Settings (defaults ← file ← env) and the compiled pipeline, for the commands that analyse text.
fn pipeline(config: Option<&std::path::Path>) -> anyhow::Result<(Settings, crate::stages::Pipeline)> {
    let settings = Settings::load(config).context("loading configuration")?;
    let pipeline = crate::stages::Pipeline::new(&settings)?;
    Ok((settings, pipeline))
}

/// Resolves on SIGINT or SIGTERM.
/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called (inside the runtime), not
/// when first awaited, so a signal during start-up is not lost (nor fatal): the run stops as soon as it starts.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    #[cfg(unix)]
    let int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    async move {
        #[cfg(unix)]
        {
            let (mut term, mut int) = (term, int);
            let term = async {
                match term.as_mut() {
                    Some(t) => drop(t.recv().await),
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(i) => drop(i.recv().await),
                    None => drop(tokio::signal::ctrl_c().await),
                }
            };
            tokio::select! {
                _ = term => {}
                _ = int => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::chain;
    use crate::error::SinkError;
    use anyhow::Context;

    #[test]
    fn chain_names_each_cause_once() {
        let io = std::io::Error::from(std::io::ErrorKind::InvalidInput);
        let io_text = io.to_string();
        let e: anyhow::Result<()> = Err(SinkError { what: "notes.ndjson".into(), source: io }.into());
        let e = e.context("the run halted").unwrap_err();
        // `{:#}` repeats the I/O cause the sink error's message already holds.
        assert_eq!(format!("{e:#}").matches(&io_text).count(), 2);
        assert_eq!(chain(&e), format!("the run halted: could not write notes.ndjson: {io_text}"));
        // A cause that is not already in the message is kept.
        let e = anyhow::anyhow!("root cause").context("outer");
        assert_eq!(chain(&e), "outer: root cause");
    }
}
