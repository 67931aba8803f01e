//! The Kafka source: one thread polls the consumer and forwards, in order, records and group events to the runner
//! over a bounded channel (`Intake<KafkaRecord>`).
//!
//! * Backpressure: when the channel is full the thread holds records back (in order) and keeps polling; when
//!   records wait for the runner (its in-flight budget full) without a break for `kafka.pause_after_ms` (or the
//!   held records reach `HELD_BYTES`) it pauses the assigned partitions, and resumes them when half of what waited
//!   at the pause is left. A pause is costly — librdkafka drops what it prefetched for a paused partition and a
//!   resumed one fetches again, which took about half a second against the test broker — so the held records are
//!   bounded by their bytes, not by a count a single fetch of small notes overruns.
//!   Polling never stops, so the worker stays in the group (`max.poll.interval.ms`).
//! * Idle backoff: Apache Kafka holds a fetch with nothing to return for `fetch.wait.max.ms`; a broker seen in
//!   librdkafka's statistics answering empty fetches at once (more than `EAGER_EMPTY_FETCHES` a second per broker;
//!   the test broker answers thousands) would be asked without pause while the worker is caught up. Against such
//!   a broker, once every assigned partition has reported its end (`enable.partition.eof`) with no record since,
//!   the partitions are paused for `kafka.idle_backoff_ms` and then resumed; librdkafka's broker thread notices a
//!   resume within a second, so a caught-up worker asks about once a second. A broker that holds empty fetches
//!   never gets this pause.
//! * Revocation: before partitions are released, the rebalance callback (on this thread) hands over what it
//!   holds, sends `Intake::Revoking` behind it and waits — at most `kafka.drain_timeout_ms` — while the runner
//!   finishes every in-flight document and commits. Only then does librdkafka release the partitions, so the
//!   next owner starts exactly after the last finished document.
//! * Offsets are never stored by librdkafka itself (`enable.auto.offset.store=false`, `enable.auto.commit=false`):
//!   the runner stores and commits per-partition watermarks of finished documents.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, Statistics, TopicPartitionList};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Intake, Record};
use crate::ack::Ledger;
use crate::config::Settings;
use crate::error::{ErrorCode, RunError};
use crate::kafka::client_config;
use crate::model::{Origin, Partition};
use crate::telemetry::metrics::metrics;

/// A topic-partition.
pub type Tp = Partition;

/// A consumed record (payload, key, headers and position; the bytes are the event's only copy).
#[derive(Debug)]
pub struct KafkaRecord {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub message: Arc<OwnedMessage>,
    /// Set when the message held a Bundle: this record is one DocumentReference entry of it.
    pub entry: Option<BundleEntry>,
}

/// One DocumentReference entry of a Bundle message: its index, its bytes, and whether it is the message's last
/// (only the last one finishes the offset, so the offset moves after every entry's outputs).
#[derive(Debug)]
pub struct BundleEntry {
    pub index: usize,
    pub payload: Vec<u8>,
    pub last: bool,
}

impl KafkaRecord {
    pub fn payload(&self) -> &[u8] {
        match &self.entry {
            Some(e) => &e.payload,
            None => self.message.payload().unwrap_or_default(),
        }
    }
    pub fn tp(&self) -> Tp {
        (self.topic.clone(), self.partition)
    }
}

impl Record for KafkaRecord {
    fn payload(&self) -> &[u8] {
        KafkaRecord::payload(self)
    }
    fn origin(&self) -> Origin {
        Origin::Kafka {
            topic: self.topic.clone(),
            partition: self.partition,
            offset: self.offset,
            entry: self.entry.as_ref().map(|e| e.index),
        }
    }
    fn position(&self) -> Option<(Partition, i64)> {
        Some((self.tp(), self.offset))
    }
    fn completes_position(&self) -> bool {
        self.entry.as_ref().is_none_or(|e| e.last)
    }
    fn counts_bytes(&self) -> bool {
        true
    }
}

/// What the intake thread sends.
pub type KafkaIntake = Intake<KafkaRecord>;

