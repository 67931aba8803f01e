//! The documents' CPU pool: the CPU-bound steps of every document in flight (text stages, chunking, points) run
//! here, oldest document first.
//!
//! Why not tokio's blocking pool: it runs tasks first come, first served, so documents admitted together go through
//! each step together — all their text stages, then all their first chunking steps, and so on — and reach the store
//! together. The store's writer then waits while they are worked on, and the pool waits while the writer applies
//! them (docs/benchmarks.md, "Where the cores' idle quarter goes"). Here each step carries its document's admission
//! number (`enter`, a task-local set by the document's task), and a free thread takes the step of the oldest
//! document waiting, so documents leave the CPU steps one after another, as they came in.
//!
//! `pipeline.workers` threads (`clinstream-cpu`), started with the worker's runtime (`start`); a step outside a
//! document's task (the lab's tools, tests) takes the next number. A step that panics answers an error instead of
//! a value; the thread goes on.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};

tokio::task_local! {
    static DOCUMENT: u64;
}

/// Admission numbers: documents in order of arrival (and steps without a document after them).
static NEXT: AtomicU64 = AtomicU64::new(0);
static POOL: OnceLock<Pool> = OnceLock::new();

struct Pool {
    queue: Mutex<BinaryHeap<Step>>,
    ready: Condvar,
}

struct Step {
    /// The document's admission number, then the step's own (the order steps of one document were asked in).
    key: (u64, u64),
    run: Box<dyn FnOnce() + Send>,
}

impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl Eq for Step {}
impl PartialOrd for Step {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Step {
    /// The heap's top is the smallest key: the oldest document's earliest step.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.key.cmp(&self.key)
    }
}

/// Starts the pool with `threads` threads (once per process; later calls keep the first pool).
pub fn start(threads: usize) {
    let mut first = false;
    let pool: &'static Pool = POOL.get_or_init(|| {
        first = true;
        Pool { queue: Mutex::new(BinaryHeap::new()), ready: Condvar::new() }
    });
    if first {
        for i in 0..threads.max(1) {
            std::thread::Builder::new()
                .name(format!("clinstream-cpu-{i}"))
                .spawn(move || work(pool))
                .expect("starting a CPU pool thread");
        }
    }
}

fn pool() -> &'static Pool {
    if let Some(pool) = POOL.get() {
        return pool;
    }
    // Not started with the worker's runtime (the lab's tools, tests): one thread per core. Asked once: the core
    // count reads the cgroup's files each time.
    start(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    POOL.get().expect("started above")
}

fn work(pool: &'static Pool) {
    loop {
        let step = {
            let mut queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(step) = queue.pop() {
                    break step;
                }
                queue = pool.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        (step.run)();
    }
}

/// Runs `f` as one document's work, its CPU steps ordered by this document's admission (call it when the
/// document arrives, in arrival order).
pub fn enter<F: std::future::Future>(f: F) -> tokio::task::futures::TaskLocalFuture<u64, F> {
    DOCUMENT.scope(NEXT.fetch_add(1, Ordering::Relaxed), f)
}

/// A step panicked (its payload is dropped: it may hold note text).
#[derive(Debug)]
pub struct Panicked;

/// Runs a CPU-bound step on the pool, before the steps of documents that arrived later.
pub async fn run<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Panicked> {
    static STEP: AtomicU64 = AtomicU64::new(0);
    let document = DOCUMENT.try_with(|d| *d).unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let run = Box::new(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| Panicked));
    });
    let pool = pool();
    let key = (document, STEP.fetch_add(1, Ordering::Relaxed));
    pool.queue.lock().unwrap_or_else(|e| e.into_inner()).push(Step { key, run });
    pool.ready.notify_one();
    rx.await.unwrap_or(Err(Panicked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_documents_step_comes_first() {
        let mut heap = BinaryHeap::new();
        for key in [(3, 0), (1, 5), (2, 1), (1, 2)] {
            heap.push(Step { key, run: Box::new(|| {}) });
        }
        let order: Vec<_> = std::iter::from_fn(|| heap.pop().map(|s| s.key)).collect();
        assert_eq!(order, [(1, 2), (1, 5), (2, 1), (3, 0)]);
    }

    #[tokio::test]
    async fn a_step_answers_its_value_and_a_panic_is_an_error() {
        assert_eq!(enter(run(|| 2 + 2)).await.unwrap(), 4);
        assert!(run(|| -> u8 { panic!("a step failed") }).await.is_err());
        // The thread that ran the panicking step goes on.
        assert_eq!(run(|| 7).await.unwrap(), 7);
    }
}
