//! Knowledge-graph deltas and the reference consumer: v1 then v2 equals v2 alone; entered-in-error empties a
//! document's contribution; replaces retracts; stale versions are ignored; ids are stable; relations and their
//! cues; the Avro schema round trip.

mod common;

use clinstream::kg::Graph;
use clinstream::stages::Pipeline;
use clinstream::stages::kg::{KgDelta, Op, stable_id};
use common::*;
use serde_json::json;

fn delta(p: &Pipeline, doc: serde_json::Value) -> KgDelta {
    p.process(&bytes(&doc)).unwrap().kg
}

fn versioned(id: &str, version: &str, text: &str) -> serde_json::Value {
    let mut d = valid_doc(id, text);
    d["meta"] = json!({"versionId": version});
    d
}

fn graph(deltas: &[&KgDelta]) -> serde_json::Value {
    let mut g = Graph::default();
    for d in deltas {
        g.apply(d);
    }
    g.to_json()
}

fn edge_types(g: &serde_json::Value) -> Vec<(String, Option<String>)> {
    let mut v: Vec<_> = g["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["type"].as_str().unwrap().to_string(), e["assertion"].as_str().map(str::to_string)))
        .collect();
    v.sort();
    v
}

#[test]
fn v1_then_v2_is_the_same_graph_as_v2_alone() {
    let p = Pipeline::new(&settings()).unwrap();
    let v1 = delta(&p, versioned("d1", "1", "ASSESSMENT: Pneumonia. Started amoxicillin for pneumonia.\n"));
    let v2 = delta(&p, versioned("d1", "2", "ASSESSMENT: Asthma exacerbation. No pneumonia. Albuterol for asthma.\n"));
    let other = delta(&p, versioned("d2", "1", "PLAN: Metformin for diabetes.\n"));
    assert_eq!(graph(&[&v1, &v2, &other]), graph(&[&v2, &other]));
    assert_eq!(graph(&[&v2, &v1, &other]), graph(&[&v2, &other]), "a stale v1 after v2 is ignored");
    assert_eq!(graph(&[&v2, &v2, &other, &other]), graph(&[&v2, &other]), "replays are idempotent");
    let g = graph(&[&v1, &v2]);
    let text = g.to_string();
    assert!(!text.contains("amoxicillin") && !text.contains("Amoxicillin"), "v1's facts are gone: {text}");
    assert!(
        edge_types(&g).contains(&("has_condition".into(), Some("negated".into()))),
        "no pneumonia is a negated edge"
    );
}

#[test]
fn entered_in_error_and_replaces_retract_a_documents_contribution() {
    let p = Pipeline::new(&settings()).unwrap();
    let a = delta(&p, versioned("a", "1", "ASSESSMENT: Hypertension.\n"));
    let b = delta(&p, versioned("b", "1", "ASSESSMENT: Hypertension and gout.\n"));
    let mut err = versioned("b", "2", "ASSESSMENT: Hypertension and gout.\n");
    err["status"] = json!("entered-in-error");
    let b_err = delta(&p, err);
    assert_eq!(b_err.op, Op::Retract);
    assert!(b_err.edges.is_empty());
    assert_eq!(graph(&[&a, &b, &b_err]), graph(&[&a]), "only a's contribution is left");

    let mut c = versioned("c", "1", "ASSESSMENT: Migraine.\n");
    c["relatesTo"] = json!([{"code": "replaces", "target": {"reference": "DocumentReference/a"}}]);
    let c = delta(&p, c);
    assert_eq!(c.replaces, vec!["a"]);
    assert_eq!(graph(&[&a, &c]), graph(&[&c]));
    assert_eq!(graph(&[&a, &c, &a]), graph(&[&c]), "a replaced document stays retracted");
}

#[test]
fn shared_edges_survive_until_their_last_document_goes() {
    let p = Pipeline::new(&settings()).unwrap();
    let mut a = valid_doc("a", "ASSESSMENT: Hypertension.\n");
    let mut b = valid_doc("b", "ASSESSMENT: Hypertension.\n");
    a["subject"] = json!({"reference": "Patient/p9"});
    b["subject"] = json!({"reference": "Patient/p9"});
    let (a, b) = (delta(&p, a), delta(&p, b));
    let mut g = Graph::default();
    g.apply(&a);
    g.apply(&b);
    let condition = |g: &Graph| g.edges().find(|e| e.edge.edge_type == "has_condition").map(|e| e.documents.len());
    assert_eq!(condition(&g), Some(2));
    g.apply(&KgDelta { op: Op::Retract, version: Some("2".into()), nodes: vec![], edges: vec![], ..a.clone() });
    assert_eq!(condition(&g), Some(1));
    g.apply(&KgDelta { op: Op::Retract, version: Some("2".into()), nodes: vec![], edges: vec![], ..b.clone() });
    assert_eq!(condition(&g), None);
}

#[test]
fn ids_are_stable_across_runs_and_releases() {
    // Fixed values (checked with Python's hashlib: SHA-1 of the parts, each followed by 0x1F, first 8 bytes).
    // A change here breaks every consumer's idempotency, so it must be deliberate.
    assert_eq!(stable_id("e", &["has_condition", "np", "nc", "affirmed"]), "e93702375fd83490a");
    assert_eq!(stable_id("n", &["concept", "DOID:552"]), "nea57229ab466dc19");
    let p = Pipeline::new(&settings()).unwrap();
    let doc = valid_doc("d", "ASSESSMENT: Pneumonia treated with azithromycin.\n");
    assert_eq!(delta(&p, doc.clone()), delta(&p, doc));
}

#[test]
fn relations_families_and_negations() {
    let p = Pipeline::new(&settings()).unwrap();
    let d = delta(
        &p,
        valid_doc(
            "d",
            "HPI: Denies chest pain.\nFAMILY HISTORY: Mother with breast cancer.\nASSESSMENT: Hypertension. Started lisinopril for hypertension.\nPLAN: Chest x-ray.\n",
        ),
    );
    let g = graph(&[&d]);
    let types = edge_types(&g);
    assert!(types.contains(&("has_symptom".into(), Some("negated".into()))), "{types:?}");
    assert!(types.contains(&("family_history_of".into(), Some("affirmed".into()))), "{types:?}");
    let rel = g["edges"].as_array().unwrap().iter().find(|e| e["type"] == "diagnosis_medication").expect("a relation");
    assert_eq!(rel["confidence"], 0.9, "\"lisinopril for hypertension\" is a cue");
    assert_eq!(rel["evidence"][0]["section"], "assessment");
    // Family history never becomes the patient's condition.
    let cancer = g["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["label"].as_str().is_some_and(|l| l.contains("breast")))
        .unwrap();
    let cancer_id = cancer["id"].as_str().unwrap();
    for e in g["edges"].as_array().unwrap().iter().filter(|e| e["target"] == cancer_id) {
        assert_eq!(e["type"], "family_history_of");
    }
}

#[test]
fn avro_schema_round_trip() {
    let p = Pipeline::new(&settings()).unwrap();
    let mut doc =
        versioned("d", "7", "ASSESSMENT: Pneumonia. Started amoxicillin for pneumonia.\nPLAN: Chest x-ray.\n");
    doc["relatesTo"] = json!([{"code": "replaces", "target": {"reference": "DocumentReference/old"}}]);
    let d = delta(&p, doc);
    let schema_text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/clinstream.kg.v1.avsc")).unwrap();
    let schema = apache_avro::Schema::parse_str(&schema_text).unwrap();
    let mut writer = apache_avro::Writer::new(&schema, Vec::new()).unwrap();
    writer.append_ser(&d).unwrap();
    let encoded = writer.into_inner().unwrap();
    let reader = apache_avro::Reader::new(&encoded[..]).unwrap();
    let values: Vec<_> = reader.map(|v| v.unwrap()).collect();
    assert_eq!(values.len(), 1);
    let back: KgDelta = apache_avro::from_value(&values[0]).unwrap();
    assert_eq!(back, d);
    assert!(!d.edges.is_empty() && !d.nodes.is_empty());
}

#[test]
fn kg_synthea_check_on_a_small_export() {
    let dir = tempfile::tempdir().unwrap();
    let mut note = valid_doc(
        "n1",
        "HISTORY OF PRESENT ILLNESS: History of hypertension. Denies asthma.\nMEDICATIONS: Lisinopril.\n",
    );
    note["subject"] = json!({"reference": "Patient/p1"});
    std::fs::write(dir.path().join("DocumentReference.000.ndjson"), format!("{note}\n")).unwrap();
    let condition = |text: &str| json!({"resourceType": "Condition", "subject": {"reference": "Patient/p1"}, "code": {"text": text}});
    std::fs::write(
        dir.path().join("Condition.000.ndjson"),
        format!(
            "{}\n{}\n{}\n",
            condition("Hypertension (disorder)"),
            condition("Asthma (disorder)"),
            condition("Full-time employment (finding)")
        ),
    )
    .unwrap();
    let med = json!({"resourceType": "MedicationRequest", "subject": {"reference": "Patient/p1"},
                     "medicationCodeableConcept": {"coding": [{"display": "lisinopril 10 MG Oral Tablet"}]}});
    std::fs::write(dir.path().join("MedicationRequest.000.ndjson"), format!("{med}\n")).unwrap();
    let p = Pipeline::new(&settings()).unwrap();
    let r = clinstream::eval::kg_synthea::run(&p, dir.path()).unwrap();
    assert_eq!((r.patients, r.notes), (1, 1));
    assert_eq!(r.conditions.structured, 3);
    assert_eq!(r.conditions.mappable, 2, "employment maps to no disease");
    assert_eq!(r.conditions.recovered, 1, "hypertension is recovered, the denied asthma is not");
    assert_eq!((r.medications.mappable, r.medications.recovered), (1, 1));
}
