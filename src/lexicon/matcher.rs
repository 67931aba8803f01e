//! A phrase matcher: one Aho-Corasick automaton (daachorse's double array) over many phrases, ASCII case folding,
//! word boundaries, and longest-leftmost non-overlapping selection. Built once, shared read-only across threads.
//! The built-in lexicon's automaton is compiled at build time (`compile`, `build.rs`) and loaded at start
//! (`from_compiled`); small phrase lists are compiled on the spot (`new`).
//!
//! A phrase marked case-sensitive (abbreviations such as `MS` or `PE`) matches only when the text has exactly
//! its case. Boundaries: the characters just before and after a match must not be letters or digits (so `pain`
//! does not match inside `painful`, and `no` does not match inside `nose`); a phrase that starts or ends with
//! another character needs no boundary there. The automaton enforces them itself: its patterns and the searched
//! text carry a boundary mark wherever a word character meets a non-word one (`compile::marked`, `prepare`), so
//! every match it reports is a match here. Runs of ASCII whitespace in the text match one space of a phrase.

use super::compile::{self, BOUNDARY, Compiled, is_word_char};

/// One occurrence of a phrase: byte span in the searched text and the phrase's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhraseMatch {
    pub start: usize,
    pub end: usize,
    pub phrase: u32,
}

pub struct PhraseMatcher {
    compiled: Compiled,
    /// Per phrase: the exact bytes to compare when the phrase is case-sensitive.
    exact: Vec<Option<Box<[u8]>>>,
}

impl std::fmt::Debug for PhraseMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhraseMatcher").field("phrases", &self.exact.len()).finish()
    }
}

fn exact_of<'a>(phrases: impl IntoIterator<Item = (&'a str, bool)>) -> Vec<Option<Box<[u8]>>> {
    phrases.into_iter().map(|(text, cs)| cs.then(|| text.as_bytes().to_vec().into_boxed_slice())).collect()
}

impl PhraseMatcher {
    /// `phrases`: (text, case_sensitive). Phrase indexes are positions in this list.
    pub fn new<'a>(phrases: impl IntoIterator<Item = (&'a str, bool)> + Clone) -> Result<Self, super::LexiconError> {
        let texts: Vec<&str> = phrases.clone().into_iter().map(|(t, _)| t).collect();
        let compiled = compile::compile(&texts).map_err(super::LexiconError)?;
        Ok(Self { compiled, exact: exact_of(phrases) })
    }

    /// Loads a compiled form (`compile::Compiled::to_bytes`) of these very phrases: a form compiled from other
    /// phrases (count or fingerprint differ) is an error.
    pub fn from_compiled<'a>(
        bytes: &[u8],
        phrases: impl IntoIterator<Item = (&'a str, bool)> + Clone,
    ) -> Result<Self, super::LexiconError> {
        let compiled = Compiled::from_bytes(bytes).map_err(super::LexiconError)?;
        let exact = exact_of(phrases.clone());
        let fingerprint = compile::fingerprint(phrases.into_iter().map(|(t, _)| t));
        if compiled.phrases as usize != exact.len() || compiled.fingerprint != fingerprint {
            return Err(super::LexiconError(format!(
                "the compiled phrase automaton holds {} other phrases than the {} given (rebuild)",
                compiled.phrases,
                exact.len()
            )));
        }
        Ok(Self { compiled, exact })
    }

    pub fn len(&self) -> usize {
        self.exact.len()
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty()
    }

    /// Every boundary-respecting occurrence (overlapping), ordered by start, longest first, then phrase index.
    /// Runs of whitespace in the text match the single spaces of a phrase (`negative   for` matches `negative
    /// for`).
    pub fn find_all(&self, text: &str) -> Vec<PhraseMatch> {
        find_all_of(&[(self, 0)], text)
    }

    fn push_prepared(&self, text: &str, prepared: &Prepared, offset: u32, out: &mut Vec<PhraseMatch>) {
        let (bytes, origin) = (prepared.bytes.as_slice(), prepared.origin.as_slice());
        for m in self.compiled.automaton.find_overlapping_iter(bytes) {
            let (s, e) = (m.start(), m.end());
            // A boundary mark stands for the position of the character after it.
            let start = origin[s] as usize;
            let end = if bytes[e - 1] == BOUNDARY { origin[e - 1] as usize } else { origin[e - 1] as usize + 1 };
            for &id in self.compiled.group(m.value()) {
                if let Some(exact) = &self.exact[id as usize]
                    && !same_but_spaces(&text.as_bytes()[start..end], exact)
                {
                    continue;
                }
                out.push(PhraseMatch { start, end, phrase: id + offset });
            }
        }
    }

    /// The phrases whose folded text is the whole of `text` folded (no boundary or case rules: the caller
    /// compares texts).
    pub fn exact(&self, text: &str) -> Vec<u32> {
        let marked = compile::marked(text);
        self.compiled
            .automaton
            .find_overlapping_iter(&marked)
            .filter(|m| m.start() == 0 && m.end() == marked.len())
            .flat_map(|m| self.compiled.group(m.value()).iter().copied())
            .collect()
    }

    /// Non-overlapping occurrences: leftmost first, longest at a position.
    pub fn find(&self, text: &str) -> Vec<PhraseMatch> {
        select_longest(self.find_all(text))
    }
}

