//! Benchmark helpers (`clinstream-lab bench text`): the text stages on a corpus of real notes, per stage and all
//! together, single-threaded and on every core, with p50/p99 per note, the number of variable-target mentions
//! (to compare with another tool on equal terms) and the CLEAR context tokens per note against note length.
//! `bench/run.sh` (`make bench`) runs it beside medSpaCy and writes `bench/results/<date>.json`.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Serialize;

use clinstream::eval::{EvalError, csv, read};
use clinstream::stages::Pipeline;
use clinstream::stages::clear::word_spans;

#[derive(Debug, Serialize)]
pub struct StageRate {
    pub stage: &'static str,
    pub seconds: f64,
    pub notes_per_s: f64,
    pub mb_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct BudgetBin {
    pub words_from: usize,
    pub words_to: Option<usize>,
    pub notes: usize,
    /// Mean and max over notes of the largest context-token count of any variable.
    pub mean_context_tokens: f64,
    pub max_context_tokens: usize,
    pub mean_note_tokens: f64,
}

#[derive(Debug, Serialize)]
pub struct TextBench {
    pub notes: usize,
    pub bytes: usize,
    /// One thread: each stage, then all of them together (`all`).
    pub single_thread: Vec<StageRate>,
    pub threads: usize,
    /// All stages on `threads` threads.
    pub all_cores_notes_per_s: f64,
    pub all_cores_notes_per_s_per_core: f64,
    pub target_mentions: usize,
    pub token_budget: usize,
    pub clear_budget: Vec<BudgetBin>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Wraps each note's text as a DocumentReference event (so decoding is measured too).
pub fn events(csv_path: &Path, column: &str, limit: Option<usize>) -> Result<Vec<Vec<u8>>, EvalError> {
    let rows = csv::records(&read(csv_path)?);
    Ok(rows
        .iter()
        .filter_map(|r| r.get(column).filter(|t| !t.trim().is_empty()))
        .take(limit.unwrap_or(usize::MAX))
        .enumerate()
        .map(|(i, text)| event_of(&format!("bench-{i}"), text))
        .collect())
}

pub fn text(pipeline: &Pipeline, events: &[Vec<u8>], threads: usize, token_budget: usize) -> TextBench {
    let targets: HashSet<u32> = pipeline.variables().iter().flat_map(|v| v.targets().iter().copied()).collect();
    let bytes: usize = events.iter().map(Vec::len).sum();
    let mut per_stage: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let mut totals = Vec::with_capacity(events.len());
    let mut target_mentions = 0;
    let mut lengths = Vec::with_capacity(events.len());
    for e in events {
        let Ok(doc) = pipeline.process(e) else { continue };
        let stages = doc.timings.stages();
        if per_stage.is_empty() {
            per_stage = stages.iter().map(|(s, _)| (*s, Vec::with_capacity(events.len()))).collect();
        }
        for (slot, (_, took)) in per_stage.iter_mut().zip(stages) {
            slot.1.push(took.as_secs_f64());
        }
        totals.push(stages.iter().map(|(_, d)| d.as_secs_f64()).sum::<f64>());
        target_mentions += doc.mentions.iter().filter(|m| targets.contains(&m.concept)).count();
        let words = word_spans(&doc.note.text).len();
        let context = doc.variables.iter().map(|v| v.context_tokens).max().unwrap_or(0);
        lengths.push((words, context, clinstream::stages::clear::count_tokens(&doc.note.text)));
    }
    let rate = |stage: &'static str, times: &[f64]| {
        let seconds: f64 = times.iter().sum();
        let mut sorted = times.to_vec();
        sorted.sort_by(f64::total_cmp);
        StageRate {
            stage,
            seconds,
            notes_per_s: times.len() as f64 / seconds.max(1e-12),
            mb_per_s: bytes as f64 / 1e6 / seconds.max(1e-12),
            p50_ms: percentile(&sorted, 0.5) * 1e3,
            p99_ms: percentile(&sorted, 0.99) * 1e3,
        }
    };
    let mut single_thread: Vec<StageRate> = per_stage.iter().map(|(s, t)| rate(s, t)).collect();
    single_thread.push(rate("all", &totals));

    // All cores: the same events split across threads, wall-clock time.
    let start = Instant::now();
    std::thread::scope(|scope| {
        for chunk in events.chunks(events.len().div_ceil(threads.max(1)).max(1)) {
            scope.spawn(move || {
                for e in chunk {
                    let _ = std::hint::black_box(pipeline.process(e));
                }
            });
        }
    });
    let wall = start.elapsed().max(Duration::from_nanos(1)).as_secs_f64();
    let all_cores = events.len() as f64 / wall;

