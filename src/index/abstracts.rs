//! RAPTOR's abstractive summaries (`raptor.abstractive`), written off the acknowledgement path.
//!
//! In: a patient whose summary tree was just rebuilt (`Abstracts::request`, called by the rebuild; it never waits).
//! Out: each of the patient's summary nodes that has no `abstract` yet gets one from the LLM (`llm.*`), stored in
//! the node's point beside its extractive `text` (which keeps the node's citations: `sentences`), with
//! `abstract_model`; with `raptor.summary_vectors = "text"` the node is then searched by the abstract's embedding,
//! and its BM25 vector is the abstract's.
//!
//! What the LLM reads: a level-1 node's member chunks (their stored text, in reading order), a higher node's member
//! summaries (their abstracts when written — lower levels are written first in one round — or their extractive
//! text), cut to `raptor.abstract_input_tokens`; one node per request, one patient's text only (the node, its
//! chunks and its child summaries are all read by the patient's filter or by the patient's own tree's ids, and a
//! chunk of another patient is dropped). Prompts and completions are never logged.
//!
//! Order and races: a patient's rebuilds and the storing of its abstracts share the patient's tree lane
//! (`Trees::lane`), so they never interleave; the LLM is asked outside the lane, and what it wrote is stored only
//! into nodes still there and still without an abstract (a node id is its children, so a node still there has the
//! text the abstract was written from). A rebuild keeps the abstract of every node it keeps (`Trees::points`).
//!
//! Failures never reach a note: an LLM that fails, times out or answers nothing leaves the node extractive until
//! the patient's next rebuild asks again; a store failure (after `store.halt_after_ms` of retries) is logged and
//! dropped the same way. Counted in `clinstream_raptor_abstracts_total{outcome}`. `llm.max_concurrent` patients are
//! worked on at once; the requests of one patient share the client's `llm.max_concurrent` slots.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tracing::{info, warn};

use super::queue::{Parts, PatientQueue, Round};
use super::{TreeLane, retry_store};
use crate::config::Settings;
use crate::llm::Llm;
use crate::query::answer::{self, Templates};
use crate::store::{self, Point, Stored, bm25};
use crate::telemetry::metrics::metrics;

/// The abstracts' queue and the LLM they are asked of.
pub(super) struct Abstracts {
    llm: Llm,
    templates: Templates,
    input_tokens: usize,
    queue: PatientQueue,
}

impl Abstracts {
    /// The queue for `raptor.abstractive` (`None` when off), its LLM client and templates.
    pub fn new(settings: &Settings) -> Result<Option<Arc<Abstracts>>, String> {
        if !settings.raptor.abstractive {
            return Ok(None);
        }
        let llm = Llm::new(&settings.llm)?.ok_or("raptor.abstractive needs llm.base_url")?;
        let templates = Templates::load_summary(&settings.llm.prompt_dir)?;
        Ok(Some(Arc::new(Abstracts {
            llm,
            templates,
            input_tokens: settings.raptor.abstract_input_tokens,
            queue: PatientQueue::default(),
        })))
    }

    /// Starts `llm.max_concurrent` workers on the current runtime; they end when the queue is closed (`close`),
    /// holding the indexer's parts only during a patient's round.
    pub fn spawn(self: &Arc<Self>, parts: &Arc<Parts>, workers: usize) {
        for _ in 0..workers.max(1) {
            let (me, parts) = (Arc::clone(self), Arc::downgrade(parts));
            tokio::spawn(async move { me.queue.work(&*me, &parts).await });
        }
    }

    /// Ends the workers; what is queued is left to the patients' next rebuilds.
    pub fn close(&self) {
        self.queue.close();
    }

    /// Queues the patient (once, however often asked before a worker takes it). Never waits.
    pub fn request(&self, patient: &str) {
        self.queue.request(patient);
    }

    /// Patients queued or being worked on.
    pub fn pending(&self) -> usize {
        self.queue.pending()
    }

    /// Waits until every queued patient has been worked on.
    pub async fn settled(&self) {
        self.queue.settled().await;
    }

