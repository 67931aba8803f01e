//! The reference consumer of the knowledge-graph stream: applies deltas in order and holds exactly the graph
//! implied by the current versions of all documents (docs/knowledge-graph.md). `clinstream kg materialize`
//! writes it as JSON and GraphML.
//!
//! Every node and edge keeps the set of documents that support it. Applying a delta for document D: ignore it if
//! D was replaced by another document or if a newer version of D was already applied; retract the documents D
//! replaces (and remember them as replaced); remove D's support everywhere; for `upsert`, add D's support to the
//! delta's nodes and edges. Nodes and edges left without support disappear. Applying the same delta twice, or
//! v1 then v2, gives the same graph as v2 alone.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::model::kg::{CompactString, Edge, Evidence, KgDelta, Node, Op};

/// Per supporting document: its confidence and evidence for an edge.
type Support = BTreeMap<String, (f64, Vec<Evidence>)>;

#[derive(Debug, Default)]
pub struct Graph {
    /// Latest applied version per document (None: applied without a version).
    versions: HashMap<String, Option<String>>,
    /// Documents replaced by another (`relatesTo.replaces`); their later deltas are ignored.
    replaced: BTreeSet<String>,
    nodes: BTreeMap<CompactString, (Node, BTreeSet<String>)>,
    /// Edge, and per supporting document its confidence and evidence.
    edges: BTreeMap<CompactString, (Edge, Support)>,
    /// Which nodes and edges each document supports (for retraction without a full scan).
    by_doc: HashMap<String, (Vec<CompactString>, Vec<CompactString>)>,
}

/// Orders document versions: numbers numerically, otherwise as text; a missing version is the oldest.
fn compare_versions(a: &Option<String>, b: &Option<String>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => x.cmp(y),
        },
    }
}

/// An edge as materialized: its attributes, the supporting documents, the best confidence and all evidence.
#[derive(Debug, Serialize, PartialEq)]
pub struct MaterializedEdge<'a> {
    #[serde(flatten)]
    pub edge: &'a Edge,
    pub documents: Vec<&'a str>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct MaterializedNode<'a> {
    #[serde(flatten)]
    pub node: &'a Node,
    pub documents: Vec<&'a str>,
}

impl Graph {
    /// Applies one delta; returns false when it was ignored (stale version or replaced document).
    pub fn apply(&mut self, d: &KgDelta) -> bool {
        if self.replaced.contains(&d.doc_id) {
            return false;
        }
        if let Some(known) = self.versions.get(&d.doc_id)
            && compare_versions(&d.version, known) == Ordering::Less
        {
            return false;
        }
        for r in &d.replaces {
            self.retract(r);
            self.replaced.insert(r.clone());
            self.versions.remove(r);
        }
        self.retract(&d.doc_id);
        self.versions.insert(d.doc_id.clone(), d.version.clone());
        if d.op == Op::Retract {
            return true;
        }
        let support = self.by_doc.entry(d.doc_id.clone()).or_default();
        for n in &d.nodes {
            let entry = self.nodes.entry(n.id.clone()).or_insert_with(|| (n.clone(), BTreeSet::new()));
            entry.0 = n.clone();
            entry.1.insert(d.doc_id.clone());
            support.0.push(n.id.clone());
        }
        for e in &d.edges {
            let entry = self.edges.entry(e.id.clone()).or_insert_with(|| (e.clone(), BTreeMap::new()));
            entry.1.insert(d.doc_id.clone(), (e.confidence, e.evidence.clone()));
            entry.0 = Edge { evidence: Vec::new(), ..e.clone() };
            Self::refresh(entry);
            support.1.push(e.id.clone());
        }
        true
    }

    /// Recomputes an edge's confidence and evidence from its supporting documents.
    fn refresh(entry: &mut (Edge, Support)) {
        entry.0.confidence = entry.1.values().map(|(c, _)| *c).fold(0.0, f64::max);
        entry.0.evidence = entry.1.values().flat_map(|(_, ev)| ev.iter().cloned()).collect();
    }

