//! The query service's request and response bodies, and the OpenAPI document generated from them
//! (`openapi()`, written to docs/openapi.json by `clinstream openapi`; a test keeps the file current).
//!
//! Requests refuse unknown fields (a misspelt filter is an error, not silently ignored).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::model::Label;
use crate::query::align::Alignment;
use crate::query::context::Context;
use crate::store::{self, Filters};

/// `POST /v1/context`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextRequest {
    /// The subject reference as the notes carry it (`Patient/123`); a bare id (`123`) is read as `Patient/123`.
    pub patient: String,
    /// The clinical question (never logged).
    pub question: String,
    /// Context budget in tokens (default `serve.default_budget_tokens`, at most `serve.max_budget_tokens`).
    #[serde(default)]
    pub budget_tokens: Option<usize>,
    /// Only notes dated on or after this day (`YYYY-MM-DD`).
    #[serde(default)]
    pub since: Option<String>,
    /// Only notes dated on or before this day (`YYYY-MM-DD`).
    #[serde(default)]
    pub until: Option<String>,
    /// Only notes of these types (the type's text or coding display, as stored).
    #[serde(default)]
    pub document_types: Vec<String>,
    /// Only mentions in these sections (canonical names: `impression`, `findings`, `assessment_and_plan`, ...).
    #[serde(default)]
    pub sections: Vec<String>,
    /// Fill what the windows leave of the budget with the patient's chunks nearest the question (default
    /// `serve.fill`); `false` returns the windows only.
    #[serde(default)]
    pub fill: Option<bool>,
}

/// How the context was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// CLEAR: windows around the aligned entities' mentions.
    Clear,
    /// Nothing aligned, or no aligned entity in this patient's notes: hybrid chunk retrieval for the patient.
    HybridFallback,
}

/// `present` | `absent` | `uncertain` | `not_mentioned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Present,
    Absent,
    Uncertain,
    NotMentioned,
}

impl From<Label> for Status {
    fn from(l: Label) -> Self {
        match l {
            Label::Present => Status::Present,
            Label::Absent => Status::Absent,
            Label::Uncertain => Status::Uncertain,
            Label::NotMentioned => Status::NotMentioned,
        }
    }
}

/// An aligned concept or CLEAR variable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Entity {
    /// The concept id (`DOID:1673`) or `variable:<name>`.
    pub id: String,
    pub label: String,
    /// Alignment score (1 for a lexicon match).
    pub score: f32,
    /// `lexicon` (a term of the question) or `embedding` (semantic alignment).
    pub found: String,
    /// An answer target (its mentions vote); otherwise context only.
    pub answer: bool,
}

/// One context window: `query::context`'s own type.
pub use crate::query::context::ContextWindow as Window;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Answer {
    pub status: Status,
    /// The winner's share of the weighted votes (1 when nothing voted).
    pub confidence: f32,
    /// Indexes into `windows` of the windows that support the status.
    pub supporting: Vec<usize>,
}

/// What the patient's notes say of one aligned concept (the knowledge graph's patient-specific node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fact {
    pub concept: String,
    pub label: String,
    /// Entity kind (`diagnosis`, `medication`, `procedure`, ...).
    pub kind: String,
    pub mentions: usize,
    pub documents: usize,
    pub first_date: Option<String>,
    pub last_date: Option<String>,
    /// The assertion of its latest mention.
    pub latest_assertion: String,
    pub doc_ids: Vec<String>,
}

/// A stored chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hit {
    pub id: String,
    /// RRF score (0 for a neighbour).
    pub score: f32,
    /// `doc_id`, `doc_version`, `doc_date`, `patient`, `section`, `text`, `entities`, `prev_chunk_id`,
    /// `next_chunk_id`, ... (docs/embedding.md lists every field).
    pub payload: Map<String, Value>,
    /// The chunk before it in the note (with `neighbours: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Box<Hit>>,
    /// The chunk after it in the note (with `neighbours: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<Box<Hit>>,
}

impl From<store::Hit> for Hit {
    fn from(h: store::Hit) -> Self {
        Hit { id: h.id, score: h.score, payload: h.payload, previous: None, next: None }
    }
}

/// The answer of `POST /v1/context`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ContextResponse {
    /// The patient reference searched (`Patient/123`).
    pub patient: String,
    pub strategy: Strategy,
    pub entities: Vec<Entity>,
    /// Date order (then note and position).
    pub windows: Vec<Window>,
    /// With `clear` and `fill`: the patient's chunks nearest the question that filled what the windows left of the
    /// budget, best first, each cut to its longest part outside the windows (`text`, `start`, `end` of that part). With `hybrid_fallback`: the patient's best chunks that fit
    /// the budget, best first. Context only: the answer comes from the windows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<Hit>,
    /// Tokens of `windows` and `chunks`, counted with the configured tokenizer.
    pub tokens: usize,
    pub budget_tokens: usize,
    /// Aligned mentions found in the patient's notes before the budget cut.
    pub mentions_found: usize,
    pub answer: Answer,
    pub facts: Vec<Fact>,
}

impl ContextResponse {
    pub(crate) fn new(filters: &Filters, budget: usize, a: &Alignment, c: Context, facts: Vec<Fact>) -> Self {
        ContextResponse {
            patient: filters.patient.clone().unwrap_or_default(),
            strategy: Strategy::Clear,
            entities: a
                .aligned
                .iter()
                .map(|x| Entity {
                    id: x.id.clone(),
                    label: x.label.clone(),
                    score: x.score,
                    found: serde_json::to_value(x.found)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    answer: x.answer,
                })
                .collect(),
            windows: c.windows,
            chunks: Vec::new(),
            tokens: c.tokens,
            budget_tokens: budget,
            mentions_found: c.mentions_found,
            answer: Answer {
                status: c.answer.status.into(),
                confidence: c.answer.confidence,
                supporting: c.answer.supporting,
            },
            facts,
        }
    }

