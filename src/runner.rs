//! The one runner: intake → work (stages, indexing) → outputs, in order, for file mode and Kafka mode alike.
//!
//! Contract:
//! * In: `Intake<R>` items over a bounded channel (`source`), in order. Each record becomes one task (`Work`);
//!   at most `in_flight` are in flight, kept in a FIFO and completed front first, so outputs come out in intake
//!   order. A full queue makes the runner wait for its oldest task before reading more; a full channel blocks the
//!   intake — that is the backpressure.
//! * Out: the `Outputs` side gets each outcome in order (`document` or `dead_letter`), then the ack core hears
//!   that the record is finished (`Acks::finished`). `checkpoint` runs every `commit_interval` (when set), once
//!   the runner has been idle for `commit_when_idle` after finishing a record (when set: nothing in flight, no
//!   record arriving), on a revocation (after draining, before answering), and at the end. A rejection whose code
//!   halts (the index failed) stops the run *before* its outputs or watermark, so nothing after it is committed.
//! * Shutdown: when `shutdown` resolves, stop taking records, finish what is in flight, checkpoint, return the
//!   summary. A halt returns the error at once; the caller aborts the outputs and commits nothing.
//!
//! The oldest task is awaited alongside the intake, so results reach the outputs as soon as they are done even
//! when the intake is slow (and acknowledgements are not held back).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, error, info};

use crate::ack::Acks;
use crate::error::{Disposition, DocError, ErrorCode, RunError, Stage};
use crate::model::{DeadLetter, Document, Origin};
use crate::sink::{Handed, Outputs};
use crate::source::{Intake, IntakeControl, Record};
use crate::stages::Rejected;
use crate::telemetry::metrics::metrics;

/// Starts one record's work (text stages, then indexing) and returns its task.
pub trait Work<R>: Send + Sync {
    fn spawn(&self, record: Arc<R>) -> JoinHandle<Result<Document, Rejected>>;
}

/// How the runner paces itself.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    pub in_flight: usize,
    /// Records larger than this are dead-lettered (`message_too_large`) without being processed.
    pub max_message_bytes: usize,
    /// Checkpoint this often (Kafka: `kafka.commit_interval_ms`); `None`: only at revocations and the end.
    pub commit_interval: Option<Duration>,
    /// Checkpoint when nothing is in flight and no record has arrived for this long since a record finished
    /// (Kafka: `kafka.commit_idle_ms`), so the end of a burst or a lone note is not held back a whole interval;
    /// `None`: only at the interval. At most one such checkpoint per finished record.
    pub commit_when_idle: Option<Duration>,
}

/// Counts for the end-of-run summary.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Events read (documents and rejected events).
    pub read: u64,
    pub written: u64,
    pub dead_letters: BTreeMap<ErrorCode, u64>,
    pub skipped_files: u64,
    pub skipped_resources: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Compiling the lexicon and variables (and loading the model), before the first document.
    pub startup: Duration,
    /// True when a shutdown signal cut the run short.
    pub interrupted: bool,
    pub outputs: Vec<PathBuf>,
}

impl Summary {
    pub fn dead_lettered(&self) -> u64 {
        self.dead_letters.values().sum()
    }

    /// Adds a later round's counts (Kafka mode after an in-process rebuild of its clients).
    pub fn absorb(&mut self, round: Summary) {
        self.read += round.read;
        self.written += round.written;
        for (code, n) in round.dead_letters {
            *self.dead_letters.entry(code).or_default() += n;
        }
        self.skipped_files += round.skipped_files;
        self.skipped_resources += round.skipped_resources;
        self.bytes += round.bytes;
        self.interrupted |= round.interrupted;
        self.outputs.extend(round.outputs);
    }

