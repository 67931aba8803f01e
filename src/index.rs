//! Indexing one document: its sentences become units (over-long ones cut at token boundaries), SEOS (or fixed)
//! planning turns units into chunks, the embedder gives each chunk a dense vector, Qdrant's BM25 a sparse one,
//! and the store receives the points with deterministic ids and the payload of ARCHITECTURE §4. The document's
//! acknowledgement waits for this (the runner awaits `Indexer::index` inside the document's task).
//!
//! The first half — units, SEOS shifts, the plan and the chunks' vectors — is `Chunker`, which needs no store
//! (`eval qa --chunks index` and `bench seos` use it). Where SEOS's vectors come from is
//! `chunking.seos_vectors`: `groups` embeds every sentence group and then every chunk (the exact method, about four
//! times a note's tokens); `sentences` embeds every sentence once and composes the group vectors from them
//! (`chunk::compose`), then embeds the chunks; `composed` composes the chunk vectors too (one pass over the note's
//! tokens). docs/embedding.md has the agreement and retrieval figures of each.
//!
//! Versions: the new version's points are written first, then every other version's points are removed, so a
//! search always finds one version. Both go through the store's writer (`store::Writer`), which applies the
//! writes of the documents waiting at the same time as one group. `entered-in-error` removes all of the document's points and writes none;
//! `relatesTo.replaces` removes the replaced documents' points.
//!
//! Failures: transient store errors are retried with capped backoff (honouring `retry-after`) for
//! `store.halt_after_ms`; after that, or on an embedding or fatal store error, the document fails with a Halt code
//! and the runner stops without acknowledging it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tracing::warn;

use crate::backoff::Backoff;
use crate::config::Settings;
use crate::embed::{EmbedError, Embedder};
use crate::error::{DocError, ErrorCode, Stage};
use crate::model::Document;
use crate::query;
use crate::stages::chunk::{self, ChunkParams, ChunkStrategy, Planned, Unit};
use crate::store::{self, Point, Store, StoreError, bm25};
use crate::telemetry::health;
use crate::telemetry::metrics::metrics;

mod abstracts;
mod queue;
mod vectors;

/// The fields of a chunk point's payload: the document's ten and the chunk's nineteen (`Cpu::payload`). Its maps are
/// made with room for them all (a window point's twenty fit too), so no payload's hash table grows while filled.
const CHUNK_FIELDS: usize = 29;

/// The chunker, the store, and how long to ride out the store.
pub struct Indexer {
    chunker: Chunker,
    store: Arc<Store>,
    /// The documents' writes, grouped (`store::Writer`).
    writer: store::Writer,
    halt_after: Duration,
    /// RAPTOR's per-patient trees: rebuilt after each note when `raptor.enabled`.
    trees: Arc<Trees>,
    tree_on_write: bool,
    /// What the trees' background workers (`vectors`, `abstracts`) borrow for a round: they hold it weakly, so the
    /// store closes when the indexer is dropped (after the round in hand, if any).
    _parts: Arc<queue::Parts>,
}

/// Dropping the indexer ends its trees' background workers; what they had queued waits for the patients' next
/// rebuilds (a file run waits for it first: `tree_work_settled`).
impl Drop for Indexer {
    fn drop(&mut self) {
        if let Some(v) = &self.trees.vectors {
            v.close();
        }
        if let Some(a) = &self.trees.abstracts {
            a.close();
        }
    }
}

/// RAPTOR's summary trees (`query::raptor`): after a note's points are written, its patient's tree is rebuilt from
/// the patient's stored chunks and replaces the patient's summary points — before the note is acknowledged, so an
/// acknowledged note is always in its patient's tree (a replay rebuilds it). Rebuilds of one patient never run at
/// once: a note whose patient's tree is being rebuilt waits, and the next rebuild covers every note that waited
/// (one rebuild for many notes of one patient arriving together, as group commit does for writes). Within one
/// process; across workers, a patient's notes keyed to one partition keep this (docs/read-side.md).
struct Trees {
    params: query::raptor::TreeParams,
    /// Summaries stored by their text's embedding (`raptor.summary_vectors = "text"`), or their members' mean.
    embed_text: bool,
    max_leaves: usize,
    bm25: bm25::Encoder,
    model: String,
    lanes: std::sync::Mutex<std::collections::HashMap<String, Arc<TreeLane>>>,
    /// `raptor.abstractive`: the LLM's summaries, asked for after each rebuild (`abstracts`).
    abstracts: Option<Arc<abstracts::Abstracts>>,
    /// `raptor.background_vectors` (with text vectors): new summaries' texts embedded after the rebuild, off the
    /// acknowledgement path (`vectors`).
    vectors: Option<Arc<vectors::Vectors>>,
    /// `raptor.compress`: CPTF's token-importance model, which compresses each new summary's sentences.
    importance: Option<Arc<crate::embed::importance::Importance>>,
}

/// One patient's rebuilds: requests counted, the last request a finished rebuild covered, one rebuild at a time.
#[derive(Default)]
struct TreeLane {
    requested: std::sync::atomic::AtomicU64,
    built: std::sync::atomic::AtomicU64,
    run: tokio::sync::Mutex<()>,
}

impl Trees {
    fn lane(&self, patient: &str) -> Arc<TreeLane> {
        let mut lanes = self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(lanes.entry(patient.to_string()).or_default())
    }

    /// Drops an idle patient's lane (no one else holds it).
    fn release(&self, patient: &str, lane: Arc<TreeLane>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if Arc::strong_count(&lane) == 2 {
            lanes.remove(patient);
        }
    }

