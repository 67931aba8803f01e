//! The malformed-event corpus: every kind of bad input gets its own code, a PHI-free detail, and no panic.

mod common;

use std::collections::HashSet;

use clinstream::error::{Disposition, ErrorCode};
use clinstream::stages::Pipeline;
use common::*;

#[test]
fn every_malformed_kind_is_dead_lettered_with_its_code() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let corpus = malformed_corpus();
    assert!(corpus.len() >= 40, "the corpus covers at least 40 kinds, has {}", corpus.len());
    let mut failures = Vec::new();
    for case in &corpus {
        match pipeline.process(&case.bytes) {
            Ok(_) => failures.push(format!("{}: accepted", case.name)),
            Err(rejected) => {
                if rejected.error.code != case.code {
                    failures.push(format!("{}: got {} expected {}", case.name, rejected.error.code, case.code));
                }
                assert_eq!(rejected.error.code.disposition(), Disposition::DeadLetter, "{}", case.name);
                assert!(!rejected.error.detail.is_empty(), "{}", case.name);
                assert!(
                    !rejected.error.detail.contains("CANARY"),
                    "{}: detail leaks input: {}",
                    case.name,
                    rejected.error.detail
                );
                assert!(rejected.error.detail.len() < 300, "{}: detail is bounded", case.name);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    let names: HashSet<_> = corpus.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), corpus.len(), "case names are unique");
}

#[test]
fn the_document_id_is_kept_when_it_was_read() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let doc = doc_with("doc-9", vec![serde_json::json!({"contentType": "application/pdf", "data": b64(b"%PDF")})]);
    let rejected = pipeline.process(&bytes(&doc)).unwrap_err();
    assert_eq!(rejected.doc_id.as_deref(), Some("doc-9"));
    let rejected = pipeline.process(br#"{"resourceType":"DocumentReference","id":"bad id"}"#).unwrap_err();
    assert_eq!(rejected.doc_id, None, "an invalid id is not echoed");
}

#[test]
fn limits_and_preferences_come_from_settings() {
    let small = Pipeline::new(&settings_with(&[("CLINSTREAM__INPUT__MAX_MESSAGE_BYTES", "100")])).unwrap();
    let doc = bytes(&valid_doc("doc-1", &"word ".repeat(50)));
    assert_eq!(small.process(&doc).unwrap_err().error.code, ErrorCode::MessageTooLarge);

    let plain_only =
        Pipeline::new(&settings_with(&[("CLINSTREAM__DECODE__CONTENT_TYPE_PREFERENCE", "text/plain")])).unwrap();
    let html =
        doc_with("doc-1", vec![serde_json::json!({"contentType": "text/html", "data": b64(b"<p>Hi there</p>")})]);
    assert_eq!(plain_only.process(&bytes(&html)).unwrap_err().error.code, ErrorCode::UnsupportedContentType);
    assert!(Pipeline::new(&settings()).unwrap().process(&bytes(&html)).is_ok());
}

#[test]
fn tolerated_oddities_decode() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    // A huge string in a field the worker does not read.
    let mut doc = valid_doc("doc-1", "Chest pain.");
    doc["text"] = serde_json::json!({"div": "x".repeat(3_000_000)});
    assert!(pipeline.process(&bytes(&doc)).is_ok());
    // Deep nesting and unchecked escapes in a field the worker does not read are skipped without recursion.
    let mut raw = bytes(&valid_doc("doc-1", "Chest pain."));
    raw.pop();
    raw.extend(format!(r#","x":{}{},"y":"\ud800"}}"#, "[".repeat(200_000), "]".repeat(200_000)).bytes());
    assert!(pipeline.process(&raw).is_ok());
    // A UTF-8 BOM before the JSON, unknown fields, R5-style string size, base64 with line breaks.
    let text = b"Plan: rest.";
    let mut doc = doc_with(
        "doc-2",
        vec![
            serde_json::json!({"contentType": "text/plain", "data": format!("{}\n", b64(text)), "size": text.len().to_string(), "hash": sha1_b64(text)}),
        ],
    );
    doc["extension"] = serde_json::json!([{"url": "x", "valueString": "y"}]);
    let mut raw = b"\xEF\xBB\xBF".to_vec();
    raw.extend(bytes(&doc));
    let out = pipeline.process(&raw).unwrap();
    assert!(out.note.attachment.hash_verified);
    assert_eq!(out.note.text, "Plan: rest.");
}

#[test]
fn several_attachments_are_chosen_by_preference() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let doc = doc_with(
        "doc-1",
        vec![
            serde_json::json!({"contentType": "application/pdf", "data": b64(b"%PDF")}),
            serde_json::json!({"contentType": "text/html", "data": b64(b"<p>From HTML.</p>")}),
            serde_json::json!({"contentType": "text/plain", "data": b64(b"From plain text.")}),
        ],
    );
    let out = pipeline.process(&bytes(&doc)).unwrap();
    assert_eq!(out.note.attachment.index, 2);
    assert_eq!(out.note.attachment.content_type, "text/plain");
    assert_eq!(out.note.text, "From plain text.");
    let html_first =
        Pipeline::new(&settings_with(&[("CLINSTREAM__DECODE__CONTENT_TYPE_PREFERENCE", "text/html,text/plain")]))
            .unwrap();
    let out = html_first.process(&bytes(&doc)).unwrap();
    assert_eq!((out.note.attachment.index, out.note.text.as_str()), (1, "From HTML.\n"));
}

#[test]
fn entered_in_error_and_replaces_are_carried() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let mut doc = valid_doc("doc-2", "Corrected note.");
    doc["status"] = serde_json::json!("entered-in-error");
    doc["relatesTo"] = serde_json::json!([{"code": "replaces", "target": {"reference": "DocumentReference/doc-1"}}, {"code": "appends"}]);
    doc["meta"] = serde_json::json!({"versionId": "3", "lastUpdated": "2026-01-01T00:00:00Z"});
    let note = pipeline.process(&bytes(&doc)).unwrap().note;
    assert!(note.entered_in_error);
    assert_eq!(note.replaces().collect::<Vec<_>>(), vec!["DocumentReference/doc-1"]);
    assert_eq!(note.version.as_deref(), Some("3"));
}
