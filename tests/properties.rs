//! Invariants over generated input: no stage panics on any bytes; sections tile the text; sentences are
//! ordered, disjoint, inside their section bodies, on char boundaries and within the length limit.

mod common;

use clinstream::stages::sections::{self, SectionParams};
use clinstream::stages::sentences::{self, SentenceParams};
use clinstream::stages::{Pipeline, html, rtf};
use common::*;
use proptest::prelude::*;

/// Note-like text: header-ish lines, punctuation, abbreviations, list markers, non-ASCII.
fn note_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("HISTORY OF PRESENT ILLNESS: ".to_string()),
        Just("PLAN:".to_string()),
        Just("# Assessment and Plan\n".to_string()),
        Just("HEENT: ".to_string()),
        Just("S: ".to_string()),
        Just("Dr. Smith ".to_string()),
        Just("p.o. b.i.d. ".to_string()),
        Just("1. ".to_string()),
        Just("- item\n".to_string()),
        Just("BP 120/80. ".to_string()),
        Just(".,".to_string()),
        Just("\n".to_string()),
        Just("\n\n".to_string()),
        Just("café \u{a0}ñ ".to_string()),
        "[A-Za-z ,.:;!?()/-]{0,20}",
        "\\PC{0,8}",
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn sections_and_sentences_keep_their_invariants(text in note_text(), max in 64usize..400) {
        let s = settings();
        let secs = sections::split(&text, &SectionParams::from_settings(&s));
        let sents = sentences::split(&text, &secs, &SentenceParams { max_sentence_bytes: max });
        if !text.trim().is_empty() {
            prop_assert!(!secs.is_empty());
        }
        for w in secs.windows(2) {
            prop_assert_eq!(w[0].end, w[1].start);
        }
        for sec in &secs {
            prop_assert!(sec.start <= sec.body_start && sec.body_start <= sec.end && sec.end <= text.len());
            prop_assert!(text.is_char_boundary(sec.start) && text.is_char_boundary(sec.body_start) && text.is_char_boundary(sec.end));
        }
        let mut last = 0;
        for st in &sents {
            let sec = &secs[st.section];
            prop_assert!(st.start >= sec.body_start && st.end <= sec.end);
            prop_assert!(st.start < st.end && st.start >= last);
            prop_assert!(st.end - st.start <= max);
            prop_assert!(text.is_char_boundary(st.start) && text.is_char_boundary(st.end));
            prop_assert_eq!(text[st.start..st.end].trim(), &text[st.start..st.end]);
            last = st.end;
        }
    }

    #[test]
    fn the_pipeline_never_panics_on_bytes(data in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = Pipeline::new(&settings()).unwrap().process(&data);
    }

    #[test]
    fn the_pipeline_never_panics_on_any_attachment(data in prop::collection::vec(any::<u8>(), 1..600),
                                                   ct in prop_oneof![Just("text/plain"), Just("text/html"), Just("text/rtf"),
                                                                     Just("text/plain; charset=utf-16le"), Just("text/plain; charset=windows-1252")]) {
        let doc = doc_with("d", vec![serde_json::json!({"contentType": ct, "data": b64(&data)})]);
        let _ = Pipeline::new(&settings()).unwrap().process(&bytes(&doc));
    }

    #[test]
    fn markup_converters_never_panic(s in "\\PC{0,300}", raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = html::to_text(&s);
        let _ = html::decode_entities(&s);
        let mut rtf_bytes = b"{\\rtf1 ".to_vec();
        rtf_bytes.extend(&raw);
        let _ = rtf::to_text(&rtf_bytes);
        let _ = rtf::to_text(s.as_bytes());
    }
}
