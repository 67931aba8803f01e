//! The embedded store: Qdrant's engine in-process (`qdrant-edge`), one shard in a directory (`store.path`).
//! Its calls block, so each runs on the blocking pool. An update returns once it is in the shard's WAL and
//! applied (the same guarantee as a server's `wait=true`); `flush` persists the segments (at shutdown).
//!
//! The engine runs no optimizers of its own (a server does, in the background): every `store.maintain_every`
//! points written or deleted, one background task flushes the segments (so closed WAL segments are released) and
//! runs the optimizers — vacuum of replaced and deleted points, merges, the HNSW index — while updates go on.
//! Without it a long run's memory grows with every rewrite, even of the same points (docs/benchmarks.md, memory).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use qdrant_edge::{
    CountRequest, CreateIndex, Distance, EdgeConfig, EdgeShard, EdgeSparseVectorParams, EdgeVectorParams,
    FieldIndexOperations, Filter, JsonPath, Memory, Modifier, NamedQuery, Payload, PayloadFieldSchema, PointId,
    PointInsertOperations, PointOperations, QueryEnum, QueryRequest, ScoringQuery, SparseVector, UpdateOperation,
    VectorInternal, Vectors, WithPayloadInterface,
};
use serde_json::Value;

use super::{DENSE, Filters, Hit, INDEXED_FIELDS, INTEGER_FIELDS, Point, Query, Record, SPARSE, StoreError};
use crate::config::StoreSettings;
use crate::telemetry::metrics::metrics;

