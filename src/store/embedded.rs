//! The embedded store: Qdrant's engine in-process (`qdrant-edge`), in a directory (`store.path`) of one or more
//! shards (`store.shards`). An update returns once it is in the shard's WAL and applied (the same guarantee as a
//! server's `wait=true`); `flush` persists the segments (at shutdown).
//!
//! **Writes.** The engine applies a shard's updates one at a time (its WAL and segments under one lock), so each
//! shard has a writer thread of its own (`clinstream-store-N`) that applies that shard's updates in the order
//! asked, and the worker's CPU pool never waits on the lock. A document's points all live in one shard, chosen
//! by its id (`shard_of`: a stable hash), so a version's upsert and the delete of its older points touch one
//! shard, and several shards are written in parallel. With `store.shards = 1` the layout on disk is a single
//! shard in `store.path` (as before shards existed); with more, `store.path/shard-N/` and a `shards.json` that
//! says how many, which readers follow whatever they are configured with.
//!
//! **Reads** run on the blocking pool and ask every shard: counts add up, scrolls and retrievals concatenate, and
//! a hybrid search ranks each vector across all shards (dense by cosine, sparse by BM25 score) before fusing the
//! two rankings by score (`store::fuse_by_score`, as the server store does), so a multi-shard store answers as one.
//!
//! The engine runs no optimizers of its own (a server does, in the background): after `store.maintain_every`
//! points written or deleted in a shard, and at least half as many as the shard held at its last maintenance, one
//! background task flushes the shard's segments (so closed WAL segments are released) and runs the optimizers —
//! vacuum of replaced and deleted points, merges, the HNSW index — while updates go on. Without it a long run's
//! memory grows with every rewrite, even of the same points (docs/benchmarks.md); spaced by the shard's
//! size, its total cost stays proportional to the points written. Shards written evenly fall due together, so at
//! most `store.maintain_concurrency` shards are maintained at once (`Slots`); the others wait their turn, and a
//! waiting shard's next maintenance covers what it gathered meanwhile. A maintenance runs on a thread of its own
//! `store.maintain_nice` steps below the worker's priority (Linux), it and the graph builders it starts (which set
//! themselves to nice 9: the thread gives up `CAP_SYS_NICE` so that, in a root process too, they cannot go above
//! it): where the pipeline keeps the cores busy, the writes that acknowledgements wait for come first. After the
//! flush, the optimisation moves to the idle scheduling class (`store.maintain_idle`): a nice value still gets a
//! share of a busy core by weight, where the idle class gets the time no other thread wants and gives the core up
//! the moment a thread of the pipeline wakes.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use qdrant_edge::{
    CountRequest, CreateIndex, Distance, EdgeConfig, EdgeShard, EdgeSparseVectorParams, EdgeVectorParams,
    FieldIndexOperations, Filter, JsonPath, Memory, Modifier, NamedQuery, Payload, PayloadFieldSchema, PointId,
    PointInsertOperations, PointOperations, QueryEnum, QueryRequest, ScoringQuery, SparseVector, UpdateOperation,
    VectorInternal, VectorStructInternal, Vectors, WithPayloadInterface, WithVector,
};
use serde_json::Value;

use super::{DENSE, Filters, Hit, Point, Query, Record, SPARSE, StoreError, integer_fields, keyword_fields};
use crate::config::StoreSettings;
use crate::telemetry::metrics::metrics;

pub struct EmbeddedStore {
    shards: Vec<Shard>,
    batch: usize,
    maintain_every: u64,
    /// Hybrid search: the dense share of the fused score (`store.dense_weight`, `store.dense_weight_matched`).
    fusion: super::Fusion,
}

/// A task for a shard's writer thread.
type Task = Box<dyn FnOnce(&EdgeShard) + Send>;

/// One shard: the engine, its writer thread, and its maintenance state.
struct Shard {
    shard: Arc<EdgeShard>,
    /// `None` only while dropping (the thread then ends and is joined).
    tx: Option<std::sync::mpsc::Sender<Task>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Points written or deleted since the last maintenance started.
    since_maintenance: AtomicU64,
    /// Points the shard held when the last maintenance ended (its next one waits for half as many updates).
    points_at_maintenance: Arc<AtomicU64>,
    /// True while a maintenance task waits for a slot or runs (at most one per shard).
    maintaining: Arc<AtomicBool>,
    /// The store's maintenance slots, shared by its shards.
    slots: Arc<Slots>,
}

/// The store's maintenance slots (`store.maintain_concurrency`): a shard due for maintenance takes one, or waits
/// for one, so a store of many shards written evenly (and so due together) rebuilds a few at a time instead of
/// taking every core from the worker at once.
struct Slots {
    permits: Arc<tokio::sync::Semaphore>,
    running: AtomicUsize,
    /// The most maintenances that ran at once (`EmbeddedStore::maintenance_peak`).
    peak: AtomicUsize,
    /// How far below the worker's scheduling priority a maintenance runs (`store.maintain_nice`).
    nice: i32,
    /// Whether its optimisation runs in the idle scheduling class (`store.maintain_idle`).
    idle: bool,
}

