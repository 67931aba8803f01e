//! The `clinstream` binary end to end: mixed valid and malformed input, stdin, Bulk-FHIR directories,
//! configuration printing and errors, and no PHI in anything it prints or dead-letters.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

/// These tests are about the text stages; embedding and the vector store are tested in tests/embed.rs.
fn text_stages_only() -> Command {
    let mut cmd = clinstream();
    cmd.env("CLINSTREAM__EMBED__ENABLED", "false");
    cmd
}

fn read_ndjson(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn mixed_valid_and_malformed_events() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("events.ndjson");
    let corpus: Vec<_> = malformed_corpus().into_iter().filter(|c| !c.bytes.is_empty()).collect();
    let mut f = std::fs::File::create(&input).unwrap();
    let mut expected = Vec::new(); // per line: Ok(doc id) or Err(code)
    for (i, case) in corpus.iter().enumerate() {
        let id = format!("good-{i}");
        f.write_all(&bytes(&valid_doc(&id, &format!("HISTORY OF PRESENT ILLNESS: {CANARY} reports cough.")))).unwrap();
        f.write_all(b"\n\n").unwrap(); // blank lines are ignored
        expected.push(Ok(id));
        assert!(!case.bytes.contains(&b'\n'), "{}", case.name);
        f.write_all(&case.bytes).unwrap();
        f.write_all(b"\n").unwrap();
        expected.push(Err(case.code.as_str()));
    }
    drop(f);
    let out = dir.path().join("out");
    let o = text_stages_only().args(["run", "--input"]).arg(&input).arg("--out").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "exit 3 = finished with dead letters\n{}", text(&o));
    let notes = read_ndjson(&out.join("notes.ndjson"));
    let dead = read_ndjson(&out.join("dead_letters.ndjson"));
    let good: Vec<_> = expected.iter().filter_map(|e| e.as_ref().ok()).collect();
    let bad: Vec<_> = expected.iter().filter_map(|e| e.as_ref().err()).collect();
    assert_eq!(notes.len(), good.len());
    assert_eq!(dead.len(), bad.len());
    for (n, id) in notes.iter().zip(&good) {
        assert_eq!(n["doc_id"], id.as_str(), "notes are written in input order");
        assert_eq!(n["sections"][0]["name"], "history_of_present_illness");
        assert!(n.get("text").is_none(), "no text without --include-text");
    }
    for (i, (d, code)) in dead.iter().zip(&bad).enumerate() {
        assert_eq!(d["code"], **code, "dead letter {i}");
        assert_eq!(d["source"]["line"].as_u64().unwrap(), 3 * i as u64 + 3, "the source line is recorded");
        assert_eq!(d["disposition"], "dead_letter");
        assert!(d["stage"].is_string() && d["detail"].is_string() && d["worker_version"].is_string());
    }
    let summary = String::from_utf8_lossy(&o.stdout);
    assert!(summary.contains(&format!("documents written{:>19}", good.len())), "{summary}");
    assert!(summary.contains("invalid_base64"), "{summary}");
    // PHI: the canary appears in no output but the note text itself, and nowhere in logs or dead letters.
    assert!(!text(&o).contains("CANARY"), "{}", text(&o));
    assert!(!std::fs::read_to_string(out.join("dead_letters.ndjson")).unwrap().contains("CANARY"));
    assert!(!std::fs::read_to_string(out.join("notes.ndjson")).unwrap().contains("CANARY"));
}

#[test]
fn include_text_writes_the_note_text() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("one.json");
    std::fs::write(&input, bytes(&valid_doc("d1", "PLAN: Rest.\n"))).unwrap();
    let out = dir.path().join("out");
    let o = text_stages_only().args(["run", "--include-text", "-i"]).arg(&input).arg("-o").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let notes = read_ndjson(&out.join("notes.ndjson"));
    assert_eq!(notes[0]["text"], "PLAN: Rest.\n");
    assert!(notes[0]["lexicon_version"].as_str().unwrap().starts_with("clinstream-lexicon-"));
    assert_eq!(notes[0]["sections"][0]["name"], "plan");
    assert_eq!(notes[0]["sections"][0]["weight"], 1.0);
}

