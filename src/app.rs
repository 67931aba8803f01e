//! Wiring: which intake, which outputs, one runner (`crate::runner`) between them.
//!
//! * File mode (`run_files`): the file reader thread → the runner → the file sink; no acknowledgements.
//! * Kafka mode (`run_kafka`): connect (indexer, topics, Schema Registry, producer, consumer group; a shutdown
//!   signal ends the wait for an unreachable cluster) → the Kafka source → the runner → the Kafka sink, with the
//!   ack core committing per-partition watermarks every `kafka.commit_interval_ms`, once idle for
//!   `kafka.commit_idle_ms` after a finished document, on every revocation and at shutdown. A halt aborts the open
//!   transaction and returns before committing.
//!
//! Both start the health server first, compile the pipeline (every name check runs here, before the first event),
//! start the indexer when indexing is on, and flush the store at the end.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::ack::{Acks, Ledger};
use crate::config::Settings;
use crate::error::{DocError, ErrorCode, RunError, Stage};
use crate::fhir::Fetcher;
use crate::http::{self, Readiness};
use crate::index::Indexer;
use crate::kafka::{admin, registry};
use crate::model::Document;
use crate::runner::{Runner, RunnerOptions, Summary, Work};
use crate::serve::{Service, routes};
use crate::sink::file::FileSink;
use crate::sink::kafka::Output;
use crate::source::file::{self, Input};
use crate::source::{Record, kafka as kafka_source};
use crate::stages::{Pipeline, Rejected, Step};
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

/// The worker's work for one record: the text stages on the CPU pool (`pool`) (with a fetch first when the note is
/// only referenced), then (when indexing) chunks, vectors and points, awaited before the document counts as done.
pub struct PipelineWork {
    pub pipeline: Arc<Pipeline>,
    pub indexer: Option<Arc<Indexer>>,
    /// Fetches referenced attachments (`fhir.base_url` / `fhir.allowed_hosts` set); `None`: fetching is off.
    pub fetcher: Option<Arc<Fetcher>>,
}

impl<R: Record> Work<R> for PipelineWork {
    fn spawn(&self, record: Arc<R>) -> JoinHandle<Result<Document, Rejected>> {
        spawn_document(Arc::clone(&self.pipeline), self.indexer.clone(), self.fetcher.clone(), move |p| {
            p.start(record.payload())
        })
    }
}

/// One event's work as a task: the text stages on the CPU pool (a referenced attachment fetched in between),
/// then (when indexing) chunks, vectors and points, awaited before the document counts as done.
pub fn spawn_document(
    pipeline: Arc<Pipeline>,
    indexer: Option<Arc<Indexer>>,
    fetcher: Option<Arc<Fetcher>>,
    start: impl FnOnce(&Pipeline) -> Result<Step, Rejected> + Send + 'static,
) -> JoinHandle<Result<Document, Rejected>> {
    tokio::spawn(crate::pool::enter(async move {
        let p = Arc::clone(&pipeline);
        let step = on_cpu_pool(move || start(&p)).await?;
        let doc = match step {
            Step::Done(doc) => *doc,
            Step::Fetch(pending) => {
                let doc_id = Some(pending.doc_id().to_string());
                let Some(fetcher) = fetcher else {
                    // `decode.fetch_references` follows the same settings as the fetcher, so this is a bug.
                    return Err(Rejected {
                        error: DocError::new(ErrorCode::InternalError, Stage::Fetch, "no FHIR client to fetch with"),
                        doc_id,
                    });
                };
                let clock = Instant::now();
                let fetched = fetcher.fetch(&pending.url).await.map_err(|error| Rejected { error, doc_id })?;
                metrics().stage_duration.with_label_values(&["fetch"]).observe(clock.elapsed().as_secs_f64());
                let p = Arc::clone(&pipeline);
                on_cpu_pool(move || p.resume(pending, fetched)).await?
            }
        };
        let Some(indexer) = indexer else { return Ok(doc) };
        let clock = Instant::now();
        let doc = Arc::new(doc);
        if let Err(error) = indexer.index(&doc).await {
            return Err(Rejected { error, doc_id: Some(doc.note.doc_id.clone()) });
        }
        metrics().stage_duration.with_label_values(&["index"]).observe(clock.elapsed().as_secs_f64());
        // The indexing steps are done with it, so this is the only reference left.
        Ok(Arc::try_unwrap(doc).unwrap_or_else(|shared| (*shared).clone()))
    }))
}