impl Drop for Shard {
    fn drop(&mut self) {
        // The thread ends when its channel closes; joining it releases its handle on the engine, so the directory
        // can be opened again as soon as the store is dropped.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The file that names a multi-shard store's shard count.
const SHARDS_FILE: &str = "shards.json";

/// The shard holding a document's points: FNV-1a of its id, stable across versions and processes.
pub fn shard_of(doc_id: &str, shards: usize) -> usize {
    if shards <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in doc_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % shards as u64) as usize
}

/// The document a point belongs to (every point the indexer writes carries `doc_id`).
/// The dense vector of a stored record (none when it has none, as a window).
fn dense_of(v: Option<VectorStructInternal>) -> Vec<f32> {
    match v {
        Some(VectorStructInternal::Named(mut m)) => match m.remove(DENSE) {
            Some(VectorInternal::Dense(d)) => d,
            _ => Vec::new(),
        },
        Some(VectorStructInternal::Single(d)) => d,
        _ => Vec::new(),
    }
}

/// A point's weight for one term of its sparse (BM25) vector; 0 when it has none.
fn sparse_weight(v: Option<VectorStructInternal>, term: u32) -> f32 {
    match v {
        Some(VectorStructInternal::Named(mut m)) => match m.remove(SPARSE) {
            Some(VectorInternal::Sparse(s)) => s.indices.iter().position(|&i| i == term).map_or(0.0, |k| s.values[k]),
            _ => 0.0,
        },
        _ => 0.0,
    }
}

fn doc_of(p: &Point) -> &str {
    p.payload.get("doc_id").and_then(Value::as_str).unwrap_or("")
}

/// Hits of several shards merged by score, best first, at most `top`.
fn merge_by_score(lists: Vec<Vec<Hit>>, top: usize) -> Vec<Hit> {
    let mut all: Vec<Hit> = lists.into_iter().flatten().collect();
    all.sort_by(|a, b| b.score.total_cmp(&a.score));
    all.truncate(top);
    all
}

/// All of a point's payload, or only these fields.
fn payload_of(fields: Option<&[&str]>) -> Result<WithPayloadInterface, StoreError> {
    Ok(match fields {
        None => WithPayloadInterface::Bool(true),
        Some(f) => WithPayloadInterface::Fields(
            f.iter()
                .map(|f| f.parse::<JsonPath>().map_err(|_| StoreError::fatal(format!("not a payload field: {f}"))))
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn fatal(what: &str) -> impl Fn(qdrant_edge::OperationError) -> StoreError + '_ {
    move |e| StoreError::fatal(format!("embedded store: {what}: {e}"))
}

/// Creates the payload indexes the shard lacks (all of them in a new store; fields added by a newer clinstream, or
/// by a `store.payload_indexes` with more of them, in an older one). An index the settings no longer ask for is
/// left in place.
fn ensure_indexes(shard: &EdgeShard, s: &StoreSettings) -> Result<(), StoreError> {
    let have = shard.info().map_err(fatal("could not read the store's indexes"))?.payload_schema;
    let wanted =
        keyword_fields(s).into_iter().map(|f| (f, "keyword")).chain(integer_fields(s).iter().map(|f| (*f, "integer")));
    for (field, kind) in wanted {
        let path =
            field.parse::<JsonPath>().map_err(|_| StoreError::fatal(format!("payload index field `{field}`")))?;
        if have.contains_key(&path) {
            continue;
        }
        let schema: PayloadFieldSchema =
            serde_json::from_value(Value::from(kind)).map_err(|e| StoreError::fatal(format!("index schema: {e}")))?;
        shard
            .update(UpdateOperation::FieldIndexOperation(FieldIndexOperations::CreateIndex(CreateIndex {
                field_name: path,
                field_schema: Some(schema),
            })))
            .map_err(fatal("could not create a payload index"))?;
    }
    Ok(())
}

fn filter_of(f: &Filters, record: Record) -> Result<Filter, StoreError> {
    parse_filter(f.to_json(record))
}

fn id_string(id: PointId) -> String {
    match id {
        PointId::Uuid(u) => u.to_string(),
        PointId::NumId(n) => n.to_string(),
    }
}

/// Opens (or, with a dimension, creates) one shard's directory.
fn open_shard(path: &Path, s: &StoreSettings, dim: Option<usize>) -> Result<EdgeShard, StoreError> {
    let shard = if holds_shard(path) {
        let tuning = EdgeConfig::builder().hnsw_config(hnsw(s)).optimizers(optimizers(s)).build();
        let shard = EdgeShard::load(path, Some(tuning)).map_err(fatal("could not open the store"))?;
        let have = shard.config().vectors.get(DENSE).map(|v| v.size);
        match (have, dim) {
            (Some(have), Some(want)) if have != want => {
                return Err(StoreError::fatal(format!(
                    "the store at {} holds {have}-dimensional vectors but the model gives {want} \
                     (use another store.path, or re-index)",
                    path.display()
                )));
            }
            (None, _) => {
                return Err(StoreError::fatal(format!(
                    "the store at {} has no `{DENSE}` vector (not a clinstream store)",
                    path.display()
                )));
            }
            _ => {}
        }
        shard
    } else {
        let Some(dim) = dim else {
            return Err(StoreError::fatal(format!(
                "no store at {} (run `clinstream run` first, or set store.path)",
                path.display()
            )));
        };
        std::fs::create_dir_all(path)
            .map_err(|e| StoreError::fatal(format!("could not create {}: {e}", path.display())))?;
        let memory = Memory::from_on_disk(s.on_disk);
        let config = EdgeConfig::builder()
            .vector(DENSE, EdgeVectorParams::builder(dim, Distance::Cosine).memory(memory).build())
            .sparse_vector(SPARSE, EdgeSparseVectorParams::builder().modifier(Modifier::Idf).memory(memory).build())
            .payload_memory(memory)
            .hnsw_config(hnsw(s))
            .optimizers(optimizers(s))
            .build();
        // Payload indexes before any data (below).
        EdgeShard::new(path, config).map_err(fatal("could not create the store"))?
    };
    if dim.is_some() {
        ensure_indexes(&shard, s)?;
    }
    Ok(shard)
}

/// The HNSW graphs' settings: `store.hnsw_m` (0: no graph, exact search) and `store.hnsw_ef_construct`, built with
/// `store.maintain_threads` threads (the engine's own default takes every core, which starves the rest of the
/// worker while a maintenance builds a large segment's graph).
fn hnsw(s: &StoreSettings) -> qdrant_edge::HnswIndexConfig {
    qdrant_edge::HnswIndexConfig {
        m: s.hnsw_m as usize,
        ef_construct: s.hnsw_ef_construct as usize,
        max_indexing_threads: s.maintain_threads(),
        ..Default::default()
    }
}

/// The optimizers' settings: a segment is rebuilt with its HNSW graph and compact payload indexes once its vectors
/// pass `store.index_threshold_kb` (0: never; until then it is searched exactly, as a query filtered to one patient
/// is anyway).
fn optimizers(s: &StoreSettings) -> qdrant_edge::EdgeOptimizersConfig {
    qdrant_edge::EdgeOptimizersConfig { indexing_threshold: Some(s.index_threshold_kb), ..Default::default() }
}

/// How many shards the store at `path` has: `shards.json`'s count, 1 for a single-shard store, `None` when there is
/// no store yet.
fn shards_on_disk(path: &Path) -> Result<Option<usize>, StoreError> {
    let file = path.join(SHARDS_FILE);
    if file.exists() {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| StoreError::fatal(format!("could not read {}: {e}", file.display())))?;
        let n = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("shards").and_then(Value::as_u64))
            .filter(|&n| n >= 1)
            .ok_or_else(|| StoreError::fatal(format!("{} does not name a shard count", file.display())))?;
        return Ok(Some(n as usize));
    }
    Ok(holds_shard(path).then_some(1))
}

/// Whether a directory holds a shard (its config, or at least its WAL).
fn holds_shard(path: &Path) -> bool {
    path.join("edge_config.json").exists() || path.join(qdrant_edge::WAL_PATH).exists()
}

impl Shard {
    fn start(shard: EdgeShard, index: usize, slots: Arc<Slots>) -> Result<Shard, StoreError> {
        let shard = Arc::new(shard);
        let (tx, rx) = std::sync::mpsc::channel::<Task>();
        let engine = shard.clone();
        let thread = std::thread::Builder::new()
            .name(format!("clinstream-store-{index}"))
            .spawn(move || {
                for task in rx {
                    task(&engine);
                }
            })
            .map_err(|e| StoreError::fatal(format!("could not start the store's writer thread: {e}")))?;
        Ok(Shard {
            shard,
            tx: Some(tx),
            thread: Some(thread),
            since_maintenance: AtomicU64::new(0),
            points_at_maintenance: Arc::new(AtomicU64::new(0)),
            maintaining: Arc::new(AtomicBool::new(false)),
            slots,
        })
    }

    /// Runs an update on the shard's writer thread and waits for it.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EdgeShard) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let stopped = || StoreError::fatal("embedded store: the writer thread has stopped");
        let task: Task = Box::new(move |shard| {
            let _ = reply.send(f(shard));
        });
        self.tx.as_ref().ok_or_else(stopped)?.send(task).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs a read on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EdgeShard) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shard = self.shard.clone();
        tokio::task::spawn_blocking(move || f(&shard))
            .await
            .map_err(|e| StoreError::fatal(format!("embedded store task failed: {e}")))?
    }