    let edges = [0usize, 250, 500, 1000, 2000];
    let clear_budget = edges
        .iter()
        .enumerate()
        .map(|(i, &from)| {
            let to = edges.get(i + 1).copied();
            let bin: Vec<&(usize, usize, usize)> =
                lengths.iter().filter(|(w, _, _)| *w >= from && to.is_none_or(|t| *w < t)).collect();
            let n = bin.len().max(1) as f64;
            BudgetBin {
                words_from: from,
                words_to: to,
                notes: bin.len(),
                mean_context_tokens: bin.iter().map(|b| b.1 as f64).sum::<f64>() / n,
                max_context_tokens: bin.iter().map(|b| b.1).max().unwrap_or(0),
                mean_note_tokens: bin.iter().map(|b| b.2 as f64).sum::<f64>() / n,
            }
        })
        .collect();
    TextBench {
        notes: totals.len(),
        bytes,
        single_thread,
        threads,
        all_cores_notes_per_s: all_cores,
        all_cores_notes_per_s_per_core: all_cores / threads.max(1) as f64,
        target_mentions,
        token_budget,
        clear_budget,
    }
}

/// The variables' target terms, for configuring another tool's matcher with the same terms.
pub fn target_terms(pipeline: &Pipeline) -> Vec<serde_json::Value> {
    let lex = pipeline.lexicon();
    let mut out = Vec::new();
    for v in pipeline.variables() {
        for (term, concept) in lex.terms() {
            if v.targets().contains(&concept) {
                out.push(serde_json::json!({"literal": term, "category": v.name()}));
            }
        }
    }
    out
}

/// Embedding throughput inside the worker against a bare ONNX Runtime loop over the same inputs (`make bench`).
#[derive(Debug, serde::Serialize)]
pub struct EmbedBench {
    pub model: String,
    pub provider: String,
    pub notes: usize,
    pub inputs: usize,
    pub tokens: usize,
    pub intra_threads: usize,
    pub batch_tokens: usize,
    pub max_batch: usize,
    /// Best of the runs, real (unpadded) tokens per second.
    pub worker_tokens_per_s: f64,
    pub bare_tokens_per_s: f64,
    pub ratio: f64,
    pub runs: usize,
    /// `--check-cpu`: these vectors against the fp32 `model.onnx` on the CPU provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<ProviderCheck>,
}

/// Per-vector cosine between the benchmarked embedder and the reference (fp32 `model.onnx` on CPU).
#[derive(Debug, serde::Serialize)]
pub struct ProviderCheck {
    pub reference: String,
    pub vectors: usize,
    pub min_cosine: f64,
    pub mean_cosine: f64,
    /// Vectors under 0.999.
    pub below_0_999: usize,
}

/// Embeds the first `n` inputs with `settings` and with the reference (CPU, `model.onnx`), and compares them.
pub fn check_against_cpu(
    settings: &clinstream::config::EmbedSettings,
    inputs: &[Vec<u32>],
    n: usize,
) -> anyhow::Result<ProviderCheck> {
    let inputs = &inputs[..n.min(inputs.len())];
    let reference = clinstream::config::EmbedSettings {
        execution_provider: "cpu".into(),
        model_file: "model.onnx".into(),
        ..settings.clone()
    };
    let got = clinstream::embed::embed_direct(settings, inputs)?;
    let want = clinstream::embed::embed_direct(&reference, inputs)?;
    let cosines: Vec<f64> = got
        .iter()
        .zip(&want)
        .map(|(a, b)| {
            let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            dot / (na * nb).max(f64::MIN_POSITIVE)
        })
        .collect();
    Ok(ProviderCheck {
        reference: "cpu model.onnx".into(),
        vectors: cosines.len(),
        min_cosine: cosines.iter().copied().fold(f64::INFINITY, f64::min),
        mean_cosine: cosines.iter().sum::<f64>() / cosines.len().max(1) as f64,
        below_0_999: cosines.iter().filter(|c| **c < 0.999).count(),
    })
}

/// The SEOS sentence groups (each sentence with one neighbour on each side) of each note: the embedder's main
/// load in the worker. One request per note.
pub fn embed_inputs(
    pipeline: &Pipeline,
    events: &[Vec<u8>],
    embedder: &clinstream::embed::Embedder,
) -> Vec<Vec<Vec<u32>>> {
    events
        .iter()
        .filter_map(|e| pipeline.process(e).ok())
        .map(|doc| {
            let s = &doc.sentences;
            let groups: Vec<&str> = (0..s.len())
                .map(|i| &doc.note.text[s[i.saturating_sub(1)].start..s[(i + 1).min(s.len() - 1)].end])
                .collect();
            embedder.encode(&groups).unwrap_or_default()
        })
        .filter(|g| !g.is_empty())
        .collect()
}

/// `bench tokens`: the worker's tokenizing against the full tokenizer.
#[derive(Debug, Serialize)]
pub struct TokensBench {
    pub model: String,
    pub sentences: usize,
    pub ascii_share: f64,
    pub tokens: usize,
    pub worker_tokens_per_s: f64,
    pub full_tokenizer_tokens_per_s: f64,
    pub ratio: f64,
    /// Every sentence got the same ids both ways.
    pub identical: bool,
    pub runs: usize,
}

/// Every sentence of the notes through `Embedder::encode_one` and through the full tokenizer, alternately, `runs`
/// times each on one thread; the best time of each.
pub fn tokens(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    events: &[Vec<u8>],
    runs: usize,
) -> anyhow::Result<TokensBench> {
    let embedder = clinstream::embed::Embedder::start(&settings.embed)?;
    let docs: Vec<_> = events.iter().filter_map(|e| pipeline.process(e).ok()).collect();
    let sentences: Vec<&str> =
        docs.iter().flat_map(|d| d.sentences.iter().map(|s| &d.note.text[s.start..s.end])).collect();
    let ascii = sentences.iter().filter(|s| s.is_ascii()).count();
    let mut identical = true;
    let mut tokens = 0;
    for s in &sentences {
        let (worker, full) = (embedder.encode_one(s)?, embedder.encode_reference(s)?);
        identical &= worker == full;
        tokens += full.len();
    }
    let time = |f: &dyn Fn(&str) -> Result<Vec<u32>, clinstream::embed::EmbedError>| -> anyhow::Result<f64> {
        let clock = Instant::now();
        let mut n = 0;
        for s in &sentences {
            n += f(s)?.len();
        }
        Ok(n as f64 / clock.elapsed().as_secs_f64())
    };
    let (mut worker, mut full) = (0f64, 0f64);
    for _ in 0..runs.max(1) {
        worker = worker.max(time(&|s| embedder.encode_one(s))?);
        full = full.max(time(&|s| embedder.encode_reference(s))?);
    }
    Ok(TokensBench {
        model: embedder.info().name.clone(),
        sentences: sentences.len(),
        ascii_share: ascii as f64 / sentences.len().max(1) as f64,
        tokens,
        worker_tokens_per_s: worker.round(),
        full_tokenizer_tokens_per_s: full.round(),
        ratio: (worker / full * 100.0).round() / 100.0,
        identical,
        runs: runs.max(1),
    })
}

/// Runs the worker path (the embedder handle, one concurrent request per note, at most `in_flight` at once) and
/// the bare loop alternately, `runs` times each, and keeps the best of each.
pub fn embed(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    events: &[Vec<u8>],
    runs: usize,
    check_cpu: usize,
) -> anyhow::Result<EmbedBench> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let embedder = clinstream::embed::Embedder::start(&settings.embed)?;
    let per_note = embed_inputs(pipeline, events, &embedder);
    let all: Vec<Vec<u32>> = per_note.iter().flatten().cloned().collect();
    let tokens: usize = all.iter().map(Vec::len).sum();
    let in_flight = settings.pipeline.in_flight;
    let (mut best_worker, mut best_bare) = (0f64, 0f64);
    for _ in 0..runs.max(1) {
        let (bare_tokens, took) = clinstream::embed::bare_loop(&settings.embed, &all)?;
        best_bare = best_bare.max(bare_tokens as f64 / took.as_secs_f64());
        let took = rt.block_on(async {
            let clock = Instant::now();
            let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight));
            let mut tasks = Vec::new();
            for inputs in &per_note {
                let permit = semaphore.clone().acquire_owned().await.expect("open semaphore");
                let e = embedder.clone();
                let inputs = inputs.clone();
                tasks.push(tokio::spawn(async move {
                    let r = e.embed_ids(inputs).await;
                    drop(permit);
                    r
                }));
            }
            for t in tasks {
                t.await??;
            }
            Ok::<_, anyhow::Error>(clock.elapsed())
        })?;
        best_worker = best_worker.max(tokens as f64 / took.as_secs_f64());
    }
    let info = embedder.info();
    Ok(EmbedBench {
        model: info.name.clone(),
        provider: info.provider.to_string(),
        notes: per_note.len(),
        inputs: all.len(),
        tokens,
        intra_threads: settings.embed.intra_threads,
        batch_tokens: settings.embed.batch_tokens,
        max_batch: settings.embed.max_batch,
        worker_tokens_per_s: best_worker,
        bare_tokens_per_s: best_bare,
        ratio: best_worker / best_bare,
        runs: runs.max(1),
        check: match check_cpu {
            0 => None,
            n => Some(check_against_cpu(&settings.embed, &all, n)?),
        },
    })
}

