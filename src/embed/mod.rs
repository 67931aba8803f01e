//! The embedder: one model per process on its own thread, behind a clonable handle.
//!
//! Callers (every in-flight document) tokenize on their own thread and send the token ids over a bounded channel
//! (`embed.queue`; a full queue is backpressure). The model thread gathers what is waiting — up to `linger_ms`
//! for more when the batch is not yet full, not at all when a query waits on it (`embed_now`) — sorts it by length so padding stays small, cuts batches by a token
//! budget that counts padding (`longest × inputs ≤ embed.batch_tokens`) and `embed.max_batch`, runs them, and
//! answers each request when all its inputs are done. Inputs longer than the model's limit are truncated by the
//! tokenizer (chunking keeps chunks under it, so only SEOS sentence groups can be cut).
//!
//! Start-up loads the ONNX Runtime library and the model, checks the budget against the model's limit, and runs a
//! warm-up batch (which also measures the vector dimension) before the worker reports ready.

mod backend;
pub mod importance;
mod tokens;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenizers::{PostProcessor, Tokenizer};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info};

use crate::config::EmbedSettings;
use crate::telemetry::metrics::metrics;

/// The embedder failed; the worker cannot index (a Halt: nothing is committed past the document). Messages name
/// files, settings and the runtime's status, never input text.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    /// The runtime, model or tokenizer could not be loaded or set up.
    #[error("{0}")]
    Load(String),
    /// Tokenizing or running the model failed.
    #[error("{0}")]
    Inference(String),
    /// The model thread has stopped (the process is shutting down or the thread failed).
    #[error("the model thread has stopped")]
    Stopped,
}

impl EmbedError {
    /// The error code a document or run gets when this error ends it.
    pub fn code(&self) -> crate::error::ErrorCode {
        crate::error::ErrorCode::EmbedFailed
    }
}

impl From<String> for EmbedError {
    /// Set-up failures are described where they happen; they are all `Load`.
    fn from(why: String) -> Self {
        EmbedError::Load(why)
    }
}

/// What was loaded (for build info, the store's dimension check and payloads).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The model's name: the model directory's last component (`all-MiniLM-L6-v2`).
    pub name: String,
    pub dim: usize,
    /// Longest input in tokens, special tokens included.
    pub max_tokens: usize,
    /// Special tokens the tokenizer adds to one input (2 for BERT: [CLS] and [SEP]).
    pub special_tokens: usize,
    /// `cpu` or `cuda`.
    pub provider: &'static str,
    /// The files the vectors depend on (the model graph, the tokenizer), for [`ModelInfo::digest`].
    files: Vec<PathBuf>,
    digest: std::sync::OnceLock<String>,
}