    /// The patient's summary points from their stored chunks (CPU only). A node already stored (`stored`, by id)
    /// keeps its vector and its abstract — the same id is the same children and so the same text; the others get
    /// their text's model input in `to_embed` (point index, token ids) and a vector once it is embedded.
    fn points(
        &self,
        patient: &str,
        leaves: Vec<store::Stored>,
        stored: &std::collections::HashMap<String, store::Stored>,
        embedder: &Embedder,
    ) -> (Vec<Point>, Vec<(usize, Vec<u32>)>) {
        let members: Vec<query::raptor::Member> = leaves.into_iter().map(leaf_member).collect();
        let id = |level: usize, children: &[String]| store::summary_id(patient, level, children).to_string();
        let mut nodes = query::raptor::build(&members, &self.params, &id);
        // A stored node is reused (its text, tokens and vector) when it was built the same way: the same id is the
        // same sentences, and `compressed` says whether they were compressed.
        let compressing = self.importance.is_some();
        let reused = |id: &str| {
            stored
                .get(id)
                .filter(|k| k.payload.get("compressed").and_then(Value::as_bool).unwrap_or(false) == compressing)
        };
        if let (Some(ratio), Some(model)) = (self.params.compress, self.importance.as_deref()) {
            let count = |t: &str| embedder.count_tokens(t);
            for n in nodes.iter_mut().filter(|n| reused(&n.id).is_none()) {
                query::raptor::compress(std::slice::from_mut(n), ratio, &mut |p| model.score(p).ok(), &count);
            }
        }
        let mut to_embed = Vec::new();
        let mut points = Vec::with_capacity(nodes.len());
        for n in nodes {
            let Ok(point_id) = n.id.parse() else { continue };
            let kept = stored.get(&n.id);
            let reuse = reused(&n.id);
            // A reused compressed node keeps its text and tokens (the model is not asked again).
            let stored_text = reuse.filter(|_| compressing).and_then(|k| {
                Some((k.payload.get("text")?.as_str()?.to_string(), k.payload.get("tokens")?.as_u64()? as usize))
            });
            let (text, tokens) = stored_text.unwrap_or_else(|| (n.text(), n.tokens()));
            let ordered = n.in_reading_order();
            let sentences: Vec<Value> = ordered
                .iter()
                .map(|s| json!({"doc_id": s.doc_id, "doc_date": s.date, "start": s.start, "end": s.end}))
                .collect();
            let latest = ordered.iter().filter_map(|s| s.date.clone()).max();
            let mut p = Map::new();
            p.insert("record".into(), store::SUMMARY.into());
            p.insert("patient".into(), patient.into());
            p.insert("level".into(), n.level.into());
            p.insert("children".into(), n.children.clone().into());
            p.insert("doc_ids".into(), n.doc_ids().into());
            p.insert("doc_date".into(), latest.map_or(Value::Null, Value::from));
            p.insert("tokens".into(), tokens.into());
            p.insert("sentences".into(), sentences.into());
            p.insert("model".into(), self.model.clone().into());
            p.insert("worker_version".into(), crate::WORKER_VERSION.into());
            if compressing {
                p.insert("compressed".into(), true.into());
            }
            for field in ["abstract", "abstract_model"] {
                if let Some(v) = kept.and_then(|k| k.payload.get(field)).filter(|v| v.is_string()) {
                    p.insert(field.into(), v.clone());
                }
            }
            p.insert("text".into(), text.clone().into());
            let sparse = bm25::sparse_document(&self.bm25, abstracts::searched_text(&p));
            let dense = match (kept, reuse) {
                _ if !self.embed_text => n.vector,
                // Searched by its abstract once written (`abstracts`), or by the same text as before (still
                // pending if it was).
                (Some(k), _) if k.payload.get("abstract").is_some_and(Value::is_string) => k.dense.clone(),
                (_, Some(k)) => {
                    if vectors::is_pending(&k.payload) {
                        p.insert(vectors::PENDING.into(), true.into());
                    }
                    k.dense.clone()
                }
                // Its members' mean until `vectors` embeds its text, off the acknowledgement path.
                _ if self.vectors.is_some() => {
                    p.insert(vectors::PENDING.into(), true.into());
                    n.vector
                }
                _ => {
                    to_embed.push((points.len(), embedder.encode_one(&text).unwrap_or_default()));
                    Vec::new()
                }
            };
            points.push(Point { id: point_id, dense, sparse, payload: p });
        }
        (points, to_embed)
    }
}

/// A stored chunk as a leaf of its patient's tree: its vector and its sentences (the `units` payload field; a
/// chunk stored without it is one sentence).
fn leaf_member(c: store::Stored) -> query::raptor::Member {
    let p = &c.payload;
    let doc_id = p.get("doc_id").and_then(Value::as_str).unwrap_or_default().to_string();
    let date = p.get("doc_date").and_then(Value::as_str).map(str::to_string);
    let text = p.get("text").and_then(Value::as_str).unwrap_or_default();
    let start = p.get("start").and_then(Value::as_u64).unwrap_or(0) as usize;
    let end = p.get("end").and_then(Value::as_u64).map_or(start + text.len(), |e| e as usize);
    let spans: Vec<(usize, usize, usize)> = p
        .get("units")
        .and_then(Value::as_array)
        .map(|u| {
            u.iter()
                .filter_map(|s| {
                    let s = s.as_array()?;
                    let n = |i: usize| s.get(i).and_then(Value::as_u64).map(|v| v as usize);
                    Some((n(0)?, n(1)?, n(2)?))
                })
                .collect()
        })
        .unwrap_or_default();
    let spans = if spans.is_empty() { vec![(start, end, text.split_whitespace().count())] } else { spans };
    let sentences = spans
        .into_iter()
        .filter_map(|(a, b, tokens)| {
            let piece = text.get(a.checked_sub(start)?..b.checked_sub(start)?)?;
            Some(query::raptor::Sentence {
                doc_id: doc_id.clone(),
                date: date.clone(),
                start: a,
                end: b,
                tokens,
                text: piece.to_string(),
            })
        })
        .collect();
    query::raptor::Member { id: c.id, vector: c.dense, sentences }
}

