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

use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;
use sha1::Digest as _;

use crate::lexicon::{EntityKind, Lexicon};
pub use crate::model::kg::{CompactString, Edge, Evidence, KgDelta, Node, Op};
use crate::model::{Assertion, Mention, Note, Section};

/// A stable id: a prefix and the first 16 hex digits of the SHA-1 of the parts.
pub fn stable_id(prefix: &str, parts: &[&str]) -> String {
    spell(prefix, digest(parts)).into_string()
}

/// The first 8 bytes of the SHA-1 of the parts (each followed by 0x1f), as a big-endian number: the 16 hex digits
/// of a stable id.
fn digest(parts: &[&str]) -> u64 {
    let mut h = sha1::Sha1::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0x1f]);
    }
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("a SHA-1 has 20 bytes"))
}

/// `prefix` and the 16 hex digits of `digest`: inline (no allocation) for a prefix of up to 8 bytes.
fn spell(prefix: &str, digest: u64) -> CompactString {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    if prefix.len() > 8 {
        return CompactString::from(format!("{prefix}{digest:016x}"));
    }
    let mut buf = [0u8; 24];
    buf[..prefix.len()].copy_from_slice(prefix.as_bytes());
    for (i, h) in buf[prefix.len()..prefix.len() + 16].iter_mut().enumerate() {
        *h = HEX[(digest >> (60 - 4 * i)) as usize & 0xf];
    }
    CompactString::from_utf8(&buf[..prefix.len() + 16]).expect("a str and ASCII digits")
}

/// Each concept's node id (`stable_id("n", ["concept", concept id])`), hashed the first time a note meets the
/// concept and kept for the life of the process: a concept's id never changes in a compiled lexicon. One per
/// compiled lexicon (`stages::Compiled`), shared by every worker thread; concepts past its end (another
/// lexicon's) are hashed each time. A slot holds the id's digest (8 bytes a concept), 0 until hashed: a digest
/// that is 0 is hashed again each time, and two threads hashing one concept store the same value.
#[derive(Debug, Default)]
pub struct ConceptIds(Vec<AtomicU64>);

impl ConceptIds {
    /// Room for the concepts of `lexicon`.
    pub fn new(lexicon: &Lexicon) -> Self {
        Self((0..lexicon.concepts().count()).map(|_| AtomicU64::new(0)).collect())
    }

    /// The digest of the concept's node id (`spell("n", digest)` is the id).
    fn get(&self, lexicon: &Lexicon, concept: u32) -> u64 {
        let hash = || digest(&["concept", &lexicon.concept(concept).id]);
        match self.0.get(concept as usize) {
            Some(slot) => match slot.load(Ordering::Relaxed) {
                0 => {
                    let d = hash();
                    slot.store(d, Ordering::Relaxed);
                    d
                }
                d => d,
            },
            None => hash(),
        }
    }
}

/// An edge's type, as a code into `EDGE_TYPES`: an edge's key in a note holds the code, its record the name.
type EdgeType = u8;

const EDGE_TYPES: [&str; 10] = [
    "has_document",
    "has_condition",
    "has_symptom",
    "takes_medication",
    "underwent_procedure",
    "has_lab_test",
    "family_history_of",
    "diagnosis_medication",
    "diagnosis_procedure",
    "medication_procedure",
];
const HAS_DOCUMENT: EdgeType = 0;
const FAMILY_HISTORY_OF: EdgeType = 6;

/// A patient edge's assertion, as a code into `ASSERTIONS` (`NO_ASSERTION` for other edges).
type AssertionName = u8;

const ASSERTIONS: [&str; 4] = ["affirmed", "negated", "uncertain", "historical"];
const NO_ASSERTION: AssertionName = u8::MAX;

fn assertion_name(a: &Assertion) -> Option<AssertionName> {
    if a.hypothetical {
        None
    } else if a.historical {
        Some(3)
    } else if a.negated {
        Some(1)
    } else if a.uncertain {
        Some(2)
    } else {
        Some(0)
    }
}

