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

use std::sync::OnceLock;

use rustc_hash::FxHashMap;
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

/// Each concept's node id (`stable_id("n", ["concept", concept id])`), hashed the first time a note meets the
/// concept and kept for the life of the process: a concept's id never changes in a compiled lexicon. One per
/// compiled lexicon (`stages::Compiled`), shared by every worker thread; concepts past its end (another
/// lexicon's) are hashed each time.
#[derive(Debug, Default)]
pub struct ConceptIds(Vec<OnceLock<Box<str>>>);

impl ConceptIds {
    /// Room for the concepts of `lexicon`.
    pub fn new(lexicon: &Lexicon) -> Self {
        Self((0..lexicon.concepts().count()).map(|_| OnceLock::new()).collect())
    }

    fn get(&self, lexicon: &Lexicon, concept: u32) -> String {
        let hash = || stable_id("n", &["concept", &lexicon.concept(concept).id]);
        match self.0.get(concept as usize) {
            Some(slot) => slot.get_or_init(|| hash().into()).to_string(),
            None => hash(),
        }
    }
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
    ids: &ConceptIds,
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
    let mut graph = Builder {
        ids,
        nodes: Vec::new(),
        concept_at: FxHashMap::default(),
        node_at: FxHashMap::default(),
        edges: Vec::new(),
        edge_at: FxHashMap::default(),
    };
    graph.nodes.push(Node {
        id: patient_node,
        node_type: "patient".into(),
        key: patient.clone(),
        kind: None,
        label: None,
        codes: vec![],
    });
    graph.nodes.push(Node {
        id: document_node,
        node_type: "document".into(),
        key: note.doc_id.clone(),
        kind: None,
        label: note.doc_type.as_ref().and_then(|t| t.text.clone().or_else(|| t.coding.first()?.display.clone())),
        codes: vec![],
    });
    let (patient_at, document_at) = (0, 1);
    graph.add_edge("has_document", patient_at, document_at, None, 1.0, None);

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
        let target = graph.concept(lexicon, m.concept);
        graph.add_edge(edge_type, patient_at, target, Some(assertion), 1.0, Some(evidence(m)));
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
                if cued(&note.text[a.end.min(b.start)..b.start.max(a.end)]) { 0.9 } else { 0.5 }
            } else {
                0.3
            };
            let (from, to) = if swapped { (b, a) } else { (a, b) };
            let source = graph.concept(lexicon, from.concept);
            let target = graph.concept(lexicon, to.concept);
            if source == target {
                continue;
            }
            let mut ev = evidence(from);
            ev.end = to.end.max(from.end) as i64;
            ev.start = to.start.min(from.start) as i64;
            graph.add_edge(edge_type, source, target, None, confidence, Some(ev));
        }
    }
    let (nodes, edges) = graph.finish();
    KgDelta { op: Op::Upsert, nodes, edges, ..base }
}

/// Whether the words between two mentions (at most six) hold a relation cue: the cue's words in a row, ASCII
/// case ignored — what `" {words joined by one space, lower-cased} ".contains(cue)` says, without building it.
fn cued(between: &str) -> bool {
    let mut words = [""; 6];
    let mut n = 0;
    for w in between.split_whitespace() {
        if n == words.len() {
            return false;
        }
        words[n] = w;
        n += 1;
    }
    let words = &words[..n];
    RELATION_CUES.iter().any(|cue| {
        let len = cue.split_whitespace().count();
        words.windows(len).any(|run| run.iter().zip(cue.split_whitespace()).all(|(w, c)| w.eq_ignore_ascii_case(c)))
    })
}

/// One note's nodes and edges as they are found. Nodes are indexes into `nodes` (distinct ids); an edge is keyed
/// by its type, endpoints and assertion, so its stable id is hashed once, when first met, however many mentions
/// support it. `finish` orders both by id (the order of the published delta).
struct Builder<'a> {
    ids: &'a ConceptIds,
    nodes: Vec<Node>,
    /// Node index of each concept met so far, and of each node id (two concepts never share an id, but the id
    /// is what makes a node one).
    concept_at: FxHashMap<u32, usize>,
    node_at: FxHashMap<String, usize>,
    edges: Vec<Edge>,
    edge_at: FxHashMap<(&'static str, usize, usize, Option<&'static str>), usize>,
}

impl Builder<'_> {
    fn concept(&mut self, lexicon: &Lexicon, concept: u32) -> usize {
        if let Some(&at) = self.concept_at.get(&concept) {
            return at;
        }
        let c = lexicon.concept(concept);
        let id = self.ids.get(lexicon, concept);
        let at = match self.node_at.get(&id) {
            Some(&at) => at,
            None => {
                self.node_at.insert(id.clone(), self.nodes.len());
                self.nodes.push(Node {
                    id,
                    node_type: "concept".into(),
                    key: c.id.clone(),
                    kind: Some(c.kind.as_str().to_string()),
                    label: Some(c.preferred.clone()),
                    codes: c.codes.clone(),
                });
                self.nodes.len() - 1
            }
        };
        self.concept_at.insert(concept, at);
        at
    }

    fn add_edge(
        &mut self,
        edge_type: &'static str,
        source: usize,
        target: usize,
        assertion: Option<&'static str>,
        confidence: f64,
        evidence: Option<Evidence>,
    ) {
        let at = *self.edge_at.entry((edge_type, source, target, assertion)).or_insert_with(|| {
            let (source, target) = (&self.nodes[source].id, &self.nodes[target].id);
            let id = match assertion {
                Some(a) => stable_id("e", &[edge_type, source, target, a]),
                None => stable_id("e", &[edge_type, source, target]),
            };
            self.edges.push(Edge {
                id,
                edge_type: edge_type.to_string(),
                source: source.clone(),
                target: target.clone(),
                assertion: assertion.map(str::to_string),
                confidence,
                evidence: Vec::new(),
            });
            self.edges.len() - 1
        });
        let e = &mut self.edges[at];
        e.confidence = e.confidence.max(confidence);
        e.evidence.extend(evidence);
    }

    fn finish(mut self) -> (Vec<Node>, Vec<Edge>) {
        self.nodes.sort_by(|a, b| a.id.cmp(&b.id));
        self.edges.sort_by(|a, b| a.id.cmp(&b.id));
        (self.nodes, self.edges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A concept's node id is hashed once and kept, and is what hashing it each time gives; a concept past the
    /// cache's end (another lexicon's) is hashed each time, alike.
    #[test]
    fn cached_concept_ids_are_the_hashed_ones() {
        let lexicon = Lexicon::builtin();
        let ids = ConceptIds::new(&lexicon);
        let last = lexicon.concepts().count() as u32 - 1;
        for concept in [0, 1, last / 2, last] {
            let want = stable_id("n", &["concept", &lexicon.concept(concept).id]);
            assert_eq!(ids.get(&lexicon, concept), want);
            assert_eq!(ids.get(&lexicon, concept), want, "second read, from the cache");
            assert!(ids.0[concept as usize].get().is_some());
        }
        let none = ConceptIds::default();
        assert_eq!(none.get(&lexicon, 3), stable_id("n", &["concept", &lexicon.concept(3).id]));
    }
}