/// What one rebuild of a patient's tree read, embedded and wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeRebuild {
    /// The patient's chunks read back.
    pub leaves: usize,
    /// Summary points written (the whole tree).
    pub written: usize,
    /// Summaries whose text was embedded (the others kept their stored vector).
    pub embedded: usize,
    /// The model's input tokens for those.
    pub embedded_tokens: usize,
    /// Summaries stored by their members' mean until their text is embedded off the acknowledgement path
    /// (`raptor.background_vectors`).
    pub deferred: usize,
    /// Reading the patient's chunks (and stored summaries); building the tree (clustering, summaries, payloads);
    /// embedding the summaries embedded here; replacing the patient's summary points.
    pub read: Duration,
    pub built: Duration,
    pub embedding: Duration,
    pub stored: Duration,
}

/// Where SEOS's vectors come from (`chunking.seos_vectors`; module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeosVectors {
    Groups,
    Sentences,
    Composed,
}

impl SeosVectors {
    /// From the validated setting (`groups` | `sentences` | `composed`).
    pub fn from_setting(s: &str) -> SeosVectors {
        match s {
            "sentences" => SeosVectors::Sentences,
            "composed" => SeosVectors::Composed,
            _ => SeosVectors::Groups,
        }
    }
}

/// Units, plan and vectors of one document, without a store.
#[derive(Clone)]
pub struct Chunker {
    embedder: Embedder,
    /// The CPU side (tokenizing units, planning, BM25, payloads), shared with the CPU pool.
    cpu: Arc<Cpu>,
}

/// A document's chunks with their dense vectors.
#[derive(Debug, Clone)]
pub struct Chunked {
    pub chunks: Vec<Chunk>,
    pub vectors: Vec<Vec<f32>>,
    /// The document's units (sentences, or pieces of over-long ones); `Chunk::units` indexes them.
    pub units: Vec<Unit>,
    /// Tokens the model was given for this document (special tokens excluded): the embedding cost.
    pub embedded_tokens: usize,
}

/// What the chunks' second pass gives: token ids for the model, or vectors composed from the sentences'.
enum ChunkInputs {
    Ids(Result<Vec<Vec<u32>>, EmbedError>),
    Composed(Vec<Vec<f32>>),
}

/// What the CPU-bound steps need; they run on the CPU pool (`Indexer::on_cpu`), never on the async workers.
struct Cpu {
    /// For the tokenizer and the model's name (the model itself is only called from async code).
    embedder: Embedder,
    bm25: bm25::Encoder,
    params: ChunkParams,
    neighbours: usize,
    cross_sections: bool,
    compiled: Arc<crate::stages::Compiled>,
    /// Entity windows: words each side of a mention (`store.window_words`; 0 = none).
    window_words: usize,
    vectors: SeosVectors,
}

impl std::fmt::Debug for Chunker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunker").field("model", self.embedder.info()).field("vectors", &self.cpu.vectors).finish()
    }
}

impl std::fmt::Debug for Indexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Indexer").field("model", self.chunker.embedder.info()).field("store", &self.store).finish()
    }
}

/// A chunk ready for the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub index: usize,
    pub start: usize,
    pub end: usize,
    /// Sections (indices into the document's) that the chunk's own units come from, in order.
    pub sections: Vec<usize>,
    pub overlap_units: usize,
    pub tokens: usize,
    /// The units it is made of (its overlap included), indices into the document's units.
    pub units: std::ops::Range<usize>,
}

/// Runs a store operation, retrying transient failures with capped backoff (honouring retry-after) for
/// `halt_after`; readiness follows the store meanwhile. The last error is returned when failures last longer, or
/// at once when one is not transient.
async fn retry_store<T, F, Fut>(halt_after: Duration, mut op: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), halt_after);
    loop {
        let result = op().await;
        health::set_store_reachable(!result.as_ref().is_err_and(|e| e.is_transient()));
        match result {
            Err(e) if e.is_transient() => match backoff.failed_with(e.retry_after()) {
                Some(wait) => {
                    metrics().store_retries.inc();
                    warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "Vector store unavailable; retrying.");
                    tokio::time::sleep(wait).await;
                }
                None => return Err(e),
            },
            other => return other,
        }
    }
}

/// Opens the store, riding out a store that is unavailable at start-up (`store.halt_after_ms`).
async fn open_store(settings: &Settings, dim: usize) -> Result<Store, StoreError> {
    retry_store(Duration::from_millis(settings.store.halt_after_ms), || Store::open(&settings.store, dim)).await
}

/// The indexer could not start: the model, the store, or settings that do not fit the model.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("embedding model: {0}")]
    Embed(#[from] EmbedError),
    #[error("vector store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Config(String),
}

impl StartError {
    pub fn code(&self) -> ErrorCode {
        match self {
            StartError::Embed(e) => e.code(),
            StartError::Store(e) => e.code(),
            StartError::Config(_) => ErrorCode::ConfigInvalid,
        }
    }
}

