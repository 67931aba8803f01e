//! The Kafka runner: intake → stages (blocking pool) → outputs, in order, with per-partition watermarks.
//!
//! The in-flight queue is FIFO over all partitions, like file mode: a document's outputs are sent when it
//! reaches the front, and only then does its partition's watermark move to `offset + 1`. Watermarks are
//! committed every `kafka.commit_interval_ms` after the outputs before them are delivered (see `output`), on
//! every revocation (before the partitions are released), and at shutdown. A halt returns before committing.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::admin;
use super::consumer::{self, Intake, IntakeHandle, KafkaRecord, Tp};
use super::output::Output;
use crate::app::{self, Pending, RunError, Summary};
use crate::config::{DeadLetterLimit, Settings};
use crate::error::{DocError, ErrorCode, Stage};
use crate::sink::DeadLetter;
use crate::source::Origin;
use crate::stages::{Pipeline, Rejected};
use crate::telemetry::metrics::metrics;

struct Entry {
    origin: Origin,
    record: Arc<KafkaRecord>,
    pending: Pending,
}

/// Halts the worker when too many events are dead-lettered (`kafka.dead_letters`).
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

    /// Records one outcome; `Err` (a PHI-free reason) when the limit is exceeded.
    pub fn record(&mut self, dead: bool) -> Result<(), String> {
        self.window.push_back(dead);
        self.dead_in_window += usize::from(dead);
        if self.window.len() > self.limit.window && self.window.pop_front() == Some(true) {
            self.dead_in_window -= 1;
        }
        self.consecutive = if dead { self.consecutive + 1 } else { 0 };
        if self.consecutive >= self.limit.max_consecutive {
            return Err(format!("{} events in a row were dead-lettered", self.consecutive));
        }
        let ratio = self.dead_in_window as f64 / self.window.len() as f64;
        if self.window.len() >= self.limit.window && ratio > self.limit.max_ratio {
            return Err(format!(
                "{} of the last {} events were dead-lettered (limit {:.0}%)",
                self.dead_in_window,
                self.window.len(),
                self.limit.max_ratio * 100.0
            ));
        }
        Ok(())
    }
}

struct Runner<'a> {
    settings: &'a Settings,
    pipeline: Arc<Pipeline>,
    indexer: Option<Arc<crate::index::Indexer>>,
    output: Output,
    intake: IntakeHandle,
    in_flight: VecDeque<Entry>,
    watermarks: HashMap<Tp, i64>,
    guard: DeadLetterGuard,
    summary: Summary,
}

