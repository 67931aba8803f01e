//! `clinstream config print`: the effective configuration (defaults ← file ← environment), secrets redacted.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::Settings;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Print the effective configuration (defaults ← file ← environment), secrets redacted.
    Print {
        #[arg(long, env = "CLINSTREAM_CONFIG")]
        config: Option<PathBuf>,
    },
}

pub fn exec(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Print { config } => {
            let settings = Settings::load(config.as_deref()).context("loading configuration")?;
            print!("{}", settings.redacted_toml());
            Ok(ExitCode::SUCCESS)
        }
    }
}