impl Chunker {
    /// The chunker of `settings.chunking` over a started embedder.
    pub fn new(
        settings: &Settings,
        embedder: Embedder,
        compiled: Arc<crate::stages::Compiled>,
    ) -> Result<Chunker, StartError> {
        let info = embedder.info().clone();
        let c = &settings.chunking;
        if c.chunk_tokens + info.special_tokens > info.max_tokens {
            return Err(StartError::Config(format!(
                "chunking.chunk_tokens ({}) + {} special tokens exceeds the model's {} tokens",
                c.chunk_tokens, info.special_tokens, info.max_tokens
            )));
        }
        let cpu = Cpu {
            embedder: embedder.clone(),
            bm25: bm25::encoder(settings.store.bm25_avg_len)?,
            params: ChunkParams {
                strategy: if c.strategy == "fixed" { ChunkStrategy::Fixed } else { ChunkStrategy::Seos },
                budget: c.chunk_tokens,
                overlap: c.overlap_sentences,
            },
            neighbours: c.group_neighbours,
            cross_sections: c.cross_sections,
            compiled,
            window_words: settings.store.window_words,
            vectors: SeosVectors::from_setting(&c.seos_vectors),
        };
        Ok(Chunker { embedder, cpu: Arc::new(cpu) })
    }

    pub fn embedder(&self) -> &Embedder {
        &self.embedder
    }

    /// A document version's points as the indexer writes them — payloads, BM25 vectors, entity windows — but with
    /// fixed-size chunks and placeholder unit vectors instead of the model's: the store's own cost with real
    /// payloads (`bench store --csv`).
    pub fn points_unembedded(&self, doc: &Document, version: &str) -> Vec<Point> {
        let units = self.cpu.units(doc);
        let fixed = ChunkParams { strategy: ChunkStrategy::Fixed, ..self.cpu.params };
        let chunks = self.cpu.plan_with(doc, &units, &[], &fixed);
        let dim = self.embedder.info().dim;
        let vectors = chunks
            .iter()
            .map(|c| {
                let mut v = vec![0.0f32; dim];
                v[c.start % dim] = 0.6;
                v[(c.end * 7) % dim] += 0.8;
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.iter_mut().for_each(|x| *x /= norm);
                v
            })
            .collect();
        let mut points = self.cpu.points(doc, &chunks, &units, vectors, version);
        points.extend(self.cpu.window_points(doc, version));
        points
    }

    /// The units of a document: its sentences, cut at token boundaries when longer than the planner's unit cap.
    pub fn units(&self, doc: &Document) -> Vec<Unit> {
        self.cpu.units(doc)
    }

    /// SEOS: neighbours on each side in a sentence group.
    pub fn neighbours(&self) -> usize {
        self.cpu.neighbours
    }

    /// Runs CPU-bound work on the CPU pool with the document (in its turn: `pool`), off the async workers.
    async fn on_cpu<T: Send + 'static>(
        &self,
        doc: &Arc<Document>,
        f: impl FnOnce(&Cpu, &Document) -> T + Send + 'static,
    ) -> Result<T, DocError> {
        let (cpu, doc) = (Arc::clone(&self.cpu), Arc::clone(doc));
        crate::pool::run(move || f(&cpu, &doc))
            .await
            .map_err(|_| DocError::new(ErrorCode::InternalError, Stage::Index, "an indexing step failed unexpectedly"))
    }

    /// The document's chunks and their dense vectors. Tokenizing, composing and planning run on the CPU
    /// pool; embedding on the model thread; only the awaiting happens on the async workers (on a GPU the async
    /// workers would otherwise be the bound: docs/benchmarks.md, "One GPU worker").
    pub async fn chunk(&self, doc: &Arc<Document>) -> Result<Chunked, DocError> {
        let embed_err = |e: EmbedError| DocError::new(e.code(), Stage::Index, e.to_string());
        let mode = self.cpu.vectors;
        let seos = self.cpu.params.strategy == ChunkStrategy::Seos;
        // Exact SEOS embeds each sentence group; the cheaper modes each sentence (unit) once.
        let per_unit = seos && mode != SeosVectors::Groups;
        let embedder = self.embedder.clone();
        let (units, first_ids) = self
            .on_cpu(doc, move |cpu, d| {
                let (units, unit_ids) = cpu.units_encoded(d);
                let ids = if !seos {
                    Ok(Vec::new())
                } else if per_unit {
                    // One unit has no shift to find, but `composed` still needs its vector for the chunk.
                    if units.len() >= 2 || mode == SeosVectors::Composed { Ok(unit_ids) } else { Ok(Vec::new()) }
                } else {
                    let texts: Vec<&str> = chunk::groups(&units, cpu.neighbours)
                        .iter()
                        .map(|r| &d.note.text[units[r.start].start..units[r.end - 1].end])
                        .collect();
                    embedder.encode(&texts)
                };
                (units, ids)
            })
            .await?;
        let first_ids = first_ids.map_err(embed_err)?;
        let mut embedded_tokens: usize = first_ids.iter().map(Vec::len).sum();
        let first = if first_ids.is_empty() {
            Vec::new()
        } else {
            self.embedder.embed_ids(first_ids).await.map_err(embed_err)?
        };
        let embedder = self.embedder.clone();
        let (chunks, inputs, units) = self
            .on_cpu(doc, move |cpu, d| {
                let shifts: Vec<f32> = if per_unit {
                    let groups: Vec<Vec<f32>> = chunk::groups(&units, cpu.neighbours)
                        .into_iter()
                        .map(|r| chunk::compose(&first, &units, r))
                        .collect();
                    groups.windows(2).map(|w| chunk::shift(&w[0], &w[1])).collect()
                } else {
                    first.windows(2).map(|w| chunk::shift(&w[0], &w[1])).collect()
                };
                let chunks = cpu.plan(d, &units, &shifts);
                let inputs = if per_unit && mode == SeosVectors::Composed {
                    ChunkInputs::Composed(
                        chunks.iter().map(|c| chunk::compose(&first, &units, c.units.clone())).collect(),
                    )
                } else {
                    let texts: Vec<&str> = chunks.iter().map(|c| &d.note.text[c.start..c.end]).collect();
                    ChunkInputs::Ids(embedder.encode(&texts))
                };
                (chunks, inputs, units)
            })
            .await?;
        let vectors = match inputs {
            ChunkInputs::Composed(v) => v,
            ChunkInputs::Ids(ids) => {
                let ids = ids.map_err(embed_err)?;
                embedded_tokens += ids.iter().map(Vec::len).sum::<usize>();
                self.embedder.embed_ids(ids).await.map_err(embed_err)?
            }
        };
        Ok(Chunked { chunks, vectors, units, embedded_tokens })
    }

    /// The points the worker writes for a chunked document (on the CPU pool): its chunks with their vectors,
    /// BM25 vectors and payloads, then its entity windows; and how many of them are chunks.
    pub async fn points(
        &self,
        doc: &Arc<Document>,
        chunked: Chunked,
        version: &str,
    ) -> Result<(Vec<Point>, usize), DocError> {
        let v = version.to_string();
        self.on_cpu(doc, move |cpu, d| cpu.document_points(d, chunked, &v)).await
    }
}

