//! The vector store: chunk points (a named dense vector, a BM25 sparse vector, a payload) in Qdrant — the engine
//! in-process (`embedded`, the default, `qdrant-edge`) or a server (`qdrant`, gRPC via `qdrant-client`). Both
//! take the same points with the same ids and payload and answer the same hybrid query (dense and BM25 candidates
//! fused by their scaled scores, `fuse_by_score`), so what `clinstream search` shows does not depend on where it
//! was stored.
//!
//! Ids are deterministic (`point_id`: UUIDv5 of document id, version and chunk index), so a replay overwrites
//! rather than duplicates. A newer version of a document, `entered-in-error`, or `relatesTo.replaces` removes the
//! older points (`delete_document`).

pub mod bm25;
pub mod embedded;
pub mod server;
pub mod writer;

pub use writer::Writer;

use std::time::Duration;

use serde_json::{Map, Value};

use crate::config::StoreSettings;
use crate::error::ErrorCode;

/// Name of the dense vector in the collection.
pub const DENSE: &str = "dense";
/// Name of the sparse (BM25) vector in the collection.
pub const SPARSE: &str = "bm25";
/// Payload fields every clinstream read and delete starts from: a patient's points (every search, the query
/// service's reads, RAPTOR's tree) and a document's points (replacing or removing a version). Indexed with every
/// setting of `store.payload_indexes`; with `lookups` (the default) the only ones.
pub const LOOKUP_FIELDS: &[&str] = &["patient", "doc_id"];
/// Payload fields clinstream's reads also filter on, always after a patient or a document has been selected by
/// [`LOOKUP_FIELDS`]: the engine picks those few hundred points by their index and checks these conditions on the
/// points themselves, so an index on them serves no clinstream read. Keyword-indexed with `store.payload_indexes =
/// "filters"` (and `all`), for stores whose reads filter across patients (a Qdrant cluster in strict mode refuses
/// a filter on a field without an index).
pub const FILTER_FIELDS: &[&str] = &["doc_version", "doc_type", "sections", "concepts", "record"];
/// Payload fields with an integer index with `filters` and `all`: `doc_day`, the note's date as `yyyymmdd`
/// (date-range filters).
pub const INTEGER_FIELDS: &[&str] = &["doc_day"];
/// Payload fields no clinstream read filters on, indexed only with `store.payload_indexes = "all"` for tools that
/// query the collection directly across patients.
pub const DIRECT_QUERY_FIELDS: &[&str] = &["section", "entity_kinds", "entity_terms"];

/// The keyword-indexed payload fields of a store with these settings (`store.payload_indexes`). Every index is
/// updated by each write on the shard's writer thread and built again, one pass over every stored payload, with
/// each new segment: on a worker that writes as fast as its cores allow, those rebuilds are most of the embedded
/// store's maintenance.
pub fn keyword_fields(s: &StoreSettings) -> Vec<&'static str> {
    let extra: &[&[&str]] = match s.payload_indexes.as_str() {
        "all" => &[FILTER_FIELDS, DIRECT_QUERY_FIELDS],
        "filters" => &[FILTER_FIELDS],
        _ => &[],
    };
    LOOKUP_FIELDS.iter().chain(extra.iter().flat_map(|f| f.iter())).copied().collect()
}

/// The integer-indexed payload fields of a store with these settings: `doc_day` unless `lookups`.
pub fn integer_fields(s: &StoreSettings) -> &'static [&'static str] {
    if s.payload_indexes == "lookups" { &[] } else { INTEGER_FIELDS }
}

/// The `record` payload value of entity-window points (chunks carry `chunk`; chunks written before windows
/// existed carry none, so readers of chunks exclude windows rather than require `chunk`).
pub const WINDOW: &str = "window";
/// The `record` payload value of RAPTOR's summary points (`query::raptor`): one patient's, never a document's
/// (no `doc_id`: a summary quotes several notes, `doc_ids`), replaced as a whole when the patient's tree is rebuilt.
pub const SUMMARY: &str = "summary";
/// The payload flag of a summary stored by its members' mean vector until its text is embedded
/// (`raptor.background_vectors`).
pub const VECTOR_PENDING: &str = "vector_pending";
/// Every payload field of a summary point (`index`: the tree's rebuild, its background vectors and its abstractive
/// summaries rewrite them).
pub const SUMMARY_FIELDS: &[&str] = &[
    "record",
    "patient",
    "level",
    "children",
    "doc_ids",
    "doc_date",
    "tokens",
    "sentences",
    "model",
    "worker_version",
    "text",
    "compressed",
    "abstract",
    "abstract_model",
    VECTOR_PENDING,
];

/// The payload fields [`Store::leaves`] returns with each chunk's vector: what a tree's leaf is made of.
pub const LEAF_FIELDS: &[&str] = &["doc_id", "doc_date", "start", "end", "text", "units"];

/// Namespace of point ids (UUIDv5): fixed forever, so ids stay stable across versions of clinstream.
const POINT_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6c1b_5e2a_3f0d_4c8e_9a7b_2d4f_6e8c_1a3b);

/// The point id of chunk `index` of a document version.
pub fn point_id(doc_id: &str, version: &str, index: usize) -> uuid::Uuid {
    uuid::Uuid::new_v5(&POINT_NAMESPACE, format!("{doc_id}\u{1f}{version}\u{1f}{index}").as_bytes())
}

