//! `clinstream run`: the worker. From files, directories or stdin into a directory (`--input`), or from Kafka
//! into the output topics (no `--input`, `kafka.enabled = true`; until SIGTERM/SIGINT). The work itself is
//! `app::run_files` / `app::run_kafka`; this parses the flags and reports.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use super::{EXIT_DEAD_LETTERS, runtime, shutdown_signal};
use crate::app::{self, RunOptions};
use crate::config::Settings;
use crate::source::file::Input;

#[derive(clap::Args)]
pub struct Args {
    /// Configuration file (TOML), layered over the built-in defaults; CLINSTREAM__* env vars override it.
    #[arg(long, env = "CLINSTREAM_CONFIG")]
    config: Option<PathBuf>,
    /// NDJSON / Bundle / Bulk-FHIR file, a directory, or `-` for stdin. Repeatable.
    #[arg(long, short, num_args = 1..)]
    input: Vec<String>,
    /// Output directory (notes.ndjson, dead_letters.ndjson).
    #[arg(long, short, default_value = "out")]
    out: PathBuf,
    /// Write note text into the outputs (off by default: outputs hold offsets, not PHI).
    #[arg(long)]
    include_text: bool,
    /// Do not draw a progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Text stages only: no chunk embedding and no vector store (same as `embed.enabled = false`).
    #[arg(long)]
    no_embed: bool,
}

pub fn exec(args: Args) -> anyhow::Result<ExitCode> {
    let Args { config, input, out, include_text, no_progress, no_embed } = args;
    let mut settings = Settings::load(config.as_deref()).context("loading configuration")?;
    if no_embed {
        settings.embed.enabled = false;
    }
    crate::telemetry::init_logging(&settings.log)?;
    let runtime = runtime(&settings)?;
    if input.is_empty() {
        anyhow::ensure!(
            settings.kafka.enabled,
            "nothing to read: give --input PATH (files) or set kafka.enabled = true (see docs/kafka.md)"
        );
        let result = runtime.block_on(async { app::run_kafka(&settings, shutdown_signal()).await });
        let summary = finish(runtime, &settings, result).context("the worker halted")?;
        print!("{summary}");
        return Ok(ExitCode::SUCCESS);
    }
    let opts = RunOptions {
        inputs: input.iter().map(|i| Input::parse(i)).collect(),
        out_dir: out,
        include_text,
        progress: !no_progress,
    };
    let result = runtime.block_on(async { app::run_files(&settings, opts, shutdown_signal()).await });
    let summary = finish(runtime, &settings, result).context("the run halted")?;
    print!("{summary}");
    Ok(if summary.dead_lettered() > 0 { ExitCode::from(EXIT_DEAD_LETTERS) } else { ExitCode::SUCCESS })
}

/// Ends the runtime once the run has returned (its outputs written, its points durable): a background task still
/// running — above all an index maintenance of the embedded store, which rebuilds a large segment's HNSW graph for
/// up to a minute — gets `store.maintenance_wait_ms`, then the process exits without it. An unfinished maintenance
/// is dropped as after a crash (the segments it would replace are intact; the next one redoes it), so a worker
/// stopped by SIGTERM exits within its pod's grace period.
fn finish<T>(runtime: tokio::runtime::Runtime, settings: &Settings, result: T) -> T {
    runtime.shutdown_timeout(std::time::Duration::from_millis(settings.store.maintenance_wait_ms));
    result
}