/// Runs the worker against Kafka until `shutdown` resolves (then drains, commits and returns) or a halt.
pub async fn run_kafka(settings: &Settings, shutdown: impl Future<Output = ()>) -> Result<Summary, RunError> {
    let startup = Instant::now();
    let readiness = app::start_health(settings).await?;
    let pipeline = Arc::new(Pipeline::new(settings).map_err(RunError::Config)?);
    let k = &settings.kafka;
    tokio::pin!(shutdown);
    // Connecting can wait on an unreachable cluster for up to `kafka.halt_after_ms`; a shutdown signal ends it.
    let connect = async {
        let indexer = app::start_indexer(settings, &pipeline).await?;
        if k.create_topics {
            admin::ensure_topics(k).await?;
        }
        let framing = super::registry::output_framing(k).await?;
        let output = Output::new(settings, pipeline.lexicon().version(), framing).await?;
        let (intake, rx) = consumer::start(settings).map_err(RunError::Config)?;
        Ok::<_, RunError>((indexer, output, intake, rx))
    };
    let (indexer, output, intake, rx) = tokio::select! {
        connected = connect => connected?,
        _ = &mut shutdown => {
            info!("Shutdown requested while connecting; nothing was consumed.");
            return Ok(Summary { interrupted: true, ..Summary::default() });
        }
    };
    let startup = startup.elapsed();
    metrics().startup_duration.set(startup.as_secs_f64());
    info!(
        topics = ?k.topics,
        group = %k.group_id,
        transactions = k.transactions,
        in_flight = settings.pipeline.in_flight,
        "Consuming from Kafka."
    );
    let mut runner = Runner {
        settings,
        pipeline,
        indexer,
        output,
        intake,
        in_flight: VecDeque::with_capacity(settings.pipeline.in_flight),
        watermarks: HashMap::new(),
        guard: DeadLetterGuard::new(&k.dead_letters),
        summary: Summary { startup, ..Summary::default() },
    };
    readiness.set(true);
    let started = Instant::now();
    let result = runner.run(rx, shutdown).await;
    readiness.set(false);
    runner.summary.elapsed = started.elapsed();
    match result {
        Ok(()) => {
            if let Some(indexer) = &runner.indexer
                && let Err(e) = indexer.store().flush().await
            {
                warn!(error = %e.message, "Could not flush the embedded store (its WAL keeps the points).");
            }
            let summary = runner.summary.clone();
            runner.intake.close();
            info!(
                read = summary.read,
                written = summary.written,
                dead_lettered = summary.dead_lettered(),
                "Kafka run finished; offsets committed."
            );
            Ok(summary)
        }
        Err(e) => {
            error!(code = e.code().as_str(), error = %e, "Halting without committing.");
            runner.output.abort();
            runner.intake.close();
            Err(e)
        }
    }
}