impl ModelInfo {
    /// SHA-1 (hex) of what the vectors depend on: the provider kind, the model file's bytes and the tokenizer's.
    /// Computed on first use (reading the model once); two model files in one directory (fp32, fp16, int8) differ.
    pub fn digest(&self) -> &str {
        self.digest.get_or_init(|| {
            use sha1::Digest as _;
            let mut h = sha1::Sha1::new();
            h.update(if self.name == backend::SYNTHETIC { "synthetic" } else { "onnx" });
            for f in &self.files {
                h.update(f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
                let Ok(mut file) = std::fs::File::open(f) else {
                    h.update(b"unreadable");
                    continue;
                };
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(n @ 1..) = std::io::Read::read(&mut file, &mut buf) {
                    h.update(&buf[..n]);
                }
            }
            h.finalize().iter().map(|b| format!("{b:02x}")).collect()
        })
    }
}

struct Request {
    inputs: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
    /// A caller waiting on the answer (a query): the model thread runs what is queued without lingering for more.
    urgent: bool,
}

/// A clonable handle to the model thread.
#[derive(Clone)]
pub struct Embedder {
    tx: mpsc::Sender<Request>,
    tokenizer: Arc<tokens::Tokens>,
    info: Arc<ModelInfo>,
    /// Dropped after `tx` of the last handle: waits for the model thread to end.
    _thread: Arc<ModelThread>,
}

/// Joins the model thread when the last handle goes, so the session is released before the process exits: the
/// CUDA provider's own teardown at exit crashes under a session that another thread is still dropping.
struct ModelThread(Option<std::thread::JoinHandle<()>>);

impl Drop for ModelThread {
    fn drop(&mut self) {
        // Every sender is gone by now (each handle drops its `tx` first), so the thread finishes its last pool and
        // ends.
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder").field("info", &self.info).finish()
    }
}

/// The model directory's files.
pub fn model_files(s: &EmbedSettings) -> (PathBuf, PathBuf) {
    let dir = Path::new(&s.model_dir);
    (dir.join(&s.model_file), dir.join("tokenizer.json"))
}

fn backend_options<'a>(s: &'a EmbedSettings, model: &'a Path) -> backend::BackendOptions<'a> {
    backend::BackendOptions {
        library: &s.ort_library,
        model,
        provider: &s.execution_provider,
        cuda_device: s.cuda_device,
        intra_threads: s.intra_threads,
        intra_spinning: s.intra_spinning,
        output: &s.output,
    }
}

/// The model's own input limit: `max_seq_length` (sentence-transformers), else `max_position_embeddings`.
pub(crate) fn model_max_tokens(model_dir: &Path) -> Option<usize> {
    let read = |file: &str, key: &str| -> Option<usize> {
        let text = std::fs::read_to_string(model_dir.join(file)).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get(key)?.as_u64().map(|n| n as usize)
    };
    read("sentence_bert_config.json", "max_seq_length").or_else(|| read("config.json", "max_position_embeddings"))
}

impl Embedder {
    /// Loads the tokenizer and the model, starts the model thread, and warms it up. Blocking (call it from
    /// `spawn_blocking` or before the runtime is busy).
    pub fn start(s: &EmbedSettings) -> Result<Embedder, EmbedError> {
        let clock = Instant::now();
        let (model_path, tokenizer_path) = model_files(s);
        let dir = Path::new(&s.model_dir);
        let synthetic = s.execution_provider == backend::SYNTHETIC;
        // The synthetic backend runs no model: only the tokenizer (and config.json's width) is read.
        let needed: &[&PathBuf] = if synthetic { &[&tokenizer_path] } else { &[&model_path, &tokenizer_path] };
        for p in needed {
            if !p.is_file() {
                return Err(EmbedError::Load(format!(
                    "{} does not exist (run `make model`, or set embed.model_dir / embed.model_file)",
                    p.display()
                )));
            }
        }
        let max_tokens = match s.max_tokens {
            0 => model_max_tokens(dir).unwrap_or(512),
            n => n,
        };
        if s.batch_tokens < max_tokens {
            return Err(EmbedError::Load(format!(
                "embed.batch_tokens ({}) is smaller than the model's longest input ({max_tokens} tokens)",
                s.batch_tokens
            )));
        }
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| EmbedError::Load(format!("could not read {}: {e}", tokenizer_path.display())))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|e| EmbedError::Load(format!("tokenizer truncation: {e}")))?;
        let special_tokens = tokenizer.get_post_processor().map_or(0, |p| p.added_tokens(false));
        let mut model = backend::Backend::load(&backend_options(s, &model_path))?;
        // Warm-up: one real batch at the longest length the model takes, which also gives the dimension.
        let warm =
            tokenizer.encode("warm up ".repeat(max_tokens), true).map_err(|e| EmbedError::Load(e.to_string()))?;
        let probe = model.run(&[warm.get_ids()])?;
        let dim = probe.first().map_or(0, Vec::len);
        if dim == 0 {
            return Err(EmbedError::Load("the model returned an empty vector".to_string()));
        }
        let name = if synthetic {
            tracing::warn!(
                "Synthetic embedder (embed.execution_provider = synthetic): vectors hashed from token ids, no model. \
                 For benchmarks only; the stored vectors mean nothing."
            );
            backend::SYNTHETIC.to_string()
        } else {
            dir.canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| s.model_dir.clone())
        };
        let files =
            if synthetic { vec![tokenizer_path.clone()] } else { vec![model_path.clone(), tokenizer_path.clone()] };
        let info = Arc::new(ModelInfo {
            name,
            dim,
            max_tokens,
            special_tokens,
            provider: model.provider,
            files,
            digest: std::sync::OnceLock::new(),
        });
        let (tx, rx) = mpsc::channel(s.queue);
        let batching = Batching::new(s, Duration::from_millis(s.linger_ms));
        let thread = std::thread::Builder::new()
            .name("clinstream-embed".into())
            .spawn(move || model_thread(model, rx, batching))
            .map_err(|e| EmbedError::Load(format!("could not start the model thread: {e}")))?;
        info!(
            model = %info.name,
            dim = info.dim,
            max_tokens = info.max_tokens,
            provider = info.provider,
            took_ms = clock.elapsed().as_millis() as u64,
            "Embedding model loaded and warm."
        );
        Ok(Embedder {
            tx,
            tokenizer: Arc::new(tokens::Tokens::new(tokenizer)),
            info,
            _thread: Arc::new(ModelThread(Some(thread))),
        })
    }

    /// `start` on the blocking pool (loading and warming the model takes a while).
    pub async fn start_async(s: &EmbedSettings) -> Result<Embedder, EmbedError> {
        let s = s.clone();
        tokio::task::spawn_blocking(move || Embedder::start(&s))
            .await
            .map_err(|e| EmbedError::Load(format!("embedder start-up failed: {e}")))?
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// [`ModelInfo::digest`] computed off the async threads (the first call reads the model file).
    pub async fn digest(&self) -> String {
        let info = Arc::clone(&self.info);
        tokio::task::spawn_blocking(move || info.digest().to_string()).await.unwrap_or_default()
    }

    /// Tokens of `text` without special tokens (what a chunk's budget counts). Ids only, as in
    /// [`Embedder::encode_one`].
    pub fn count_tokens(&self, text: &str) -> usize {
        self.tokenizer.ids(text, false).map(|ids| ids.len()).unwrap_or(usize::MAX)
    }

    /// Token boundaries of `text` as byte offsets of each token's end (for cutting an over-long sentence).
    pub fn token_ends(&self, text: &str) -> Vec<usize> {
        self.tokenizer
            .full()
            .encode(text, false)
            .map(|e| e.get_offsets().iter().map(|&(_, end)| end).collect())
            .unwrap_or_default()
    }

    /// Token ids with special tokens, truncated to the model's limit.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>, EmbedError> {
        texts.iter().map(|t| self.encode_one(t)).collect()
    }

    /// One text's token ids with special tokens, truncated to the model's limit: ids only, without the offsets
    /// nothing here reads, and ASCII text through the tokenizer's shortcut (`tokens`: the same ids, half the time).
    pub fn encode_one(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        self.tokenizer.ids(text, true).map_err(|e| EmbedError::Inference(format!("tokenizer: {e}")))
    }

    /// [`Embedder::encode_one`] through the full tokenizer, without the shortcuts of `tokens` (the same ids; the
    /// reference `bench tokens` times the worker's path against).
    pub fn encode_reference(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let e = self.tokenizer.full().encode_fast(text, true);
        e.map(|e| e.get_ids().to_vec()).map_err(|e| EmbedError::Inference(format!("tokenizer: {e}")))
    }

    /// Embeds already-encoded inputs (unit vectors, in input order).
    pub async fn embed_ids(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.send(inputs, false).await
    }

    async fn send(&self, inputs: Vec<Vec<u32>>, urgent: bool) -> Result<Vec<Vec<f32>>, EmbedError> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request { inputs, reply, urgent }).await.map_err(|_| EmbedError::Stopped)?;
        rx.await.map_err(|_| EmbedError::Stopped)?
    }

    /// Tokenizes and embeds `texts`.
    pub async fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let ids = self.encode(texts)?;
        self.embed_ids(ids).await
    }

    /// [`Embedder::embed`] for a caller waiting on the answer (a query): its batch runs with whatever else is
    /// already queued, without waiting `embed.linger_ms` for more (that wait fills batches for throughput; a
    /// question pays it as latency).
    pub async fn embed_now(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let ids = self.encode(texts)?;
        self.send(ids, true).await
    }
}

