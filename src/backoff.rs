//! The one backoff: capped exponential delays that give up after a total time. Used by every retry loop that
//! waits on something outside the process (Kafka admin, commits and transactions, the producer queue, the Schema
//! Registry, the vector store), so every outage is ridden out the same way and ends the same way: the caller
//! halts without committing once failures have lasted `halt_after`.
//!
//! Pure bookkeeping over `tokio::time::Instant` (so tests run it on tokio's paused clock); the caller sleeps.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::KafkaSettings;

/// Capped exponential backoff that gives up after `halt_after`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    halt_after: Duration,
    next: Duration,
    first_failure: Option<Instant>,
}

impl Backoff {
    /// The Kafka settings' backoff (`kafka.retry_initial_ms`, `retry_max_ms`, `halt_after_ms`).
    pub fn kafka(k: &KafkaSettings) -> Self {
        Self::new(
            Duration::from_millis(k.retry_initial_ms),
            Duration::from_millis(k.retry_max_ms),
            Duration::from_millis(k.halt_after_ms),
        )
    }

    pub fn new(initial: Duration, max: Duration, halt_after: Duration) -> Self {
        Self { initial, max, halt_after, next: initial, first_failure: None }
    }

    /// Records a failure: the delay before the next attempt (never past the give-up time), or `None` when
    /// failures have lasted `halt_after` (the caller halts).
    pub fn failed(&mut self) -> Option<Duration> {
        self.failed_with(None)
    }

    /// Like `failed`, honouring a delay the other side asked for (`Retry-After`) instead of the computed one.
    pub fn failed_with(&mut self, asked: Option<Duration>) -> Option<Duration> {
        let first = *self.first_failure.get_or_insert_with(Instant::now);
        let elapsed = first.elapsed();
        if elapsed >= self.halt_after {
            return None;
        }
        let delay = asked.unwrap_or(self.next).min(self.halt_after - elapsed);
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// Records a success: the next failure starts from the initial delay again.
    pub fn succeeded(&mut self) {
        self.next = self.initial;
        self.first_failure = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_caps_and_gives_up() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(35), Duration::from_millis(50));
        assert_eq!(b.failed(), Some(Duration::from_millis(10)));
        assert_eq!(b.failed(), Some(Duration::from_millis(20)));
        assert_eq!(b.failed(), Some(Duration::from_millis(35)));
        assert_eq!(b.failed(), Some(Duration::from_millis(35)));
        b.succeeded();
        assert_eq!(b.failed(), Some(Duration::from_millis(10)));
        tokio::time::advance(Duration::from_millis(45)).await;
        assert_eq!(b.failed(), Some(Duration::from_millis(5)), "never sleeps past the give-up time");
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(b.failed(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_requested_delay_replaces_the_computed_one() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5), Duration::from_secs(60));
        assert_eq!(b.failed_with(Some(Duration::from_secs(2))), Some(Duration::from_secs(2)));
        assert_eq!(b.failed_with(None), Some(Duration::from_millis(200)));
    }
}