/// `find_all` over several matchers at once, as if they were one over the concatenation of their phrase lists:
/// each `(matcher, offset)` adds `offset` to its phrase indexes. The text is prepared (folded, marked) once.
pub fn find_all_of(matchers: &[(&PhraseMatcher, u32)], text: &str) -> Vec<PhraseMatch> {
    let mut out = Vec::new();
    let prepared = prepare(text);
    for (m, offset) in matchers {
        m.push_prepared(text, &prepared, *offset, &mut out);
    }
    out.sort_unstable_by_key(|m| (m.start, std::cmp::Reverse(m.end), m.phrase));
    out
}

/// A text as the automaton searches it, and where each of its bytes came from.
struct Prepared {
    /// ASCII case folded, each run of ASCII whitespace one space, `BOUNDARY` wherever a word character meets a
    /// non-word one (and before a leading, after a trailing word character): the rule of `compile::marked`.
    bytes: Vec<u8>,
    /// Per byte of `bytes`: its offset in the text; for a boundary mark, the offset of the character after it.
    origin: Vec<u32>,
}

fn prepare(text: &str) -> Prepared {
    let src = text.as_bytes();
    let cap = src.len() + src.len() / 3 + 2;
    let (mut bytes, mut origin) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    let mut word = false;
    let mut i = 0;
    while i < src.len() {
        let b = src[i];
        let (w, len) = if b.is_ascii() {
            (b.is_ascii_alphanumeric(), 1)
        } else {
            let c = text[i..].chars().next().expect("a char starts here");
            (is_word_char(c), c.len_utf8())
        };
        if w != word {
            bytes.push(BOUNDARY);
            origin.push(i as u32);
            word = w;
        }
        if b.is_ascii_whitespace() {
            bytes.push(b' ');
            origin.push(i as u32);
            i += 1;
            while i < src.len() && src[i].is_ascii_whitespace() {
                i += 1;
            }
            continue;
        }
        for (k, &c) in src[i..i + len].iter().enumerate() {
            bytes.push(c.to_ascii_lowercase());
            origin.push((i + k) as u32);
        }
        i += len;
    }
    if word {
        bytes.push(BOUNDARY);
        origin.push(src.len() as u32);
    }
    Prepared { bytes, origin }
}

/// Whether `text` equals `phrase` byte for byte, a run of ASCII whitespace in `text` standing for one space.
fn same_but_spaces(text: &[u8], phrase: &[u8]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < text.len() {
        if phrase.get(j) != Some(if text[i].is_ascii_whitespace() { &b' ' } else { &text[i] }) {
            return false;
        }
        if text[i].is_ascii_whitespace() {
            while i < text.len() && text[i].is_ascii_whitespace() {
                i += 1;
            }
        } else {
            i += 1;
        }
        j += 1;
    }
    j == phrase.len()
}

