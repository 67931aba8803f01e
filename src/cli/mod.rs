//! The `clinstream` command line: parsing (clap) and dispatch to one module per command — `run` (the worker),
//! `serve` (the query service), `context` and `search` (the read side from a shell), `produce` (events onto a
//! topic), `kg` (materialise the graph), `explain`, `config`, and `docs` (`errors`, `openapi`). The top layer: it
//! may use every module below; nothing in the library imports it. Start-up errors are reported with context (this
//! is the only place that uses `anyhow`); exit statuses are documented in docs/errors.md.
//!
//! The measuring tools — benchmarks, evaluations, the vocabulary build — are another binary, `clinstream-lab`
//! (src/bin/clinstream-lab), over the same library; they do not ship with the worker.

pub mod config;
pub mod context;
pub mod docs;
pub mod explain;
pub mod kg;
pub mod produce;
pub mod run;
pub mod search;
pub mod serve;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::config::Settings;

/// Exit status when the run finished but dead-lettered at least one event.
pub const EXIT_DEAD_LETTERS: u8 = 3;

#[derive(Parser)]
#[command(name = "clinstream", version, about = "Clinical notes (FHIR DocumentReference) to structured data")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Process DocumentReference events: from files, directories or stdin into DIR (--input), or from Kafka
    /// into the output topics (no --input, `kafka.enabled = true`; runs until SIGTERM/SIGINT).
    Run(run::Args),
    /// Search the indexed chunks (dense + BM25 fused by score) in the configured store — by default the embedded
    /// store that `clinstream run` writes (`store.path`, relative to the working directory).
    Search(search::Args),
    /// Serve the query API (`POST /v1/context`, `POST /v1/search`, /metrics, /healthz, /readyz) on `serve.addr`
    /// over the configured store; runs until SIGTERM/SIGINT. Auth: `serve.api_keys` (docs/read-side.md).
    Serve(serve::Args),
    /// The CLEAR context for a question about one patient, from the configured store: what `POST /v1/context`
    /// answers, computed by the same code. Prints note text (you asked for it); logs never do.
    Context(context::Args),
    /// Publish DocumentReference events (NDJSON, Bundles, Bulk-FHIR, `-` for stdin) onto a Kafka topic, keyed by
    /// resource id, using the `kafka.*` connection settings.
    Produce(produce::Args),
    /// Inspect the configuration.
    Config {
        #[command(subcommand)]
        command: config::Command,
    },
    /// Show what the text stages make of a piece of text: sections, mentions with assertions, variable labels.
    /// For tuning vocabularies and variable definitions; prints the text you give it.
    Explain(explain::Args),
    /// Knowledge-graph tools.
    Kg {
        #[command(subcommand)]
        command: kg::Command,
    },
    /// Print the query service's OpenAPI document (docs/openapi.json), generated from the code.
    Openapi,
    /// List the error codes with their dispositions.
    Errors(docs::ErrorsArgs),
}

/// Parses the command line and runs the command; the exit status of `clinstream`.
pub fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(a) => run::exec(a),
        Command::Search(a) => search::exec(a),
        Command::Serve(a) => serve::exec(a),
        Command::Context(a) => context::exec(a),
        Command::Produce(a) => produce::exec(a),
        Command::Config { command } => config::exec(command),
        Command::Explain(a) => explain::exec(a),
        Command::Kg { command } => kg::exec(command),
        Command::Openapi => docs::openapi(),
        Command::Errors(a) => Ok(docs::errors(a)),
    };
    exit(result)
}

