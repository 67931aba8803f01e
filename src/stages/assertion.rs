//! Assertion (ConText-style): for each mention in a sentence, whether it is negated, uncertain, hypothetical,
//! historical or about someone else (family / other experiencer).
//!
//! Cues come from `data/context/cues.tsv` (built by `tools/build_context.py` from NegEx, genConText, medSpaCy,
//! negspacy, pyConTextNLP and a curated list). Each cue has a category and a direction:
//! * forward cues (`no`, `denies`, `rule out`, `history of`) reach mentions after them, backward cues
//!   (`was ruled out`, `resolved`, `cannot be excluded`) mentions before them, `both` either way;
//! * a scope ends at a termination cue (`but`, `however`, `which`, `secondary to`, ...), at `;`, at the sentence
//!   end, or after `assertion.forward_words` / `backward_words` words. Words inside other mentions and list
//!   connectors (`,` `or` `and` `nor`) do not count, so "negative for fever, chills, night sweats or weight
//!   loss" negates the whole list;
//! * pseudo-cues (`no increase`, `not only`, `gram negative`, `history of present illness`) are matched like cues
//!   and, being longer, hide the cue they contain; cues inside a mention are ignored;
//! * `X: none` / `X: negative` / `X - denied` negate X.
//!
//! Section defaults (family history → family; past medical / surgical history → historical) are applied by
//! `apply_section_defaults`. Sentence limits come from the sentence splitter. Cannot fail.

use std::sync::OnceLock;

use crate::lexicon::LexiconError;
use crate::lexicon::matcher::{PhraseMatch, PhraseMatcher};
pub use crate::model::Assertion;

const CUES_TSV: &str = include_str!("../../data/context/cues.tsv");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Negated,
    Possible,
    Hypothetical,
    Historical,
    Family,
    Pseudo,
    Terminate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Backward,
    Both,
    None,
}

#[derive(Debug, Clone, Copy)]
pub struct Cue {
    pub category: Category,
    pub direction: Direction,
}

/// Scope limits.
#[derive(Debug, Clone, Copy)]
pub struct AssertionParams {
    pub forward_words: usize,
    pub backward_words: usize,
}

impl Default for AssertionParams {
    fn default() -> Self {
        Self { forward_words: 8, backward_words: 5 }
    }
}

/// The compiled cue list.
pub struct ContextRules {
    matcher: PhraseMatcher,
    /// Per matcher phrase, the cues it carries (a phrase may be, e.g., both historical and family).
    cues: Vec<Vec<Cue>>,
}

impl ContextRules {
    /// The rules compiled from `data/context/cues.tsv`, built once per process.
    pub fn builtin() -> &'static ContextRules {
        static RULES: OnceLock<ContextRules> = OnceLock::new();
        RULES.get_or_init(|| ContextRules::parse(CUES_TSV).expect("the built-in cue list is valid"))
    }

    pub fn parse(tsv: &str) -> Result<Self, LexiconError> {
        let mut phrases: Vec<String> = Vec::new();
        let mut cues: Vec<Vec<Cue>> = Vec::new();
        let mut index = std::collections::HashMap::new();
        for (n, line) in tsv.lines().enumerate() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let cols: Vec<&str> = line.split('\t').collect();
            let [phrase, category, direction, ..] = cols[..] else {
                return Err(LexiconError(format!("cue line {}: expected 4 columns", n + 1)));
            };
            let category = match category {
                "negated" => Category::Negated,
                "possible" => Category::Possible,
                "hypothetical" => Category::Hypothetical,
                "historical" => Category::Historical,
                "family" => Category::Family,
                "pseudo" => Category::Pseudo,
                "terminate" => Category::Terminate,
                other => return Err(LexiconError(format!("cue line {}: unknown category {other}", n + 1))),
            };
            let direction = match direction {
                "forward" => Direction::Forward,
                "backward" => Direction::Backward,
                "both" => Direction::Both,
                "none" => Direction::None,
                other => return Err(LexiconError(format!("cue line {}: unknown direction {other}", n + 1))),
            };
            let i = *index.entry(phrase.to_string()).or_insert_with(|| {
                phrases.push(phrase.to_string());
                cues.push(Vec::new());
                phrases.len() - 1
            });
            cues[i].push(Cue { category, direction });
        }
        let matcher = PhraseMatcher::new(phrases.iter().map(|p| (p.as_str(), false)))?;
        Ok(Self { matcher, cues })
    }

    /// Byte spans of the assertion cues in `text` (negation, uncertainty, hypothetical, historical, family and
    /// pseudo-cues; not the scope terminators): what a filter of the text must keep for its assertions to read
    /// the same.
    pub fn cue_spans(&self, text: &str) -> Vec<(usize, usize)> {
        self.matcher
            .find(text)
            .into_iter()
            .filter(|m| self.cues[m.phrase as usize].iter().any(|c| c.category != Category::Terminate))
            .map(|m| (m.start, m.end))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.matcher.len()
    }

    pub fn is_empty(&self) -> bool {
        self.matcher.is_empty()
    }
}