/// Shared between the intake thread (callbacks) and the runner.
pub struct IntakeContext {
    tx: mpsc::Sender<KafkaIntake>,
    /// Items the channel had no room for, in order, and their bytes (`held_bytes`); only the intake thread touches it.
    held: Mutex<Held>,
    drain_timeout: Duration,
    /// Set before the consumer is closed: the final revocation needs no drain.
    closing: AtomicBool,
    paused: AtomicBool,
    /// librdkafka's cumulative fetch requests and consumed messages at the last statistics, with their time.
    fetch_counts: Mutex<Option<FetchCounts>>,
    /// Set once the broker is seen answering empty fetches at once: the poll thread then backs off while idle.
    eager_broker: AtomicBool,
    /// Set by the rebalance callback: the idle backoff forgets which partitions were at their end.
    assignment_changed: AtomicBool,
    created: Instant,
    /// Assigned partitions and the offsets this process committed (the ack core's shared half): the runner
    /// commits only assigned partitions, and the committed offsets with librdkafka's end offsets give the lag.
    ledger: Arc<Ledger>,
    topic_names: Mutex<Vec<Arc<str>>>,
}

/// Records held back for a full channel beyond these bytes (payloads plus `HELD_RECORD_OVERHEAD` each) pause intake
/// at once: about what librdkafka prefetches for one partition by default (`queued.max.messages.kbytes`), so memory
/// stays bounded for notes of any size while a fetch's worth of small notes never triggers a pause.
const HELD_BYTES: usize = 64 << 20;
/// What one held record costs beside its payload (the record, its message's metadata, the queue's slot).
const HELD_RECORD_OVERHEAD: usize = 256;

#[derive(Default)]
struct Held {
    items: VecDeque<KafkaIntake>,
    bytes: usize,
}

impl Held {
    fn push(&mut self, item: KafkaIntake) {
        self.bytes += held_bytes(&item);
        self.items.push_back(item);
    }
}

fn held_bytes(item: &KafkaIntake) -> usize {
    match item {
        Intake::Record(r) => r.payload().len() + HELD_RECORD_OVERHEAD,
        _ => HELD_RECORD_OVERHEAD,
    }
}

/// Empty fetches a second (per broker asked) above which a broker is taken not to hold empty fetches: Apache Kafka
/// answers at most `1000 / fetch.wait.max.ms` of them (2 at the default 500 ms); the test broker about 2,000.
const EAGER_EMPTY_FETCHES: f64 = 50.0;
#[derive(Clone, Copy)]
struct FetchCounts {
    ts_us: i64,
    fetches: i64,
    messages: i64,
}

impl IntakeContext {
    /// Reads fetch requests and consumed messages from librdkafka's statistics: counts the requests, and marks the
    /// broker eager when it answers empty fetches at once.
    fn watch_fetches(&self, statistics: &Statistics) {
        let per_broker: Vec<i64> =
            statistics.brokers.values().map(|b| b.req.get("Fetch").copied().unwrap_or(0)).collect();
        let now = FetchCounts { ts_us: statistics.ts, fetches: per_broker.iter().sum(), messages: statistics.rxmsgs };
        let mut last = self.fetch_counts.lock().unwrap_or_else(|p| p.into_inner());
        // The first statistics count from the consumer's creation.
        let since_created = self.created.elapsed().as_micros() as i64;
        let before = last.unwrap_or(FetchCounts { ts_us: now.ts_us - since_created, fetches: 0, messages: 0 });
        *last = Some(now);
        let fetches = (now.fetches - before.fetches).max(0);
        metrics().fetch_requests.inc_by(fetches as u64);
        let seconds = (now.ts_us - before.ts_us) as f64 / 1e6;
        let brokers = per_broker.iter().filter(|f| **f > 0).count().max(1) as f64;
        // A fetch that returned records returned at least one: the rest were empty.
        let empty = (fetches - (now.messages - before.messages).max(0)).max(0) as f64;
        if seconds > 0.0
            && empty / seconds / brokers > EAGER_EMPTY_FETCHES
            && !self.eager_broker.swap(true, Ordering::SeqCst)
        {
            info!(
                empty_fetches_per_second = (empty / seconds / brokers).round() as u64,
                "The broker answers empty fetches at once (it does not wait fetch.wait.max.ms); intake backs off \
                 while idle (kafka.idle_backoff_ms)."
            );
        }
    }

    fn topic(&self, name: &str) -> Arc<str> {
        let mut names = self.topic_names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = names.iter().find(|t| &***t == name) {
            return t.clone();
        }
        let t: Arc<str> = Arc::from(name);
        names.push(t.clone());
        t
    }

    fn tps(&self, tpl: &TopicPartitionList) -> Vec<Tp> {
        tpl.elements().iter().map(|e| (self.topic(e.topic()), e.partition())).collect()
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Queues an item behind anything held, then hands over what fits.
    fn push(&self, item: KafkaIntake) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.push(item);
        Self::hand_over(&self.tx, &mut held);
    }

