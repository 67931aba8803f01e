//! The read side's method over its edges: given a patient and a question, `Reader::context` aligns the question
//! with the lexicon's concepts and the CLEAR variables (`align`, with the patient's own entities), reads the
//! patient's stored entity windows (`Store::windows`, filtered by patient, dates, document types), rebuilds them
//! into note fragments (`windows::fragments`) and assembles the context (`context`: windows by alignment × section
//! weight, merged, copy-forward dropped, cut to the budget, date order, the answer they support), with the
//! patient's facts (`facts`); then fills what the windows left of the budget with the patient's chunks nearest
//! the question (`serve.fill`; dense search). When nothing aligns, it falls back to hybrid chunk retrieval for
//! that patient and says so. `Reader::search` is the dense + BM25 hybrid over chunks with filters and neighbour
//! expansion.
//!
//! `POST /v1/context` and `clinstream context` call the same `Reader::context` (the service adds routes, auth
//! and limits around it: `serve`). The embedder, the store and the label index are the edge; everything between
//! is pure. Questions and note text are never logged; errors name fields and limits, never values.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use super::align::{self, AlignParams, LabelIndex};
use super::api::{self, ContextRequest, ContextResponse, SearchRequest, SearchResponse};
use super::context::{self, ContextParams, PatientNote};
use super::cptf;
use super::facts::facts;
use super::labels::label_index_with;
use super::windows::fragments;
use crate::config::Settings;
use crate::embed::{EmbedError, Embedder};
use crate::stages::Pipeline;
use crate::store::{self, Filters, Query, Record, Store, StoreError, bm25};

/// Most windows read for one patient per request (a larger record is cut in point-id order; at ±150 words a
/// window per mention cluster, this is thousands of notes).
const MAX_WINDOWS: usize = 20_000;

/// A string field of a hit's payload ("" when absent).
fn str_of<'h>(h: &'h store::Hit, key: &str) -> &'h str {
    h.payload.get(key).and_then(|v| v.as_str()).unwrap_or("")
}

/// The payload fields of a fill (or fallback) chunk: what [`context::fill`] reads and what cites the chunk (note,
/// version, date, type, section, position and neighbours); the indexed copies of its entities and concepts stay in
/// the store.
const FILL_FIELDS: &[&str] = &[
    "doc_id",
    "doc_version",
    "doc_date",
    "doc_type",
    "encounter",
    "patient",
    "section",
    "section_title",
    "start",
    "end",
    "text",
    "tokens",
    "chunk_index",
    "prev_chunk_id",
    "next_chunk_id",
];

/// Why a request was not answered.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The request is malformed or asks past a limit (4xx; the message names the field and the limit).
    #[error("{0}")]
    BadRequest(String),
    /// The store could not be reached (503) or failed (500).
    #[error("vector store: {0}")]
    Store(#[from] StoreError),
    #[error("embedding model: {0}")]
    Embed(#[from] EmbedError),
    /// The label index is still being built (the service's first start with this model): 503, retry shortly.
    #[error("the label index is being built")]
    NotReady,
}

/// Counts context tokens: the embedding model's tokenizer, or the downstream LLM's `tokenizer.json`.
enum Counter {
    Model,
    File(Box<tokenizers::Tokenizer>),
}

/// Everything a request needs; cheap to share (`Arc`).
pub struct Reader {
    pipeline: Arc<Pipeline>,
    embedder: Embedder,
    store: Arc<Store>,
    /// Built on first use (`prepare` builds it before the service says it is ready).
    labels: tokio::sync::OnceCell<LabelIndex>,
    /// True while `prepare` builds the label index.
    preparing: std::sync::atomic::AtomicBool,
    bm25: bm25::Encoder,
    counter: Counter,
    settings: crate::config::ServeSettings,
    /// CPTF's token-importance model, loaded by the first request that asks for compression.
    importance: tokio::sync::OnceCell<Arc<crate::embed::importance::Importance>>,
    embed_settings: crate::config::EmbedSettings,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").field("store", &self.store.kind()).finish_non_exhaustive()
    }
}

/// `Patient/123` stays; a bare `123` becomes `Patient/123` (the form the notes carry).
pub fn patient_reference(p: &str) -> String {
    let p = p.trim();
    if p.contains('/') { p.to_string() } else { format!("Patient/{p}") }
}

