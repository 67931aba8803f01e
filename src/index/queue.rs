//! A queue of patients whose tree has work left after a rebuild (`abstracts`, `vectors`): a patient is queued
//! once however often it is asked for before a worker takes it, so a burst of one patient's notes costs one round.
//! Asking never waits; `settled` waits until nothing is queued or in hand (a file run's end). `close` (the indexer
//! dropped) lets the workers end: what is still queued is left to the patients' next rebuilds. `work` is the workers'
//! loop: each patient taken is worked on by the part's `Round` under the patient's tree lane, with the indexer's
//! `Parts` held only for the round.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::{TreeLane, Trees};
use crate::embed::Embedder;
use crate::store::Store;

/// What the background parts need of the indexer; held weakly by their workers.
pub(super) struct Parts {
    pub trees: Arc<Trees>,
    pub store: Arc<Store>,
    pub embedder: Embedder,
    pub halt_after: Duration,
}

/// One patient's round of a background part, run under the patient's tree lane; it handles its own failures.
pub(super) trait Round: Sync {
    fn round(&self, parts: &Parts, patient: &str, lane: &TreeLane) -> impl Future<Output = ()> + Send;
}

#[derive(Default)]
pub(super) struct PatientQueue {
    state: Mutex<State>,
    /// A patient was queued.
    work: tokio::sync::Notify,
    /// The queue ran empty with nothing in hand.
    idle: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<String>,
    queued: HashSet<String>,
    busy: usize,
    closed: bool,
}

impl PatientQueue {
    /// Queues the patient unless it is queued already (or the queue is closed). Never waits.
    pub fn request(&self, patient: &str) {
        let mut q = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !q.closed && q.queued.insert(patient.to_string()) {
            q.waiting.push_back(patient.to_string());
            self.work.notify_one();
        }
    }

    /// Patients queued or in hand.
    pub fn pending(&self) -> usize {
        let q = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        q.waiting.len() + q.busy
    }

    /// Waits until nothing is queued or in hand.
    pub async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.pending() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// The next patient, taken in hand (waits for one); call `done` when its round is over. A patient asked for
    /// again while in hand is queued again, so what changed meanwhile gets a round of its own. `None` once closed.
    pub async fn next(&self) -> Option<String> {
        loop {
            let work = self.work.notified();
            tokio::pin!(work);
            work.as_mut().enable();
            {
                let mut q = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if q.closed {
                    return None;
                }
                if let Some(p) = q.waiting.pop_front() {
                    q.queued.remove(&p);
                    q.busy += 1;
                    return Some(p);
                }
            }
            work.await;
        }
    }

    /// A worker: takes patients until the queue is closed, each worked on by `round` under its tree lane with the
    /// indexer's parts, which it holds only during the round (gone, the worker ends).
    pub async fn work(&self, round: &impl Round, parts: &Weak<Parts>) {
        while let Some(patient) = self.next().await {
            let Some(parts) = parts.upgrade() else {
                self.done();
                return;
            };
            let lane = parts.trees.lane(&patient);
            round.round(&parts, &patient, &lane).await;
            parts.trees.release(&patient, lane);
            self.done();
        }
    }

    /// Ends the workers (each returns from `next` once its round in hand is over) and drops what is queued.
    pub fn close(&self) {
        let mut q = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        q.closed = true;
        q.waiting.clear();
        q.queued.clear();
        self.work.notify_waiters();
        if q.busy == 0 {
            self.idle.notify_waiters();
        }
    }

    /// A patient taken by `next` is finished with.
    pub fn done(&self) {
        let mut q = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        q.busy -= 1;
        if q.waiting.is_empty() && q.busy == 0 {
            self.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_patient_asked_for_twice_is_one_round_and_settled_waits_for_the_round() {
        let q = Arc::new(PatientQueue::default());
        q.request("a");
        q.request("b");
        q.request("a");
        assert_eq!(q.pending(), 2);
        assert_eq!(q.next().await.as_deref(), Some("a"));
        // Asked for again while in hand: queued again.
        q.request("a");
        assert_eq!(q.pending(), 3);
        let waiter = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.settled().await }
        });
        q.done();
        assert_eq!(q.next().await.as_deref(), Some("b"));
        q.done();
        assert_eq!(q.next().await.as_deref(), Some("a"));
        assert!(!waiter.is_finished(), "a patient is still in hand");
        q.done();
        tokio::time::timeout(std::time::Duration::from_secs(30), waiter).await.unwrap().unwrap();
        assert_eq!(q.pending(), 0);
    }

    #[tokio::test]
    async fn closing_ends_a_waiting_worker_and_drops_the_queue() {
        let q = Arc::new(PatientQueue::default());
        let worker = tokio::spawn({
            let q = Arc::clone(&q);
            async move { q.next().await }
        });
        // Waiting already or not yet, the worker gets no patient once the queue is closed.
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(tokio::time::timeout(std::time::Duration::from_secs(30), worker).await.unwrap().unwrap(), None);
        q.request("a");
        assert_eq!(q.pending(), 0, "a closed queue takes nothing");
        assert_eq!(q.next().await, None);
        q.settled().await;
    }
}
