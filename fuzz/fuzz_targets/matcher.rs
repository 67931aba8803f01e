//! Fuzzes the phrase matcher (the trie over words that holds the lexicon's 92k terms, the variables' terms and the
//! ConText cues) against the statement of its rules (`matcher::reference`): phrases (with their case flags), a
//! text and pieces of it come from the input. `find_all` must equal the statement, `find` its longest-leftmost
//! selection, and `find_within` on a prepared text any piece's `find` alone.
#![no_main]

use clinstream::lexicon::matcher::{self, PhraseMatcher};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<(String, bool)>, String, Vec<(u16, u16)>)| {
    let (phrases, text, pieces) = input;
    // The statement is quadratic: keep inputs small (the trie walks words, so size adds nothing new).
    if phrases.len() > 48 || phrases.iter().any(|(p, _)| p.len() > 48) || text.len() > 1024 {
        return;
    }
    let list: Vec<(&str, bool)> = phrases.iter().map(|(p, cs)| (p.as_str(), *cs)).collect();
    // Lists the compiler refuses (too many distinct separators or words) are errors, not matchers.
    let Ok(m) = PhraseMatcher::new(list.iter().copied()) else { return };
    let all = m.find_all(&text);
    assert_eq!(all, matcher::reference(&list, &text), "find_all against the statement");
    let found = m.find(&text);
    assert_eq!(found, matcher::select_longest(all), "find is the longest-leftmost selection");
    let prepared = matcher::prepare(&text);
    let bound = |x: u16| {
        let mut i = x as usize % (text.len() + 1);
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    for (a, b) in pieces.into_iter().take(8) {
        let (x, y) = (bound(a), bound(b));
        let (from, to) = (x.min(y), x.max(y));
        assert_eq!(m.find_within(&text, &prepared, from, to), m.find(&text[from..to]), "piece {from}..{to}");
    }
});