/// The point id of a summary node: its patient, level and sorted children (an unchanged cluster keeps its id).
pub fn summary_id(patient: &str, level: usize, children: &[String]) -> uuid::Uuid {
    uuid::Uuid::new_v5(
        &POINT_NAMESPACE,
        format!("summary\u{1f}{patient}\u{1f}{level}\u{1f}{}", children.join(",")).as_bytes(),
    )
}

/// The point id of entity window `index` of a document version (a namespace apart from chunk ids).
pub fn window_id(doc_id: &str, version: &str, index: usize) -> uuid::Uuid {
    uuid::Uuid::new_v5(&POINT_NAMESPACE, format!("window\u{1f}{doc_id}\u{1f}{version}\u{1f}{index}").as_bytes())
}

/// A note date (`2024-03-01`, `2024-03-01T10:00:00Z`, ...) as the integer `yyyymmdd`; `None` when it does not
/// start with a calendar date.
pub fn day(date: &str) -> Option<i64> {
    let b = date.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| date.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then_some(y * 10_000 + m * 100 + d)
}

/// A sparse vector: sorted unique indices and their weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sparse {
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
}

/// A point. An entity window has no vectors (`dense` and `sparse` empty): it is found by filter only.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub id: uuid::Uuid,
    pub dense: Vec<f32>,
    pub sparse: Sparse,
    pub payload: Map<String, Value>,
}

/// Filters on chunks or windows; empty lists and `None` filter nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filters {
    pub patient: Option<String>,
    /// Any of these sections (chunks: any section the chunk spans; windows: any of their mentions' sections).
    pub sections: Vec<String>,
    pub doc_types: Vec<String>,
    /// Any of these concept ids.
    pub concepts: Vec<String>,
    /// Note dates as `yyyymmdd` (`day`), inclusive.
    pub since: Option<i64>,
    pub until: Option<i64>,
}

/// Which points a filter selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Record {
    /// Chunks (neither windows nor summaries).
    #[default]
    Chunks,
    Windows,
    /// RAPTOR's summary nodes.
    Summaries,
    /// The collapsed tree: chunks and summary nodes together.
    Tree,
}

impl Filters {
    /// The filter as Qdrant's JSON filter language (the embedded store parses this form; the server store builds
    /// the same conditions with the client's builders).
    pub fn to_json(&self, record: Record) -> Value {
        use serde_json::json;
        let mut must = Vec::new();
        let mut must_not = Vec::new();
        match record {
            Record::Chunks => must_not.push(json!({"key": "record", "match": {"any": [WINDOW, SUMMARY]}})),
            Record::Windows => must.push(json!({"key": "record", "match": {"value": WINDOW}})),
            Record::Summaries => must.push(json!({"key": "record", "match": {"value": SUMMARY}})),
            Record::Tree => must_not.push(json!({"key": "record", "match": {"value": WINDOW}})),
        }
        if let Some(p) = &self.patient {
            must.push(json!({"key": "patient", "match": {"value": p}}));
        }
        for (key, values) in [("sections", &self.sections), ("doc_type", &self.doc_types), ("concepts", &self.concepts)]
        {
            if !values.is_empty() {
                must.push(json!({"key": key, "match": {"any": values}}));
            }
        }
        if self.since.is_some() || self.until.is_some() {
            let mut range = serde_json::Map::new();
            if let Some(d) = self.since {
                range.insert("gte".into(), d.into());
            }
            if let Some(d) = self.until {
                range.insert("lte".into(), d.into());
            }
            must.push(json!({"key": "doc_day", "range": range}));
        }
        json!({"must": must, "must_not": must_not})
    }
}

/// The payload fields [`Store::windows`] returns: the note's identity and date, and the stored windows.
pub const WINDOW_FIELDS: &[&str] = &["doc_id", "doc_version", "doc_date", "window"];

/// A hybrid query: dense and sparse candidates fused by RRF (hit scores are RRF scores), with optional filters;
/// chunks only. With no sparse terms it is a plain nearest-neighbour search (scores are cosine similarities):
/// one ranking needs no fusion, and a Qdrant server answers it several times faster than a fused one.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub dense: Vec<f32>,
    pub sparse: Sparse,
    pub filters: Filters,
    pub top: usize,
    /// The payload fields the hits carry; `None`: all of them. A chunk's payload is ~2 kB of metadata, most of
    /// which a caller that needs only the text and offsets should not pay to move.
    pub fields: Option<&'static [&'static str]>,
    /// Chunks (the default) or the collapsed tree (chunks and summaries).
    pub record: Record,
    /// Concept ids whose mentions count as a full lexical match (the query's aligned answer concepts,
    /// `serve.match_concepts`): a hybrid query also ranks, by the dense vector, the chunks that mention one of them,
    /// and each such chunk counts with a whole BM25 share ([`with_matches`]) whatever words it uses. Empty: none.
    pub matched: Vec<String>,
}

/// How a dense-only nearest-neighbour search runs (`ServerStore::nearest`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum DenseSearch {
    /// Every vector compared at full precision: the ground truth.
    Exact,
    /// The HNSW graph over full-precision vectors.
    Hnsw,
    /// The HNSW graph over the int8 copies; `rescore` re-ranks `oversampling` × top candidates at full precision.
    Int8 { rescore: bool, oversampling: f64 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub id: String,
    pub score: f32,
    pub payload: Map<String, Value>,
    /// Which rankings of a search returned it (empty for a point read by id or filter).
    pub found: Found,
}