/// SEOS's vector modes side by side on the same notes (`clinstream-lab bench seos`, `make bench`): what each costs
/// the model and how far its plans and vectors are from the exact method's (`groups`).
#[derive(Debug, serde::Serialize)]
pub struct SeosBench {
    pub model: String,
    pub notes: usize,
    /// Tokens of the notes' units (sentences), the unit of the cost figures.
    pub note_tokens: usize,
    pub chunk_tokens: usize,
    pub runs: usize,
    pub modes: Vec<SeosMode>,
}

#[derive(Debug, serde::Serialize)]
pub struct SeosMode {
    pub mode: String,
    /// Best of the runs: notes through units, shifts, plan and chunk vectors (the indexer's first half), with
    /// `pipeline.in_flight` notes at once as in the worker.
    pub seconds: f64,
    pub notes_per_s: f64,
    pub embedded_tokens: usize,
    /// Embedded tokens per note token.
    pub tokens_per_note_token: f64,
    pub chunks: usize,
    /// Chunk starts of the exact plan that this plan also has (1 for the exact method).
    pub cut_agreement: f64,
    /// Notes whose plan is exactly the exact method's.
    pub identical_plans: f64,
    /// Cosine between this mode's and the exact method's vector of the same chunk (same units), where both plans
    /// have it.
    pub mean_chunk_cosine: f64,
    pub min_chunk_cosine: f64,
    /// The embedding bound: the same model inputs (this mode's groups or sentences, and chunks) through the bare
    /// ONNX Runtime loop (`embed::bare_loop`: same model, threads, batch plan) — notes/s if nothing but the model
    /// took time — and this mode's notes/s against it.
    pub bare_tokens_per_s: f64,
    pub bound_notes_per_s: f64,
    pub vs_bound: f64,
}

/// Runs each SEOS mode `runs` times (alternating) over the notes and compares with `groups`.
pub fn seos(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    events: &[Vec<u8>],
    modes: &[String],
    runs: usize,
) -> anyhow::Result<SeosBench> {
    let (rt, embedder, docs) = seos_setup(settings, pipeline, events)?;
    let mut all_modes = vec!["groups".to_string()];
    all_modes.extend(modes.iter().filter(|m| *m != "groups").cloned());
    let chunkers = seos_chunkers(settings, pipeline, &embedder, &all_modes)?;
    let note_tokens: usize = docs.iter().map(|d| chunkers[0].units(d).iter().map(|u| u.tokens).sum::<usize>()).sum();
    let in_flight = settings.pipeline.in_flight.max(1);
    let run_mode = |c: &clinstream::index::Chunker| chunk_all(&rt, c, &docs, in_flight);
    let mut best = vec![Duration::MAX; chunkers.len()];
    let mut results: Vec<Vec<clinstream::index::Chunked>> = vec![Vec::new(); chunkers.len()];
    for _ in 0..runs.max(1) {
        for (i, c) in chunkers.iter().enumerate() {
            let (took, out) = run_mode(c)?;
            best[i] = best[i].min(took);
            results[i] = out;
        }
    }
    let starts = |x: &clinstream::index::Chunked| -> Vec<usize> {
        x.chunks.iter().map(|c| c.units.start + c.overlap_units).collect()
    };
    let exact = &results[0];
    let mut modes_out = Vec::new();
    for (i, mode) in all_modes.iter().enumerate() {
        let (mut shared, mut total, mut identical) = (0usize, 0usize, 0usize);
        let mut cosines = Vec::new();
        for (e, m) in exact.iter().zip(&results[i]) {
            let (a, b) = (starts(e), starts(m));
            total += a.len();
            shared += a.iter().filter(|x| b.contains(x)).count();
            identical += usize::from(a == b);
            for (c, v) in m.chunks.iter().zip(&m.vectors) {
                if let Some(k) = e.chunks.iter().position(|x| x.units == c.units) {
                    cosines.push(v.iter().zip(&e.vectors[k]).map(|(x, y)| f64::from(x * y)).sum::<f64>());
                }
            }
        }
        let (embedded, bare, bound) = mode_bound(settings, &chunkers[i], mode, &docs, &results[i])?;
        let notes_per_s = docs.len() as f64 / best[i].as_secs_f64();
        modes_out.push(SeosMode {
            mode: mode.clone(),
            seconds: best[i].as_secs_f64(),
            notes_per_s,
            embedded_tokens: embedded,
            tokens_per_note_token: embedded as f64 / note_tokens.max(1) as f64,
            chunks: results[i].iter().map(|x| x.chunks.len()).sum(),
            cut_agreement: shared as f64 / total.max(1) as f64,
            identical_plans: identical as f64 / docs.len().max(1) as f64,
            mean_chunk_cosine: cosines.iter().sum::<f64>() / cosines.len().max(1) as f64,
            min_chunk_cosine: cosines.iter().copied().fold(f64::INFINITY, f64::min),
            bare_tokens_per_s: bare,
            bound_notes_per_s: bound,
            vs_bound: notes_per_s / bound.max(f64::MIN_POSITIVE),
        });
    }
    Ok(SeosBench {
        model: embedder.info().name.clone(),
        notes: docs.len(),
        note_tokens,
        chunk_tokens: settings.chunking.chunk_tokens,
        runs: runs.max(1),
        modes: modes_out,
    })
}

type Docs = Vec<std::sync::Arc<clinstream::model::Document>>;

/// What the SEOS benches share: a 2-worker runtime, the embedder, and the notes through the text stages.
fn seos_setup(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    events: &[Vec<u8>],
) -> anyhow::Result<(tokio::runtime::Runtime, clinstream::embed::Embedder, Docs)> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let embedder = clinstream::embed::Embedder::start(&settings.embed)?;
    let docs = events.iter().filter_map(|e| pipeline.process(e).ok()).map(std::sync::Arc::new).collect();
    Ok((rt, embedder, docs))
}

