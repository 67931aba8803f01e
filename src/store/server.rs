//! A Qdrant server over gRPC (`qdrant-client`): API key, TLS by an `https://` URL, collection bootstrap with
//! payload indexes before data, upserts in batches with `wait=true`, and errors sorted into transient
//! (unavailable, resource-exhausted with its retry-after, deadline) and fatal ones. Retrying is the caller's
//! job (`index::Indexer`), so one policy covers both stores.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use qdrant_client::qdrant::{
    Condition, CountPointsBuilder, CreateAliasBuilder, CreateCollectionBuilder, CreateFieldIndexCollectionBuilder,
    DeletePointsBuilder, Distance, FieldType, Filter, HnswConfigDiffBuilder, Modifier, PayloadIncludeSelector,
    PointStruct, QuantizationSearchParamsBuilder, Query as QQuery, QueryPointsBuilder, ScalarQuantizationBuilder,
    SearchParamsBuilder, SparseVectorParamsBuilder, SparseVectorsConfigBuilder, UpsertPointsBuilder,
    VectorParamsBuilder, VectorsConfigBuilder, point_id::PointIdOptions, vectors_config,
    with_payload_selector::SelectorOptions,
};
use qdrant_client::{Payload, Qdrant, QdrantError};

use super::{DENSE, DenseSearch, Filters, Hit, Point, Query, Record, SPARSE, SUMMARY, StoreError, Stored, WINDOW};
use crate::config::StoreSettings;
use crate::telemetry::metrics::metrics;

pub struct ServerStore {
    client: Qdrant,
    collection: String,
    batch: usize,
    /// With int8 vectors: rescore twice the candidates at full precision (`make bench`: recall@10 0.977 at
    /// oversampling 1, 0.996 at 2 — that of full-precision HNSW).
    int8: bool,
    /// Hybrid search: the dense share of the fused score (`store.dense_weight`, `store.dense_weight_matched`).
    fusion: super::Fusion,
}

/// Oversampling of quantized candidates in hybrid search (see `ServerStore::int8`).
const INT8_OVERSAMPLING: f64 = 2.0;

/// Sorts a client error (the message names the operation, never point contents).
fn classify(what: &str, e: QdrantError) -> StoreError {
    use tonic::Code;
    match &e {
        QdrantError::ResourceExhaustedError { retry_after_seconds, .. } => StoreError::Unavailable {
            detail: format!("qdrant {what}: resource exhausted"),
            retry_after: Some(Duration::from_secs(*retry_after_seconds)),
        },
        QdrantError::ResponseError { status } => {
            // A connection dropped mid-call (the server killed or restarted) surfaces as `Internal` with a
            // transport message from h2/hyper, not as `Unavailable`: that is an outage, not a refused request.
            let message = status.message().to_ascii_lowercase();
            let connection_lost = status.code() == Code::Internal
                && ["h2 protocol error", "connection", "transport", "broken pipe", "stream closed"]
                    .iter()
                    .any(|m| message.contains(m));
            let transient = connection_lost
                || matches!(
                    status.code(),
                    Code::Unavailable
                        | Code::DeadlineExceeded
                        | Code::ResourceExhausted
                        | Code::Aborted
                        | Code::Unknown
                        // The client's own request timeout (`store.timeout_ms`) ends a call as Cancelled.
                        | Code::Cancelled
                );
            let detail = format!("qdrant {what}: {:?}", status.code());
            if transient { StoreError::unavailable(detail) } else { StoreError::Failed(detail) }
        }
        QdrantError::Io(_) => StoreError::unavailable(format!("qdrant {what}: connection failed")),
        other => StoreError::fatal(format!("qdrant {what}: {other}")),
    }
}

fn id_string(id: Option<qdrant_client::qdrant::PointId>) -> String {
    match id.and_then(|i| i.point_id_options) {
        Some(PointIdOptions::Uuid(u)) => u,
        Some(PointIdOptions::Num(n)) => n.to_string(),
        None => String::new(),
    }
}

/// Only these payload fields.
fn included(fields: &[&str]) -> SelectorOptions {
    PayloadIncludeSelector::new(fields.iter().map(|f| f.to_string()).collect::<Vec<_>>()).into()
}