/// Which rankings of a search returned a hit, each with its own score: what the fused score is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Found {
    /// The dense ranking returned it: the cosine of the query's and the chunk's vectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense: Option<f32>,
    /// The BM25 ranking returned it: its BM25 score over the query's IDF mass (1 = every word of the query, each
    /// weighed by its rarity, before the fusion's fading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub words: Option<f32>,
    /// It mentions a concept the query was aligned to (`serve.match_concepts`), so it counted as a full BM25
    /// match whatever its words.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub concept: bool,
}

impl Found {
    pub fn is_empty(&self) -> bool {
        *self == Found::default()
    }
}

/// The hits of a dense-only search, each marked as found by the dense ranking with its cosine.
pub(crate) fn found_by_dense(mut hits: Vec<Hit>) -> Vec<Hit> {
    for h in &mut hits {
        h.found.dense = Some(h.score);
    }
    hits
}

/// A stored chunk with its dense vector (`Store::leaves`).
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    pub id: String,
    pub dense: Vec<f32>,
    pub payload: Map<String, Value>,
}

/// A store failure: transient ones (unavailable, overloaded, timeouts) are retried, the rest halt the worker.
/// Messages name the operation and the status, never payload values.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Unavailable, overloaded or timed out; `retry_after` is the server's requested pause, if any.
    #[error("{detail}")]
    Unavailable { detail: String, retry_after: Option<Duration> },
    /// Anything else (a refused request, a collection of another shape, local I/O).
    #[error("{0}")]
    Failed(String),
}

impl StoreError {
    pub fn fatal(message: impl Into<String>) -> Self {
        StoreError::Failed(message.into())
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        StoreError::Unavailable { detail: message.into(), retry_after: None }
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            StoreError::Unavailable { retry_after, .. } => *retry_after,
            StoreError::Failed(_) => None,
        }
    }

    /// The error code a document or run gets when this error ends it.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Unavailable { .. } => ErrorCode::StoreUnavailable,
            StoreError::Failed(_) => ErrorCode::StoreFailed,
        }
    }
}

/// The configured store.
pub enum Store {
    Embedded(embedded::EmbeddedStore),
    Server(server::ServerStore),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind())
    }
}

impl Store {
    /// Opens the store and makes sure the collection exists with vectors of `dim` (created with its payload
    /// indexes when missing; a collection of another dimension is an error).
    pub async fn open(s: &StoreSettings, dim: usize) -> Result<Store, StoreError> {
        Self::open_with(s, Some(dim)).await
    }

    /// Opens an existing store for reading (`clinstream search`): the dimension is whatever it holds.
    pub async fn open_existing(s: &StoreSettings) -> Result<Store, StoreError> {
        Self::open_with(s, None).await
    }

    async fn open_with(s: &StoreSettings, dim: Option<usize>) -> Result<Store, StoreError> {
        match s.kind.as_str() {
            "embedded" => {
                let s = s.clone();
                tokio::task::spawn_blocking(move || embedded::EmbeddedStore::open(&s, dim))
                    .await
                    .map_err(|e| StoreError::fatal(format!("store task failed: {e}")))?
                    .map(Store::Embedded)
            }
            "qdrant" => server::ServerStore::open(s, dim).await.map(Store::Server),
            other => Err(StoreError::fatal(format!("store.kind `{other}` has no store"))),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Store::Embedded(_) => "embedded",
            Store::Server(_) => "qdrant",
        }
    }

