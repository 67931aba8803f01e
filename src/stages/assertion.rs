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
//! * `X: none` / `X: negative` / `X - denied` negate X;
//! * mentions offered as alternatives to a mention of a like kind ("effusion or pneumothorax", "aspirin or
//!   ibuprofen") are uncertain unless negated; a hedge right before a cause ("possibly from", "possibly due to")
//!   qualifies the cause only.
//!
//! Section defaults (family history → family; past medical / surgical history → historical) are applied by
//! `apply_section_defaults`. Sentence limits and mention kinds come from the caller. Cannot fail.

use std::sync::OnceLock;

use crate::lexicon::LexiconError;
use crate::lexicon::matcher::{PhraseMatch, PhraseMatcher};
pub use crate::model::Assertion;
use crate::model::EntityKind;

const CUES_TSV: &str = include_str!("../../data/context/cues.tsv");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Negated,
    Possible,
    /// A differential between findings ("versus"): uncertain, and marked `Assertion::differential` when no other
    /// hedge applies.
    Differential,
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
                "differential" => Category::Differential,
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
/// `kinds[i]` is mention `i`'s kind: only mentions of like kinds are offered as alternatives to each other
/// (`alike`: "effusion or pneumothorax", "aspirin or ibuprofen"); a choice of side or site, or of a drug, beside a
/// finding ("atelectasis in the left or right lung base", "aspirin or ibuprofen for headache") leaves it asserted.
pub fn assert_sentence(
    text: &str,
    sentence: (usize, usize),
    mentions: &[(usize, usize)],
    kinds: &[EntityKind],
    rules: &ContextRules,
    p: &AssertionParams,
) -> Vec<Assertion> {
    let cues = rules.matcher.find(&text[sentence.0..sentence.1]);
    assert_with_cues(text, sentence, mentions, kinds, cues, rules, p)
}

/// `assert_sentence` in a text already prepared for matching (`matcher::prepare(text)`): the cues are read off
/// its words (`PhraseMatcher::find_within`) instead of preparing each sentence again.
pub fn assert_sentence_prepared(
    text: &str,
    prepared: &crate::lexicon::matcher::Prepared,
    sentence: (usize, usize),
    mentions: &[(usize, usize)],
    kinds: &[EntityKind],
    rules: &ContextRules,
    p: &AssertionParams,
) -> Vec<Assertion> {
    let cues = rules.matcher.find_within(text, prepared, sentence.0, sentence.1);
    assert_with_cues(text, sentence, mentions, kinds, cues, rules, p)
}