/// A command's result as the process's exit status: its own, or 1 with the error and its causes on stderr.
pub fn exit(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", as `{:#}` does, except that a cause the message before it already ends
/// with is left out: our typed errors name their I/O cause in their own message ("could not write X: Invalid
/// argument") and also expose it as `source()`, which `{:#}` printed twice.
fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

/// The worker's async runtime — `pipeline.async_threads` async threads and a blocking pool (blocking client calls,
/// store reads and conversions) of up to one thread per `pipeline.workers` and one more — after starting the
/// documents' CPU pool (`pool`: `pipeline.workers` threads for the CPU-bound stages, `pipeline.workers_nice` below).
pub fn runtime(settings: &Settings) -> anyhow::Result<tokio::runtime::Runtime> {
    crate::pool::start(settings.worker_threads(), settings.pipeline.workers_nice);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.async_threads())
        .max_blocking_threads(settings.worker_threads() + 1)
        .thread_name("clinstream")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The query service's CLI twins (`context`, `search`) run as the local operator: every patient. They say so on
/// stderr, and the access gets an audit record like an API request (`serve.audit.topic`, or the log with ids
/// pseudonymised); when it cannot be delivered and `serve.audit.fail_closed` is on, nothing is printed.
pub(crate) async fn audit_operator(
    settings: &Settings,
    route: &'static str,
    patient: Option<&str>,
    returned: usize,
    documents: Vec<String>,
) -> anyhow::Result<()> {
    use crate::serve::access::{Principal, Who};
    let operator = Principal::operator();
    if let Who::Operator { user } = &operator.who {
        eprintln!("clinstream {route}: running as the local operator `{user}` (every patient; this access is audited)");
    }
    let record = crate::serve::audit::AuditRecord {
        request_id: crate::serve::audit::request_id(None),
        recorded: std::time::SystemTime::now(),
        route,
        who: Some(operator.who),
        patient: patient.filter(|p| !p.trim().is_empty()).map(crate::query::reader::patient_reference),
        status: 200,
        returned,
        documents,
    };
    let auditor = crate::serve::audit::Auditor::new(settings).map_err(anyhow::Error::msg)?;
    match auditor.record(&record).await {
        Ok(()) => Ok(()),
        Err(e) if settings.serve.audit.fail_closed => {
            Err(anyhow::anyhow!("{e} (serve.audit.fail_closed): nothing is printed"))
        }
        Err(e) => {
            eprintln!("warning: {e}");
            Ok(())
        }
    }
}

/// Settings (defaults ← file ← env) and the compiled pipeline, for the commands that analyse text.
pub fn pipeline(config: Option<&std::path::Path>) -> anyhow::Result<(Settings, crate::stages::Pipeline)> {
    let settings = Settings::load(config).context("loading configuration")?;
    let pipeline = crate::stages::Pipeline::new(&settings)?;
    Ok((settings, pipeline))
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called (inside the runtime), not
/// when first awaited, so a signal during start-up is not lost (nor fatal): the run stops as soon as it starts.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    #[cfg(unix)]
    let int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    async move {
        #[cfg(unix)]
        {
            let (mut term, mut int) = (term, int);
            let term = async {
                match term.as_mut() {
                    Some(t) => drop(t.recv().await),
                    None => std::future::pending().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(i) => drop(i.recv().await),
                    None => drop(tokio::signal::ctrl_c().await),
                }
            };
            tokio::select! {
                _ = term => {}
                _ = int => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::chain;
    use crate::error::SinkError;
    use anyhow::Context;

    #[test]
    fn chain_names_each_cause_once() {
        let io = std::io::Error::from(std::io::ErrorKind::InvalidInput);
        let io_text = io.to_string();
        let e: anyhow::Result<()> = Err(SinkError { what: "notes.ndjson".into(), source: io }.into());
        let e = e.context("the run halted").unwrap_err();
        // `{:#}` repeats the I/O cause the sink error's message already holds.
        assert_eq!(format!("{e:#}").matches(&io_text).count(), 2);
        assert_eq!(chain(&e), format!("the run halted: could not write notes.ndjson: {io_text}"));
        // A cause that is not already in the message is kept.
        let e = anyhow::anyhow!("root cause").context("outer");
        assert_eq!(chain(&e), "outer: root cause");
    }
}