impl Reader {
    /// Builds the service over an open store and a running embedder (shared with a worker in the same process).
    pub fn new(
        settings: &Settings,
        pipeline: Arc<Pipeline>,
        embedder: Embedder,
        store: Arc<Store>,
    ) -> anyhow::Result<Reader> {
        let counter = if settings.serve.tokenizer.is_empty() {
            Counter::Model
        } else {
            let t = tokenizers::Tokenizer::from_file(&settings.serve.tokenizer)
                .map_err(|e| anyhow::anyhow!("serve.tokenizer: {e}"))?;
            Counter::File(Box::new(t))
        };
        Ok(Reader {
            pipeline,
            embedder,
            store,
            labels: tokio::sync::OnceCell::new(),
            preparing: std::sync::atomic::AtomicBool::new(false),
            bm25: bm25::encoder(settings.store.bm25_avg_len)?,
            counter,
            settings: settings.serve.clone(),
            importance: tokio::sync::OnceCell::new(),
            embed_settings: settings.embed.clone(),
        })
    }

    /// Builds (or loads from `serve.cache_dir`) the concept-label embeddings; the first `/v1/context` would
    /// otherwise pay for it.
    pub async fn prepare(&self) -> Result<(), EmbedError> {
        self.prepare_with(&|_, _| {}).await
    }

    /// [`Reader::prepare`], reporting the build's progress (`done`, `total` labels) when the index is not cached.
    /// While it runs, a `context` request is answered [`ReadError::NotReady`] at once rather than queued behind it.
    pub async fn prepare_with(&self, progress: &(dyn Fn(usize, usize) + Send + Sync)) -> Result<(), EmbedError> {
        self.preparing.store(true, std::sync::atomic::Ordering::SeqCst);
        let built = self
            .labels
            .get_or_try_init(|| async {
                let cache = Path::new(&self.settings.cache_dir);
                let index = label_index_with(&self.pipeline, &self.embedder, cache, progress).await?;
                index.prepare_sites(self.pipeline.lexicon(), self.pipeline.variables(), AlignParams::default());
                Ok(index)
            })
            .await
            .map(|_| ());
        self.preparing.store(false, std::sync::atomic::Ordering::SeqCst);
        built
    }