/// A cue occurrence in a sentence.
#[derive(Debug, Clone, Copy)]
struct CueHit {
    start: usize,
    end: usize,
    phrase: u32,
}

/// Words that join list items or link a finding to what it would indicate ("no opacity to suggest a
/// pneumonia"); they do not count towards a scope's length.
const CONNECTORS: &[&str] = &[
    "or",
    "and",
    "nor",
    "and/or",
    "as",
    "well",
    "any",
    "other",
    "of",
    "a",
    "an",
    "the",
    "to",
    "suggest",
    "indicate",
    "represent",
];

/// Assertions for the mentions (byte spans, in order) of one sentence `text[sentence.0..sentence.1]`.
pub fn assert_sentence(
    text: &str,
    sentence: (usize, usize),
    mentions: &[(usize, usize)],
    rules: &ContextRules,
    p: &AssertionParams,
) -> Vec<Assertion> {
    let cues = rules.matcher.find(&text[sentence.0..sentence.1]);
    assert_with_cues(text, sentence, mentions, cues, rules, p)
}

/// `assert_sentence` in a text already prepared for matching (`matcher::prepare(text)`): the cues are read off
/// its words (`PhraseMatcher::find_within`) instead of preparing each sentence again.
pub fn assert_sentence_prepared(
    text: &str,
    prepared: &crate::lexicon::matcher::Prepared,
    sentence: (usize, usize),
    mentions: &[(usize, usize)],
    rules: &ContextRules,
    p: &AssertionParams,
) -> Vec<Assertion> {
    let cues = rules.matcher.find_within(text, prepared, sentence.0, sentence.1);
    assert_with_cues(text, sentence, mentions, cues, rules, p)
}

/// The assertions given the cue matches of the sentence (offsets in the sentence, leftmost-longest).
fn assert_with_cues(
    text: &str,
    sentence: (usize, usize),
    mentions: &[(usize, usize)],
    cues: Vec<PhraseMatch>,
    rules: &ContextRules,
    p: &AssertionParams,
) -> Vec<Assertion> {
    let (s0, s1) = sentence;
    let sent = &text[s0..s1];
    // A cue strictly inside a mention is part of the term ("no" in a drug name); a cue that covers a mention
    // ("nonsmoker", "differential diagnosis") applies to it.
    let inside_mention = |a: usize, b: usize| mentions.iter().any(|&(ms, me)| ms <= a && b <= me && (ms, me) != (a, b));
    // Cues, longest first (pseudo-cues hide the cues they contain), minus those inside mentions.
    let hits: Vec<CueHit> = cues
        .into_iter()
        .map(|PhraseMatch { start, end, phrase }| CueHit { start: start + s0, end: end + s0, phrase })
        .filter(|h| !inside_mention(h.start, h.end))
        .collect();
    let is_terminator = |h: &CueHit| rules.cues[h.phrase as usize].iter().any(|c| c.category == Category::Terminate);
    // Scope breakers (termination cues and semicolons), in text order, found once per sentence.
    let mut breakers: Vec<(usize, usize)> =
        hits.iter().filter(|h| is_terminator(h)).map(|h| (h.start, h.end)).collect();
    breakers.extend(sent.match_indices(';').map(|(i, _)| (s0 + i, s0 + i + 1)));
    breakers.sort_unstable();
    // A scope is blocked between a and b when a breaker lies inside it.
    let blocked = |a: usize, b: usize| {
        let first = breakers.partition_point(|&(start, _)| start < a);
        breakers[first..].iter().take_while(|&&(start, _)| start < b).any(|&(_, end)| end <= b)
    };
    let distance = |a: usize, b: usize| count_words(text, a, b, mentions);

    mentions
        .iter()
        .map(|&(ms, me)| {
            let mut a = Assertion::default();
            for h in &hits {
                for cue in &rules.cues[h.phrase as usize] {
                    let covers = h.start <= ms && me <= h.end;
                    let forward = matches!(cue.direction, Direction::Forward | Direction::Both)
                        && h.end <= ms
                        && !blocked(h.end, ms)
                        && distance(h.end, ms) <= p.forward_words;
                    let backward = matches!(cue.direction, Direction::Backward | Direction::Both)
                        && me <= h.start
                        && !blocked(me, h.start)
                        && distance(me, h.start) <= p.backward_words;
                    if !(forward || backward || covers && cue.direction != Direction::None) {
                        continue;
                    }
                    match cue.category {
                        Category::Negated => a.negated = true,
                        Category::Possible => a.uncertain = true,
                        Category::Hypothetical => a.hypothetical = true,
                        Category::Historical => a.historical = true,
                        Category::Family => a.family = true,
                        Category::Pseudo | Category::Terminate => {}
                    }
                }
            }
            if colon_none_follows(&text[me..s1]) {
                a.negated = true;
            }
            a
        })
        .collect()
}