    pub fn notes_per_second(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 { self.read as f64 / secs } else { 0.0 }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.interrupted { " (interrupted)" } else { "" };
        writeln!(f, "clinstream run{status}")?;
        let row = |f: &mut fmt::Formatter<'_>, label: &str, n: u64| writeln!(f, "  {label:<28}{n:>8}");
        row(f, "documents read", self.read)?;
        row(f, "documents written", self.written)?;
        row(f, "dead-lettered", self.dead_lettered())?;
        for (code, n) in &self.dead_letters {
            row(f, &format!("  {}", code.as_str()), *n)?;
        }
        if self.skipped_files > 0 {
            row(f, "skipped files (other types)", self.skipped_files)?;
        }
        if self.skipped_resources > 0 {
            row(f, "skipped bundle entries", self.skipped_resources)?;
        }
        let secs = self.elapsed.as_secs_f64();
        writeln!(
            f,
            "  {:<28}{:>8.2} s  ({:.0} notes/s, {:.1} MB/s)",
            "time",
            secs,
            self.notes_per_second(),
            self.bytes as f64 / 1e6 / secs.max(1e-9)
        )?;
        writeln!(f, "  {:<28}{:>8.2} s  (lexicon, variables, model)", "start-up", self.startup.as_secs_f64())?;
        for p in &self.outputs {
            writeln!(f, "  wrote {}", p.display())?;
        }
        Ok(())
    }
}

/// An event's processing: still running, finished, or rejected without it (oversized).
enum Pending {
    Task(JoinHandle<Result<Document, Rejected>>),
    Done(Box<Result<Document, Rejected>>),
    Rejected(Rejected),
}

struct Entry<R> {
    origin: Origin,
    /// The record (for dead letters that carry the original, and its position); `None` when not kept.
    record: Option<Arc<R>>,
    pending: Pending,
}

/// A rejection whose code halts the worker (the index failed) rather than dead-lettering the event.
pub fn halting(rejected: &Rejected) -> Option<RunError> {
    (rejected.error.disposition() == Disposition::Halt)
        .then(|| RunError::halt(rejected.error.code, rejected.error.detail.clone()))
}

/// The runner: one FIFO of in-flight records, completed front first.
pub struct Runner<'a, R, W, O> {
    opts: RunnerOptions,
    work: &'a W,
    outputs: &'a mut O,
    acks: &'a mut Acks,
    in_flight: VecDeque<Entry<R>>,
    /// A record finished since the last checkpoint (what an idle checkpoint waits for).
    finished_since_checkpoint: bool,
    pub summary: Summary,
}

