//! Summary vectors written off the acknowledgement path (`raptor.summary_vectors = "text"` with
//! `raptor.background_vectors`).
//!
//! In: a patient whose rebuilt tree has summaries not yet embedded (`Vectors::request`, called by the rebuild; it
//! never waits). The rebuild stores such a node with its members' mean vector and `vector_pending = true`, so the
//! tree is whole and searchable as soon as the note is acknowledged.
//! Out: each pending node's searched text (`abstracts::searched_text`) embedded and stored as its vector, the flag
//! removed.
//!
//! Order and races, as for abstracts: the snapshot and the store share the patient's tree lane (`Trees::lane`);
//! the model is asked outside it, and a vector is stored only into a node still there, still pending and with the
//! same searched text. Notes of one patient arriving while its vectors are embedded queue the patient once more,
//! so a burst of notes is embedded in one or two rounds, not one per note.
//!
//! Failures never reach a note: an embedding or store failure leaves the nodes pending (still searched by their
//! members' mean) until the patient's next rebuild queues them again; counted in
//! `clinstream_raptor_node_vectors_total{outcome}`. A worker restarted with nodes pending embeds them at the
//! patient's next rebuild.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tracing::warn;

use super::queue::{Parts, PatientQueue, Round};
use super::{TreeLane, abstracts::searched_text, retry_store};
use crate::store::{self, Point, Stored, bm25};
use crate::telemetry::metrics::metrics;

/// The payload flag of a summary stored by its members' mean until its text is embedded.
pub(super) const PENDING: &str = store::VECTOR_PENDING;

/// The queue of patients with summaries to embed.
#[derive(Default)]
pub(super) struct Vectors {
    queue: PatientQueue,
}

/// Whether a stored summary still waits for its text's vector.
pub(super) fn is_pending(p: &serde_json::Map<String, Value>) -> bool {
    p.get(PENDING).and_then(Value::as_bool).unwrap_or(false)
}

impl Vectors {
    /// Starts one worker on the current runtime (the model batches its requests with the notes'); it ends when the
    /// queue is closed (`close`), holding the indexer's parts only during a patient's round.
    pub fn spawn(self: &Arc<Self>, parts: &Arc<Parts>) {
        let (me, parts) = (Arc::clone(self), Arc::downgrade(parts));
        tokio::spawn(async move { me.queue.work(&*me, &parts).await });
    }

    /// Ends the worker; what is queued is left to the patients' next rebuilds (the nodes stay pending).
    pub fn close(&self) {
        self.queue.close();
    }

    pub fn request(&self, patient: &str) {
        self.queue.request(patient);
    }

    pub fn pending(&self) -> usize {
        self.queue.pending()
    }

    pub async fn settled(&self) {
        self.queue.settled().await;
    }
}

impl Round for Vectors {
    async fn round(&self, parts: &Parts, patient: &str, lane: &TreeLane) {
        if let Err(code) = write(parts, patient, lane).await {
            metrics().raptor_summary_vectors.with_label_values(&["failed"]).inc();
            warn!(code, "Summary vectors not stored; the patient's next rebuild asks again.");
        }
    }
}

/// One patient's round: the pending nodes' searched texts embedded, then stored into the nodes still pending with
/// the same text. Errors are codes (logged, never the text).
async fn write(parts: &Parts, patient: &str, lane: &TreeLane) -> Result<(), &'static str> {
    let code = |e: store::StoreError| e.code().as_str();
    let todo: Vec<(String, String)> = {
        let _running = lane.run.lock().await;
        let snapshot = retry_store(parts.halt_after, || parts.store.summaries(patient)).await.map_err(code)?;
        snapshot
            .into_iter()
            .filter(|(_, s)| is_pending(&s.payload))
            .map(|(id, s)| (id, searched_text(&s.payload).to_string()))
            .collect()
    };
    if todo.is_empty() {
        return Ok(());
    }
    let embedder = parts.embedder.clone();
    let texts: Vec<String> = todo.iter().map(|(_, t)| t.clone()).collect();
    let ids =
        tokio::task::spawn_blocking(move || embedder.encode(&texts.iter().map(String::as_str).collect::<Vec<_>>()))
            .await
            .map_err(|_| "internal_error")?
            .map_err(|e| e.code().as_str())?;
    let vectors = parts.embedder.embed_ids(ids).await.map_err(|e| e.code().as_str())?;
    let embedded: HashMap<String, (String, Vec<f32>)> =
        todo.into_iter().zip(vectors).map(|((id, text), v)| (id, (text, v))).collect();
    let _running = lane.run.lock().await;
    let current = retry_store(parts.halt_after, || parts.store.summaries(patient)).await.map_err(code)?;
    let mut stored = 0u64;
    let mut points = Vec::with_capacity(current.len());
    for (id, s) in current {
        let Ok(point_id) = id.parse() else { continue };
        let Stored { mut payload, mut dense, .. } = s;
        if is_pending(&payload)
            && let Some((text, v)) = embedded.get(&id)
            && searched_text(&payload) == text
        {
            dense.clone_from(v);
            payload.remove(PENDING);
            stored += 1;
        }
        let sparse = bm25::sparse_document(&parts.trees.bm25, searched_text(&payload));
        points.push(Point { id: point_id, dense, sparse, payload });
    }
    if stored > 0 {
        retry_store(parts.halt_after, || parts.store.replace_summaries(patient, points.clone())).await.map_err(code)?;
    }
    metrics().raptor_summary_vectors.with_label_values(&["embedded"]).inc_by(stored);
    Ok(())
}
