//! `clinstream-lab bench …`: the measurements behind docs/benchmarks.md (`make bench` runs them through
//! bench/run.sh). Each prints JSON on stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use clinstream::cli::pipeline;
use clinstream::config::Settings;

use crate::{measure, serve_bench};

#[derive(Subcommand)]
pub enum BenchCommand {
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
    /// Tokenizing as the worker does (`embed::Embedder::encode_one`: the ASCII shortcuts) against the model's full
    /// tokenizer on the same sentences (every sentence of the notes, as SEOS encodes them), alternately, one
    /// thread; prints JSON with tokens/s of each, their ratio and whether every sentence got the same ids.
    Tokens {
        #[arg(long)]
        csv: PathBuf,
        #[arg(long, default_value = "transcription")]
        column: String,
        /// Notes to take from the CSV.
        #[arg(long, default_value_t = 2000)]
        limit: usize,
        /// Alternating runs of each side; the best of each is kept.
        #[arg(long, default_value_t = 3)]
        runs: usize,
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
        /// Also send the first N questions as `POST /v1/answer` (needs `llm.base_url`) and report the service's
        /// own time per answer beside the LLM's.
        #[arg(long, default_value_t = 0)]
        answers: usize,
        /// Ask `/v1/context` (and `/v1/answer`) for CPTF at this ratio.
        #[arg(long)]
        compress: Option<f32>,
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
        /// Real notes (MTSamples: column `transcription`): the worker's own payloads, windows and BM25 vectors, and
        /// chunks as `--points` says; without it, synthetic documents of `--chunks` + `--windows`.
        #[arg(long)]
        csv: Option<PathBuf>,
        #[arg(long, default_value = "transcription")]
        column: String,
        /// With `--csv`: `worker` = the points an end-to-end run writes (the configured chunking and embedder; set
        /// `embed.execution_provider = "synthetic"` to run no model), `placeholder` = fixed chunks with placeholder
        /// vectors.
        #[arg(long, value_enum, default_value = "worker")]
        points: measure::StorePoints,
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
        /// Embedded store: also wait, after the points are durable, for the maintenance their writes started and
        /// report `settled_seconds` (tens of seconds on 2 cores).
        #[arg(long)]
        settled: bool,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
    /// RAPTOR's tree as notes arrive: each note indexed (as the worker does), then its patient's tree rebuilt from
    /// the store, timed note by note, on a fresh embedded store (or with `--url` a new collection on a Qdrant
    /// server, dropped afterwards); prints JSON with the rebuild's p50/p99 against the goal of 50 ms a note.
    Tree {
        /// DocumentReference NDJSON in arrival order (e.g. ../shared/eval/qa/documents.ndjson).
        #[arg(long)]
        documents: PathBuf,
        /// The first N notes only.
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long, env = "QDRANT_URL")]
        url: Option<String>,
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

/// Runs one `bench` command.
pub fn exec(command: BenchCommand) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Embed { csv, column, limit, runs, batch_tokens, max_batch, check_cpu, config } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = measure::events(&csv, &column, Some(limit)).context("reading the corpus")?;
            if batch_tokens.is_empty() && max_batch.is_empty() {
                let r = measure::embed(&settings, &pipeline, &events, runs, check_cpu)?;
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
                    let r = measure::embed(&s, &pipeline, &events, runs, check_cpu)?;
                    println!("{}", serde_json::to_string(&r)?);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Tokens { csv, column, limit, runs, config } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = measure::events(&csv, &column, Some(limit)).context("reading the corpus")?;
            let r = measure::tokens(&settings, &pipeline, &events, runs)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Serve { documents, questions, url, requests, clients, keep, answers, compress, config } => {
            let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
            settings.log.level = "warn".into();
            clinstream::telemetry::init_logging(&settings.log)?;
            let r = serve_bench::run(
                &settings,
                &documents,
                &questions,
                url.as_deref(),
                &serve_bench::Load { requests, clients: &clients, answers, compress },
                keep.as_deref(),
            )?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Seos { csv, column, limit, modes, runs, bound_only, config } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = measure::events(&csv, &column, Some(limit)).context("reading the corpus")?;
            if bound_only {
                println!("{}", serde_json::to_string_pretty(&measure::bounds(&settings, &pipeline, &events, &modes)?)?);
                return Ok(ExitCode::SUCCESS);
            }
            let r = measure::seos(&settings, &pipeline, &events, &modes, runs)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Quantization { csv, column, url, notes, queries, top, config } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            // The stored notes, then enough further notes for the held-out queries.
            let events = measure::events(&csv, &column, Some(notes + 50)).context("reading the corpus")?;
            let r = measure::quantization(&settings, &pipeline, &events, notes, queries, top, &url)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Store {
            csv,
            column,
            points,
            docs,
            chunks,
            windows,
            concurrency,
            groups,
            url,
            runs,
            settled,
            config,
        } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let events = match &csv {
                Some(csv) => measure::events(csv, &column, Some(docs)).context("reading the corpus")?,
                None => Vec::new(),
            };
            let real = csv.is_some().then_some((&pipeline, events.as_slice(), points));
            let url = url.as_deref();
            let r = measure::store(&settings, real, docs, chunks, windows, concurrency, &groups, url, runs, settled)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Tree { documents, limit, url, config } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let r = measure::tree(&settings, &pipeline, &documents, limit, url.as_deref())?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Growth { csv, column, synthetic, no_index, config } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let r = measure::growth(&settings, &pipeline, &csv, &column, &synthetic, !no_index)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        BenchCommand::Text { csv, column, limit, threads, targets_out } => {
            let (settings, pipeline) = pipeline(None)?;
            if let Some(path) = targets_out {
                std::fs::write(&path, serde_json::to_string(&measure::target_terms(&pipeline))?)?;
            }
            let events = measure::events(&csv, &column, limit).context("reading the corpus")?;
            let threads = threads.unwrap_or_else(|| settings.worker_threads());
            let r = measure::text(&pipeline, &events, threads, settings.clear.token_budget);
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
