//! Sections and sentences on real notes: snapshots of 24 MTSamples notes (one per specialty), and structural
//! checks on every Synthea fixture note and the US Core examples.

mod common;

use std::path::Path;

use clinstream::model::{Section, Sentence};
use clinstream::stages::Pipeline;
use clinstream::stages::sections::{self, SectionParams};
use clinstream::stages::sentences::{self, SentenceParams};
use common::*;

fn fixture(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path)
}

/// Checks the invariants every split must keep, whatever the note.
fn assert_structure(text: &str, secs: &[Section], sents: &[Sentence]) {
    assert!(!secs.is_empty());
    for w in secs.windows(2) {
        assert_eq!(w[0].end, w[1].start, "sections tile the text");
    }
    for s in secs {
        assert!(s.start <= s.body_start && s.body_start <= s.end.max(s.body_start) && s.end <= text.len());
        assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
    }
    let mut last_end = 0;
    for s in sents {
        let sec = &secs[s.section];
        assert!(s.start >= sec.body_start && s.end <= sec.end, "a sentence stays inside its section body");
        assert!(s.start < s.end && s.start >= last_end, "sentences are ordered and disjoint");
        assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
        last_end = s.end;
    }
}

/// A readable summary of a split: one line per section, with its first sentence.
fn render(text: &str, secs: &[Section], sents: &[Sentence]) -> String {
    let mut out = String::new();
    for (i, s) in secs.iter().enumerate() {
        let mine: Vec<&Sentence> = sents.iter().filter(|x| x.section == i).collect();
        let first = mine.first().map(|x| &text[x.start..x.end]).unwrap_or("");
        let first: String = first.chars().take(60).collect();
        out.push_str(&format!(
            "{:<28} {:<34} {:>3}  {}\n",
            s.name,
            format!("{:?}", s.title),
            mine.len(),
            first.replace('\n', " ")
        ));
    }
    out
}

#[test]
fn mtsamples_section_snapshots() {
    let settings = settings();
    let (sp, tp) = (SectionParams::from_settings(&settings), SentenceParams::from_settings(&settings));
    let mut files: Vec<_> = std::fs::read_dir(fixture("mtsamples")).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "txt"));
    files.sort();
    assert!(files.len() >= 20, "at least 20 MTSamples notes");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let secs = sections::split(&text, &sp);
        let sents = sentences::split(&text, &secs, &tp);
        assert_structure(&text, &secs, &sents);
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        insta::with_settings!({snapshot_suffix => name.clone(), prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!("mtsamples", render(&text, &secs, &sents));
        });
    }
}

/// Mentions of a note, one line each: kind, text, concept, assertion flags, section.
fn render_mentions(pipeline: &Pipeline, text: &str) -> String {
    let doc = pipeline.analyse(clinstream::model::Note::from_text("t", text.to_string()));
    let mut out = String::new();
    for m in &doc.mentions {
        let c = pipeline.lexicon().concept(m.concept);
        out.push_str(&format!(
            "{:<10} {:<32} {:<16} {:<9} {}\n",
            m.kind.as_str(),
            format!("{:?}", &text[m.start..m.end]),
            c.id,
            m.assertion.short().replace(' ', ","),
            doc.sections[m.section].name
        ));
    }
    let mut variables: Vec<String> = doc
        .variables
        .iter()
        .filter(|v| v.mentions_found > 0)
        .map(|v| format!("variable {} = {}", v.variable, v.label.as_str()))
        .collect();
    variables.sort();
    out.push_str(&variables.join("\n"));
    out
}

#[test]
fn mtsamples_mention_snapshots() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let mut files: Vec<_> = std::fs::read_dir(fixture("mtsamples")).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "txt"));
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        insta::with_settings!({snapshot_suffix => name.clone(), prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!("mentions", render_mentions(&pipeline, &text));
        });
    }
}

#[test]
fn every_synthea_fixture_note_decodes_with_its_sections() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let ndjson = std::fs::read_to_string(fixture("synthea/DocumentReference.sample.ndjson")).unwrap();
    let mut n = 0;
    for line in ndjson.lines() {
        let doc = pipeline.process(line.as_bytes()).unwrap_or_else(|e| panic!("line {}: {:?}", n + 1, e.error));
        assert_structure(&doc.note.text, &doc.sections, &doc.sentences);
        let names: Vec<&str> = doc.sections.iter().map(|s| s.name).collect();
        for expected in ["chief_complaint", "history_of_present_illness", "social_history", "allergies", "medications"]
        {
            assert!(names.contains(&expected), "line {}: no {expected} in {names:?}", n + 1);
        }
        assert!(names.contains(&"assessment_and_plan") || names.contains(&"plan"), "line {}: {names:?}", n + 1);
        assert_eq!(doc.note.attachment.content_type, "text/plain");
        assert_eq!(doc.note.attachment.charset, "utf-8");
        assert!(doc.note.patient.as_deref().is_some_and(|p| p.starts_with("Patient/")));
        n += 1;
    }
    assert_eq!(n, 200);
}

#[test]
fn us_core_examples() {
    let pipeline = Pipeline::new(&settings()).unwrap();
    let read = |name: &str| std::fs::read(fixture(&format!("us-core/{name}"))).unwrap();

    let soap = pipeline.process(&read("DocumentReference-soap-note.json")).unwrap();
    assert_eq!(soap.note.doc_id, "soap-note");
    let names: Vec<_> = soap.sections.iter().map(|s| (s.name, s.title.as_str())).collect();
    assert_eq!(names, vec![("subjective", "S"), ("objective", "O"), ("assessment", "A"), ("plan", "P")]);
    let plan = &soap.sections[3];
    assert!(soap.note.text[plan.body_start..plan.end].starts_with("Rest,\u{a0}Ice"));
    assert_eq!(soap.note.doc_type.as_ref().unwrap().coding[0].code.as_deref(), Some("34131-3"));

    let by_url = pipeline.process(&read("DocumentReference-episode-summary.json")).unwrap_err();
    assert_eq!(by_url.error.code, clinstream::error::ErrorCode::AttachmentByReference);
    assert_eq!(by_url.doc_id.as_deref(), Some("episode-summary"));

    let report = pipeline.process(&read("DocumentReference-chest-xray-xhtml.json")).unwrap();
    assert_eq!(report.note.attachment.content_type, "application/xhtml+xml");
    let find = |name: &str| report.sections.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}"));
    let findings = find("findings");
    let body = &report.note.text[findings.body_start..findings.end];
    assert!(body.contains("No pleural effusion.") && body.contains("No pneumothorax."), "{body}");
    assert!(body.contains("LUNGS AND PLEURA"), "organ sub-headings stay inside FINDINGS");
    let impression = find("impression");
    assert!(report.note.text[impression.body_start..impression.end].trim_start().starts_with("No acute abnormality."));
    assert_eq!(impression.weight, 1.0);
    assert!(!report.note.text.contains('<'), "markup removed");
}
