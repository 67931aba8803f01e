//! `clinstream-lab eval kg-synthea --fhir DIR`: how much of a Synthea patient's coded record the knowledge graph
//! recovers from the notes alone (issue baseline, no target yet).
//!
//! From a Synthea bulk export (`DocumentReference.000.ndjson`, `Condition.000.ndjson`,
//! `MedicationRequest.000.ndjson`): every note runs through the pipeline and its deltas are applied per
//! patient; every coded condition and medication is mapped to lexicon concepts through its display text (the
//! same matcher as the notes). A coded item is *mappable* when its text yields a concept of the right kind
//! (conditions: disease or symptom; medications: medication) and *recovered* when one of those concepts is the
//! target of the patient's affirmed or historical `has_condition` / `has_symptom` / `takes_medication` edge.
//! Graph facts without a counterpart are the patient's affirmed or historical condition / medication edges
//! whose concept no coded item of the patient maps to.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use super::{EvalError, read};
use crate::lexicon::EntityKind;
use crate::stages::Pipeline;

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Recovery {
    /// Distinct coded items (per patient).
    pub structured: u64,
    pub mappable: u64,
    pub recovered: u64,
    /// recovered / mappable.
    pub recall: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct GraphFacts {
    pub facts: u64,
    pub without_structured_counterpart: u64,
    pub share_without_counterpart: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KgSynthea {
    pub patients: u64,
    pub notes: u64,
    pub conditions: Recovery,
    pub medications: Recovery,
    pub graph_conditions: GraphFacts,
    pub graph_medications: GraphFacts,
}

fn ndjson(path: &Path) -> Result<Vec<Value>, EvalError> {
    read(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| EvalError::Format { path: path.display().to_string(), why: format!("invalid JSON: {e}") })
        })
        .collect()
}

fn display(v: &Value) -> Option<String> {
    v.get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| v.get("coding")?.as_array()?.iter().find_map(|c| c.get("display")?.as_str().map(str::to_string)))
}

/// Concepts the graph asserts for one patient: (conditions and symptoms, medications).
type Asserted = (BTreeSet<String>, BTreeSet<String>);

pub fn run(pipeline: &Pipeline, dir: &Path) -> Result<KgSynthea, EvalError> {
    let lexicon = pipeline.lexicon();
    // patient -> (condition concepts, medication concepts) asserted by the graph.
    let mut graph: BTreeMap<String, Asserted> = BTreeMap::new();
    let mut notes = 0;
    for doc in ndjson(&dir.join("DocumentReference.000.ndjson"))? {
        let Ok(d) = pipeline.process(doc.to_string().as_bytes()) else { continue };
        notes += 1;
        let delta = d.kg;
        let keys: BTreeMap<&str, &str> = delta.nodes.iter().map(|n| (n.id.as_str(), n.key.as_str())).collect();
        let entry = graph.entry(delta.patient.clone()).or_default();
        for e in &delta.edges {
            if !matches!(e.assertion.as_deref(), Some("affirmed" | "historical")) {
                continue;
            }
            let Some(concept) = keys.get(e.target.as_str()) else { continue };
            match e.edge_type.as_str() {
                "has_condition" | "has_symptom" => entry.0.insert(concept.to_string()),
                "takes_medication" => entry.1.insert(concept.to_string()),
                _ => false,
            };
        }
    }
    let concepts_of = |text: &str, kinds: &[EntityKind]| -> BTreeSet<String> {
        lexicon
            .find(text)
            .iter()
            .map(|m| lexicon.concept(m.concept))
            .filter(|c| kinds.contains(&c.kind))
            .map(|c| c.id.clone())
            .collect()
    };
    let score = |file: &str,
                 field: &str,
                 kinds: &[EntityKind],
                 pick: fn(&Asserted) -> &BTreeSet<String>|
     -> Result<(Recovery, GraphFacts), EvalError> {
        let mut items: BTreeMap<String, HashSet<String>> = BTreeMap::new(); // patient -> distinct texts
        for r in ndjson(&dir.join(file))? {
            let (Some(patient), Some(text)) =
                (r.pointer("/subject/reference").and_then(Value::as_str), r.get(field).and_then(display))
            else {
                continue;
            };
            items.entry(patient.to_string()).or_default().insert(text);
        }
        let mut rec = Recovery::default();
        let mut facts = GraphFacts::default();
        let empty = (BTreeSet::new(), BTreeSet::new());
        for (patient, texts) in &items {
            let asserted = pick(graph.get(patient).unwrap_or(&empty));
            let mut structured_concepts = BTreeSet::new();
            for text in texts {
                rec.structured += 1;
                let concepts = concepts_of(text, kinds);
                if concepts.is_empty() {
                    continue;
                }
                rec.mappable += 1;
                if concepts.iter().any(|c| asserted.contains(c)) {
                    rec.recovered += 1;
                }
                structured_concepts.extend(concepts);
            }
            facts.facts += asserted.len() as u64;
            facts.without_structured_counterpart += asserted.difference(&structured_concepts).count() as u64;
        }
        rec.recall = if rec.mappable > 0 { rec.recovered as f64 / rec.mappable as f64 } else { 0.0 };
        facts.share_without_counterpart =
            if facts.facts > 0 { facts.without_structured_counterpart as f64 / facts.facts as f64 } else { 0.0 };
        Ok((rec, facts))
    };
    let (conditions, graph_conditions) =
        score("Condition.000.ndjson", "code", &[EntityKind::Disease, EntityKind::Symptom], |g| &g.0)?;
    let (medications, graph_medications) =
        score("MedicationRequest.000.ndjson", "medicationCodeableConcept", &[EntityKind::Medication], |g| &g.1)?;
    Ok(KgSynthea { patients: graph.len() as u64, notes, conditions, medications, graph_conditions, graph_medications })
}
