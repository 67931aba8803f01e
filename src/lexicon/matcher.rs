//! A phrase matcher: a trie over the words of many phrases (`compile::Trie`), ASCII case folding, word
//! boundaries, and longest-leftmost non-overlapping selection. Built once, shared read-only across threads.
//! The built-in lexicon's trie is compiled at build time (`compile`, `build.rs`) and loaded at start
//! (`from_compiled`); small phrase lists are compiled on the spot (`new`).
//!
//! A phrase marked case-sensitive (abbreviations such as `MS` or `PE`) matches only when the text has exactly
//! its case. Boundaries: the characters just before and after a match must not be letters or digits (so `pain`
//! does not match inside `painful`, and `no` does not match inside `nose`); a phrase that starts or ends with
//! another character needs no boundary there. Runs of ASCII whitespace in the text match one space of a phrase.
//! The search reads the text as the trie holds phrases: its words (maximal runs of letters and digits) and the
//! separators between them; a walk starts at every word the trie knows and follows (separator, word) steps, so
//! every match it reports respects the boundaries by construction.

use super::compile::{self, Compiled, NONE, is_word_char};

/// One occurrence of a phrase: byte span in the searched text and the phrase's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhraseMatch {
    pub start: usize,
    pub end: usize,
    pub phrase: u32,
}

pub struct PhraseMatcher {
    compiled: Compiled,
    /// The case-sensitive phrases and their exact bytes; one bit per phrase says whether it is one (the bits
    /// stay in cache, the bytes are read only for those phrases).
    exact: Exact,
    /// Per byte: whether some lead separator ends with it (ASCII whitespace as a space).
    lead_last: [bool; 256],
}

impl std::fmt::Debug for PhraseMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhraseMatcher").field("phrases", &self.exact.phrases).finish()
    }
}

struct Exact {
    phrases: usize,
    flagged: Vec<u64>,
    bytes: rustc_hash::FxHashMap<u32, Box<[u8]>>,
}

impl Exact {
    /// The exact bytes of phrase `id` when it is case-sensitive.
    #[inline]
    fn get(&self, id: u32) -> Option<&[u8]> {
        let flagged = self.flagged.get(id as usize / 64).is_some_and(|w| w >> (id % 64) & 1 == 1);
        if flagged { self.bytes.get(&id).map(|b| &b[..]) } else { None }
    }
}

fn exact_of<'a>(phrases: impl IntoIterator<Item = (&'a str, bool)>) -> Exact {
    let mut e = Exact { phrases: 0, flagged: Vec::new(), bytes: rustc_hash::FxHashMap::default() };
    for (id, (text, case_sensitive)) in phrases.into_iter().enumerate() {
        if id % 64 == 0 {
            e.flagged.push(0);
        }
        if case_sensitive {
            e.flagged[id / 64] |= 1 << (id % 64);
            e.bytes.insert(id as u32, text.as_bytes().into());
        }
        e.phrases = id + 1;
    }
    e
}

impl PhraseMatcher {
    fn with(compiled: Compiled, exact: Exact) -> Self {
        let mut lead_last = [false; 256];
        let t = &compiled.trie;
        for &[a, b, _] in &t.leads {
            if let Some(&last) = t.lead_text[a as usize..b as usize].last() {
                lead_last[last as usize] = true;
            }
        }
        Self { compiled, exact, lead_last }
    }