    /// The label index: built here on first use, unless a `prepare` is building it (then not ready).
    async fn labels(&self) -> Result<&LabelIndex, ReadError> {
        if let Some(index) = self.labels.get() {
            return Ok(index);
        }
        if self.preparing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ReadError::NotReady);
        }
        self.prepare().await?;
        self.labels.get().ok_or(ReadError::NotReady)
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn settings(&self) -> &crate::config::ServeSettings {
        &self.settings
    }

    fn count_tokens(&self, text: &str) -> usize {
        match &self.counter {
            Counter::Model => self.embedder.count_tokens(text),
            Counter::File(t) => {
                t.encode(text, false).map(|e| e.len()).unwrap_or_else(|_| text.split_whitespace().count())
            }
        }
    }

    /// Where each token of `text` ends (byte offsets), with the same tokenizer as [`Reader::count_tokens`].
    fn token_ends(&self, text: &str) -> Vec<usize> {
        match &self.counter {
            Counter::Model => self.embedder.token_ends(text),
            Counter::File(t) => {
                t.encode(text, false).map(|e| e.get_offsets().iter().map(|&(_, end)| end).collect()).unwrap_or_default()
            }
        }
    }

    /// A stored chunk's token count, when it was counted with the tokenizer this service counts with (chunks
    /// carry their count with the embedding model's).
    fn stored_tokens(&self, h: &store::Hit) -> Option<usize> {
        match self.counter {
            Counter::Model => h.payload.get("tokens").and_then(|v| v.as_u64()).map(|t| t as usize),
            Counter::File(_) => None,
        }
    }

    /// `POST /v1/context`.
    pub async fn context(&self, req: &ContextRequest) -> Result<ContextResponse, ReadError> {
        let budget = req.budget_tokens.unwrap_or(self.settings.default_budget_tokens);
        if !limits::budget_tokens(&self.settings).contains(&budget) {
            return Err(ReadError::BadRequest(format!(
                "budget_tokens: must be between 1 and {} (serve.max_budget_tokens)",
                self.settings.max_budget_tokens
            )));
        }
        let question = req.question.trim();
        if question.is_empty() {
            return Err(ReadError::BadRequest("question: must not be empty".into()));
        }
        if req.compress.is_some_and(|r| !(r > 0.0 && r <= 1.0)) {
            return Err(ReadError::BadRequest("compress: must be more than 0 and at most 1".into()));
        }
        let filters =
            self.filters(Some(&req.patient), req.since.as_deref(), req.until.as_deref(), &req.document_types)?;
        let lexicon = self.pipeline.lexicon();
        let variables = self.pipeline.variables();
        // The patient's windows (vectorless points, read by filter) and the question's embeddings, together.
        let phrases = align::phrases(question);
        let refs: Vec<&str> = phrases.iter().map(String::as_str).collect();
        let (stored, phrase_vectors) =
            tokio::join!(self.store.windows(&filters, MAX_WINDOWS), self.embedder.embed_now(&refs));
        let (stored, phrase_vectors) = (stored?, phrase_vectors?);
        // The dense search starts now, beside the alignment and assembly (it needs only the question's vector: the
        // first phrase): it fills what the windows leave of the budget, or is the whole context when no window
        // is found. Dense only — on the qa set fused BM25 holds less evidence within a budget than dense alone.
        let fill = req.fill.unwrap_or(self.settings.fill);
        let dense_search = {
            let mut f = filters.clone();
            f.sections = req.sections.clone();
            let dense = phrase_vectors.first().cloned().unwrap_or_default();
            let top = context::fill_candidates(budget).min(self.settings.max_top);
            let q = Query {
                dense,
                sparse: store::Sparse::default(),
                filters: f,
                top,
                fields: Some(FILL_FIELDS),
                record: Record::Chunks,
                matched: Vec::new(),
            };
            let store = Arc::clone(&self.store);
            tokio::spawn(async move { store.search(&q).await })
        };
        let sections: HashSet<&str> = req.sections.iter().map(String::as_str).collect();
        let notes = fragments(stored, lexicon, &sections);
        let present: HashSet<u32> = notes.iter().flat_map(|n| n.mentions.iter().map(|m| m.concept)).collect();
        let alignment = align::align(
            question,
            &phrase_vectors,
            lexicon,
            variables,
            self.labels().await?,
            Some(&present),
            AlignParams::default(),
        );
        let views: Vec<PatientNote<'_>> = notes.iter().map(PatientNote::from).collect();
        let mut params = ContextParams::new(budget, self.settings.window_words);
        if !fill {
            // Windows only: nothing else would take what a held-back share leaves.
            params.related_share = 1.0;
        }
        let count = |t: &str| self.count_tokens(t);
        let ends = |t: &str| self.token_ends(t);
        let importance = match req.compress {
            Some(_) => Some(self.importance().await?),
            None => None,
        };
        let filter = |text: &str, spans: &[(usize, usize)], allowance: usize| {
            // Scored by the importance model (a failure keeps the window whole: it is then chosen by its full size).
            let Some(Ok(tokens)) = importance.as_ref().map(|m| m.score(text)) else {
                return (text.to_string(), self.count_tokens(text));
            };
            let kept = cptf::filter_window(text, &tokens, spans, allowance);
            let n = self.count_tokens(&kept.text);
            (kept.text, n)
        };
        params.compress = req.compress.map(|ratio| context::Compress { ratio: ratio as f32, filter: &filter });
        let assemble = || context::assemble_with(&views, &alignment, variables, lexicon, params, &count, Some(&ends));
        // CPTF runs the model per window: off the async threads where the runtime allows it.
        let c = match (req.compress, tokio::runtime::Handle::current().runtime_flavor()) {
            (Some(_), tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(assemble),
            _ => assemble(),
        };
        let facts = facts(&notes, &alignment, lexicon);
        let fall_back = alignment.is_empty() || c.windows.is_empty();
        let needed = fall_back || (fill && c.tokens < budget);
        if !needed {
            dense_search.abort();
            return Ok(ContextResponse::new(&filters, budget, &alignment, c, facts));
        }
        let hits = dense_search.await.map_err(|e| StoreError::unavailable(format!("dense search: {e}")))??;
        if fall_back {
            // Nothing aligned (or no aligned concept in this patient's notes): the patient's chunks nearest the
            // question.
            let mut response = ContextResponse::new(&filters, budget, &alignment, c, facts);
            response.fall_back(hits, budget, &|h| {
                self.stored_tokens(h).unwrap_or_else(|| self.count_tokens(str_of(h, "text")))
            });
            return Ok(response);
        }
        // Fill: the nearest chunks, in what the windows left of the budget.
        let at = |h: &store::Hit, key: &str| h.payload.get(key).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        let taken = {
            let passages: Vec<context::Passage<'_>> = hits
                .iter()
                .map(|h| context::Passage {
                    doc_id: str_of(h, "doc_id"),
                    start: at(h, "start"),
                    end: at(h, "end"),
                    text: str_of(h, "text"),
                    tokens: self.stored_tokens(h),
                })
                .collect();
            context::fill(&c.windows, &passages, budget, &count)
        };
        let mut response = ContextResponse::new(&filters, budget, &alignment, c, facts);
        response.add_fill(hits, &taken);
        Ok(response)
    }

    /// CPTF's token-importance model (`serve.compress_model_file`), loaded once, off the async threads.
    async fn importance(&self) -> Result<Arc<crate::embed::importance::Importance>, ReadError> {
        let model = self
            .importance
            .get_or_try_init(|| async {
                let (s, file) = (self.embed_settings.clone(), self.settings.compress_model_file.clone());
                tokio::task::spawn_blocking(move || crate::embed::importance::Importance::load(&s, &file))
                    .await
                    .map_err(|_| EmbedError::Stopped)?
                    .map(Arc::new)
            })
            .await?;
        Ok(Arc::clone(model))
    }

    /// `POST /v1/search`.
    pub async fn search(&self, req: &SearchRequest) -> Result<SearchResponse, ReadError> {
        let top = req.top.unwrap_or(10);
        if !limits::top(&self.settings).contains(&top) {
            return Err(ReadError::BadRequest(format!(
                "top: must be between 1 and {} (serve.max_top)",
                self.settings.max_top
            )));
        }
        if req.query.trim().is_empty() {
            return Err(ReadError::BadRequest("query: must not be empty".into()));
        }
        let mut filters =
            self.filters(req.patient.as_deref(), req.since.as_deref(), req.until.as_deref(), &req.document_types)?;
        filters.concepts = req.concepts.clone();
        let strategy = req.strategy.unwrap_or_default();
        if strategy == api::SearchStrategy::Tree && req.patient.is_none() {
            return Err(ReadError::BadRequest("strategy: `tree` searches one patient's tree; give `patient`".into()));
        }
        let hits = if strategy == api::SearchStrategy::Tree {
            // A summary quotes its chunks: twice the hits are read, and those that only repeat better ones dropped.
            let hits = self.ranked(req.query.trim(), filters, &req.sections, top.saturating_mul(2), strategy).await?;
            without_repeats(hits, top)
        } else {
            self.ranked(req.query.trim(), filters, &req.sections, top, strategy).await?
        };
        let mut out: Vec<api::Hit> = hits.into_iter().map(api::Hit::from).collect();
        if req.neighbours {
            // The stored previous/next chunk ids, fetched once each, attached to the hit they neighbour.
            let mut ids: Vec<String> = Vec::new();
            for h in &out {
                for key in ["prev_chunk_id", "next_chunk_id"] {
                    if let Some(id) = h.payload.get(key).and_then(|v| v.as_str())
                        && !ids.iter().any(|i| i == id)
                    {
                        ids.push(id.to_string());
                    }
                }
            }
            let found: HashMap<String, store::Hit> =
                self.store.chunks(&ids).await?.into_iter().map(|h| (h.id.clone(), h)).collect();
            for h in &mut out {
                for (key, slot) in [("prev_chunk_id", 0), ("next_chunk_id", 1)] {
                    let n = h.payload.get(key).and_then(|v| v.as_str()).and_then(|id| found.get(id));
                    let n = n.map(|n| api::Hit::from(n.clone()));
                    if slot == 0 { h.previous = n.map(Box::new) } else { h.next = n.map(Box::new) }
                }
            }
        }
        Ok(SearchResponse { hits: out })
    }

    /// The search of `strategy` for `text`: hybrid (dense and BM25 fused by score, `store.dense_weight`), dense
    /// alone, or hybrid over the collapsed tree (the patient's chunks and RAPTOR summaries together).
    async fn ranked(
        &self,
        text: &str,
        mut filters: Filters,
        sections: &[String],
        top: usize,
        strategy: api::SearchStrategy,
    ) -> Result<Vec<store::Hit>, ReadError> {
        filters.sections = sections.to_vec();
        let (sparse, record) = match strategy {
            api::SearchStrategy::Hybrid => (bm25::sparse_query(&self.bm25, text), Record::Chunks),
            api::SearchStrategy::Dense => (store::Sparse::default(), Record::Chunks),
            api::SearchStrategy::Tree => (bm25::sparse_query(&self.bm25, text), Record::Tree),
        };
        // Concept matches need the label index: until `prepare` has built it (a first start with this model), the
        // search ranks by the query's words alone rather than wait for it.
        let labels = self.labels.get().filter(|_| self.settings.match_concepts);
        let Some(labels) = labels.filter(|_| strategy != api::SearchStrategy::Dense) else {
            let dense = self.embedder.embed_now(&[text]).await?.pop().unwrap_or_default();
            let q = Query { dense, sparse, filters, top, fields: None, record, matched: Vec::new() };
            return Ok(self.store.search(&q).await?);
        };
        // The query aligned as a question is (its phrases embedded with it: the first vector is the query's own),
        // its answer concepts matched by the chunks that mention them.
        let phrases = align::phrases(text);
        let refs: Vec<&str> = phrases.iter().map(String::as_str).collect();
        let vectors = self.embedder.embed_now(&refs).await?;
        let lexicon = self.pipeline.lexicon();
        let alignment =
            align::align(text, &vectors, lexicon, self.pipeline.variables(), labels, None, AlignParams::default());
        let q = Query {
            dense: vectors.into_iter().next().unwrap_or_default(),
            sparse,
            filters,
            top,
            fields: None,
            record,
            matched: matched_concepts(&alignment, lexicon),
        };
        Ok(self.store.search(&q).await?)
    }

    fn filters(
        &self,
        patient: Option<&str>,
        since: Option<&str>,
        until: Option<&str>,
        types: &[String],
    ) -> Result<Filters, ReadError> {
        if patient.is_some_and(|p| p.trim().is_empty()) {
            return Err(ReadError::BadRequest("patient: must not be empty (`Patient/123` or `123`)".into()));
        }
        let day = |field: &str, v: Option<&str>| match v {
            None => Ok(None),
            Some(d) => store::day(d.trim()).map(Some).ok_or_else(|| {
                ReadError::BadRequest(format!("{field}: not a date (YYYY-MM-DD, or a date-time starting so)"))
            }),
        };
        Ok(Filters {
            patient: patient.map(patient_reference),
            sections: Vec::new(),
            doc_types: types.to_vec(),
            concepts: Vec::new(),
            since: day("since", since)?,
            until: day("until", until)?,
        })
    }
}