/// Runs a stage call on the CPU pool (`pool`, in the document's turn); a panic there becomes an `internal_error`
/// dead letter.
async fn on_cpu_pool<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Rejected> + Send + 'static,
) -> Result<T, Rejected> {
    match crate::pool::run(f).await {
        Ok(result) => result,
        Err(crate::pool::Panicked) => {
            error!(panic = true, "A stage failed unexpectedly.");
            Err(Rejected {
                error: DocError::new(ErrorCode::InternalError, Stage::Decode, "a stage failed unexpectedly"),
                doc_id: None,
            })
        }
    }
}

/// The FHIR client when fetching is on (`fhir.base_url` or `fhir.allowed_hosts`); a bad key or URL stops here.
pub fn start_fetcher(settings: &Settings) -> Result<Option<Arc<Fetcher>>, RunError> {
    if !settings.fhir.fetching() {
        return Ok(None);
    }
    let fetcher = Fetcher::new(&settings.fhir, settings.decode.max_attachment_bytes)
        .map_err(|e| RunError::Config(e.to_string()))?;
    info!(smart = !settings.fhir.smart.token_url.is_empty(), "Fetching referenced attachments from FHIR.");
    Ok(Some(Arc::new(fetcher)))
}

/// Starts the embedder and opens the store when indexing is on (`embed.enabled` and a store); sets build info.
pub async fn start_indexer(settings: &Settings, pipeline: &Pipeline) -> Result<Option<Arc<Indexer>>, RunError> {
    let version = crate::WORKER_VERSION;
    let lexicon = pipeline.lexicon().version();
    if !settings.embed.enabled || settings.store.kind == "none" {
        metrics().build_info.with_label_values(&[version, lexicon, "none", "none"]).set(1);
        return Ok(None);
    }
    let indexer =
        Indexer::start(settings, pipeline.compiled()).await.map_err(|e| RunError::halt(e.code(), e.to_string()))?;
    let info = indexer.embedder().info();
    metrics().build_info.with_label_values(&[version, lexicon, &info.name, info.provider]).set(1);
    info!(store = indexer.store().kind(), model = %info.name, "Indexing chunks.");
    Ok(Some(Arc::new(indexer)))
}

/// Serves /metrics, /healthz and /readyz when enabled; the returned readiness starts false.
pub async fn start_health(settings: &Settings) -> Result<Readiness, RunError> {
    let readiness = Readiness::default();
    if settings.metrics.enabled {
        let addr = http::serve(&settings.metrics.addr, readiness.clone())
            .await
            .map_err(|source| RunError::Listen { addr: format!("metrics.addr {}", settings.metrics.addr), source })?;
        info!(addr = %addr, "Serving /metrics, /healthz and /readyz.");
    }
    Ok(readiness)
}

/// With `serve.enabled`, serves the query API beside the worker: the same process, the same embedder and the same
/// store handle (an embedded store is locked by the process that opens it, so a second process could not read
/// it while the worker writes). Returns once the service listens and its label index is built.
pub async fn start_service(
    settings: &Settings,
    pipeline: &Arc<Pipeline>,
    indexer: Option<&Arc<Indexer>>,
    readiness: &Readiness,
) -> Result<(), RunError> {
    if !settings.serve.enabled {
        return Ok(());
    }
    let Some(indexer) = indexer else {
        return Err(RunError::Config(
            "serve.enabled: the query service reads the store the worker indexes into; it needs embed.enabled and a \
             store"
                .into(),
        ));
    };
    let service = Service::new(settings, Arc::clone(pipeline), indexer.embedder().clone(), Arc::clone(indexer.store()))
        .map_err(|e| RunError::Config(format!("serve: {e:#}")))?;
    service.prepare().await.map_err(|e| RunError::halt(e.code(), e.to_string()))?;
    let (addr, _task) =
        routes::serve(&settings.serve.addr, Arc::new(service), readiness.clone(), std::future::pending())
            .await
            .map_err(|source| RunError::Listen { addr: format!("serve.addr {}", settings.serve.addr), source })?;
    info!(addr = %addr, "Serving the query API beside the worker.");
    Ok(())
}

