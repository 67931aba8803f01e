//! Fuzzes the whole per-event pipeline (decode → attachment → sections → sentences) on raw event bytes, and
//! on the same bytes wrapped as a base64 attachment of each readable content type. It must never panic.
#![no_main]

use std::sync::OnceLock;

use base64::Engine as _;
use clinstream::config::Settings;
use clinstream::stages::Pipeline;
use libfuzzer_sys::fuzz_target;

fn pipeline() -> &'static Pipeline {
    static P: OnceLock<Pipeline> = OnceLock::new();
    P.get_or_init(|| Pipeline::new(&Settings::load_from(None, Some(Default::default())).unwrap()).unwrap())
}

const TYPES: &[&str] = &["text/plain", "text/html", "text/rtf", "text/plain; charset=utf-16le", "text/plain; charset=windows-1252"];

fuzz_target!(|data: &[u8]| {
    let _ = pipeline().process(data);
    if let Some((&selector, rest)) = data.split_first() {
        let ct = TYPES[selector as usize % TYPES.len()];
        let doc = format!(
            r#"{{"resourceType":"DocumentReference","id":"f","content":[{{"attachment":{{"contentType":"{ct}","data":"{}"}}}}]}}"#,
            base64::engine::general_purpose::STANDARD.encode(rest)
        );
        if let Ok(doc) = pipeline().process(doc.as_bytes()) {
            for s in &doc.sentences {
                assert!(s.start < s.end && s.end <= doc.note.text.len());
            }
        }
    }
});