    /// Writes points and returns when they are applied (wait=true).
    pub async fn upsert(&self, points: Vec<Point>) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.upsert(points).await,
            Store::Server(s) => s.upsert(points).await,
        }
    }

    /// Removes a document's points; with `keep_version`, only those of other versions.
    pub async fn delete_document(&self, doc_id: &str, keep_version: Option<&str>) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.delete_document(doc_id, keep_version).await,
            Store::Server(s) => s.delete_document(doc_id, keep_version).await,
        }
    }

    /// Removes every point of these documents except `keep` (the points just written for them): one delete for
    /// a whole group (the group writer's second step). For a document whose new version was just written this
    /// is its other versions' points (and any chunks of the same version that the new plan no longer has).
    pub async fn delete_except(&self, doc_ids: &[&str], keep: &[uuid::Uuid]) -> Result<(), StoreError> {
        if doc_ids.is_empty() {
            return Ok(());
        }
        match self {
            Store::Embedded(s) => s.delete_except(doc_ids, keep).await,
            Store::Server(s) => s.delete_except(doc_ids, keep).await,
        }
    }

    pub async fn search(&self, q: &Query) -> Result<Vec<Hit>, StoreError> {
        match self {
            Store::Embedded(s) => s.search(q).await,
            Store::Server(s) => s.search(q).await,
        }
    }

    /// The query's IDF mass for hybrid fusion: the sum over its terms of each term's IDF as the store weighs it
    /// (`idf_of`), read from the best point holding the term in the whole store — any patient's point, of which
    /// only two numbers are read (its score and its weight for the term), never its payload. A term no point
    /// holds adds 0.
    pub async fn idf_mass(&self, sparse: &Sparse) -> Result<f32, StoreError> {
        match self {
            Store::Embedded(s) => s.idf_mass(sparse).await,
            Store::Server(s) => s.idf_mass(sparse).await,
        }
    }

    /// Chunks in the collection.
    pub async fn count(&self) -> Result<usize, StoreError> {
        self.count_where(&Filters::default(), Record::Chunks).await
    }

    /// Points of one kind matching the filters.
    pub async fn count_where(&self, f: &Filters, record: Record) -> Result<usize, StoreError> {
        match self {
            Store::Embedded(s) => s.count(f, record).await,
            Store::Server(s) => s.count(f, record).await,
        }
    }

    /// The payloads of every window matching the filters (paged through; `limit` caps how many): the fields
    /// that rebuild a note's windows ([`WINDOW_FIELDS`]), not the indexed copies beside them.
    pub async fn windows(&self, f: &Filters, limit: usize) -> Result<Vec<Map<String, Value>>, StoreError> {
        match self {
            Store::Embedded(s) => s.scroll(f, Record::Windows, limit, WINDOW_FIELDS).await,
            Store::Server(s) => s.scroll(f, Record::Windows, limit, WINDOW_FIELDS).await,
        }
    }

    /// A patient's chunks with their dense vectors and [`LEAF_FIELDS`] (at most `limit`): the leaves of the
    /// patient's summary tree.
    pub async fn leaves(&self, patient: &str, limit: usize) -> Result<Vec<Stored>, StoreError> {
        let f = Filters { patient: Some(patient.to_string()), ..Default::default() };
        match self {
            Store::Embedded(s) => s.scroll_vectors(&f, Record::Chunks, limit, LEAF_FIELDS).await,
            Store::Server(s) => s.scroll_vectors(&f, Record::Chunks, limit, LEAF_FIELDS).await,
        }
    }

    /// A patient's stored summary points with their dense vectors and every field of theirs ([`SUMMARY_FIELDS`]),
    /// by point id.
    pub async fn summaries(&self, patient: &str) -> Result<std::collections::HashMap<String, Stored>, StoreError> {
        let f = Filters { patient: Some(patient.to_string()), ..Default::default() };
        let found = match self {
            Store::Embedded(s) => s.scroll_vectors(&f, Record::Summaries, usize::MAX, SUMMARY_FIELDS).await?,
            Store::Server(s) => s.scroll_vectors(&f, Record::Summaries, usize::MAX, SUMMARY_FIELDS).await?,
        };
        Ok(found.into_iter().map(|p| (p.id.clone(), p)).collect())
    }

    /// Writes a patient's summary points, then removes the patient's other summary points: the tree is replaced
    /// as a whole, new nodes first, so a search always finds a whole tree (embedded: one update of the patient's
    /// shard).
    pub async fn replace_summaries(&self, patient: &str, points: Vec<Point>) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.replace_summaries(patient, points).await,
            Store::Server(s) => s.replace_summaries(patient, points).await,
        }
    }

    /// Chunks by id (neighbour expansion), in the order asked; missing ids are left out.
    pub async fn chunks(&self, ids: &[String]) -> Result<Vec<Hit>, StoreError> {
        match self {
            Store::Embedded(s) => s.retrieve(ids).await,
            Store::Server(s) => s.retrieve(ids).await,
        }
    }

    /// The most embedded-store shard maintenances that ran at once (`store.maintain_concurrency`); 0 for a server.
    pub fn maintenance_peak(&self) -> usize {
        match self {
            Store::Embedded(s) => s.maintenance_peak(),
            Store::Server(_) => 0,
        }
    }

    /// Waits until no background maintenance runs (embedded; a server optimises on its own).
    pub async fn maintenance_idle(&self) {
        if let Store::Embedded(s) = self {
            s.maintenance_idle().await;
        }
    }

    /// Makes everything written so far durable (embedded: segments flushed; server: nothing to do).
    pub async fn flush(&self) -> Result<(), StoreError> {
        match self {
            Store::Embedded(s) => s.flush().await,
            Store::Server(_) => Ok(()),
        }
    }
}

/// Filter matching a document's points (other versions only, with `keep_version`).
pub(crate) fn document_filter(doc_id: &str, keep_version: Option<&str>) -> Value {
    let mut f = serde_json::json!({"must": [{"key": "doc_id", "match": {"value": doc_id}}]});
    if let Some(v) = keep_version {
        f["must_not"] = serde_json::json!([{"key": "doc_version", "match": {"value": v}}]);
    }
    f
}

/// Filter matching a patient's summary points other than `keep`.
pub(crate) fn summaries_except(patient: &str, keep: &[uuid::Uuid]) -> Value {
    let keep: Vec<String> = keep.iter().map(|u| u.to_string()).collect();
    let must_not = if keep.is_empty() { Vec::new() } else { vec![serde_json::json!({"has_id": keep})] };
    serde_json::json!({
        "must": [{"key": "patient", "match": {"value": patient}}, {"key": "record", "match": {"value": SUMMARY}}],
        "must_not": must_not,
    })
}

/// Filter matching the points of these documents other than `keep`.
pub(crate) fn except_filter(doc_ids: &[&str], keep: &[uuid::Uuid]) -> Value {
    let keep: Vec<String> = keep.iter().map(|u| u.to_string()).collect();
    let must_not = if keep.is_empty() { Vec::new() } else { vec![serde_json::json!({"has_id": keep})] };
    serde_json::json!({
        "must": [{"key": "doc_id", "match": {"any": doc_ids}}],
        "must_not": must_not,
    })
}

