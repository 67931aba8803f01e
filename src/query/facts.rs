//! The patient's facts for the aligned concepts: what the stored mentions say of each (how often, in which notes,
//! when, and the assertion of the latest) and the knowledge graph's relations that link it to other concepts in
//! this patient's notes (the medications, procedures and diagnoses stated with it, dated) — ConTextual's C(d), the
//! knowledge-graph stream's view of this patient, beside the context. Pure.

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
    /// The knowledge graph's relations of this concept in the patient's notes, most documents first.
    pub relations: Vec<Relation>,
}

/// A relation of a fact's concept to another concept, as the patient's notes state it (the knowledge-graph delta's
/// concept–concept edges: docs/knowledge-graph.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Relation {
    /// `diagnosis_medication`, `diagnosis_procedure` or `medication_procedure`.
    #[serde(rename = "type")]
    pub relation: String,
    /// `from` when the fact's concept is the edge's source (the diagnosis of a treatment), `to` otherwise.
    pub direction: String,
    /// The concept at the other end: id, preferred term, entity kind.
    pub concept: String,
    pub label: String,
    pub kind: String,
    /// The best confidence any note gave it (0.9 with a cue such as "X for Y", 0.5 in one sentence, 0.3 in one
    /// assessment or plan section).
    pub confidence: f64,
    pub documents: usize,
    pub first_date: Option<String>,
    pub last_date: Option<String>,
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
                relations: Vec::new(),
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
    // Relations of the facts' concepts, wherever in the patient's notes they are stated.
    let ids: BTreeMap<&str, u32> = by.iter().map(|(&c, f)| (f.concept.as_str(), c)).collect();
    let mut related: BTreeMap<(u32, &str, &str, bool), Relation> = BTreeMap::new();
    for n in notes {
        for r in &n.relations {
            for (own, other, outgoing) in [(&r.from, &r.to, true), (&r.to, &r.from, false)] {
                let Some(&c) = ids.get(own.as_str()) else { continue };
                let e = related.entry((c, r.relation.as_str(), other.as_str(), outgoing)).or_insert_with(|| {
                    let known = lexicon.concept_index(other).map(|i| lexicon.concept(i));
                    Relation {
                        relation: r.relation.clone(),
                        direction: if outgoing { "from" } else { "to" }.to_string(),
                        concept: other.clone(),
                        label: known.map_or_else(|| other.clone(), |k| k.preferred.clone()),
                        kind: known.map_or("", |k| k.kind.as_str()).to_string(),
                        confidence: 0.0,
                        documents: 0,
                        first_date: None,
                        last_date: None,
                        doc_ids: Vec::new(),
                    }
                });
                e.confidence = e.confidence.max(r.confidence);
                if !e.doc_ids.contains(&n.doc_id) {
                    e.doc_ids.push(n.doc_id.clone());
                    e.documents += 1;
                }
                if e.first_date.is_none() || n.date.is_some() && n.date < e.first_date {
                    e.first_date = n.date.clone();
                }
                if n.date > e.last_date {
                    e.last_date = n.date.clone();
                }
            }
        }
    }
    for ((c, ..), r) in related {
        if let Some(f) = by.get_mut(&c) {
            f.relations.push(r);
        }
    }
    let mut out: Vec<Fact> = by.into_values().collect();
    for f in &mut out {
        f.relations.sort_by(|a, b| {
            b.documents.cmp(&a.documents).then(b.confidence.total_cmp(&a.confidence)).then(a.concept.cmp(&b.concept))
        });
    }
    out.sort_by(|a, b| b.mentions.cmp(&a.mentions).then_with(|| a.concept.cmp(&b.concept)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Document;
    use crate::query::context::tests::{doc, pipeline};
    use crate::query::windows::{StoredWindow, build, relations};
    use crate::stages::Pipeline;

    /// The notes as the query service reads them: stored windows, through their JSON form.
    fn stored(p: &Pipeline, docs: &[Document], radius: usize) -> Vec<WindowNote> {
        docs.iter()
            .flat_map(|d| {
                let ws = build(&d.note.text, &d.sections, &d.mentions, &relations(&d.kg), p.lexicon(), radius);
                ws.into_iter().map(move |w| {
                    let w: StoredWindow = serde_json::from_value(serde_json::to_value(&w).unwrap()).unwrap();
                    WindowNote::new(d.note.doc_id.clone(), "1".into(), d.note.date.clone(), w, p.lexicon())
                })
            })
            .collect()
    }

    #[test]
    fn a_fact_carries_the_relations_the_patients_notes_state_dated_and_counted_by_note() {
        let p = pipeline();
        let lexicon = p.lexicon();
        let filler = "The patient was seen today and vital signs were reviewed. ".repeat(20);
        let docs = [
            doc(&p, "a", "2024-01-05", "ASSESSMENT AND PLAN: Pneumonia, treated with azithromycin."),
            doc(&p, "b", "2024-02-10", &format!("HPI: Cough. {filler}\n\nPLAN: Pneumonia. Continue azithromycin.")),
            doc(&p, "c", "2024-03-01", "FINDINGS: No pneumonia. Azithromycin was stopped."),
        ];
        let pneumonia = lexicon.term_concept("pneumonia").unwrap();
        let azithromycin = lexicon.concept(lexicon.term_concept("azithromycin").unwrap()).id.clone();
        let mut a = Alignment::default();
        a.concepts.insert(pneumonia, 1.0);
        a.answer_concepts.insert(pneumonia);
        for radius in [5, 150] {
            let notes = stored(&p, &docs, radius);
            let f = facts(&notes, &a, lexicon);
            assert_eq!(f.len(), 1, "{f:?}");
            let r: Vec<&Relation> = f[0].relations.iter().filter(|r| r.concept == azithromycin).collect();
            // Stated in a and b (a cue in one sentence; the same plan section); c negates the pneumonia: no relation.
            assert_eq!(r.len(), 1, "radius {radius}: {:?}", f[0].relations);
            let r = r[0];
            assert_eq!(
                (r.relation.as_str(), r.direction.as_str(), r.kind.as_str()),
                ("diagnosis_medication", "from", "medication")
            );
            assert_eq!(r.doc_ids, ["a", "b"], "radius {radius}");
            assert_eq!((r.first_date.as_deref(), r.last_date.as_deref()), (Some("2024-01-05"), Some("2024-02-10")));
            assert_eq!(r.confidence, 0.9, "the cue of a");
        }
        // From the medication's side the same edge points the other way.
        let mut m = Alignment::default();
        m.concepts.insert(lexicon.term_concept("azithromycin").unwrap(), 1.0);
        let f = facts(&stored(&p, &docs, 150), &m, lexicon);
        assert!(f[0].relations.iter().any(|r| r.direction == "to" && r.kind == "disease"), "{f:?}");
        // A concept the notes relate to nothing has none.
        let mut none = Alignment::default();
        none.concepts.insert(lexicon.term_concept("cough").unwrap(), 1.0);
        let f = facts(&stored(&p, &docs, 150), &none, lexicon);
        assert!(f[0].relations.is_empty(), "{f:?}");
    }
}