    fn hand_over(tx: &mpsc::Sender<KafkaIntake>, held: &mut Held) {
        while let Some(item) = held.items.pop_front() {
            let bytes = held_bytes(&item);
            match tx.try_send(item) {
                Ok(()) => held.bytes -= bytes,
                Err(mpsc::error::TrySendError::Full(item)) => {
                    held.items.push_front(item);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    *held = Held::default();
                    return;
                }
            }
        }
    }

    /// Records held after a hand-over, and their bytes.
    fn held_len(&self) -> (usize, usize) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        Self::hand_over(&self.tx, &mut held);
        (held.items.len(), held.bytes)
    }

    /// Items waiting for the runner: held here plus queued in the channel (after a hand-over), and the held bytes.
    fn buffered(&self) -> (usize, usize) {
        let (held, bytes) = self.held_len();
        (bytes, held + self.tx.max_capacity() - self.tx.capacity())
    }

    /// Hands over everything held and then `item`, waiting for room until `deadline`. False on timeout.
    fn push_all_until(&self, item: KafkaIntake, deadline: Instant) -> bool {
        self.push(item);
        loop {
            if self.held_len().0 == 0 {
                return true;
            }
            if Instant::now() >= deadline || self.tx.is_closed() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl ClientContext for IntakeContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // The end of a partition (enable.partition.eof, for the idle backoff) comes as an error event too.
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF) {
            return;
        }
        // librdkafka's reasons name brokers and codes, never record contents.
        warn!(code = ErrorCode::KafkaUnavailable.as_str(), error = %error, reason, "Kafka consumer error.");
    }

    fn stats(&self, statistics: Statistics) {
        self.watch_fetches(&statistics);
        // Lag per assigned partition: the end a read_committed consumer can reach (the last stable offset, or the
        // high watermark when the broker reports none) minus the committed watermark — ours when this process has
        // committed (transactional commits never reach librdkafka's own offset bookkeeping), else the group's
        // committed offset as librdkafka fetched it on assignment.
        let assigned = self.ledger.assigned();
        for (name, topic) in &statistics.topics {
            for (id, p) in &topic.partitions {
                let tp: Tp = (self.topic(name), *id);
                if *id < 0 || !assigned.contains(&tp) {
                    continue;
                }
                let end = if p.ls_offset >= 0 { p.ls_offset } else { p.hi_offset };
                let committed = self.ledger.committed(&tp).or((p.committed_offset >= 0).then_some(p.committed_offset));
                let lag = match committed {
                    Some(c) if end >= 0 => (end - c).max(0),
                    _ if p.consumer_lag >= 0 => p.consumer_lag,
                    _ => continue,
                };
                metrics().consumer_lag.with_label_values(&[name.as_str(), &id.to_string()]).set(lag);
            }
        }
    }
}

impl ConsumerContext for IntakeContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else { return };
        let partitions = self.tps(tpl);
        metrics().rebalances.with_label_values(&["revoke"]).inc();
        if self.closing.load(Ordering::SeqCst) || partitions.is_empty() {
            self.forget(&partitions);
            return;
        }
        info!(partitions = partitions.len(), "Partitions revoked; draining in-flight documents.");
        let started = Instant::now();
        let deadline = started + self.drain_timeout;
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
        let sent = self.push_all_until(Intake::Revoking { partitions: partitions.clone(), done: done_tx }, deadline);
        let drained = sent && done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_ok();
        if drained {
            info!(took_ms = started.elapsed().as_millis() as u64, "Drained in-flight documents before release.");
        } else {
            warn!(
                code = ErrorCode::RebalanceDrainTimeout.as_str(),
                timeout_ms = self.drain_timeout.as_millis() as u64,
                "Revoked partitions did not drain in time; the next owner redelivers their uncommitted events."
            );
        }
        self.forget(&partitions);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let partitions = self.tps(tpl);
                metrics().rebalances.with_label_values(&["assign"]).inc();
                metrics().assigned.set(self.ledger.assign(&partitions) as i64);
                info!(partitions = partitions.len(), "Partitions assigned.");
                self.assignment_changed.store(true, Ordering::SeqCst);
                // librdkafka keeps an application pause on a partition across a revocation and a new assignment
                // (only its own pause is reset): a partition paused by the budget or by the idle backoff, and
                // resumed while it was not assigned (a resume then covers nothing), would stay paused for good.
                // So the new assignment's state is set here: the budget's pause, or running.
                if tpl.count() > 0 {
                    let _ = if self.paused.load(Ordering::SeqCst) { consumer.pause(tpl) } else { consumer.resume(tpl) };
                }
                self.push(Intake::Assigned(partitions));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => warn!(error = %e, "Rebalance error."),
        }
    }
}

