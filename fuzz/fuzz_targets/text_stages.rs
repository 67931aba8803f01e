//! Fuzzes sections and sentences directly on arbitrary UTF-8 text and checks their invariants.
#![no_main]

use std::sync::OnceLock;

use clinstream::config::Settings;
use clinstream::stages::sections::{self, SectionParams};
use clinstream::stages::sentences::{self, SentenceParams};
use libfuzzer_sys::fuzz_target;

fn params() -> &'static (SectionParams, SentenceParams) {
    static P: OnceLock<(SectionParams, SentenceParams)> = OnceLock::new();
    P.get_or_init(|| {
        let s = Settings::load_from(None, Some(Default::default())).unwrap();
        (SectionParams::from_settings(&s), SentenceParams { max_sentence_bytes: 200 })
    })
}

fuzz_target!(|text: &str| {
    let (sp, tp) = params();
    let secs = sections::split(text, sp);
    for w in secs.windows(2) {
        assert_eq!(w[0].end, w[1].start);
    }
    let sents = sentences::split(text, &secs, tp);
    let mut last = 0;
    for s in &sents {
        assert!(s.start >= last && s.start < s.end && s.end - s.start <= 200);
        assert!(text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
        last = s.end;
    }
});
