//! A knowledge-graph delta: what one document version asserts about its patient (docs/knowledge-graph.md).
//!
//! Node, edge and evidence strings are `CompactString`s: ids (17 characters), types, kinds, assertions, sections
//! and most keys fit inline (24 bytes), so building a delta and copying it allocates for long labels and
//! document ids only. They read as `&str` (`Deref`) and serialize as strings.

pub use compact_str::CompactString;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Upsert,
    Retract,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: CompactString,
    /// `patient`, `document` or `concept`.
    #[serde(rename = "type")]
    pub node_type: CompactString,
    /// Patient / document reference, or the concept's canonical id.
    pub key: CompactString,
    /// Concept kind (medication, symptom, disease, procedure, lab, anatomy); null for other nodes.
    pub kind: Option<CompactString>,
    pub label: Option<CompactString>,
    pub codes: Vec<CompactString>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub doc_id: CompactString,
    pub section: CompactString,
    pub start: i64,
    pub end: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    pub id: CompactString,
    #[serde(rename = "type")]
    pub edge_type: CompactString,
    pub source: CompactString,
    pub target: CompactString,
    /// For patient → concept edges: affirmed, negated, uncertain, historical; null otherwise.
    pub assertion: Option<CompactString>,
    pub confidence: f64,
    pub evidence: Vec<Evidence>,
}

/// One document version's contribution to the graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KgDelta {
    pub doc_id: String,
    pub version: Option<String>,
    pub last_updated: Option<String>,
    pub patient: String,
    pub op: Op,
    /// Document ids whose contributions this document removes (`relatesTo.replaces`).
    pub replaces: Vec<String>,
    pub nodes: Vec<Node>,
    pub edges: Vec<Edge>,
    pub lexicon_version: String,
    pub worker_version: String,
}