/// How a hybrid search weighs its two rankings (`store.dense_weight`, `store.dense_weight_matched`,
/// `store.bm25_full_share`, `store.bm25_partial_power`).
///
/// The dense share of the fused score goes from `dense_weight` when no candidate holds the question's rare words
/// down to `dense_weight_matched` when the best BM25 candidate holds all of them (its score is the question's whole
/// IDF mass), linearly between. A question stated in the notes' own words ("pneumothorax" asked, "pneumothorax"
/// written) leans on BM25; a paraphrase whose words the notes lack ("air in the pleural space") keeps the dense
/// order. Equal weights are a fixed weight.
///
/// Each chunk's BM25 share then counts as [`Fusion::share`]: in full from `full_share` of the IDF mass up (a chunk
/// holding the question's rare words, longer than the average or not), below it fading with `partial_power`. A
/// partial match — the question's common words, which BM25's term-frequency saturation lifts to more than twice
/// their IDF when a note repeats them ("heart" in a cardiology note) — would otherwise reshuffle the dense order of
/// a paraphrased question by small amounts spread over many chunks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fusion {
    pub dense_weight: f32,
    pub dense_weight_matched: f32,
    pub full_share: f32,
    pub partial_power: f32,
}

impl Fusion {
    /// The fusion the store settings name.
    pub fn of(s: &crate::config::StoreSettings) -> Self {
        Fusion {
            dense_weight: s.dense_weight,
            dense_weight_matched: s.dense_weight_matched,
            full_share: s.bm25_full_share,
            partial_power: s.bm25_partial_power,
        }
    }

    /// One weight for every question, every BM25 share counted linearly.
    pub fn fixed(dense_weight: f32) -> Self {
        Fusion { dense_weight, dense_weight_matched: dense_weight, full_share: 1.0, partial_power: 1.0 }
    }

    /// A chunk's BM25 share of the question's IDF mass as it counts in the fused score: `share` from `full_share`
    /// up, `share × (share / full_share)^(partial_power − 1)` below (continuous at `full_share`; power 1 = linear).
    pub fn share(&self, share: f32) -> f32 {
        if !share.is_finite() || share <= 0.0 {
            0.0
        } else if self.partial_power == 1.0 || share >= self.full_share {
            share
        } else {
            share * (share / self.full_share).powf(self.partial_power - 1.0)
        }
    }

    /// The dense share for a question whose best BM25 candidate scores `best_share` of its IDF mass.
    pub fn weight(&self, best_share: f32) -> f32 {
        let c = if best_share.is_finite() { best_share.clamp(0.0, 1.0) } else { 0.0 };
        (self.dense_weight - (self.dense_weight - self.dense_weight_matched) * c).clamp(0.0, 1.0)
    }
}

/// Fuses a dense and a sparse ranking of the same query by their scores: a hit scores
/// `w × cosine + (1 − w) × share(bm25 / idf_mass)` (each 0 for a list it is not in; `w` from `fusion` and the best
/// BM25 hit's share of the IDF mass, [`Fusion::weight`]; partial matches fading, [`Fusion::share`]), best first,
/// ties by the rank in the heavier list, then in the other; at most `top`. Cosines are comparable across queries and
/// lists as they are; BM25 scores are not, so they are scaled by the query's IDF mass — the sum of its terms' IDFs
/// (`Store::idf_mass`), which a chunk holding every term once at the average length scores — so a chunk's share is
/// how much of the question's rare words it holds: a match of a common word alone ("patient", "heart") counts
/// little, a match of the rare concept the question names counts fully, even when it is the best BM25 hit either
/// way (scaling by the list's best, used before, gave a weak best match the full share). Unlike reciprocal rank
/// fusion it keeps how far apart the scores are. A weight of 1 is dense alone, 0 BM25 alone. Pure (tested below).
pub fn fuse_by_score(dense: Vec<Hit>, sparse: Vec<Hit>, fusion: Fusion, idf_mass: f32, top: usize) -> Vec<Hit> {
    let scale = if idf_mass > 0.0 { 1.0 / idf_mass } else { 0.0 };
    let ds: Vec<f32> = dense.iter().map(|h| h.score).collect();
    let ss: Vec<f32> = sparse.iter().map(|h| h.score * scale).collect();
    let w = fusion.weight(ss.iter().copied().fold(0.0, f32::max));
    let ss: Vec<f32> = ss.into_iter().map(|s| fusion.share(s)).collect();
    // (hit, fused score, dense rank, sparse rank)
    let mut fused: Vec<(Hit, f32, usize, usize)> = Vec::with_capacity(dense.len() + sparse.len());
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (rank, (mut h, s)) in dense.into_iter().zip(ds).enumerate() {
        h.found.dense = Some(h.score);
        at.insert(h.id.clone(), fused.len());
        fused.push((h, w * s, rank, usize::MAX));
    }
    for (rank, (mut h, s)) in sparse.into_iter().zip(ss).enumerate() {
        // A concept match's own BM25 score was kept by `with_matches` (none when its words did not match).
        let words = if h.found.concept { h.found.words } else { Some(h.score) };
        h.found.words = words.map(|raw| raw * scale);
        match at.get(&h.id) {
            Some(&i) => {
                fused[i].1 += (1.0 - w) * s;
                fused[i].3 = rank;
                fused[i].0.found.words = h.found.words;
                fused[i].0.found.concept = h.found.concept;
            }
            None => {
                at.insert(h.id.clone(), fused.len());
                fused.push((h, (1.0 - w) * s, usize::MAX, rank));
            }
        }
    }
    // Ties (e.g. a list's weakest hit and a hit absent from it, both 0) go by the heavier list's rank first.
    let by_dense = w >= 0.5;
    fused.sort_by(|a, b| {
        let (first, second) = if by_dense { ((a.2, b.2), (a.3, b.3)) } else { ((a.3, b.3), (a.2, b.2)) };
        b.1.total_cmp(&a.1).then(first.0.cmp(&first.1)).then(second.0.cmp(&second.1))
    });
    fused.truncate(top);
    fused
        .into_iter()
        .map(|(mut h, score, _, _)| {
            h.score = score;
            h
        })
        .collect()
}

