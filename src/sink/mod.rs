//! Sinks: where results go. A sink receives each event's outcome in input order — a `Document` or a
//! `DeadLetter` — and reports an error only when it cannot write (`ErrorCode::SinkIo`, which halts the run).
//!
//! * `file` — `notes.ndjson` and `dead_letters.ndjson` in an output directory (file mode).
//! * Kafka topics and the vector store come with their issues; each resolves its part of an event's ack only
//!   when its write is durable (see docs/architecture.md).

pub mod file;
pub mod records;

use crate::error::{DocError, ErrorCode, Stage};
use crate::model::Document;
use crate::source::Origin;

/// An event that produced no document: why, and where it came from. Never holds note text.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub error: DocError,
    pub origin: Origin,
    pub doc_id: Option<String>,
}

impl DeadLetter {
    pub fn code(&self) -> ErrorCode {
        self.error.code
    }
    pub fn stage(&self) -> Stage {
        self.error.stage
    }
}

/// An output could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not write {what}: {source}")]
pub struct SinkError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

/// Receives outcomes in input order.
pub trait Sink {
    fn document(&mut self, doc: &Document, origin: &Origin) -> Result<(), SinkError>;
    fn dead_letter(&mut self, letter: &DeadLetter) -> Result<(), SinkError>;
    /// Makes everything written so far durable.
    fn flush(&mut self) -> Result<(), SinkError>;
}