/// `X: none`, `X - negative`, `X: denied`, `X: absent`, `X: no`.
fn colon_none_follows(after: &str) -> bool {
    let rest = after.trim_start_matches([' ', '\t']);
    let Some(rest) = rest.strip_prefix(':').or_else(|| rest.strip_prefix(" -")).or_else(|| rest.strip_prefix('-'))
    else {
        return false;
    };
    let word: String =
        rest.trim_start().chars().take_while(|c| c.is_alphabetic()).collect::<String>().to_ascii_lowercase();
    matches!(word.as_str(), "none" | "negative" | "denied" | "denies" | "absent" | "no" | "nil")
}

/// Words in `text[a..b]` outside mentions, not counting list connectors.
fn count_words(text: &str, a: usize, b: usize, mentions: &[(usize, usize)]) -> usize {
    let mut n = 0;
    let mut i = a;
    // The character at `i`, ASCII without decoding.
    let char_at = |i: usize| match text.as_bytes()[i] {
        byte if byte < 0x80 => char::from(byte),
        _ => text[i..].chars().next().unwrap_or(' '),
    };
    while i < b {
        // Skip non-word characters.
        let c = char_at(i);
        if !c.is_alphanumeric() {
            i += c.len_utf8();
            continue;
        }
        let start = i;
        while i < b {
            let c = char_at(i);
            if !(c.is_alphanumeric() || c == '\'' || c == '/' || c == '-') {
                break;
            }
            i += c.len_utf8();
        }
        let word = &text[start..i];
        let in_mention = mentions.iter().any(|&(ms, me)| start >= ms && i <= me);
        if !in_mention && !CONNECTORS.iter().any(|c| word.eq_ignore_ascii_case(c)) {
            n += 1;
        }
    }
    n
}

/// Section defaults: mentions in family history are about the family; in past medical / surgical history they are
/// historical.
pub fn apply_section_defaults(section: &str, a: &mut Assertion) {
    match section {
        "family_history" => a.family = true,
        "past_medical_history" | "past_surgical_history" => a.historical = true,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cues read off the note's own word split give every sentence of real notes the assertions that the
    /// sentence prepared alone gives (short sentences cut inside words included).
    #[test]
    fn sentences_of_a_prepared_note_assert_as_alone() {
        use crate::stages::{sections, sentences};
        let notes = [
            include_str!("../../tests/fixtures/mtsamples/17-cardiovascular--pulmonary.txt"),
            include_str!("../../tests/fixtures/mtsamples/1506-radiology.txt"),
            include_str!("../../tests/fixtures/mtsamples/1288-soap--chart--progress-notes.txt"),
            include_str!("../../tests/fixtures/mtsamples/1758-psychiatry--psychology.txt"),
        ];
        let settings = crate::config::Settings::load_from(None, Some(Default::default())).unwrap();
        let rules = ContextRules::builtin();
        let p = AssertionParams::default();
        let lexicon = crate::lexicon::Lexicon::builtin();
        let (mut sentences_seen, mut asserted) = (0, 0);
        for note in notes {
            let prepared = crate::lexicon::matcher::prepare(note);
            let secs = sections::split(note, &sections::SectionParams::from_settings(&settings));
            for max in [settings.sentences.max_sentence_bytes, 40] {
                let sents = sentences::split(note, &secs, &sentences::SentenceParams { max_sentence_bytes: max });
                for s in &sents {
                    let spans: Vec<(usize, usize)> = lexicon
                        .find(&note[s.start..s.end])
                        .iter()
                        .map(|t| (s.start + t.start, s.start + t.end))
                        .collect();
                    let alone = assert_sentence(note, (s.start, s.end), &spans, rules, &p);
                    let within = assert_sentence_prepared(note, &prepared, (s.start, s.end), &spans, rules, &p);
                    assert_eq!(alone, within, "sentence at {}..{}", s.start, s.end);
                    assert_eq!(
                        rules.matcher.find(&note[s.start..s.end]),
                        rules.matcher.find_within(note, &prepared, s.start, s.end)
                    );
                    sentences_seen += 1;
                    asserted += alone.iter().filter(|a| **a != Assertion::default()).count();
                }
            }
        }
        assert!(sentences_seen > 200 && asserted > 10, "{sentences_seen} sentences, {asserted} asserted");
    }

    fn assert_one(sentence: &str, mention: &str) -> Assertion {
        let start = sentence.find(mention).expect("mention in sentence");
        let r = assert_sentence(
            sentence,
            (0, sentence.len()),
            &[(start, start + mention.len())],
            ContextRules::builtin(),
            &AssertionParams::default(),
        );
        r[0]
    }

    #[test]
    fn basic_negation_and_scope_end() {
        assert!(assert_one("No pleural effusion.", "pleural effusion").negated);
        assert!(!assert_one("No pneumothorax, but there is a pleural effusion.", "pleural effusion").negated);
        assert!(assert_one("Pneumonia was ruled out.", "Pneumonia").negated);
        assert!(assert_one("Allergies: none.", "Allergies").negated);
        assert!(assert_one("SKIN:  No RASHES.", "RASHES").negated);
    }
}