/// The collapsed tree's hits, best first, without those that only repeat better ones (`raptor::repeats`: an
/// extractive summary whose sentences all lie in chunks ranked above it, a one-sentence chunk a summary above it
/// quotes), at most `top`.
fn without_repeats(hits: Vec<store::Hit>, top: usize) -> Vec<store::Hit> {
    let mut taken = Vec::new();
    let mut out = Vec::with_capacity(top);
    for h in hits {
        let spans = quoted_spans(&h.payload);
        if super::raptor::repeats(&spans, &taken) {
            continue;
        }
        taken.extend(spans);
        out.push(h);
        if out.len() == top {
            break;
        }
    }
    out
}

/// Where a hit's text lies in its notes: a chunk's span, an extractive summary's sentences; nothing for a summary
/// with an abstract (text of its own).
fn quoted_spans(p: &serde_json::Map<String, serde_json::Value>) -> Vec<super::raptor::Span<String>> {
    let span = |v: &serde_json::Map<String, serde_json::Value>| {
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).map(|n| n as usize);
        Some((v.get("doc_id")?.as_str()?.to_string(), n("start")?, n("end")?))
    };
    if p.get("record").and_then(|r| r.as_str()) != Some(store::SUMMARY) {
        return span(p).into_iter().collect();
    }
    if p.get("abstract").is_some_and(|a| !a.is_null()) {
        return Vec::new();
    }
    let sentences = p.get("sentences").and_then(|s| s.as_array()).map(Vec::as_slice).unwrap_or_default();
    let spans: Option<Vec<_>> = sentences.iter().map(|s| s.as_object().and_then(span)).collect();
    spans.unwrap_or_default()
}