fn hit(p: qdrant_client::qdrant::ScoredPoint) -> Hit {
    Hit {
        id: id_string(p.id),
        score: p.score,
        payload: p.payload.into_iter().map(|(k, v)| (k, v.into_json())).collect(),
        found: Default::default(),
    }
}

/// The conditions of `Filters::to_json`, with the client's builders.
fn filter_of(f: &Filters, record: Record) -> Filter {
    use qdrant_client::qdrant::Range;
    let mut must = Vec::new();
    let mut must_not = Vec::new();
    match record {
        Record::Chunks => must_not.push(Condition::matches("record", vec![WINDOW.to_string(), SUMMARY.to_string()])),
        Record::Windows => must.push(Condition::matches("record", WINDOW.to_string())),
        Record::Summaries => must.push(Condition::matches("record", SUMMARY.to_string())),
        Record::Tree => must_not.push(Condition::matches("record", WINDOW.to_string())),
    }
    if let Some(p) = &f.patient {
        must.push(Condition::matches("patient", p.clone()));
    }
    for (key, values) in [("sections", &f.sections), ("doc_type", &f.doc_types), ("concepts", &f.concepts)] {
        if !values.is_empty() {
            must.push(Condition::matches(key, values.clone()));
        }
    }
    if f.since.is_some() || f.until.is_some() {
        let range = Range { gte: f.since.map(|d| d as f64), lte: f.until.map(|d| d as f64), ..Default::default() };
        must.push(Condition::range("doc_day", range));
    }
    Filter { must, must_not, ..Default::default() }
}

/// `filter` without the points `keep` (the ones just written).
fn except(mut filter: Filter, keep: &[uuid::Uuid]) -> Filter {
    if !keep.is_empty() {
        let ids: Vec<qdrant_client::qdrant::PointId> = keep.iter().map(|u| u.to_string().into()).collect();
        filter.must_not = vec![Condition::has_id(ids)];
    }
    filter
}

/// A point in the client's form.
fn client_point(p: Point) -> Result<PointStruct, StoreError> {
    let payload = Payload::try_from(serde_json::Value::Object(p.payload))
        .map_err(|e| StoreError::fatal(format!("payload: {e}")))?;
    let mut vectors: HashMap<String, qdrant_client::qdrant::Vector> = HashMap::new();
    // A window point has no vectors.
    if !p.dense.is_empty() {
        vectors.insert(DENSE.into(), p.dense.into());
        vectors.insert(SPARSE.into(), qdrant_client::qdrant::Vector::new_sparse(p.sparse.indices, p.sparse.values));
    }
    Ok(PointStruct::new(p.id.to_string(), vectors, payload))
}

impl ServerStore {
    /// Connects. With a dimension (a writer): creates the collection with the configured settings (dense + sparse
    /// vectors, shards, replicas, HNSW, quantization; payload indexes before the first point) when it is missing,
    /// or checks its shape (dense vector name, dimension and distance; the sparse vector) when it exists — another
    /// shape is a fatal error before anything is consumed; then creates `store.alias` when set and missing.
    /// Without one (a reader): reads through `store.alias` when set.
    pub async fn open(s: &StoreSettings, dim: Option<usize>) -> Result<ServerStore, StoreError> {
        let mut builder = Qdrant::from_url(&s.url).timeout(Duration::from_millis(s.timeout_ms));
        if !s.api_key.expose().is_empty() {
            builder = builder.api_key(s.api_key.expose().to_string());
        }
        let client = builder.build().map_err(|e| classify("connect", e))?;
        let Some(dim) = dim else {
            let name = if s.alias.is_empty() { &s.collection } else { &s.alias };
            let store = ServerStore {
                client,
                collection: name.clone(),
                batch: s.upsert_batch,
                int8: s.quantization == "int8",
                fusion: super::Fusion::of(s),
            };
            // Resolves aliases too: a missing collection is a clear error, not an empty answer later.
            store.client.collection_info(name).await.map_err(|e| match classify("collection_info", e) {
                StoreError::Failed(_) => {
                    StoreError::fatal(format!("qdrant collection or alias `{name}` does not exist"))
                }
                transient => transient,
            })?;
            return Ok(store);
        };
        let store = ServerStore {
            client,
            collection: s.collection.clone(),
            batch: s.upsert_batch,
            int8: s.quantization == "int8",
            fusion: super::Fusion::of(s),
        };
        let exists =
            store.client.collection_exists(&store.collection).await.map_err(|e| classify("collection_exists", e))?;
        if exists {
            store.check_shape(dim).await?;
        } else {
            store.create(dim, s).await?;
        }
        store.ensure_indexes(s).await?;
        if !s.alias.is_empty() {
            store.ensure_alias(&s.alias).await?;
        }
        Ok(store)
    }

