//! Wiring: a source feeds the stages, the stages feed the sinks, and a summary says what happened.
//!
//! File mode (`run_files`): the file source reads on its own thread into a bounded channel
//! (`pipeline.source_channel`); each event is processed on the blocking pool (`spawn_blocking`, at most
//! `pipeline.workers` threads); at most `pipeline.in_flight` events are in flight, and results are handed to the
//! sink in input order (a queue of in-flight tasks, completed front first). When the queue is full the runner
//! waits for its oldest task before reading more — that, and the bounded channel, is the backpressure.
//!
//! Shutdown (`shutdown` resolves, e.g. on SIGINT/SIGTERM): stop reading, finish what is in flight, flush the
//! sinks, return the summary. A source or sink I/O error halts the run with an error.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, error, info};

use crate::config::Settings;
use crate::error::{DocError, ErrorCode, Stage};
use crate::health::{self, Readiness};
use crate::index::Indexer;
use crate::model::Document;
use crate::sink::file::FileSink;
use crate::sink::{DeadLetter, Sink, SinkError};
use crate::source::file::{self, Input};
use crate::source::{Origin, SourceError, SourceEvent};
use crate::stages::{Pipeline, Rejected};
use crate::telemetry::metrics::metrics;

/// What `clinstream run` was asked to do (file mode).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub inputs: Vec<Input>,
    pub out_dir: PathBuf,
    pub include_text: bool,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

/// A run that had to stop.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("invalid configuration:\n{0}")]
    Config(String),
    #[error("could not listen on metrics.addr {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    /// Kafka mode: a failure that stops the worker without committing (the message is PHI-free).
    #[error("{code}: {detail}")]
    Kafka { code: ErrorCode, detail: String },
    /// Embedding or the vector store failed for good (the message is PHI-free).
    #[error("{code}: {detail}")]
    Index { code: ErrorCode, detail: String },
    /// The embedding model or the store could not be started.
    #[error("{0}")]
    IndexStartup(String),
}