impl Indexer {
    /// Loads the model (blocking, on the blocking pool) and opens the store with the model's dimension.
    pub async fn start(settings: &Settings, compiled: Arc<crate::stages::Compiled>) -> Result<Indexer, StartError> {
        let embedder = Embedder::start_async(&settings.embed).await?;
        let dim = embedder.info().dim;
        let chunker = Chunker::new(settings, embedder, compiled)?;
        let store = Arc::new(open_store(settings, dim).await?);
        let writer = store::Writer::start(store.clone(), settings.store.group_points, settings.store.group_concurrency);
        let trees = Arc::new(Trees {
            params: (&settings.raptor).into(),
            embed_text: settings.raptor.summary_vectors == "text",
            max_leaves: settings.raptor.max_leaves,
            bm25: bm25::encoder(settings.store.bm25_avg_len)?,
            model: chunker.embedder.info().name.clone(),
            lanes: Default::default(),
            abstracts: abstracts::Abstracts::new(settings).map_err(StartError::Config)?,
            vectors: (settings.raptor.summary_vectors == "text" && settings.raptor.background_vectors)
                .then(|| Arc::new(vectors::Vectors::default())),
            importance: match settings.raptor.compress > 0.0 {
                true => {
                    let (embed, file) = (settings.embed.clone(), settings.serve.compress_model_file.clone());
                    let load =
                        tokio::task::spawn_blocking(move || crate::embed::importance::Importance::load(&embed, &file));
                    let loaded = load.await.map_err(|_| {
                        StartError::Config("raptor.compress: loading the token-importance model failed".into())
                    })?;
                    Some(Arc::new(loaded?))
                }
                false => None,
            },
        });
        let halt_after = Duration::from_millis(settings.store.halt_after_ms);
        let parts = Arc::new(queue::Parts {
            trees: Arc::clone(&trees),
            store: Arc::clone(&store),
            embedder: chunker.embedder.clone(),
            halt_after,
        });
        if let Some(a) = &trees.abstracts {
            a.spawn(&parts, settings.llm.max_concurrent);
        }
        if let Some(v) = &trees.vectors {
            v.spawn(&parts);
        }
        Ok(Indexer { chunker, store, writer, halt_after, trees, tree_on_write: settings.raptor.enabled, _parts: parts })
    }

    pub fn embedder(&self) -> &Embedder {
        &self.chunker.embedder
    }

    /// Patients whose tree still has work off the acknowledgement path: summary texts to embed
    /// (`raptor.background_vectors`) or abstractive summaries to write (`raptor.abstractive`); 0 when neither.
    pub fn tree_work_pending(&self) -> usize {
        self.trees.abstracts.as_ref().map_or(0, |a| a.pending())
            + self.trees.vectors.as_ref().map_or(0, |v| v.pending())
    }

    /// Waits until every summary vector and abstract asked for so far has been stored or given up (at once when
    /// there is none). The vectors first: an abstract written meanwhile replaces a pending node's vector.
    pub async fn tree_work_settled(&self) {
        loop {
            if let Some(v) = &self.trees.vectors {
                v.settled().await;
            }
            if let Some(a) = &self.trees.abstracts {
                a.settled().await;
            }
            if self.tree_work_pending() == 0 {
                return;
            }
        }
    }