    /// The existing collection must hold what this worker writes: `DENSE` vectors of `dim` with cosine distance,
    /// and the `SPARSE` vector.
    async fn check_shape(&self, dim: usize) -> Result<(), StoreError> {
        let info = self.client.collection_info(&self.collection).await.map_err(|e| classify("collection_info", e))?;
        let params = info.result.and_then(|r| r.config).and_then(|c| c.params);
        let name = &self.collection;
        let refuse = |why: String| {
            Err(StoreError::fatal(format!("qdrant collection `{name}` {why}; see docs/operations.md (model swap)")))
        };
        let Some(params) = params else { return refuse("reports no parameters".into()) };
        let dense = params.vectors_config.and_then(|v| v.config).and_then(|c| match c {
            vectors_config::Config::ParamsMap(m) => m.map.get(DENSE).cloned(),
            vectors_config::Config::Params(_) => None,
        });
        let Some(dense) = dense else { return refuse(format!("has no named `{DENSE}` vector")) };
        if dense.size as usize != dim {
            return refuse(format!("holds {}-dimensional `{DENSE}` vectors; the model gives {dim}", dense.size));
        }
        if dense.distance != Distance::Cosine as i32 {
            let distance = Distance::try_from(dense.distance).map_or("unknown", |d| d.as_str_name());
            return refuse(format!("measures `{DENSE}` with {distance} distance; clinstream writes cosine"));
        }
        if !params.sparse_vectors_config.is_some_and(|s| s.map.contains_key(SPARSE)) {
            return refuse(format!("has no `{SPARSE}` sparse vector"));
        }
        Ok(())
    }

    /// Creates `alias` pointing at this collection unless an alias of that name exists (pointing anywhere: after
    /// a model swap it points at the new collection, and an old worker must not move it back).
    async fn ensure_alias(&self, alias: &str) -> Result<(), StoreError> {
        let aliases = self.client.list_aliases().await.map_err(|e| classify("list_aliases", e))?;
        if aliases.aliases.iter().any(|a| a.alias_name == alias) {
            return Ok(());
        }
        if let Err(e) = self.client.create_alias(CreateAliasBuilder::new(&self.collection, alias)).await {
            // Another replica may have created it first.
            let aliases = self.client.list_aliases().await.map_err(|e| classify("list_aliases", e))?;
            if !aliases.aliases.iter().any(|a| a.alias_name == alias) {
                return Err(classify("create_alias", e));
            }
        }
        Ok(())
    }

