//! The pure stages: synchronous functions, no I/O, no async runtime. Each file is one stage; `Pipeline` runs
//! them in order for one event.
//!
//! In: the bytes of one event. Out: a `Document` (note, sections, sentences) or a `Rejected` carrying the
//! dead-letter code and, when it was already known, the document id. Never panics (fuzzed: `fuzz/`).

pub mod assertion;
pub mod attachment;
pub mod decode;
pub mod html;
pub mod rtf;
pub mod sections;
pub mod sentences;

use crate::config::Settings;
use crate::error::DocError;
use crate::model::Document;

/// Why one event produced no document: the error, and the document id when it was read before the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub error: DocError,
    pub doc_id: Option<String>,
}

/// The stage parameters, resolved from settings once and shared by every worker thread.
#[derive(Debug, Clone)]
pub struct Pipeline {
    decode: decode::DecodeParams,
    sections: sections::SectionParams,
    sentences: sentences::SentenceParams,
}

impl Pipeline {
    pub fn new(settings: &Settings) -> Self {
        Self {
            decode: decode::DecodeParams::from_settings(settings),
            sections: sections::SectionParams::from_settings(settings),
            sentences: sentences::SentenceParams::from_settings(settings),
        }
    }

    /// Runs every stage over one event.
    pub fn process(&self, bytes: &[u8]) -> Result<Document, Rejected> {
        let doc = decode::parse(bytes, &self.decode).map_err(|error| Rejected { error, doc_id: None })?;
        let doc_id = doc.id.clone().filter(|id| decode::is_valid_id(id));
        let note = decode::note_from(doc, &self.decode).map_err(|error| Rejected { error, doc_id })?;
        let sections = sections::split(&note.text, &self.sections);
        let sentences = sentences::split(&note.text, &sections, &self.sentences);
        Ok(Document { note, sections, sentences })
    }
}
