//! The read side's requests and answers: what `Reader::context` and `Reader::search` take and give, the bodies of
//! `POST /v1/context` and `POST /v1/search` (the service's OpenAPI document is generated from them:
//! `serve::api::openapi`), and what `clinstream context --json` prints.
//!
//! Requests refuse unknown fields (a misspelt filter is an error, not silently ignored).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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
    /// CPTF: keep this share (more than 0, at most 1) of each window's tokens — its most important words by the
    /// attention they receive, mentions and assertion cues always — so more windows fit the budget. Absent: off.
    #[serde(default)]
    pub compress: Option<f64>,
}

/// How the context was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// CLEAR: windows around the aligned entities' mentions.
    Clear,
    /// Nothing aligned, or no aligned entity in this patient's notes: the patient's chunks nearest the question
    /// (dense retrieval within the patient's filter).
    DenseFallback,
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

pub use super::facts::Fact;

/// A stored chunk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Hit {
    pub id: String,
    /// Fused hybrid score (a dense share × cosine + the rest × BM25 over the question's IDF mass, partial matches
    /// fading below `store.bm25_full_share`; the share from `store.dense_weight` down to
    /// `store.dense_weight_matched` as the best BM25 hit holds more of the question's rare words; 0 for a neighbour).
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
    /// In a context: the path that produced it (`dense`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<crate::query::context::Path>,
    /// Which rankings of the search returned it, each with its own score (absent for a neighbour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<store::Found>,
}

impl From<store::Hit> for Hit {
    fn from(h: store::Hit) -> Self {
        let found = (!h.found.is_empty()).then_some(h.found);
        Hit { id: h.id, score: h.score, payload: h.payload, previous: None, next: None, path: None, found }
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
    /// budget, best first, each cut to its longest part outside the windows (`text`, `start`, `end` of that part).
    /// With `dense_fallback`: the patient's chunks nearest the question that fit the budget, best first. Context
    /// only: the answer comes from the windows. Each has `path: dense`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<Hit>,
    /// Tokens of `windows` and `chunks`, counted with the configured tokenizer.
    pub tokens: usize,
    pub budget_tokens: usize,
    /// Aligned mentions found in the patient's notes before the budget cut.
    pub mentions_found: usize,
    /// Of those, mentions of an answer target. 0 means the lexicon found no mention of what the question asks
    /// about: the windows (all `related`) were held to three quarters of the budget and the nearest chunks took the
    /// rest.
    pub answer_mentions: usize,
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
            answer_mentions: c.answer_mentions,
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
            self.chunks.push(Hit { path: Some(crate::query::context::Path::Dense), ..Hit::from(h) });
            self.tokens += f.tokens;
        }
    }

    /// Switches to the dense fallback: the hits, best first, while their text fits the budget.
    /// `tokens` gives a hit's token count.
    pub(crate) fn fall_back(&mut self, hits: Vec<store::Hit>, budget: usize, tokens: &dyn Fn(&store::Hit) -> usize) {
        self.strategy = Strategy::DenseFallback;
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
                self.chunks.push(Hit { path: Some(crate::query::context::Path::Dense), ..Hit::from(h) });
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
    /// How hits are ranked (default `hybrid`).
    #[serde(default)]
    pub strategy: Option<SearchStrategy>,
}

/// How `/v1/search` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SearchStrategy {
    /// The patient's chunks by dense and BM25 scores fused (`store.dense_weight`, `store.dense_weight_matched`).
    /// With `serve.match_concepts` (the default) the query is aligned to concepts as a context's question is, and a
    /// chunk that mentions an aligned answer concept counts as a full BM25 match whatever words it uses.
    #[default]
    Hybrid,
    /// The chunks by the dense vector alone.
    Dense,
    /// RAPTOR's collapsed tree: one patient's chunks and summary nodes (`record: "summary"`, with `level`,
    /// `children`, `sentences`) ranked together by the fused score of `hybrid` (a summary's BM25 from its text or
    /// abstract; concept matches count for the chunks). Needs `patient`; the summaries exist where the worker runs
    /// with `raptor.enabled`. A summary has no section, type, concept or date fields, so those filters leave
    /// summaries out.
    Tree,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SearchResponse {
    pub hits: Vec<Hit>,
}

/// The answer of `POST /v1/answer` (the body is a `ContextRequest`): the CLEAR context, then one generation by the
/// configured LLM over it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AnswerResponse {
    /// The patient reference searched (`Patient/123`).
    pub patient: String,
    /// The model's answer.
    pub answer: String,
    /// The model's status for the question.
    pub status: Status,
    /// The passages the model cited, each once, in the order cited; every one is a passage of this context.
    pub citations: Vec<Citation>,
    /// Citations the model made of passages that are not in the context (dropped).
    pub citations_refused: usize,
    /// The notes of every passage the model was given (its whole context).
    pub sources: Vec<String>,
    /// Passages the model was given (the context's windows, then its chunks).
    pub passages: usize,
    /// The context's own answer (the rule vote over its windows), beside the model's.
    pub rule_answer: Answer,
    pub strategy: Strategy,
    /// Tokens of the context (the configured tokenizer).
    pub context_tokens: usize,
    /// The model that answered, as the endpoint names it.
    pub model: String,
    pub usage: Usage,
    /// Time the LLM endpoint took (the rest of the request is the service's own).
    pub llm_ms: u64,
    /// Where the request's time went, sent as the `Server-Timing` header, not in the body.
    #[serde(skip)]
    pub timing: AnswerTiming,
}

/// The stages of one answer, timed by the service (`Server-Timing: context;dur=…, generate;dur=…, llm;dur=…`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AnswerTiming {
    /// Building the CLEAR context (what `/v1/context` does).
    pub context: std::time::Duration,
    /// The generative step's own work: the passages, the prompt and its schema, the answer parsed and its
    /// citations checked; the LLM's time excluded.
    pub generate: std::time::Duration,
    /// The LLM endpoint's time: the call, its slot wait and retries, as `llm_ms`.
    pub llm: std::time::Duration,
}

/// One cited passage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Citation {
    /// Its number in the prompt (1-based).
    pub passage: usize,
    pub doc_id: String,
    pub date: Option<String>,
    pub section: String,
    /// Byte offsets of the passage in the note's text.
    pub start: usize,
    pub end: usize,
    pub text: String,
}

/// Tokens the generation used, as the endpoint counts them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}