    async fn create(&self, dim: usize, s: &StoreSettings) -> Result<(), StoreError> {
        let mut dense = VectorParamsBuilder::new(dim as u64, Distance::Cosine).on_disk(s.on_disk);
        if s.quantization == "int8" {
            dense = dense.quantization_config(ScalarQuantizationBuilder::default().always_ram(true));
        }
        let mut vectors = VectorsConfigBuilder::default();
        vectors.add_named_vector_params(DENSE, dense);
        let mut sparse = SparseVectorsConfigBuilder::default();
        sparse.add_named_vector_params(SPARSE, SparseVectorParamsBuilder::default().modifier(Modifier::Idf));
        let created = self
            .client
            .create_collection(
                CreateCollectionBuilder::new(&self.collection)
                    .vectors_config(vectors)
                    .sparse_vectors_config(sparse)
                    .on_disk_payload(s.on_disk)
                    .shard_number(s.shards)
                    .replication_factor(s.replication_factor)
                    .write_consistency_factor(s.write_consistency)
                    .hnsw_config(HnswConfigDiffBuilder::default().m(s.hnsw_m).ef_construct(s.hnsw_ef_construct)),
            )
            .await;
        if let Err(e) = created {
            // Created meanwhile: by another replica, or by this very call whose answer was lost (the client's
            // timeout fired after the server had acted), so that the retry finds it.
            if matches!(&e, QdrantError::ResponseError { status } if status.code() == tonic::Code::AlreadyExists) {
                return Ok(());
            }
            match self.client.collection_exists(&self.collection).await {
                Ok(true) => {}
                Ok(false) => return Err(classify("create_collection", e)),
                // The check itself did not get through (a slow or broken link): retried like any outage, never
                // taken for "not there".
                Err(probe) => return Err(classify("collection_exists", probe)),
            }
        }
        Ok(())
    }

    /// Creates the payload indexes the collection lacks (all of them after `create`, before any point; fields a
    /// newer clinstream, or a `store.payload_indexes` with more of them, added, in an older collection). An index
    /// the settings no longer ask for is left in place.
    async fn ensure_indexes(&self, s: &StoreSettings) -> Result<(), StoreError> {
        let info = self.client.collection_info(&self.collection).await.map_err(|e| classify("collection_info", e))?;
        let have = info.result.map(|r| r.payload_schema).unwrap_or_default();
        let wanted = super::keyword_fields(s)
            .into_iter()
            .map(|f| (f, FieldType::Keyword))
            .chain(super::integer_fields(s).iter().map(|f| (*f, FieldType::Integer)));
        for (field, kind) in wanted {
            if have.contains_key(field) {
                continue;
            }
            self.client
                .create_field_index(CreateFieldIndexCollectionBuilder::new(&self.collection, field, kind).wait(true))
                .await
                .map_err(|e| classify("create_field_index", e))?;
        }
        Ok(())
    }

    /// Upserts points in requests of `store.upsert_batch`, all of them at once. The points are converted to the
    /// client's form on the blocking pool (payloads are most of a point, and converting them is CPU work the async
    /// threads should not do).
    pub async fn upsert(&self, points: Vec<Point>) -> Result<(), StoreError> {
        let batch = self.batch.max(1);
        let batches = tokio::task::spawn_blocking(move || {
            let mut points = points;
            let mut out: Vec<Vec<PointStruct>> = Vec::new();
            while !points.is_empty() {
                let rest = points.split_off(batch.min(points.len()));
                out.push(points.into_iter().map(client_point).collect::<Result<Vec<_>, _>>()?);
                points = rest;
            }
            Ok::<_, StoreError>(out)
        })
        .await
        .map_err(|e| StoreError::fatal(format!("store task failed: {e}")))??;
        let requests = batches.into_iter().map(|batch| async move {
            let n = batch.len();
            let clock = Instant::now();
            self.client
                .upsert_points(UpsertPointsBuilder::new(&self.collection, batch).wait(true))
                .await
                .map_err(|e| classify("upsert", e))?;
            let m = metrics();
            m.store_upsert_duration.with_label_values(&["qdrant"]).observe(clock.elapsed().as_secs_f64());
            m.store_points.with_label_values(&["upserted"]).inc_by(n as u64);
            Ok::<(), StoreError>(())
        });
        futures_util::future::join_all(requests).await.into_iter().collect()
    }

    pub async fn delete_document(&self, doc_id: &str, keep_version: Option<&str>) -> Result<(), StoreError> {
        let mut filter = Filter::must([Condition::matches("doc_id", doc_id.to_string())]);
        if let Some(v) = keep_version {
            filter.must_not = vec![Condition::matches("doc_version", v.to_string())];
        }
        self.delete_where(filter).await?;
        metrics().store_points.with_label_values(&["deleted_documents"]).inc();
        Ok(())
    }