    /// `phrases`: (text, case_sensitive). Phrase indexes are positions in this list.
    pub fn new<'a>(phrases: impl IntoIterator<Item = (&'a str, bool)> + Clone) -> Result<Self, super::LexiconError> {
        let texts: Vec<&str> = phrases.clone().into_iter().map(|(t, _)| t).collect();
        let compiled = compile::compile(&texts).map_err(|e| super::LexiconError(e.to_string()))?;
        Ok(Self::with(compiled, exact_of(phrases)))
    }

    /// Loads a compiled form (`compile::Compiled::to_bytes`) of these very phrases: a form compiled from other
    /// phrases (count or fingerprint differ) is an error.
    pub fn from_compiled<'a>(
        bytes: &[u8],
        phrases: impl IntoIterator<Item = (&'a str, bool)> + Clone,
    ) -> Result<Self, super::LexiconError> {
        let compiled = Compiled::from_bytes(bytes).map_err(|e| super::LexiconError(e.to_string()))?;
        let exact = exact_of(phrases.clone());
        let fingerprint = compile::fingerprint(phrases.into_iter().map(|(t, _)| t));
        if compiled.phrases as usize != exact.phrases || compiled.fingerprint != fingerprint {
            return Err(super::LexiconError(format!(
                "the compiled phrase matcher holds {} other phrases than the {} given (rebuild)",
                compiled.phrases, exact.phrases
            )));
        }
        Ok(Self::with(compiled, exact))
    }

    pub fn len(&self) -> usize {
        self.exact.phrases
    }

    pub fn is_empty(&self) -> bool {
        self.exact.phrases == 0
    }

    /// Every boundary-respecting occurrence (overlapping), ordered by start, longest first, then phrase index.
    /// Runs of whitespace in the text match the single spaces of a phrase (`negative   for` matches `negative
    /// for`).
    pub fn find_all(&self, text: &str) -> Vec<PhraseMatch> {
        find_all_of(&[(self, 0)], text)
    }

    /// The group's phrases found at `start..end`, the case-sensitive ones only where the text has their case.
    #[inline]
    fn emit(&self, text: &str, start: usize, end: usize, group: u32, offset: u32, out: &mut Vec<PhraseMatch>) {
        for &id in self.compiled.group(group) {
            if let Some(exact) = self.exact.get(id)
                && !same_but_spaces(&text.as_bytes()[start..end], exact)
            {
                continue;
            }
            out.push(PhraseMatch { start, end, phrase: id + offset });
        }
    }

    fn push_prepared(&self, text: &str, p: &Prepared, offset: u32, out: &mut Vec<PhraseMatch>) {
        self.push_words(text, &p.folded, &p.words, &p.keys, offset, out);
        if !self.compiled.trie.pure.is_empty() {
            self.push_pure(text, p, offset, out);
        }
    }

    /// The matches of every pattern with words that starts at one of `words` (spans of the text, in order, a
    /// run of `prepare(text).words`, `keys` the same run of its keys; `folded` that preparation's folded text)
    /// and takes its words from them.
    fn push_words(
        &self,
        text: &str,
        folded: &[u8],
        words: &[(u32, u32)],
        keys: &[(u64, u64)],
        offset: u32,
        out: &mut Vec<PhraseMatch>,
    ) {
        let t = &self.compiled.trie;
        let src = text.as_bytes();
        // Per word: its id and the node of the patterns it starts (`NONE`s when no pattern has it).
        let mut found: Vec<(u32, u32)> = Vec::new();
        t.words.get_all_keyed(folded, words, keys, &mut found);
        let walk = |mut node: u32, mut j: usize, start: usize, out: &mut Vec<PhraseMatch>| loop {
            let end = words[j].1 as usize;
            for &g in t.outs(node) {
                self.emit(text, start, end, g, offset, out);
            }
            for &[a, b, g] in t.trails(node) {
                let after = &src[end..words.get(j + 1).map_or(src.len(), |w| w.0 as usize)];
                if let Some(e) = collapsed_prefix_end(after, &t.trail_text[a as usize..b as usize]) {
                    self.emit(text, start, end + e, g, offset, out);
                }
            }
            let Some(&(next, _)) = found.get(j + 1) else { return };
            if next == NONE || !t.has_children(node) {
                return;
            }
            let sep = sep_id(t, &src[end..words[j + 1].0 as usize]);
            if sep == NONE || !t.may_have_child(node, sep, next) {
                return;
            }
            node = t.child(node, sep, next);
            if node == NONE {
                return;
            }
            j += 1;
        };
        for (j, &(w, node)) in found.iter().enumerate() {
            let start = words[j].0 as usize;
            if node != NONE {
                walk(node, j, start, out);
            }
            if w == NONE || t.leads.is_empty() {
                continue;
            }
            let before_from = if j == 0 { 0 } else { words[j - 1].1 as usize };
            let before = &src[before_from..start];
            let Some(&last) = before.last() else { continue };
            if !self.lead_last[if last.is_ascii_whitespace() { b' ' } else { last } as usize] {
                continue;
            }
            for &[a, b, lead_node] in &t.leads {
                if let Some(s) = collapsed_suffix_start(before, &t.lead_text[a as usize..b as usize]) {
                    let node = t.child(lead_node, compile::LEAD_STEP, w);
                    if node != NONE {
                        walk(node, j, before_from + s, out);
                    }
                }
            }
        }
    }

    /// Wordless phrases: anywhere inside a separator (before the first word, between words, after the last).
    fn push_pure(&self, text: &str, p: &Prepared, offset: u32, out: &mut Vec<PhraseMatch>) {
        let t = &self.compiled.trie;
        let src = text.as_bytes();
        let mut bounds = vec![0];
        for &(a, b) in &p.words {
            bounds.extend([a as usize, b as usize]);
        }
        bounds.push(src.len());
        for run in bounds.chunks_exact(2) {
            let (from, to) = (run[0], run[1]);
            let (mut collapsed, mut origin) = (Vec::new(), Vec::new());
            let mut i = from;
            while i < to {
                origin.push(i);
                if src[i].is_ascii_whitespace() {
                    collapsed.push(b' ');
                    while i < to && src[i].is_ascii_whitespace() {
                        i += 1;
                    }
                } else {
                    collapsed.push(src[i]);
                    i += 1;
                }
            }
            for &[a, b, g] in &t.pure {
                let pat = &t.pure_text[a as usize..b as usize];
                for q in 0..collapsed.len().saturating_sub(pat.len().saturating_sub(1)) {
                    if !pat.is_empty() && collapsed[q..].starts_with(pat) {
                        self.emit(text, origin[q], origin[q + pat.len() - 1] + 1, g, offset, out);
                    }
                }
            }
        }
    }

    /// The phrases whose folded text is the whole of `text` folded (no boundary or case rules: the caller
    /// compares texts; whitespace is not collapsed).
    pub fn exact(&self, text: &str) -> Vec<u32> {
        let t = &self.compiled.trie;
        let marked = compile::marked(text);
        let pieces: Vec<&[u8]> = marked.split(|&b| b == compile::BOUNDARY).collect();
        let groups: Vec<u32> = if pieces.len() == 1 {
            t.pure
                .iter()
                .filter(|&&[a, b, _]| &t.pure_text[a as usize..b as usize] == pieces[0])
                .map(|x| x[2])
                .collect()
        } else {
            let (lead, trail) = (pieces[0], pieces[pieces.len() - 1]);
            let inner = &pieces[1..pieces.len() - 1];
            let (first, first_node) = t.words.get_with_value(inner[0]);
            let mut node = if first == NONE {
                NONE
            } else if lead.is_empty() {
                first_node
            } else {
                t.leads
                    .iter()
                    .find(|&&[a, b, _]| &t.lead_text[a as usize..b as usize] == lead)
                    .map_or(NONE, |&[_, _, n]| t.child(n, compile::LEAD_STEP, first))
            };
            for step in inner[1..].chunks_exact(2) {
                if node == NONE {
                    break;
                }
                let (sep, word) = (t.seps.get(step[0]), t.words.get(step[1]));
                node = if sep == NONE || word == NONE { NONE } else { t.child(node, sep, word) };
            }
            if node == NONE {
                Vec::new()
            } else if trail.is_empty() {
                t.outs(node).to_vec()
            } else {
                let same = |&&[a, b, _]: &&[u32; 3]| &t.trail_text[a as usize..b as usize] == trail;
                t.trails(node).iter().filter(same).map(|x| x[2]).collect()
            }
        };
        groups.into_iter().flat_map(|g| self.compiled.group(g).iter().copied()).collect()
    }

    /// Non-overlapping occurrences: leftmost first, longest at a position.
    pub fn find(&self, text: &str) -> Vec<PhraseMatch> {
        select_longest(self.find_all(text))
    }

    /// `find(&text[from..to])` (offsets from `from`), reading the words of `prepared = prepare(text)` instead
    /// of preparing the piece again: the same matches, as a match inside the piece sees the same words and
    /// separators either way — provided no word crosses the piece's ends (a sentence cut inside a word: then it
    /// prepares the piece) and the matcher has no wordless patterns (which it matches on the piece). Matches
    /// reaching out of the piece (a lead before it, a trail after it) are dropped before the selection.
    pub fn find_within(&self, text: &str, prepared: &Prepared, from: usize, to: usize) -> Vec<PhraseMatch> {
        let words = &prepared.words;
        let a = words.partition_point(|w| (w.1 as usize) <= from);
        let b = words.partition_point(|w| (w.0 as usize) < to).max(a);
        let cut = words.get(a).is_some_and(|w| (w.0 as usize) < from) || (b > a && words[b - 1].1 as usize > to);
        // A whitespace run across an end: the piece alone sees part of the run, which a lead or trail space matches
        // whole (the `matcher` fuzz target found " Q" in a piece starting inside a run of newlines).
        let space = |i: usize| text.as_bytes().get(i).is_some_and(u8::is_ascii_whitespace);
        let across = |i: usize| i > 0 && space(i - 1) && space(i);
        if cut || across(from) || across(to) || !self.compiled.trie.pure.is_empty() {
            return self.find(&text[from..to]);
        }
        let mut out = Vec::new();
        self.push_words(text, &prepared.folded, &words[a..b], &prepared.keys[a..b], 0, &mut out);
        out.retain(|m| m.start >= from && m.end <= to);
        out.sort_unstable_by_key(|m| (m.start, std::cmp::Reverse(m.end), m.phrase));
        let mut out = select_longest(out);
        for m in &mut out {
            m.start -= from;
            m.end -= from;
        }
        out
    }
}