/// The assertions given the cue matches of the sentence (offsets in the sentence, leftmost-longest).
fn assert_with_cues(
    text: &str,
    sentence: (usize, usize),
    mentions: &[(usize, usize)],
    kinds: &[EntityKind],
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
    // Only a sentence with two mentions other than sites can offer one as an alternative to the other. Lists of
    // alternatives end at cues as at breakers: "effusion, possibly from pleuritis or …" offers no choice of effusion.
    debug_assert_eq!(kinds.len(), mentions.len());
    let groups = if kinds.iter().filter(|&&k| k != EntityKind::Anatomy).count() >= 2 {
        let mut list_ends: Vec<(usize, usize)> = hits.iter().map(|h| (h.start, h.end)).collect();
        list_ends.extend(&breakers);
        disjunctions(text, sentence, mentions, &list_ends)
    } else {
        Vec::new()
    };
    // Per cue, once: whether it leads a cause ("possibly due to heart failure"), and where its forward scope starts
    // — past the breaker that names the cause ("due to"), which does not end it.
    let leads: Vec<bool> = hits.iter().map(|h| leads_cause(text, h.end, s1)).collect();
    let scope_starts: Vec<usize> = hits
        .iter()
        .zip(&leads)
        .map(|(h, &leads)| {
            if !leads {
                return h.end;
            }
            let next = text[h.end..s1].len() - text[h.end..s1].trim_start().len() + h.end;
            breakers.iter().find(|&&(start, _)| start == next).map_or(h.end, |&(_, end)| end)
        })
        .collect();

    mentions
        .iter()
        .enumerate()
        .map(|(i, &(ms, me))| {
            let mut a = Assertion::default();
            // Uncertain by a hedge, or only by a differential.
            let (mut hedged, mut differential) = (false, false);
            for (k, h) in hits.iter().enumerate() {
                for cue in &rules.cues[h.phrase as usize] {
                    let covers = h.start <= ms && me <= h.end;
                    let forward = matches!(cue.direction, Direction::Forward | Direction::Both)
                        && h.end <= ms
                        && !blocked(scope_starts[k], ms)
                        && distance(h.end, ms) <= p.forward_words;
                    // "effusion, possibly from pleuritis": a two-way cue that leads a cause qualifies the cause.
                    let backward = (cue.direction == Direction::Backward
                        || cue.direction == Direction::Both && !leads[k])
                        && me <= h.start
                        && !blocked(me, h.start)
                        && distance(me, h.start) <= p.backward_words;
                    if !(forward || backward || covers && cue.direction != Direction::None) {
                        continue;
                    }
                    match cue.category {
                        Category::Negated => a.negated = true,
                        Category::Possible => hedged = true,
                        Category::Differential => differential = true,
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
            if !a.negated && in_disjunction(&groups, i, mentions, kinds) {
                hedged = true;
            }
            if !a.negated && kinds[i].is_finding() && through_projection(text, ms, me, s1) {
                hedged = true;
            }
            a.uncertain = hedged || differential;
            a.differential = differential && !hedged && !a.negated;
            a
        })
        .collect()
}

/// Words that state a cause: a two-way cue right before one (`possibly from`, `perhaps due to`) qualifies the
/// cause and not the finding before it.
const CAUSAL: &[&str] = &["from", "due", "secondary", "related", "caused", "because", "attributable", "owing"];

/// Whether the first word at or after `at` (before `end`) states a cause (`CAUSAL`).
fn leads_cause(text: &str, at: usize, end: usize) -> bool {
    let rest = text[at..end].trim_start_matches(|c: char| !c.is_alphanumeric());
    let word = rest.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("");
    CAUSAL.iter().any(|c| word.eq_ignore_ascii_case(c))
}

/// The word that offers alternatives between list items ("versus" is a two-way uncertainty cue of its own; "and/or"
/// keeps the findings it joins).
const ALTERNATIVES: &[&str] = &["or"];

/// Words an item of a list does not count.
const ARTICLES: &[&str] = &["a", "an", "the", "any"];

/// Words beside an alternative that make it a quantity or a manner rather than a choice between findings ("one or
/// more", "with or without", "whether or not", "more or less").
const NOT_A_CHOICE: &[&str] =
    &["one", "two", "three", "four", "several", "more", "less", "fewer", "with", "without", "whether", "not"];

/// Words an item of a list of alternatives may hold, a mention counting as one ("focal lung consolidation").
const ITEM_WORDS: usize = 3;

/// A word, comma or other punctuation of a sentence.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    Word { start: usize, end: usize, counts: bool, choice: bool },
    Comma,
    Stop,
}

/// The lists of alternatives in a sentence ("pleural effusion or pneumothorax", "atelectasis, scarring or
/// infiltrate"), each as the byte spans of its items: an item is the words between two separators (a comma or an
/// alternative), at most `ITEM_WORDS` words; the item before the list's first separator and the one
/// after its alternative are read as far as `ITEM_WORDS` words from it. `ends` (cues and scope breakers), `:`
/// and other punctuation end a list. A list is only kept when its alternative joins two items.
fn disjunctions(
    text: &str,
    (s0, s1): (usize, usize),
    mentions: &[(usize, usize)],
    ends: &[(usize, usize)],
) -> Vec<Vec<(usize, usize)>> {
    let sent = &text[s0..s1];
    // "or" as a word (ALTERNATIVES), found without splitting the sentence.
    let bytes = sent.as_bytes();
    let is_word = |i: usize| bytes.get(i).is_some_and(|b| b.is_ascii_alphanumeric() || *b >= 0x80);
    let has_choice = (0..bytes.len().saturating_sub(1)).any(|i| {
        bytes[i].eq_ignore_ascii_case(&b'o')
            && bytes[i + 1].eq_ignore_ascii_case(&b'r')
            && !(i > 0 && is_word(i - 1))
            && !is_word(i + 2)
    });
    if !has_choice {
        return Vec::new();
    }
    let mut tokens = Vec::new();
    let mut chars = sent.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_alphanumeric() {
            let start = s0 + i;
            let mut end = start + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !in_word(d) {
                    break;
                }
                end = s0 + j + d.len_utf8();
                chars.next();
            }
            let word = &text[start..end];
            if ends.iter().any(|&(a, b)| a < end && start < b) {
                tokens.push(Token::Stop);
                continue;
            }
            // A mention counts as one word, articles as none.
            let mention = mentions.iter().find(|&&(ms, me)| ms <= start && end <= me);
            let counts = match mention {
                Some(&(ms, _)) => ms == start,
                None => !ARTICLES.iter().any(|a| word.eq_ignore_ascii_case(a)),
            };
            let choice = mention.is_none() && ALTERNATIVES.iter().any(|a| word.eq_ignore_ascii_case(a));
            tokens.push(Token::Word { start, end, counts, choice });
        } else if c == ',' {
            tokens.push(Token::Comma);
        } else if !c.is_whitespace() && c != '.' || c == '.' && chars.peek().is_none_or(|&(_, d)| d.is_whitespace()) {
            // Sentence punctuation and brackets end a list; a point inside a word ("vs.", "2.5") does not.
            tokens.push(Token::Stop);
        }
    }
    let word = |t: &Token| match *t {
        Token::Word { start, end, .. } => Some(&text[start..end]),
        _ => None,
    };
    let not_a_choice = |t: Option<&Token>| {
        t.and_then(word).is_some_and(|w| {
            w.bytes().all(|b| b.is_ascii_digit()) || NOT_A_CHOICE.iter().any(|n| w.eq_ignore_ascii_case(n))
        })
    };
    // The span of up to `ITEM_WORDS` counted words of `tokens[range]`, read from the end nearest the separator.
    let item = |range: &[Token], from_end: bool| -> Option<(usize, usize)> {
        let mut spans = range.iter().filter_map(|t| match *t {
            Token::Word { start, end, counts, .. } => Some((start, end, counts)),
            _ => None,
        });
        let mut taken: Vec<(usize, usize)> = Vec::new();
        let mut counted = 0;
        let mut take = |(start, end, counts): (usize, usize, bool)| {
            counted += usize::from(counts);
            if counted > ITEM_WORDS {
                return false;
            }
            taken.push((start, end));
            true
        };
        if from_end {
            for w in spans.rev() {
                if !take(w) {
                    break;
                }
            }
        } else {
            for w in spans.by_ref() {
                if !take(w) {
                    break;
                }
            }
        }
        let (a, b) = (taken.iter().map(|t| t.0).min()?, taken.iter().map(|t| t.1).max()?);
        Some((a, b))
    };
    // Whether a whole item is short enough to be one.
    let full =
        |range: &[Token]| range.iter().filter(|t| matches!(t, Token::Word { counts: true, .. })).count() <= ITEM_WORDS;
    let is_sep = |t: &Token| matches!(t, Token::Comma | Token::Stop | Token::Word { choice: true, .. });
    let mut groups = Vec::new();
    for (k, t) in tokens.iter().enumerate() {
        if !matches!(t, Token::Word { choice: true, .. }) {
            continue;
        }
        if not_a_choice(k.checked_sub(1).and_then(|j| tokens.get(j))) || not_a_choice(tokens.get(k + 1)) {
            continue;
        }
        let mut items = Vec::new();
        // After the alternative: up to the next separator.
        let after_end = tokens[k + 1..].iter().position(is_sep).map_or(tokens.len(), |p| k + 1 + p);
        let Some(after) = item(&tokens[k + 1..after_end], false) else { continue };
        items.push(after);
        // Before it: items separated by commas, back to a long item or another separator.
        let mut end = k;
        loop {
            let start = tokens[..end].iter().rposition(is_sep).map_or(0, |p| p + 1);
            let range = &tokens[start..end];
            let Some(span) = item(range, true) else { break };
            items.push(span);
            if !full(range) || start == 0 || tokens[start - 1] != Token::Comma {
                break;
            }
            end = start - 1;
        }
        if items.len() >= 2 {
            groups.push(items);
        }
    }
    groups
}

