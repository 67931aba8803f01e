//! Knowledge-graph deltas: what one document version asserts about its patient, as nodes and edges that
//! replace the document's previous contribution (the graph model is documented in docs/knowledge-graph.md).
//!
//! Nodes: Patient, Document, Concept (kind, canonical id, codes, preferred term). Edges:
//! * patient → concept by kind (`has_condition`, `has_symptom`, `takes_medication`, `underwent_procedure`,
//!   `has_lab_test`) with an assertion (`affirmed`, `negated`, `uncertain`, `historical`); mentions about family
//!   members become `family_history_of` edges instead; hypothetical mentions and anatomy make no edges;
//! * concept → concept (`diagnosis_medication`, `diagnosis_procedure`, `medication_procedure`) between affirmed or
//!   historical mentions of the same patient: co-occurrence in a sentence (confidence 0.5), raised to 0.9 by a
//!   cue between them ("X for Y", "Y treated with X", "started X due to Y"), or co-occurrence in an assessment /
//!   plan section (0.3); each with evidence (document, section, offsets);
//! * patient → document (`has_document`).
//!
//! Ids are stable hashes of type and endpoints (and assertion), so replays are idempotent. A delta carries
//! `op = upsert` (replace this document's contribution with these facts) or `retract` (entered-in-error: remove
//! it), plus the documents it `replaces`. Pure and synchronous.

use std::collections::{BTreeMap, HashMap};

use sha1::Digest as _;

use crate::lexicon::{EntityKind, Lexicon};
pub use crate::model::kg::{Edge, Evidence, KgDelta, Node, Op};
use crate::model::{Assertion, Mention, Note, Section};

/// A stable id: a prefix and the first 16 hex digits of the SHA-1 of the parts.
pub fn stable_id(prefix: &str, parts: &[&str]) -> String {
    let mut h = sha1::Sha1::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0x1f]);
    }
    let digest = h.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(prefix.len() + 16);
    id.push_str(prefix);
    for b in &digest[..8] {
        id.push(HEX[(b >> 4) as usize] as char);
        id.push(HEX[(b & 0xf) as usize] as char);
    }
    id
}

fn assertion_name(a: &Assertion) -> Option<&'static str> {
    if a.hypothetical {
        None
    } else if a.historical {
        Some("historical")
    } else if a.negated {
        Some("negated")
    } else if a.uncertain {
        Some("uncertain")
    } else {
        Some("affirmed")
    }
}

fn patient_edge_type(kind: EntityKind) -> Option<&'static str> {
    Some(match kind {
        EntityKind::Disease => "has_condition",
        EntityKind::Symptom => "has_symptom",
        EntityKind::Medication => "takes_medication",
        EntityKind::Procedure => "underwent_procedure",
        EntityKind::Lab => "has_lab_test",
        EntityKind::Anatomy => return None,
    })
}

fn pair_type(a: EntityKind, b: EntityKind) -> Option<(&'static str, bool)> {
    // (type, swapped): the edge always goes diagnosis → medication / procedure, medication → procedure.
    use EntityKind::*;
    match (a, b) {
        (Disease, Medication) => Some(("diagnosis_medication", false)),
        (Medication, Disease) => Some(("diagnosis_medication", true)),
        (Disease, Procedure) => Some(("diagnosis_procedure", false)),
        (Procedure, Disease) => Some(("diagnosis_procedure", true)),
        (Medication, Procedure) => Some(("medication_procedure", false)),
        (Procedure, Medication) => Some(("medication_procedure", true)),
        _ => None,
    }
}

/// Cue phrases between two mentions of a sentence that state a treatment relation.
const RELATION_CUES: &[&str] = &[
    " for ",
    " to treat ",
    " treated with ",
    " due to ",
    " secondary to ",
    " started on ",
    " managed with ",
    " controlled with ",
    " on ",
    " with ",
    " because of ",
    " given ",
    " received ",
    " status post ",
    " s/p ",
];

/// Sections where a treatment and a problem in the same section are likely related.
const PLAN_SECTIONS: &[&str] = &["assessment_and_plan", "assessment", "plan", "impression"];

