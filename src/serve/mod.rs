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
use crate::llm::{Llm, LlmError};
use crate::query::Reader;
use crate::query::answer::{self, Templates, Unusable};
use crate::stages::Pipeline;
use crate::store::{Filters, Store};

pub use crate::query::ReadError;
pub use api::{AnswerResponse, ContextRequest, ContextResponse, SearchRequest, SearchResponse};

/// The service: the reader it answers with, who may ask (`access`), where requests are recorded (`audit`).
#[derive(Debug)]
pub struct Service {
    reader: Reader,
    authenticator: access::Authenticator,
    auditor: audit::Auditor,
    llm: Option<Llm>,
    templates: Templates,
}

/// Why `/v1/answer` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The context could not be read (as `/v1/context`).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// No `llm.base_url`.
    #[error("no LLM is configured (llm.base_url)")]
    NotConfigured,
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Unusable(#[from] Unusable),
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
        let llm = Llm::new(&settings.llm).map_err(anyhow::Error::msg)?;
        let templates = Templates::load(&settings.llm.prompt_dir).map_err(anyhow::Error::msg)?;
        let reader = Reader::new(settings, pipeline, embedder, store)?;
        Ok(Service { reader, authenticator, auditor, llm, templates })
    }

    /// `POST /v1/answer`: the CLEAR context for the request, then one generation over its passages (and nothing
    /// else: the patient's own context), the model's citations checked against them.
    pub async fn answer(&self, req: &ContextRequest) -> Result<AnswerResponse, AnswerError> {
        let llm = self.llm.as_ref().ok_or(AnswerError::NotConfigured)?;
        let start = std::time::Instant::now();
        let context = self.reader.context(req).await?;
        let context_time = start.elapsed();
        let passages = answer::passages(&context);
        let messages = answer::messages(&self.templates, &req.question, &passages);
        let schema = answer::schema(passages.len());
        let clock = std::time::Instant::now();
        let completion = llm.chat(&messages, Some(&schema)).await;
        let llm_time = clock.elapsed();
        let m = crate::telemetry::metrics::metrics();
        m.llm_duration.observe(llm_time.as_secs_f64());
        let outcome = match &completion {
            Ok(_) => "ok",
            Err(LlmError::Timeout) => "timeout",
            Err(LlmError::Unavailable(_)) => "unavailable",
            Err(LlmError::Failed(_)) => "failed",
        };
        m.llm_requests.with_label_values(&[outcome]).inc();
        let completion = completion?;
        let generated = answer::parse(&completion.content, passages.len()).inspect_err(|_| {
            m.llm_requests.with_label_values(&["unusable"]).inc();
        })?;
        m.llm_citations_refused.inc_by(generated.refused as u64);
        let status = serde_json::from_value(serde_json::Value::String(generated.status.clone()))
            .map_err(|_| Unusable("has an unknown status"))?;
        let sources: std::collections::BTreeSet<String> = passages.iter().map(|p| p.doc_id.clone()).collect();
        Ok(AnswerResponse {
            patient: context.patient.clone(),
            answer: generated.answer,
            status,
            citations: generated
                .citations
                .iter()
                .map(|&i| {
                    let p = &passages[i];
                    api::Citation {
                        passage: i + 1,
                        doc_id: p.doc_id.clone(),
                        date: p.date.clone(),
                        section: p.section.clone(),
                        start: p.start,
                        end: p.end,
                        text: p.text.clone(),
                    }
                })
                .collect(),
            citations_refused: generated.refused,
            sources: sources.into_iter().collect(),
            passages: passages.len(),
            rule_answer: context.answer.clone(),
            strategy: context.strategy,
            context_tokens: context.tokens,
            model: completion.model,
            usage: api::Usage {
                prompt_tokens: completion.prompt_tokens,
                completion_tokens: completion.completion_tokens,
            },
            llm_ms: llm_time.as_millis() as u64,
            timing: api::AnswerTiming {
                context: context_time,
                generate: start.elapsed().saturating_sub(context_time + llm_time),
                llm: llm_time,
            },
        })
    }

    /// Whether an LLM is configured (`/v1/answer` answers).
    pub fn llm_timeout(&self) -> Option<std::time::Duration> {
        self.llm.as_ref().map(Llm::timeout)
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
