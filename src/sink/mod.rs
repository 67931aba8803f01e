//! Sinks: where results go. The runner hands each event's outcome to its outputs side in intake order — a
//! `Document` or a `DeadLetter` — and asks it to `checkpoint`: make everything handed over so far durable, then
//! commit what the ack core allows. An error here halts the run (`sink_io`, `delivery_failed`, `commit_failed`).
//!
//! * `file` — `notes.ndjson`, `variables.ndjson`, `kg.ndjson`, `dead_letters.ndjson` in an output directory; a
//!   checkpoint flushes them (nothing to commit: a rerun rewrites the files).
//! * `kafka` — the producer (variables, knowledge-graph deltas, dead letters as Avro) and the commit step
//!   (offsets after deliveries, or in one transaction with them).

pub mod file;
pub mod kafka;

use std::future::Future;

use crate::ack::Acks;
pub use crate::error::SinkError;
use crate::error::{DocError, RunError};
pub use crate::model::DeadLetter;
use crate::model::Document;

/// What became of a document's outputs.
#[derive(Debug)]
pub enum Handed {
    /// Handed over (durable at the next checkpoint).
    Written,
    /// Not sendable (an output over the message size limit): nothing was sent, and the event is dead-lettered
    /// with this error instead.
    Refused(DocError),
}

/// The outputs side of a run, generic over the intake's record type `R`.
pub trait Outputs<R> {
    /// A finished document's outputs.
    fn document(&mut self, doc: &Document, record: &R) -> impl Future<Output = Result<Handed, RunError>>;
    /// An event that produced no document; `record` when its bytes were kept (Kafka dead letters carry them).
    fn dead_letter(&mut self, letter: &DeadLetter, record: Option<&R>) -> impl Future<Output = Result<(), RunError>>;
    /// Makes everything handed over so far durable, then commits the watermarks `acks` allows.
    fn checkpoint(&mut self, acks: &mut Acks) -> impl Future<Output = Result<(), RunError>>;
}
