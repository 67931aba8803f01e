//! `clinstream serve`: the query service (`POST /v1/context`, `POST /v1/search`, /metrics, /healthz, /readyz) on
//! `serve.addr` over the configured store, until SIGTERM/SIGINT (`app::run_service`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use super::{runtime, shutdown_signal};
use crate::app;
use crate::config::Settings;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, env = "CLINSTREAM_CONFIG")]
    config: Option<PathBuf>,
}

pub fn exec(args: Args) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(args.config.as_deref()).context("loading configuration")?;
    crate::telemetry::init_logging(&settings.log)?;
    runtime(&settings)?
        .block_on(async { app::run_service(&settings, shutdown_signal()).await })
        .context("the query service stopped")?;
    Ok(ExitCode::SUCCESS)
}
