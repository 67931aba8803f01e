//! The ack core: what may be committed, per partition, and when the worker must stop instead.
//!
//! Contract. The runner completes documents in intake order (one FIFO over all partitions) and, for each one at
//! the front, first hands its outputs to the outputs side and then calls `Acks::finished(partition, offset)`. So
//! a partition's watermark (the next offset to read, `offset + 1`) only ever passes documents that are finished
//! and whose outputs were handed over. The outputs side's `checkpoint` takes the watermarks with `Acks::take` only
//! after everything handed to it is durable (delivered, or in the same transaction), commits them, and reports
//! back with `committed` or `refused`. Together: **an offset is never committed past an unfinished document, nor
//! ahead of its outputs.** The broker-free tests below and in `runner` check exactly that.
//!
//! * `Ledger` — shared with the intake thread (its rebalance callbacks): the assigned partitions and the highest
//!   offset this process committed per partition (behind the lag gauge; librdkafka's own committed offset misses
//!   transactional commits). Commits never move backwards.
//! * `Acks` — owned by the runner: pending watermarks, the merge-back of a commit the group refused (kept for the
//!   partitions still assigned, so a finished partition is committed at the next tick even with no new record),
//!   and the dead-letter guard (`kafka.dead_letters`).
//!
//! No I/O, no metrics, no clock: pure bookkeeping.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::DeadLetterLimit;
use crate::error::{ErrorCode, RunError};
use crate::model::Partition;

/// Assigned partitions and committed offsets, shared between the runner and the intake thread.
#[derive(Debug, Default)]
pub struct Ledger {
    inner: Mutex<LedgerInner>,
}

#[derive(Debug, Default)]
struct LedgerInner {
    assigned: BTreeSet<Partition>,
    committed: HashMap<Partition, i64>,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, LedgerInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds partitions to the assignment; returns how many are assigned now.
    pub fn assign(&self, partitions: &[Partition]) -> usize {
        let mut l = self.lock();
        l.assigned.extend(partitions.iter().cloned());
        l.assigned.len()
    }

    /// Removes partitions (revoked or lost); returns how many stay assigned. Their committed offsets are kept:
    /// a partition that comes back is never committed below what this process committed.
    pub fn revoke(&self, partitions: &[Partition]) -> usize {
        let mut l = self.lock();
        for p in partitions {
            l.assigned.remove(p);
        }
        l.assigned.len()
    }

    pub fn is_assigned(&self, p: &Partition) -> bool {
        self.lock().assigned.contains(p)
    }

    pub fn assigned(&self) -> Vec<Partition> {
        self.lock().assigned.iter().cloned().collect()
    }

    /// The offset this process last committed for `p`.
    pub fn committed(&self, p: &Partition) -> Option<i64> {
        self.lock().committed.get(p).copied()
    }

    fn record_committed(&self, p: &Partition, offset: i64) {
        let mut l = self.lock();
        let c = l.committed.entry(p.clone()).or_insert(offset);
        *c = (*c).max(offset);
    }
}

/// Watermarks taken for one commit: (partition, next offset to read).
pub type Batch = Vec<(Partition, i64)>;

/// The runner's side of the ack core.
#[derive(Debug)]
pub struct Acks {
    ledger: Arc<Ledger>,
    /// Next offset to commit per partition, for finished documents not yet committed.
    pending: HashMap<Partition, i64>,
    guard: Option<DeadLetterGuard>,
}

impl Acks {
    /// `limit`: halt when too many events are dead-lettered (Kafka mode); `None` never halts for that.
    pub fn new(ledger: Arc<Ledger>, limit: Option<&DeadLetterLimit>) -> Self {
        Acks { ledger, pending: HashMap::new(), guard: limit.map(DeadLetterGuard::new) }
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The document at `offset` of `p` is finished and its outputs (or dead letter) handed to the outputs side.
    /// Called in intake order, so every earlier offset of `p` is finished too.
    pub fn finished(&mut self, p: Partition, offset: i64) {
        let w = self.pending.entry(p).or_insert(offset + 1);
        *w = (*w).max(offset + 1);
    }

    /// Records one outcome with the dead-letter guard: `Err` (`dead_letter_limit`) when the limit is exceeded.
    pub fn outcome(&mut self, dead: bool) -> Result<(), RunError> {
        self.guard.as_mut().map_or(Ok(()), |g| g.record(dead))
    }

    /// Whether any watermark waits for a commit.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes the watermarks that may be committed now: partitions still assigned, above what was committed.
    /// Watermarks of partitions no longer assigned are dropped (their next owner redelivers from its commit).
    pub fn take(&mut self) -> Batch {
        let mut batch: Batch = self
            .pending
            .drain()
            .filter(|(p, offset)| self.ledger.is_assigned(p) && self.ledger.committed(p).is_none_or(|c| c < *offset))
            .collect();
        batch.sort();
        batch
    }

    /// The batch was committed.
    pub fn committed(&mut self, batch: &Batch) {
        for (p, offset) in batch {
            self.ledger.record_committed(p, *offset);
        }
    }

    /// The group refused the commit (a rebalance): the watermarks go back, merged with newer ones, and are tried
    /// again at the next checkpoint for the partitions still assigned then.
    pub fn refused(&mut self, batch: Batch) {
        for (p, offset) in batch {
            let w = self.pending.entry(p).or_insert(offset);
            *w = (*w).max(offset);
        }
    }
}

/// Halts the worker when too many events are dead-lettered (`kafka.dead_letters`): a ratio over a window of
/// outcomes, or a run of consecutive dead letters.
#[derive(Debug)]
pub struct DeadLetterGuard {
    limit: DeadLetterLimit,
    window: VecDeque<bool>,
    dead_in_window: usize,
    consecutive: u64,
}

impl DeadLetterGuard {
    pub fn new(limit: &DeadLetterLimit) -> Self {
        Self { limit: limit.clone(), window: VecDeque::new(), dead_in_window: 0, consecutive: 0 }
    }

