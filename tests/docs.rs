//! The operator docs stay true to the code: every error code, every canonical section with its default weight,
//! every configuration key.

use std::path::Path;

fn doc(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs").join(name)).unwrap()
}

#[test]
fn errors_doc_holds_the_generated_table() {
    let table = clinstream::cli::docs::errors_table(true);
    assert!(doc("errors.md").contains(&table), "docs/errors.md is out of date: paste `clinstream errors --markdown`");
}

#[test]
fn openapi_doc_is_the_generated_one() {
    let generated = serde_json::to_string_pretty(&clinstream::serve::api::openapi()).unwrap() + "\n";
    assert!(
        doc("openapi.json") == generated,
        "docs/openapi.json is out of date: `clinstream openapi > docs/openapi.json`"
    );
    let v: serde_json::Value = serde_json::from_str(&generated).unwrap();
    // Every body the routes take or give is described, with its fields.
    for (schema, field) in [
        ("ContextRequest", "budget_tokens"),
        ("ContextResponse", "windows"),
        ("ContextWindow", "doc_version"),
        ("SearchRequest", "neighbours"),
        ("Hit", "payload"),
        ("ErrorBody", "error"),
    ] {
        assert!(v["components"]["schemas"][schema]["properties"][field].is_object(), "{schema}.{field}");
    }
    assert_eq!(v["components"]["schemas"]["ContextRequest"]["required"], serde_json::json!(["patient", "question"]));
    // The limits the server enforces are in the contract, from the same settings.
    let serve = clinstream::config::Settings::load_from(None, Some(Default::default())).unwrap().serve;
    let schemas = &v["components"]["schemas"];
    assert_eq!(schemas["ContextRequest"]["properties"]["budget_tokens"]["minimum"], 1);
    assert_eq!(schemas["ContextRequest"]["properties"]["budget_tokens"]["maximum"], serve.max_budget_tokens);
    assert_eq!(schemas["SearchRequest"]["properties"]["top"]["maximum"], serve.max_top);
    for (schema, field) in [("ContextRequest", "patient"), ("ContextRequest", "question"), ("SearchRequest", "query")] {
        assert_eq!(schemas[schema]["properties"][field]["minLength"], 1, "{schema}.{field}");
    }
    assert!(schemas["SearchRequest"]["properties"]["since"]["pattern"].is_string());
    let mut narrow = serve.clone();
    narrow.max_top = 7;
    let doc = clinstream::serve::api::openapi_for(&narrow);
    assert_eq!(doc["components"]["schemas"]["SearchRequest"]["properties"]["top"]["maximum"], 7);
}

#[test]
fn sections_doc_lists_every_canonical_section_with_its_default_weight() {
    let settings = clinstream::config::Settings::load_from(None, Some(Default::default())).unwrap();
    let text = doc("sections.md");
    for name in clinstream::stages::sections::CANONICAL_SECTIONS {
        let row = format!("| `{name}` | {:?} |", settings.section_weight(name));
        assert!(text.contains(&row), "docs/sections.md lacks {row}");
    }
}

#[test]
fn configuration_doc_lists_every_key() {
    let settings = clinstream::config::Settings::load_from(None, Some(Default::default())).unwrap();
    let value = toml::Value::try_from(&settings).unwrap();
    let text = doc("configuration.md");
    for (section, table) in value.as_table().unwrap() {
        for key in table.as_table().unwrap().keys() {
            let key =
                if section == "sections" && key == "weights" { "weights.<name>".to_string() } else { key.clone() };
            assert!(text.contains(&format!("`{section}.{key}`")), "docs/configuration.md lacks {section}.{key}");
        }
    }
}

/// Words about how the project's work was organised, not about the product.
fn work_words(text: &str) -> Vec<String> {
    const QUALIFIERS: &[&str] = &[
        "this",
        "that",
        "next",
        "previous",
        "earlier",
        "later",
        "same",
        "last",
        "first",
        "second",
        "third",
        "fourth",
        "fifth",
        "sixth",
        "seventh",
        "eighth",
        "ninth",
        "tenth",
        "eleventh",
        "twelfth",
        "thirteenth",
        "fourteenth",
        "fifteenth",
        "sixteenth",
        "one",
        "each",
        "every",
        "either",
        "both",
        "whole",
    ];
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let raw: Vec<&str> =
            line.split(|c: char| !(c.is_alphanumeric() || c == '#')).filter(|w| !w.is_empty()).collect();
        let words: Vec<String> = raw.iter().map(|w| w.to_lowercase()).collect();
        for (i, w) in words.iter().enumerate() {
            let prev = i.checked_sub(1).map(|p| words[p].as_str()).unwrap_or("");
            let next = words.get(i + 1).map(String::as_str).unwrap_or("");
            let bad = w == "sessions"
                || (w == "session" && QUALIFIERS.contains(&prev))
                || ((w == "issue" || w == "issues") && next.trim_start_matches('#').parse::<u32>().is_ok())
                || (w == "build" && (next == "machine" || next == "machines"))
                || raw[i] == "VM"
                || raw[i] == "VMs";
            if bad {
                found.push(format!("line {}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

fn files_under(dir: &Path, exts: &[&str], out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, exts, out);
        } else if path.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)) {
            out.push(path);
        }
    }
}

/// The repository speaks of the product: its docs, code comments, tests and bench scripts say nothing of work
/// sessions, issue numbers, or the machines the work was done on (figures name the hardware instead).
#[test]
fn docs_code_and_scripts_speak_of_the_product_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<std::path::PathBuf> =
        ["README.md", "CHANGELOG.md", "Makefile", "Cargo.toml", "Dockerfile", "build.rs"]
            .iter()
            .map(|f| root.join(f))
            .collect();
    files_under(&root.join("docs"), &["md"], &mut files);
    files_under(&root.join("src"), &["rs"], &mut files);
    files_under(&root.join("tests"), &["rs", "py"], &mut files);
    files_under(&root.join("bench"), &["py", "sh"], &mut files);
    files_under(&root.join("tools"), &["py", "sh"], &mut files);
    files_under(&root.join("config"), &["toml"], &mut files);
    files_under(&root.join("helm"), &["yaml", "md", "txt", "tpl"], &mut files);
    let this = root.join("tests").join("docs.rs");
    let mut problems = Vec::new();
    for f in files.iter().filter(|f| **f != this) {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for p in work_words(&text) {
            problems.push(format!("{}: {p}", f.strip_prefix(root).unwrap().display()));
        }
    }
    assert!(problems.is_empty(), "{} lines:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn the_word_check_finds_what_it_looks_for() {
    // Each phrase built from its parts, so this file reads as the check's own fixtures.
    let phrase = |parts: &[&str]| parts.join(" ");
    assert_eq!(work_words(&phrase(&["measured in the fifteenth", "session"])).len(), 1);
    assert_eq!(work_words(&phrase(&["two", "sessions", "that day"])).len(), 1);
    assert_eq!(work_words(&phrase(&["see", "issue", "17, part 2"])).len(), 1);
    assert_eq!(work_words(&phrase(&["on the 2-core", "build", "machine"])).len(), 1);
    assert_eq!(work_words(&phrase(&["why timing fails on this", "VM"])).len(), 1);
    // The product's own words pass: Kafka's and ONNX Runtime's sessions, issues without a number.
    assert!(work_words("below the consumer's session.timeout.ms; the ONNX session; known issues").is_empty());
}