impl<'a, R, W, O> Runner<'a, R, W, O>
where
    R: Record,
    W: Work<R>,
    O: Outputs<R>,
{
    pub fn new(opts: RunnerOptions, work: &'a W, outputs: &'a mut O, acks: &'a mut Acks) -> Self {
        let in_flight = VecDeque::with_capacity(opts.in_flight);
        Runner { opts, work, outputs, acks, in_flight, finished_since_checkpoint: false, summary: Summary::default() }
    }

    /// Runs until the intake ends, `shutdown` resolves, or a halt; then stops the intake, drains and checkpoints.
    pub async fn run(
        &mut self,
        mut rx: mpsc::Receiver<Intake<R>>,
        intake: &mut impl IntakeControl,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let result = self.main_loop(&mut rx, shutdown).await;
        // Stop taking records; keep answering the intake (a revocation may be waiting) until it ends.
        intake.request_stop();
        if !intake.answers_requests() {
            rx.close();
        }
        result?;
        if let Some(thread) = intake.take_thread(self.summary.interrupted) {
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
                        None => {
                            let _ = join.await;
                            break;
                        }
                    },
                }
            }
        }
        self.drain().await
    }

    async fn main_loop(
        &mut self,
        rx: &mut mpsc::Receiver<Intake<R>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RunError> {
        let capacity = self.opts.in_flight.max(1);
        let mut tick = self.opts.commit_interval.map(|every| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
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
            let idle =
                self.opts.commit_when_idle.filter(|_| self.in_flight.is_empty() && self.finished_since_checkpoint);
            tokio::select! {
                biased;
                _ = &mut shutdown => {
                    info!(in_flight = self.in_flight.len(), "Shutdown requested; finishing in-flight documents.");
                    self.summary.interrupted = true;
                    return Ok(());
                }
                _ = next_tick(&mut tick) => self.checkpoint().await?,
                done = front_done(&mut self.in_flight), if front_is_task => {
                    if let Some(front) = self.in_flight.front_mut() {
                        front.pending = Pending::Done(Box::new(done));
                    }
                    self.finish_front().await?;
                }
                item = rx.recv() => match item {
                    None => return Ok(()),
                    Some(item) => self.intake(item).await?,
                },
                () = idle_for(idle) => self.checkpoint().await?,
            }
        }
    }

    async fn checkpoint(&mut self) -> Result<(), RunError> {
        self.finished_since_checkpoint = false;
        self.outputs.checkpoint(self.acks).await
    }

    async fn intake(&mut self, item: Intake<R>) -> Result<(), RunError> {
        let m = metrics();
        match item {
            Intake::Record(record) => {
                let len = record.payload().len();
                self.summary.read += 1;
                m.documents_consumed.inc();
                m.in_flight.inc();
                if record.counts_bytes() {
                    self.summary.bytes += len as u64;
                    m.input_bytes.inc_by(len as u64);
                }
                let record = Arc::new(record);
                let limit = self.opts.max_message_bytes;
                let pending = if len > limit {
                    Pending::Rejected(too_large(len as u64, limit))
                } else {
                    Pending::Task(self.work.spawn(Arc::clone(&record)))
                };
                self.in_flight.push_back(Entry { origin: record.origin(), record: Some(record), pending });
            }
            Intake::Oversized { origin, bytes } => {
                self.summary.read += 1;
                m.documents_consumed.inc();
                m.in_flight.inc();
                let pending = Pending::Rejected(too_large(bytes, self.opts.max_message_bytes));
                self.in_flight.push_back(Entry { origin, record: None, pending });
            }
            Intake::Progress(bytes) => {
                m.input_bytes.inc_by(bytes.saturating_sub(self.summary.bytes));
                self.summary.bytes = bytes;
            }
            Intake::SkippedFile(path) => {
                self.summary.skipped_files += 1;
                debug!(path = %path.display(), "Skipping a file of another resource type.");
            }
            Intake::SkippedResource => self.summary.skipped_resources += 1,
            Intake::Assigned(partitions) => debug!(partitions = partitions.len(), "Assignment received."),
            Intake::Revoking { partitions, done } => {
                debug!(partitions = partitions.len(), "Draining for a revocation.");
                self.drain().await?;
                let _ = done.send(());
            }
            Intake::Failed(e) => return Err(e),
        }
        Ok(())
    }

    /// Finishes everything in flight and checkpoints.
    pub async fn drain(&mut self) -> Result<(), RunError> {
        while !self.in_flight.is_empty() {
            self.finish_front().await?;
        }
        self.checkpoint().await
    }

    async fn finish_front(&mut self) -> Result<(), RunError> {
        let Some(Entry { origin, record, pending }) = self.in_flight.pop_front() else { return Ok(()) };
        let result = match pending {
            Pending::Rejected(r) => Err(r),
            Pending::Done(r) => *r,
            Pending::Task(task) => task.await.unwrap_or_else(|e| panicked(&origin, e)),
        };
        metrics().in_flight.dec();
        let result = match result {
            Ok(doc) => {
                let clock = Instant::now();
                let kept = record.as_deref().expect("a processed record is kept");
                match self.outputs.document(&doc, kept).await? {
                    Handed::Written => {
                        observe_document(&doc, clock.elapsed());
                        Ok(())
                    }
                    Handed::Refused(error) => Err(Rejected { error, doc_id: Some(doc.note.doc_id.clone()) }),
                }
            }
            Err(rejected) => Err(rejected),
        };
        let dead = match result {
            Ok(()) => {
                self.summary.written += 1;
                false
            }
            Err(rejected) => {
                if let Some(halt) = halting(&rejected) {
                    error!(code = rejected.error.code.as_str(), origin = %origin, "A halting error (indexing or fetching); stopping.");
                    return Err(halt);
                }
                let Rejected { error, doc_id } = rejected;
                observe_dead_letter(error.code);
                debug!(code = error.code.as_str(), stage = error.stage.as_str(), origin = %origin, "Event dead-lettered.");
                *self.summary.dead_letters.entry(error.code).or_default() += 1;
                self.outputs.dead_letter(&DeadLetter { error, origin, doc_id }, record.as_deref()).await?;
                true
            }
        };
        if let Some((partition, offset)) = record.as_ref().filter(|r| r.completes_position()).and_then(|r| r.position())
        {
            self.acks.finished(partition, offset);
            self.finished_since_checkpoint = true;
        }
        self.acks.outcome(dead)
    }
}

fn too_large(bytes: u64, limit: usize) -> Rejected {
    let error = DocError::new(
        ErrorCode::MessageTooLarge,
        Stage::Source,
        format!("event is {bytes} bytes; the limit is {limit}"),
    );
    Rejected { error, doc_id: None }
}