impl IntakeContext {
    fn forget(&self, partitions: &[Tp]) {
        let left = self.ledger.revoke(partitions);
        for tp in partitions {
            // A partition that moved to another worker is that worker's to report.
            let labels = [&*tp.0, &tp.1.to_string()];
            let _ = metrics().consumer_lag.remove_label_values(&labels);
            let _ = metrics().committed_offset.remove_label_values(&labels);
        }
        metrics().assigned.set(left as i64);
    }
}

pub type IntakeConsumer = BaseConsumer<IntakeContext>;

/// The running intake: the consumer (shared with the runner for commits) and its poll thread.
pub struct IntakeHandle {
    pub consumer: Arc<IntakeConsumer>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl IntakeHandle {
    pub fn context(&self) -> &IntakeContext {
        self.consumer.context()
    }

    /// Stops polling and waits for the poll thread.
    pub fn stop_intake(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Leaves the group (after the final commit).
    pub fn close(mut self) {
        self.stop_intake();
        self.context().closing.store(true, Ordering::SeqCst);
        // Dropping the last handle closes the consumer; the final revocation skips the drain (`closing`).
        drop(self.consumer);
    }
}

impl super::IntakeControl for IntakeHandle {
    /// Asks the poll thread to stop taking records; the consumer stays open for the final commit.
    fn request_stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// A revocation may be waiting for its answer while the poll thread stops.
    fn answers_requests(&self) -> bool {
        true
    }

    fn take_thread(&mut self, _interrupted: bool) -> Option<JoinHandle<()>> {
        self.thread.take()
    }
}

/// Subscribes and starts the poll thread. Records arrive on the returned channel in partition order.
pub fn start(
    settings: &Settings,
    ledger: &Arc<Ledger>,
) -> Result<(IntakeHandle, mpsc::Receiver<KafkaIntake>), RunError> {
    let k = &settings.kafka;
    let mut config = client_config(k, &std::collections::BTreeMap::new());
    config
        .set("group.id", &k.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("statistics.interval.ms", "5000")
        // The idle backoff pauses once every assigned partition has reported its end.
        .set("enable.partition.eof", if k.idle_backoff_ms > 0 { "true" } else { "false" });
    if !k.group_instance_id.is_empty() {
        config.set("group.instance.id", &k.group_instance_id);
    }
    for (key, value) in &k.consumer {
        config.set(key, value);
    }
    let capacity = settings.pipeline.source_channel;
    let (tx, rx) = mpsc::channel(capacity);
    let context = IntakeContext {
        tx,
        held: Mutex::new(Held::default()),
        drain_timeout: Duration::from_millis(k.drain_timeout_ms),
        closing: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        fetch_counts: Mutex::new(None),
        eager_broker: AtomicBool::new(false),
        assignment_changed: AtomicBool::new(false),
        created: Instant::now(),
        ledger: Arc::clone(ledger),
        topic_names: Mutex::new(Vec::new()),
    };
    let consumer: IntakeConsumer =
        config.create_with_context(context).map_err(|e| RunError::Config(format!("kafka consumer: {e}")))?;
    let topics: Vec<&str> = k.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).map_err(|e| RunError::Config(format!("kafka subscribe: {e}")))?;
    let consumer = Arc::new(consumer);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let consumer = Arc::clone(&consumer);
        let stop = Arc::clone(&stop);
        let pause_after = Duration::from_millis(k.pause_after_ms);
        let idle_backoff = Duration::from_millis(k.idle_backoff_ms);
        std::thread::Builder::new()
            .name("clinstream-intake".into())
            .spawn(move || poll_loop(&consumer, &stop, pause_after, idle_backoff))
            .map_err(|e| RunError::Config(format!("starting the intake thread: {e}")))?
    };
    Ok((IntakeHandle { consumer, stop, thread: Some(thread) }, rx))
}

fn poll_loop(consumer: &IntakeConsumer, stop: &AtomicBool, pause_after: Duration, idle_backoff: Duration) {
    let ctx = consumer.context();
    // Since when records have been waiting for the runner without a break (its in-flight budget is full), and
    // how many waited when intake was paused.
    let mut waiting_since: Option<Instant> = None;
    let mut buffered_at_pause = 0usize;
    let mut last_error: Option<Instant> = None;
    // Idle backoff (eager brokers only): the partitions (by number: librdkafka's end-of-partition event names no
    // topic) that reached their end since they last brought a record or were resumed, and until when intake is
    // paused because all of them did.
    let mut at_end: HashSet<i32> = HashSet::new();
    // Whether that set (or the broker's eagerness) changed since it was last checked against the assignment.
    let mut recheck = true;
    let mut idle_until: Option<Instant> = None;
    while !stop.load(Ordering::SeqCst) {
        let (held_bytes, buffered) = ctx.buffered();
        if buffered == 0 {
            waiting_since = None;
        } else {
            waiting_since.get_or_insert_with(Instant::now);
        }
        let paused = ctx.paused.load(Ordering::SeqCst);
        let exhausted = waiting_since.is_some_and(|t| t.elapsed() >= pause_after) || held_bytes >= HELD_BYTES;
        if !paused && exhausted {
            set_paused(consumer, true);
            buffered_at_pause = buffered;
        } else if paused && buffered <= buffered_at_pause / 2 {
            // Resume before everything buffered is handed over: a resumed partition's next fetch can take up to a
            // second, and what is still buffered (plus the in-flight queue) covers that gap. Staying paused while
            // the runner has work also spares the broker fetches it cannot use (a broker that answers an empty
            // fetch at once, without waiting `fetch.wait.max.ms`, is otherwise asked thousands of times a second).
            set_paused(consumer, false);
            waiting_since = (buffered > 0).then(Instant::now);
            idle_until = None;
            at_end.clear();
            recheck = true;
        }
        let paused = ctx.paused.load(Ordering::SeqCst);
        if ctx.assignment_changed.swap(false, Ordering::SeqCst) {
            // The new assignment runs (or holds the budget's pause): an idle pause ended with the rebalance.
            at_end.clear();
            recheck = true;
            idle_until = None;
        }
        let now = Instant::now();
        match idle_until {
            // Paused for the budget meanwhile: that pause ends the idle one (and its resume fetches again).
            Some(_) if paused => idle_until = None,
            // A resume starts a new fetch version: every partition reports its end again.
            Some(until) if now >= until && pause_assignment(consumer, false) => {
                idle_until = None;
                at_end.clear();
                recheck = true;
            }
            _ => {}
        }
        // Every assigned partition at its end (checked when that may have changed): pause until `idle_until`.
        let eager = !idle_backoff.is_zero() && ctx.eager_broker.load(Ordering::SeqCst);
        if eager
            && idle_until.is_none()
            && !paused
            && std::mem::take(&mut recheck)
            && all_at_end(consumer, &at_end)
            && pause_assignment(consumer, true)
        {
            idle_until = Some(now + idle_backoff);
            metrics().idle_pauses.inc();
        }
        let timeout = match idle_until {
            Some(until) => until.saturating_duration_since(now).min(Duration::from_millis(100)),
            None => Duration::from_millis(100),
        };
        let polled = consumer.poll(timeout);
        // A consumer in a fatal state (librdkafka: `FencedInstanceId`, another member with this
        // `group.instance.id`) fetches and commits nothing ever again: the run halts at once (`consumer_fatal`)
        // instead of idling, and the restarted worker redelivers what was not committed. Checked when a poll
        // brought no message, so the message path pays nothing.
        if !matches!(polled, Some(Ok(_)))
            && let Some(error) = fatal(consumer)
        {
            ctx.push(Intake::Failed(error));
            break;
        }
        match polled {
            None => {}
            Some(Ok(message)) => {
                recheck |= at_end.remove(&message.partition());
                let message = Arc::new(message.detach());
                let topic = ctx.topic(message.topic());
                let (partition, offset) = (message.partition(), message.offset());
                let record = |entry| KafkaRecord {
                    topic: topic.clone(),
                    partition,
                    offset,
                    message: Arc::clone(&message),
                    entry,
                };
                // A Bundle is unpacked into its DocumentReference entries; one without any goes on whole (and is
                // dead-lettered as bundle_without_documents).
                let entries = super::bundle_entries(message.payload().unwrap_or_default()).unwrap_or_default();
                let documents = entries.iter().filter(|(_, r)| r.is_some()).count();
                if documents == 0 {
                    ctx.push(Intake::Record(record(None)));
                    continue;
                }
                let mut seen = 0;
                for (index, resource) in entries {
                    let Some(payload) = resource else {
                        ctx.push(Intake::SkippedResource);
                        continue;
                    };
                    seen += 1;
                    ctx.push(Intake::Record(record(Some(BundleEntry { index, payload, last: seen == documents }))));
                }
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                recheck |= at_end.insert(partition);
            }
            Some(Err(e)) if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) => {
                warn!(code = ErrorCode::KafkaUnavailable.as_str(), error = %e, "Kafka poll error.");
                last_error = Some(Instant::now());
            }
            Some(Err(_)) => {}
        }
    }
    debug!("Intake stopped.");
}