    pub fn chunker(&self) -> &Chunker {
        &self.chunker
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Indexes one document; returns the number of chunks written. Tokenizing, planning, BM25 and payloads run
    /// on the CPU pool; embedding on the model thread; only the awaiting happens on the async workers.
    pub async fn index(&self, doc: &Arc<Document>) -> Result<usize, DocError> {
        let note = &doc.note;
        if note.entered_in_error {
            // A write with no points removes the document, in order with its other writes.
            self.retrying(|| self.writer.write(&note.doc_id, Vec::new())).await?;
            self.refresh_tree(note.patient.as_deref()).await?;
            return Ok(0);
        }
        let clock = Instant::now();
        let chunked = self.chunker.chunk(doc).await?;
        metrics().stage_duration.with_label_values(&["embed"]).observe(clock.elapsed().as_secs_f64());
        let v = note.version.clone().unwrap_or_default();
        let (points, n) = self.chunker.points(doc, chunked.clone(), &v).await?;
        let clock = Instant::now();
        // The points, then the document's other points (older versions), grouped with other documents' writes;
        // then any documents this one replaces. The first write takes the points; a retry makes them again from
        // the chunks (a copy of every payload kept for a write that rarely fails cost more than the making).
        let mut ready = Some(points);
        self.retrying(|| {
            let points = ready.take().unwrap_or_else(|| self.chunker.cpu.document_points(doc, chunked.clone(), &v).0);
            self.writer.write(&note.doc_id, points)
        })
        .await?;
        for replaced in note.replaces() {
            self.retrying(|| self.writer.write(replaced, Vec::new())).await?;
        }
        let m = metrics();
        m.stage_duration.with_label_values(&["qdrant"]).observe(clock.elapsed().as_secs_f64());
        m.chunks_per_document.observe(n as f64);
        self.refresh_tree(note.patient.as_deref()).await?;
        Ok(n)
    }

    /// Rebuilds the patient's summary tree after a note of theirs was written or removed (`Trees`); nothing
    /// without `raptor.enabled` or a patient. Store failures are retried and then halt, as the note's own writes.
    async fn refresh_tree(&self, patient: Option<&str>) -> Result<(), DocError> {
        let Some(patient) = patient.filter(|_| self.tree_on_write) else { return Ok(()) };
        use std::sync::atomic::Ordering::SeqCst;
        let trees = &self.trees;
        let lane = trees.lane(patient);
        let mine = lane.requested.fetch_add(1, SeqCst) + 1;
        let result = {
            let _running = lane.run.lock().await;
            if lane.built.load(SeqCst) >= mine {
                // A rebuild that started after this note was written has finished: it holds the note.
                Ok(())
            } else {
                let covers = lane.requested.load(SeqCst);
                let clock = Instant::now();
                let r = self.rebuild_tree(patient).await.map(|_| ());
                if r.is_ok() {
                    lane.built.fetch_max(covers, SeqCst);
                    metrics().stage_duration.with_label_values(&["tree"]).observe(clock.elapsed().as_secs_f64());
                }
                r
            }
        };
        trees.release(patient, lane);
        result
    }

    /// One rebuild of a patient's tree, whatever `raptor.enabled` says: the patient's chunks read back with their
    /// vectors (and the summaries already stored, whose vectors are kept), the tree built on the blocking pool, the
    /// new summaries' text embedded, the patient's summary points replaced. Store failures are retried as a note's
    /// own writes are, then halt. Returns what it read, embedded and wrote (`bench tree` times it).
    pub async fn rebuild_tree(&self, patient: &str) -> Result<TreeRebuild, DocError> {
        let to_doc = |e: StoreError| DocError::new(e.code(), Stage::Index, e.to_string());
        let clock = Instant::now();
        let (leaves, stored) = retry_store(self.halt_after, || async {
            let stored = async {
                match self.trees.embed_text || self.trees.abstracts.is_some() || self.trees.importance.is_some() {
                    true => self.store.summaries(patient).await,
                    false => Ok(Default::default()),
                }
            };
            tokio::try_join!(self.store.leaves(patient, self.trees.max_leaves), stored)
        })
        .await
        .map_err(to_doc)?;
        let n = leaves.len();
        let read = clock.elapsed();
        let clock = Instant::now();
        let (t, p, e) = (Arc::clone(&self.trees), patient.to_string(), self.chunker.embedder.clone());
        let (mut points, to_embed) = tokio::task::spawn_blocking(move || t.points(&p, leaves, &stored, &e))
            .await
            .map_err(|_| DocError::new(ErrorCode::InternalError, Stage::Index, "a tree step failed unexpectedly"))?;
        let built = clock.elapsed();
        let clock = Instant::now();
        let embedded = to_embed.len();
        let embedded_tokens = to_embed.iter().map(|(_, ids)| ids.len()).sum();
        if !to_embed.is_empty() {
            let (at, ids): (Vec<usize>, Vec<Vec<u32>>) = to_embed.into_iter().unzip();
            let vectors = self
                .chunker
                .embedder
                .embed_ids(ids)
                .await
                .map_err(|e| DocError::new(e.code(), Stage::Index, e.to_string()))?;
            for (i, v) in at.into_iter().zip(vectors) {
                points[i].dense = v;
            }
        }
        let embedding = clock.elapsed();
        let clock = Instant::now();
        let written = points.len();
        self.retrying(|| self.store.replace_summaries(patient, points.clone())).await?;
        let stored_in = clock.elapsed();
        let deferred = points.iter().filter(|p| vectors::is_pending(&p.payload)).count();
        if let Some(v) = self.trees.vectors.as_ref().filter(|_| deferred > 0) {
            v.request(patient);
        }
        if let Some(a) = &self.trees.abstracts {
            a.request(patient);
        }
        Ok(TreeRebuild {
            leaves: n,
            written,
            embedded,
            embedded_tokens,
            deferred,
            read,
            built,
            embedding,
            stored: stored_in,
        })
    }

    /// A store operation for a document: retried while transient (`retry_store`), then a Halt code
    /// (`store_unavailable` after `store.halt_after_ms`, `store_failed` at once otherwise).
    async fn retrying<F, Fut>(&self, op: F) -> Result<(), DocError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), StoreError>>,
    {
        retry_store(self.halt_after, op).await.map_err(|e| DocError::new(e.code(), Stage::Index, e.to_string()))
    }
}