async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn idle_for(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// The oldest in-flight task's result (pending forever when the front is not a running task).
async fn front_done<R>(in_flight: &mut VecDeque<Entry<R>>) -> Result<Document, Rejected> {
    match in_flight.front_mut() {
        Some(Entry { origin, pending: Pending::Task(task), .. }) => task.await.unwrap_or_else(|e| panicked(origin, e)),
        _ => std::future::pending().await,
    }
}

fn panicked(origin: &Origin, join_error: tokio::task::JoinError) -> Result<Document, Rejected> {
    error!(origin = %origin, panic = join_error.is_panic(), "A stage failed unexpectedly.");
    Err(Rejected {
        error: DocError::new(ErrorCode::InternalError, Stage::Decode, "a stage failed unexpectedly"),
        doc_id: None,
    })
}

/// Metrics of a document whose outputs were handed over (`outputs_took`: the outputs side's share).
fn observe_document(doc: &Document, outputs_took: Duration) {
    let m = metrics();
    m.documents_finished.with_label_values(&["written"]).inc();
    for (stage, took) in doc.timings.stages() {
        m.stage_duration.with_label_values(&[stage]).observe(took.as_secs_f64());
    }
    m.stage_duration.with_label_values(&["sink"]).observe(outputs_took.as_secs_f64());
    for mention in &doc.mentions {
        m.mentions.with_label_values(&[mention.kind.as_str()]).inc();
    }
    for v in &doc.variables {
        m.context_tokens.observe(v.context_tokens as f64);
    }
}

/// Metrics of a dead-lettered event.
fn observe_dead_letter(code: ErrorCode) {
    let m = metrics();
    m.documents_finished.with_label_values(&["dead_lettered"]).inc();
    m.dead_letters.with_label_values(&[code.as_str()]).inc();
}

#[cfg(test)]
mod tests {
    //! Broker-free checks of the invariant the runner and the ack core keep together: an offset is never
    //! committed past an unfinished document, nor ahead of its outputs. Fake work (random durations, dead letters,
    //! halts), a fake outputs side whose records become durable only when a checkpoint waits for them, revocations
    //! in the intake stream, and tokio's paused clock (so the commit ticks and the work interleave at random but
    //! deterministically per case). The written documents' store writes go through a fake group-commit store
    //! (`FakeStore`, the contract of `store::Writer`): writes wait in lanes and are applied in groups, lanes finish
    //! out of order, and a group fails now and then, so each of its documents asks again; a commit must never pass
    //! a document whose store write is not applied.

    use std::collections::{BTreeMap, HashSet};
    use std::sync::Mutex;

    use proptest::prelude::*;

    use super::*;
    use crate::ack::Ledger;
    use crate::model::{KgDelta, Note, Partition, kg::Op};

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Outcome {
        Written,
        Dead,
        Halt,
    }

    #[derive(Debug)]
    struct FakeRecord {
        partition: Partition,
        offset: i64,
        work_ms: u64,
        outcome: Outcome,
        /// This record is entry `part` of `parts` unpacked from one message (a Bundle); 1 part otherwise.
        part: usize,
        parts: usize,
    }

    impl Record for FakeRecord {
        fn payload(&self) -> &[u8] {
            b"{}"
        }
        fn origin(&self) -> Origin {
            Origin::Kafka {
                topic: self.partition.0.clone(),
                partition: self.partition.1,
                offset: self.offset,
                entry: None,
            }
        }
        fn position(&self) -> Option<(Partition, i64)> {
            Some((self.partition.clone(), self.offset))
        }
        fn completes_position(&self) -> bool {
            self.part + 1 == self.parts
        }
    }

    /// A record's identity in the log: partition, offset, part.
    type Key = (Partition, i64, usize);

    /// What happened, shared by the fakes.
    #[derive(Default)]
    struct Log {
        /// Work finished (the task returned).
        finished: HashSet<Key>,
        /// Outputs handed to the outputs side, not yet durable.
        handed: Vec<Key>,
        /// Outputs made durable by a checkpoint.
        durable: HashSet<Key>,
        /// Every commit: (partition, next offset).
        commits: Vec<(Partition, i64)>,
        /// When each checkpoint that committed something ran (time since the case started, on the paused clock).
        commit_times: Vec<Duration>,
        /// Documents whose store write was applied (a group holding them succeeded).
        stored: HashSet<Key>,
        /// Store groups applied and failed, and the largest group.
        groups: usize,
        failed_groups: usize,
        largest_group: usize,
        /// Offsets below a commit that were, at the moment of that commit, unfinished or not durable.
        violations: Vec<String>,
    }

    /// One store write waiting in a lane: the document and where to answer.
    type Write = (Key, tokio::sync::oneshot::Sender<bool>);

    /// A store behind group commit, as `store::Writer` applies one: a document's write goes to its lane (by
    /// offset, so neighbours take different lanes), each lane applies what waits as one group after a latency of
    /// its own (lanes finish out of order), and every fourth group fails, answering each of its documents with a
    /// failure (they retry, as `index::retry_store` does).
    struct FakeStore {
        lanes: Vec<mpsc::Sender<Write>>,
    }

    impl FakeStore {
        fn start(log: Arc<Mutex<Log>>) -> FakeStore {
            let lanes = (0..3u64)
                .map(|lane| {
                    let (tx, mut rx) = mpsc::channel::<Write>(1024);
                    let log = Arc::clone(&log);
                    tokio::spawn(async move {
                        let mut n = 0u64;
                        while let Some(first) = rx.recv().await {
                            let mut group = vec![first];
                            while let Ok(w) = rx.try_recv() {
                                group.push(w);
                            }
                            n += 1;
                            tokio::time::sleep(Duration::from_millis(1 + (lane * 3 + n) % 7)).await;
                            let ok = !(n + lane).is_multiple_of(4);
                            let mut l = log.lock().unwrap();
                            l.groups += 1;
                            l.largest_group = l.largest_group.max(group.len());
                            if !ok {
                                l.failed_groups += 1;
                            }
                            for (key, reply) in group {
                                if ok {
                                    l.stored.insert(key);
                                }
                                let _ = reply.send(ok);
                            }
                        }
                    });
                    tx
                })
                .collect();
            FakeStore { lanes }
        }

        /// Writes a document, asking again after a failed group, until it is applied.
        async fn write(&self, key: Key) {
            loop {
                let (reply, answer) = tokio::sync::oneshot::channel();
                let lane = &self.lanes[(key.1 as usize + key.2) % self.lanes.len()];
                if lane.send((key.clone(), reply)).await.is_err() {
                    return;
                }
                if answer.await.unwrap_or(false) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    struct FakeWork(Arc<Mutex<Log>>, Arc<FakeStore>);

    fn document() -> Document {
        let note = Note::from_text("d", "text".into());
        let kg = KgDelta {
            doc_id: "d".into(),
            version: None,
            last_updated: None,
            patient: String::new(),
            op: Op::Upsert,
            replaces: vec![],
            nodes: vec![],
            edges: vec![],
            lexicon_version: String::new(),
            worker_version: String::new(),
        };
        Document {
            note,
            sections: vec![],
            sentences: vec![],
            mentions: vec![],
            variables: vec![],
            kg,
            timings: Default::default(),
        }
    }

    impl Work<FakeRecord> for FakeWork {
        fn spawn(&self, record: Arc<FakeRecord>) -> JoinHandle<Result<Document, Rejected>> {
            let log = Arc::clone(&self.0);
            let store = Arc::clone(&self.1);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(record.work_ms)).await;
                let key = (record.partition.clone(), record.offset, record.part);
                if record.outcome == Outcome::Written {
                    // Indexing: the document is done only when its group is applied.
                    store.write(key.clone()).await;
                }
                log.lock().unwrap().finished.insert(key);
                let reject = |code| Err(Rejected { error: DocError::new(code, Stage::Index, "fake"), doc_id: None });
                match record.outcome {
                    Outcome::Written => Ok(document()),
                    Outcome::Dead => reject(ErrorCode::InvalidJson),
                    Outcome::Halt => reject(ErrorCode::StoreUnavailable),
                }
            })
        }
    }

    struct FakeOutputs {
        log: Arc<Mutex<Log>>,
        durable_after: Duration,
        /// Every message's position, its number of parts and whether it is written (indexed), to check each commit
        /// against the state at that moment.
        positions: Vec<(Partition, i64, usize, bool)>,
        started: tokio::time::Instant,
    }

    impl FakeOutputs {
        fn hand(&self, record: &FakeRecord) {
            let log = &mut self.log.lock().unwrap();
            let key = (record.partition.clone(), record.offset, record.part);
            assert!(log.finished.contains(&key), "outputs of unfinished work");
            log.handed.push(key);
        }
    }

    impl Outputs<FakeRecord> for FakeOutputs {
        async fn document(&mut self, _doc: &Document, record: &FakeRecord) -> Result<Handed, RunError> {
            self.hand(record);
            Ok(Handed::Written)
        }
        async fn dead_letter(&mut self, _l: &DeadLetter, record: Option<&FakeRecord>) -> Result<(), RunError> {
            self.hand(record.expect("kept"));
            Ok(())
        }
        async fn checkpoint(&mut self, acks: &mut Acks) -> Result<(), RunError> {
            // Like the Kafka sink: wait until everything handed over is durable, then commit what acks allows.
            tokio::time::sleep(self.durable_after).await;
            let batch = acks.take();
            let mut log = self.log.lock().unwrap();
            let handed = std::mem::take(&mut log.handed);
            log.durable.extend(handed);
            for (p, next) in &batch {
                for (bp, bo, parts, written) in self.positions.iter().filter(|(rp, o, _, _)| rp == p && o < next) {
                    let below = (bp, bo);
                    let done = |part: usize| {
                        let key = (bp.clone(), *bo, part);
                        log.finished.contains(&key) && log.durable.contains(&key)
                    };
                    if !(0..*parts).all(done) {
                        let v = format!("commit {p:?}@{next} passed {below:?} (finished or durable: not yet)");
                        log.violations.push(v);
                    }
                    let stored = |part: usize| log.stored.contains(&(bp.clone(), *bo, part));
                    if *written && !(0..*parts).all(stored) {
                        log.violations.push(format!("commit {p:?}@{next} passed {below:?} (store write: not yet)"));
                    }
                }
            }
            log.commits.extend(batch.iter().cloned());
            if !batch.is_empty() {
                log.commit_times.push(self.started.elapsed());
            }
            drop(log);
            acks.committed(&batch);
            Ok(())
        }
    }

    struct FakeIntake;

    impl IntakeControl for FakeIntake {
        fn request_stop(&mut self) {}
        fn answers_requests(&self) -> bool {
            true
        }
        fn take_thread(&mut self, _interrupted: bool) -> Option<std::thread::JoinHandle<()>> {
            None
        }
    }

    /// A record's partition, offset and how its work ends.
    type Position = (Partition, i64, Outcome);

    fn partition(n: i32) -> Partition {
        (Arc::from("notes"), n)
    }

    /// How a case commits and how its intake paces the records.
    #[derive(Clone, Copy)]
    struct Pace {
        interval_ms: u64,
        /// `RunnerOptions::commit_when_idle`.
        idle_ms: Option<u64>,
        /// Between two messages, the intake waits this long.
        gap_ms: u64,
        /// After the last message, the intake stays open this long before it ends.
        linger_ms: u64,
    }

    const PACE: Pace = Pace { interval_ms: 7, idle_ms: None, gap_ms: 0, linger_ms: 0 };

    /// Runs one case; returns the log, the records, and the runner's result.
    fn run_case(
        events: Vec<(i32, u64, Outcome, usize)>,
        revoke_every: usize,
        in_flight: usize,
    ) -> (Log, Vec<Position>, Result<(), RunError>) {
        run_paced(events, revoke_every, in_flight, PACE)
    }

    fn run_paced(
        events: Vec<(i32, u64, Outcome, usize)>,
        revoke_every: usize,
        in_flight: usize,
        pace: Pace,
    ) -> (Log, Vec<Position>, Result<(), RunError>) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async move {
            let log = Arc::new(Mutex::new(Log::default()));
            let ledger = Arc::new(Ledger::default());
            let partitions: Vec<Partition> = (0..3).map(partition).collect();
            ledger.assign(&partitions);
            let (tx, rx) = mpsc::channel(4);
            let mut next: BTreeMap<i32, i64> = BTreeMap::new();
            let mut records = Vec::new();
            for (p, _, outcome, _) in &events {
                let offset = next.entry(*p).or_insert(0);
                records.push((partition(*p), *offset, *outcome));
                *offset += 1;
            }
            let parts_of: Vec<usize> = events.iter().map(|e| e.3.max(1)).collect();
            let feed = records.clone();
            let feed_ledger = Arc::clone(&ledger);
            let works: Vec<u64> = events.iter().map(|e| e.1).collect();
            let feed_parts = parts_of.clone();
            let intake = tokio::spawn(async move {
                for (i, ((p, offset, outcome), work_ms)) in feed.into_iter().zip(works).enumerate() {
                    if pace.gap_ms > 0 && i > 0 {
                        tokio::time::sleep(Duration::from_millis(pace.gap_ms)).await;
                    }
                    if revoke_every > 0 && i > 0 && i % revoke_every == 0 {
                        // A rebalance: the runner drains and checkpoints, then the partitions go and come back.
                        let (done, answered) = std::sync::mpsc::sync_channel(1);
                        let all: Vec<Partition> = (0..3).map(partition).collect();
                        if tx.send(Intake::Revoking { partitions: all.clone(), done }).await.is_err() {
                            return;
                        }
                        while answered.try_recv().is_err() {
                            if tx.is_closed() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        feed_ledger.revoke(&all);
                        feed_ledger.assign(&all);
                        let _ = tx.send(Intake::Assigned(all)).await;
                    }
                    // A message's parts go in one run (the Kafka intake pushes a Bundle's entries together);
                    // earlier parts take longer, so later ones finish first.
                    let parts = feed_parts[i];
                    for part in 0..parts {
                        let work_ms = work_ms + 5 * (parts - 1 - part) as u64;
                        let record = FakeRecord { partition: p.clone(), offset, work_ms, outcome, part, parts };
                        if tx.send(Intake::Record(record)).await.is_err() {
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(pace.linger_ms)).await;
            });
            let work = FakeWork(Arc::clone(&log), Arc::new(FakeStore::start(Arc::clone(&log))));
            let positions = records
                .iter()
                .zip(&parts_of)
                .map(|((p, o, outcome), n)| (p.clone(), *o, *n, *outcome == Outcome::Written))
                .collect();
            let mut outputs = FakeOutputs {
                log: Arc::clone(&log),
                durable_after: Duration::from_millis(3),
                positions,
                started: tokio::time::Instant::now(),
            };
            let mut acks = Acks::new(ledger, None);
            let opts = RunnerOptions {
                in_flight,
                max_message_bytes: 1 << 20,
                commit_interval: Some(Duration::from_millis(pace.interval_ms)),
                commit_when_idle: pace.idle_ms.map(Duration::from_millis),
            };
            let mut runner = Runner::new(opts, &work, &mut outputs, &mut acks);
            let result = runner.run(rx, &mut FakeIntake, std::future::pending()).await;
            intake.abort();
            let log = std::mem::take(&mut *log.lock().unwrap());
            (log, records, result)
        })
    }

    fn event() -> impl Strategy<Value = (i32, u64, Outcome, usize)> {
        let outcome = prop_oneof![8 => Just(Outcome::Written), 2 => Just(Outcome::Dead), 1 => Just(Outcome::Halt)];
        let parts = prop_oneof![6 => Just(1usize), 2 => Just(2usize), 1 => Just(4usize)];
        (0..3i32, 0..40u64, outcome, parts)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn never_committed_past_unfinished_work_nor_ahead_of_outputs(
            events in proptest::collection::vec(event(), 1..60),
            revoke_every in 0usize..20,
            in_flight in 1usize..12,
            idle_ms in proptest::option::of(1u64..20),
            gap_ms in prop_oneof![3 => Just(0u64), 1 => 1u64..30],
        ) {
            let pace = Pace { idle_ms, gap_ms, linger_ms: 25, ..PACE };
            let (log, records, result) = run_paced(events, revoke_every, in_flight, pace);
            // The first halting record, in intake order: nothing at or after it may be committed.
            let halt_at = records.iter().position(|r| r.2 == Outcome::Halt);
            prop_assert_eq!(result.is_err(), halt_at.is_some(), "a halt code stops the run");
            prop_assert!(log.violations.is_empty(), "{:?}", log.violations);
            for (p, next) in &log.commits {
                if let Some(h) = halt_at {
                    let (hp, ho, _) = &records[h];
                    prop_assert!(!(hp == p && *next > *ho), "committed past the halting record {hp:?}@{ho}");
                }
            }
            if halt_at.is_none() {
                // Without a halt every partition ends committed at its end.
                let mut ends: BTreeMap<Partition, i64> = BTreeMap::new();
                for (p, o, _) in &records {
                    ends.insert(p.clone(), o + 1);
                }
                for (p, end) in ends {
                    let last = log.commits.iter().filter(|c| c.0 == p).map(|c| c.1).max();
                    prop_assert_eq!(last, Some(end), "{:?} committed to its end", p);
                }
            }
        }
    }

    #[test]
    fn grouped_store_writes_that_fail_and_finish_out_of_order_never_let_a_commit_pass_them() {
        let events: Vec<_> = (0..48u64).map(|i| ((i % 3) as i32, i * 7 % 13, Outcome::Written, 1)).collect();
        let (log, records, result) = run_case(events, 5, 12);
        assert!(result.is_ok());
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert!(log.largest_group > 1, "writes were applied in groups");
        assert!(log.failed_groups > 0, "some groups failed and their documents asked again");
        assert_eq!(log.stored.len(), records.len(), "every document's write was applied once it was committed");
    }

    #[test]
    fn the_front_waits_for_a_slow_document_before_later_ones_commit() {
        // Offset 0 takes 100 ms, offsets 1..5 take 1 ms: no commit may pass offset 0 before it is done.
        let mut events = vec![(0, 100, Outcome::Written, 1)];
        events.extend((0..5).map(|_| (0, 1, Outcome::Written, 1)));
        let (log, _, result) = run_case(events, 0, 8);
        result.unwrap();
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert_eq!(log.commits.iter().map(|c| c.1).max(), Some(6));
        assert!(log.commits.iter().all(|c| c.1 == 6), "the only commit is after the slow front: {:?}", log.commits);
    }

    #[test]
    fn a_bundle_offset_waits_for_its_slowest_entry() {
        // Offset 0 is a Bundle of 4 entries (the first is slowest); offset 1 is quick: no commit passes offset 0
        // until every entry of it is done and durable.
        let events = vec![(0, 60, Outcome::Written, 4), (0, 1, Outcome::Written, 1)];
        let (log, _, result) = run_case(events, 0, 8);
        result.unwrap();
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert_eq!(log.finished.len(), 5);
        assert_eq!(log.commits.iter().map(|c| c.1).max(), Some(2));
    }

    #[test]
    fn an_idle_runner_commits_what_it_finished_without_waiting_for_the_interval() {
        // Five quick documents, then the intake stays open (a quiet topic) for 2 s; the interval is a minute.
        let events: Vec<_> = (0..5).map(|_| (0, 1, Outcome::Written, 1)).collect();
        let pace = Pace { interval_ms: 60_000, idle_ms: Some(5), gap_ms: 0, linger_ms: 2_000 };
        let (log, _, result) = run_paced(events.clone(), 0, 8, pace);
        result.unwrap();
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert_eq!(log.commits.first().map(|c| c.1), Some(5), "one commit of all five: {:?}", log.commits);
        assert!(log.commit_times[0] < Duration::from_millis(100), "committed at {:?}", log.commit_times);
        assert_eq!(log.commit_times.len(), 1, "nothing new to commit afterwards: {:?}", log.commit_times);
        // Without it, the documents wait for the end of the run (or the interval).
        let (log, _, result) = run_paced(events, 0, 8, Pace { idle_ms: None, ..pace });
        result.unwrap();
        assert!(log.commit_times[0] >= Duration::from_millis(2_000), "committed at {:?}", log.commit_times);
    }

    #[test]
    fn idle_commits_follow_a_trickle_but_not_a_stream() {
        // A document every 30 ms, each done in 1 ms: the runner is idle between them, so each is committed on its
        // own, 5 ms after it finished.
        let events: Vec<_> = (0..6).map(|_| (0, 1, Outcome::Written, 1)).collect();
        let trickle = Pace { interval_ms: 60_000, idle_ms: Some(5), gap_ms: 30, linger_ms: 500 };
        let (log, _, result) = run_paced(events.clone(), 0, 8, trickle);
        result.unwrap();
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert_eq!(log.commits.iter().map(|c| c.1).collect::<Vec<_>>(), (1..=6).collect::<Vec<i64>>());
        // A document every 2 ms, each done in 4 ms: never idle for 5 ms until the last, so one commit.
        let events: Vec<_> = (0..6).map(|_| (0, 4, Outcome::Written, 1)).collect();
        let (log, _, result) = run_paced(events, 0, 8, Pace { gap_ms: 2, ..trickle });
        result.unwrap();
        assert_eq!(log.commits, vec![(partition(0), 6)], "{:?}", log.commit_times);
        assert!(log.commit_times[0] < Duration::from_millis(100), "committed at {:?}", log.commit_times);
    }
}