/// At most this many answer concepts are matched by mention (a query that names a broad class, "disease" with its
/// descendants, names no finding a mention could stand for: its words alone rank it).
pub const MAX_MATCHED_CONCEPTS: usize = 256;

/// The concept ids whose mentions count as a full lexical match for a query aligned as `alignment`: its answer
/// concepts, none when there are more than [`MAX_MATCHED_CONCEPTS`].
pub fn matched_concepts(alignment: &align::Alignment, lexicon: &crate::lexicon::Lexicon) -> Vec<String> {
    if alignment.answer_concepts.len() > MAX_MATCHED_CONCEPTS {
        return Vec::new();
    }
    let mut ids: Vec<String> = alignment.answer_concepts.iter().map(|&c| lexicon.concept(c).id.clone()).collect();
    ids.sort();
    ids
}

/// The limits a request is held to, in one place: the checks above use them, and the OpenAPI document states them
/// (`serve::api::openapi_for`), so the contract says what the server enforces.
pub mod limits {
    use std::ops::RangeInclusive;

    use crate::config::ServeSettings;

    /// `budget_tokens` (`serve.max_budget_tokens`).
    pub fn budget_tokens(s: &ServeSettings) -> RangeInclusive<usize> {
        1..=s.max_budget_tokens
    }

