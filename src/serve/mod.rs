//! The query service: the read side's method (`query::Reader`) behind HTTP — routes, bearer-token auth, body and
//! concurrency limits, timeouts (`routes`), the OpenAPI document (`api`), and the wiring that keeps `/readyz`
//! true to the store. Nothing of the method lives here: `POST /v1/context` and `clinstream context` both call
//! `Reader::context`.

pub mod api;
pub mod routes;

use std::sync::Arc;

use crate::config::Settings;
use crate::embed::{EmbedError, Embedder};
use crate::query::Reader;
use crate::stages::Pipeline;
use crate::store::{Filters, Store};

pub use crate::query::ReadError;
pub use api::{ContextRequest, ContextResponse, SearchRequest, SearchResponse};

/// The service: the reader it answers with, and its limits (`serve.*`).
#[derive(Debug)]
pub struct Service {
    reader: Reader,
}

impl Service {
    /// Builds the service over an open store and a running embedder (shared with a worker in the same process).
    pub fn new(
        settings: &Settings,
        pipeline: Arc<Pipeline>,
        embedder: Embedder,
        store: Arc<Store>,
    ) -> anyhow::Result<Service> {
        Ok(Service { reader: Reader::new(settings, pipeline, embedder, store)? })
    }

    /// The read side's method this service answers with.
    pub fn reader(&self) -> &Reader {
        &self.reader
    }

    /// Builds (or loads from `serve.cache_dir`) the concept-label embeddings before the service says it is ready;
    /// the first `/v1/context` would otherwise pay for it.
    pub async fn prepare(&self) -> Result<(), EmbedError> {
        self.reader.prepare().await
    }

    pub fn store(&self) -> &Arc<Store> {
        self.reader.store()
    }

    pub fn settings(&self) -> &crate::config::ServeSettings {
        self.reader.settings()
    }

    /// While the store is marked unreachable (a request got 503), asks it every `every` whether it answers again,
    /// so `/readyz` recovers even when the orchestrator has stopped sending requests to a not-ready pod. Runs until
    /// the process ends.
    pub fn watch_store(self: &Arc<Self>, every: std::time::Duration) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            // A filter no point matches: answered from the payload index, whatever the collection's size.
            let probe = Filters { patient: Some("\u{1f}readiness-probe".into()), ..Default::default() };
            loop {
                tokio::time::sleep(every).await;
                if !crate::telemetry::health::store_reachable() && me.reader.store().windows(&probe, 1).await.is_ok() {
                    crate::http::set_store_reachable(true);
                }
            }
        });
    }
}