impl RunError {
    pub fn code(&self) -> ErrorCode {
        match self {
            RunError::Source(_) => ErrorCode::SourceIo,
            RunError::Sink(_) => ErrorCode::SinkIo,
            RunError::Config(_) => ErrorCode::ConfigInvalid,
            RunError::Listen { .. } => ErrorCode::ListenFailed,
            RunError::Kafka { code, .. } | RunError::Index { code, .. } => *code,
            RunError::IndexStartup(_) => ErrorCode::EmbedFailed,
        }
    }
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

/// An event's processing: still running on the pool, finished, or rejected without it (oversized).
pub(crate) enum Pending {
    Task(JoinHandle<Result<Document, Rejected>>),
    Done(Box<Result<Document, Rejected>>),
    Rejected(Rejected),
}

/// The oldest in-flight task's result (pending forever when the front is not a running task).
async fn front_done(in_flight: &mut VecDeque<(Origin, Pending)>) -> Result<Document, Rejected> {
    match in_flight.front_mut() {
        Some((origin, pending)) => task_done(origin, pending).await,
        None => std::future::pending().await,
    }
}

/// A running task's result (pending forever when `pending` is not a running task).
pub(crate) async fn task_done(origin: &Origin, pending: &mut Pending) -> Result<Document, Rejected> {
    match pending {
        Pending::Task(task) => task.await.unwrap_or_else(|join_error| panicked(origin, join_error)),
        _ => std::future::pending().await,
    }
}

/// The result of an in-flight entry, waiting for it if it still runs.
pub(crate) async fn into_result(origin: &Origin, pending: Pending) -> Result<Document, Rejected> {
    match pending {
        Pending::Rejected(r) => Err(r),
        Pending::Done(r) => *r,
        Pending::Task(task) => task.await.unwrap_or_else(|join_error| panicked(origin, join_error)),
    }
}

/// Starts the embedder and opens the store when indexing is on (`embed.enabled` and a store); sets build info.
pub(crate) async fn start_indexer(settings: &Settings, pipeline: &Pipeline) -> Result<Option<Arc<Indexer>>, RunError> {
    let version = crate::sink::records::WORKER_VERSION;
    let lexicon = pipeline.lexicon().version();
    if !settings.embed.enabled || settings.store.kind == "none" {
        metrics().build_info.with_label_values(&[version, lexicon, "none", "none"]).set(1);
        return Ok(None);
    }
    let indexer = Indexer::start(settings, pipeline.compiled()).await.map_err(RunError::IndexStartup)?;
    let info = indexer.embedder().info();
    metrics().build_info.with_label_values(&[version, lexicon, &info.name, info.provider]).set(1);
    info!(store = indexer.store().kind(), model = %info.name, "Indexing chunks.");
    Ok(Some(Arc::new(indexer)))
}

/// One event's work as a task: the text stages on the blocking pool, then (when indexing) chunks, vectors and
/// points, awaited before the document counts as done.
pub(crate) fn spawn_document(
    pipeline: Arc<Pipeline>,
    indexer: Option<Arc<Indexer>>,
    process: impl FnOnce(&Pipeline) -> Result<Document, Rejected> + Send + 'static,
) -> JoinHandle<Result<Document, Rejected>> {
    tokio::spawn(async move {
        let doc = match tokio::task::spawn_blocking(move || process(&pipeline)).await {
            Ok(result) => result?,
            Err(join_error) => {
                error!(panic = join_error.is_panic(), "A stage failed unexpectedly.");
                return Err(Rejected {
                    error: DocError::new(ErrorCode::InternalError, Stage::Decode, "a stage failed unexpectedly"),
                    doc_id: None,
                });
            }
        };
        if let Some(indexer) = indexer {
            let clock = Instant::now();
            if let Err(error) = indexer.index(&doc).await {
                return Err(Rejected { error, doc_id: Some(doc.note.doc_id.clone()) });
            }
            metrics().stage_duration.with_label_values(&["index"]).observe(clock.elapsed().as_secs_f64());
        }
        Ok(doc)
    })
}

/// A rejection whose code halts the worker (the index failed) rather than dead-lettering the event.
pub(crate) fn halting(rejected: &Rejected) -> Option<RunError> {
    (rejected.error.disposition() == crate::error::Disposition::Halt)
        .then(|| RunError::Index { code: rejected.error.code, detail: rejected.error.detail.clone() })
}

/// Serves /metrics, /healthz and /readyz when enabled; the returned readiness starts false.
pub(crate) async fn start_health(settings: &Settings) -> Result<Readiness, RunError> {
    let readiness = Readiness::default();
    if settings.metrics.enabled {
        let addr = health::serve(&settings.metrics.addr, readiness.clone())
            .await
            .map_err(|source| RunError::Listen { addr: settings.metrics.addr.clone(), source })?;
        info!(addr = %addr, "Serving /metrics, /healthz and /readyz.");
    }
    Ok(readiness)
}

/// Metrics of a document whose outputs were handed to the sink (`sink_took`: the sink's share).
pub(crate) fn observe_document(doc: &Document, sink_took: Duration) {
    let m = metrics();
    m.documents_finished.with_label_values(&["written"]).inc();
    for (stage, took) in doc.timings.stages() {
        m.stage_duration.with_label_values(&[stage]).observe(took.as_secs_f64());
    }
    m.stage_duration.with_label_values(&["sink"]).observe(sink_took.as_secs_f64());
    for mention in &doc.mentions {
        m.mentions.with_label_values(&[mention.kind.as_str()]).inc();
    }
    for v in &doc.variables {
        m.context_tokens.observe(v.context_tokens as f64);
    }
}

/// Metrics of a dead-lettered event.
pub(crate) fn observe_dead_letter(code: ErrorCode) {
    let m = metrics();
    m.documents_finished.with_label_values(&["dead_lettered"]).inc();
    m.dead_letters.with_label_values(&[code.as_str()]).inc();
}

fn panicked(origin: &Origin, join_error: tokio::task::JoinError) -> Result<Document, Rejected> {
    error!(origin = %origin, panic = join_error.is_panic(), "A stage failed unexpectedly.");
    Err(Rejected {
        error: DocError::new(ErrorCode::InternalError, Stage::Decode, "a stage failed unexpectedly"),
        doc_id: None,
    })
}

/// Runs the file source through the stages into the file sink.
pub async fn run_files(
    settings: &Settings,
    opts: RunOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, RunError> {
    let startup = Instant::now();
    let readiness = start_health(settings).await?;
    let plan = file::plan(&opts.inputs)?;
    let pipeline = Arc::new(Pipeline::new(settings).map_err(RunError::Config)?);
    let indexer = start_indexer(settings, &pipeline).await?;
    let startup = startup.elapsed();
    let m = metrics();
    m.startup_duration.set(startup.as_secs_f64());
    let started = Instant::now();
    let progress = progress_bar(opts.progress, &plan);
    let mut sink =
        FileSink::create(&opts.out_dir, opts.include_text || settings.output.include_text, pipeline.compiled())?;
    let mut summary = Summary { outputs: sink.paths().to_vec(), startup, ..Summary::default() };
    info!(
        files = plan.files.len(),
        stdin = plan.stdin,
        workers = settings.worker_threads(),
        in_flight = settings.pipeline.in_flight,
        "Starting file run."
    );

    let (tx, mut rx) = mpsc::channel::<file::Item>(settings.pipeline.source_channel);
    let reader = file::spawn(plan, settings.input.max_message_bytes, tx);
    let capacity = settings.pipeline.in_flight;
    let mut in_flight: VecDeque<(Origin, Pending)> = VecDeque::with_capacity(capacity);
    let mut failure: Option<RunError> = None;
    readiness.set(true);
    tokio::pin!(shutdown);

    loop {
        if in_flight.len() >= capacity {
            if let Err(e) = finish_oldest(&mut in_flight, &mut sink, &mut summary).await {
                failure = Some(e);
                break;
            }
            continue;
        }
        // Hand finished documents to the sink as soon as the oldest is done, not only when the queue is full: a
        // slow source must not hold results (and, with Kafka, acknowledgements) back.
        while matches!(in_flight.front(), Some((_, Pending::Rejected(_)))) {
            if let Err(e) = finish_oldest(&mut in_flight, &mut sink, &mut summary).await {
                failure = Some(e);
                break;
            }
        }
        if failure.is_some() {
            break;
        }
        let front_is_task = matches!(in_flight.front(), Some((_, Pending::Task(_))));
        let item = tokio::select! {
            biased;
            _ = &mut shutdown => {
                info!(in_flight = in_flight.len(), "Shutdown requested; finishing in-flight documents.");
                summary.interrupted = true;
                break;
            }
            done = front_done(&mut in_flight), if front_is_task => {
                if let Some(front) = in_flight.front_mut() {
                    front.1 = Pending::Done(Box::new(done));
                }
                if let Err(e) = finish_oldest(&mut in_flight, &mut sink, &mut summary).await {
                    failure = Some(e);
                    break;
                }
                continue;
            }
            item = rx.recv() => item,
        };
        match item {
            None => break,
            Some(Err(e)) => {
                failure = Some(e.into());
                break;
            }
            Some(Ok(SourceEvent::Record(envelope))) => {
                summary.read += 1;
                m.documents_consumed.inc();
                m.in_flight.inc();
                let origin = envelope.origin.clone();
                let task =
                    spawn_document(Arc::clone(&pipeline), indexer.clone(), move |p| p.process(&envelope.payload));
                in_flight.push_back((origin, Pending::Task(task)));
            }
            Some(Ok(SourceEvent::Oversized { origin, bytes })) => {
                summary.read += 1;
                m.documents_consumed.inc();
                m.in_flight.inc();
                let error = DocError::new(
                    ErrorCode::MessageTooLarge,
                    Stage::Source,
                    format!("event is {bytes} bytes; the limit is {}", settings.input.max_message_bytes),
                );
                in_flight.push_back((origin, Pending::Rejected(Rejected { error, doc_id: None })));
            }
            Some(Ok(SourceEvent::Progress(bytes))) => {
                m.input_bytes.inc_by(bytes.saturating_sub(summary.bytes));
                summary.bytes = bytes;
                progress.set_position(bytes);
            }
            Some(Ok(SourceEvent::SkippedFile(path))) => {
                summary.skipped_files += 1;
                debug!(path = %path.display(), "Skipping a file of another resource type.");
            }
            Some(Ok(SourceEvent::SkippedResource)) => summary.skipped_resources += 1,
        }
    }
    // Stop the reader (it sees the closed channel) and finish what is in flight, in order.
    drop(rx);
    while !in_flight.is_empty() {
        if let Err(e) = finish_oldest(&mut in_flight, &mut sink, &mut summary).await {
            failure.get_or_insert(e);
            break;
        }
    }
    if let Err(e) = sink.flush() {
        failure.get_or_insert(e.into());
    }
    if let Some(indexer) = &indexer
        && let Err(e) = indexer.store().flush().await
    {
        failure.get_or_insert(RunError::Index { code: ErrorCode::StoreFailed, detail: e.message });
    }
    progress.finish_and_clear();
    readiness.set(false);
    if !summary.interrupted {
        // The reader has sent everything (the channel closed), so it is finishing; join it.
        let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    }
    summary.elapsed = started.elapsed();
    if let Some(e) = failure {
        error!(code = e.code().as_str(), "Run halted.");
        return Err(e);
    }
    info!(
        read = summary.read,
        written = summary.written,
        dead_lettered = summary.dead_lettered(),
        elapsed_s = summary.elapsed.as_secs_f64(),
        "File run finished."
    );
    Ok(summary)
}

async fn finish_oldest(
    in_flight: &mut VecDeque<(Origin, Pending)>,
    sink: &mut impl Sink,
    summary: &mut Summary,
) -> Result<(), RunError> {
    let Some((origin, pending)) = in_flight.pop_front() else { return Ok(()) };
    let result = into_result(&origin, pending).await;
    metrics().in_flight.dec();
    match result {
        Ok(doc) => {
            let clock = Instant::now();
            sink.document(&doc, &origin)?;
            summary.written += 1;
            observe_document(&doc, clock.elapsed());
        }
        Err(rejected) if halting(&rejected).is_some() => {
            error!(code = rejected.error.code.as_str(), origin = %origin, "Indexing failed; stopping.");
            return Err(halting(&rejected).expect("checked"));
        }
        Err(Rejected { error, doc_id }) => {
            observe_dead_letter(error.code);
            debug!(code = error.code.as_str(), stage = error.stage.as_str(), origin = %origin, "Event dead-lettered.");
            *summary.dead_letters.entry(error.code).or_default() += 1;
            sink.dead_letter(&DeadLetter { error, origin, doc_id })?;
        }
    }
    Ok(())
}

fn progress_bar(enabled: bool, plan: &file::Plan) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !enabled || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(plan.total_bytes);
    let template = if plan.stdin {
        "{spinner} {bytes} read ({bytes_per_sec})"
    } else {
        "{bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})"
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}