    /// `top` of `/v1/search` (`serve.max_top`).
    pub fn top(s: &ServeSettings) -> RangeInclusive<usize> {
        1..=s.max_top
    }

    /// Text that must hold something besides white space (`patient`, `question`, `query`; they are trimmed).
    pub const NOT_BLANK: &str = "\\S";

    /// A day as `since`/`until` take it (`store::day`): `YYYY-MM-DD`, alone or starting a date-time.
    pub const DAY: &str = "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn hit(id: &str, payload: serde_json::Value) -> store::Hit {
        let payload = payload.as_object().unwrap().clone();
        store::Hit { id: id.into(), score: 0.0, payload, found: Default::default() }
    }

    #[test]
    fn the_tree_search_drops_what_only_repeats_better_hits() {
        let chunk = |id: &str, doc: &str, start: u64, end: u64| {
            hit(id, json!({"record": "chunk", "doc_id": doc, "start": start, "end": end}))
        };
        let summary = |id: &str, sentences: serde_json::Value, written: bool| {
            let mut p = json!({"record": "summary", "sentences": sentences});
            if written {
                p["abstract"] = json!("text of its own");
            }
            hit(id, p)
        };
        let quoting_a = json!([{"doc_id": "a", "start": 10, "end": 40}, {"doc_id": "b", "start": 5, "end": 9}]);
        let hits = vec![
            chunk("c1", "a", 0, 100),
            chunk("c2", "b", 0, 50),
            // Every sentence inside c1 or c2: a repeat.
            summary("s1", quoting_a.clone(), false),
            // The same sentences with an abstract: its own text, kept.
            summary("s2", quoting_a, true),
            // One sentence outside what was returned: kept.
            summary(
                "s3",
                json!([{"doc_id": "a", "start": 10, "end": 40}, {"doc_id": "c", "start": 0, "end": 9}]),
                false,
            ),
            chunk("c3", "c", 0, 9),
            chunk("c4", "d", 0, 20),
        ];
        let ids = |hits: Vec<store::Hit>| hits.into_iter().map(|h| h.id).collect::<Vec<_>>();
        // c3 is a one-sentence chunk s3 quotes whole: a repeat too.
        assert_eq!(ids(without_repeats(hits.clone(), 10)), ["c1", "c2", "s2", "s3", "c4"]);
        assert_eq!(ids(without_repeats(hits.clone(), 3)), ["c1", "c2", "s2"]);
        // Ranked first, the summary stays, and the chunks that hold more than it quotes follow.
        let mut first = hits;
        first.rotate_left(2);
        assert_eq!(ids(without_repeats(first, 10)), ["s1", "s2", "s3", "c4", "c1", "c2"]);
    }
}