    /// Counts `n` points written or deleted; past `maintain_every` and half the points the shard held at its last
    /// maintenance, queues a maintenance for a slot unless one is queued or runs. A maintenance rewrites up to the
    /// whole shard (merges, the HNSW index), so spacing them by the shard's size keeps their total cost proportional
    /// to the points written; at a fixed interval it grew with the square of the store (a 4,966-note run spent most
    /// of its time in maintenance: docs/benchmarks.md).
    fn note_updates(&self, n: u64, maintain_every: u64) {
        if maintain_every == 0 {
            return;
        }
        let since = self.since_maintenance.fetch_add(n, Ordering::SeqCst) + n;
        if since < maintain_every.max(self.points_at_maintenance.load(Ordering::SeqCst) / 2) {
            return;
        }
        if self.maintaining.swap(true, Ordering::SeqCst) {
            return;
        }
        self.since_maintenance.store(0, Ordering::SeqCst);
        // Waiting for a slot holds the engine weakly: a store dropped meanwhile closes at once, and the queued
        // maintenance is given up.
        let (shard, running, size) =
            (Arc::downgrade(&self.shard), self.maintaining.clone(), self.points_at_maintenance.clone());
        let slots = self.slots.clone();
        let m = metrics();
        m.store_maintenance_shards.with_label_values(&["waiting"]).inc();
        tokio::spawn(async move {
            let permit = slots.permits.clone().acquire_owned().await;
            m.store_maintenance_shards.with_label_values(&["waiting"]).dec();
            let (Ok(permit), Some(shard)) = (permit, shard.upgrade()) else {
                running.store(false, Ordering::SeqCst);
                return;
            };
            let now = slots.running.fetch_add(1, Ordering::SeqCst) + 1;
            slots.peak.fetch_max(now, Ordering::SeqCst);
            m.store_maintenance_shards.with_label_values(&["running"]).inc();
            let (nice, idle) = (slots.nice, slots.idle);
            let ending = Ending { engine: Some(shard), slots, permit: Some(permit), running };
            // A thread of its own, at a lower priority (on cores the pipeline keeps busy, the writes that the
            // input's offsets wait for come first and maintenance takes what they leave), joined from the
            // blocking pool so that a runtime shutting down gives it `store.maintenance_wait_ms` as before. The
            // flush releases closed WAL segments, so it runs at that priority even on saturated cores; the
            // optimisation after it, with the graph builders it starts, in the idle class (`store.maintain_idle`).
            let maintain = move || {
                crate::pool::lower_priority_for_good(nice);
                let clock = Instant::now();
                let shard = ending.engine.as_ref().expect("held until the end");
                match shard.flush().and_then(|()| optimise(shard, idle)) {
                    Ok(optimized) => tracing::debug!(
                        optimized,
                        took_ms = clock.elapsed().as_millis() as u64,
                        "Embedded store flushed and optimised."
                    ),
                    Err(e) => tracing::warn!(error = %e, "Embedded store maintenance failed; it is tried again later."),
                }
                if let Ok(info) = shard.info() {
                    size.store(info.points_count as u64, Ordering::SeqCst);
                }
                m.store_maintenance_duration.observe(clock.elapsed().as_secs_f64());
                drop(ending);
            };
            let _ = tokio::task::spawn_blocking(move || {
                // A thread that cannot start drops `maintain`, and with it the slot (`Ending`).
                match std::thread::Builder::new().name("clinstream-maint".into()).spawn(maintain) {
                    Ok(thread) => {
                        let _ = thread.join();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Could not start a store maintenance thread; it is tried again later.")
                    }
                }
            })
            .await;
        });
    }
}

