//! Group commit: the documents' writes to the store go through writer tasks ("lanes"), which apply what is
//! waiting as groups — every point of a group upserted (in requests of `store.upsert_batch`), then one delete of
//! the older versions of all its documents — and answer each document when its group is applied. A server store
//! has one lane with up to `store.group_concurrency` groups at once; the embedded store one lane per shard
//! (`store.shards`), each applying one group at a time on its shard's writer thread, a document always in the
//! lane of its shard (`embedded::shard_of`).
//!
//! Why: a Qdrant shard applies updates one at a time (the embedded engine under its update lock, a server through
//! its per-shard update queue with `wait=true`), and each update has a fixed cost besides its points. With one
//! upsert and one delete per document the store was the serial step of the worker (documents queued in the store
//! stage; docs/benchmarks.md). The group grows with the queue: one document alone is written at once; many
//! waiting are written together.
//!
//! Per document the order is kept: its new points are applied before its other points are removed (a search
//! always finds one version; the delete keeps exactly the points just written, so a rewrite of the same version
//! with fewer chunks leaves none behind), and two writes of one document are never applied at once (a group ends
//! before a document it already holds or that a running group holds, and nothing behind it starts until that
//! group is done), so they apply in the order they were asked. A write with no points removes the document
//! (`entered-in-error`, a replaced document). `store.group_points = 0` writes every document alone (upsert, then
//! delete), without the tasks.
//!
//! Failure: a group's error is every one of its documents' error; each document's own retry (`index::retry_store`)
//! asks again, so a transient failure is ridden out as before.
//!
//! Lifetime: the lanes hold the store weakly (a group holds it while it is applied), so the store closes — its
//! shards' writer threads joined, the embedded engine's directory released — when the last handle to it goes,
//! not whenever the lane tasks next run.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::{Point, Store, StoreError};
use crate::telemetry::metrics::metrics;

/// Jobs waiting for the writer task at most (the runner's in-flight budget bounds them long before).
const QUEUE: usize = 4096;

/// A handle to the store's writer (clonable; the tasks end when the last handle goes).
#[derive(Clone)]
pub struct Writer {
    store: Arc<Store>,
    /// One sender per lane; empty when grouping is off (`store.group_points = 0`).
    lanes: Vec<mpsc::Sender<Job>>,
}

/// One document version's write: its points (every other point of the document goes).
pub struct Job {
    pub doc_id: String,
    pub points: Vec<Point>,
    reply: Option<oneshot::Sender<Result<(), StoreError>>>,
}

impl Writer {
    /// Starts the writer task on the current runtime (grouping up to `group_points` points; 0 = no grouping).
    /// `concurrency` groups are applied at once at most (at least one).
    /// The embedded store gets one lane per shard, one group at a time each (its shard applies updates one at a
    /// time anyway); a server one lane with `concurrency` groups.
    pub fn start(store: Arc<Store>, group_points: usize, concurrency: usize) -> Writer {
        if group_points == 0 {
            return Writer { store, lanes: Vec::new() };
        }
        let (lanes, concurrency) = match &*store {
            Store::Embedded(e) => (e.shard_count(), 1),
            Store::Server(_) => (1, concurrency.max(1)),
        };
        let lanes = (0..lanes)
            .map(|lane| {
                let (tx, rx) = mpsc::channel(QUEUE);
                tokio::spawn(run(Arc::downgrade(&store), lane, rx, group_points, concurrency));
                tx
            })
            .collect();
        Writer { store, lanes }
    }