    /// Removes the points of several documents other than `keep` with one request.
    pub async fn delete_except(&self, doc_ids: &[&str], keep: &[uuid::Uuid]) -> Result<(), StoreError> {
        let ids: Vec<String> = doc_ids.iter().map(|d| d.to_string()).collect();
        self.delete_where(except(Filter::must([Condition::matches("doc_id", ids)]), keep)).await?;
        metrics().store_points.with_label_values(&["deleted_documents"]).inc_by(doc_ids.len() as u64);
        Ok(())
    }

    /// Deletes the points matching `filter` (wait=true).
    async fn delete_where(&self, filter: Filter) -> Result<(), StoreError> {
        self.client
            .delete_points(DeletePointsBuilder::new(&self.collection).points(filter).wait(true))
            .await
            .map_err(|e| classify("delete", e))?;
        Ok(())
    }

    pub async fn search(&self, q: &Query) -> Result<Vec<Hit>, StoreError> {
        let filter = Some(filter_of(&q.filters, q.record));
        let int8 = self.int8.then(|| {
            SearchParamsBuilder::default()
                .quantization(QuantizationSearchParamsBuilder::default().rescore(true).oversampling(INT8_OVERSAMPLING))
        });
        let payload = match q.fields {
            None => SelectorOptions::from(true),
            Some(fields) => included(fields),
        };
        if q.sparse.indices.is_empty() && q.matched.is_empty() {
            // Dense only: one ranking, no fusion.
            let mut request = QueryPointsBuilder::new(&self.collection)
                .query(QQuery::new_nearest(q.dense.clone()))
                .using(DENSE)
                .limit(q.top as u64)
                .with_payload(payload);
            if let Some(p) = int8 {
                request = request.params(p);
            }
            if let Some(f) = filter {
                request = request.filter(f);
            }
            let found = self.client.query(request).await.map_err(|e| classify("query", e))?;
            return Ok(super::found_by_dense(found.result.into_iter().map(hit).collect()));
        }
        // Hybrid: the dense and the BM25 candidates, asked together, fused here by score (`fuse_by_score`), as
        // the embedded store fuses them.
        let candidates = (q.top * 4).max(20) as u64;
        let mut dense = QueryPointsBuilder::new(&self.collection)
            .query(QQuery::new_nearest(q.dense.clone()))
            .using(DENSE)
            .limit(candidates)
            .with_payload(payload.clone());
        if let Some(p) = int8 {
            dense = dense.params(p);
        }
        let input = qdrant_client::qdrant::VectorInput::new_sparse(q.sparse.indices.clone(), q.sparse.values.clone());
        let mut sparse = QueryPointsBuilder::new(&self.collection)
            .query(QQuery::new_nearest(input))
            .using(SPARSE)
            .limit(candidates)
            .with_payload(payload);
        // The chunks that mention a matched concept, ranked by the dense vector: full BM25 matches (`with_matches`).
        // The query's filters (a concept filter of the caller's included) and a mention of a matched concept.
        let matched = (!q.matched.is_empty()).then(|| {
            let mut f = filter_of(&q.filters, q.record);
            f.must.push(Condition::matches("concepts", q.matched.clone()));
            dense.clone().filter(f)
        });
        if let Some(f) = filter {
            dense = dense.filter(f.clone());
            sparse = sparse.filter(f);
        }
        let ask = |request: Option<QueryPointsBuilder>| async move {
            match request {
                None => Ok(Vec::new()),
                Some(r) => Ok::<Vec<Hit>, StoreError>(
                    self.client.query(r).await.map_err(|e| classify("query", e))?.result.into_iter().map(hit).collect(),
                ),
            }
        };
        let (dense, sparse, matched, mass) = tokio::join!(
            ask(Some(dense)),
            ask((!q.sparse.indices.is_empty()).then_some(sparse)),
            ask(matched),
            self.idf_mass(&q.sparse)
        );
        let (sparse, mass) = super::with_matches(sparse?, matched?, mass?);
        Ok(super::fuse_by_score(dense?, sparse, self.fusion, mass, q.top))
    }