/// Builds the delta of one document. `replaces` are document ids (reference prefixes removed).
pub fn delta(
    note: &Note,
    sections: &[Section],
    mentions: &[Mention],
    lexicon: &Lexicon,
    worker_version: &str,
) -> KgDelta {
    let patient = note.patient.clone().unwrap_or_else(|| format!("DocumentReference/{}", note.doc_id));
    let replaces: Vec<String> = note.replaces().map(|r| r.rsplit('/').next().unwrap_or(r).to_string()).collect();
    let base = KgDelta {
        doc_id: note.doc_id.clone(),
        version: note.version.clone(),
        last_updated: note.last_updated.clone(),
        patient: patient.clone(),
        op: Op::Retract,
        replaces,
        nodes: Vec::new(),
        edges: Vec::new(),
        lexicon_version: lexicon.version().to_string(),
        worker_version: worker_version.to_string(),
    };
    if note.entered_in_error {
        return base;
    }
    let patient_node = stable_id("n", &["patient", &patient]);
    let document_node = stable_id("n", &["document", &note.doc_id]);
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    nodes.insert(
        patient_node.clone(),
        Node {
            id: patient_node.clone(),
            node_type: "patient".into(),
            key: patient.clone(),
            kind: None,
            label: None,
            codes: vec![],
        },
    );
    nodes.insert(
        document_node.clone(),
        Node {
            id: document_node.clone(),
            node_type: "document".into(),
            key: note.doc_id.clone(),
            kind: None,
            label: note.doc_type.as_ref().and_then(|t| t.text.clone().or_else(|| t.coding.first()?.display.clone())),
            codes: vec![],
        },
    );
    let mut edges: BTreeMap<String, Edge> = BTreeMap::new();
    let mut add_edge = |edge_type: &str,
                        source: &str,
                        target: &str,
                        assertion: Option<&str>,
                        confidence: f64,
                        ev: Option<Evidence>| {
        let mut parts = vec![edge_type, source, target];
        if let Some(a) = assertion {
            parts.push(a);
        }
        let id = stable_id("e", &parts);
        let e = edges.entry(id.clone()).or_insert_with(|| Edge {
            id,
            edge_type: edge_type.to_string(),
            source: source.to_string(),
            target: target.to_string(),
            assertion: assertion.map(str::to_string),
            confidence,
            evidence: Vec::new(),
        });
        e.confidence = e.confidence.max(confidence);
        if let Some(ev) = ev {
            e.evidence.push(ev);
        }
    };
    add_edge("has_document", &patient_node, &document_node, None, 1.0, None);

    // A concept's node id, hashed once per note however many mentions and relations name it.
    let mut concept_ids: HashMap<u32, String> = HashMap::new();
    let mut concept_node = |nodes: &mut BTreeMap<String, Node>, m: &Mention| {
        if let Some(id) = concept_ids.get(&m.concept) {
            return id.clone();
        }
        let c = lexicon.concept(m.concept);
        let id = stable_id("n", &["concept", &c.id]);
        nodes.entry(id.clone()).or_insert_with(|| Node {
            id: id.clone(),
            node_type: "concept".into(),
            key: c.id.clone(),
            kind: Some(c.kind.as_str().to_string()),
            label: Some(c.preferred.clone()),
            codes: c.codes.clone(),
        });
        concept_ids.insert(m.concept, id.clone());
        id
    };
    let evidence = |m: &Mention| Evidence {
        doc_id: note.doc_id.clone(),
        section: sections[m.section].name.to_string(),
        start: m.start as i64,
        end: m.end as i64,
    };

    for m in mentions {
        let Some(assertion) = assertion_name(&m.assertion) else { continue };
        let edge_type = if m.assertion.family {
            if m.kind == EntityKind::Anatomy {
                continue;
            }
            "family_history_of"
        } else {
            match patient_edge_type(m.kind) {
                Some(t) => t,
                None => continue,
            }
        };
        let target = concept_node(&mut nodes, m);
        add_edge(edge_type, &patient_node, &target, Some(assertion), 1.0, Some(evidence(m)));
    }

    // Concept–concept relations between the patient's affirmed or historical mentions.
    let usable: Vec<&Mention> = mentions
        .iter()
        .filter(|m| {
            let a = m.assertion;
            !(a.negated || a.family || a.hypothetical || a.uncertain)
        })
        .collect();
    // Mentions are in text order, so those of one section are contiguous: only pairs within a section can relate.
    for (i, a) in usable.iter().enumerate() {
        for b in usable[i + 1..].iter().take_while(|b| b.section == a.section) {
            let Some((edge_type, swapped)) = pair_type(a.kind, b.kind) else { continue };
            let same_sentence = a.sentence == b.sentence;
            let same_plan_section = a.section == b.section && PLAN_SECTIONS.contains(&sections[a.section].name);
            if !same_sentence && !same_plan_section {
                continue;
            }
            let confidence = if same_sentence {
                let between = &note.text[a.end.min(b.start)..b.start.max(a.end)];
                let words = between.split_whitespace().count();
                let cued = words <= 6 && {
                    let padded =
                        format!(" {} ", between.split_whitespace().collect::<Vec<_>>().join(" ").to_ascii_lowercase());
                    RELATION_CUES.iter().any(|c| padded.contains(c))
                };
                if cued { 0.9 } else { 0.5 }
            } else {
                0.3
            };
            let (from, to) = if swapped { (b, a) } else { (a, b) };
            let source = concept_node(&mut nodes, from);
            let target = concept_node(&mut nodes, to);
            if source == target {
                continue;
            }
            let mut ev = evidence(from);
            ev.end = to.end.max(from.end) as i64;
            ev.start = to.start.min(from.start) as i64;
            add_edge(edge_type, &source, &target, None, confidence, Some(ev));
        }
    }
    KgDelta { op: Op::Upsert, nodes: nodes.into_values().collect(), edges: edges.into_values().collect(), ..base }
}