#[test]
fn variables_and_mentions_are_written_per_document() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("notes.ndjson");
    let lines = [
        valid_doc("a", &format!("HPI: {CANARY} denies fever.\nASSESSMENT: Community-acquired pneumonia.\n")),
        valid_doc("b", "IMPRESSION: No pleural effusion.\n"),
    ];
    std::fs::write(&input, lines.iter().map(|d| String::from_utf8(bytes(d)).unwrap() + "\n").collect::<String>())
        .unwrap();
    let out = dir.path().join("out");
    let o = text_stages_only().args(["run", "-i"]).arg(&input).arg("-o").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let notes = read_ndjson(&out.join("notes.ndjson"));
    let fever = notes[0]["mentions"].as_array().unwrap().iter().find(|m| m["concept"] == "MESH:D005334").cloned();
    let fever = fever.expect("fever mention");
    assert_eq!(fever["kind"], "symptom");
    assert_eq!(fever["assertion"]["negated"], true);
    assert!(fever.get("term").is_none(), "no matched text without --include-text");
    let variables = read_ndjson(&out.join("variables.ndjson"));
    let n_vars = variables.len() / 2;
    assert!(n_vars >= 17, "every shipped variable is evaluated for every document");
    let get = |doc: &str, v: &str| variables.iter().find(|r| r["doc_id"] == doc && r["variable"] == v).unwrap().clone();
    assert_eq!(get("a", "pneumonia")["label"], "present");
    assert_eq!(get("a", "pneumonia")["evidence"][0]["section"], "assessment");
    assert_eq!(get("b", "pleural_effusion")["label"], "absent");
    assert_eq!(get("b", "cardiomegaly")["label"], "not_mentioned");
    assert!(get("a", "pneumonia")["context_tokens"].as_u64().unwrap() > 0);
    assert!(!std::fs::read_to_string(out.join("variables.ndjson")).unwrap().contains("CANARY"));
}

#[test]
fn stdin_ndjson_and_pretty_printed_documents() {
    let dir = tempfile::tempdir().unwrap();
    let run = |input: Vec<u8>, out: &Path| {
        let mut child = text_stages_only()
            .args(["run", "--input", "-", "--out"])
            .arg(out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&input).unwrap();
        child.wait_with_output().unwrap()
    };
    let mut ndjson = Vec::new();
    for i in 0..3 {
        ndjson.extend(bytes(&valid_doc(&format!("s{i}"), "Plan: rest.")));
        ndjson.push(b'\n');
    }
    let o = run(ndjson, &dir.path().join("a"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(read_ndjson(&dir.path().join("a/notes.ndjson")).len(), 3);

    let pretty = serde_json::to_vec_pretty(&serde_json::json!({
        "resourceType": "Bundle",
        "entry": [{"resource": valid_doc("b1", "Plan: rest.")}, {"resource": {"resourceType": "Patient"}}],
    }))
    .unwrap();
    let o = run(pretty, &dir.path().join("b"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let notes = read_ndjson(&dir.path().join("b/notes.ndjson"));
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0]["source"]["kind"], "stdin");
    assert_eq!(notes[0]["source"]["entry"], 0);
}

#[test]
fn bulk_fhir_directory_reads_only_document_references() {
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export");
    std::fs::create_dir_all(export.join("nested")).unwrap();
    let line = |id: &str| [bytes(&valid_doc(id, "Plan: rest.")), b"\n".to_vec()].concat();
    std::fs::write(export.join("DocumentReference.000.ndjson"), [line("a"), line("b")].concat()).unwrap();
    std::fs::write(export.join("DocumentReference.001.ndjson"), line("c")).unwrap();
    std::fs::write(export.join("Patient.000.ndjson"), b"{\"resourceType\":\"Patient\",\"id\":\"p\"}\n").unwrap();
    std::fs::write(export.join("log.ndjson"), b"{\"x\":1}\n").unwrap();
    std::fs::write(export.join("README.txt"), b"not read").unwrap();
    std::fs::write(export.join("nested/more.json"), bytes(&valid_doc("d", "Plan: rest."))).unwrap();
    let out = dir.path().join("out");
    let o = text_stages_only().args(["run", "--no-progress", "-i"]).arg(&export).arg("-o").arg(&out).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let ids: Vec<_> =
        read_ndjson(&out.join("notes.ndjson")).iter().map(|n| n["doc_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, vec!["a", "b", "c", "d"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("skipped files (other types){:>9}", 2)));
}

#[test]
fn oversized_lines_are_dead_lettered_without_being_kept() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.ndjson");
    let big = bytes(&valid_doc("big", &"word ".repeat(10_000)));
    std::fs::write(&input, [big, b"\n".to_vec(), bytes(&valid_doc("small", "Plan: rest.")), b"\n".to_vec()].concat())
        .unwrap();
    let out = dir.path().join("out");
    let o = text_stages_only()
        .env("CLINSTREAM__INPUT__MAX_MESSAGE_BYTES", "4096")
        .args(["run", "-i"])
        .arg(&input)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let dead = read_ndjson(&out.join("dead_letters.ndjson"));
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0]["code"], "message_too_large");
    assert_eq!(dead[0]["stage"], "source");
    assert_eq!(read_ndjson(&out.join("notes.ndjson"))[0]["doc_id"], "small");
}

#[test]
fn a_missing_input_halts_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = text_stages_only().args(["run", "-i", "/nonexistent/notes.ndjson", "-o"]).arg(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("/nonexistent/notes.ndjson"), "{}", text(&o));
}

