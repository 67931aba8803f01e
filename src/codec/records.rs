//! The records written in file mode (`notes.ndjson`, `dead_letters.ndjson`): the JSON contract documented in
//! docs/outputs.md. Offsets are UTF-8 byte offsets into the decoded note text.
//!
//! PHI rule: note text appears only when `output.include_text` is set. Section titles of known sections are
//! standard headers and always written; the title of an `other` section (an unknown ALL-CAPS header, which could
//! be anything) only with `include_text`.

use serde::Serialize;

use crate::WORKER_VERSION;
use crate::lexicon::Lexicon;
use crate::model::{
    Assertion, AttachmentInfo, CodeableConcept, DeadLetter, Document, EntityKind, Label, Origin, Period, RelatesTo,
    Window,
};

#[derive(Debug, Serialize)]
pub struct NoteRecord<'a> {
    pub doc_id: &'a str,
    pub version: Option<&'a str>,
    pub last_updated: Option<&'a str>,
    pub status: Option<&'a str>,
    pub doc_status: Option<&'a str>,
    pub entered_in_error: bool,
    /// References of the documents this one replaces (`relatesTo.code = replaces`).
    pub replaces: Vec<&'a str>,
    pub relates_to: &'a [RelatesTo],
    pub patient: Option<&'a str>,
    pub encounter: Option<&'a str>,
    pub period: Option<&'a Period>,
    pub date: Option<&'a str>,
    #[serde(rename = "type")]
    pub doc_type: Option<&'a CodeableConcept>,
    pub category: &'a [CodeableConcept],
    pub authors: &'a [String],
    pub attachment: &'a AttachmentInfo,
    /// Length of the decoded note text in bytes.
    pub text_bytes: usize,
    pub sections: Vec<SectionRecord<'a>>,
    pub sentence_count: usize,
    pub mentions: Vec<MentionRecord<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<&'a str>,
    pub source: &'a Origin,
    pub lexicon_version: &'a str,
    pub worker_version: &'static str,
}

#[derive(Debug, Serialize)]
pub struct MentionRecord<'a> {
    pub kind: EntityKind,
    pub concept: &'a str,
    pub preferred: &'a str,
    pub codes: &'a [String],
    pub start: usize,
    pub end: usize,
    pub section: &'static str,
    pub sentence: usize,
    pub assertion: Assertion,
    /// The matched text, only with `include_text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub term: Option<&'a str>,
}

/// One (document, variable) result: `variables.ndjson`, and later `clinstream.variables.v1`.
#[derive(Debug, Serialize)]
pub struct VariableRecord<'a> {
    pub doc_id: &'a str,
    pub version: Option<&'a str>,
    pub patient: Option<&'a str>,
    pub encounter: Option<&'a str>,
    pub date: Option<&'a str>,
    pub entered_in_error: bool,
    pub variable: &'a str,
    pub label: Label,
    pub confidence: f32,
    pub evidence: Vec<EvidenceRecord<'a>>,
    pub context_tokens: usize,
    pub mentions_found: usize,
    pub lexicon_version: &'a str,
    pub worker_version: &'static str,
}

#[derive(Debug, Serialize)]
pub struct EvidenceRecord<'a> {
    #[serde(flatten)]
    pub window: &'a Window,
    /// The window's text, only with `include_text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<&'a str>,
}

impl<'a> VariableRecord<'a> {
    pub fn all(
        doc: &'a Document,
        lexicon: &'a Lexicon,
        include_text: bool,
    ) -> impl Iterator<Item = VariableRecord<'a>> {
        let n = &doc.note;
        doc.variables.iter().map(move |v| VariableRecord {
            doc_id: &n.doc_id,
            version: n.version.as_deref(),
            patient: n.patient.as_deref(),
            encounter: n.encounter.as_deref(),
            date: n.date.as_deref(),
            entered_in_error: n.entered_in_error,
            variable: &v.variable,
            label: v.label,
            confidence: v.confidence,
            evidence: v
                .evidence
                .iter()
                .map(|w| EvidenceRecord { window: w, text: include_text.then(|| &n.text[w.start..w.end]) })
                .collect(),
            context_tokens: v.context_tokens,
            mentions_found: v.mentions_found,
            lexicon_version: lexicon.version(),
            worker_version: WORKER_VERSION,
        })
    }
}

#[derive(Debug, Serialize)]
pub struct SectionRecord<'a> {
    pub name: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<&'a str>,
    pub start: usize,
    pub end: usize,
    pub body_start: usize,
    pub weight: f32,
    pub sentences: usize,
}

impl<'a> NoteRecord<'a> {
    pub fn new(doc: &'a Document, origin: &'a Origin, lexicon: &'a Lexicon, include_text: bool) -> Self {
        let n = &doc.note;
        let mut per_section = vec![0usize; doc.sections.len()];
        for s in &doc.sentences {
            per_section[s.section] += 1;
        }
        NoteRecord {
            doc_id: &n.doc_id,
            version: n.version.as_deref(),
            last_updated: n.last_updated.as_deref(),
            status: n.status.as_deref(),
            doc_status: n.doc_status.as_deref(),
            entered_in_error: n.entered_in_error,
            replaces: n.replaces().collect(),
            relates_to: &n.relates_to,
            patient: n.patient.as_deref(),
            encounter: n.encounter.as_deref(),
            period: n.period.as_ref(),
            date: n.date.as_deref(),
            doc_type: n.doc_type.as_ref(),
            category: &n.category,
            authors: &n.authors,
            attachment: &n.attachment,
            text_bytes: n.text.len(),
            sections: doc
                .sections
                .iter()
                .zip(per_section)
                .map(|(s, sentences)| SectionRecord {
                    name: s.name,
                    title: (!s.title.is_empty() && (include_text || s.name != "other")).then_some(s.title.as_str()),
                    start: s.start,
                    end: s.end,
                    body_start: s.body_start,
                    weight: s.weight,
                    sentences,
                })
                .collect(),
            sentence_count: doc.sentences.len(),
            mentions: doc
                .mentions
                .iter()
                .map(|m| {
                    let c = lexicon.concept(m.concept);
                    MentionRecord {
                        kind: m.kind,
                        concept: &c.id,
                        preferred: &c.preferred,
                        codes: &c.codes,
                        start: m.start,
                        end: m.end,
                        section: doc.sections[m.section].name,
                        sentence: m.sentence,
                        assertion: m.assertion,
                        term: include_text.then(|| &n.text[m.start..m.end]),
                    }
                })
                .collect(),
            text: include_text.then_some(n.text.as_str()),
            source: origin,
            lexicon_version: lexicon.version(),
            worker_version: WORKER_VERSION,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DeadLetterRecord<'a> {
    pub code: &'static str,
    pub stage: &'static str,
    pub disposition: crate::error::Disposition,
    /// What was wrong, in words that name fields, limits and positions — never input values.
    pub detail: &'a str,
    pub source: &'a Origin,
    pub doc_id: Option<&'a str>,
    pub worker_version: &'static str,
}

impl<'a> DeadLetterRecord<'a> {
    pub fn new(letter: &'a DeadLetter) -> Self {
        DeadLetterRecord {
            code: letter.error.code.as_str(),
            stage: letter.error.stage.as_str(),
            disposition: letter.error.code.disposition(),
            detail: &letter.error.detail,
            source: &letter.origin,
            doc_id: letter.doc_id.as_deref(),
            worker_version: WORKER_VERSION,
        }
    }
}
