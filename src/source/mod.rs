//! Sources: where events come from. Each yields records — the raw bytes of one event and where they came
//! from — into a bounded channel; the runner turns each into outputs and tells the source (through its ack,
//! for sources that have one) when everything derived from the event is durable.
//!
//! * `file` — NDJSON, FHIR Bundles and Bulk-FHIR exports from files, directories or stdin. Reading a file
//!   needs no acknowledgement: a rerun reprocesses it and the outputs are overwritten.
//! * `kafka` — a consumer group member on its own poll thread: records with `Origin::Kafka` and group events
//!   (`Assigned`, `Revoking`); the ack core (`crate::ack`) advances each partition's watermark only past documents
//!   whose outputs are delivered.
//!
//! Both speak `Intake<R>` over a bounded channel to the one runner (`crate::runner`); `R: Record`.

pub mod file;
pub mod kafka;

use std::path::PathBuf;

use crate::error::RunError;
pub use crate::error::SourceError;
pub use crate::model::Origin;
use crate::model::Partition;
use crate::model::fhir::{Bundle, Probe};

/// The bytes of one event and where they came from.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub payload: Vec<u8>,
    pub origin: Origin,
}

/// What an intake sends to the runner, in order: records, and the events around them.
#[derive(Debug)]
pub enum Intake<R> {
    Record(R),
    /// An event longer than `input.max_message_bytes` whose bytes were not kept (the file source).
    Oversized {
        origin: Origin,
        bytes: u64,
    },
    /// Progress: bytes of input consumed so far (for the progress bar).
    Progress(u64),
    /// A file that was deliberately not read (another resource type in a Bulk-FHIR export).
    SkippedFile(PathBuf),
    /// A Bundle entry that is not a DocumentReference.
    SkippedResource,
    /// Partitions assigned to this worker (the intake has added them to the ack ledger).
    Assigned(Vec<Partition>),
    /// Partitions about to be released: finish everything in flight, checkpoint, then send on `done`.
    Revoking {
        partitions: Vec<Partition>,
        done: std::sync::mpsc::SyncSender<()>,
    },
    /// The input could not be read (a file's I/O error, a Kafka consumer in a fatal state); the run halts.
    Failed(RunError),
}

/// The file source's events.
pub type SourceEvent = Intake<Envelope>;

/// The intake's thread or task, which the runner stops and waits for at the end.
pub trait IntakeControl {
    /// Stop taking records (the runner keeps answering revocations until the intake has ended).
    fn request_stop(&mut self);
    /// Whether the intake sends requests the runner must answer while it stops (revocations). When it does not,
    /// the runner closes its receiver so a reader blocked on a full channel ends.
    fn answers_requests(&self) -> bool;
    /// The thread to wait for; `None` when it must not be waited for (a reader blocked on stdin).
    fn take_thread(&mut self, interrupted: bool) -> Option<std::thread::JoinHandle<()>>;
}

/// One consumed event as the runner sees it.
pub trait Record: Send + Sync + 'static {
    /// The event's bytes.
    fn payload(&self) -> &[u8];
    /// Where it came from (for dead letters and logs).
    fn origin(&self) -> Origin;
    /// Partition and offset, for intakes whose progress is acknowledged (Kafka); `None` for files.
    fn position(&self) -> Option<(Partition, i64)> {
        None
    }
    /// Whether finishing this record finishes its position: false for all but the last entry of a Bundle
    /// message, so the offset moves only after every entry's outputs.
    fn completes_position(&self) -> bool {
        true
    }
    /// Whether the runner counts the payload as input bytes (sources without `Progress` events).
    fn counts_bytes(&self) -> bool {
        false
    }
}

impl Record for Envelope {
    fn payload(&self) -> &[u8] {
        &self.payload
    }
    fn origin(&self) -> Origin {
        self.origin.clone()
    }
}

/// When `payload` is a FHIR Bundle: each entry's resource bytes if it is a DocumentReference, `None` for
/// entries of other types (or without a resource). `None` overall when the payload is not a (readable) Bundle.
pub fn bundle_entries(payload: &[u8]) -> Option<Vec<(usize, Option<Vec<u8>>)>> {
    if !payload.windows(6).any(|w| w == b"Bundle") {
        return None;
    }
    let probe: Probe<'_> = serde_json::from_slice(payload).ok()?;
    if probe.resource_type.as_deref() != Some("Bundle") {
        return None;
    }
    let bundle: Bundle<'_> = serde_json::from_slice(payload).ok()?;
    let is_document_reference = |raw: &serde_json::value::RawValue| {
        serde_json::from_str::<Probe<'_>>(raw.get())
            .is_ok_and(|p| p.resource_type.as_deref() == Some("DocumentReference"))
    };
    Some(
        bundle
            .entry
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.resource.filter(|r| is_document_reference(r)).map(|r| r.get().as_bytes().to_vec())))
            .collect(),
    )
}