    /// One patient's round: the nodes without an abstract, lowest level first, each written by the LLM from its
    /// members' texts; then those still there stored. Errors are codes (logged, never the text).
    async fn write(&self, parts: &Parts, patient: &str, lane: &TreeLane) -> Result<(), &'static str> {
        let code = |e: store::StoreError| e.code().as_str();
        let snapshot = {
            let _running = lane.run.lock().await;
            retry_store(parts.halt_after, || parts.store.summaries(patient)).await.map_err(code)?
        };
        let mut todo: Vec<&Stored> = snapshot.values().filter(|s| !has_abstract(&s.payload)).collect();
        if todo.is_empty() {
            return Ok(());
        }
        todo.sort_by(|a, b| level(a).cmp(&level(b)).then(a.id.cmp(&b.id)));
        // The level-1 nodes' chunks, this patient's only.
        let mut wanted: Vec<String> = todo.iter().filter(|n| level(n) == 1).flat_map(|n| children(n)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let chunks: HashMap<String, store::Hit> = if wanted.is_empty() {
            HashMap::new()
        } else {
            retry_store(parts.halt_after, || parts.store.chunks(&wanted))
                .await
                .map_err(code)?
                .into_iter()
                .filter(|h| h.payload.get("patient").and_then(Value::as_str) == Some(patient))
                .map(|h| (h.id.clone(), h))
                .collect()
        };
        let m = &metrics().raptor_abstracts;
        let mut written: HashMap<String, (String, String)> = HashMap::new();
        let mut at = 0;
        while at < todo.len() {
            let lvl = level(todo[at]);
            let end = todo[at..].iter().position(|n| level(n) != lvl).map_or(todo.len(), |i| at + i);
            let asks = todo[at..end].iter().map(|n| {
                let members = self.members(n, &snapshot, &chunks, &written);
                let passages = answer::fit(members, self.input_tokens, &|t| parts.embedder.count_tokens(t));
                let messages = answer::summary_messages(&self.templates, &passages);
                async move { (n.id.clone(), self.llm.chat(&messages, None).await) }
            });
            for (id, result) in futures_util::future::join_all(asks).await {
                match result {
                    Ok(c) => match answer::summary_of(&c.content) {
                        Some(text) => {
                            written.insert(id, (text, c.model));
                        }
                        None => m.with_label_values(&["unusable"]).inc(),
                    },
                    Err(_) => m.with_label_values(&["failed"]).inc(),
                }
            }
            at = end;
        }
        if written.is_empty() {
            return Ok(());
        }
        let vectors: HashMap<String, Vec<f32>> = if parts.trees.embed_text {
            let (ids, texts): (Vec<&String>, Vec<&str>) = written.iter().map(|(id, (t, _))| (id, t.as_str())).unzip();
            let vectors = parts.embedder.embed(&texts).await.map_err(|e| e.code().as_str())?;
            ids.into_iter().cloned().zip(vectors).collect()
        } else {
            HashMap::new()
        };
        let _running = lane.run.lock().await;
        let current = retry_store(parts.halt_after, || parts.store.summaries(patient)).await.map_err(code)?;
        let mut stored = 0;
        let mut points = Vec::with_capacity(current.len());
        for (id, s) in current {
            let Ok(point_id) = id.parse() else { continue };
            let Stored { mut payload, mut dense, .. } = s;
            if !has_abstract(&payload)
                && let Some((text, model)) = written.remove(&id)
            {
                payload.insert("abstract".into(), text.into());
                payload.insert("abstract_model".into(), model.into());
                if let Some(v) = vectors.get(&id) {
                    dense.clone_from(v);
                    payload.remove(store::VECTOR_PENDING);
                }
                stored += 1;
            }
            let sparse = bm25::sparse_document(&parts.trees.bm25, searched_text(&payload));
            points.push(Point { id: point_id, dense, sparse, payload });
        }
        m.with_label_values(&["replaced"]).inc_by(written.len() as u64);
        if stored > 0 {
            retry_store(parts.halt_after, || parts.store.replace_summaries(patient, points.clone()))
                .await
                .map_err(code)?;
            m.with_label_values(&["written"]).inc_by(stored);
            info!(summaries = stored, "Abstractive summaries stored.");
        }
        Ok(())
    }

    /// A node's members' texts: a level-1 node's chunks in reading order (date, note, offset), a higher node's
    /// child summaries (abstract if there is one, else the extractive text) in the order the node lists them.
    fn members(
        &self,
        node: &Stored,
        snapshot: &HashMap<String, Stored>,
        chunks: &HashMap<String, store::Hit>,
        written: &HashMap<String, (String, String)>,
    ) -> Vec<String> {
        let ids = children(node);
        if level(node) == 1 {
            let mut found: Vec<&store::Hit> = ids.iter().filter_map(|id| chunks.get(id)).collect();
            let key = |h: &store::Hit| {
                let p = &h.payload;
                let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                (s("doc_date"), s("doc_id"), p.get("start").and_then(Value::as_u64).unwrap_or(0))
            };
            found.sort_by_key(|h| key(h));
            found.iter().filter_map(|h| h.payload.get("text").and_then(Value::as_str).map(str::to_string)).collect()
        } else {
            ids.iter()
                .filter_map(|id| match written.get(id) {
                    Some((text, _)) => Some(text.clone()),
                    None => snapshot.get(id).map(|s| searched_text(&s.payload).to_string()),
                })
                .collect()
        }
    }
}

impl Round for Abstracts {
    async fn round(&self, parts: &Parts, patient: &str, lane: &TreeLane) {
        if let Err(code) = self.write(parts, patient, lane).await {
            warn!(code, "Abstractive summaries not stored; the patient's next rebuild asks again.");
        }
    }
}

fn level(s: &Stored) -> u64 {
    s.payload.get("level").and_then(Value::as_u64).unwrap_or(0)
}

fn children(s: &Stored) -> Vec<String> {
    s.payload
        .get("children")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn has_abstract(p: &serde_json::Map<String, Value>) -> bool {
    p.get("abstract").and_then(Value::as_str).is_some_and(|a| !a.is_empty())
}

/// What a summary is searched by: its abstract once written, else its extractive text.
pub(super) fn searched_text(p: &serde_json::Map<String, Value>) -> &str {
    p.get("abstract")
        .and_then(Value::as_str)
        .filter(|a| !a.is_empty())
        .or_else(|| p.get("text").and_then(Value::as_str))
        .unwrap_or_default()
}