    /// Removes every bit of support `doc_id` gave.
    fn retract(&mut self, doc_id: &str) {
        let Some((nodes, edges)) = self.by_doc.remove(doc_id) else { return };
        for id in edges {
            if let Some(entry) = self.edges.get_mut(&id) {
                entry.1.remove(doc_id);
                if entry.1.is_empty() {
                    self.edges.remove(&id);
                } else {
                    Self::refresh(entry);
                }
            }
        }
        for id in nodes {
            if let Some(entry) = self.nodes.get_mut(&id) {
                entry.1.remove(doc_id);
                if entry.1.is_empty() {
                    self.nodes.remove(&id);
                }
            }
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn edge_count(&self) -> usize {
        self.edges.len()
    }

    pub fn nodes(&self) -> impl Iterator<Item = MaterializedNode<'_>> {
        self.nodes
            .values()
            .map(|(n, docs)| MaterializedNode { node: n, documents: docs.iter().map(String::as_str).collect() })
    }

    pub fn edges(&self) -> impl Iterator<Item = MaterializedEdge<'_>> {
        self.edges
            .values()
            .map(|(e, docs)| MaterializedEdge { edge: e, documents: docs.keys().map(String::as_str).collect() })
    }

    /// `{"nodes": [...], "edges": [...]}`, sorted by id.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "nodes": self.nodes().collect::<Vec<_>>(),
            "edges": self.edges().collect::<Vec<_>>(),
        })
    }

    /// GraphML with node attributes (type, key, kind, label, codes) and edge attributes (type, assertion,
    /// confidence, documents).
    pub fn to_graphml(&self) -> String {
        let mut out = String::from(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<graphml xmlns=\"http://graphml.graphdrawing.org/xmlns\">\n",
        );
        for (id, on, name, ty) in [
            ("n_type", "node", "type", "string"),
            ("n_key", "node", "key", "string"),
            ("n_kind", "node", "kind", "string"),
            ("n_label", "node", "label", "string"),
            ("n_codes", "node", "codes", "string"),
            ("e_type", "edge", "type", "string"),
            ("e_assertion", "edge", "assertion", "string"),
            ("e_confidence", "edge", "confidence", "double"),
            ("e_documents", "edge", "documents", "string"),
        ] {
            out.push_str(&format!("  <key id=\"{id}\" for=\"{on}\" attr.name=\"{name}\" attr.type=\"{ty}\"/>\n"));
        }
        out.push_str("  <graph id=\"clinstream\" edgedefault=\"directed\">\n");
        for (n, _) in self.nodes.values() {
            out.push_str(&format!("    <node id=\"{}\">\n", xml(&n.id)));
            let codes = n.codes.join("|");
            for (key, value) in [
                ("n_type", Some(n.node_type.as_str())),
                ("n_key", Some(n.key.as_str())),
                ("n_kind", n.kind.as_deref()),
                ("n_label", n.label.as_deref()),
                ("n_codes", Some(codes.as_str()).filter(|c| !c.is_empty())),
            ] {
                if let Some(v) = value {
                    out.push_str(&format!("      <data key=\"{key}\">{}</data>\n", xml(v)));
                }
            }
            out.push_str("    </node>\n");
        }
        for (e, docs) in self.edges.values() {
            out.push_str(&format!(
                "    <edge id=\"{}\" source=\"{}\" target=\"{}\">\n",
                xml(&e.id),
                xml(&e.source),
                xml(&e.target)
            ));
            out.push_str(&format!("      <data key=\"e_type\">{}</data>\n", xml(&e.edge_type)));
            if let Some(a) = &e.assertion {
                out.push_str(&format!("      <data key=\"e_assertion\">{}</data>\n", xml(a)));
            }
            out.push_str(&format!("      <data key=\"e_confidence\">{}</data>\n", e.confidence));
            let documents: Vec<&str> = docs.keys().map(String::as_str).collect();
            out.push_str(&format!("      <data key=\"e_documents\">{}</data>\n", xml(&documents.join("|"))));
            out.push_str("    </edge>\n");
        }
        out.push_str("  </graph>\n</graphml>\n");
        out
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