    /// `Store::idf_mass`: per term (asked at once), the best point holding it (no filter, no payload, its sparse
    /// vector).
    pub async fn idf_mass(&self, sparse: &super::Sparse) -> Result<f32, StoreError> {
        use qdrant_client::qdrant::{VectorsSelector, vector_output::Vector};
        let asks = sparse.indices.iter().zip(&sparse.values).map(|(&term, &weight)| {
            let request = QueryPointsBuilder::new(&self.collection)
                .query(QQuery::new_nearest(qdrant_client::qdrant::VectorInput::new_sparse(vec![term], vec![weight])))
                .using(SPARSE)
                .limit(1)
                .with_payload(false)
                .with_vectors(VectorsSelector { names: vec![SPARSE.to_string()] });
            async move {
                let found = self.client.query(request).await.map_err(|e| classify("query", e))?;
                let Some(p) = found.result.into_iter().next() else { return Ok(0.0) };
                let d = match p.vectors.and_then(|v| v.get_vector_by_name(SPARSE)) {
                    Some(Vector::Sparse(v)) => v.indices.iter().position(|&i| i == term).map_or(0.0, |k| v.values[k]),
                    _ => 0.0,
                };
                Ok::<f32, StoreError>(super::idf_of(p.score, weight, d))
            }
        });
        Ok(futures_util::future::try_join_all(asks).await?.into_iter().sum())
    }

    /// The ids of the `top` nearest points by the dense vector alone, searched as `how` says (the quantization
    /// benchmark compares exact search, HNSW on full vectors and HNSW on int8 vectors).
    pub async fn nearest(&self, vector: Vec<f32>, top: usize, how: DenseSearch) -> Result<Vec<String>, StoreError> {
        let params = match how {
            DenseSearch::Exact => SearchParamsBuilder::default()
                .exact(true)
                .quantization(QuantizationSearchParamsBuilder::default().ignore(true)),
            DenseSearch::Hnsw => {
                SearchParamsBuilder::default().quantization(QuantizationSearchParamsBuilder::default().ignore(true))
            }
            DenseSearch::Int8 { rescore, oversampling } => SearchParamsBuilder::default().quantization(
                QuantizationSearchParamsBuilder::default().ignore(false).rescore(rescore).oversampling(oversampling),
            ),
        };
        let request = QueryPointsBuilder::new(&self.collection)
            .query(QQuery::new_nearest(vector))
            .using(DENSE)
            .params(params)
            .limit(top as u64);
        let found = self.client.query(request).await.map_err(|e| classify("query", e))?;
        Ok(found
            .result
            .into_iter()
            .filter_map(|p| match p.id.and_then(|i| i.point_id_options) {
                Some(PointIdOptions::Uuid(u)) => Some(u),
                Some(PointIdOptions::Num(n)) => Some(n.to_string()),
                None => None,
            })
            .collect())
    }

    /// Asks the server to build the HNSW graph over every segment, however small (Qdrant searches segments below
    /// its indexing threshold, 10 MB by default, without the graph — and without the quantized vectors).
    pub async fn index_every_segment(&self) -> Result<(), StoreError> {
        use qdrant_client::qdrant::{OptimizersConfigDiffBuilder, UpdateCollectionBuilder};
        self.client
            .update_collection(
                UpdateCollectionBuilder::new(&self.collection)
                    .optimizers_config(OptimizersConfigDiffBuilder::default().indexing_threshold(1)),
            )
            .await
            .map_err(|e| classify("update_collection", e))?;
        Ok(())
    }

    /// Deletes the collection (benchmarks' own collections).
    pub async fn drop_collection(&self) -> Result<(), StoreError> {
        self.client.delete_collection(&self.collection).await.map_err(|e| classify("delete_collection", e))?;
        Ok(())
    }

    /// Points and HNSW-indexed vectors in the collection, and whether its optimizers are idle (status green).
    pub async fn index_status(&self) -> Result<(u64, u64, bool), StoreError> {
        let info = self.client.collection_info(&self.collection).await.map_err(|e| classify("collection_info", e))?;
        let r = info.result.unwrap_or_default();
        let green = r.status == qdrant_client::qdrant::CollectionStatus::Green as i32;
        Ok((r.points_count.unwrap_or(0), r.indexed_vectors_count.unwrap_or(0), green))
    }