    /// Records one outcome; `Err` (`dead_letter_limit`, with a PHI-free reason) when the limit is exceeded.
    pub fn record(&mut self, dead: bool) -> Result<(), RunError> {
        self.window.push_back(dead);
        self.dead_in_window += usize::from(dead);
        if self.window.len() > self.limit.window && self.window.pop_front() == Some(true) {
            self.dead_in_window -= 1;
        }
        self.consecutive = if dead { self.consecutive + 1 } else { 0 };
        if self.consecutive >= self.limit.max_consecutive {
            let why = format!("{} events in a row were dead-lettered", self.consecutive);
            return Err(RunError::halt(ErrorCode::DeadLetterLimit, why));
        }
        let ratio = self.dead_in_window as f64 / self.window.len() as f64;
        if self.window.len() >= self.limit.window && ratio > self.limit.max_ratio {
            let why = format!(
                "{} of the last {} events were dead-lettered (limit {:.0}%)",
                self.dead_in_window,
                self.window.len(),
                self.limit.max_ratio * 100.0
            );
            return Err(RunError::halt(ErrorCode::DeadLetterLimit, why));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: i32) -> Partition {
        (Arc::from("notes"), n)
    }

    fn guard(window: usize, max_ratio: f64, max_consecutive: u64) -> DeadLetterGuard {
        DeadLetterGuard::new(&DeadLetterLimit { window, max_ratio, max_consecutive })
    }

    fn acks(assigned: &[i32]) -> Acks {
        let ledger = Arc::new(Ledger::default());
        ledger.assign(&assigned.iter().map(|n| p(*n)).collect::<Vec<_>>());
        Acks::new(ledger, None)
    }

    #[test]
    fn watermark_is_next_offset_and_never_moves_back() {
        let mut a = acks(&[0, 1]);
        a.finished(p(0), 4);
        a.finished(p(0), 7);
        a.finished(p(1), 2);
        assert_eq!(a.take(), vec![(p(0), 8), (p(1), 3)]);
        assert!(!a.has_pending());
    }

    #[test]
    fn only_assigned_partitions_above_the_last_commit_are_taken() {
        let mut a = acks(&[0]);
        a.finished(p(0), 9);
        a.finished(p(1), 9);
        let batch = a.take();
        assert_eq!(batch, vec![(p(0), 10)], "partition 1 is not ours");
        a.committed(&batch);
        assert_eq!(a.ledger().committed(&p(0)), Some(10));
        // A replayed (lower or equal) watermark is not committed again.
        a.finished(p(0), 9);
        assert!(a.take().is_empty());
        a.ledger().record_committed(&p(0), 5);
        assert_eq!(a.ledger().committed(&p(0)), Some(10), "the ledger never moves backwards");
    }

    #[test]
    fn a_refused_commit_is_merged_back_and_retried_while_assigned() {
        let mut a = acks(&[0, 1]);
        a.finished(p(0), 3);
        a.finished(p(1), 5);
        let batch = a.take();
        a.finished(p(0), 6); // a newer watermark arrived meanwhile
        a.refused(batch);
        a.ledger().revoke(&[p(1)]);
        assert_eq!(a.take(), vec![(p(0), 7)], "newer watermark kept; the revoked partition dropped");
    }

    #[test]
    fn guard_halts_with_its_code() {
        let ledger = Arc::new(Ledger::default());
        let mut a = Acks::new(ledger, Some(&DeadLetterLimit { window: 100, max_ratio: 1.0, max_consecutive: 2 }));
        assert!(a.outcome(true).is_ok());
        let e = a.outcome(true).unwrap_err();
        assert_eq!(e.code(), ErrorCode::DeadLetterLimit);
        let mut none = acks(&[]);
        assert!((0..1000).all(|_| none.outcome(true).is_ok()), "no limit in file mode");
    }

    #[test]
    fn consecutive_dead_letters_halt() {
        let mut g = guard(100, 1.0, 3);
        assert!(g.record(true).is_ok());
        assert!(g.record(true).is_ok());
        assert!(g.record(false).is_ok());
        assert!(g.record(true).is_ok());
        assert!(g.record(true).is_ok());
        assert!(g.record(true).unwrap_err().to_string().contains("3 events in a row"));
    }

    #[test]
    fn ratio_over_a_full_window_halts() {
        let mut g = guard(10, 0.5, 1000);
        // Alternating: 50 % — at the limit, not over it.
        for i in 0..40 {
            assert!(g.record(i % 2 == 0).is_ok(), "event {i}");
        }
        // A few more dead letters in a row push the window over 50 %.
        let err = (0..3).find_map(|_| g.record(true).err()).expect("limit reached").to_string();
        assert!(err.contains("of the last 10"), "{err}");
    }

    #[test]
    fn a_short_burst_below_the_window_does_not_halt() {
        let mut g = guard(200, 0.5, 100);
        for _ in 0..50 {
            assert!(g.record(true).is_ok());
        }
    }
}