/// `clinstream serve`: the query service alone, reading the configured store (`store.alias` when set) until
/// `shutdown` resolves. An unreachable store at start-up is waited for (`store.halt_after_ms`), like a worker does.
pub async fn run_service(
    settings: &Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    settings.serve.check_auth().map_err(RunError::Config)?;
    let readiness = Readiness::default();
    let pipeline = compile(settings)?;
    let embedder = crate::embed::Embedder::start_async(&settings.embed)
        .await
        .map_err(|e| RunError::halt(e.code(), e.to_string()))?;
    let store = open_for_reading(settings).await?;
    let service = Service::new(settings, pipeline, embedder, Arc::new(store))
        .map_err(|e| RunError::Config(format!("serve: {e:#}")))?;
    let service = Arc::new(service);
    service.watch_store(std::time::Duration::from_secs(2));
    let (addr, task) = routes::serve(&settings.serve.addr, Arc::clone(&service), readiness.clone(), shutdown)
        .await
        .map_err(|source| RunError::Listen { addr: format!("serve.addr {}", settings.serve.addr), source })?;
    info!(addr = %addr, store = service.store().kind(), "Query service listening; building the label index.");
    service.prepare().await.map_err(|e| RunError::halt(e.code(), e.to_string()))?;
    readiness.set(true);
    info!("Query service ready.");
    let _ = task.await;
    readiness.set(false);
    info!("Query service stopped.");
    Ok(())
}

/// Opens the configured store for reading, waiting out an unavailable one for `store.halt_after_ms`.
pub async fn open_for_reading(settings: &Settings) -> Result<crate::store::Store, RunError> {
    let halt_after = std::time::Duration::from_millis(settings.store.halt_after_ms);
    let mut backoff = crate::backoff::Backoff::new(
        std::time::Duration::from_millis(200),
        std::time::Duration::from_secs(5),
        halt_after,
    );
    loop {
        match crate::store::Store::open_existing(&settings.store).await {
            Ok(s) => return Ok(s),
            Err(e) if e.is_transient() => match backoff.failed_with(e.retry_after()) {
                Some(wait) => {
                    warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "Vector store unavailable; retrying.");
                    tokio::time::sleep(wait).await;
                }
                None => return Err(RunError::halt(e.code(), e.to_string())),
            },
            Err(e) => return Err(RunError::halt(e.code(), e.to_string())),
        }
    }
}