impl Cpu {
    /// A chunked document's points: its chunks with their vectors, BM25 vectors and payloads, then its entity
    /// windows; and how many of them are chunks.
    fn document_points(&self, d: &Document, chunked: Chunked, version: &str) -> (Vec<Point>, usize) {
        let Chunked { chunks, vectors, units, .. } = chunked;
        let mut points = self.points(d, &chunks, &units, vectors, version);
        let n = points.len();
        points.extend(self.window_points(d, version));
        (points, n)
    }

    /// The units of a document: its sentences, cut at token boundaries when longer than the planner's unit cap.
    pub fn units(&self, doc: &Document) -> Vec<Unit> {
        self.units_encoded(doc).0
    }

    /// The units and each unit's model input (token ids with the special tokens), from one tokenization of each
    /// sentence: a unit's token count is its input's length without the special tokens, so SEOS's sentence vectors
    /// need no second pass of the tokenizer (the worker's most expensive CPU step besides the text stages). A
    /// sentence over the unit cap is cut at every cap-th token end and each piece tokenized on its own, as the
    /// model sees it. A sentence the tokenizer cannot read gets no unit.
    fn units_encoded(&self, doc: &Document) -> (Vec<Unit>, Vec<Vec<u32>>) {
        let cap = self.params.max_unit_tokens();
        let special = self.embedder.info().special_tokens;
        let text = &doc.note.text;
        let mut units = Vec::with_capacity(doc.sentences.len());
        let mut inputs = Vec::with_capacity(doc.sentences.len());
        for s in &doc.sentences {
            let segment = if self.cross_sections { 0 } else { s.section };
            let sentence = &text[s.start..s.end];
            let Ok(ids) = self.embedder.encode_one(sentence) else { continue };
            let tokens = ids.len().saturating_sub(special);
            if tokens == 0 {
                continue;
            }
            if tokens <= cap {
                units.push(Unit { start: s.start, end: s.end, tokens, segment });
                inputs.push(ids);
                continue;
            }
            // Cut at every `cap`-th token end.
            let ends = self.embedder.token_ends(sentence);
            let mut from = 0usize;
            for (i, &end) in ends.iter().enumerate() {
                if (i + 1) % cap == 0 || i + 1 == ends.len() {
                    let n = if (i + 1) % cap == 0 { cap } else { (i + 1) % cap };
                    let piece_end = if i + 1 == ends.len() { sentence.len() } else { end };
                    let piece = &sentence[from..piece_end];
                    units.push(Unit { start: s.start + from, end: s.start + piece_end, tokens: n, segment });
                    inputs.push(self.embedder.encode_one(piece).unwrap_or_default());
                    from = piece_end;
                }
            }
        }
        (units, inputs)
    }

    /// Chunks from the planner's plan over `units` and the SEOS shifts.
    fn plan(&self, doc: &Document, units: &[Unit], shifts: &[f32]) -> Vec<Chunk> {
        self.plan_with(doc, units, shifts, &self.params)
    }

    fn plan_with(&self, doc: &Document, units: &[Unit], shifts: &[f32], params: &ChunkParams) -> Vec<Chunk> {
        let planned = chunk::plan(units, shifts, params);
        planned
            .iter()
            .enumerate()
            .map(|(index, p): (usize, &Planned)| {
                let mut sections: Vec<usize> = Vec::new();
                for u in p.own() {
                    if let Some(sentence_section) = section_of(doc, units[u].start)
                        && sections.last() != Some(&sentence_section)
                    {
                        sections.push(sentence_section);
                    }
                }
                Chunk {
                    index,
                    start: units[p.units.start].start,
                    end: units[p.units.end - 1].end,
                    sections,
                    overlap_units: p.overlap,
                    tokens: units[p.units.clone()].iter().map(|u| u.tokens).sum(),
                    units: p.units.clone(),
                }
            })
            .collect()
    }

    /// The store points of a document version's chunks: ids, dense vectors, BM25 vectors, payloads.
    fn points(
        &self,
        doc: &Document,
        chunks: &[Chunk],
        units: &[Unit],
        vectors: Vec<Vec<f32>>,
        version: &str,
    ) -> Vec<Point> {
        let note = &doc.note;
        let ids: Vec<uuid::Uuid> = chunks.iter().map(|c| store::point_id(&note.doc_id, version, c.index)).collect();
        let fields = self.document_fields(doc, version);
        chunks
            .iter()
            .zip(vectors)
            .map(|(c, dense)| Point {
                id: ids[c.index],
                sparse: bm25::sparse_document(&self.bm25, &note.text[c.start..c.end]),
                payload: self.payload(doc, &fields, c, units, &ids),
                dense,
            })
            .collect()
    }

    /// The entity-window points of a document version (no vectors; found by filter): see `query::windows`.
    fn window_points(&self, doc: &Document, version: &str) -> Vec<Point> {
        let lexicon = &self.compiled.lexicon;
        let relations = query::windows::relations(&doc.kg);
        let windows =
            query::windows::build(&doc.note.text, &doc.sections, &doc.mentions, &relations, lexicon, self.window_words);
        let fields = self.document_fields(doc, version);
        windows
            .into_iter()
            .map(|w| {
                let mut p = fields.clone();
                p.insert("record".into(), store::WINDOW.into());
                p.insert("window_index".into(), w.index.into());
                p.insert("start".into(), w.start.into());
                p.insert("end".into(), w.end.into());
                let main = w.main_section();
                p.insert("section".into(), main.map_or(Value::Null, |s| s.name.clone().into()));
                p.insert("section_weight".into(), main.map_or(Value::Null, |s| json!(s.weight)));
                p.insert("sections".into(), w.sections.iter().map(|s| s.name.clone()).collect::<Vec<_>>().into());
                p.insert("concepts".into(), w.concepts().into());
                let mut kinds: Vec<&str> = w.mentions.iter().map(|m| m.kind.as_str()).collect();
                kinds.sort_unstable();
                kinds.dedup();
                p.insert("entity_kinds".into(), kinds.into());
                let id = store::window_id(&doc.note.doc_id, version, w.index);
                p.insert("window".into(), serde_json::to_value(&w).unwrap_or(Value::Null));
                Point { id, dense: Vec::new(), sparse: store::Sparse::default(), payload: p }
            })
            .collect()
    }

