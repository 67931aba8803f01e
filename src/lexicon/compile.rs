//! The phrase automaton in its compiled form, shared by the build script (which compiles the built-in lexicon's
//! 92k terms once, at build time) and the matcher (which loads that form at start, or compiles a small phrase
//! list — ConText cues, CLEAR variable synonyms — on the spot).
//!
//! Matching folds ASCII case, so the automaton holds each phrase lower-cased, once: phrases that fold to the same
//! text (`MS` and `ms`) share one automaton pattern, whose *group* lists their indexes in ascending order.
//!
//! Word boundaries are part of the patterns: each pattern carries a `BOUNDARY` byte (0xFF, which no UTF-8 text
//! holds) wherever a word character (letter or digit) meets a non-word one, before a leading word character and
//! after a trailing one (`marked`); the matcher searches the text marked by the same rule. So the automaton reports
//! only matches whose ends respect word boundaries (`pain` never inside `painful`, `ar` never inside `heart`), and
//! inside a word that starts no pattern it stays at its root instead of walking the states of the word's
//! suffixes (`docs/benchmarks.md`, 2026-11-24, fifth). The
//! compiled form is `MAGIC`, the phrase count, a fingerprint of the folded phrases (a matcher refuses a form built
//! from other phrases), the groups, then daachorse's own serialisation of the automaton. Integers are
//! little-endian. This file uses nothing but `std` and `daachorse` (the build script includes it by path).

use daachorse::{DoubleArrayAhoCorasick, DoubleArrayAhoCorasickBuilder, MatchKind};

pub const MAGIC: &[u8; 8] = b"CLSPM02\n";

/// Marks a word boundary in patterns and in the searched text; never a byte of UTF-8.
pub const BOUNDARY: u8 = 0xFF;

/// Letters and digits: a match must not cut through a run of them.
pub fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
}

/// A phrase as the automaton holds it: ASCII case folded, `BOUNDARY` wherever a word character meets a non-word
/// character, before a leading word character and after a trailing one.
pub fn marked(phrase: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(phrase.len() + 4);
    let mut word = false;
    let mut buf = [0u8; 4];
    for c in phrase.chars() {
        let w = is_word_char(c);
        if w != word {
            out.push(BOUNDARY);
            word = w;
        }
        out.extend_from_slice(c.to_ascii_lowercase().encode_utf8(&mut buf).as_bytes());
    }
    if word {
        out.push(BOUNDARY);
    }
    out
}

/// The automaton over the marked phrases (values: group index) and the phrase groups.
pub struct Compiled {
    pub automaton: DoubleArrayAhoCorasick<u32>,
    /// Group `g` holds `group_phrases[group_start[g]..group_start[g + 1]]`.
    pub group_start: Vec<u32>,
    pub group_phrases: Vec<u32>,
    pub phrases: u32,
    pub fingerprint: u64,
}

/// The terms of a lexicon `terms.tsv` (first column of each line that is neither empty nor a `#` comment), in
/// order: the phrase list of the built-in matcher.
pub fn tsv_terms(tsv: &str) -> impl Iterator<Item = &str> {
    tsv.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').next().unwrap_or(""))
}

/// FNV-1a over the folded phrases, each followed by a 0 byte.
pub fn fingerprint<'a>(phrases: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in phrases {
        for b in p.bytes().map(|b| b.to_ascii_lowercase()).chain([0]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Compiles the phrases (empty phrases never match and get no pattern).
pub fn compile(phrases: &[&str]) -> Result<Compiled, String> {
    let mut group_of: std::collections::HashMap<Vec<u8>, u32> = std::collections::HashMap::new();
    let mut members: Vec<Vec<u32>> = Vec::new();
    let mut patterns: Vec<(Vec<u8>, u32)> = Vec::new();
    let mut count = 0u32;
    for (i, p) in phrases.iter().enumerate() {
        count += 1;
        if p.is_empty() {
            continue;
        }
        let folded = marked(p);
        let g = *group_of.entry(folded.clone()).or_insert_with(|| {
            members.push(Vec::new());
            patterns.push((folded, (members.len() - 1) as u32));
            (members.len() - 1) as u32
        });
        members[g as usize].push(i as u32);
    }
    let automaton = DoubleArrayAhoCorasickBuilder::new()
        .match_kind(MatchKind::Standard)
        .build_with_values(patterns)
        .map_err(|e| format!("phrase automaton: {e}"))?;
    let mut group_start = Vec::with_capacity(members.len() + 1);
    let mut group_phrases = Vec::with_capacity(count as usize);
    for m in &members {
        group_start.push(group_phrases.len() as u32);
        group_phrases.extend_from_slice(m);
    }
    group_start.push(group_phrases.len() as u32);
    Ok(Compiled {
        automaton,
        group_start,
        group_phrases,
        phrases: count,
        fingerprint: fingerprint(phrases.iter().copied()),
    })
}

impl Compiled {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.phrases.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        for list in [&self.group_start, &self.group_phrases] {
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for v in list.iter() {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.extend_from_slice(&self.automaton.serialize());
        out
    }

    /// Reads a compiled form, checking its structure (group bounds, automaton layout); whether it was built from
    /// the caller's phrases is the caller's check (`phrases`, `fingerprint`).
    pub fn from_bytes(bytes: &[u8]) -> Result<Compiled, String> {
        let bad = |what: &str| format!("compiled phrase automaton: {what}");
        let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(|| bad("wrong header"))?;
        let (phrases, rest) = take_u32(rest).ok_or_else(|| bad("truncated"))?;
        let (fp, rest) = rest.split_at_checked(8).ok_or_else(|| bad("truncated"))?;
        let fingerprint = u64::from_le_bytes(fp.try_into().expect("8 bytes"));
        let (group_start, rest) = take_list(rest).ok_or_else(|| bad("truncated groups"))?;
        let (group_phrases, rest) = take_list(rest).ok_or_else(|| bad("truncated groups"))?;
        let (automaton, rest) =
            DoubleArrayAhoCorasick::<u32>::deserialize(rest).map_err(|e| bad(&format!("automaton: {e}")))?;
        let groups_whole = group_start.first() == Some(&0)
            && group_start.windows(2).all(|w| w[0] <= w[1])
            && group_start.last().map(|&l| l as usize) == Some(group_phrases.len())
            && group_phrases.iter().all(|&p| p < phrases);
        if !rest.is_empty() || !groups_whole {
            return Err(bad("inconsistent groups"));
        }
        Ok(Compiled { automaton, group_start, group_phrases, phrases, fingerprint })
    }

    /// The phrase indexes of an automaton match (by the match's value).
    pub fn group(&self, g: u32) -> &[u32] {
        let g = g as usize;
        match (self.group_start.get(g), self.group_start.get(g + 1)) {
            (Some(&a), Some(&b)) => &self.group_phrases[a as usize..b as usize],
            _ => &[],
        }
    }
}

fn take_u32(b: &[u8]) -> Option<(u32, &[u8])> {
    let (v, rest) = b.split_at_checked(4)?;
    Some((u32::from_le_bytes(v.try_into().ok()?), rest))
}

fn take_list(b: &[u8]) -> Option<(Vec<u32>, &[u8])> {
    let (n, rest) = take_u32(b)?;
    let (body, rest) = rest.split_at_checked(n as usize * 4)?;
    Some((body.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect(), rest))
}
