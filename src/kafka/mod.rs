//! Kafka mode: consume `DocumentReference` events, publish results, commit only what is finished.
//!
//! * `consumer` — a poll thread owns the intake: it forwards records in order over a bounded channel, pauses the
//!   assigned partitions when the in-flight budget stays exhausted (while still polling, so the worker stays in
//!   the group), and on a revocation asks the runner to drain and commit before the partitions are released.
//! * `output` — the producer (idempotent, or transactional with `kafka.transactions`), Avro encoding, dead
//!   letters, and the commit step: wait until every record handed to the producer is delivered, then commit the
//!   per-partition watermarks (or send them to the transaction and commit it).
//! * `run` — the runner loop: the same in-order in-flight queue as file mode, so a partition's watermark never
//!   passes a document whose outputs are not delivered.
//! * `admin` — topic creation; `registry` — Schema Registry registration (`kafka.schema_registry.url`);
//!   `produce` — `clinstream produce` (NDJSON events onto a topic).
//!
//! See docs/kafka.md for the guarantees and the settings.

pub mod admin;
pub mod avro;
pub mod consumer;
pub mod output;
pub mod produce;
pub mod registry;
pub mod run;

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;

use crate::config::KafkaSettings;

/// Client settings shared by the consumer, the producer and the admin client: bootstrap servers, then the
/// `kafka.common` passthrough, then the role's own map.
pub fn client_config(k: &KafkaSettings, role: &std::collections::BTreeMap<String, String>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &k.bootstrap_servers);
    // Quiet librdkafka's own logging of connection churn; errors still arrive through the error callback.
    c.set("log.connection.close", "false");
    for (key, value) in k.common.iter().chain(role.iter()) {
        c.set(key, value);
    }
    c
}

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
    pub fn new(k: &KafkaSettings) -> Self {
        Self::with(
            Duration::from_millis(k.retry_initial_ms),
            Duration::from_millis(k.retry_max_ms),
            Duration::from_millis(k.halt_after_ms),
        )
    }

    pub fn with(initial: Duration, max: Duration, halt_after: Duration) -> Self {
        Self { initial, max, halt_after, next: initial, first_failure: None }
    }

    /// Records a failure: the delay before the next attempt, or `None` when failures have lasted past
    /// `halt_after` (the caller halts).
    pub fn failed(&mut self) -> Option<Duration> {
        let first = *self.first_failure.get_or_insert_with(Instant::now);
        if first.elapsed() >= self.halt_after {
            return None;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// Records a success: the next failure starts from the initial delay again.
    pub fn succeeded(&mut self) {
        self.next = self.initial;
        self.first_failure = None;
    }

    /// How long failures have been going on.
    pub fn failing_for(&self) -> Duration {
        self.first_failure.map(|t| t.elapsed()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_gives_up() {
        let mut b = Backoff::with(Duration::from_millis(10), Duration::from_millis(35), Duration::from_millis(50));
        assert_eq!(b.failed(), Some(Duration::from_millis(10)));
        assert_eq!(b.failed(), Some(Duration::from_millis(20)));
        assert_eq!(b.failed(), Some(Duration::from_millis(35)));
        assert_eq!(b.failed(), Some(Duration::from_millis(35)));
        b.succeeded();
        assert_eq!(b.failed(), Some(Duration::from_millis(10)));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(b.failed(), None);
    }
}