impl Runner<'_> {
    async fn run(
        &mut self,
        mut rx: mpsc::Receiver<Intake>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let capacity = self.settings.pipeline.in_flight;
        let mut tick = tokio::time::interval(Duration::from_millis(self.settings.kafka.commit_interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            if self.in_flight.len() >= capacity {
                self.finish_front().await?;
                continue;
            }
            while matches!(self.in_flight.front(), Some(Entry { pending: Pending::Rejected(_), .. })) {
                self.finish_front().await?;
            }
            let front_is_task = matches!(self.in_flight.front(), Some(Entry { pending: Pending::Task(_), .. }));
            tokio::select! {
                biased;
                _ = &mut shutdown => {
                    info!(in_flight = self.in_flight.len(), "Shutdown requested; draining and committing.");
                    self.summary.interrupted = true;
                    break;
                }
                _ = tick.tick() => self.commit().await?,
                done = front_done(&mut self.in_flight), if front_is_task => {
                    if let Some(front) = self.in_flight.front_mut() {
                        front.pending = Pending::Done(Box::new(done));
                    }
                    self.finish_front().await?;
                }
                item = rx.recv() => match item {
                    None => break,
                    Some(item) => self.intake_item(item).await?,
                },
            }
        }
        // Stop taking records; keep answering the intake thread (a revocation may be waiting) until it ends.
        self.intake.request_stop();
        if let Some(thread) = self.intake.take_thread() {
            let mut join = tokio::task::spawn_blocking(move || thread.join());
            loop {
                tokio::select! {
                    _ = &mut join => break,
                    item = rx.recv() => match item {
                        Some(Intake::Revoking { done, .. }) => {
                            self.drain().await?;
                            let _ = done.send(());
                        }
                        // Records taken after the stop are not processed; their offsets stay uncommitted.
                        Some(_) => {}
                        None => break,
                    },
                }
            }
        }
        self.drain().await
    }

    async fn intake_item(&mut self, item: Intake) -> Result<(), RunError> {
        match item {
            Intake::Record(record) => {
                let m = metrics();
                self.summary.read += 1;
                self.summary.bytes += record.payload().len() as u64;
                m.documents_consumed.inc();
                m.input_bytes.inc_by(record.payload().len() as u64);
                m.in_flight.inc();
                let origin =
                    Origin::Kafka { topic: record.topic.clone(), partition: record.partition, offset: record.offset };
                let limit = self.settings.input.max_message_bytes;
                let pending = if record.payload().len() > limit {
                    let error = DocError::new(
                        ErrorCode::MessageTooLarge,
                        Stage::Source,
                        format!("event is {} bytes; the limit is {limit}", record.payload().len()),
                    );
                    Pending::Rejected(Rejected { error, doc_id: None })
                } else {
                    let r = Arc::clone(&record);
                    Pending::Task(app::spawn_document(Arc::clone(&self.pipeline), self.indexer.clone(), move |p| {
                        p.process(r.payload())
                    }))
                };
                self.in_flight.push_back(Entry { origin, record, pending });
            }
            Intake::Assigned(partitions) => debug!(partitions = partitions.len(), "Assignment received."),
            Intake::Revoking { partitions, done } => {
                debug!(partitions = partitions.len(), "Draining for a revocation.");
                self.drain().await?;
                let _ = done.send(());
            }
        }
        Ok(())
    }

    /// Finishes everything in flight and commits.
    async fn drain(&mut self) -> Result<(), RunError> {
        while !self.in_flight.is_empty() {
            self.finish_front().await?;
        }
        self.commit().await
    }

    async fn commit(&mut self) -> Result<(), RunError> {
        self.output.commit(&self.intake.consumer, &mut self.watermarks).await
    }

    async fn finish_front(&mut self) -> Result<(), RunError> {
        let Some(Entry { origin, record, pending }) = self.in_flight.pop_front() else { return Ok(()) };
        let result = app::into_result(&origin, pending).await;
        metrics().in_flight.dec();
        let dead = match result {
            Ok(doc) => {
                let clock = Instant::now();
                self.output.document(&doc).await?;
                self.summary.written += 1;
                app::observe_document(&doc, clock.elapsed());
                false
            }
            Err(rejected) if app::halting(&rejected).is_some() => {
                warn!(code = rejected.error.code.as_str(), "Indexing failed; stopping without committing.");
                return Err(app::halting(&rejected).expect("checked"));
            }
            Err(Rejected { error, doc_id }) => {
                app::observe_dead_letter(error.code);
                debug!(code = error.code.as_str(), stage = error.stage.as_str(), origin = %origin, "Event dead-lettered.");
                *self.summary.dead_letters.entry(error.code).or_default() += 1;
                self.output.dead_letter(&DeadLetter { error, origin, doc_id }, &record).await?;
                true
            }
        };
        self.watermarks.insert(record.tp(), record.offset + 1);
        if let Err(why) = self.guard.record(dead) {
            warn!(code = ErrorCode::DeadLetterLimit.as_str(), "{why}");
            return Err(RunError::Kafka { code: ErrorCode::DeadLetterLimit, detail: why });
        }
        Ok(())
    }
}

async fn front_done(in_flight: &mut VecDeque<Entry>) -> Result<crate::model::Document, Rejected> {
    match in_flight.front_mut() {
        Some(e) => app::task_done(&e.origin, &mut e.pending).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(window: usize, max_ratio: f64, max_consecutive: u64) -> DeadLetterGuard {
        DeadLetterGuard::new(&DeadLetterLimit { window, max_ratio, max_consecutive })
    }

    #[test]
    fn consecutive_dead_letters_halt() {
        let mut g = guard(100, 1.0, 3);
        assert!(g.record(true).is_ok());
        assert!(g.record(true).is_ok());
        assert!(g.record(false).is_ok());
        assert!(g.record(true).is_ok());
        assert!(g.record(true).is_ok());
        assert!(g.record(true).unwrap_err().contains("3 events in a row"));
    }

    #[test]
    fn ratio_over_a_full_window_halts() {
        let mut g = guard(10, 0.5, 1000);
        // Alternating: 50 % — at the limit, not over it.
        for i in 0..40 {
            assert!(g.record(i % 2 == 0).is_ok(), "event {i}");
        }
        // A few more dead letters in a row push the window over 50 %.
        let err = (0..3).find_map(|_| g.record(true).err()).expect("limit reached");
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