    /// The fields every point of a document version carries (patient, encounter, ids, date, type, versions), made
    /// once per document and cloned into each point's payload: a clone copies the map's hash table as it is, where
    /// inserting hashes every key again. Its table has room for a whole chunk payload's fields.
    fn document_fields(&self, doc: &Document, version: &str) -> Map<String, Value> {
        let note = &doc.note;
        let doc_type = note.doc_type.as_ref().and_then(|t| {
            t.text.clone().or_else(|| t.coding.iter().find_map(|c| c.display.clone().or_else(|| c.code.clone())))
        });
        let mut p = Map::with_capacity(CHUNK_FIELDS);
        p.insert("patient".into(), note.patient.clone().map_or(Value::Null, Value::from));
        p.insert("encounter".into(), note.encounter.clone().map_or(Value::Null, Value::from));
        p.insert("doc_id".into(), note.doc_id.clone().into());
        p.insert("doc_version".into(), version.into());
        p.insert("doc_date".into(), note.date.clone().map_or(Value::Null, Value::from));
        p.insert("doc_day".into(), note.date.as_deref().and_then(store::day).map_or(Value::Null, Value::from));
        p.insert("doc_type".into(), doc_type.map_or(Value::Null, Value::from));
        p.insert("vocabulary_version".into(), self.compiled.lexicon.version().into());
        p.insert("model".into(), self.embedder.info().name.clone().into());
        p.insert("worker_version".into(), crate::WORKER_VERSION.into());
        p
    }

    fn payload(
        &self,
        doc: &Document,
        fields: &Map<String, Value>,
        c: &Chunk,
        units: &[Unit],
        ids: &[uuid::Uuid],
    ) -> Map<String, Value> {
        let note = &doc.note;
        let lexicon = &self.compiled.lexicon;
        let mut kinds: Vec<&str> = Vec::new();
        let mut terms: Vec<String> = Vec::new();
        let mut entities = Vec::new();
        let mut concepts: Vec<String> = Vec::new();
        for m in doc.mentions.iter().filter(|m| m.start >= c.start && m.end <= c.end) {
            let id = &lexicon.concept(m.concept).id;
            if !concepts.contains(id) {
                concepts.push(id.clone());
            }
            let kind = m.kind.as_str();
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
            let term = &lexicon.concept(m.concept).preferred;
            if !terms.contains(term) {
                terms.push(term.clone());
            }
            let a = &m.assertion;
            let mut e = Map::with_capacity(10);
            e.insert("kind".into(), kind.into());
            e.insert("term".into(), term.as_str().into());
            e.insert("start".into(), (m.start - c.start).into());
            e.insert("end".into(), (m.end - c.start).into());
            e.insert("negated".into(), a.negated.into());
            e.insert("uncertain".into(), a.uncertain.into());
            e.insert("historical".into(), a.historical.into());
            e.insert("family".into(), a.family.into());
            e.insert("hypothetical".into(), a.hypothetical.into());
            e.insert("differential".into(), a.differential.into());
            entities.push(Value::Object(e));
        }
        let first = c.sections.first().and_then(|&i| doc.sections.get(i));
        let id_at = |i: Option<usize>| i.and_then(|i| ids.get(i)).map_or(Value::Null, |u| Value::from(u.to_string()));
        let mut p = fields.clone();
        p.insert("record".into(), "chunk".into());
        p.insert("section".into(), first.map_or(Value::Null, |s| s.name.into()));
        p.insert("section_title".into(), first.map_or(Value::Null, |s| s.title.clone().into()));
        p.insert("section_weight".into(), first.map_or(Value::Null, |s| json!(s.weight)));
        p.insert(
            "sections".into(),
            c.sections.iter().filter_map(|&i| doc.sections.get(i)).map(|s| s.name).collect::<Vec<_>>().into(),
        );
        p.insert("chunk_index".into(), c.index.into());
        p.insert("chunk_count".into(), ids.len().into());
        p.insert("prev_chunk_id".into(), id_at(c.index.checked_sub(1)));
        p.insert("next_chunk_id".into(), id_at(Some(c.index + 1)));
        p.insert("start".into(), c.start.into());
        p.insert("end".into(), c.end.into());
        p.insert("tokens".into(), c.tokens.into());
        // Its sentences as [start, end, tokens] (note offsets): what a summary of the patient's tree quotes.
        let spans: Vec<Value> =
            units.get(c.units.clone()).unwrap_or_default().iter().map(|u| json!([u.start, u.end, u.tokens])).collect();
        p.insert("units".into(), spans.into());
        p.insert("overlap_sentences".into(), c.overlap_units.into());
        p.insert("text".into(), note.text[c.start..c.end].into());
        p.insert("entity_kinds".into(), kinds.into());
        p.insert("entity_terms".into(), terms.into());
        p.insert("entities".into(), entities.into());
        p.insert("concepts".into(), concepts.into());
        debug_assert!(p.len() <= CHUNK_FIELDS, "a chunk payload has outgrown CHUNK_FIELDS");
        p
    }
}

/// The section holding byte `at`.
fn section_of(doc: &Document, at: usize) -> Option<usize> {
    doc.sections.iter().position(|s| s.start <= at && at < s.end)
}