/// Whether mention `m` lies in an item of a list of alternatives that holds a mention of a like kind (`alike`) in
/// another item.
fn in_disjunction(groups: &[Vec<(usize, usize)>], m: usize, mentions: &[(usize, usize)], kinds: &[EntityKind]) -> bool {
    let within = |(a, b): (usize, usize), (ms, me): (usize, usize)| a <= ms && me <= b;
    let (ms, me) = mentions[m];
    groups.iter().any(|items| {
        let Some(own) = items.iter().position(|&i| within(i, (ms, me))) else { return false };
        items.iter().enumerate().any(|(j, &i)| {
            j != own
                && mentions.iter().zip(kinds).any(|(&o, &kind)| {
                    alike(kinds[m], kind) && o != (ms, me) && (o.1 <= ms || me <= o.0) && within(i, o)
                })
        })
    })
}

/// Whether mentions of kinds `a` and `b` can be alternatives to each other: a finding (disease or symptom) to a
/// finding, a drug to a drug, a procedure to a procedure, a test to a test; a site never (a choice of side names no
/// other finding).
fn alike(a: EntityKind, b: EntityKind) -> bool {
    a != EntityKind::Anatomy && (a == b || a.is_finding() && b.is_finding())
}

/// Nouns of a radiograph's projected outline. A finding stated through one ("the cardiac silhouette is enlarged",
/// "enlarged cardiac contour") is a sign of it, not the finding: the outline takes in more than the organ (an
/// enlarged cardiac silhouette is a cardiomegaly or a pericardial effusion), so the finding is possible.
const PROJECTIONS: &[&str] = &["silhouette", "silhouettes", "shadow", "shadows", "contour", "contours", "outline"];