/// One chunker per mode (`groups`, `sentences`, `composed`: SEOS with those vectors; `fixed`: fixed-size chunks).
fn seos_chunkers(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    embedder: &clinstream::embed::Embedder,
    modes: &[String],
) -> anyhow::Result<Vec<clinstream::index::Chunker>> {
    if let Some(bad) = modes.iter().find(|m| !["groups", "sentences", "composed", "fixed"].contains(&m.as_str())) {
        anyhow::bail!("--modes: `{bad}` is not groups, sentences, composed or fixed");
    }
    let mut base = settings.clone();
    base.chunking.strategy = "seos".into();
    modes
        .iter()
        .map(|m| {
            let mut s = base.clone();
            if m == "fixed" {
                // Fixed-size chunks: no SEOS vectors, the chunks alone go to the model (its bound for `make bench`).
                s.chunking.strategy = "fixed".into();
            } else {
                s.chunking.seos_vectors = m.clone();
            }
            clinstream::index::Chunker::new(&s, embedder.clone(), pipeline.compiled())
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect()
}

/// Chunks (and embeds) every note with `in_flight` notes at once, as the worker does: the time and the results.
fn chunk_all(
    rt: &tokio::runtime::Runtime,
    chunker: &clinstream::index::Chunker,
    docs: &[std::sync::Arc<clinstream::model::Document>],
    in_flight: usize,
) -> anyhow::Result<(Duration, Vec<clinstream::index::Chunked>)> {
    use std::sync::Arc;
    rt.block_on(async {
        let clock = Instant::now();
        let semaphore = Arc::new(tokio::sync::Semaphore::new(in_flight));
        let mut tasks = Vec::with_capacity(docs.len());
        for d in docs {
            let permit = semaphore.clone().acquire_owned().await?;
            let (c, d) = (chunker.clone(), Arc::clone(d));
            tasks.push(tokio::spawn(async move {
                let r = c.chunk(&d).await;
                drop(permit);
                r
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await?.map_err(|e| anyhow::anyhow!("{}", e.code.as_str()))?);
        }
        Ok((clock.elapsed(), out))
    })
}

/// A mode's embedding bound on these notes: (embedded tokens, the bare loop's tokens/s on the mode's own model
/// inputs, notes/s if nothing but the model took time).
fn mode_bound(
    settings: &clinstream::config::Settings,
    chunker: &clinstream::index::Chunker,
    mode: &str,
    docs: &[std::sync::Arc<clinstream::model::Document>],
    chunked: &[clinstream::index::Chunked],
) -> anyhow::Result<(usize, f64, f64)> {
    let embedded: usize = chunked.iter().map(|x| x.embedded_tokens).sum();
    let inputs = model_inputs(chunker, mode, docs, chunked)?;
    anyhow::ensure!(
        inputs.iter().map(Vec::len).sum::<usize>() == embedded,
        "bench seos: the rebuilt model inputs of `{mode}` differ from what the chunker embedded"
    );
    let bare = if inputs.is_empty() {
        0.0
    } else {
        let (tokens, took) = clinstream::embed::bare_loop(&settings.embed, &inputs)?;
        tokens as f64 / took.as_secs_f64()
    };
    Ok((embedded, bare, bare / (embedded as f64 / docs.len().max(1) as f64).max(1.0)))
}

/// The embedding bound alone (`clinstream-lab bench seos --bound-only`): each mode's notes chunked once, then its model
/// inputs through the bare loop. For measuring a bound right beside an end-to-end run (`make bench`, step 3).
#[derive(Debug, serde::Serialize)]
pub struct Bound {
    pub mode: String,
    pub notes: usize,
    pub embedded_tokens: usize,
    pub bare_tokens_per_s: f64,
    pub bound_notes_per_s: f64,
}

pub fn bounds(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    events: &[Vec<u8>],
    modes: &[String],
) -> anyhow::Result<Vec<Bound>> {
    let (rt, embedder, docs) = seos_setup(settings, pipeline, events)?;
    let chunkers = seos_chunkers(settings, pipeline, &embedder, modes)?;
    let mut out = Vec::with_capacity(modes.len());
    for (mode, chunker) in modes.iter().zip(&chunkers) {
        let (_, chunked) = chunk_all(&rt, chunker, &docs, settings.pipeline.in_flight.max(1))?;
        let (embedded_tokens, bare_tokens_per_s, bound_notes_per_s) =
            mode_bound(settings, chunker, mode, &docs, &chunked)?;
        out.push(Bound {
            mode: mode.clone(),
            notes: docs.len(),
            embedded_tokens,
            bare_tokens_per_s,
            bound_notes_per_s,
        });
    }
    Ok(out)
}

/// The token ids a SEOS mode gave the model for these notes, rebuilt from their units and plans: the groups
/// (`groups`) or the sentences (`sentences`, `composed`) of notes with more than one unit, then the chunks (not for
/// `composed`; only the chunks for `fixed`).
fn model_inputs(
    chunker: &clinstream::index::Chunker,
    mode: &str,
    docs: &[std::sync::Arc<clinstream::model::Document>],
    chunked: &[clinstream::index::Chunked],
) -> anyhow::Result<Vec<Vec<u32>>> {
    let mut texts: Vec<&str> = Vec::new();
    for (d, c) in docs.iter().zip(chunked) {
        let text = &d.note.text;
        let units = chunker.units(d);
        match mode {
            "groups" if units.len() >= 2 => {
                for r in clinstream::stages::chunk::groups(&units, chunker.neighbours()) {
                    texts.push(&text[units[r.start].start..units[r.end - 1].end]);
                }
            }
            "sentences" if units.len() >= 2 => texts.extend(units.iter().map(|u| &text[u.start..u.end])),
            "composed" => texts.extend(units.iter().map(|u| &text[u.start..u.end])),
            _ => {}
        }
        if mode != "composed" {
            texts.extend(c.chunks.iter().map(|ch| &text[ch.start..ch.end]));
        }
    }
    Ok(chunker.embedder().encode(&texts)?)
}

/// Recall of int8 scalar quantization against exact search on a Qdrant server (`make bench`).
#[derive(Debug, serde::Serialize)]
pub struct QuantizationBench {
    pub model: String,
    /// Notes whose sentence groups were stored, and how many points that made.
    pub notes: usize,
    pub points: u64,
    /// Points the server had indexed with HNSW when the queries ran (below Qdrant's indexing threshold a segment
    /// is searched without the graph; the bench asks for the graph everywhere).
    pub indexed_vectors: u64,
    /// Queries: sentence groups of further notes, not stored.
    pub queries: usize,
    pub top: usize,
    pub modes: Vec<SearchMode>,
}

#[derive(Debug, serde::Serialize)]
pub struct SearchMode {
    pub search: clinstream::store::DenseSearch,
    /// Mean share of the exact top-`top` ids found (exact search: 1 by definition).
    pub recall: f64,
    pub mean_ms: f64,
    pub p95_ms: f64,
}

/// Stores the SEOS sentence groups of `notes` notes in a new int8-quantized collection on the server at `url`,
/// waits until its optimizers are idle, then asks `queries` held-out sentence groups for their `top` neighbours
/// by exact search (the truth), HNSW on full vectors, and HNSW on int8 vectors with and without rescoring.
pub fn quantization(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    events: &[Vec<u8>],
    notes: usize,
    queries: usize,
    top: usize,
    url: &str,
) -> anyhow::Result<QuantizationBench> {
    use clinstream::store::{DenseSearch, Point, server::ServerStore};
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let embedder = clinstream::embed::Embedder::start(&settings.embed)?;
    let per_note = embed_inputs(pipeline, events, &embedder);
    anyhow::ensure!(per_note.len() > notes, "need more than {notes} readable notes, found {}", per_note.len());
    let mut store_settings = settings.store.clone();
    store_settings.url = url.to_string();
    store_settings.quantization = "int8".into();
    store_settings.alias.clear();
    store_settings.collection = format!("clinstream-bench-int8-{}", std::process::id());
    rt.block_on(async {
        let dim = embedder.info().dim;
        let store = ServerStore::open(&store_settings, Some(dim)).await?;
        for (n, inputs) in per_note[..notes].iter().enumerate() {
            let vectors = embedder.embed_ids(inputs.clone()).await?;
            let points = vectors
                .into_iter()
                .enumerate()
                .map(|(i, dense)| Point {
                    id: clinstream::store::point_id(&format!("bench-{n}"), "1", i),
                    dense,
                    sparse: Default::default(),
                    payload: Default::default(),
                })
                .collect();
            store.upsert(points).await?;
        }
        let held_out: Vec<Vec<u32>> = per_note[notes..].iter().flatten().cloned().collect();
        let step = (held_out.len() / queries.max(1)).max(1);
        let picked: Vec<Vec<u32>> = held_out.into_iter().step_by(step).take(queries).collect();
        let query_vectors = embedder.embed_ids(picked).await?;
        store.index_every_segment().await?;
        let waited = Instant::now();
        let (points, indexed) = loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let (points, indexed, green) = store.index_status().await?;
            if (green && indexed >= points) || waited.elapsed() > Duration::from_secs(600) {
                break (points, indexed);
            }
        };
        let modes = [
            DenseSearch::Exact,
            DenseSearch::Hnsw,
            DenseSearch::Int8 { rescore: false, oversampling: 1.0 },
            DenseSearch::Int8 { rescore: true, oversampling: 1.0 },
            DenseSearch::Int8 { rescore: true, oversampling: 2.0 },
        ];
        let mut truth = Vec::new();
        for q in &query_vectors {
            truth.push(store.nearest(q.clone(), top, DenseSearch::Exact).await?);
        }
        let mut out = Vec::new();
        for how in modes {
            let (mut found, mut ms) = (0usize, Vec::new());
            for (q, exact) in query_vectors.iter().zip(&truth) {
                let clock = Instant::now();
                let ids = store.nearest(q.clone(), top, how).await?;
                ms.push(clock.elapsed().as_secs_f64() * 1e3);
                found += ids.iter().filter(|id| exact.contains(id)).count();
            }
            let expected: usize = truth.iter().map(Vec::len).sum();
            let mean_ms = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
            ms.sort_by(f64::total_cmp);
            out.push(SearchMode {
                search: how,
                recall: found as f64 / expected.max(1) as f64,
                mean_ms,
                p95_ms: percentile(&ms, 0.95),
            });
        }
        Ok(QuantizationBench {
            model: embedder.info().name.clone(),
            notes,
            points,
            indexed_vectors: indexed,
            queries: query_vectors.len(),
            top,
            modes: out,
        })
    })
}

/// One row of the growth table: a note of `tokens` CLEAR tokens, its text-stage and indexing cost, the peak
/// resident memory so far, and the largest CLEAR context of any variable against the budget.
#[derive(Debug, Serialize)]
pub struct GrowthRow {
    pub note: String,
    pub tokens: usize,
    pub bytes: usize,
    /// Text stages (decode to knowledge graph): median of `runs` runs.
    pub text_ms: f64,
    pub text_us_per_1k_tokens: f64,
    pub runs: usize,
    /// Synthetic notes: the real notes it was made of, and the sum of their own text-stage times (median of 5
    /// runs each) — the cost of the same text as separate notes.
    pub parts: Option<usize>,
    pub parts_text_ms: Option<f64>,
    /// Indexing (units, SEOS plan, chunk vectors): one run.
    pub index_ms: Option<f64>,
    pub index_us_per_1k_tokens: Option<f64>,
    pub embedded_tokens: Option<usize>,
    pub chunks: Option<usize>,
    /// Peak resident memory of the process (VmHWM) after this row, above the value before the first row.
    pub peak_rss_growth_mb: f64,
    pub clear_max_context_tokens: usize,
    pub token_budget: usize,
}

#[derive(Debug, Serialize)]
pub struct GrowthBench {
    pub rows: Vec<GrowthRow>,
    /// Per-token text-stage time of the longest note ÷ that of the median real note (1 = linear).
    pub text_per_token_ratio: f64,
    /// The same for indexing (when measured).
    pub index_per_token_ratio: Option<f64>,
    pub clear_within_budget: bool,
}

/// The process's peak resident set (VmHWM, Linux), in MB; 0 elsewhere.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A note's text as a DocumentReference event.
fn event_of(id: &str, text: &str) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::to_vec(&serde_json::json!({
        "resourceType": "DocumentReference", "id": id, "status": "current",
        "content": [{"attachment": {"contentType": "text/plain; charset=utf-8", "data": b64.encode(text)}}]
    }))
    .expect("JSON")
}

/// How cost grows with note length: real notes at the median, 90th and 99th percentile and the longest of the
/// corpus, then synthetic notes of `synthetic` tokens each made by concatenating real notes (in corpus order). The
/// text stages run on each (median of several runs), then — with `index` — the indexer's first half (units, SEOS
/// plan, chunk vectors, on the configured embedder).
pub fn growth(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    csv_path: &Path,
    column: &str,
    synthetic: &[usize],
    index: bool,
) -> anyhow::Result<GrowthBench> {
    use clinstream::stages::clear::count_tokens;
    let rows = csv::records(&read(csv_path)?);
    let texts: Vec<&str> =
        rows.iter().filter_map(|r| r.get(column)).map(|t| t.as_str()).filter(|t| !t.trim().is_empty()).collect();
    anyhow::ensure!(!texts.is_empty(), "no notes in column `{column}`");
    let mut by_len: Vec<(usize, &str)> = texts.iter().map(|t| (count_tokens(t), *t)).collect();
    by_len.sort_by_key(|(n, _)| *n);
    let pick = |p: f64| by_len[((by_len.len() - 1) as f64 * p).round() as usize].1.to_string();
    let mut notes: Vec<(String, String, usize)> = vec![
        ("real, median".into(), pick(0.5), 0),
        ("real, p90".into(), pick(0.9), 0),
        ("real, p99".into(), pick(0.99), 0),
        ("real, longest".into(), pick(1.0), 0),
    ];
    for &target in synthetic {
        let (mut text, mut parts) = (String::new(), 0);
        for t in texts.iter().cycle() {
            if count_tokens(&text) >= target {
                break;
            }
            text.push_str(t);
            text.push_str("\n\n");
            parts += 1;
        }
        notes.push((format!("synthetic {}k", target / 1000), text, parts));
    }
    let median_ms = |event: &[u8], runs: usize| -> f64 {
        let mut times: Vec<f64> = (0..runs)
            .map(|_| {
                let clock = Instant::now();
                let _ = std::hint::black_box(pipeline.process(event));
                clock.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let chunker = if index {
        let embedder = clinstream::embed::Embedder::start(&settings.embed)?;
        Some(
            clinstream::index::Chunker::new(settings, embedder, pipeline.compiled())
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        )
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let start_rss = peak_rss_mb();
    let mut out = Vec::new();
    for (i, (label, text, parts)) in notes.iter().enumerate() {
        let event = event_of(&format!("growth-{i}"), text);
        let tokens = count_tokens(text);
        // About 2M tokens of work per row for the small ones, at least 3 runs.
        let runs = (2_000_000 / tokens.max(1)).clamp(3, 200);
        let mut times = Vec::with_capacity(runs);
        let mut doc = None;
        for _ in 0..runs {
            let clock = Instant::now();
            let d = pipeline.process(&event).map_err(|e| anyhow::anyhow!("{}", e.error.code.as_str()))?;
            times.push(clock.elapsed().as_secs_f64());
            doc = Some(d);
        }
        times.sort_by(f64::total_cmp);
        let text_s = times[times.len() / 2];
        let doc = doc.expect("at least one run");
        let clear_max = doc.variables.iter().map(|v| v.context_tokens).max().unwrap_or(0);
        let (mut index_ms, mut embedded, mut chunks) = (None, None, None);
        if let Some(c) = &chunker {
            let doc = std::sync::Arc::new(doc);
            let clock = Instant::now();
            let chunked = rt.block_on(c.chunk(&doc)).map_err(|e| anyhow::anyhow!("{}", e.code.as_str()))?;
            index_ms = Some(clock.elapsed().as_secs_f64() * 1e3);
            embedded = Some(chunked.embedded_tokens);
            chunks = Some(chunked.chunks.len());
        }
        let per_k = |ms: f64| ms * 1e3 / (tokens.max(1) as f64 / 1000.0);
        let parts_text_ms = (*parts > 0)
            .then(|| texts.iter().cycle().take(*parts).map(|t| median_ms(&event_of("growth-part", t), 5)).sum::<f64>());
        out.push(GrowthRow {
            note: label.clone(),
            tokens,
            bytes: text.len(),
            text_ms: text_s * 1e3,
            text_us_per_1k_tokens: per_k(text_s * 1e3),
            runs,
            parts: (*parts > 0).then_some(*parts),
            parts_text_ms,
            index_ms,
            index_us_per_1k_tokens: index_ms.map(per_k),
            embedded_tokens: embedded,
            chunks,
            peak_rss_growth_mb: peak_rss_mb() - start_rss,
            clear_max_context_tokens: clear_max,
            token_budget: settings.clear.token_budget,
        });
    }
    let last = out.last().expect("rows");
    let text_ratio = last.text_us_per_1k_tokens / out[0].text_us_per_1k_tokens.max(1e-12);
    let index_ratio = last.index_us_per_1k_tokens.zip(out[0].index_us_per_1k_tokens).map(|(a, b)| a / b.max(1e-12));
    let within = out.iter().all(|r| r.clear_max_context_tokens <= r.token_budget);
    Ok(GrowthBench {
        rows: out,
        text_per_token_ratio: text_ratio,
        index_per_token_ratio: index_ratio,
        clear_within_budget: within,
    })
}

/// What `bench store --csv` writes for each note.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StorePoints {
    /// The points the worker writes: its chunking (`chunking.*`, SEOS by default) and its embedder's vectors
    /// (`embed.*`; with `embed.execution_provider = "synthetic"` no model runs), so that the store's write path is
    /// measured on exactly what an end-to-end run writes.
    Worker,
    /// Fixed chunks with placeholder dense vectors (two non-zero components): no embedder at all.
    Placeholder,
}

/// One setting of `bench store`.
#[derive(Debug, Serialize)]
pub struct StoreRun {
    pub store: &'static str,
    /// Points per document (chunks and windows), and chunk points per document.
    pub points_per_doc: f64,
    pub chunks_per_doc: f64,
    /// `store.group_points` (0 = every document written alone).
    pub group_points: usize,
    /// `store.shards` (embedded: shards in the process, each with its own writer; server: the collection's).
    pub shards: u32,
    pub docs: usize,
    pub seconds: f64,
    pub docs_per_s: f64,
    /// Embedded store with `--settled`: seconds until the points were durable and the maintenance their writes
    /// started had finished (the segment rebuilds `seconds` leaves running), and documents per second over them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled_docs_per_s: Option<f64>,
    /// Mean documents per group write.
    pub mean_group_documents: f64,
    /// docs/s over the same store's run with `group_points = 0` in this invocation.
    pub ratio_to_ungrouped: Option<f64>,
}

/// Writes through `store::Writer` as the indexer does: `docs` documents, `concurrency` at once (the in-flight
/// budget), each with `chunks` points carrying a dense (random unit, the model's width) and a sparse vector and
/// `windows` vector-less window points, payloads shaped like the worker's (ids, record, ~800 characters of text).
/// Each `group_points` setting gets a fresh store: an embedded one in a temporary directory, and with `url` also
/// a new collection on that Qdrant server (dropped afterwards). Checks the point count after each run.
#[allow(clippy::too_many_arguments)]
pub fn store(
    settings: &clinstream::config::Settings,
    real: Option<(&Pipeline, &[Vec<u8>], StorePoints)>,
    docs: usize,
    chunks: usize,
    windows: usize,
    concurrency: usize,
    groups: &[usize],
    url: Option<&str>,
    runs: usize,
    settled: bool,
) -> anyhow::Result<Vec<StoreRun>> {
    use std::sync::Arc;

    use clinstream::store::{Point, Sparse, Store, Writer, point_id, window_id};
    // The worker's own runtime (async threads, blocking pool), so the store is measured as the worker drives it.
    let rt = clinstream::cli::runtime(settings)?;
    let dim = 384;
    let text = "x".repeat(800);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let mut documents: Vec<(String, Vec<Point>)> = Vec::with_capacity(docs);
    if let Some((pipeline, events, shape)) = real {
        // Real notes: the worker's payloads, windows and BM25 vectors; the chunks and dense vectors either the
        // worker's own (its chunking, its embedder as `embed.*` configures it) or fixed chunks with placeholders.
        let mut embed = settings.embed.clone();
        if shape == StorePoints::Placeholder {
            embed.execution_provider = "cpu".into();
        }
        let embedder = clinstream::embed::Embedder::start(&embed)?;
        let chunker = clinstream::index::Chunker::new(settings, embedder, pipeline.compiled())?;
        for event in events.iter().cycle().take(docs) {
            let Ok(doc) = pipeline.process(event) else { continue };
            let n = documents.len();
            let doc_id = format!("{}-{n}", doc.note.doc_id);
            let mut points = match shape {
                StorePoints::Placeholder => chunker.points_unembedded(&doc, "1"),
                StorePoints::Worker => {
                    let doc = Arc::new(doc);
                    rt.block_on(async {
                        let chunked = chunker.chunk(&doc).await?;
                        chunker.points(&doc, chunked, "1").await.map(|(points, _)| points)
                    })?
                }
            };
            for (i, p) in points.iter_mut().enumerate() {
                p.id = point_id(&doc_id, "1", i);
                p.payload.insert("doc_id".into(), doc_id.clone().into());
            }
            documents.push((doc_id, points));
        }
    }
    for d in 0..if real.is_some() { 0 } else { docs } {
        let doc_id = format!("bench-{d}");
        let payload = |record: &str| {
            let mut m = serde_json::Map::new();
            m.insert("doc_id".into(), doc_id.clone().into());
            m.insert("doc_version".into(), "1".into());
            m.insert("patient".into(), format!("Patient/{}", d % 97).into());
            m.insert("record".into(), record.into());
            m.insert("text".into(), text.clone().into());
            m
        };
        let mut points = Vec::with_capacity(chunks + windows);
        for i in 0..chunks {
            let mut dense: Vec<f32> = (0..dim).map(|_| next()).collect();
            let norm = dense.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            dense.iter_mut().for_each(|x| *x /= norm);
            let indices: Vec<u32> = (0..30).map(|k| (d * 31 + i * 7 + k * 13) as u32 % 30_000).collect();
            let mut indices = indices;
            indices.sort_unstable();
            indices.dedup();
            let values = indices.iter().map(|_| 1.0).collect();
            points.push(Point {
                id: point_id(&doc_id, "1", i),
                dense,
                sparse: Sparse { indices, values },
                payload: payload("chunk"),
            });
        }
        for i in 0..windows {
            points.push(Point {
                id: window_id(&doc_id, "1", i),
                dense: Vec::new(),
                sparse: Sparse::default(),
                payload: payload("window"),
            });
        }
        documents.push((doc_id, points));
    }
    let docs = documents.len();
    let chunk_points: usize = documents.iter().map(|(_, p)| p.iter().filter(|p| !p.dense.is_empty()).count()).sum();
    let all_points: usize = documents.iter().map(|(_, p)| p.len()).sum();
    tracing::info!(docs, chunk_points, all_points, "bench store: documents ready");
    let documents = Arc::new(documents);
    let mut kinds: Vec<(&'static str, clinstream::config::StoreSettings)> = Vec::new();
    let mut embedded = settings.store.clone();
    embedded.kind = "embedded".into();
    embedded.alias.clear();
    kinds.push(("embedded", embedded));
    if let Some(url) = url {
        let mut server = settings.store.clone();
        server.kind = "qdrant".into();
        server.url = url.to_string();
        server.alias.clear();
        kinds.push(("qdrant", server));
    }
    let mut out: Vec<StoreRun> = Vec::new();
    for run in 0..runs.max(1) {
        for (kind, base) in &kinds {
            for &group_points in groups {
                let dir = std::env::temp_dir()
                    .join(format!("clinstream-bench-store-{}-{run}-{group_points}", std::process::id()));
                let mut s = base.clone();
                s.path = dir.display().to_string();
                s.collection = format!("clinstream-bench-store-{}-{run}-{group_points}", std::process::id());
                let documents = documents.clone();
                let result = rt.block_on(async {
                    let store = Arc::new(Store::open(&s, dim).await?);
                    let writer = Writer::start(store.clone(), group_points, s.group_concurrency);
                    let groups0 = clinstream::telemetry::metrics::metrics().store_group_documents.get_sample_count();
                    let limit = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
                    let clock = Instant::now();
                    let mut tasks = Vec::with_capacity(docs);
                    for d in 0..docs {
                        let (writer, documents, limit) = (writer.clone(), documents.clone(), limit.clone());
                        let permit = limit.acquire_owned().await?;
                        tasks.push(tokio::spawn(async move {
                            let (doc_id, points) = &documents[d];
                            let r = writer.write(doc_id, points.clone()).await;
                            drop(permit);
                            r
                        }));
                    }
                    for t in tasks {
                        t.await??;
                    }
                    let seconds = clock.elapsed().as_secs_f64();
                    let settled = match &*store {
                        Store::Embedded(embedded) if settled => {
                            embedded.maintenance_idle().await;
                            Some(clock.elapsed().as_secs_f64())
                        }
                        _ => None,
                    };
                    let groups =
                        clinstream::telemetry::metrics::metrics().store_group_documents.get_sample_count() - groups0;
                    let count = store.count().await?;
                    if let Store::Server(server) = &*store {
                        server.drop_collection().await?;
                    }
                    let mean_group = if groups == 0 { 1.0 } else { docs as f64 / groups as f64 };
                    anyhow::Ok((seconds, settled, count, mean_group))
                });
                let _ = std::fs::remove_dir_all(&dir);
                let (seconds, settled, count, mean_group) = result?;
                anyhow::ensure!(count == chunk_points, "{kind} store holds {count} chunks, expected {chunk_points}");
                out.push(StoreRun {
                    store: kind,
                    points_per_doc: all_points as f64 / docs as f64,
                    chunks_per_doc: chunk_points as f64 / docs as f64,
                    group_points,
                    shards: base.shards,
                    docs,
                    seconds,
                    docs_per_s: docs as f64 / seconds,
                    settled_seconds: settled,
                    settled_docs_per_s: settled.map(|s| docs as f64 / s),
                    mean_group_documents: mean_group,
                    ratio_to_ungrouped: None,
                });
            }
        }
    }
    // Best of the runs per setting, then the ratio to the ungrouped setting of the same store.
    let mut best: Vec<StoreRun> = Vec::new();
    for r in out {
        match best.iter_mut().find(|b| b.store == r.store && b.group_points == r.group_points) {
            Some(b) if b.docs_per_s >= r.docs_per_s => {}
            Some(b) => *b = r,
            None => best.push(r),
        }
    }
    let base: Vec<(&'static str, f64)> =
        best.iter().filter(|r| r.group_points == 0).map(|r| (r.store, r.docs_per_s)).collect();
    for r in &mut best {
        r.ratio_to_ungrouped = base.iter().find(|(k, _)| *k == r.store).map(|(_, v)| r.docs_per_s / v);
    }
    Ok(best)
}

/// `bench tree`: per note, indexing and then the patient's tree rebuild, timed.
#[derive(Debug, Serialize)]
pub struct TreeRun {
    pub store: String,
    pub notes: usize,
    pub patients: usize,
    pub index_ms_p50: f64,
    pub index_ms_p99: f64,
    pub tree_ms_p50: f64,
    pub tree_ms_p99: f64,
    pub tree_ms_max: f64,
    pub tree_ms_mean: f64,
    /// The patient's chunks read per rebuild.
    pub leaves_mean: f64,
    pub leaves_max: usize,
    /// Summary points of all patients at the end.
    pub summaries: usize,
    /// Summaries written per rebuild, and of them those whose text was embedded (the others kept their vector).
    pub written_mean: f64,
    pub embedded_mean: f64,
    /// The model's input tokens per rebuild for those.
    pub embedded_tokens_mean: f64,
    /// Summaries per rebuild left to be embedded off the acknowledgement path.
    pub deferred_mean: f64,
    /// The rebuild's parts, mean and p99 in ms: reading the patient's points, building the tree, embedding in the
    /// rebuild, replacing the summary points.
    pub parts_ms: serde_json::Value,
    /// `raptor.summary_vectors` of the run.
    pub summary_vectors: String,
    /// Summary texts embedded after the rebuild (`raptor.background_vectors`), timed after each note's rebuild
    /// (`tree_ms` is then the rebuild in the note's path); 0 when embedded in the rebuild or not at all.
    pub background_vectors: bool,
    pub background_ms_p50: f64,
    pub background_ms_p99: f64,
    pub background_ms_mean: f64,
    /// Each patient's tree rebuilt once more at the end, nothing changed (no summary to embed): the rebuild's
    /// cost without the model, over every patient's whole record.
    pub unchanged_ms_p50: f64,
    pub unchanged_ms_p99: f64,
    /// The rebuild's p99 against the goal (50 ms a note): below 1 meets it.
    pub tree_p99_vs_goal: f64,
    /// Mean rebuild ÷ mean indexing of a note (embedding included).
    pub tree_vs_index: f64,
}

pub fn tree(
    settings: &clinstream::config::Settings,
    pipeline: &Pipeline,
    documents: &std::path::Path,
    limit: Option<usize>,
    url: Option<&str>,
) -> anyhow::Result<TreeRun> {
    use std::sync::Arc;

    let text = std::fs::read_to_string(documents)?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).take(limit.unwrap_or(usize::MAX)).collect();
    let mut s = settings.clone();
    s.raptor.enabled = false; // rebuilt and timed here instead
    let dir = std::env::temp_dir().join(format!("clinstream-bench-tree-{}", std::process::id()));
    match url {
        Some(u) => {
            s.store.kind = "qdrant".into();
            s.store.url = u.to_string();
            s.store.alias.clear();
            s.store.collection = format!("clinstream-bench-tree-{}", std::process::id());
        }
        None => {
            s.store.kind = "embedded".into();
            s.store.path = dir.display().to_string();
        }
    }
    let rt = clinstream::cli::runtime(&s)?;
    let r = rt.block_on(async {
        let indexer = clinstream::index::Indexer::start(&s, pipeline.compiled()).await?;
        let (mut index_ms, mut tree_ms, mut rebuilds) = (Vec::new(), Vec::new(), Vec::new());
        let mut background_ms = Vec::new();
        let mut patients = std::collections::HashSet::new();
        for line in &lines {
            let Ok(doc) = pipeline.process(line.as_bytes()) else { continue };
            let Some(patient) = doc.note.patient.clone() else { continue };
            let doc = Arc::new(doc);
            let clock = Instant::now();
            indexer.index(&doc).await.map_err(|e| anyhow::anyhow!("indexing: {}", e.code.as_str()))?;
            index_ms.push(clock.elapsed().as_secs_f64() * 1e3);
            let clock = Instant::now();
            let rebuild = indexer.rebuild_tree(&patient).await?;
            tree_ms.push(clock.elapsed().as_secs_f64() * 1e3);
            rebuilds.push(rebuild);
            // The work left off the acknowledgement path (summary texts to embed), waited for before the next
            // note so that it is timed alone: no round serves two notes here.
            let clock = Instant::now();
            indexer.tree_work_settled().await;
            background_ms.push(clock.elapsed().as_secs_f64() * 1e3);
            patients.insert(patient);
        }
        let mut unchanged = Vec::new();
        let mut names: Vec<&String> = patients.iter().collect();
        names.sort();
        for patient in names {
            let clock = Instant::now();
            indexer.rebuild_tree(patient).await?;
            unchanged.push(clock.elapsed().as_secs_f64() * 1e3);
        }
        unchanged.sort_by(f64::total_cmp);
        let summaries = indexer
            .store()
            .count_where(&clinstream::store::Filters::default(), clinstream::store::Record::Summaries)
            .await?;
        if let clinstream::store::Store::Server(server) = indexer.store().as_ref() {
            server.drop_collection().await?;
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let sorted = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v
        };
        let (im, tm, bm) = (mean(&index_ms), mean(&tree_ms), mean(&background_ms));
        let (index_ms, tree_ms, background_ms) = (sorted(index_ms), sorted(tree_ms), sorted(background_ms));
        let per_rebuild = |f: fn(&clinstream::index::TreeRebuild) -> usize| {
            rebuilds.iter().map(f).sum::<usize>() as f64 / rebuilds.len().max(1) as f64
        };
        anyhow::Ok(TreeRun {
            store: s.store.kind.clone(),
            notes: tree_ms.len(),
            patients: patients.len(),
            index_ms_p50: percentile(&index_ms, 0.5),
            index_ms_p99: percentile(&index_ms, 0.99),
            tree_ms_p50: percentile(&tree_ms, 0.5),
            tree_ms_p99: percentile(&tree_ms, 0.99),
            tree_ms_max: tree_ms.last().copied().unwrap_or(0.0),
            tree_ms_mean: tm,
            leaves_mean: per_rebuild(|r| r.leaves),
            leaves_max: rebuilds.iter().map(|r| r.leaves).max().unwrap_or(0),
            summaries,
            written_mean: per_rebuild(|r| r.written),
            embedded_mean: per_rebuild(|r| r.embedded),
            embedded_tokens_mean: per_rebuild(|r| r.embedded_tokens),
            deferred_mean: per_rebuild(|r| r.deferred),
            parts_ms: {
                let part = |f: fn(&clinstream::index::TreeRebuild) -> Duration| {
                    let v = sorted(rebuilds.iter().map(|r| f(r).as_secs_f64() * 1e3).collect());
                    serde_json::json!({"mean": mean(&v), "p99": percentile(&v, 0.99)})
                };
                serde_json::json!({
                    "read": part(|r| r.read),
                    "build": part(|r| r.built),
                    "embed": part(|r| r.embedding),
                    "store": part(|r| r.stored),
                })
            },
            summary_vectors: s.raptor.summary_vectors.clone(),
            background_vectors: s.raptor.summary_vectors == "text" && s.raptor.background_vectors,
            background_ms_p50: percentile(&background_ms, 0.5),
            background_ms_p99: percentile(&background_ms, 0.99),
            background_ms_mean: bm,
            unchanged_ms_p50: percentile(&unchanged, 0.5),
            unchanged_ms_p99: percentile(&unchanged, 0.99),
            tree_p99_vs_goal: percentile(&tree_ms, 0.99) / 50.0,
            tree_vs_index: tm / im.max(1e-9),
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    r
}