pub struct EmbeddedStore {
    shard: Arc<EdgeShard>,
    batch: usize,
    maintain_every: u64,
    /// Points written or deleted since the last maintenance started.
    since_maintenance: AtomicU64,
    /// True while a maintenance task runs (at most one at a time).
    maintaining: Arc<AtomicBool>,
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

/// Creates the payload indexes the shard lacks (all of them in a new store; fields added by a newer clinstream in
/// an older one).
fn ensure_indexes(shard: &EdgeShard) -> Result<(), StoreError> {
    let have = shard.info().map_err(fatal("could not read the store's indexes"))?.payload_schema;
    let wanted = INDEXED_FIELDS.iter().map(|f| (*f, "keyword")).chain(INTEGER_FIELDS.iter().map(|f| (*f, "integer")));
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
    serde_json::from_value(f.to_json(record)).map_err(|e| StoreError::fatal(format!("filter: {e}")))
}

fn id_string(id: PointId) -> String {
    match id {
        PointId::Uuid(u) => u.to_string(),
        PointId::NumId(n) => n.to_string(),
    }
}

impl EmbeddedStore {
    /// Opens (or, with a dimension, creates) the shard at `store.path`.
    pub fn open(s: &StoreSettings, dim: Option<usize>) -> Result<EmbeddedStore, StoreError> {
        let path = Path::new(&s.path);
        let exists = path.join("edge_config.json").exists() || path.join(qdrant_edge::WAL_PATH).exists();
        let shard = if exists {
            let shard = EdgeShard::load(path, None).map_err(fatal("could not open the store"))?;
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
                .build();
            // Payload indexes before any data (below).
            EdgeShard::new(path, config).map_err(fatal("could not create the store"))?
        };
        if dim.is_some() {
            ensure_indexes(&shard)?;
        }
        Ok(EmbeddedStore {
            shard: Arc::new(shard),
            batch: s.upsert_batch,
            maintain_every: s.maintain_every,
            since_maintenance: AtomicU64::new(0),
            maintaining: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Counts `n` points written or deleted; past `store.maintain_every`, starts a maintenance task unless one runs.
    fn note_updates(&self, n: u64) {
        if self.maintain_every == 0 || self.since_maintenance.fetch_add(n, Ordering::SeqCst) + n < self.maintain_every {
            return;
        }
        if self.maintaining.swap(true, Ordering::SeqCst) {
            return;
        }
        self.since_maintenance.store(0, Ordering::SeqCst);
        let (shard, running) = (self.shard.clone(), self.maintaining.clone());
        tokio::task::spawn_blocking(move || {
            let clock = Instant::now();
            match shard.flush().and_then(|()| shard.optimize()) {
                Ok(optimized) => tracing::debug!(
                    optimized,
                    took_ms = clock.elapsed().as_millis() as u64,
                    "Embedded store flushed and optimised."
                ),
                Err(e) => tracing::warn!(error = %e, "Embedded store maintenance failed; it is tried again later."),
            }
            metrics().store_maintenance_duration.observe(clock.elapsed().as_secs_f64());
            running.store(false, Ordering::SeqCst);
        });
    }

    /// Waits for a running maintenance task (tests, and before a final flush).
    pub async fn maintenance_idle(&self) {
        while self.maintaining.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EdgeShard) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shard = self.shard.clone();
        tokio::task::spawn_blocking(move || f(&shard))
            .await
            .map_err(|e| StoreError::fatal(format!("embedded store task failed: {e}")))?
    }

    pub async fn upsert(&self, points: Vec<Point>) -> Result<(), StoreError> {
        let batch = self.batch;
        let n = points.len() as u64;
        let result = self
            .blocking(move |shard| {
                let mut points = points;
                while !points.is_empty() {
                    let rest = points.split_off(batch.min(points.len()));
                    let n = points.len();
                    let list = points
                        .into_iter()
                        .map(|p| {
                            // A window point has no vectors.
                            let vectors = if p.dense.is_empty() {
                                Vectors::new_named(Vec::<(String, qdrant_edge::Vector)>::new())
                            } else {
                                let sparse = qdrant_edge::Vector::new_sparse(p.sparse.indices, p.sparse.values)
                                    .map_err(fatal("sparse vector"))?;
                                Vectors::new_named([
                                    (DENSE.to_string(), qdrant_edge::Vector::new_dense(p.dense)),
                                    (SPARSE.to_string(), sparse),
                                ])
                            };
                            Ok(qdrant_edge::PointStruct::new(PointId::Uuid(p.id), vectors, Value::Object(p.payload)).0)
                        })
                        .collect::<Result<Vec<_>, StoreError>>()?;
                    let clock = Instant::now();
                    shard
                        .update(UpdateOperation::PointOperation(PointOperations::UpsertPoints(
                            PointInsertOperations::PointsList(list),
                        )))
                        .map_err(fatal("upsert failed"))?;
                    let m = metrics();
                    m.store_upsert_duration.with_label_values(&["embedded"]).observe(clock.elapsed().as_secs_f64());
                    m.store_points.with_label_values(&["upserted"]).inc_by(n as u64);
                    points = rest;
                }
                Ok(())
            })
            .await;
        if result.is_ok() {
            self.note_updates(n);
        }
        result
    }

    pub async fn delete_document(&self, doc_id: &str, keep_version: Option<&str>) -> Result<(), StoreError> {
        let filter: Filter = serde_json::from_value(super::document_filter(doc_id, keep_version))
            .map_err(|e| StoreError::fatal(format!("filter: {e}")))?;
        let result = self
            .blocking(move |shard| {
                shard
                    .update(UpdateOperation::PointOperation(PointOperations::DeletePointsByFilter(filter)))
                    .map_err(fatal("delete failed"))?;
                metrics().store_points.with_label_values(&["deleted_documents"]).inc();
                Ok(())
            })
            .await;
        if result.is_ok() {
            // The points a filter removes are not counted; a deletion counts as one update.
            self.note_updates(1);
        }
        result
    }

    /// Removes the points of several documents other than `keep` with one update.
    pub async fn delete_except(&self, doc_ids: &[&str], keep: &[uuid::Uuid]) -> Result<(), StoreError> {
        let filter: Filter = serde_json::from_value(super::except_filter(doc_ids, keep))
            .map_err(|e| StoreError::fatal(format!("filter: {e}")))?;
        let n = doc_ids.len() as u64;
        let result = self
            .blocking(move |shard| {
                shard
                    .update(UpdateOperation::PointOperation(PointOperations::DeletePointsByFilter(filter)))
                    .map_err(fatal("delete failed"))?;
                metrics().store_points.with_label_values(&["deleted_documents"]).inc_by(n);
                Ok(())
            })
            .await;
        if result.is_ok() {
            self.note_updates(1);
        }
        result
    }

    pub async fn search(&self, q: &Query) -> Result<Vec<Hit>, StoreError> {
        let filter = Some(filter_of(&q.filters, Record::Chunks)?);
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
        let prefetch = |query: ScoringQuery| {
            let mut p = qdrant_edge::PrefetchBuilder::new(candidates).query(query);
            if let Some(f) = &filter {
                p = p.filter(f.clone());
            }
            p.build()
        };
        let mut request = QueryRequest::new(q.top);
        if q.sparse.indices.is_empty() {
            // Dense only: one ranking, no fusion.
            request.query = Some(dense);
            request.filter = filter;
        } else {
            request.prefetches = vec![prefetch(dense), prefetch(sparse)];
            request.query = Some(ScoringQuery::Fusion(qdrant_edge::Fusion::Rrf { k: 60, weights: None }));
        }
        request.with_payload = payload_of(q.fields)?;
        self.blocking(move |shard| {
            let found = shard.query(request).map_err(fatal("query failed"))?;
            Ok(found
                .into_iter()
                .map(|p| Hit {
                    id: id_string(p.id),
                    score: p.score,
                    payload: p.payload.map(|Payload(m)| m).unwrap_or_default(),
                })
                .collect())
        })
        .await
    }

    pub async fn count(&self, f: &Filters, record: Record) -> Result<usize, StoreError> {
        let filter = filter_of(f, record)?;
        self.blocking(move |shard| {
            let mut request = CountRequest::new();
            request.filter = Some(filter);
            request.exact = true;
            shard.count(request).map_err(fatal("count failed"))
        })
        .await
    }

    /// Payloads of the points matching the filters, paged by id, at most `limit`.
    pub async fn scroll(
        &self,
        f: &Filters,
        record: Record,
        limit: usize,
        fields: &[&str],
    ) -> Result<Vec<serde_json::Map<String, Value>>, StoreError> {
        let filter = filter_of(f, record)?;
        let payload = payload_of(Some(fields))?;
        self.blocking(move |shard| {
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
                    .with_payload(payload.clone());
                if let Some(o) = offset {
                    request = request.offset(o);
                }
                let (records, next) = shard.scroll(request.build()).map_err(fatal("scroll failed"))?;
                out.extend(records.into_iter().map(|r| r.payload.map(|Payload(m)| m).unwrap_or_default()));
                match next {
                    Some(n) => offset = Some(n),
                    None => break,
                }
            }
            Ok(out)
        })
        .await
    }

    /// Points by id, in the order asked (missing ones left out).
    pub async fn retrieve(&self, ids: &[String]) -> Result<Vec<Hit>, StoreError> {
        let wanted: Vec<PointId> = ids.iter().filter_map(|i| i.parse::<uuid::Uuid>().ok()).map(PointId::Uuid).collect();
        self.blocking(move |shard| {
            let request = qdrant_edge::RetrieveRequestBuilder::new(wanted.clone())
                .with_payload(WithPayloadInterface::Bool(true))
                .build();
            let mut found = shard.retrieve(request).map_err(fatal("retrieve failed"))?;
            found.sort_by_key(|r| wanted.iter().position(|w| *w == r.id));
            Ok(found
                .into_iter()
                .map(|r| Hit {
                    id: id_string(r.id),
                    score: 0.0,
                    payload: r.payload.map(|Payload(m)| m).unwrap_or_default(),
                })
                .collect())
        })
        .await
    }

    pub async fn flush(&self) -> Result<(), StoreError> {
        self.maintenance_idle().await;
        self.blocking(|shard| shard.flush().map_err(fatal("flush failed"))).await
    }
}
