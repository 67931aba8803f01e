//! Sources: where events come from. Each yields `Envelope`s — the raw bytes of one event and where they came
//! from — into a bounded channel; the runner turns each into outputs and tells the source (through its ack,
//! for sources that have one) when everything derived from the event is durable.
//!
//! * `file` — NDJSON, FHIR Bundles and Bulk-FHIR exports from files, directories or stdin. Reading a file
//!   needs no acknowledgement: a rerun reprocesses it and the outputs are overwritten.
//! * Kafka (`crate::kafka`) yields records with `Origin::Kafka`; the runner advances each partition's
//!   watermark only past documents whose outputs are delivered.

pub mod file;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// The bytes of one event and where they came from.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub payload: Vec<u8>,
    pub origin: Origin,
}

/// Where an event came from, for dead letters and logs. Holds positions, never content.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// A line of an NDJSON file, or (for a `.json` file) line 1; `entry` is the Bundle entry index when the event
    /// was unpacked from a Bundle.
    File {
        path: Arc<PathBuf>,
        line: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        entry: Option<usize>,
    },
    Stdin {
        line: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        entry: Option<usize>,
    },
    /// A Kafka record.
    Kafka { topic: Arc<str>, partition: i32, offset: i64 },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (place, line, entry) = match self {
            Origin::File { path, line, entry } => (path.display().to_string(), line, entry),
            Origin::Stdin { line, entry } => ("<stdin>".to_string(), line, entry),
            Origin::Kafka { topic, partition, offset } => return write!(f, "{topic}[{partition}]@{offset}"),
        };
        write!(f, "{place}:{line}")?;
        if let Some(e) = entry {
            write!(f, " entry {e}")?;
        }
        Ok(())
    }
}

/// What a source sends to the runner.
#[derive(Debug)]
pub enum SourceEvent {
    Record(Envelope),
    /// Progress: bytes of input consumed so far (for the progress bar).
    Progress(u64),
    /// An event longer than `input.max_message_bytes`; its bytes were not kept.
    Oversized {
        origin: Origin,
        bytes: u64,
    },
    /// A file that was deliberately not read (another resource type in a Bulk-FHIR export).
    SkippedFile(PathBuf),
    /// A Bundle entry that is not a DocumentReference.
    SkippedResource,
}

/// The input could not be read. Halts the run (see `ErrorCode::SourceIo`).
#[derive(Debug, thiserror::Error)]
#[error("could not read {path}: {source}")]
pub struct SourceError {
    pub path: String,
    #[source]
    pub source: std::io::Error,
}