    /// Writes a document version's points and removes the document's other points (older versions); returns when
    /// both are applied.
    pub async fn write(&self, doc_id: &str, points: Vec<Point>) -> Result<(), StoreError> {
        let lane = match &*self.store {
            Store::Embedded(e) => super::embedded::shard_of(doc_id, e.shard_count()),
            Store::Server(_) => 0,
        };
        let Some(tx) = self.lanes.get(lane) else {
            let keep: Vec<uuid::Uuid> = points.iter().map(|p| p.id).collect();
            if !points.is_empty() {
                self.store.upsert(points).await?;
            }
            return self.store.delete_except(&[doc_id], &keep).await;
        };
        let (reply, answer) = oneshot::channel();
        let job = Job { doc_id: doc_id.to_string(), points, reply: Some(reply) };
        let stopped = || StoreError::fatal("the store writer has stopped");
        tx.send(job).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(store: Weak<Store>, lane: usize, mut rx: mpsc::Receiver<Job>, group_points: usize, concurrency: usize) {
    let mut queue: VecDeque<Job> = VecDeque::new();
    let mut running: JoinSet<Vec<Job>> = JoinSet::new();
    // Documents of the running groups.
    let mut busy: HashSet<String> = HashSet::new();
    let mut open = true;
    loop {
        while open && queue.len() < QUEUE {
            match rx.try_recv() {
                Ok(job) => queue.push_back(job),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        while running.len() < concurrency && queue.front().is_some_and(|j| !busy.contains(&j.doc_id)) {
            let mut group = next_group(&mut queue, group_points, &busy);
            busy.extend(group.iter().map(|j| j.doc_id.clone()));
            let store = store.upgrade();
            running.spawn(async move {
                let clock = std::time::Instant::now();
                let result = match store {
                    Some(store) => apply(&store, lane, &mut group).await,
                    None => Err(StoreError::fatal("the store is closed")),
                };
                let m = metrics();
                m.store_write_duration.observe(clock.elapsed().as_secs_f64());
                m.store_group_documents.observe(group.len() as f64);
                for job in &mut group {
                    if let Some(reply) = job.reply.take() {
                        let _ = reply.send(result.clone());
                    }
                }
                group
            });
        }
        if !open && queue.is_empty() && running.is_empty() {
            return;
        }
        tokio::select! {
            done = running.join_next(), if !running.is_empty() => {
                // A group that panicked dropped its replies: its documents see the writer as stopped.
                if let Some(Ok(group)) = done {
                    for job in &group {
                        busy.remove(&job.doc_id);
                    }
                } else {
                    busy.clear();
                }
            }
            job = rx.recv(), if open => match job {
                Some(job) => queue.push_back(job),
                None => open = false,
            },
        }
    }
}

/// The next group from the front of the queue, in order: the first job, then the following ones while their
/// points fit in `group_points` and their document is neither in the group nor `busy` (in a running group). The
/// caller checks that the first job's document is not busy. Pure (tested below).
pub fn next_group(queue: &mut VecDeque<Job>, group_points: usize, busy: &HashSet<String>) -> Vec<Job> {
    let mut group = Vec::new();
    let mut docs: HashSet<String> = HashSet::new();
    let mut points = 0usize;
    while let Some(job) = queue.front() {
        let fits = group.is_empty()
            || (points + job.points.len() <= group_points
                && !docs.contains(&job.doc_id)
                && !busy.contains(&job.doc_id));
        if !fits {
            break;
        }
        let job = queue.pop_front().expect("front exists");
        points += job.points.len();
        docs.insert(job.doc_id.clone());
        group.push(job);
    }
    group
}

/// Upserts every point of the group, then removes its documents' other points (older versions, and chunks of
/// the same version that the new plan no longer has).
async fn apply(store: &Store, lane: usize, group: &mut [Job]) -> Result<(), StoreError> {
    let points: Vec<Point> = group.iter_mut().flat_map(|j| std::mem::take(&mut j.points)).collect();
    let keep: Vec<uuid::Uuid> = points.iter().map(|p| p.id).collect();
    let doc_ids: Vec<&str> = group.iter().map(|j| j.doc_id.as_str()).collect();
    if let Store::Embedded(e) = store {
        return e.write_group(lane, points, &doc_ids, &keep).await;
    }
    if !points.is_empty() {
        store.upsert(points).await?;
    }
    store.delete_except(&doc_ids, &keep).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(doc: &str, points: usize) -> Job {
        let point = || Point {
            id: uuid::Uuid::nil(),
            dense: Vec::new(),
            sparse: Default::default(),
            payload: Default::default(),
        };
        Job { doc_id: doc.into(), points: (0..points).map(|_| point()).collect(), reply: None }
    }

    fn busy(docs: &[&str]) -> HashSet<String> {
        docs.iter().map(|d| d.to_string()).collect()
    }

    fn ids(group: &[Job]) -> Vec<&str> {
        group.iter().map(|j| j.doc_id.as_str()).collect()
    }

    #[test]
    fn a_group_takes_jobs_in_order_up_to_the_point_budget() {
        let none = busy(&[]);
        let mut q: VecDeque<Job> = [job("a", 40), job("b", 40), job("c", 40), job("d", 10)].into();
        assert_eq!(ids(&next_group(&mut q, 100, &none)), ["a", "b"]);
        // "d" would fit, but taking it past "c" would reorder the queue.
        assert_eq!(ids(&next_group(&mut q, 100, &none)), ["c", "d"]);
        assert!(q.is_empty());
        assert!(next_group(&mut q, 100, &none).is_empty());
    }

    #[test]
    fn a_job_larger_than_the_budget_goes_alone_and_empty_jobs_ride_along() {
        let none = busy(&[]);
        let mut q: VecDeque<Job> = [job("big", 500), job("e", 0), job("f", 0), job("g", 1)].into();
        assert_eq!(ids(&next_group(&mut q, 100, &none)), ["big"]);
        assert_eq!(ids(&next_group(&mut q, 100, &none)), ["e", "f", "g"]);
    }

    #[test]
    fn two_writes_of_one_document_never_share_a_group() {
        let none = busy(&[]);
        let mut q: VecDeque<Job> = [job("a", 1), job("b", 1), job("a", 1), job("c", 1)].into();
        assert_eq!(ids(&next_group(&mut q, 100, &none)), ["a", "b"]);
        assert_eq!(ids(&next_group(&mut q, 100, &none)), ["a", "c"]);
    }

    #[test]
    fn a_group_ends_before_a_document_that_a_running_group_holds() {
        let mut q: VecDeque<Job> = [job("a", 1), job("b", 1), job("c", 1)].into();
        assert_eq!(ids(&next_group(&mut q, 100, &busy(&["b"]))), ["a"]);
        assert_eq!(ids(&next_group(&mut q, 100, &busy(&[]))), ["b", "c"]);
    }
}