/// A maintenance's optimisation, on its own thread after the flush: in the idle scheduling class when `idle`
/// (`store.maintain_idle`; for good, and the graph builders it starts with it), at the thread's priority otherwise.
fn optimise(shard: &EdgeShard, idle: bool) -> Result<bool, qdrant_edge::OperationError> {
    if idle {
        crate::pool::idle_for_good();
    }
    shard.optimize()
}

/// A running maintenance's hold on its shard and slot, given up when it ends however it ends (done, failed, a
/// panic, or a thread that could not start): the engine and the slot first, then the shard is marked idle, so a
/// store dropped once maintenance is idle releases its directory at once.
struct Ending {
    engine: Option<Arc<EdgeShard>>,
    slots: Arc<Slots>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    running: Arc<AtomicBool>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        drop(self.engine.take());
        self.slots.running.fetch_sub(1, Ordering::SeqCst);
        metrics().store_maintenance_shards.with_label_values(&["running"]).dec();
        drop(self.permit.take());
        self.running.store(false, Ordering::SeqCst);
    }
}

/// A point as the engine takes it.
fn engine_point(p: Point) -> Result<qdrant_edge::PointStruct, StoreError> {
    // A window point has no vectors.
    let vectors = if p.dense.is_empty() {
        Vectors::new_named(Vec::<(String, qdrant_edge::Vector)>::new())
    } else {
        let sparse =
            qdrant_edge::Vector::new_sparse(p.sparse.indices, p.sparse.values).map_err(fatal("sparse vector"))?;
        Vectors::new_named([(DENSE.to_string(), qdrant_edge::Vector::new_dense(p.dense)), (SPARSE.to_string(), sparse)])
    };
    // The payload handed over as it is: `PointStruct::new` would collect the map into a new one, key by key.
    let mut point = qdrant_edge::PointStruct::new(PointId::Uuid(p.id), vectors, Value::Object(Default::default()));
    point.0.payload = Some(Payload(p.payload));
    Ok(point)
}

