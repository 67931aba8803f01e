//! `clinstream-lab eval …`: quality on the labelled sets (`make eval`; docs/evaluation.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;
use clinstream::cli::{pipeline, runtime};

#[derive(Subcommand)]
pub enum EvalCommand {
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
        /// Also label with the LLM of `llm.*` (`llm.base_url` must be set): the CLEAR windows of each variable in
        /// the report, asked whether the report indicates it; scored beside the rule labels on the same reports.
        #[arg(long)]
        llm: bool,
        /// With `--llm`: every N-th report only.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        sample: u64,
        /// With `--llm`: CLEAR tokens of windows per variable.
        #[arg(long, default_value_t = 512)]
        budget: usize,
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
        /// answers by default; `clear@0.5` with another share of the budget for related windows when the answer
        /// target is not mentioned; `clear+cptf`, `clear+cptf@0.4` with each window filtered by CPTF to that share
        /// of its tokens, 0.5 by default), clear-windows (the windows only), dense, bm25, hybrid (fused by score
        /// with `store.dense_weight` and `store.dense_weight_matched`; `hybrid@0.6` with one fixed weight,
        /// `hybrid@0.9:0.6` with those two, `hybrid@0.9:0.6^4/0.6` also with `store.bm25_partial_power` 4 and
        /// `store.bm25_full_share` 0.6; without `^` every BM25 share counts linearly), hybrid-rrf (fused by
        /// reciprocal rank; `bm25`, `hybrid` and `tree+hybrid` count a chunk that mentions the question's answer
        /// concept as a full BM25 match when `serve.match_concepts` is on, as `/v1/search` does, and a `+concepts`
        /// or `-concepts` suffix turns that on or off), hybrid+dense (the fused and the dense ranking taken in turn, fused first;
        /// `hybrid+dense@W[:M]` as hybrid@), tree (RAPTOR's collapsed tree over the same chunks, built under
        /// `raptor.*`; `tree+hybrid` ranked by the fused score of hybrid; `tree:128` with summaries of 128 tokens;
        /// `tree@mean` with summaries retrieved by their members' mean vector; `tree+cptf`, `tree+cptf@0.7` with summaries CPTF-compressed to that share of their
        /// sentences' tokens, 0.5 by default).
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
        /// Also ask the LLM of `llm.*` (`llm.base_url` must be set) for each strategy's context, with the query
        /// service's prompt and answer schema, and score its answers beside the rule vote.
        #[arg(long)]
        llm: bool,
        /// Every N-th question only (a spread of the set, for a slow model).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        sample: u64,
    },
    /// Multi-note questions from a record set (JSONL on stdout, the `qa` format with `evidence_doc_ids`): per
    /// patient, concepts the patient's notes affirm in three or more notes and few notes of the set mention.
    QaMulti {
        /// DocumentReference NDJSON (the patients' notes).
        #[arg(long)]
        documents: PathBuf,
        /// Questions per patient, at most.
        #[arg(long, default_value_t = 1)]
        per_patient: usize,
        /// Concepts mentioned in more than this share of all notes are too common to ask about.
        #[arg(long, default_value_t = 0.05)]
        max_share: f64,
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
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

/// Runs one `eval` command.
pub fn exec(command: EvalCommand) -> anyhow::Result<ExitCode> {
    match command {
        EvalCommand::Negex { pairs, json, show_errors } => {
            let r = clinstream::eval::negex::run(&pairs, show_errors).context("evaluating on the NegEx kit")?;
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
        EvalCommand::Openi { reports, labels, config, json, llm: true, sample, budget, .. } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            let client = clinstream::llm::Llm::new(&settings.llm)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .context("--llm needs llm.base_url")?;
            let templates = clinstream::query::answer::Templates::load(&settings.llm.prompt_dir)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let eval_llm = clinstream::eval::qa::EvalLlm { llm: &client, templates: &templates };
            let window = settings.clear.window_words;
            let r = runtime(&settings)?
                .block_on(clinstream::eval::openi::run_llm(
                    &pipeline,
                    &reports,
                    &labels,
                    &eval_llm,
                    sample as usize,
                    budget,
                    window,
                ))
                .context("evaluating on Open-i with the LLM")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (v, p) in &r.llm {
                    let rule = &r.rule[v];
                    println!(
                        "{v:<18} LLM P {:.3} R {:.3} F1 {:.3} | rules P {:.3} R {:.3} F1 {:.3}",
                        p.precision, p.recall, p.f1, rule.precision, rule.recall, rule.f1
                    );
                }
                println!(
                    "macro F1 LLM {:.3} rules {:.3}  n {}  calls {} (failed {}, no window {})  tokens prompt {:.0} \
                     completion {:.0}  endpoint ms mean {:.0}",
                    r.llm_macro_f1,
                    r.rule_macro_f1,
                    r.n,
                    r.calls,
                    r.failed,
                    r.no_window,
                    r.prompt_tokens_mean,
                    r.completion_tokens_mean,
                    r.ms_mean
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        EvalCommand::Openi { reports, labels, config, json, show_errors, .. } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let r = clinstream::eval::openi::run(&pipeline, &reports, &labels, show_errors)
                .context("evaluating on Open-i")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                for (v, p) in &r.per_variable {
                    println!(
                        "{v:<18} P {:.3}  R {:.3}  F1 {:.3}  (tp {} fp {} fn {})",
                        p.precision, p.recall, p.f1, p.tp, p.fp, p.fn_
                    );
                    let labels = r.by_label.get(v).into_iter().flatten();
                    let line: Vec<String> =
                        labels.map(|(l, c)| format!("{l} {} ({} gold)", c.reports, c.gold_positive)).collect();
                    println!("{:<18} {}", "", line.join("  "));
                }
                println!("macro F1 {:.3}  n {}", r.macro_f1, r.n);
            }
            Ok(ExitCode::SUCCESS)
        }
        EvalCommand::Qa {
            documents,
            questions,
            budget,
            strategy,
            config,
            json,
            cache_dir,
            show_errors,
            chunks,
            llm,
            sample,
        } => {
            let (settings, pipeline) = pipeline(config.as_deref())?;
            for s in &strategy {
                let s = &clinstream::eval::qa::concept_matching(s, true).0;
                anyhow::ensure!(
                    [
                        "clear",
                        "clear-windows",
                        "dense",
                        "bm25",
                        "hybrid",
                        "hybrid-rrf",
                        "tree",
                        "tree@mean",
                        "tree+llm",
                        "tree+hybrid"
                    ]
                    .contains(&s.as_str())
                        || s == "clear+cptf"
                        || ["tree", "tree@mean", "tree+llm", "tree+hybrid"].iter().any(|t| {
                            s.strip_prefix(t)
                                .and_then(|r| r.strip_prefix(':'))
                                .is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n >= 16))
                        })
                        || {
                            // `tree+cptf[@RATIO][:TOKENS]`
                            let (b, n) = s.split_once(':').map_or((s.as_str(), None), |(b, n)| (b, Some(n)));
                            n.is_none_or(|n| n.parse::<usize>().is_ok_and(|n| n >= 16))
                                && (b == "tree+cptf"
                                    || b.strip_prefix("tree+cptf@")
                                        .and_then(|w| w.parse::<f32>().ok())
                                        .is_some_and(|w| w > 0.0 && w <= 1.0))
                        }
                        || s == "hybrid+dense"
                        || s.strip_prefix("hybrid@")
                            .or_else(|| s.strip_prefix("hybrid+dense@"))
                            .and_then(clinstream::eval::qa::parse_fusion)
                            .is_some()
                        || s.strip_prefix("clear@")
                            .or_else(|| s.strip_prefix("clear+cptf@"))
                            .and_then(|w| w.parse::<f32>().ok())
                            .is_some_and(|w| (0.0..=1.0).contains(&w)),
                    "unknown strategy `{s}` (clear, clear@SHARE, clear+cptf, clear+cptf@RATIO, clear-windows, dense, \
                     bm25, hybrid, hybrid@WEIGHT[:MATCHED][^POWER[/FULL]], hybrid-rrf, \
                     hybrid+dense[@WEIGHT[:MATCHED]], tree, tree@mean, tree+llm, tree+hybrid, tree+cptf[@RATIO], \
                     tree[@mean|+llm|+hybrid|+cptf[@RATIO]]:TOKENS)"
                );
            }
            let r = runtime(&settings)?.block_on(async {
                let embedder =
                    clinstream::embed::Embedder::start_async(&settings.embed).await.context("embedding model")?;
                let chunker = match chunks.as_str() {
                    "index" => Some(
                        clinstream::index::Chunker::new(&settings, embedder.clone(), pipeline.compiled())
                            .map_err(|e| anyhow::anyhow!("{e}"))?,
                    ),
                    _ => None,
                };
                let window = settings.clear.window_words;
                // The LLM client with one set of templates, when `wanted` (`why` names what needs it).
                let endpoint = |wanted: bool,
                                why: &str,
                                load: fn(&str) -> Result<clinstream::query::answer::Templates, String>|
                 -> anyhow::Result<
                    Option<(clinstream::llm::Llm, clinstream::query::answer::Templates)>,
                > {
                    if !wanted {
                        return Ok(None);
                    }
                    let client = clinstream::llm::Llm::new(&settings.llm)
                        .map_err(|e| anyhow::anyhow!("{e}"))?
                        .with_context(|| format!("{why} needs llm.base_url"))?;
                    let templates = load(&settings.llm.prompt_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
                    Ok(Some((client, templates)))
                };
                let answers = endpoint(llm, "--llm", clinstream::query::answer::Templates::load)?;
                let eval_llm =
                    answers.as_ref().map(|(llm, templates)| clinstream::eval::qa::EvalLlm { llm, templates });
                // `tree+llm`: the abstractive summaries' client and templates (without --llm too).
                let summarizer = endpoint(
                    strategy.iter().any(|s| s.starts_with("tree+llm")),
                    "tree+llm",
                    clinstream::query::answer::Templates::load_summary,
                )?;
                let summary_llm =
                    summarizer.as_ref().map(|(llm, templates)| clinstream::eval::qa::EvalLlm { llm, templates });
                let importance = if strategy.iter().any(|s| s.starts_with("clear+cptf") || s.starts_with("tree+cptf")) {
                    let (embed, file) = (settings.embed.clone(), settings.serve.compress_model_file.clone());
                    Some(
                        tokio::task::spawn_blocking(move || {
                            clinstream::embed::importance::Importance::load(&embed, &file)
                        })
                        .await?
                        .context("the token-importance model")?,
                    )
                } else {
                    None
                };
                let run = clinstream::eval::qa::QaRun {
                    documents: &documents,
                    questions: &questions,
                    budget_tokens: budget,
                    window_words: window,
                    strategies: &strategy,
                    label_cache: &cache_dir,
                    show_errors,
                    chunker: chunker.as_ref(),
                    fusion: clinstream::store::Fusion::of(&settings.store),
                    bm25_avg_len: settings.store.bm25_avg_len,
                    match_concepts: settings.serve.match_concepts,
                    llm: eval_llm.as_ref(),
                    sample: sample as usize,
                    importance: importance.as_ref(),
                    tree: (&settings.raptor).into(),
                    summaries: summary_llm.as_ref().map(|l| (l, settings.raptor.abstract_input_tokens)),
                };
                clinstream::eval::qa::run(&pipeline, &embedder, &run).await.context("evaluating question answering")
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("{} documents, {} patients, budget {} tokens", r.documents, r.patients, r.budget_tokens);
                if let Some((written, not)) = r.abstracts {
                    println!("abstractive summaries: {written} written, {not} not (extractive)");
                }
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
                        if s.strategy.starts_with("clear+cptf") {
                            format!(
                                "  unaligned {}  evidence inside the windows cut {:.3}, its words kept {:.3}",
                                s.unaligned,
                                s.evidence_covered,
                                s.evidence_words_kept.unwrap_or(0.0)
                            )
                        } else if s.strategy.starts_with("clear") {
                            format!("  unaligned {}", s.unaligned)
                        } else {
                            format!(
                                "  Hit@1 {:.3} Hit@5 {:.3} Hit@10 {:.3} MRR {:.3}",
                                s.hit_at_1.unwrap_or(0.0),
                                s.hit_at_5.unwrap_or(0.0),
                                s.hit_at_10.unwrap_or(0.0),
                                s.mrr.unwrap_or(0.0)
                            )
                        }
                    );
                    if let Some(n) = s.evidence_notes {
                        println!("{:<13} evidence notes reached {n:.3} (multi-note questions)", "");
                    }
                    if let Some(l) = &s.llm {
                        println!(
                            "{:<13} LLM accuracy {:.3} (rule vote {:.3}) over {} asked, failed {}, citations outside \
                             the context {}, tokens prompt {:.0} completion {:.0}, endpoint ms mean {:.0} max {}",
                            "",
                            l.accuracy,
                            l.rule_accuracy,
                            l.asked,
                            l.failed,
                            l.citations_refused,
                            l.prompt_tokens_mean,
                            l.completion_tokens_mean,
                            l.ms_mean,
                            l.ms_max
                        );
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        EvalCommand::QaMulti { documents, per_patient, max_share, config } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let questions = clinstream::eval::qa::multi_note_questions(&pipeline, &documents, per_patient, max_share)
                .context("building multi-note questions")?;
            let mut out = std::io::stdout().lock();
            for q in &questions {
                writeln!(out, "{q}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        EvalCommand::KgSynthea { fhir, config } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let r =
                clinstream::eval::kg_synthea::run(&pipeline, &fhir).context("checking the graph against Synthea")?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(ExitCode::SUCCESS)
        }
        EvalCommand::Sdoh { csv, config, json, show_errors } => {
            let (_, pipeline) = pipeline(config.as_deref())?;
            let r = clinstream::eval::sdoh::run(&pipeline, &csv, show_errors).context("evaluating on SDOH-NLI")?;
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
    }
}
