//! Entity windows as they are stored beside the chunks: per note version, a window of ±`words` words around
//! every mention, windows that overlap or touch merged, each carrying its mentions (offsets relative to the
//! window), their sections and assertions, and the note's concept–concept relations (the knowledge-graph delta's
//! treatment edges) whose evidence starts inside it. The read side rebuilds notes from them (`WindowNote`) and assembles
//! context over those exactly as over the whole notes, because a query window of at most the stored radius around
//! a mention never leaves the stored window that holds the mention, and two mentions in different stored windows
//! are more than two stored radii apart (their query windows cannot touch either). `context::tests` checks that
//! equivalence on real notes.
//!
//! Pure: no I/O; `index` turns these into store points, the query service reads them back from payloads.

use serde::{Deserialize, Serialize};

use crate::lexicon::Lexicon;
use crate::model::mention::{Assertion, EntityKind};
use crate::model::{Mention, Section};
use crate::stages::clear::word_spans;
use crate::stages::sections::CANONICAL_SECTIONS;

/// One stored window of a note.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredWindow {
    /// Position among the note's windows (part of the point id).
    pub index: usize,
    /// Byte offsets of the window in the note's text.
    pub start: usize,
    pub end: usize,
    pub text: String,
    /// The sections its mentions lie in, each once, in text order.
    pub sections: Vec<StoredSection>,
    pub mentions: Vec<StoredMention>,
    /// The note's concept–concept relations whose evidence starts in this window (the knowledge-graph delta's
    /// treatment edges: docs/knowledge-graph.md). Absent in windows stored before relations were.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relations: Vec<StoredRelation>,
}

/// A relation between two concepts that a note states, as the knowledge-graph delta has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRelation {
    /// The edge type (`diagnosis_medication`, `diagnosis_procedure`, `medication_procedure`).
    #[serde(rename = "type")]
    pub relation: String,
    /// Concept ids, in the edge's direction (diagnosis → medication / procedure, medication → procedure).
    pub from: String,
    pub to: String,
    pub confidence: f64,
}