/// Upserts points into one shard in updates of at most `batch` points (on its writer thread).
fn upsert_into(shard: &EdgeShard, points: Vec<qdrant_edge::PointStruct>, batch: usize) -> Result<(), StoreError> {
    let mut points = points;
    while !points.is_empty() {
        let rest = points.split_off(batch.min(points.len()));
        let n = points.len();
        let clock = Instant::now();
        shard
            .update(UpdateOperation::PointOperation(PointOperations::UpsertPoints(PointInsertOperations::PointsList(
                points.into_iter().map(|p| p.0).collect(),
            ))))
            .map_err(fatal("upsert failed"))?;
        let m = metrics();
        m.store_upsert_duration.with_label_values(&["embedded"]).observe(clock.elapsed().as_secs_f64());
        m.store_points.with_label_values(&["upserted"]).inc_by(n as u64);
        points = rest;
    }
    Ok(())
}

/// Removes the points a filter selects from one shard (on its writer thread).
fn delete_where(shard: &EdgeShard, filter: Filter) -> Result<(), StoreError> {
    shard
        .update(UpdateOperation::PointOperation(PointOperations::DeletePointsByFilter(filter)))
        .map_err(fatal("delete failed"))
}

fn parse_filter(v: Value) -> Result<Filter, StoreError> {
    serde_json::from_value(v).map_err(|e| StoreError::fatal(format!("filter: {e}")))
}

impl EmbeddedStore {
    /// Opens (or, with a dimension, creates) the store at `store.path`: `store.shards` shards for a new store; an
    /// existing one keeps the count it was created with (a writer configured with another count is refused, since
    /// documents are placed by it).
    pub fn open(s: &StoreSettings, dim: Option<usize>) -> Result<EmbeddedStore, StoreError> {
        let path = Path::new(&s.path);
        let wanted = s.shards.max(1) as usize;
        let n = match shards_on_disk(path)? {
            Some(have) if dim.is_some() && have != wanted => {
                return Err(StoreError::fatal(format!(
                    "the store at {} has {have} shard(s) but store.shards = {wanted} (documents are placed by the \
                     shard count: use the store's count, or another store.path and re-index)",
                    path.display()
                )));
            }
            Some(have) => have,
            None if dim.is_none() => {
                return Err(StoreError::fatal(format!(
                    "no store at {} (run `clinstream run` first, or set store.path)",
                    path.display()
                )));
            }
            None => wanted,
        };
        let slots = Arc::new(Slots {
            permits: Arc::new(tokio::sync::Semaphore::new(s.maintain_concurrency())),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            nice: s.maintain_nice,
            idle: s.maintain_idle,
        });
        let mut shards = Vec::with_capacity(n);
        if n == 1 {
            shards.push(Shard::start(open_shard(path, s, dim)?, 0, slots)?);
        } else {
            for i in 0..n {
                shards.push(Shard::start(open_shard(&path.join(format!("shard-{i}")), s, dim)?, i, slots.clone())?);
            }
            let file = path.join(SHARDS_FILE);
            if !file.exists() {
                std::fs::write(&file, serde_json::json!({ "shards": n }).to_string())
                    .map_err(|e| StoreError::fatal(format!("could not write {}: {e}", file.display())))?;
            }
        }
        Ok(EmbeddedStore {
            shards,
            batch: s.upsert_batch.max(1),
            maintain_every: s.maintain_every,
            fusion: super::Fusion::of(s),
        })
    }

    /// The most shard maintenances that ran at once since the store was opened (at most
    /// `store.maintain_concurrency`).
    pub fn maintenance_peak(&self) -> usize {
        self.shards.first().map_or(0, |s| s.slots.peak.load(Ordering::SeqCst))
    }

