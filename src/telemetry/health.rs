//! The process's health flags, set by the parts that know and read by the HTTP endpoints (`crate::http`):
//! readiness (start-up done) and whether the vector store answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Shared readiness flag (start-up done), combined with the store's state when read, and with any gates a part
/// added (`gated`: the query service's identity-provider keys).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    gates: Vec<Arc<AtomicBool>>,
}

/// False while the indexer retries an unavailable vector store (one store per process).
static STORE_REACHABLE: AtomicBool = AtomicBool::new(true);

/// Called by the indexer: false when a store call failed transiently, true when one succeeded.
pub fn set_store_reachable(reachable: bool) {
    STORE_REACHABLE.store(reachable, Ordering::SeqCst);
}

/// Whether the last store call answered.
pub fn store_reachable() -> bool {
    STORE_REACHABLE.load(Ordering::SeqCst)
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// The same readiness, which also waits for `gate` (this copy only; `set` still reaches every copy).
    pub fn gated(&self, gate: Arc<AtomicBool>) -> Readiness {
        let mut r = self.clone();
        r.gates.push(gate);
        r
    }

    /// Ready: start-up done, the store answering, every gate open.
    pub fn get(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
            && STORE_REACHABLE.load(Ordering::SeqCst)
            && self.gates.iter().all(|g| g.load(Ordering::SeqCst))
    }
}
