//! The patient's facts for the aligned concepts: what the stored mentions say of each (how often, in which notes,
//! when, and the assertion of the latest) — the knowledge-graph stream's view of this patient, beside the context.
//! Pure.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::align::Alignment;
use super::context;
use super::windows::WindowNote;
use crate::lexicon::Lexicon;

/// What the patient's notes say of one aligned concept (the knowledge graph's patient-specific node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fact {
    pub concept: String,
    pub label: String,
    /// Entity kind (`diagnosis`, `medication`, `procedure`, ...).
    pub kind: String,
    pub mentions: usize,
    pub documents: usize,
    pub first_date: Option<String>,
    pub last_date: Option<String>,
    /// The assertion of its latest mention.
    pub latest_assertion: String,
    pub doc_ids: Vec<String>,
}

/// The patient's facts for the aligned concepts, from the stored mentions: per concept, how often and when it
/// was mentioned and the assertion of its latest mention (what the knowledge-graph stream says of this patient).
pub fn facts(notes: &[WindowNote], alignment: &Alignment, lexicon: &Lexicon) -> Vec<Fact> {
    let mut by: BTreeMap<u32, Fact> = BTreeMap::new();
    for n in notes {
        for m in n.mentions.iter().filter(|m| alignment.concepts.contains_key(&m.concept)) {
            let c = lexicon.concept(m.concept);
            let f = by.entry(m.concept).or_insert_with(|| Fact {
                concept: c.id.clone(),
                label: c.preferred.clone(),
                kind: m.kind.as_str().to_string(),
                mentions: 0,
                documents: 0,
                first_date: None,
                last_date: None,
                latest_assertion: String::new(),
                doc_ids: Vec::new(),
            });
            f.mentions += 1;
            if !f.doc_ids.contains(&n.doc_id) {
                f.doc_ids.push(n.doc_id.clone());
                f.documents += 1;
            }
            if f.first_date.is_none() || n.date.is_some() && n.date < f.first_date {
                f.first_date = n.date.clone();
            }
            if n.date >= f.last_date || f.latest_assertion.is_empty() {
                f.last_date = n.date.clone().or(f.last_date.take());
                f.latest_assertion = context::assertion_name(&m.assertion).to_string();
            }
        }
    }
    let mut out: Vec<Fact> = by.into_values().collect();
    out.sort_by(|a, b| b.mentions.cmp(&a.mentions).then_with(|| a.concept.cmp(&b.concept)));
    out
}