/// Keeps leftmost-longest non-overlapping matches from matches sorted by (start, longest first).
pub fn select_longest(sorted: Vec<PhraseMatch>) -> Vec<PhraseMatch> {
    let mut out: Vec<PhraseMatch> = Vec::with_capacity(sorted.len());
    let mut covered = 0;
    for m in sorted {
        if m.start >= covered {
            covered = m.end;
            out.push(m);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statement of the rules, one phrase at a time over the whitespace-collapsed text, char by char: every
    /// occurrence of the folded phrase whose ends respect the boundary rule and, for a case-sensitive phrase, with
    /// the phrase's exact case. Offsets in the original text.
    fn reference(phrases: &[(&str, bool)], text: &str) -> Vec<PhraseMatch> {
        let mut norm = String::new();
        let mut map = Vec::new();
        for (i, c) in text.char_indices() {
            if c.is_ascii_whitespace() {
                if !norm.ends_with(' ') {
                    norm.push(' ');
                    map.push(i);
                }
                continue;
            }
            for k in 0..c.len_utf8() {
                map.push(i + k);
            }
            norm.push(c);
        }
        let word_at = |s: &str| s.chars().next().is_some_and(is_word_char);
        let word_before = |s: &str| s.chars().next_back().is_some_and(is_word_char);
        let mut out = Vec::new();
        for (id, &(phrase, cs)) in phrases.iter().enumerate() {
            if phrase.is_empty() {
                continue;
            }
            for start in (0..=norm.len()).filter(|&i| norm.is_char_boundary(i)) {
                let end = start + phrase.len();
                let Some(found) = norm.get(start..end) else { continue };
                let same = if cs { found == phrase } else { found.eq_ignore_ascii_case(phrase) };
                let before_ok = !word_at(found) || !word_before(&norm[..start]);
                let after_ok = !word_before(found) || !word_at(&norm[end..]);
                if same && before_ok && after_ok {
                    let orig_end = map[end - 1] + 1;
                    out.push(PhraseMatch { start: map[start], end: orig_end, phrase: id as u32 });
                }
            }
        }
        out.sort_unstable_by_key(|m| (m.start, std::cmp::Reverse(m.end), m.phrase));
        out
    }

    #[test]
    fn the_marked_automaton_finds_what_the_rules_say() {
        let phrases: Vec<(&str, bool)> = vec![
            ("pain", false),
            ("chest pain", false),
            ("ar", false),
            ("MS", true),
            ("Ms A", true),
            ("(+)-x", false),
            ("b.p.", false),
            ("-1", false),
            ("é", false),
            ("fièvre légère", false),
            ("a1", false),
            (" a", false),
            ("x ", false),
            ("a-b", false),
            ("", false),
        ];
        let m = PhraseMatcher::new(phrases.iter().copied()).unwrap();
        let fixed = [
            "heart pain, painful; chest  \n pain",
            "MS ms Ms  A ms a\r\nMS",
            "(+)-x y(+)-xz B.P. b.p.q -1 a-1 2-1",
            "é fé éa Fièvre\tlégère fièvre légèreté",
            "a1 a12 ba1 a-b a-bc xa-b",
            "",
            " ",
            "\u{a0}pain\u{a0}ar\u{2014}ar",
        ];
        for text in fixed {
            assert_eq!(m.find_all(text), reference(&phrases, text), "{text:?}");
        }
        // Random texts over an alphabet of the characters the rules treat differently.
        let alphabet = [
            'a', 'r', 'p', 'i', 'n', 'A', 'M', 'S', 's', '1', '-', '.', ' ', '\n', '\t', 'é', '\u{a0}', '(', ')', '+',
            'x', 'b',
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut text = String::new();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            for _ in 0..(state % 40) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            for p in ["pain", "ar", "a1", "b.", "MS", "x", "(+)-x"] {
                if state.is_multiple_of(3) {
                    text.push_str(p);
                }
                state = state.rotate_left(7);
            }
            assert_eq!(m.find_all(&text), reference(&phrases, &text), "{text:?}");
        }
        assert_eq!(m.exact("Chest Pain"), vec![1]);
        assert!(m.exact("chest  pain").is_empty() && m.exact("pain ").is_empty());
    }

    #[test]
    fn longest_leftmost_with_boundaries_and_case_rules() {
        let m = PhraseMatcher::new([
            ("pleural effusion", false),
            ("effusion", false),
            ("pain", false),
            ("chest pain", false),
            ("MS", true),
            ("no", false),
        ])
        .unwrap();
        let text = "No chest pain, painful nose. Pleural effusion; ms and MS.";
        let found: Vec<&str> = m.find(text).iter().map(|x| &text[x.start..x.end]).collect();
        assert_eq!(found, vec!["No", "chest pain", "Pleural effusion", "MS"]);
        let text = "no   chest\n pain here";
        let found: Vec<&str> = m.find(text).iter().map(|x| &text[x.start..x.end]).collect();
        assert_eq!(found, vec!["no", "chest\n pain"]);
    }
}