fn patient_edge_type(kind: EntityKind) -> Option<EdgeType> {
    Some(match kind {
        EntityKind::Disease => 1,
        EntityKind::Symptom => 2,
        EntityKind::Medication => 3,
        EntityKind::Procedure => 4,
        EntityKind::Lab => 5,
        EntityKind::Anatomy => return None,
    })
}

fn pair_type(a: EntityKind, b: EntityKind) -> Option<(EdgeType, bool)> {
    // (type, swapped): the edge always goes diagnosis → medication / procedure, medication → procedure.
    use EntityKind::*;
    match (a, b) {
        (Disease, Medication) => Some((7, false)),
        (Medication, Disease) => Some((7, true)),
        (Disease, Procedure) => Some((8, false)),
        (Procedure, Disease) => Some((8, true)),
        (Medication, Procedure) => Some((9, false)),
        (Procedure, Medication) => Some((9, true)),
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
    let patient_node = digest(&["patient", &patient]);
    let document_node = digest(&["document", &note.doc_id]);
    let doc_id = CompactString::new(&note.doc_id);
    let mut graph = Builder {
        ids,
        nodes: Vec::with_capacity(mentions.len() + 2),
        node_digests: Vec::with_capacity(mentions.len() + 2),
        concept_at: FxHashMap::with_capacity_and_hasher(mentions.len(), Default::default()),
        node_at: FxHashMap::with_capacity_and_hasher(mentions.len(), Default::default()),
        edges: Vec::with_capacity(mentions.len() + 1),
        edge_digests: Vec::with_capacity(mentions.len() + 1),
        edge_at: FxHashMap::with_capacity_and_hasher(mentions.len() + 1, Default::default()),
    };
    graph.node_digests.extend([patient_node, document_node]);
    graph.nodes.push(Node {
        id: spell("n", patient_node),
        node_type: CompactString::const_new("patient"),
        key: CompactString::new(&patient),
        kind: None,
        label: None,
        codes: vec![],
    });
    graph.nodes.push(Node {
        id: spell("n", document_node),
        node_type: CompactString::const_new("document"),
        key: doc_id.clone(),
        kind: None,
        label: note
            .doc_type
            .as_ref()
            .and_then(|t| t.text.as_deref().or(t.coding.first()?.display.as_deref()))
            .map(CompactString::new),
        codes: vec![],
    });
    let (patient_at, document_at) = (0, 1);
    graph.add_edge(HAS_DOCUMENT, patient_at, document_at, NO_ASSERTION, 1.0, None);

    let evidence = |m: &Mention| Evidence {
        doc_id: doc_id.clone(),
        section: CompactString::const_new(sections[m.section].name),
        start: m.start as i64,
        end: m.end as i64,
    };

    for m in mentions {
        let Some(assertion) = assertion_name(&m.assertion) else { continue };
        let edge_type = if m.assertion.family {
            if m.kind == EntityKind::Anatomy {
                continue;
            }
            FAMILY_HISTORY_OF
        } else {
            match patient_edge_type(m.kind) {
                Some(t) => t,
                None => continue,
            }
        };
        let target = graph.concept(lexicon, m.concept);
        graph.add_edge(edge_type, patient_at, target, assertion, 1.0, Some(evidence(m)));
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
            graph.add_edge(edge_type, source, target, NO_ASSERTION, confidence, Some(ev));
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
/// support it. Each node and edge keeps the digest its id spells (`spell`): all node ids share the prefix `n` and
/// all edge ids `e`, so the digests order them as their ids do, and `finish` sorts by digest (the order of the
/// published delta) without comparing strings or moving a node more than twice.
struct Builder<'a> {
    ids: &'a ConceptIds,
    nodes: Vec<Node>,
    node_digests: Vec<u64>,
    /// Node index of each concept met so far, and of each node id by its digest (two concepts never share an id,
    /// but the id is what makes a node one).
    concept_at: FxHashMap<u32, usize>,
    node_at: FxHashMap<u64, usize>,
    edges: Vec<Edge>,
    edge_digests: Vec<u64>,
    edge_at: FxHashMap<(EdgeType, usize, usize, AssertionName), usize>,
}

/// `items` in ascending order of `digests` (one each), ties in their order: a stable sort by id.
fn by_digest<T>(items: Vec<T>, digests: &[u64]) -> Vec<T> {
    let mut order: Vec<(u64, u32)> = digests.iter().zip(0..).map(|(&d, i)| (d, i)).collect();
    order.sort_unstable();
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    order.iter().map(|&(_, i)| slots[i as usize].take().expect("each index once")).collect()
}

impl Builder<'_> {
    fn concept(&mut self, lexicon: &Lexicon, concept: u32) -> usize {
        if let Some(&at) = self.concept_at.get(&concept) {
            return at;
        }
        let c = lexicon.concept(concept);
        let digest = self.ids.get(lexicon, concept);
        let at = match self.node_at.get(&digest) {
            Some(&at) => at,
            None => {
                self.node_at.insert(digest, self.nodes.len());
                self.node_digests.push(digest);
                self.nodes.push(Node {
                    id: spell("n", digest),
                    node_type: CompactString::const_new("concept"),
                    key: CompactString::new(&c.id),
                    kind: Some(CompactString::const_new(c.kind.as_str())),
                    label: Some(CompactString::new(&c.preferred)),
                    codes: c.codes.iter().map(CompactString::new).collect(),
                });
                self.nodes.len() - 1
            }
        };
        self.concept_at.insert(concept, at);
        at
    }

    fn add_edge(
        &mut self,
        edge_type: EdgeType,
        source: usize,
        target: usize,
        assertion: AssertionName,
        confidence: f64,
        evidence: Option<Evidence>,
    ) {
        let at = *self.edge_at.entry((edge_type, source, target, assertion)).or_insert_with(|| {
            let (source, target) = (&self.nodes[source].id, &self.nodes[target].id);
            let edge_type = EDGE_TYPES[edge_type as usize];
            let assertion = ASSERTIONS.get(assertion as usize).copied();
            let digest = match assertion {
                Some(a) => digest(&[edge_type, source, target, a]),
                None => digest(&[edge_type, source, target]),
            };
            self.edge_digests.push(digest);
            self.edges.push(Edge {
                id: spell("e", digest),
                edge_type: CompactString::const_new(edge_type),
                source: source.clone(),
                target: target.clone(),
                assertion: assertion.map(CompactString::const_new),
                confidence,
                evidence: Vec::new(),
            });
            self.edges.len() - 1
        });
        let e = &mut self.edges[at];
        e.confidence = e.confidence.max(confidence);
        e.evidence.extend(evidence);
    }

    fn finish(self) -> (Vec<Node>, Vec<Edge>) {
        (by_digest(self.nodes, &self.node_digests), by_digest(self.edges, &self.edge_digests))
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
            assert_eq!(spell("n", ids.get(&lexicon, concept)), want);
            assert_eq!(spell("n", ids.get(&lexicon, concept)), want, "second read, from the cache");
            assert_ne!(ids.0[concept as usize].load(Ordering::Relaxed), 0);
        }
        let none = ConceptIds::default();
        assert_eq!(spell("n", none.get(&lexicon, 3)), stable_id("n", &["concept", &lexicon.concept(3).id]));
    }

    /// An id spells its digest in 16 lower-case hex digits after the prefix, so among ids of one prefix the
    /// digests order them as the strings do, and `by_digest` is a stable sort by id (ties keep their order).
    #[test]
    fn digests_order_ids_as_their_strings_do() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut digests: Vec<u64> = (0..300)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Some small, some equal, some differing in one nibble only.
                match i % 5 {
                    0 => x >> 40,
                    1 => 0,
                    2 => x & !0xf,
                    _ => x,
                }
            })
            .collect();
        digests.extend([u64::MAX, 1, 0xa, 0x9]);
        for prefix in ["n", "e", "", "longer-than-8"] {
            for &d in &digests {
                assert_eq!(spell(prefix, d), format!("{prefix}{d:016x}"));
            }
            let items: Vec<(CompactString, usize)> = digests.iter().map(|&d| spell(prefix, d)).zip(0..).collect();
            let mut want = items.clone();
            want.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(by_digest(items, &digests), want);
        }
    }
}