/// The halt for a consumer in a fatal state, if it is in one. librdkafka's reason names the error and the
/// broker's words, never record contents.
pub(crate) fn fatal(consumer: &IntakeConsumer) -> Option<RunError> {
    consumer.client().fatal_error().map(|(code, reason)| {
        RunError::halt(ErrorCode::ConsumerFatal, format!("the Kafka consumer hit a fatal error ({code:?}): {reason}"))
    })
}

/// Whether every assigned partition (by number) has reached its end.
fn all_at_end(consumer: &IntakeConsumer, at_end: &HashSet<i32>) -> bool {
    let Ok(assignment) = consumer.assignment() else { return false };
    let elements = assignment.elements();
    !elements.is_empty() && elements.iter().all(|e| at_end.contains(&e.partition()))
}

/// Pauses or resumes every assigned partition; false when librdkafka refused.
fn pause_assignment(consumer: &IntakeConsumer, pause: bool) -> bool {
    let Ok(assignment) = consumer.assignment() else { return false };
    let result = if pause { consumer.pause(&assignment) } else { consumer.resume(&assignment) };
    if let Err(e) = &result {
        warn!(error = %e, "Could not pause/resume partitions.");
    }
    result.is_ok()
}

/// The budget's pause (`clinstream_kafka_paused`), which a rebalance keeps on newly assigned partitions.
fn set_paused(consumer: &IntakeConsumer, pause: bool) {
    if !pause_assignment(consumer, pause) {
        return;
    }
    consumer.context().paused.store(pause, Ordering::SeqCst);
    metrics().paused.set(i64::from(pause));
    if pause {
        info!("In-flight budget exhausted; pausing intake.");
    } else {
        info!("Resuming intake.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;

    fn record(offset: i64, bytes: usize) -> KafkaIntake {
        let message =
            OwnedMessage::new(Some(vec![b'x'; bytes]), None, "notes".into(), Timestamp::NotAvailable, 0, offset, None);
        Intake::Record(KafkaRecord {
            topic: "notes".into(),
            partition: 0,
            offset,
            message: Arc::new(message),
            entry: None,
        })
    }

    fn offsets(rx: &mut mpsc::Receiver<KafkaIntake>) -> Vec<i64> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|i| match i {
                Intake::Record(r) => r.offset,
                _ => -1,
            })
            .collect()
    }

    /// What the channel has no room for is held in order and counted by its bytes, which go down as it is handed
    /// over; a closed channel drops it all.
    #[test]
    fn held_records_are_counted_by_their_bytes_and_handed_over_in_order() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut held = Held::default();
        for (offset, bytes) in [(0, 10), (1, 1_000), (2, 100_000), (3, 5)] {
            held.push(record(offset, bytes));
            IntakeContext::hand_over(&tx, &mut held);
        }
        assert_eq!(held.items.len(), 2);
        assert_eq!(held.bytes, 100_000 + 5 + 2 * HELD_RECORD_OVERHEAD);
        assert_eq!(offsets(&mut rx), [0, 1]);
        IntakeContext::hand_over(&tx, &mut held);
        assert_eq!((held.items.len(), held.bytes), (0, 0));
        assert_eq!(offsets(&mut rx), [2, 3]);
        for offset in 4..8 {
            held.push(record(offset, 1 << 20));
        }
        IntakeContext::hand_over(&tx, &mut held);
        assert_eq!(held.bytes, 2 * ((1 << 20) + HELD_RECORD_OVERHEAD));
        drop(rx);
        IntakeContext::hand_over(&tx, &mut held);
        assert_eq!((held.items.len(), held.bytes), (0, 0));
    }
}