    /// Shards in the store.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Waits for running maintenance tasks (tests, and before a final flush).
    pub async fn maintenance_idle(&self) {
        while self.shards.iter().any(|s| s.maintaining.load(Ordering::SeqCst)) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    fn shard_for(&self, doc_id: &str) -> usize {
        shard_of(doc_id, self.shards.len())
    }

    /// Upserts points, each into its document's shard; the shards are written in parallel.
    pub async fn upsert(&self, points: Vec<Point>) -> Result<(), StoreError> {
        let mut by_shard: Vec<Vec<Point>> = (0..self.shards.len()).map(|_| Vec::new()).collect();
        for p in points {
            let i = self.shard_for(doc_of(&p));
            by_shard[i].push(p);
        }
        let batch = self.batch;
        let writes = by_shard.into_iter().enumerate().filter(|(_, p)| !p.is_empty()).map(|(i, points)| async move {
            let n = points.len() as u64;
            let shard = &self.shards[i];
            let points = points.into_iter().map(engine_point).collect::<Result<Vec<_>, _>>()?;
            shard.write(move |engine| upsert_into(engine, points, batch)).await?;
            shard.note_updates(n, self.maintain_every);
            Ok::<(), StoreError>(())
        });
        futures_all(writes).await
    }

    /// A group of documents' writes in one shard (`store::Writer`'s lanes: one per shard): their points upserted,
    /// then every other point of those documents removed, both on the shard's writer thread.
    pub async fn write_group(
        &self,
        lane: usize,
        points: Vec<Point>,
        doc_ids: &[&str],
        keep: &[uuid::Uuid],
    ) -> Result<(), StoreError> {
        let filter = super::except_filter(doc_ids, keep);
        self.upsert_then_delete(lane.min(self.shards.len() - 1), points, filter).await?;
        metrics().store_points.with_label_values(&["deleted_documents"]).inc_by(doc_ids.len() as u64);
        Ok(())
    }

    /// One update of shard `i` on its writer thread: `points` upserted, then the points matching `filter` deleted.
    async fn upsert_then_delete(&self, i: usize, points: Vec<Point>, filter: Value) -> Result<(), StoreError> {
        let shard = &self.shards[i];
        let n = points.len() as u64 + 1;
        let filter = parse_filter(filter)?;
        let points = points.into_iter().map(engine_point).collect::<Result<Vec<_>, _>>()?;
        let batch = self.batch;
        shard
            .write(move |engine| {
                if !points.is_empty() {
                    upsert_into(engine, points, batch)?;
                }
                delete_where(engine, filter)
            })
            .await?;
        shard.note_updates(n, self.maintain_every);
        Ok(())
    }

    pub async fn delete_document(&self, doc_id: &str, keep_version: Option<&str>) -> Result<(), StoreError> {
        let filter = parse_filter(super::document_filter(doc_id, keep_version))?;
        let shard = &self.shards[self.shard_for(doc_id)];
        shard
            .write(move |engine| {
                delete_where(engine, filter)?;
                metrics().store_points.with_label_values(&["deleted_documents"]).inc();
                Ok(())
            })
            .await?;
        // The points a filter removes are not counted; a deletion counts as one update.
        shard.note_updates(1, self.maintain_every);
        Ok(())
    }

    /// Removes the points of several documents other than `keep`: one update per shard they live in (a group
    /// with no points to write).
    pub async fn delete_except(&self, doc_ids: &[&str], keep: &[uuid::Uuid]) -> Result<(), StoreError> {
        let mut by_shard: Vec<Vec<&str>> = vec![Vec::new(); self.shards.len()];
        for d in doc_ids {
            by_shard[self.shard_for(d)].push(d);
        }
        let deletes = by_shard
            .into_iter()
            .enumerate()
            .filter(|(_, d)| !d.is_empty())
            .map(|(i, docs)| async move { self.write_group(i, Vec::new(), &docs, keep).await });
        futures_all(deletes).await
    }

    pub async fn search(&self, q: &Query) -> Result<Vec<Hit>, StoreError> {
        let filter = Some(filter_of(&q.filters, q.record)?);
        let candidates = (q.top * 4).max(20);
        let dense = ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery {
            query: VectorInternal::Dense(q.dense.clone()),
            using: Some(DENSE.into()),
        }));
        let sparse = ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery {
            query: VectorInternal::Sparse(SparseVector {
                indices: q.sparse.indices.clone(),
                values: q.sparse.values.clone(),
            }),
            using: Some(SPARSE.into()),
        }));
        let with_payload = payload_of(q.fields)?;
        // One ranking by one scoring query, in every shard, merged by score.
        let ranked = |query: ScoringQuery, limit: usize| {
            let mut request = QueryRequest::new(limit);
            request.query = Some(query);
            request.filter = filter.clone();
            request.with_payload = with_payload.clone();
            request
        };
        if q.sparse.indices.is_empty() && q.matched.is_empty() {
            // Dense only: one ranking, no fusion.
            return Ok(super::found_by_dense(merge_by_score(self.query_all(ranked(dense, q.top)).await?, q.top)));
        }
        // Hybrid: each vector's candidates ranked across every shard, then fused by score (`fuse_by_score`), as
        // the server store fuses them; the chunks that mention a matched concept, ranked by the dense vector, count
        // as full BM25 matches (`with_matches`).
        let matched = async {
            if q.matched.is_empty() {
                return Ok(Vec::new());
            }
            // The query's filters (a concept filter of the caller's included) and a mention of a matched concept.
            let mut f = q.filters.to_json(q.record);
            if let Some(must) = f.get_mut("must").and_then(|m| m.as_array_mut()) {
                must.push(serde_json::json!({"key": "concepts", "match": {"any": q.matched}}));
            }
            let mut request = ranked(dense.clone(), candidates);
            request.filter = Some(parse_filter(f)?);
            Ok::<_, StoreError>(merge_by_score(self.query_all(request).await?, candidates))
        };
        let searched = async {
            if q.sparse.indices.is_empty() {
                return Ok(Vec::new());
            }
            Ok(merge_by_score(self.query_all(ranked(sparse, candidates)).await?, candidates))
        };
        let (dense_hits, sparse_hits, matched, mass) = tokio::join!(
            self.query_all(ranked(dense.clone(), candidates)),
            searched,
            matched,
            self.idf_mass(&q.sparse)
        );
        let dense_hits = merge_by_score(dense_hits?, candidates);
        let (sparse_hits, mass) = super::with_matches(sparse_hits?, matched?, mass?);
        Ok(super::fuse_by_score(dense_hits, sparse_hits, self.fusion, mass, q.top))
    }

    /// `Store::idf_mass`: per term, the best point holding it in each shard (no filter, no payload, its sparse
    /// vector), the best of the shards read.
    pub async fn idf_mass(&self, sparse: &super::Sparse) -> Result<f32, StoreError> {
        let terms: Vec<(u32, f32)> = sparse.indices.iter().copied().zip(sparse.values.iter().copied()).collect();
        let reads = self.shards.iter().map(|shard| {
            let terms = terms.clone();
            shard.read(move |engine| {
                let mut best = Vec::with_capacity(terms.len());
                for &(term, weight) in &terms {
                    let mut request = QueryRequest::new(1);
                    request.query = Some(ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery {
                        query: VectorInternal::Sparse(SparseVector { indices: vec![term], values: vec![weight] }),
                        using: Some(SPARSE.into()),
                    })));
                    request.with_vector = WithVector::Selector(vec![SPARSE.into()]);
                    let found = engine.query(request).map_err(fatal("query failed"))?;
                    best.push(found.into_iter().next().map(|p| (p.score, sparse_weight(p.vector, term))));
                }
                Ok(best)
            })
        });
        let per_shard = futures_collect(reads).await?;
        let mut mass = 0.0;
        for (i, &(_, weight)) in terms.iter().enumerate() {
            let best = per_shard.iter().filter_map(|s| s[i]).max_by(|a, b| a.0.total_cmp(&b.0));
            mass += best.map_or(0.0, |(score, d)| super::idf_of(score, weight, d));
        }
        Ok(mass)
    }

    /// The same query in every shard.
    async fn query_all(&self, request: QueryRequest) -> Result<Vec<Vec<Hit>>, StoreError> {
        let reads = self.shards.iter().map(|shard| {
            let request = request.clone();
            shard.read(move |engine| {
                let found = engine.query(request).map_err(fatal("query failed"))?;
                Ok(found
                    .into_iter()
                    .map(|p| Hit {
                        id: id_string(p.id),
                        score: p.score,
                        payload: p.payload.map(|Payload(m)| m).unwrap_or_default(),
                        found: Default::default(),
                    })
                    .collect::<Vec<_>>())
            })
        });
        futures_collect(reads).await
    }

    pub async fn count(&self, f: &Filters, record: Record) -> Result<usize, StoreError> {
        let filter = filter_of(f, record)?;
        let reads = self.shards.iter().map(|shard| {
            let filter = filter.clone();
            shard.read(move |engine| {
                let mut request = CountRequest::new();
                request.filter = Some(filter);
                request.exact = true;
                engine.count(request).map_err(fatal("count failed"))
            })
        });
        Ok(futures_collect(reads).await?.into_iter().sum())
    }

    /// Payloads of the points matching the filters, paged by id, at most `limit` (all shards together).
    pub async fn scroll(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
    ) -> Result<Vec<serde_json::Map<String, Value>>, StoreError> {
        Ok(self.scroll_points(f, record, limit, fields, false).await?.into_iter().map(|p| p.payload).collect())
    }

    /// The points matching the filters with their dense vectors and the given payload fields, at most `limit`
    /// (all shards together).
    pub async fn scroll_vectors(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
    ) -> Result<Vec<super::Stored>, StoreError> {
        self.scroll_points(f, record, limit, fields, true).await
    }

    /// The points matching the filters, paged by id in every shard, at most `limit`: ids, the given payload fields
    /// and, `with_dense`, the dense vectors.
    async fn scroll_points(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
        with_dense: bool,
    ) -> Result<Vec<super::Stored>, StoreError> {
        let filter = filter_of(f, record)?;
        let payload = payload_of(Some(fields))?;
        let vector = if with_dense { WithVector::Selector(vec![DENSE.into()]) } else { WithVector::Bool(false) };
        let reads = self.shards.iter().map(|shard| {
            let (filter, payload, vector) = (filter.clone(), payload.clone(), vector.clone());
            shard.read(move |engine| {
                let mut out = Vec::new();
                let mut offset: Option<PointId> = None;
                loop {
                    let page = 256.min(limit.saturating_sub(out.len()));
                    if page == 0 {
                        break;
                    }
                    let mut request = qdrant_edge::ScrollRequestBuilder::new()
                        .limit(page)
                        .filter(filter.clone())
                        .with_payload(payload.clone())
                        .with_vector(vector.clone());
                    if let Some(o) = offset {
                        request = request.offset(o);
                    }
                    let (records, next) = engine.scroll(request.build()).map_err(fatal("scroll failed"))?;
                    out.extend(records.into_iter().map(|r| super::Stored {
                        id: id_string(r.id),
                        dense: dense_of(r.vector),
                        payload: r.payload.map(|Payload(m)| m).unwrap_or_default(),
                    }));
                    match next {
                        Some(n) => offset = Some(n),
                        None => break,
                    }
                }
                Ok(out)
            })
        });
        let mut all: Vec<super::Stored> = futures_collect(reads).await?.into_iter().flatten().collect();
        all.truncate(limit);
        Ok(all)
    }

    /// Upserts a patient's summary points and deletes the patient's other summary points, in one update of the
    /// patient's shard.
    pub async fn replace_summaries(&self, patient: &str, points: Vec<Point>) -> Result<(), StoreError> {
        let keep: Vec<uuid::Uuid> = points.iter().map(|p| p.id).collect();
        self.upsert_then_delete(self.shard_for(patient), points, super::summaries_except(patient, &keep)).await
    }

    /// Points by id, in the order asked (missing ones left out).
    pub async fn retrieve(&self, ids: &[String]) -> Result<Vec<Hit>, StoreError> {
        let wanted: Vec<PointId> = ids.iter().filter_map(|i| i.parse::<uuid::Uuid>().ok()).map(PointId::Uuid).collect();
        let reads = self.shards.iter().map(|shard| {
            let wanted = wanted.clone();
            shard.read(move |engine| {
                let request = qdrant_edge::RetrieveRequestBuilder::new(wanted)
                    .with_payload(WithPayloadInterface::Bool(true))
                    .build();
                engine.retrieve(request).map_err(fatal("retrieve failed"))
            })
        });
        let mut found: Vec<_> = futures_collect(reads).await?.into_iter().flatten().collect();
        found.sort_by_key(|r| wanted.iter().position(|w| *w == r.id));
        Ok(found
            .into_iter()
            .map(|r| Hit {
                id: id_string(r.id),
                score: 0.0,
                payload: r.payload.map(|Payload(m)| m).unwrap_or_default(),
                found: Default::default(),
            })
            .collect())
    }

    /// Persists every shard's segments. A maintenance still running is not waited for: what it rebuilds is already
    /// durable in the segments it replaces, and it finishes (or, if the process ends first, is dropped as after a
    /// crash) on its own. A file run's time thus ends when its points are durable, not when the index housekeeping
    /// that follows is done (on a large store that is seconds; the process still lets it finish before exiting).
    pub async fn flush(&self) -> Result<(), StoreError> {
        let flushes =
            self.shards.iter().map(|shard| shard.read(|engine| engine.flush().map_err(fatal("flush failed"))));
        futures_all(flushes).await
    }
}