/// Benchmark baseline: the same model file, library, threads and batch plan (`plan_batches` over all inputs at
/// once), called directly in a loop — no channel, no model thread, no per-request bookkeeping. Returns the real
/// tokens embedded and the time taken (after one warm-up run).
pub fn bare_loop(s: &EmbedSettings, inputs: &[Vec<u32>]) -> Result<(usize, Duration), EmbedError> {
    let (model_path, _) = model_files(s);
    let mut model = backend::Backend::load(&backend_options(s, &model_path))?;
    if let Some(first) = inputs.first() {
        model.run(&[first.as_slice()])?;
    }
    let mut sorted: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    sorted.sort_by_key(|b| std::cmp::Reverse(b.len()));
    let lengths: Vec<usize> = sorted.iter().map(|i| i.len()).collect();
    let b = Batching::new(s, Duration::ZERO);
    let plan = plan_batches(&lengths, &b);
    let clock = Instant::now();
    for r in plan {
        model.run(&sorted[r])?;
    }
    Ok((lengths.iter().sum(), clock.elapsed()))
}

/// Embeds `inputs` with a model loaded for this call alone (no model thread), batched by the same plan as the
/// worker, and returns the vectors in input order. For comparing providers and precisions (`bench embed
/// --check-cpu`).
pub fn embed_direct(s: &EmbedSettings, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EmbedError> {
    let (model_path, _) = model_files(s);
    let mut model = backend::Backend::load(&backend_options(s, &model_path))?;
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(inputs[i].len()));
    let lengths: Vec<usize> = order.iter().map(|&i| inputs[i].len()).collect();
    let b = Batching::new(s, Duration::ZERO);
    let mut out = vec![Vec::new(); inputs.len()];
    for r in plan_batches(&lengths, &b) {
        let batch: Vec<&[u32]> = order[r.clone()].iter().map(|&i| inputs[i].as_slice()).collect();
        for (&i, v) in order[r].iter().zip(model.run(&batch)?) {
            out[i] = v;
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Batching {
    pub batch_tokens: usize,
    pub max_batch: usize,
    pub linger: Duration,
    /// Fixed cost of one model run, in padded-token equivalents (keeps the plan from making many small batches).
    pub run_overhead: usize,
}

impl Batching {
    fn new(s: &EmbedSettings, linger: Duration) -> Batching {
        let run_overhead = if s.execution_provider == "cuda" { GPU_RUN_OVERHEAD_TOKENS } else { RUN_OVERHEAD_TOKENS };
        Batching { batch_tokens: s.batch_tokens, max_batch: s.max_batch, linger, run_overhead }
    }
}

/// One waiting input: which request, which position in it, its ids.
struct Item {
    request: u64,
    index: usize,
    ids: Vec<u32>,
}

struct Open {
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
    vectors: Vec<Vec<f32>>,
    remaining: usize,
}

/// Fixed cost of one model run on the CPU, in padded-token equivalents.
const RUN_OVERHEAD_TOKENS: usize = 64;
/// The same on a GPU: a run of a small encoder is about a hundred kernel launches plus the copies and the
/// synchronisation, about a millisecond, which is a couple of thousand tokens' work at the H100's rate
/// (docs/benchmarks.md, "One GPU worker").
const GPU_RUN_OVERHEAD_TOKENS: usize = 2048;

/// The model thread gathers up to this many batch budgets of queued inputs before planning: a larger pool sorts
/// into evenly sized batches with less padding and fewer partial batches.
const POOL_BATCHES: usize = 8;

/// Cuts items (sorted by length, longest first) into contiguous batches that minimise the padded tokens computed
/// (`longest × count` per batch, plus a per-run overhead) — a small dynamic programme over the sorted lengths —
/// subject to `longest × count ≤ batch_tokens` and `count ≤ max_batch`. Returns ranges of the sorted slice.
pub(crate) fn plan_batches(lengths: &[usize], b: &Batching) -> Vec<std::ops::Range<usize>> {
    let n = lengths.len();
    // best[i]: cheapest cost of batching the first i items; from[i]: where the last batch starts.
    let mut best = vec![usize::MAX; n + 1];
    let mut from = vec![0usize; n + 1];
    best[0] = 0;
    for i in 1..=n {
        for j in (0..i).rev() {
            let count = i - j;
            let longest = lengths[j].max(1);
            if count > 1 && (count > b.max_batch.max(1) || longest * count > b.batch_tokens) {
                break;
            }
            let cost = best[j].saturating_add(longest * count + b.run_overhead);
            if cost < best[i] {
                best[i] = cost;
                from[i] = j;
            }
        }
    }
    let mut out = Vec::new();
    let mut i = n;
    while i > 0 {
        out.push(from[i]..i);
        i = from[i];
    }
    out.reverse();
    out
}

fn model_thread(mut model: backend::Backend, mut rx: mpsc::Receiver<Request>, b: Batching) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_time().build() else { return };
    let mut open: HashMap<u64, Open> = HashMap::new();
    let mut next_id = 0u64;
    let mut closed = false;
    let m = metrics();
    while !closed {
        let mut items: Vec<Item> = Vec::new();
        let mut tokens = 0usize;
        let mut urgent = false;
        let mut take = |req: Request, items: &mut Vec<Item>, tokens: &mut usize, urgent: &mut bool| {
            *urgent |= req.urgent;
            let id = next_id;
            next_id += 1;
            let n = req.inputs.len();
            for (index, ids) in req.inputs.into_iter().enumerate() {
                *tokens += ids.len();
                items.push(Item { request: id, index, ids });
            }
            open.insert(id, Open { reply: req.reply, vectors: vec![Vec::new(); n], remaining: n });
        };
        // Wait for the first request; take whatever else is already queued, up to POOL_BATCHES batch budgets; and
        // while under one batch, wait for more until the linger expires (not when a query is among them).
        match rt.block_on(rx.recv()) {
            Some(req) => take(req, &mut items, &mut tokens, &mut urgent),
            None => break,
        }
        let deadline = tokio::time::Instant::now() + b.linger;
        let (pool_tokens, pool_items) =
            (b.batch_tokens.saturating_mul(POOL_BATCHES), b.max_batch.max(1).saturating_mul(POOL_BATCHES));
        while tokens < pool_tokens && items.len() < pool_items {
            match rx.try_recv() {
                Ok(req) => take(req, &mut items, &mut tokens, &mut urgent),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
                Err(mpsc::error::TryRecvError::Empty) => {
                    if urgent || tokens >= b.batch_tokens || items.len() >= b.max_batch {
                        break;
                    }
                    match rt.block_on(async { tokio::time::timeout_at(deadline, rx.recv()).await }) {
                        Ok(Some(req)) => take(req, &mut items, &mut tokens, &mut urgent),
                        Ok(None) => {
                            closed = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        }
        items.sort_by_key(|i| std::cmp::Reverse(i.ids.len()));
        let lengths: Vec<usize> = items.iter().map(|i| i.ids.len()).collect();
        for range in plan_batches(&lengths, &b) {
            let batch = &items[range];
            let refs: Vec<&[u32]> = batch.iter().map(|i| i.ids.as_slice()).collect();
            let clock = Instant::now();
            let result = model.run(&refs);
            let took = clock.elapsed();
            let real: usize = refs.iter().map(|r| r.len()).sum();
            let padded = refs.first().map_or(0, |r| r.len()) * refs.len();
            m.embed_batch_items.observe(refs.len() as f64);
            m.embed_batch_tokens.observe(padded as f64);
            m.embed_tokens.inc_by(real as u64);
            m.embed_duration.observe(took.as_secs_f64());
            if took.as_secs_f64() > 0.0 {
                m.embed_tokens_per_second.set(real as f64 / took.as_secs_f64());
            }
            debug!(items = refs.len(), tokens = real, padded, took_ms = took.as_millis() as u64, "Embedded a batch.");
            match result {
                Ok(vectors) => {
                    for (item, vector) in batch.iter().zip(vectors) {
                        if let Some(o) = open.get_mut(&item.request) {
                            o.vectors[item.index] = vector;
                            o.remaining -= 1;
                            // Answer a request as soon as its last input is done, not at the end of the pool.
                            if o.remaining == 0
                                && let Some(o) = open.remove(&item.request)
                            {
                                let _ = o.reply.send(Ok(o.vectors));
                            }
                        }
                    }
                }
                Err(e) => {
                    for item in batch {
                        if let Some(o) = open.remove(&item.request) {
                            let _ = o.reply.send(Err(e.clone()));
                        }
                    }
                }
            }
        }
        let done: Vec<u64> = open.iter().filter(|(_, o)| o.remaining == 0).map(|(k, _)| *k).collect();
        for id in done {
            if let Some(o) = open.remove(&id) {
                let _ = o.reply.send(Ok(o.vectors));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_respect_the_padded_token_budget_and_the_size_cap() {
        let b = Batching { batch_tokens: 100, max_batch: 4, linger: Duration::ZERO, run_overhead: RUN_OVERHEAD_TOKENS };
        let lengths = [60, 40, 30, 25, 10, 10, 10, 10, 10, 5];
        let plan = plan_batches(&lengths, &b);
        let mut covered = 0;
        for r in &plan {
            assert_eq!(r.start, covered, "batches are contiguous");
            covered = r.end;
            assert!(r.len() <= 4);
            assert!(lengths[r.start] * r.len() <= 100 || r.len() == 1, "{r:?} over budget");
        }
        assert_eq!(covered, lengths.len());
        // One input longer than the budget still gets its own batch.
        assert_eq!(plan_batches(&[500, 3], &b), vec![0..1, 1..2]);
        // A long input is not padded against many short ones: 1×160 + 20×10 beats 21×160.
        let b = Batching {
            batch_tokens: 100_000,
            max_batch: 128,
            linger: Duration::ZERO,
            run_overhead: RUN_OVERHEAD_TOKENS,
        };
        let mut lengths = vec![160];
        lengths.extend([10; 20]);
        assert_eq!(plan_batches(&lengths, &b), vec![0..1, 1..21]);
        // Where a run costs more than the padding (a GPU), a 40-token input is batched with short ones; on the CPU
        // it is not.
        lengths[0] = 40;
        assert_eq!(plan_batches(&lengths, &b), vec![0..1, 1..21]);
        let b = Batching { run_overhead: GPU_RUN_OVERHEAD_TOKENS, ..b };
        assert_eq!(plan_batches(&lengths, &b), vec![0..21]);
    }
}
