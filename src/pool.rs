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
//!
//! The threads run `pipeline.workers_nice` steps below the rest of the worker (Linux). The pool starts documents;
//! the store's writers, the model thread and the async runtime finish them, and one writer per shard is a serial
//! path: where the pool took its share of a busy core from a writer, the writer fell behind, the in-flight budget
//! filled, and the pool then waited in turn. Below them, the pool takes what the finishing side leaves
//! (docs/benchmarks.md, "Where the cores' idle quarter goes").

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

/// Starts the pool with `threads` threads `nice` steps below the caller's priority (once per process; later calls
/// keep the first pool).
pub fn start(threads: usize, nice: i32) {
    let mut first = false;
    let pool: &'static Pool = POOL.get_or_init(|| {
        first = true;
        Pool::default()
    });
    if first {
        spawn(pool, threads, nice);
    }
}

impl Default for Pool {
    fn default() -> Self {
        Pool { queue: Mutex::new(BinaryHeap::new()), ready: Condvar::new() }
    }
}

fn spawn(pool: &'static Pool, threads: usize, nice: i32) {
    for i in 0..threads.max(1) {
        std::thread::Builder::new()
            .name(format!("clinstream-cpu-{i}"))
            .spawn(move || {
                lower_priority(nice);
                work(pool)
            })
            .expect("starting a CPU pool thread");
    }
}

/// Lowers the calling thread's scheduling priority by `nice` steps (Linux: a thread's nice value, inherited by the
/// threads it starts); elsewhere, or at 0, nothing. A thread cannot raise its priority back without privilege, so
/// it is called on a thread of its own (the pool's, a store maintenance's).
pub(crate) fn lower_priority(nice: i32) {
    #[cfg(target_os = "linux")]
    if nice > 0 {
        // SAFETY: plain system calls on the calling thread's id; no memory is shared with them.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            let now = libc::getpriority(libc::PRIO_PROCESS as _, tid);
            if libc::setpriority(libc::PRIO_PROCESS as _, tid, (now + nice).min(19)) != 0 {
                tracing::debug!("Could not lower a thread's priority.");
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// Lowers the calling thread's priority by `nice` steps and keeps it, and every thread it starts, from setting
/// itself back above that. A process that may raise priority (root, or `CAP_SYS_NICE`) lets any of its threads do
/// so, and the store engine's graph builders set themselves to nice 9 whatever they inherit (thread-priority's
/// "low" priority); so the thread, on Linux, also gives up that capability — its own, as Linux keeps
/// capabilities per thread: the rest of the worker keeps it. Without the capability, a thread can still lower its
/// priority further, never raise it. For a thread that runs one task and ends (a store maintenance).
pub(crate) fn lower_priority_for_good(nice: i32) {
    lower_priority(nice);
    #[cfg(target_os = "linux")]
    if nice > 0 && drop_sys_nice().is_err() {
        tracing::debug!("Could not give up a thread's CAP_SYS_NICE.");
    }
}

/// Puts the calling thread, and every thread it starts from then on, in Linux's idle scheduling class
/// (`SCHED_IDLE`): it runs on a core only when no thread of an ordinary class wants it there, and a thread of the
/// worker that wakes takes the core from it at once. Its nice value no longer counts, and the threads it starts
/// stay in the class even where they set a nice value of their own (the store engine's graph builders keep the
/// class they inherit). A thread cannot leave the class without privilege, so it is called on a thread that runs
/// one task and ends (a store maintenance's optimisation); elsewhere than Linux, nothing.
pub(crate) fn idle_for_good() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain system call on the calling thread (`pid` 0) with a parameter it only reads.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            tracing::debug!("Could not move a thread to the idle scheduling class.");
        }
    }
}

