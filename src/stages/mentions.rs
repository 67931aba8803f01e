//! Sentences → entity mentions with their assertion.
//!
//! In: the note text, its sections and sentences, the lexicon (and its compounds' glosses) and the cue rules.
//! Out: every lexicon match that lies inside a sentence (headers are not mentions), and every gloss match that
//! overlaps no lexicon match other than an anatomy term ("pleural" in "pleural air collection"), in text order, with
//! kind, concept, span, sentence, section, and the ConText assertion computed over its sentence plus the section
//! defaults. Cannot fail.

use crate::lexicon::{EntityKind, Lexicon, TermMatch};
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
    let prepared = crate::lexicon::matcher::prepare(text);
    let (matches, hits) = lexicon.find_with_gloss_hits_prepared(text, &prepared);
    let glosses = lexicon.glosses();
    let mut h = 0;
    let mention = |t: TermMatch, sentence: usize, section: usize| Mention {
        kind: lexicon.concept(t.concept).kind,
        concept: t.concept,
        start: t.start,
        end: t.end,
        sentence,
        section,
        assertion: Assertion::default(),
    };
    let mut out = Vec::with_capacity(matches.len());
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut kinds: Vec<EntityKind> = Vec::new();
    let mut m = 0;
    for (si, s) in sentences.iter().enumerate() {
        while m < matches.len() && matches[m].start < s.start {
            m += 1;
        }
        let first = out.len();
        while m < matches.len() && matches[m].start < s.end {
            let t = matches[m];
            if t.end <= s.end {
                out.push(mention(t, si, s.section));
            }
            m += 1;
        }
        while h < hits.len() && hits[h].start < s.start {
            h += 1;
        }
        let from = h;
        while h < hits.len() && hits[h].end <= s.end {
            h += 1;
        }
        if let Some(g) = glosses.filter(|_| h - from > 1) {
            let lexical = out.len();
            for t in g.pairs(text, &hits[from..h]) {
                let t = after_inner_cues(text, t, rules);
                let taken = out[first..lexical]
                    .iter()
                    .any(|x| x.start < t.end && t.start < x.end && x.kind != EntityKind::Anatomy);
                if !taken {
                    out.push(mention(t, si, s.section));
                }
            }
            if out.len() > lexical {
                out[first..].sort_by_key(|x| (x.start, x.end));
            }
        }
        if out.len() > first {
            spans.clear();
            spans.extend(out[first..].iter().map(|x| (x.start, x.end)));
            kinds.clear();
            kinds.extend(out[first..].iter().map(|x| x.kind));
            let sentence = (s.start, s.end);
            let asserted = assertion::assert_sentence_prepared(text, &prepared, sentence, &spans, &kinds, rules, p);
            for (mention, mut a) in out[first..].iter_mut().zip(asserted) {
                assertion::apply_section_defaults(sections[s.section].name, &mut a);
                mention.assertion = a;
            }
        }
    }
    out
}

/// A gloss match with an assertion cue between its parts ("heart is not enlarged", "heart is possibly enlarged")
/// starts after the last such cue, so the cue stands before the mention, where assertion reads it, rather than
/// inside it, where it would be ignored.
fn after_inner_cues(text: &str, t: TermMatch, rules: &ContextRules) -> TermMatch {
    let inner = &text[t.start..t.end];
    let last = rules.cue_spans(inner).into_iter().filter(|&(a, b)| a > 0 && b < inner.len()).map(|(_, b)| b).max();
    match last {
        Some(b) => {
            let rest = &inner[b..];
            TermMatch { start: t.start + b + (rest.len() - rest.trim_start().len()), ..t }
        }
        None => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gloss_starts_after_the_cues_between_its_parts() {
        let rules = ContextRules::builtin();
        let span = |text: &'static str| -> &'static str {
            let t = after_inner_cues(text, TermMatch { start: 4, end: text.len() - 1, concept: 0 }, rules);
            &text[t.start..t.end]
        };
        assert_eq!(span("The heart is not enlarged."), "enlarged");
        assert_eq!(span("The heart is possibly mildly enlarged."), "mildly enlarged");
        assert_eq!(span("The heart is moderately enlarged."), "heart is moderately enlarged", "no cue: whole");
    }
}
