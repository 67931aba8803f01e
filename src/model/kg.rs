//! A knowledge-graph delta: what one document version asserts about its patient (docs/knowledge-graph.md).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Upsert,
    Retract,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    /// `patient`, `document` or `concept`.
    #[serde(rename = "type")]
    pub node_type: String,
    /// Patient / document reference, or the concept's canonical id.
    pub key: String,
    /// Concept kind (medication, symptom, disease, procedure, lab, anatomy); null for other nodes.
    pub kind: Option<String>,
    pub label: Option<String>,
    pub codes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub doc_id: String,
    pub section: String,
    pub start: i64,
    pub end: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    pub id: String,
    #[serde(rename = "type")]
    pub edge_type: String,
    pub source: String,
    pub target: String,
    /// For patient → concept edges: affirmed, negated, uncertain, historical; null otherwise.
    pub assertion: Option<String>,
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