/// Clears `CAP_SYS_NICE` from the calling thread's effective and permitted capabilities (capget/capset on the
/// thread itself: `pid` 0); nothing to do when it does not hold it.
#[cfg(target_os = "linux")]
fn drop_sys_nice() -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const SYS_NICE: u32 = 1 << 23;
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data::default(); 2];
    // SAFETY: the kernel writes two `Data` records (version 3) into `data`, which holds two.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (data[0].effective | data[0].permitted) & SYS_NICE == 0 {
        return Ok(());
    }
    data[0].effective &= !SYS_NICE;
    data[0].permitted &= !SYS_NICE;
    // SAFETY: the same two records, read above, with one bit cleared; applies to the calling thread only.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn pool() -> &'static Pool {
    if let Some(pool) = POOL.get() {
        return pool;
    }
    // Not started with the worker's runtime (the lab's tools, tests): one thread per core, at the caller's
    // priority. Asked once: the core count reads the cgroup's files each time.
    start(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), 0);
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

    #[cfg(target_os = "linux")]
    fn nice() -> i32 {
        // SAFETY: reads the calling thread's nice value.
        unsafe { libc::getpriority(libc::PRIO_PROCESS as _, libc::gettid() as libc::id_t) }
    }

    /// A lowered thread runs below its starter's priority, and so do the threads it starts; the thread that asked
    /// is untouched, and 0 changes nothing.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_and_its_helpers_run_at_a_lower_priority() {
        let mine = nice();
        let (before, same, lowered, helper) = std::thread::spawn(|| {
            let before = nice();
            lower_priority(0);
            let same = nice();
            lower_priority(3);
            (before, same, nice(), std::thread::spawn(nice).join().expect("helper"))
        })
        .join()
        .expect("lowered thread");
        assert_eq!(same, before);
        assert_eq!(lowered, (before + 3).min(19));
        assert_eq!(helper, lowered);
        assert_eq!(nice(), mine);
    }

    /// A thread lowered for good stays there, and so do the threads it starts, even those that set their own
    /// priority as the store engine's graph builders do (thread-priority's low priority: nice 9) in a process that
    /// may raise priority (root, `CAP_SYS_NICE`); the thread that asked keeps its priority.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_lowered_for_good_and_its_helpers_stay_below() {
        fn set_nine() -> i32 {
            // SAFETY: sets the calling thread's nice value, as thread-priority does.
            unsafe { libc::setpriority(libc::PRIO_PROCESS as _, 0, 9) };
            nice()
        }
        let mine = nice();
        // At least nice 10, so that nice 9 would be a step up.
        let steps = (15 - mine).max(1);
        let target = (mine + steps).min(19);
        let (lowered, helper) = std::thread::spawn(move || {
            lower_priority_for_good(steps);
            (nice(), std::thread::spawn(set_nine).join().expect("helper"))
        })
        .join()
        .expect("lowered thread");
        assert_eq!(lowered, target);
        assert_eq!(helper, target, "a helper set itself above the thread that started it");
        assert_eq!(nice(), mine);
    }

    /// A thread moved to the idle class stays there, and so do the threads it starts, even those that set their
    /// own priority as the store engine's graph builders do (thread-priority keeps the class and sets a nice value);
    /// the thread that asked keeps its own class.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_idle_thread_and_its_helpers_stay_idle() {
        fn class() -> i32 {
            // SAFETY: reads the calling thread's scheduling class.
            unsafe { libc::sched_getscheduler(0) }
        }
        fn set_nine() -> i32 {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as thread-priority does on Linux: the class kept, then a nice value.
            unsafe {
                libc::pthread_setschedparam(libc::pthread_self(), class(), &param);
                libc::setpriority(libc::PRIO_PROCESS as _, 0, 9);
            }
            class()
        }
        let mine = class();
        assert_ne!(mine, libc::SCHED_IDLE);
        let (moved, helper) = std::thread::spawn(|| {
            idle_for_good();
            (class(), std::thread::spawn(set_nine).join().expect("helper"))
        })
        .join()
        .expect("idle thread");
        assert_eq!(moved, libc::SCHED_IDLE);
        assert_eq!(helper, libc::SCHED_IDLE, "a helper left the idle class");
        assert_eq!(class(), mine);
    }

    /// The pool's threads run its steps `nice` steps below the thread that started it.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_pools_threads_run_below_the_worker() {
        let pool: &'static Pool = Box::leak(Box::default());
        spawn(pool, 2, 4);
        let (tx, rx) = std::sync::mpsc::channel();
        for key in 0..2 {
            let tx = tx.clone();
            pool.queue.lock().unwrap().push(Step { key: (key, 0), run: Box::new(move || tx.send(nice()).unwrap()) });
            pool.ready.notify_one();
        }
        let seen = [rx.recv().unwrap(), rx.recv().unwrap()];
        assert_eq!(seen, [(nice() + 4).min(19); 2]);
    }

    #[tokio::test]
    async fn a_step_answers_its_value_and_a_panic_is_an_error() {
        assert_eq!(enter(run(|| 2 + 2)).await.unwrap(), 4);
        assert!(run(|| -> u8 { panic!("a step failed") }).await.is_err());
        // The thread that ran the panicking step goes on.
        assert_eq!(run(|| 7).await.unwrap(), 7);
    }
}