    /// Adds the fill chunks (`context::fill`'s choice among `hits`): a chunk cut to its part outside the windows
    /// carries that part's `text`, `start` and `end`.
    pub(crate) fn add_fill(&mut self, hits: Vec<store::Hit>, taken: &[crate::query::context::Filled]) {
        let mut hits: Vec<Option<store::Hit>> = hits.into_iter().map(Some).collect();
        for f in taken {
            let Some(mut h) = hits.get_mut(f.index).and_then(Option::take) else { continue };
            let at = |key: &str| h.payload.get(key).and_then(Value::as_u64).map(|v| v as usize);
            if let (Some(start), Some(end)) = (at("start"), at("end"))
                && (start, end) != (f.start, f.end)
            {
                let text = h.payload.get("text").and_then(Value::as_str).unwrap_or("");
                let part = text.get(f.start - start..f.end - start).unwrap_or("").to_string();
                h.payload.insert("text".into(), part.into());
                h.payload.insert("start".into(), f.start.into());
                h.payload.insert("end".into(), f.end.into());
            }
            self.chunks.push(Hit::from(h));
            self.tokens += f.tokens;
        }
    }

    /// Switches to the hybrid fallback: the hits, best first, while their text fits the budget.
    /// `tokens` gives a hit's token count.
    pub(crate) fn fall_back(&mut self, hits: Vec<store::Hit>, budget: usize, tokens: &dyn Fn(&store::Hit) -> usize) {
        self.strategy = Strategy::HybridFallback;
        self.windows.clear();
        self.answer = Answer { status: Status::NotMentioned, confidence: 1.0, supporting: Vec::new() };
        let mut remaining = budget;
        for h in hits {
            if remaining == 0 {
                break;
            }
            let t = tokens(&h);
            if t <= remaining {
                remaining -= t;
                self.chunks.push(Hit::from(h));
            }
        }
        self.tokens = budget - remaining;
    }
}

/// `POST /v1/search`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    pub query: String,
    /// `Patient/123` or `123`; omitted = every patient (the caller's authorisation decides whether it may).
    #[serde(default)]
    pub patient: Option<String>,
    /// Hits to return (default 10, at most `serve.max_top`).
    #[serde(default)]
    pub top: Option<usize>,
    /// Only chunks spanning any of these sections.
    #[serde(default)]
    pub sections: Vec<String>,
    #[serde(default)]
    pub document_types: Vec<String>,
    /// Only chunks mentioning any of these concept ids.
    #[serde(default)]
    pub concepts: Vec<String>,
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub until: Option<String>,
    /// Attach each hit's previous and next chunk (the stored neighbour ids).
    #[serde(default)]
    pub neighbours: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchResponse {
    pub hits: Vec<Hit>,
}

/// Every error body: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorDetail {
    /// `bad_request`, `unauthorized`, `payload_too_large`, `unsupported_media_type`, `store_unavailable`,
    /// `store_failed`, `embed_failed`, `timeout`, `not_found`, `method_not_allowed`.
    pub code: String,
    /// Names the field or limit; never echoes request values.
    pub message: String,
}

/// The OpenAPI 3.0 document of the service, generated from these types.
pub fn openapi() -> Value {
    let mut generator = schemars::r#gen::SchemaSettings::openapi3().into_generator();
    // Each body type (and what it refers to) lands in the generator's definitions: `#/components/schemas/…`.
    generator.subschema_for::<ContextRequest>();
    generator.subschema_for::<ContextResponse>();
    generator.subschema_for::<SearchRequest>();
    generator.subschema_for::<SearchResponse>();
    generator.subschema_for::<ErrorBody>();
    let components: Map<String, Value> = generator
        .take_definitions()
        .into_iter()
        .map(|(k, v)| (k, serde_json::to_value(v).unwrap_or_default()))
        .collect();
    let error = |what: &str| json!({"description": what, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}});
    let post = |summary: &str, req: &str, resp: &str| {
        json!({"post": {
            "summary": summary,
            "security": [{"bearer": []}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{req}")}}}},
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{resp}")}}}},
                "400": error("Malformed request, unknown field, or a value past a limit"),
                "401": error("No or unknown bearer token"),
                "413": error("Body larger than serve.max_body_bytes"),
                "415": error("Body is not application/json"),
                "503": error("Vector store unavailable (retry later)"),
                "504": error("Not answered within serve.timeout_ms"),
            }
        }})
    };
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "clinstream query service",
            "version": crate::WORKER_VERSION,
            "description": "CLEAR context and hybrid search over the notes clinstream workers stored. Generated from the code by `clinstream openapi`."
        },
        "paths": {
            "/v1/context": post("The evidence for a clinical question about one patient, inside a token budget, and the answer it supports", "ContextRequest", "ContextResponse"),
            "/v1/search": post("Hybrid (dense + BM25, RRF) search over stored chunks with filters and neighbour expansion", "SearchRequest", "SearchResponse"),
            "/healthz": {"get": {"summary": "Alive", "security": [], "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Ready: label index built, store reachable", "security": [], "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": {"200": {"description": "text exposition"}}}}
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "security": [{"bearer": []}]
    })
}