/// `find_all` over several matchers at once, as if they were one over the concatenation of their phrase lists:
/// each `(matcher, offset)` adds `offset` to its phrase indexes. The text is prepared (folded, split) once.
pub fn find_all_of(matchers: &[(&PhraseMatcher, u32)], text: &str) -> Vec<PhraseMatch> {
    find_all_of_prepared(matchers, text, &prepare(text))
}

/// `find_all_of` over a text already prepared (`prepare(text)`), for callers that read its words too.
pub fn find_all_of_prepared(matchers: &[(&PhraseMatcher, u32)], text: &str, prepared: &Prepared) -> Vec<PhraseMatch> {
    let mut out = Vec::new();
    for (m, offset) in matchers {
        m.push_prepared(text, prepared, *offset, &mut out);
    }
    out.sort_unstable_by_key(|m| (m.start, std::cmp::Reverse(m.end), m.phrase));
    out
}

/// A text as the trie reads it.
pub struct Prepared {
    /// The text, ASCII case folded (same offsets), then 8 zero bytes (`Vocab::get_at` reads 8 at a time).
    pub folded: Vec<u8>,
    /// Its words: maximal runs of letters and digits, as byte spans (for an ASCII text: of ASCII letters and
    /// digits).
    pub words: Vec<(u32, u32)>,
    /// Whether the text is all ASCII.
    pub ascii: bool,
    /// The vocabulary key of each word (`compile::Vocab::keys`): hashed once, read by every matcher.
    pub keys: Vec<(u64, u64)>,
}