/// Awaits futures together; the first error wins (every future still runs to its end).
async fn futures_collect<T>(
    futures: impl IntoIterator<Item = impl std::future::Future<Output = Result<T, StoreError>>>,
) -> Result<Vec<T>, StoreError> {
    futures_util::future::join_all(futures).await.into_iter().collect()
}

async fn futures_all(
    futures: impl IntoIterator<Item = impl std::future::Future<Output = Result<(), StoreError>>>,
) -> Result<(), StoreError> {
    futures_collect(futures).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: &str, score: f32) -> Hit {
        Hit { id: id.into(), score, payload: Default::default(), found: Default::default() }
    }

    /// A maintenance that panics (or never starts) still gives back its slot and marks its shard idle, so the
    /// shard is maintained again and shutdown does not wait for it.
    #[test]
    fn a_maintenance_that_panics_gives_back_its_slot() {
        let slots = Arc::new(Slots {
            permits: Arc::new(tokio::sync::Semaphore::new(1)),
            running: AtomicUsize::new(1),
            peak: AtomicUsize::new(1),
            nice: 0,
            idle: false,
        });
        let permit = slots.permits.clone().try_acquire_owned().expect("the one slot");
        let running = Arc::new(AtomicBool::new(true));
        let ending = Ending { engine: None, slots: slots.clone(), permit: Some(permit), running: running.clone() };
        let panicked = std::thread::spawn(move || {
            let _held = ending;
            panic!("maintenance failed");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(slots.permits.available_permits(), 1);
        assert_eq!(slots.running.load(Ordering::SeqCst), 0);
        assert!(!running.load(Ordering::SeqCst));
    }

    /// A maintenance's optimisation runs in the idle scheduling class with `store.maintain_idle`, at the thread's
    /// own class without it, on a real shard.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_optimisation_runs_in_the_idle_class_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = crate::config::Settings::load_from(None, Some(Default::default())).unwrap().store;
        s.path = dir.path().join("q").display().to_string();
        let shard = Arc::new(open_shard(Path::new(&s.path), &s, Some(4)).unwrap());
        let class_during = |idle: bool| {
            let shard = shard.clone();
            std::thread::spawn(move || {
                optimise(&shard, idle).unwrap();
                // SAFETY: reads the calling thread's scheduling class.
                unsafe { libc::sched_getscheduler(0) }
            })
            .join()
            .unwrap()
        };
        assert_eq!(class_during(true), libc::SCHED_IDLE);
        assert_ne!(class_during(false), libc::SCHED_IDLE);
    }

    #[test]
    fn documents_spread_over_shards_and_stay_put() {
        assert_eq!(shard_of("anything", 1), 0);
        let mut seen = [0usize; 4];
        for i in 0..4000 {
            let d = format!("DocumentReference/{i}");
            let s = shard_of(&d, 4);
            assert_eq!(s, shard_of(&d, 4));
            seen[s] += 1;
        }
        // Each of four shards gets roughly a quarter.
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }

    #[test]
    fn shard_lists_merge_by_score() {
        let merged = merge_by_score(vec![vec![hit("a", 0.5), hit("b", 0.1)], vec![hit("c", 0.7)]], 2);
        let ids: Vec<&str> = merged.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["c", "a"]);
    }
}