#[test]
fn config_print_layers_and_rejects_unknown_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[decode]\nmax_attachment_bytes = 1234\n").unwrap();
    let o = text_stages_only()
        .env("CLINSTREAM__SECTIONS__WEIGHTS__PLAN", "0.25")
        .args(["config", "print", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let printed: toml::Value = toml::from_str(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert_eq!(printed["decode"]["max_attachment_bytes"].as_integer(), Some(1234));
    assert_eq!(printed["sections"]["weights"]["plan"].as_float(), Some(0.25));

    let o = text_stages_only().env("CLINSTREAM__DECODE__MAX_BYTES", "1").args(["config", "print"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("max_bytes"), "the unknown key is named: {}", text(&o));
    let o = text_stages_only().env("CLINSTREAM__PIPELINE__IN_FLIGHT", "0").args(["config", "print"]).output().unwrap();
    assert!(text(&o).contains("pipeline.in_flight: must be at least 1"), "{}", text(&o));
}

/// Outputs that cannot be synced (a FIFO, /dev/null: `fsync` gives EINVAL) are written and the run ends cleanly; a
/// real write failure still halts the run with the sink's code and names the file once.
#[cfg(unix)]
#[test]
fn outputs_that_cannot_be_synced_are_written_and_a_full_disk_halts_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("notes.ndjson");
    let lines = [valid_doc("a", "ASSESSMENT: Community-acquired pneumonia.\n")];
    std::fs::write(&input, lines.iter().map(|d| String::from_utf8(bytes(d)).unwrap() + "\n").collect::<String>())
        .unwrap();
    let linked = |target: &str| {
        let out = dir.path().join(format!("out-{}", target.replace('/', "_")));
        std::fs::create_dir_all(&out).unwrap();
        for name in ["notes.ndjson", "variables.ndjson", "kg.ndjson", "dead_letters.ndjson"] {
            std::os::unix::fs::symlink(target, out.join(name)).unwrap();
        }
        text_stages_only().args(["run", "--no-progress", "-i"]).arg(&input).arg("-o").arg(&out).output().unwrap()
    };
    let o = linked("/dev/null");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // /dev/full: every write fails with ENOSPC, as on a full disk.
    let o = linked("/dev/full");
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("\"code\":\"sink_io\""), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("could not write"), "{line}");
    let cause = std::io::Error::from_raw_os_error(28).to_string();
    assert_eq!(line.matches(&cause).count(), 1, "{line}");
}
