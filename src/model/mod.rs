//! The domain types every layer above shares: a decoded `Note`, its `Section`s and `Sentence`s, the mentions,
//! variable results and knowledge-graph delta the stages derive (`Document`), where an event came from
//! (`Origin`) and the record of one that produced no document (`DeadLetter`). Plain data: this module imports
//! nothing from the crate but `error` (the codes a dead letter carries).
//!
//! Offsets (`start`, `end`) are UTF-8 byte offsets into `Note::text`, half-open, and always on `char`
//! boundaries, so `&note.text[s.start..s.end]` is the span's text.

pub mod fhir;
pub mod kg;
pub mod mention;
pub mod origin;
pub mod variable;

use serde::Serialize;

pub use fhir::{CodeableConcept, Coding, Period};
pub use kg::KgDelta;
pub use mention::{Assertion, EntityKind, Mention};
pub use origin::{DeadLetter, Origin, Partition};
pub use variable::{Label, VariableResult, Window};

/// A clinical note decoded from a DocumentReference: metadata plus the plain text the stages read.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Note {
    pub doc_id: String,
    /// `meta.versionId` when present.
    pub version: Option<String>,
    pub last_updated: Option<String>,
    pub status: Option<String>,
    pub doc_status: Option<String>,
    /// `subject.reference`, e.g. `Patient/123`.
    pub patient: Option<String>,
    /// First `context.encounter[].reference`.
    pub encounter: Option<String>,
    pub period: Option<Period>,
    pub date: Option<String>,
    #[serde(rename = "type")]
    pub doc_type: Option<CodeableConcept>,
    pub category: Vec<CodeableConcept>,
    /// `author[].reference` values.
    pub authors: Vec<String>,
    /// `relatesTo` entries as (code, target reference).
    pub relates_to: Vec<RelatesTo>,
    /// True when `status = entered-in-error`; later stages retract the document's outputs.
    pub entered_in_error: bool,
    pub attachment: AttachmentInfo,
    #[serde(skip)]
    pub text: String,
}

impl Note {
    /// A note from plain text alone (evaluation sets, tests): UTF-8 `text/plain`, no metadata.
    pub fn from_text(doc_id: &str, text: String) -> Note {
        Note {
            doc_id: doc_id.to_string(),
            version: None,
            last_updated: None,
            status: None,
            doc_status: None,
            patient: None,
            encounter: None,
            period: None,
            date: None,
            doc_type: None,
            category: Vec::new(),
            authors: Vec::new(),
            relates_to: Vec::new(),
            entered_in_error: false,
            attachment: AttachmentInfo {
                index: 0,
                content_type: "text/plain".into(),
                charset: "utf-8".into(),
                language: None,
                title: None,
                bytes: text.len(),
                hash_verified: false,
            },
            text,
        }
    }

    /// References of documents this one replaces (`relatesTo.code = replaces`).
    pub fn replaces(&self) -> impl Iterator<Item = &str> {
        self.relates_to.iter().filter(|r| r.code == "replaces").map(|r| r.target.as_str())
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RelatesTo {
    pub code: String,
    pub target: String,
}

/// Which attachment was read and how it was decoded.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AttachmentInfo {
    /// Index into `content[]`.
    pub index: usize,
    /// The media type without parameters, lower-cased (`text/plain`).
    pub content_type: String,
    /// The charset actually used to decode (`utf-8`, `utf-16le`, `windows-1252`, ...).
    pub charset: String,
    pub language: Option<String>,
    pub title: Option<String>,
    /// Decoded attachment size in bytes (before markup removal).
    pub bytes: usize,
    /// Whether `hash` was present and verified.
    pub hash_verified: bool,
}

/// A section of a note: a canonical name from the synonym table, the title as written, and its span.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Section {
    /// Canonical name (`history_of_present_illness`, `assessment_and_plan`, `body`, `other`, ...).
    pub name: &'static str,
    /// The header as written (without the trailing colon), empty for the implicit `body` section.
    pub title: String,
    /// Span of the whole section, header included.
    pub start: usize,
    pub end: usize,
    /// Where the section's body starts (after the header and its colon).
    pub body_start: usize,
    /// Priority weight from `sections.weights`.
    pub weight: f32,
}

/// A sentence span inside one section.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Sentence {
    pub start: usize,
    pub end: usize,
    /// Index into the note's sections.
    pub section: usize,
}

/// Everything the stages derived from one event, ready for the sinks.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub note: Note,
    pub sections: Vec<Section>,
    pub sentences: Vec<Sentence>,
    pub mentions: Vec<Mention>,
    pub variables: Vec<VariableResult>,
    /// The document's knowledge-graph delta (computed last, from everything above).
    pub kg: KgDelta,
    pub timings: Timings,
}

/// Time spent in each stage for one document (recorded as metrics by the runner).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    pub decode: std::time::Duration,
    pub sections: std::time::Duration,
    pub sentences: std::time::Duration,
    pub entities: std::time::Duration,
    pub variables: std::time::Duration,
    pub kg: std::time::Duration,
}

impl Timings {
    pub fn stages(&self) -> [(&'static str, std::time::Duration); 6] {
        [
            ("decode", self.decode),
            ("sections", self.sections),
            ("sentences", self.sentences),
            ("entities", self.entities),
            ("variables", self.variables),
            ("kg", self.kg),
        ]
    }
}
