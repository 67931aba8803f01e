//! A phrase matcher: one Aho-Corasick automaton (daachorse's double array) over many phrases, ASCII case folding,
//! word boundaries, and longest-leftmost non-overlapping selection. Built once, shared read-only across threads.
//! The built-in lexicon's automaton is compiled at build time (`compile`, `build.rs`) and loaded at start
//! (`from_compiled`); small phrase lists are compiled on the spot (`new`).
//!
//! A phrase marked case-sensitive (abbreviations such as `MS` or `PE`) matches only when the text has exactly
//! its case. Boundaries: the characters just before and after a match must not be letters or digits (so `pain`
//! does not match inside `painful`, and `no` does not match inside `nose`).

use super::compile::{self, Compiled};

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

    fn push_normalised(&self, text: &str, offset: u32, out: &mut Vec<PhraseMatch>) {
        let bytes = text.as_bytes();
        let folded = bytes.iter().map(u8::to_ascii_lowercase);
        for m in self.compiled.automaton.find_overlapping_iter_from_iter(folded) {
            let (start, end) = (m.start(), m.end());
            if !boundary_before(text, start) || !boundary_after(text, end) {
                continue;
            }
            for &id in self.compiled.group(m.value()) {
                if let Some(exact) = &self.exact[id as usize]
                    && &bytes[start..end] != exact.as_ref()
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
        let folded = text.bytes().map(|b| b.to_ascii_lowercase());
        self.compiled
            .automaton
            .find_overlapping_iter_from_iter(folded)
            .filter(|m| m.start() == 0 && m.end() == text.len())
            .flat_map(|m| self.compiled.group(m.value()).iter().copied())
            .collect()
    }

    /// Non-overlapping occurrences: leftmost first, longest at a position.
    pub fn find(&self, text: &str) -> Vec<PhraseMatch> {
        select_longest(self.find_all(text))
    }
}

/// `find_all` over several matchers at once, as if they were one over the concatenation of their phrase lists:
/// each `(matcher, offset)` adds `offset` to its phrase indexes. The text is normalised once.
pub fn find_all_of(matchers: &[(&PhraseMatcher, u32)], text: &str) -> Vec<PhraseMatch> {
    let mut out = Vec::new();
    if !needs_normalising(text) {
        for (m, offset) in matchers {
            m.push_normalised(text, *offset, &mut out);
        }
    } else {
        let (normalised, shifts) = normalise_whitespace(text);
        for (m, offset) in matchers {
            m.push_normalised(&normalised, *offset, &mut out);
        }
        let to_original = |pos: usize| {
            // The last shift at or before `pos` gives the offset to add.
            let i = shifts.partition_point(|&(at, _)| at <= pos);
            pos + if i == 0 { 0 } else { shifts[i - 1].1 }
        };
        for m in &mut out {
            m.start = to_original(m.start);
            m.end = to_original(m.end - 1) + 1;
        }
    }
    out.sort_unstable_by_key(|m| (m.start, std::cmp::Reverse(m.end), m.phrase));
    out
}

fn needs_normalising(text: &str) -> bool {
    let b = text.as_bytes();
    b.iter().any(|&c| c == b'\n' || c == b'\t' || c == b'\r') || b.windows(2).any(|w| w == b"  ")
}

/// Collapses runs of ASCII whitespace to one space. Returns the text and its shifts: `(normalised offset, bytes
/// removed before it)` at each point where the removed count grows, so an offset maps back with one binary
/// search (a sparse map, not one entry per byte).
fn normalise_whitespace(text: &str) -> (String, Vec<(usize, usize)>) {
    // Byte runs, not chars: whitespace is ASCII, so cutting at it keeps every UTF-8 sequence whole.
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut shifts = Vec::new();
    let mut removed = 0;
    let mut i = 0;
    while i < bytes.len() {
        let word_end = bytes[i..].iter().position(u8::is_ascii_whitespace).map_or(bytes.len(), |p| i + p);
        out.extend_from_slice(&bytes[i..word_end]);
        if word_end == bytes.len() {
            break;
        }
        let space_end =
            bytes[word_end..].iter().position(|b| !b.is_ascii_whitespace()).map_or(bytes.len(), |p| word_end + p);
        out.push(b' ');
        let now_removed = removed + (space_end - word_end - 1);
        if now_removed != removed && space_end < bytes.len() {
            shifts.push((out.len(), now_removed));
        }
        removed = now_removed;
        i = space_end;
    }
    (String::from_utf8(out).expect("cut at ASCII whitespace only"), shifts)
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

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
}

fn boundary_before(text: &str, start: usize) -> bool {
    let first = text[start..].chars().next();
    // A phrase that starts with punctuation needs no boundary.
    if !first.is_some_and(is_word_char) {
        return true;
    }
    text[..start].chars().next_back().is_none_or(|c| !is_word_char(c))
}

fn boundary_after(text: &str, end: usize) -> bool {
    let last = text[..end].chars().next_back();
    if !last.is_some_and(is_word_char) {
        return true;
    }
    text[end..].chars().next().is_none_or(|c| !is_word_char(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-run normaliser against a plain per-char statement of the same rule.
    #[test]
    fn whitespace_runs_collapse_with_a_sparse_offset_map() {
        for text in ["a  b\n\n c", "  lead and trail  ", "é\t\tü ñ\r\nx", "", " ", "one", "a\nb"] {
            let (out, shifts) = normalise_whitespace(text);
            let mut expected = String::new();
            let mut map = Vec::new();
            for (i, c) in text.char_indices() {
                if c.is_ascii_whitespace() {
                    if !expected.ends_with(' ') {
                        expected.push(' ');
                        map.push(i);
                    }
                    continue;
                }
                map.extend((0..c.len_utf8()).map(|k| i + k));
                expected.push(c);
            }
            assert_eq!(out, expected, "{text:?}");
            for (pos, &orig) in map.iter().enumerate() {
                if out.as_bytes()[pos] == b' ' {
                    continue;
                }
                let k = shifts.partition_point(|&(at, _)| at <= pos);
                let back = pos + if k == 0 { 0 } else { shifts[k - 1].1 };
                assert_eq!(back, orig, "{text:?} at {pos}");
            }
        }
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