fn compile(settings: &Settings) -> Result<Arc<Pipeline>, RunError> {
    Pipeline::new(settings).map(Arc::new).map_err(|e| RunError::Config(e.problems().join("\n")))
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
    let pipeline = compile(settings)?;
    let fetcher = start_fetcher(settings)?;
    let indexer = start_indexer(settings, &pipeline).await?;
    start_service(settings, &pipeline, indexer.as_ref(), &readiness).await?;
    let startup = startup.elapsed();
    metrics().startup_duration.set(startup.as_secs_f64());
    let started = Instant::now();
    let progress = progress_bar(opts.progress, &plan);
    let mut sink =
        FileSink::create(&opts.out_dir, opts.include_text || settings.output.include_text, pipeline.compiled())?;
    let outputs = sink.paths().to_vec();
    info!(
        files = plan.files.len(),
        stdin = plan.stdin,
        workers = settings.worker_threads(),
        in_flight = settings.pipeline.in_flight,
        "Starting file run."
    );

    let (tx, rx) = mpsc::channel::<file::Item>(settings.pipeline.source_channel);
    let mut reading = file::Reading::new(file::spawn(plan, settings.input.max_message_bytes, tx));
    let work = PipelineWork { pipeline, indexer: indexer.clone(), fetcher };
    let mut acks = Acks::new(Arc::new(Ledger::default()), None);
    let opts = RunnerOptions {
        in_flight: settings.pipeline.in_flight,
        max_message_bytes: settings.input.max_message_bytes,
        commit_interval: None,
        commit_when_idle: None,
    };
    let mut runner = Runner::new(opts, &work, &mut sink, &mut acks);
    readiness.set(true);
    // The progress bar follows the runner's byte count.
    let result = {
        let run = runner.run(rx, &mut reading, shutdown);
        tokio::pin!(run);
        let mut every = tokio::time::interval(std::time::Duration::from_millis(200));
        loop {
            tokio::select! {
                r = &mut run => break r,
                _ = every.tick(), if !progress.is_hidden() => progress.set_position(metrics().input_bytes.get()),
            }
        }
    };
    let mut summary = std::mem::take(&mut runner.summary);
    let mut failure = result.err();
    if let Some(indexer) = &indexer {
        // The notes are indexed; a file run also waits for the summary vectors still being embedded and the
        // summaries the LLM is still writing (each call bounded by llm.timeout_ms), so the store it leaves holds them.
        let pending = indexer.tree_work_pending();
        if pending > 0 && failure.is_none() {
            info!(patients = pending, "Finishing summary trees.");
            indexer.tree_work_settled().await;
        }
        if let Err(e) = indexer.store().flush().await {
            failure.get_or_insert(RunError::halt(e.code(), e.to_string()));
        }
    }
    progress.finish_and_clear();
    readiness.set(false);
    summary.startup = startup;
    summary.outputs = outputs;
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

/// Runs the worker against Kafka until `shutdown` resolves (then drains, commits and returns) or a halt.
///
/// A Kafka client in a fatal state — the consumer fenced (`consumer_fatal`: a restarted broker that forgot the
/// static member, or another member with the same `group.instance.id`), or a transactional producer that hit a
/// fatal error — is rebuilt in-process, at most `kafka.rebuilds_max` times within `kafka.rebuilds_window_ms`: the
/// round's open transaction is aborted, the consumer and producer are closed and made again, and the new consumer
/// resumes from the committed offsets (what a restart would do), while the model, the store, the query service and
/// the health endpoints stay up. Past the budget the worker halts as before, and its restart resumes.
pub async fn run_kafka(settings: &Settings, shutdown: impl Future<Output = ()>) -> Result<Summary, RunError> {
    let startup = Instant::now();
    let readiness = start_health(settings).await?;
    let pipeline = compile(settings)?;
    let fetcher = start_fetcher(settings)?;
    let k = &settings.kafka;
    tokio::pin!(shutdown);
    // Connecting can wait on an unreachable cluster for up to `kafka.halt_after_ms`; a shutdown signal ends it.
    let connect = async {
        let indexer = start_indexer(settings, &pipeline).await?;
        start_service(settings, &pipeline, indexer.as_ref(), &readiness).await?;
        if k.create_topics {
            admin::ensure_topics(k).await?;
        }
        let framing = registry::output_framing(k).await?;
        Ok::<_, RunError>((indexer, framing))
    };
    let (indexer, framing) = tokio::select! {
        connected = connect => connected?,
        _ = &mut shutdown => {
            info!("Shutdown requested while connecting; nothing was consumed.");
            return Ok(Summary { interrupted: true, ..Summary::default() });
        }
    };
    let work = PipelineWork { pipeline, indexer: indexer.clone(), fetcher };
    let opts = RunnerOptions {
        in_flight: settings.pipeline.in_flight,
        max_message_bytes: settings.input.max_message_bytes,
        commit_interval: Some(std::time::Duration::from_millis(k.commit_interval_ms)),
        commit_when_idle: (k.commit_idle_ms > 0).then(|| std::time::Duration::from_millis(k.commit_idle_ms)),
    };
    let mut rebuilds = Rebuilds::new(k);
    let mut total = Summary::default();
    let started = Instant::now();
    let mut first = true;
    loop {
        // One round: a consumer and a producer, from the committed offsets.
        let ledger = Arc::new(Ledger::default());
        let clients = async {
            let (intake, rx) = kafka_source::start(settings, &ledger)?;
            let output =
                Output::new(settings, work.pipeline.lexicon().version(), framing.clone(), Arc::clone(&intake.consumer))
                    .await?;
            Ok::<_, RunError>((intake, rx, output))
        };
        let (mut intake, rx, mut output) = tokio::select! {
            made = clients => made?,
            _ = &mut shutdown => {
                info!("Shutdown requested while connecting; nothing more was consumed.");
                total.interrupted = true;
                return Ok(total);
            }
        };
        if std::mem::take(&mut first) {
            let startup = startup.elapsed();
            metrics().startup_duration.set(startup.as_secs_f64());
            total.startup = startup;
            info!(
                topics = ?k.topics,
                group = %k.group_id,
                transactions = k.transactions,
                in_flight = settings.pipeline.in_flight,
                "Consuming from Kafka."
            );
        }
        let mut acks = Acks::new(ledger, Some(&k.dead_letters));
        let mut runner = Runner::new(opts.clone(), &work, &mut output, &mut acks);
        readiness.set(true);
        let result = runner.run(rx, &mut intake, shutdown.as_mut()).await;
        total.absorb(std::mem::take(&mut runner.summary));
        readiness.set(false);
        total.elapsed = started.elapsed();
        match result {
            Ok(()) => {
                if let Some(indexer) = &indexer
                    && let Err(e) = indexer.store().flush().await
                {
                    warn!(error = %e, "Could not flush the embedded store (its WAL keeps the points).");
                }
                intake.close();
                info!(
                    read = total.read,
                    written = total.written,
                    dead_lettered = total.dead_lettered(),
                    "Kafka run finished; offsets committed."
                );
                return Ok(total);
            }
            Err(e) => {
                let client = output.fatal_client();
                let rebuild =
                    client.filter(|_| matches!(e.code(), ErrorCode::ConsumerFatal | ErrorCode::DeliveryFailed));
                output.abort().await;
                intake.close();
                drop(output);
                match rebuild.map(|client| (client, rebuilds.next())) {
                    Some((client, Some(pause))) => {
                        warn!(
                            code = e.code().as_str(),
                            client,
                            error = %e,
                            "A Kafka client is in a fatal state: the open transaction is aborted and the consumer and \
                             producer are made again; consuming resumes from the committed offsets."
                        );
                        metrics().kafka_rebuilds.with_label_values(&[client]).inc();
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = &mut shutdown => {
                                total.interrupted = true;
                                return Ok(total);
                            }
                        }
                    }
                    _ => {
                        error!(code = e.code().as_str(), error = %e, "Halting without committing.");
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// The budget of in-process rebuilds: at most `kafka.rebuilds_max` within `kafka.rebuilds_window_ms` (so two
/// members given one `group.instance.id`, which fence each other in turn, end with one halted as before), each
/// after a pause that doubles from `kafka.retry_initial_ms` up to `kafka.retry_max_ms`.
struct Rebuilds {
    max: usize,
    window: std::time::Duration,
    initial: std::time::Duration,
    cap: std::time::Duration,
    at: std::collections::VecDeque<Instant>,
}

impl Rebuilds {
    fn new(k: &crate::config::KafkaSettings) -> Rebuilds {
        Rebuilds {
            max: k.rebuilds_max,
            window: std::time::Duration::from_millis(k.rebuilds_window_ms),
            initial: std::time::Duration::from_millis(k.retry_initial_ms),
            cap: std::time::Duration::from_millis(k.retry_max_ms),
            at: Default::default(),
        }
    }

    /// The pause before the next rebuild, or `None` when the budget is spent.
    fn next(&mut self) -> Option<std::time::Duration> {
        let now = Instant::now();
        while self.at.front().is_some_and(|t| now.duration_since(*t) > self.window) {
            self.at.pop_front();
        }
        if self.at.len() >= self.max {
            return None;
        }
        self.at.push_back(now);
        let doublings = (self.at.len() - 1).min(16) as u32;
        Some(self.initial.saturating_mul(1 << doublings).min(self.cap))
    }
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
