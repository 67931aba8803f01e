//! Sentences → entity mentions with their assertion.
//!
//! In: the note text, its sections and sentences, the lexicon and the cue rules. Out: every lexicon match that
//! lies inside a sentence (headers are not mentions), with kind, concept, span, sentence, section, and the
//! ConText assertion computed over its sentence plus the section defaults. Cannot fail.

use crate::lexicon::Lexicon;
use crate::model::Assertion;
pub use crate::model::Mention;
use crate::model::{Section, Sentence};
use crate::stages::assertion::{self, AssertionParams, ContextRules};

/// Finds mentions in every sentence and asserts them.
pub fn extract(
    text: &str,
    sections: &[Section],
    sentences: &[Sentence],
    lexicon: &Lexicon,
    rules: &ContextRules,
    p: &AssertionParams,
) -> Vec<Mention> {
    let matches = lexicon.find(text);
    let mut out = Vec::with_capacity(matches.len());
    let mut m = 0;
    for (si, s) in sentences.iter().enumerate() {
        while m < matches.len() && matches[m].start < s.start {
            m += 1;
        }
        let first = out.len();
        while m < matches.len() && matches[m].start < s.end {
            let t = matches[m];
            if t.end <= s.end {
                out.push(Mention {
                    kind: lexicon.concept(t.concept).kind,
                    concept: t.concept,
                    start: t.start,
                    end: t.end,
                    sentence: si,
                    section: s.section,
                    assertion: Assertion::default(),
                });
            }
            m += 1;
        }
        if out.len() > first {
            let spans: Vec<(usize, usize)> = out[first..].iter().map(|x| (x.start, x.end)).collect();
            let asserted = assertion::assert_sentence(text, (s.start, s.end), &spans, rules, p);
            for (mention, mut a) in out[first..].iter_mut().zip(asserted) {
                assertion::apply_section_defaults(sections[s.section].name, &mut a);
                mention.assertion = a;
            }
        }
    }
    out
}
