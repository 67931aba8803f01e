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