/// The text folded and split into words, once for every matcher that reads it.
pub fn prepare(text: &str) -> Prepared {
    let src = text.as_bytes();
    let mut words = Vec::with_capacity(src.len() / 5);
    let ascii = text.is_ascii();
    if ascii {
        ascii_words(src, &mut words);
    } else {
        unicode_words(text, &mut words);
    }
    let mut folded = Vec::with_capacity(src.len() + 8);
    folded.extend(src.iter().map(u8::to_ascii_lowercase));
    folded.extend_from_slice(&[0; 8]);
    let mut keys = Vec::new();
    compile::Vocab::keys(&folded, &words, &mut keys);
    Prepared { folded, words, ascii, keys }
}

/// One bit per byte of 8 ASCII bytes (little-endian `x`, every byte below 0x80): bit `i` set when byte `i` is a
/// letter or a digit. Each range test adds a constant that carries into a byte's top bit exactly from the range's
/// bound up; bytes below 0x80 never carry into their neighbour.
#[inline]
pub(crate) fn ascii_alnum_bits(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOP: u64 = 0x8080_8080_8080_8080;
    let at_least = |v: u64, lo: u8| v + ONES * u64::from(0x80 - lo);
    let lower = x | (ONES * 0x20);
    let letter = at_least(lower, b'a') & !at_least(lower, b'z' + 1);
    let digit = at_least(x, b'0') & !at_least(x, b'9' + 1);
    // The top bits, byte i's at bit 8i + 7, gathered into bits 56 + i by one multiply.
    (((letter | digit) & TOP) >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// Like `ascii_alnum_bits`, for the ASCII characters `char::is_whitespace` takes (9–13 and space).
#[inline]
pub(crate) fn ascii_space_bits(x: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const TOP: u64 = 0x8080_8080_8080_8080;
    let at_least = |v: u64, lo: u8| v + ONES * u64::from(0x80 - lo);
    let control = at_least(x, b'\t') & !at_least(x, b'\r' + 1);
    let space = at_least(x, b' ') & !at_least(x, b' ' + 1);
    (((control | space) & TOP) >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// The words of an ASCII text, 64 bytes at a time: a mask of its letters and digits (8 bytes per step,
/// `ascii_alnum_bits`), whose rising and falling edges are the words' starts and ends (no branch per byte).
fn ascii_words(src: &[u8], words: &mut Vec<(u32, u32)>) {
    let (mut carry, mut open, mut in_word) = (0u64, 0u32, false);
    for (n, chunk) in src.chunks(64).enumerate() {
        let mut padded = [0u8; 64];
        let chunk: &[u8; 64] = match chunk.try_into() {
            Ok(full) => full,
            Err(_) => {
                padded[..chunk.len()].copy_from_slice(chunk);
                &padded
            }
        };
        let mut mask = 0u64;
        for (k, eight) in chunk.chunks_exact(8).enumerate() {
            let x = u64::from_le_bytes(eight.try_into().expect("8 bytes"));
            mask |= ascii_alnum_bits(x) << (8 * k);
        }
        let before = (mask << 1) | carry;
        let (mut starts, mut ends) = (mask & !before, !mask & before);
        let base = (n * 64) as u32;
        loop {
            let edges = if in_word { &mut ends } else { &mut starts };
            if *edges == 0 {
                break;
            }
            let at = base + edges.trailing_zeros();
            *edges &= *edges - 1;
            if in_word {
                words.push((open, at));
            } else {
                open = at;
            }
            in_word = !in_word;
        }
        carry = mask >> 63;
    }
    if in_word {
        words.push((open, src.len() as u32));
    }
}

/// The words of any text, char by char.
fn unicode_words(text: &str, words: &mut Vec<(u32, u32)>) {
    let src = text.as_bytes();
    let mut start = None;
    let mut i = 0;
    while i < src.len() {
        let b = src[i];
        let (w, len) = if b.is_ascii() {
            (b.is_ascii_alphanumeric(), 1)
        } else {
            let c = text[i..].chars().next().expect("a char starts here");
            (is_word_char(c), c.len_utf8())
        };
        match (w, start) {
            (true, None) => start = Some(i as u32),
            (false, Some(s)) => {
                words.push((s, i as u32));
                start = None;
            }
            _ => {}
        }
        i += len;
    }
    if let Some(s) = start {
        words.push((s, src.len() as u32));
    }
}

/// The id of a text's separator, whitespace runs collapsed to one space.
#[inline]
fn sep_id(t: &compile::Trie, sep: &[u8]) -> u32 {
    if let [b] = sep {
        return t.sep_byte[*b as usize];
    }
    let mut buf = [0u8; 32];
    if sep.len() <= buf.len() {
        let n = collapse_into(sep, |i, b| buf[i] = b);
        t.sep_id(&buf[..n])
    } else {
        let mut long = Vec::with_capacity(sep.len());
        collapse_into(sep, |_, b| long.push(b));
        t.sep_id(&long)
    }
}

/// Writes `sep` with each whitespace run as one space through `put(index, byte)`; returns the length written.
#[inline]
fn collapse_into(sep: &[u8], mut put: impl FnMut(usize, u8)) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < sep.len() {
        if sep[i].is_ascii_whitespace() {
            put(n, b' ');
            while i < sep.len() && sep[i].is_ascii_whitespace() {
                i += 1;
            }
        } else {
            put(n, sep[i]);
            i += 1;
        }
        n += 1;
    }
    n
}

/// Where a prefix of `run` (whitespace collapsed) spelling `trail` ends in `run`: after the last matched byte, a
/// whitespace run counting as its first byte.
fn collapsed_prefix_end(run: &[u8], trail: &[u8]) -> Option<usize> {
    let (mut i, mut end) = (0, 0);
    for &c in trail {
        let &b = run.get(i)?;
        if b.is_ascii_whitespace() {
            if c != b' ' {
                return None;
            }
            end = i + 1;
            while i < run.len() && run[i].is_ascii_whitespace() {
                i += 1;
            }
        } else {
            if c != b {
                return None;
            }
            i += 1;
            end = i;
        }
    }
    Some(end)
}

/// Where a suffix of `run` (whitespace collapsed) spelling `lead` starts in `run`.
fn collapsed_suffix_start(run: &[u8], lead: &[u8]) -> Option<usize> {
    let mut i = run.len();
    for &c in lead.iter().rev() {
        if i == 0 {
            return None;
        }
        if run[i - 1].is_ascii_whitespace() {
            if c != b' ' {
                return None;
            }
            while i > 0 && run[i - 1].is_ascii_whitespace() {
                i -= 1;
            }
        } else {
            if c != run[i - 1] {
                return None;
            }
            i -= 1;
        }
    }
    Some(i)
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
pub fn select_longest(mut sorted: Vec<PhraseMatch>) -> Vec<PhraseMatch> {
    let mut covered = 0;
    // In place: `retain` visits the matches in order.
    sorted.retain(|m| {
        let keep = m.start >= covered;
        if keep {
            covered = m.end;
        }
        keep
    });
    sorted
}

/// The statement of the rules, one phrase at a time over the whitespace-collapsed text, char by char: every
/// occurrence of the folded phrase whose ends respect the boundary rule and, for a case-sensitive phrase, with the
/// phrase's exact case; offsets in the original text, ordered as `find_all` orders its matches. Quadratic: the
/// oracle the unit tests and the `matcher` fuzz target hold `find_all` to, not for use.
#[doc(hidden)]
pub fn reference(phrases: &[(&str, bool)], text: &str) -> Vec<PhraseMatch> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-byte letter-and-digit test agrees with the byte one on every ASCII byte in every position.
    #[test]
    fn eight_bytes_at_a_time_classify_every_ascii_byte() {
        for b in 0u8..0x80 {
            for i in 0..8 {
                for fill in [0u8, b'a', b'Z', b'5', b' ', 0x7f] {
                    let mut bytes = [fill; 8];
                    bytes[i] = b;
                    let want =
                        bytes.iter().enumerate().fold(0u64, |m, (k, c)| m | u64::from(c.is_ascii_alphanumeric()) << k);
                    assert_eq!(ascii_alnum_bits(u64::from_le_bytes(bytes)), want, "{b:#x} at {i} among {fill:#x}");
                    let spaces = bytes
                        .iter()
                        .enumerate()
                        .fold(0u64, |m, (k, &c)| m | u64::from(char::from(c).is_whitespace()) << k);
                    assert_eq!(ascii_space_bits(u64::from_le_bytes(bytes)), spaces, "{b:#x} at {i} among {fill:#x}");
                }
            }
        }
    }

    /// The batched lookup (each slot prefetched some spans ahead of its probe) gives what one lookup at a
    /// time gives, for words held and not held, short and long (over 8 bytes: compared past the slot), across
    /// block edges.
    #[test]
    fn batched_vocabulary_lookups_are_the_single_ones() {
        // A table that stays in cache (probed as it is) and one that does not (its slots prefetched ahead).
        for size in [500u32, 5_000] {
            batched_lookups_of_a_vocabulary(size);
        }
    }

    fn batched_lookups_of_a_vocabulary(size: u32) {
        let held: Vec<Vec<u8>> = (0..size)
            .map(|i| format!("{}w{i}", "x".repeat((i % 23) as usize)).into_bytes())
            .chain([b"a".to_vec(), b"pain".to_vec(), b"hypercholesterolemia".to_vec()])
            .collect();
        let values: Vec<u32> = (0..held.len() as u32).map(|i| i * 7 + 1).collect();
        let vocab = compile::Vocab::build(&held, &values);
        let mut text = Vec::new();
        let mut spans = Vec::new();
        for i in 0..1_000u32 {
            let word = match i % 4 {
                0 | 1 => held[(i as usize * 31) % held.len()].clone(),
                2 => format!("{}w{}", "x".repeat((i % 23) as usize), i + 1_000).into_bytes(), // same shape, not held
                _ => held[(i as usize * 17) % held.len()][1..].to_vec(),                      // a held word's tail
            };
            if word.is_empty() {
                continue;
            }
            spans.push((text.len() as u32, (text.len() + word.len()) as u32));
            text.extend_from_slice(&word);
            text.push(b' ');
        }
        text.extend_from_slice(&[0; 8]);
        let mut batched = Vec::new();
        vocab.get_all_at(&text, &spans, &mut batched);
        let single: Vec<(u32, u32)> = spans.iter().map(|&(a, b)| vocab.get_at(&text, a as usize, b as usize)).collect();
        assert_eq!(batched, single);
        // The keys of a text, hashed once, serve any vocabulary: the small one looks up the same words alike.
        let mut keys = Vec::new();
        compile::Vocab::keys(&text, &spans, &mut keys);
        let mut keyed = Vec::new();
        vocab.get_all_keyed(&text, &spans, &keys, &mut keyed);
        assert_eq!(keyed, single);
        let small = compile::Vocab::build(&held[..8], &values[..8]);
        let (mut from_keys, mut own) = (Vec::new(), Vec::new());
        small.get_all_keyed(&text, &spans, &keys, &mut from_keys);
        small.get_all_at(&text, &spans, &mut own);
        assert_eq!(from_keys, own);
        assert!(own.iter().any(|&(id, _)| id != NONE) && own.iter().any(|&(id, _)| id == NONE));
        let found = single.iter().filter(|&&(id, _)| id != NONE).count();
        assert!(found >= 500 && found < single.len(), "{found} of {} held", single.len());
        for (&(a, b), &(id, value)) in spans.iter().zip(&single) {
            if id != NONE {
                assert_eq!(vocab.string(id as usize), &text[a as usize..b as usize]);
                assert_eq!(value, values[id as usize]);
            }
        }
    }

    /// `find_within` on any piece of a text is `find` on that piece alone: leads before it and trails after it
    /// do not leak in, pieces cut inside a word (and matchers with wordless phrases) take the piece's own split,
    /// ASCII pieces of non-ASCII texts split alike.
    #[test]
    fn finding_within_a_prepared_text_is_finding_in_the_piece() {
        let with_words: Vec<(&str, bool)> = vec![
            ("pain", false),
            ("chest pain", false),
            ("MS", true),
            ("(+)-x", false),
            ("b.p.", false),
            ("x )", false),
            ("-1", false),
            ("é", false),
            ("no", false),
            ("no chest", false),
            (" q", true),
            ("q ", false),
        ];
        let wordless: Vec<(&str, bool)> = with_words.iter().copied().chain([("+)", false)]).collect();
        let texts = [
            "no chest pain (+)-x y(+)-xz B.P. b.p.q -1. MS ms x ) x  )",
            "café pain; no  chest\n pain é-1 (+)-x é",
            "chestpain no-pain (+)-x)(+)-x ",
            "x\n\n\n\nq;q  \t q \n\nx",
        ];
        let mut compared = 0;
        for phrases in [&with_words, &wordless] {
            let m = PhraseMatcher::new(phrases.iter().copied()).unwrap();
            for text in texts {
                let p = prepare(text);
                let bounds: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
                for (k, &from) in bounds.iter().enumerate() {
                    for &to in &bounds[k..] {
                        assert_eq!(m.find_within(text, &p, from, to), m.find(&text[from..to]), "{:?}", &text[from..to]);
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 5_000, "{compared}");
    }

    #[test]
    fn the_word_trie_finds_what_the_rules_say() {
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
            // Wordless phrases match inside a separator; a tab in a phrase never matches (the text's whitespace
            // runs are one space).
            ("+)", false),
            ("- ", false),
            (" (", false),
            ("a\tb", false),
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
            // Up to 150 characters: the ASCII word split works 64 bytes at a time.
            for _ in 0..(state % 150) {
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
        // Leads, trails, wordless phrases; no whitespace collapse in `exact`.
        assert_eq!(m.exact("(+)-X"), vec![5]);
        assert_eq!(m.exact("x "), vec![12]);
        assert_eq!(m.exact("ms"), vec![3]);
        assert_eq!(m.exact("+)"), vec![15]);
        assert_eq!(m.exact("a\tb"), vec![18]);
        assert!(m.exact("a b").is_empty() && m.exact("(+)-").is_empty() && m.exact("x").is_empty());
    }

    /// The 64-byte ASCII word split finds the words the char-by-char one finds, words across chunk edges included.
    #[test]
    fn the_ascii_word_split_agrees_with_the_char_by_char_one() {
        let alphabet = b"aZ9 .-\n\t(_";
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..400 {
            let text: String = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    alphabet[(state % alphabet.len() as u64) as usize] as char
                })
                .collect();
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            ascii_words(text.as_bytes(), &mut fast);
            unicode_words(&text, &mut slow);
            assert_eq!(fast, slow, "{text:?}");
        }
        // Words ending and starting exactly at a chunk edge.
        for cut in [63, 64, 65, 127, 128] {
            let text = format!("{}{}", "a".repeat(cut), " b".repeat(40));
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            ascii_words(text.as_bytes(), &mut fast);
            unicode_words(&text, &mut slow);
            assert_eq!(fast, slow, "{cut}");
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
