//! The query service: the read side's method (`query::Reader`) behind HTTP — routes, body and concurrency limits,
//! timeouts (`routes`), who may ask about which patient (`access`, with identity-provider tokens checked by
//! `oidc`), one audit record per request (`audit`), the OpenAPI document (`api`), and the wiring that keeps
//! `/readyz` true to the store. Nothing of the method lives here: `POST /v1/context` and `clinstream context` both call
//! `Reader::context`.

pub mod access;
pub mod api;
pub mod audit;
pub mod oidc;
pub mod routes;

use std::sync::Arc;

use crate::config::Settings;
use crate::embed::{EmbedError, Embedder};
use crate::query::Reader;
use crate::stages::Pipeline;
use crate::store::{Filters, Store};

pub use crate::query::ReadError;
pub use api::{ContextRequest, ContextResponse, SearchRequest, SearchResponse};

/// The service: the reader it answers with, who may ask (`access`), where requests are recorded (`audit`).
#[derive(Debug)]
pub struct Service {
    reader: Reader,
    authenticator: access::Authenticator,
    auditor: audit::Auditor,
}

impl Service {
    /// Builds the service over an open store and a running embedder (shared with a worker in the same process);
    /// starts loading the identity provider's keys when one is configured (within a Tokio runtime).
    pub fn new(
        settings: &Settings,
        pipeline: Arc<Pipeline>,
        embedder: Embedder,
        store: Arc<Store>,
    ) -> anyhow::Result<Service> {
        let authenticator = access::Authenticator::new(&settings.serve).map_err(anyhow::Error::msg)?;
        let auditor = audit::Auditor::new(settings).map_err(anyhow::Error::msg)?;
        Ok(Service { reader: Reader::new(settings, pipeline, embedder, store)?, authenticator, auditor })
    }

    /// Who may ask.
    pub fn authenticator(&self) -> &access::Authenticator {
        &self.authenticator
    }

    /// Where requests are recorded.
    pub fn auditor(&self) -> &audit::Auditor {
        &self.auditor
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