/// Whether the mention `text[ms..me]` states its finding through a projected outline (`PROJECTIONS`): one of its
/// words, or the word right after it (the noun its last word qualifies: "enlarged cardiac | contour").
fn through_projection(text: &str, ms: usize, me: usize, sentence_end: usize) -> bool {
    let is_projection = |w: &str| PROJECTIONS.iter().any(|p| w.eq_ignore_ascii_case(p));
    if text[ms..me].split(|c: char| !c.is_alphanumeric()).any(is_projection) {
        return true;
    }
    // Only a noun that follows the mention's last word directly (one space between), not one past punctuation.
    text[me..sentence_end.max(me)]
        .strip_prefix(' ')
        .and_then(|after| after.split(|c: char| !c.is_alphanumeric()).next())
        .is_some_and(is_projection)
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

/// Whether `c` continues a word that began with a letter or digit ("x-ray", "and/or", "patient's").
fn in_word(c: char) -> bool {
    c.is_alphanumeric() || c == '\'' || c == '/' || c == '-'
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
            if !in_word(c) {
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
                    let found = lexicon.find(&note[s.start..s.end]);
                    let spans: Vec<(usize, usize)> =
                        found.iter().map(|t| (s.start + t.start, s.start + t.end)).collect();
                    let kinds: Vec<EntityKind> = found.iter().map(|t| lexicon.concept(t.concept).kind).collect();
                    let alone = assert_sentence(note, (s.start, s.end), &spans, &kinds, rules, &p);
                    let within = assert_sentence_prepared(note, &prepared, (s.start, s.end), &spans, &kinds, rules, &p);
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
            &[EntityKind::Disease],
            ContextRules::builtin(),
            &AssertionParams::default(),
        );
        r[0]
    }

    /// The assertions of several findings (diseases) of one sentence, each found at its first occurrence.
    fn assert_all(sentence: &str, mentions: &[&str]) -> Vec<Assertion> {
        let findings: Vec<(&str, EntityKind)> = mentions.iter().map(|&m| (m, EntityKind::Disease)).collect();
        assert_kinds(sentence, &findings)
    }

    /// `assert_all` with mentions of the given kinds.
    fn assert_kinds(sentence: &str, mentions: &[(&str, EntityKind)]) -> Vec<Assertion> {
        let spans: Vec<(usize, usize)> = mentions
            .iter()
            .map(|(m, _)| {
                let start = sentence.find(m).expect("mention in sentence");
                (start, start + m.len())
            })
            .collect();
        let kinds: Vec<EntityKind> = mentions.iter().map(|&(_, k)| k).collect();
        let (rules, p) = (ContextRules::builtin(), &AssertionParams::default());
        assert_sentence(sentence, (0, sentence.len()), &spans, &kinds, rules, p)
    }

    /// A finding stated through a radiograph's projected outline is a sign of it, and possible: the projection
    /// noun inside the mention or right after it. A negation wins; the organ itself, another word after the
    /// mention, or a projection noun past punctuation leaves it asserted; a site is never hedged.
    #[test]
    fn a_finding_stated_through_its_outline_is_possible() {
        for (sentence, mention) in [
            ("The cardiac silhouette is moderately enlarged.", "cardiac silhouette is moderately enlarged"),
            ("Stable enlarged cardiac contour.", "enlarged cardiac"),
            ("Enlarged cardiomediastinal silhouettes.", "Enlarged cardiomediastinal"),
            ("Enlargement of the cardiac shadow.", "Enlargement of the cardiac shadow"),
        ] {
            let a = assert_one(sentence, mention);
            assert!(a.uncertain && !a.negated && !a.differential, "{sentence}: {a:?}");
        }
        for (sentence, mention) in [
            ("The heart is moderately enlarged.", "heart is moderately enlarged"),
            ("Enlarged cardiac size, stable contour.", "Enlarged cardiac"),
            ("Enlarged heart. Silhouette otherwise normal.", "Enlarged heart"),
        ] {
            assert!(assert_one(sentence, mention).is_affirmed(), "{sentence}");
        }
        let negated = assert_one("No enlarged cardiac silhouette.", "enlarged cardiac silhouette");
        assert!(negated.negated && !negated.uncertain, "{negated:?}");
        let site = assert_kinds("Cardiac silhouette enlarged.", &[("Cardiac", EntityKind::Anatomy)]);
        assert!(site[0].is_affirmed(), "{site:?}");
    }

    /// A finding named in a differential ("A versus B") is uncertain, and marked as uncertain only by the
    /// differential unless another hedge (a modal, a question, a list of alternatives, a projected outline) applies.
    #[test]
    fn a_differential_is_uncertain_and_marked_as_such() {
        for (sentence, mention) in [
            ("Small left pleural effusion versus pleural thickening.", "pleural effusion"),
            ("Pleural thickening versus small effusion.", "effusion"),
            ("Atelectasis vs. pneumonia in the left base.", "pneumonia"),
        ] {
            let a = assert_one(sentence, mention);
            assert!(a.uncertain && a.differential, "{sentence}: {a:?}");
        }
        for (sentence, mention) in [
            ("This may represent pleural effusion versus pleural thickening.", "pleural effusion"),
            ("Question small right pleural effusion versus pleural thickening.", "pleural effusion"),
            ("Enlarged cardiac silhouette versus pericardial effusion.", "Enlarged cardiac"),
        ] {
            let a = assert_one(sentence, mention);
            assert!(a.uncertain && !a.differential, "{sentence}: {a:?}");
        }
        let negated = assert_one("No effusion versus prior.", "effusion");
        assert!(!negated.differential, "{negated:?}");
        assert!(assert_one("Effusion, stable since the prior study.", "Effusion").is_affirmed());
    }

    /// Findings offered as alternatives ("A or B", "A, B or C") are not asserted; a negation still wins; a
    /// quantity, a manner, an "and/or" or a list with one finding offers no choice between findings.
    #[test]
    fn findings_offered_as_alternatives_are_uncertain() {
        let both = assert_all("Pleural effusions or pneumothorax.", &["Pleural effusions", "pneumothorax"]);
        assert!(both.iter().all(|a| a.uncertain && !a.negated), "{both:?}");
        let list = assert_kinds(
            "Marrow pneumothorax, focal lung consolidation or pleural effusions.",
            &[
                ("Marrow", EntityKind::Anatomy),
                ("pneumothorax", EntityKind::Disease),
                ("lung", EntityKind::Anatomy),
                ("pleural effusions", EntityKind::Disease),
            ],
        );
        assert!(list[1].uncertain && list[3].uncertain, "{list:?}");
        let three = assert_all("Atelectasis, scarring or infiltrate in the left base.", &["Atelectasis", "infiltrate"]);
        assert!(three.iter().all(|a| a.uncertain), "{three:?}");
        let negated = assert_all("No pleural effusion or pneumothorax.", &["pleural effusion", "pneumothorax"]);
        assert!(negated.iter().all(|a| a.negated && !a.uncertain), "{negated:?}");
        for (sentence, mentions) in [
            ("Effusion and/or atelectasis at the right base.", &["Effusion", "atelectasis"][..]),
            ("Cardiomegaly and pleural effusion.", &["Cardiomegaly", "pleural effusion"]),
            ("New or worsening pleural effusion.", &["pleural effusion"]),
            ("One or more pulmonary nodules.", &["pulmonary nodules"]),
            ("Chest pain with or without exertion, and dyspnea.", &["Chest pain", "dyspnea"]),
            // The list ends at the negation: the cardiomegaly before it is no alternative.
            (
                "Mild cardiomegaly as before with no effusions or overt evidence of CHF.",
                &["cardiomegaly", "effusions", "CHF"],
            ),
        ] {
            let a = assert_all(sentence, mentions);
            assert!(!a[0].uncertain, "{sentence}: {a:?}");
        }
    }

    /// Only mentions of like kinds are alternatives: a choice of side or site beside a finding, or of drugs beside
    /// a finding, leaves the finding asserted; findings to findings and drugs to drugs are still a choice.
    #[test]
    fn only_like_kinds_are_alternatives() {
        use EntityKind::{Anatomy, Disease, Medication, Procedure, Symptom};
        for (sentence, mentions) in [
            ("Atelectasis in the left or right lung base.", &[("Atelectasis", Disease), ("lung", Anatomy)][..]),
            ("Edema, right or left leg.", &[("Edema", Symptom), ("leg", Anatomy)]),
            ("Removal of the spermatocele or needle drainage.", &[("spermatocele", Disease), ("drainage", Procedure)]),
        ] {
            let a = assert_kinds(sentence, mentions);
            assert!(!a[0].uncertain && !a[1].uncertain, "{sentence}: {a:?}");
        }
        let a = assert_kinds(
            "He takes aspirin or ibuprofen for headache.",
            &[("aspirin", Medication), ("ibuprofen", Medication), ("headache", Symptom)],
        );
        assert!(a[0].uncertain && a[1].uncertain && !a[2].uncertain, "{a:?}");
        let a = assert_kinds(
            "Atelectasis or pneumonia in the right lung base.",
            &[("Atelectasis", Disease), ("pneumonia", Disease), ("lung", Anatomy)],
        );
        assert!(a[0].uncertain && a[1].uncertain && !a[2].uncertain, "{a:?}");
        let a = assert_kinds("Cough or dyspnea on exertion.", &[("Cough", Symptom), ("dyspnea", Symptom)]);
        assert!(a.iter().all(|a| a.uncertain), "{a:?}");
    }

    /// A two-way cue that leads a cause ("possibly from", "possibly due to") qualifies the cause, not the finding
    /// before it; the breaker that names the cause does not end its scope.
    #[test]
    fn a_hedge_before_a_cause_qualifies_the_cause() {
        let a = assert_all(
            "Bilateral large pleural effusion, possibly from pleuritis or the known pancreatitis.",
            &["pleural effusion", "pleuritis", "pancreatitis"],
        );
        assert!(!a[0].uncertain && a[1].uncertain && a[2].uncertain, "{a:?}");
        let a = assert_all("Pleural effusion, possibly due to heart failure.", &["Pleural effusion", "heart failure"]);
        assert!(!a[0].uncertain && a[1].uncertain, "{a:?}");
        // Without a cause after it the cue reaches back as before.
        assert!(assert_one("Pleural effusion, possibly.", "Pleural effusion").uncertain);
        // A negation before a cause: "not due to trauma".
        assert!(assert_one("Rib pain not due to trauma.", "trauma").negated);
    }

    /// Hedges built from their parts (tools/build_context.py): any modal before a verb of representation, and a
    /// finding hard to exclude whatever adverb of degree stands inside — uncertain, not negated.
    #[test]
    fn hedges_are_built_from_their_parts() {
        for (sentence, mention) in [
            ("Bibasilar opacities, pulmonary edema difficult to entirely exclude.", "pulmonary edema"),
            ("The differential could include interstitial edema.", "interstitial edema"),
            ("Pneumonia cannot be completely excluded.", "Pneumonia"),
            ("Pneumonia cannot totally be excluded.", "Pneumonia"),
            ("It is not possible to rule out a small pneumothorax.", "pneumothorax"),
            ("The opacity might reflect atelectasis.", "atelectasis"),
        ] {
            let a = assert_one(sentence, mention);
            assert!(a.uncertain && !a.negated, "{sentence}: {a:?}");
        }
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
