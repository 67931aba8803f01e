//! A phrase matcher: one Aho-Corasick automaton over many phrases, ASCII case folding, word boundaries, and
//! longest-leftmost non-overlapping selection. Built once, shared read-only across threads.
//!
//! A phrase marked case-sensitive (abbreviations such as `MS` or `PE`) matches only when the text has exactly
//! its case. Boundaries: the characters just before and after a match must not be letters or digits (so `pain`
//! does not match inside `painful`, and `no` does not match inside `nose`).

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

/// One occurrence of a phrase: byte span in the searched text and the phrase's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhraseMatch {
    pub start: usize,
    pub end: usize,
    pub phrase: u32,
}

pub struct PhraseMatcher {
    automaton: AhoCorasick,
    /// Per phrase: the exact bytes to compare when the phrase is case-sensitive.
    exact: Vec<Option<Box<[u8]>>>,
}

impl std::fmt::Debug for PhraseMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhraseMatcher").field("phrases", &self.exact.len()).finish()
    }
}

impl PhraseMatcher {
    /// `phrases`: (text, case_sensitive). Phrase indexes are positions in this list.
    pub fn new<'a>(phrases: impl IntoIterator<Item = (&'a str, bool)>) -> Result<Self, super::LexiconError> {
        let mut patterns = Vec::new();
        let mut exact = Vec::new();
        for (text, case_sensitive) in phrases {
            patterns.push(text.to_string());
            exact.push(case_sensitive.then(|| text.as_bytes().to_vec().into_boxed_slice()));
        }
        let automaton = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .map_err(|e| super::LexiconError(e.to_string()))?;
        Ok(Self { automaton, exact })
    }

    pub fn len(&self) -> usize {
        self.exact.len()
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty()
    }

    /// Every boundary-respecting occurrence (overlapping), in order of start. Runs of whitespace in the text
    /// match the single spaces of a phrase (`negative   for` matches `negative for`).
    pub fn find_all(&self, text: &str) -> Vec<PhraseMatch> {
        if !needs_normalising(text) {
            return self.find_all_normalised(text);
        }
        let (normalised, shifts) = normalise_whitespace(text);
        let to_original = |pos: usize| {
            // The last shift at or before `pos` gives the offset to add.
            let i = shifts.partition_point(|&(at, _)| at <= pos);
            pos + if i == 0 { 0 } else { shifts[i - 1].1 }
        };
        let mut found = self.find_all_normalised(&normalised);
        for m in &mut found {
            m.start = to_original(m.start);
            m.end = to_original(m.end - 1) + 1;
        }
        found
    }

    fn find_all_normalised(&self, text: &str) -> Vec<PhraseMatch> {
        let bytes = text.as_bytes();
        let mut out = Vec::new();
        for m in self.automaton.find_overlapping_iter(text) {
            let (start, end) = (m.start(), m.end());
            if !boundary_before(text, start) || !boundary_after(text, end) {
                continue;
            }
            let id = m.pattern().as_u32();
            if let Some(exact) = &self.exact[id as usize]
                && &bytes[start..end] != exact.as_ref()
            {
                continue;
            }
            out.push(PhraseMatch { start, end, phrase: id });
        }
        out.sort_by_key(|m| (m.start, std::cmp::Reverse(m.end)));
        out
    }

    /// Non-overlapping occurrences: leftmost first, longest at a position.
    pub fn find(&self, text: &str) -> Vec<PhraseMatch> {
        select_longest(self.find_all(text))
    }
}

fn needs_normalising(text: &str) -> bool {
    let b = text.as_bytes();
    b.iter().any(|&c| c == b'\n' || c == b'\t' || c == b'\r') || b.windows(2).any(|w| w == b"  ")
}

/// Collapses runs of ASCII whitespace to one space. Returns the text and its shifts: `(normalised offset, bytes
/// removed before it)` at each point where the removed count grows, so an offset maps back with one binary
/// search (a sparse map, not one entry per byte).
fn normalise_whitespace(text: &str) -> (String, Vec<(usize, usize)>) {
    let mut out = String::with_capacity(text.len());
    let mut shifts = Vec::new();
    let mut in_space = false;
    for (i, c) in text.char_indices() {
        if c.is_ascii_whitespace() {
            if !in_space {
                out.push(' ');
            }
            in_space = true;
            continue;
        }
        in_space = false;
        let removed = i - out.len();
        if shifts.last().map_or(0, |&(_, r)| r) != removed {
            shifts.push((out.len(), removed));
        }
        out.push(c);
    }
    (out, shifts)
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
