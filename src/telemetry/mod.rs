//! Logging set-up, metrics (`metrics`) and the process's health flags (`health`). Logs are structured fields, never note text, names or identifiers: events carry codes,
//! stages, counts and input positions (file and line), not document ids or values.

pub mod health;
pub mod metrics;

use std::io::IsTerminal;

use crate::config::{LogFormat, LogSettings};

/// Logging could not be set up (a bad filter, or a subscriber already installed).
#[derive(Debug, thiserror::Error)]
#[error("setting up logging: {0}")]
pub struct LogError(String);

/// Installs the global subscriber: JSON lines, or human-readable text on a terminal (`log.format = auto`).
/// `RUST_LOG` overrides `log.level` when set.
pub fn init_logging(settings: &LogSettings) -> Result<(), LogError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => v,
        _ => settings.level.clone(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).map_err(|e| LogError(format!("log filter: {e}")))?;
    let json = match settings.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = if json {
        builder.json().flatten_event(true).with_current_span(false).try_init()
    } else {
        builder.with_target(false).try_init()
    };
    result.map_err(|e| LogError(e.to_string()))
}