    pub async fn count(&self, f: &Filters, record: Record) -> Result<usize, StoreError> {
        let r = self
            .client
            .count(CountPointsBuilder::new(&self.collection).filter(filter_of(f, record)).exact(true))
            .await
            .map_err(|e| classify("count", e))?;
        Ok(r.result.map_or(0, |c| c.count as usize))
    }

    /// Payloads of the points matching the filters, paged by id, at most `limit`.
    pub async fn scroll(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
    ) -> Result<Vec<serde_json::Map<String, serde_json::Value>>, StoreError> {
        Ok(self.scroll_points(f, record, limit, fields, false).await?.into_iter().map(|p| p.payload).collect())
    }

    /// The points matching the filters with their dense vectors and the given payload fields, paged by id, at most
    /// `limit`.
    pub async fn scroll_vectors(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
    ) -> Result<Vec<Stored>, StoreError> {
        self.scroll_points(f, record, limit, fields, true).await
    }

    /// The points matching the filters, paged by id, at most `limit`: ids, the given payload fields and, with
    /// `with_dense`, the dense vectors.
    async fn scroll_points(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
        with_dense: bool,
    ) -> Result<Vec<Stored>, StoreError> {
        use qdrant_client::qdrant::{ScrollPointsBuilder, VectorsSelector, vector_output::Vector};

        let filter = filter_of(f, record);
        let mut out = Vec::new();
        let mut offset = None;
        loop {
            let page = 256.min(limit.saturating_sub(out.len())) as u32;
            if page == 0 {
                break;
            }
            let mut request = ScrollPointsBuilder::new(&self.collection)
                .filter(filter.clone())
                .limit(page)
                .with_payload(included(fields));
            if with_dense {
                request = request.with_vectors(VectorsSelector { names: vec![DENSE.to_string()] });
            }
            if let Some(o) = offset.take() {
                request = request.offset(o);
            }
            let r = self.client.scroll(request).await.map_err(|e| classify("scroll", e))?;
            out.extend(r.result.into_iter().map(|p| {
                let dense = match p.vectors.and_then(|v| v.get_vector_by_name(DENSE)) {
                    Some(Vector::Dense(d)) => d.data,
                    _ => Vec::new(),
                };
                Stored {
                    id: id_string(p.id),
                    dense,
                    payload: p.payload.into_iter().map(|(k, v)| (k, v.into_json())).collect(),
                }
            }));
            match r.next_page_offset {
                Some(n) => offset = Some(n),
                None => break,
            }
        }
        Ok(out)
    }

    /// Upserts a patient's summary points, then deletes the patient's other summary points.
    pub async fn replace_summaries(&self, patient: &str, points: Vec<Point>) -> Result<(), StoreError> {
        let keep: Vec<uuid::Uuid> = points.iter().map(|p| p.id).collect();
        if !points.is_empty() {
            self.upsert(points).await?;
        }
        let summaries = Filter::must([
            Condition::matches("patient", patient.to_string()),
            Condition::matches("record", SUMMARY.to_string()),
        ]);
        self.delete_where(except(summaries, &keep)).await
    }

    /// Points by id, in the order asked (missing ones left out).
    pub async fn retrieve(&self, ids: &[String]) -> Result<Vec<Hit>, StoreError> {
        use qdrant_client::qdrant::{GetPointsBuilder, PointId};
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<PointId> = ids.iter().map(|i| PointId::from(i.clone())).collect();
        let r = self
            .client
            .get_points(GetPointsBuilder::new(&self.collection, wanted).with_payload(true))
            .await
            .map_err(|e| classify("get_points", e))?;
        let mut hits: Vec<Hit> = r
            .result
            .into_iter()
            .map(|p| Hit {
                id: id_string(p.id),
                score: 0.0,
                payload: p.payload.into_iter().map(|(k, v)| (k, v.into_json())).collect(),
                found: Default::default(),
            })
            .collect();
        hits.sort_by_key(|h| ids.iter().position(|i| *i == h.id));
        Ok(hits)
    }
}