/// The BM25 candidates with the chunks that mention a matched concept (`matched`, from a search filtered to those
/// concepts) counted as full lexical matches: each scores at least the query's IDF mass, so [`fuse_by_score`]
/// gives it a share of 1, as if it held every query term. Returns the candidates, best first, and the mass to
/// scale by (1 when the query's own terms are in no point, so that matches still count).
pub fn with_matches(mut sparse: Vec<Hit>, matched: Vec<Hit>, idf_mass: f32) -> (Vec<Hit>, f32) {
    if matched.is_empty() {
        return (sparse, idf_mass);
    }
    let mass = if idf_mass > 0.0 { idf_mass } else { 1.0 };
    for m in matched {
        match sparse.iter_mut().find(|h| h.id == m.id) {
            Some(h) => {
                h.found = Found { words: Some(h.score), concept: true, ..h.found };
                h.score = h.score.max(mass);
            }
            None => sparse.push(Hit { score: mass, found: Found { words: None, concept: true, ..m.found }, ..m }),
        }
    }
    // Stable: matches keep the dense order among themselves, after any candidate that scores above the mass.
    sparse.sort_by(|a, b| b.score.total_cmp(&a.score));
    (sparse, mass)
}

/// A query term's IDF as the store weighs it, from the best point holding it: that point's score for the term
/// alone is `idf × query weight × document weight` (Qdrant's IDF modifier), so `idf = score / (q × d)`; 0 when no
/// point holds the term.
pub(crate) fn idf_of(score: f32, query_weight: f32, doc_weight: f32) -> f32 {
    if query_weight > 0.0 && doc_weight > 0.0 { score / (query_weight * doc_weight) } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hit(id: &str, score: f32) -> Hit {
        Hit { id: id.into(), score, payload: Default::default(), found: Found::default() }
    }

    #[test]
    fn fusion_by_score_keeps_how_far_apart_the_scores_are() {
        let ids = |v: Vec<Hit>| v.into_iter().map(|h| h.id).collect::<Vec<_>>();
        // Dense: a is far better than b; BM25 barely prefers b. RRF would tie them; score fusion keeps a first.
        let dense = vec![hit("a", 0.9), hit("b", 0.3), hit("c", 0.1)];
        let sparse = vec![hit("b", 5.0), hit("a", 4.9), hit("d", 1.0)];
        assert_eq!(
            ids(fuse_by_score(dense.clone(), sparse.clone(), Fusion::fixed(0.5), 5.0, 10)),
            ["a", "b", "d", "c"].map(String::from)
        );
        // Weight 1 is the dense ranking, weight 0 the BM25 one (hits of the other list after, in their order).
        assert_eq!(
            ids(fuse_by_score(dense.clone(), sparse.clone(), Fusion::fixed(1.0), 5.0, 4)),
            ["a", "b", "c", "d"].map(String::from)
        );
        assert_eq!(
            ids(fuse_by_score(dense.clone(), sparse.clone(), Fusion::fixed(0.0), 5.0, 4)),
            ["b", "a", "d", "c"].map(String::from)
        );
        // Close cosines: the exact term match decides (a record of a few chunks, where dense alone guesses).
        let close = vec![hit("hpi", 0.55), hit("plan", 0.52)];
        let term = vec![hit("plan", 3.0)];
        assert_eq!(ids(fuse_by_score(close.clone(), term.clone(), Fusion::fixed(0.8), 3.0, 1)), ["plan"]);
        // The same best BM25 hit when it holds only a common word of the question (IDF mass 30: the rare words
        // are elsewhere or nowhere): it counts for little, and the dense order stands.
        assert_eq!(ids(fuse_by_score(close, term, Fusion::fixed(0.8), 30.0, 1)), ["hpi"]);
        // Fused scores, best first, at most `top`; no BM25 hit leaves the dense order and scores scaled by weight.
        let f = fuse_by_score(dense.clone(), sparse.clone(), Fusion::fixed(0.7), 5.0, 2);
        assert_eq!(f.len(), 2);
        assert!(f[0].score >= f[1].score && f[0].score <= 1.0);
        let alone = fuse_by_score(dense.clone(), Vec::new(), Fusion::fixed(0.5), 5.0, 10);
        assert_eq!(ids(alone.clone()), ["a", "b", "c"].map(String::from));
        assert_eq!(alone[0].score, 0.45);
        // No IDF mass (no term of the question in the store): the BM25 list adds nothing.
        assert_eq!(ids(fuse_by_score(dense, sparse, Fusion::fixed(0.5), 0.0, 3)), ["a", "b", "c"].map(String::from));
        assert_eq!(idf_of(6.0, 1.0, 2.0), 3.0);
        assert_eq!(idf_of(6.0, 1.0, 0.0), 0.0);
    }

    #[test]
    fn a_chunk_that_mentions_a_matched_concept_counts_as_a_full_bm25_match() {
        let ids = |v: &[Hit]| v.iter().map(|h| h.id.clone()).collect::<Vec<_>>();
        // "Is the heart enlarged?": BM25 finds the notes that repeat "heart"; the evidence says "cardiomegaly".
        let dense = vec![hit("plan", 0.62), hit("ekg", 0.60), hit("cxr", 0.58)];
        let sparse = vec![hit("plan", 3.0), hit("ekg", 2.5)];
        let matched = vec![hit("cxr", 0.58), hit("ekg", 0.60)];
        let f = Fusion::fixed(0.5);
        // Words only: the chunk that names the finding otherwise comes last.
        assert_eq!(ids(&fuse_by_score(dense.clone(), sparse.clone(), f, 4.0, 3)), ["plan", "ekg", "cxr"]);
        let (with, mass) = with_matches(sparse.clone(), matched.clone(), 4.0);
        assert_eq!(mass, 4.0);
        // Each match scores the whole mass (a candidate already above it keeps its own); the rest stay as they were.
        let scores: Vec<(String, f32)> = with.iter().map(|h| (h.id.clone(), h.score)).collect();
        assert_eq!(scores, [("ekg".into(), 4.0), ("cxr".into(), 4.0), ("plan".into(), 3.0)]);
        let fused = fuse_by_score(dense.clone(), with, f, mass, 3);
        assert_eq!(ids(&fused), ["ekg", "cxr", "plan"]);
        // Each hit says which rankings returned it: its cosine, its BM25 share of the mass, a concept match.
        let found: Vec<(&str, Found)> = fused.iter().map(|h| (h.id.as_str(), h.found)).collect();
        assert_eq!(
            found,
            [
                ("ekg", Found { dense: Some(0.60), words: Some(2.5 / 4.0), concept: true }),
                ("cxr", Found { dense: Some(0.58), words: None, concept: true }),
                ("plan", Found { dense: Some(0.62), words: Some(3.0 / 4.0), concept: false }),
            ]
        );
        // Found by BM25 alone, or by the dense vector alone.
        let fused = fuse_by_score(vec![hit("a", 0.5)], vec![hit("b", 2.0)], f, 4.0, 2);
        let found: Vec<(&str, Found)> = fused.iter().map(|h| (h.id.as_str(), h.found)).collect();
        assert_eq!(
            found,
            [
                ("a", Found { dense: Some(0.5), ..Found::default() }),
                ("b", Found { words: Some(0.5), ..Found::default() })
            ]
        );
        // A query whose words are in no point: the matches still count (mass 1), ranked by their dense scores.
        let (with, mass) = with_matches(Vec::new(), matched.clone(), 0.0);
        assert_eq!(mass, 1.0);
        let fused = fuse_by_score(dense.clone(), with, f, mass, 3);
        assert_eq!(ids(&fused), ["ekg", "cxr", "plan"]);
        assert!(fused.iter().all(|h| h.found.words.is_none()), "no word of the query matched: {fused:?}");
        // No matches: unchanged, the mass too (0 stays 0: no BM25 share at all).
        let (with, mass) = with_matches(sparse.clone(), Vec::new(), 0.0);
        assert_eq!((ids(&with), mass), (ids(&sparse), 0.0));
    }

    #[test]
    fn partial_bm25_matches_fade_and_full_ones_count_as_they_are() {
        let ids = |v: Vec<Hit>| v.into_iter().map(|h| h.id).collect::<Vec<_>>();
        let f = Fusion { dense_weight: 0.95, dense_weight_matched: 0.7, full_share: 0.6, partial_power: 3.0 };
        // From the full share up a share counts as it is; below, it fades as (share / full)², continuously.
        assert_eq!(f.share(0.6), 0.6);
        assert_eq!(f.share(1.4), 1.4);
        assert!((f.share(0.3) - 0.3 * 0.25).abs() < 1e-6);
        assert!((f.share(0.599_99) - 0.6).abs() < 1e-4);
        assert_eq!(f.share(0.0), 0.0);
        assert_eq!(f.share(f32::NAN), 0.0);
        assert_eq!(Fusion::fixed(0.8).share(0.3), 0.3, "power 1 is linear");
        // A paraphrased question: dense prefers hpi; "plan" repeats the question's common word and BM25's
        // saturation lifts it to 0.3 of the IDF mass. Linear, that reorders the two; faded, the dense order stands.
        let dense = vec![hit("hpi", 0.60), hit("plan", 0.58)];
        let common = vec![hit("plan", 0.3 * 4.0)];
        let linear = Fusion { partial_power: 1.0, ..f };
        assert_eq!(ids(fuse_by_score(dense.clone(), common.clone(), linear, 4.0, 1)), ["plan"]);
        assert_eq!(ids(fuse_by_score(dense.clone(), common, f, 4.0, 1)), ["hpi"]);
        // A chunk holding the rare word once in a longer chunk than the average (0.65 of the mass) still moves up.
        let rare = vec![hit("plan", 0.65 * 4.0)];
        assert_eq!(ids(fuse_by_score(dense, rare, f, 4.0, 1)), ["plan"]);
    }

    #[test]
    fn the_dense_share_falls_as_a_chunk_holds_more_of_the_questions_rare_words() {
        let ids = |v: Vec<Hit>| v.into_iter().map(|h| h.id).collect::<Vec<_>>();
        let f = Fusion { dense_weight: 0.95, dense_weight_matched: 0.7, full_share: 1.0, partial_power: 1.0 };
        assert_eq!(f.weight(0.0), 0.95);
        assert!((f.weight(1.0) - 0.7).abs() < 1e-6);
        assert!((f.weight(0.5) - 0.825).abs() < 1e-6);
        assert!((f.weight(3.0) - 0.7).abs() < 1e-6, "more than the mass (a term repeated) is all of it");
        assert_eq!(f.weight(f32::NAN), 0.95);
        assert_eq!(Fusion::fixed(0.8).weight(0.6), 0.8);
        // Dense prefers hpi a little. A BM25 hit holding 0.3 of the question's IDF mass (its common words) moves
        // a fixed 0.7 to it, but not the adaptive weight (0.875 here); one holding all of it (the concept asked for,
        // in the notes' words) does.
        let close = vec![hit("hpi", 0.55), hit("plan", 0.50)];
        let partial = vec![hit("plan", 0.9)];
        assert_eq!(ids(fuse_by_score(close.clone(), partial.clone(), Fusion::fixed(0.7), 3.0, 1)), ["plan"]);
        assert_eq!(ids(fuse_by_score(close.clone(), partial, f, 3.0, 1)), ["hpi"]);
        let whole = vec![hit("plan", 3.0)];
        let fused = fuse_by_score(close, whole, f, 3.0, 2);
        assert_eq!(ids(fused.clone()), ["plan", "hpi"]);
        assert!((fused[0].score - (0.7 * 0.5 + 0.3)).abs() < 1e-6, "{fused:?}");
    }

    #[test]
    fn point_ids_are_deterministic_and_distinct() {
        assert_eq!(point_id("d1", "2", 0), point_id("d1", "2", 0));
        assert_ne!(point_id("d1", "2", 0), point_id("d1", "3", 0));
        assert_ne!(point_id("d1", "2", 0), point_id("d1", "2", 1));
        // The separator keeps ("a1", "") and ("a", "1") apart.
        assert_ne!(point_id("a1", "", 0), point_id("a", "1", 0));
        assert_eq!(point_id("d1", "2", 0).get_version_num(), 5);
        assert_ne!(window_id("d1", "2", 0), point_id("d1", "2", 0));
        assert_eq!(window_id("d1", "2", 3), window_id("d1", "2", 3));
    }

    #[test]
    fn days_from_fhir_dates() {
        assert_eq!(day("2024-03-01"), Some(20240301));
        assert_eq!(day("2024-03-01T10:00:00+01:00"), Some(20240301));
        assert_eq!(day("2024-13-01"), None);
        assert_eq!(day("2024"), None);
        assert_eq!(day("20240301"), None);
        assert_eq!(day("2024-03-0x"), None);
    }

    #[test]
    fn chunk_filters_exclude_windows_and_window_filters_require_them() {
        let f = Filters { patient: Some("Patient/1".into()), since: Some(20240101), ..Default::default() };
        let chunks = f.to_json(Record::Chunks);
        assert_eq!(chunks["must_not"][0]["match"]["any"], json!([WINDOW, SUMMARY]));
        assert_eq!(chunks["must"][1]["range"]["gte"], 20240101);
        assert!(chunks["must"][1]["range"]["lte"].is_null());
        let windows = f.to_json(Record::Windows);
        assert_eq!(windows["must"][0]["match"]["value"], WINDOW);
        assert_eq!(windows["must_not"].as_array().unwrap().len(), 0);
        // Both parse as the embedded engine's filter.
        let _: qdrant_edge::Filter = serde_json::from_value(chunks).unwrap();
        let _: qdrant_edge::Filter = serde_json::from_value(windows).unwrap();
        // Summaries alone, and the collapsed tree (chunks and summaries, no windows).
        let summaries = f.to_json(Record::Summaries);
        assert_eq!(summaries["must"][0]["match"]["value"], SUMMARY);
        let tree = f.to_json(Record::Tree);
        assert_eq!(tree["must_not"][0]["match"]["value"], WINDOW);
        assert_eq!(tree["must_not"].as_array().unwrap().len(), 1);
        for f in [summaries, tree, summaries_except("Patient/1", &[summary_id("Patient/1", 1, &[])])] {
            let _: qdrant_edge::Filter = serde_json::from_value(f).unwrap();
        }
        assert_ne!(summary_id("Patient/1", 1, &["a".into()]), summary_id("Patient/1", 2, &["a".into()]));
        assert_ne!(summary_id("Patient/1", 1, &["a".into()]), summary_id("Patient/2", 1, &["a".into()]));
    }

    #[test]
    fn the_stale_points_of_several_documents_are_one_filter() {
        let keep = [point_id("d1", "2", 0), point_id("d2", "", 0)];
        let f = except_filter(&["d1", "d2"], &keep);
        assert_eq!(f["must"][0]["match"]["any"], serde_json::json!(["d1", "d2"]));
        assert_eq!(f["must_not"][0]["has_id"][1], keep[1].to_string());
        let _: qdrant_edge::Filter = serde_json::from_value(f).unwrap();
        // A document written with no points keeps none.
        let none = except_filter(&["d3"], &[]);
        assert_eq!(none["must_not"].as_array().unwrap().len(), 0);
        let _: qdrant_edge::Filter = serde_json::from_value(none).unwrap();
    }
}