/// The concept–concept relations of a document's knowledge-graph delta, each with where its evidence starts in
/// the note (one per piece of evidence from this document).
pub fn relations(kg: &crate::model::KgDelta) -> Vec<(usize, StoredRelation)> {
    let concept: std::collections::HashMap<&str, &str> =
        kg.nodes.iter().filter(|n| n.node_type == "concept").map(|n| (n.id.as_str(), n.key.as_str())).collect();
    let mut out = Vec::new();
    for e in &kg.edges {
        let (Some(from), Some(to)) = (concept.get(e.source.as_str()), concept.get(e.target.as_str())) else {
            continue;
        };
        for ev in e.evidence.iter().filter(|ev| ev.doc_id == kg.doc_id.as_str()) {
            let relation = StoredRelation {
                relation: e.edge_type.to_string(),
                from: from.to_string(),
                to: to.to_string(),
                confidence: e.confidence,
            };
            out.push((usize::try_from(ev.start).unwrap_or(0), relation));
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSection {
    pub name: String,
    pub weight: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMention {
    /// Concept id in the lexicon (`SNOMED:…`, `RXNORM:…`, ...).
    pub concept: String,
    pub kind: String,
    /// Byte offsets in the window's text.
    pub start: usize,
    pub end: usize,
    /// Index into the window's `sections`.
    pub section: usize,
    pub negated: bool,
    pub uncertain: bool,
    pub historical: bool,
    pub family: bool,
    pub hypothetical: bool,
    /// `Assertion::differential` (absent in windows stored before it: false).
    #[serde(default)]
    pub differential: bool,
}

impl StoredWindow {
    /// The concept ids inside, each once, in text order (an indexed payload field).
    pub fn concepts(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for m in &self.mentions {
            if !out.contains(&m.concept.as_str()) {
                out.push(&m.concept);
            }
        }
        out
    }

    /// The heaviest section among the mentions.
    pub fn main_section(&self) -> Option<&StoredSection> {
        self.sections.iter().max_by(|a, b| a.weight.total_cmp(&b.weight))
    }
}

/// The windows of one processed note: ±`words` words around each mention (in sentences), merged when they overlap
/// or touch. `words = 0` stores none.
pub fn build(
    text: &str,
    sections: &[Section],
    mentions: &[Mention],
    relations: &[(usize, StoredRelation)],
    lexicon: &Lexicon,
    words: usize,
) -> Vec<StoredWindow> {
    let spans = word_spans(text);
    if words == 0 || spans.is_empty() || mentions.is_empty() {
        return Vec::new();
    }
    let word_of = |offset: usize| spans.partition_point(|&(_, e)| e <= offset).min(spans.len() - 1);
    let mut sorted: Vec<&Mention> = mentions.iter().collect();
    sorted.sort_by_key(|m| (m.start, m.end));
    let mut groups: Vec<(usize, usize, Vec<&Mention>)> = Vec::new();
    for m in sorted {
        let lo = word_of(m.start).saturating_sub(words);
        let hi = (word_of(m.end.saturating_sub(1)) + words).min(spans.len() - 1);
        match groups.last_mut() {
            Some(g) if lo <= g.1 + 1 => {
                g.1 = g.1.max(hi);
                g.2.push(m);
            }
            _ => groups.push((lo, hi, vec![m])),
        }
    }
    groups
        .into_iter()
        .enumerate()
        .map(|(index, (lo, hi, ms))| {
            let (start, end) = (spans[lo].0, spans[hi].1);
            let mut window_sections: Vec<usize> = Vec::new();
            let mentions = ms
                .iter()
                .map(|m| {
                    let at = window_sections.iter().position(|&s| s == m.section).unwrap_or_else(|| {
                        window_sections.push(m.section);
                        window_sections.len() - 1
                    });
                    let a = m.assertion;
                    StoredMention {
                        concept: lexicon.concept(m.concept).id.clone(),
                        kind: m.kind.as_str().to_string(),
                        start: m.start - start,
                        end: m.end.min(end) - start,
                        section: at,
                        negated: a.negated,
                        uncertain: a.uncertain,
                        historical: a.historical,
                        family: a.family,
                        hypothetical: a.hypothetical,
                        differential: a.differential,
                    }
                })
                .collect();
            StoredWindow {
                index,
                start,
                end,
                text: text[start..end].to_string(),
                sections: window_sections
                    .iter()
                    .map(|&i| StoredSection { name: sections[i].name.to_string(), weight: sections[i].weight })
                    .collect(),
                mentions,
                relations: relations
                    .iter()
                    .filter(|(at, _)| (start..end).contains(at))
                    .map(|(_, r)| r.clone())
                    .collect(),
            }
        })
        .collect()
}

/// A stored window turned back into what context assembly reads (`PatientNote` borrows from it).
#[derive(Debug, Clone)]
pub struct WindowNote {
    pub doc_id: String,
    pub version: String,
    pub date: Option<String>,
    /// Byte offset of `text` in the note.
    pub offset: usize,
    pub text: String,
    pub sections: Vec<Section>,
    pub mentions: Vec<Mention>,
    /// The relations stored with the window (`facts` reads them for the aligned concepts).
    pub relations: Vec<StoredRelation>,
}

impl WindowNote {
    /// Rebuilds a window's note fragment; mentions of concepts the lexicon does not know (another vocabulary
    /// version) or with offsets outside the text are dropped, so a stale point never breaks a request.
    pub fn new(doc_id: String, version: String, date: Option<String>, w: StoredWindow, lexicon: &Lexicon) -> Self {
        let sections: Vec<Section> = w
            .sections
            .iter()
            .map(|s| Section {
                name: static_section(&s.name),
                title: String::new(),
                start: 0,
                end: w.text.len(),
                body_start: 0,
                weight: s.weight,
            })
            .collect();
        let mentions = w
            .mentions
            .iter()
            .filter(|m| m.start < m.end && m.end <= w.text.len() && m.section < sections.len())
            .filter(|m| w.text.is_char_boundary(m.start) && w.text.is_char_boundary(m.end))
            .filter_map(|m| {
                let concept = lexicon.concept_index(&m.concept)?;
                Some(Mention {
                    kind: EntityKind::parse(&m.kind).unwrap_or(lexicon.concept(concept).kind),
                    concept,
                    start: m.start,
                    end: m.end,
                    sentence: 0,
                    section: m.section,
                    assertion: Assertion {
                        negated: m.negated,
                        uncertain: m.uncertain,
                        historical: m.historical,
                        family: m.family,
                        hypothetical: m.hypothetical,
                        differential: m.differential,
                    },
                })
            })
            .collect();
        WindowNote { doc_id, version, date, offset: w.start, text: w.text, sections, mentions, relations: w.relations }
    }
}

/// The canonical section name as the `'static` the model uses (`other` for a name this build does not know).
fn static_section(name: &str) -> &'static str {
    CANONICAL_SECTIONS.iter().find(|c| **c == name).copied().unwrap_or("other")
}

/// Stored window payloads → note fragments, keeping only mentions in the asked sections (all when none asked).
/// A payload that does not parse (written by a future clinstream) is skipped.
pub fn fragments(
    stored: Vec<serde_json::Map<String, serde_json::Value>>,
    lexicon: &crate::lexicon::Lexicon,
    sections: &std::collections::HashSet<&str>,
) -> Vec<WindowNote> {
    let mut out = Vec::with_capacity(stored.len());
    for mut p in stored {
        let text = |p: &serde_json::Map<String, serde_json::Value>, k: &str| {
            p.get(k).and_then(|v| v.as_str()).map(str::to_string)
        };
        let (Some(doc_id), version, date) = (text(&p, "doc_id"), text(&p, "doc_version"), text(&p, "doc_date")) else {
            continue;
        };
        let Some(Ok(w)) = p.remove("window").map(serde_json::from_value::<StoredWindow>) else { continue };
        let mut note = WindowNote::new(doc_id, version.unwrap_or_default(), date, w, lexicon);
        if !sections.is_empty() {
            let keep: Vec<bool> = note.sections.iter().map(|s| sections.contains(s.name)).collect();
            note.mentions.retain(|m| keep[m.section]);
        }
        out.push(note);
    }
    out
}
