//! The phrase matcher's compiled form, shared by the build script (which compiles the built-in lexicon's 92k terms
//! once, at build time) and the matcher (which loads that form at start, or compiles a small phrase list — ConText
//! cues, CLEAR variable synonyms — on the spot).
//!
//! Matching folds ASCII case, so each phrase is held lower-cased, once: phrases that fold to the same text (`MS`
//! and `ms`) share one *pattern*, whose *group* lists their indexes in ascending order.
//!
//! A pattern is read as the matcher reads a text: maximal runs of word characters (letters and digits: *words*)
//! and the runs of other characters between them (*separators*). A match never cuts through a word, so a pattern
//! is a word sequence — optionally after a *lead* separator (`(` in `(+)-x`) and before a *trail* one (`)` in
//! `... (disorder)`) — and a text matches it where its words are those words, its separators between them are
//! those separators (a run of whitespace in the text standing for one space), the separator before the first word
//! ends with the lead, and the one after the last word begins with the trail. Patterns without a word (none in
//! the built-in lexicon) match inside a separator.
//!
//! So the search walks words, not bytes (`Trie`): each distinct pattern word and separator has an id
//! (`Vocab`, open addressing over the folded bytes), the patterns form a trie over (separator, word) steps whose
//! edges are one hash table keyed by (node, separator, word); a word's slot in the vocabulary also holds the node
//! of the patterns it starts, and each node a 32-bit filter of its edges. A text's words are looked up once each
//! (each slot prefetched some words before it is probed, so the misses overlap), then a walk starts at
//! every word and stops at the first step no pattern takes: a few table reads per word,
//! where the byte-wise Aho-Corasick automaton it replaced made one dependent read per byte into 11.7 MB
//! (CHANGELOG.md, 2026-11-24).
//!
//! The compiled form is `MAGIC`, the phrase count, a fingerprint of the folded phrases (a matcher refuses a form
//! built from other phrases), the groups, then the trie's arrays, each a length and its little-endian items.
//! This file uses nothing but `std` (the build script includes it by path).

use std::collections::HashMap;

pub const MAGIC: &[u8; 8] = b"CLSPM04\n";

/// Marks a word boundary in `marked` patterns; never a byte of UTF-8.
pub const BOUNDARY: u8 = 0xFF;

/// No id: a word or separator no pattern has, a node without that child.
pub const NONE: u32 = u32::MAX;

/// Separator ids are below this (they share an edge key with the word id and the node).
const MAX_SEPS: u32 = 1 << 11;
/// The separator of a lead root's first step (there is none: the lead is checked on its own).
pub const LEAD_STEP: u32 = MAX_SEPS - 1;
/// Word ids are below this.
const MAX_WORDS: u32 = 1 << 21;

/// Letters and digits: a match must not cut through a run of them.
pub fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
}

/// A phrase ASCII case folded, with `BOUNDARY` wherever a word character meets a non-word character, before a
/// leading word character and after a trailing one: split at `BOUNDARY`, its pieces alternate separator, word,
/// separator, ... (the first and last separators possibly empty), or it is one separator when it has no word.
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

/// `bytes` as a little-endian u64, zero-padded (at most 8 bytes).
#[inline]
fn word_of(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(buf)
}

/// FxHash-style hash of a byte string given as its first 8 bytes (zero-padded, `head`) and the rest (the same at
/// build time and at run time).
#[inline]
fn hash_parts(head: u64, rest: &[u8], len: usize) -> u64 {
    const K: u64 = 0xf135_7aea_2e62_a9c5;
    let mut h = ((len as u64).rotate_left(26) ^ head).wrapping_mul(K);
    for c in rest.chunks(8) {
        h = (h.rotate_left(26) ^ word_of(c)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

/// Distinct byte strings with dense ids and a value each, looked up by open addressing. A slot holds the
/// string's first 8 bytes, its length and its value, so most lookups (words of up to 8 bytes) read one slot and
/// nothing else — for the trie's words the value is the root's child, the node of the patterns they start.
#[derive(Debug, Default, Clone)]
pub struct Vocab {
    /// `[first 8 bytes zero-padded, min(len, 255) << 56 | (id + 1) << 32 | value]`; an empty slot is `[0, 0]`.
    /// Length a power of two, at most half full.
    slots: Vec<[u64; 2]>,
    /// String `id` is `text[ends[id - 1]..ends[id]]` (from 0 for id 0).
    ends: Vec<u32>,
    text: Vec<u8>,
}

/// Ids are below this (24 bits of a slot).
const MAX_VOCAB: usize = 1 << 24;

impl Vocab {
    /// `values[i]` goes with `strings[i]` (distinct strings; string `i` gets id `i`).
    pub fn build(strings: &[Vec<u8>], values: &[u32]) -> Vocab {
        let size = (strings.len() * 2).next_power_of_two().max(16);
        let mut v = Vocab { slots: vec![[0, 0]; size], ends: Vec::with_capacity(strings.len()), text: Vec::new() };
        for (id, (s, &value)) in strings.iter().zip(values).enumerate() {
            v.text.extend_from_slice(s);
            v.ends.push(v.text.len() as u32);
            let head = word_of(&s[..s.len().min(8)]);
            let mut i = hash_parts(head, &s[s.len().min(8)..], s.len()) as usize & (size - 1);
            while v.slots[i][1] != 0 {
                i = (i + 1) & (size - 1);
            }
            v.slots[i] = [head, (s.len().min(255) as u64) << 56 | (id as u64 + 1) << 32 | u64::from(value)];
        }
        v
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// String `id`.
    pub fn string(&self, id: usize) -> &[u8] {
        let start = if id == 0 { 0 } else { self.ends[id - 1] as usize };
        &self.text[start..self.ends[id] as usize]
    }

    /// Every string's value, in no particular order.
    fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().filter(|s| s[1] != 0).map(|s| s[1] as u32)
    }

    /// The id of `s`, or `NONE`.
    pub fn get(&self, s: &[u8]) -> u32 {
        self.get_with_value(s).0
    }

    /// The id and value of `s`, or `(NONE, NONE)`.
    pub fn get_with_value(&self, s: &[u8]) -> (u32, u32) {
        let mut padded = Vec::with_capacity(s.len() + 8);
        padded.extend_from_slice(s);
        padded.extend_from_slice(&[0; 8]);
        self.get_at(&padded, 0, s.len())
    }

    /// The id and value of `buf[a..b]` (not empty), or `(NONE, NONE)`; `buf` holds at least 8 bytes from `a`
    /// (pad it).
    #[inline]
    pub fn get_at(&self, buf: &[u8], a: usize, b: usize) -> (u32, u32) {
        if self.is_empty() || a >= b {
            return (NONE, NONE);
        }
        let (head, h) = Self::key_at(buf, a, b);
        self.probe(buf, a, b, head, h)
    }

    /// `get_at` of `buf[a..b]` given its key (`Vocab::keys`), which every vocabulary shares.
    #[inline]
    pub fn get_keyed(&self, buf: &[u8], a: usize, b: usize, (head, h): (u64, u64)) -> (u32, u32) {
        if self.is_empty() || a >= b {
            return (NONE, NONE);
        }
        self.probe(buf, a, b, head, h)
    }

    /// `get_at` of every span of `spans` (none empty), in order, into `out`.
    pub fn get_all_at(&self, buf: &[u8], spans: &[(u32, u32)], out: &mut Vec<(u32, u32)>) {
        let mut keys = Vec::new();
        Self::keys(buf, spans, &mut keys);
        self.get_all_keyed(buf, spans, &keys, out);
    }

    /// The key (padded head, hash) of every span of `spans` (none empty) of `buf` (padded: 8 bytes past each
    /// span's start), into `out`. Every vocabulary hashes alike, so one text's keys serve every vocabulary that
    /// looks its words up (`get_all_keyed`).
    pub fn keys(buf: &[u8], spans: &[(u32, u32)], out: &mut Vec<(u64, u64)>) {
        out.reserve(spans.len());
        out.extend(spans.iter().map(|&(a, b)| Self::key_at(buf, a as usize, b as usize)));
    }

    /// `get_at` of every span of `spans`, in order, into `out`, given their keys (`Vocab::keys` of the same
    /// spans). In a large table the slot of the span `AHEAD` places on is prefetched before a span is probed, so
    /// the table's cache misses overlap instead of each stalling the probe that needs it.
    pub fn get_all_keyed(&self, buf: &[u8], spans: &[(u32, u32)], keys: &[(u64, u64)], out: &mut Vec<(u32, u32)>) {
        const AHEAD: usize = 16;
        debug_assert_eq!(spans.len(), keys.len());
        out.reserve(spans.len());
        if self.is_empty() {
            out.extend(spans.iter().map(|_| (NONE, NONE)));
            return;
        }
        let mask = self.slots.len() - 1;
        // A table of up to 64 KB stays in cache: no prefetching.
        if self.slots.len() <= 4096 {
            for (&(a, b), &(head, h)) in spans.iter().zip(keys) {
                out.push(self.probe(buf, a as usize, b as usize, head, h));
            }
            return;
        }
        for &(_, h) in keys.iter().take(AHEAD) {
            prefetch(&self.slots[h as usize & mask]);
        }
        for (j, (&(a, b), &(head, h))) in spans.iter().zip(keys).enumerate() {
            if let Some(&(_, ahead)) = keys.get(j + AHEAD) {
                prefetch(&self.slots[ahead as usize & mask]);
            }
            out.push(self.probe(buf, a as usize, b as usize, head, h));
        }
    }

    /// The padded head and the hash of `buf[a..b]` (not empty).
    #[inline]
    fn key_at(buf: &[u8], a: usize, b: usize) -> (u64, u64) {
        let len = b - a;
        let head8 = u64::from_le_bytes(buf[a..a + 8].try_into().expect("padded"));
        let head = if len >= 8 { head8 } else { head8 & ((1u64 << (8 * len)) - 1) };
        (head, hash_parts(head, &buf[(a + 8).min(b)..b], len))
    }

    #[inline(always)]
    fn probe(&self, buf: &[u8], a: usize, b: usize, head: u64, h: u64) -> (u32, u32) {
        let len = b - a;
        let mask = self.slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let [slot_head, meta] = self.slots[i];
            if meta == 0 {
                return (NONE, NONE);
            }
            if slot_head == head && (meta >> 56) as usize == len.min(255) {
                let id = ((meta >> 32) as u32 & 0x00ff_ffff) - 1;
                if len <= 8 || self.string(id as usize) == &buf[a..b] {
                    return (id, meta as u32);
                }
            }
            i = (i + 1) & mask;
        }
    }

    fn check(&self) -> bool {
        let ids_ok = self
            .slots
            .iter()
            .all(|&[_, meta]| meta == 0 || (1..=self.ends.len()).contains(&(((meta >> 32) & 0x00ff_ffff) as usize)));
        self.slots.len().is_power_of_two()
            && self.ends.len() < MAX_VOCAB
            && self.ends.windows(2).all(|w| w[0] <= w[1])
            && self.ends.last().is_none_or(|&e| e as usize == self.text.len())
            && ids_ok
            && self.slots.iter().any(|s| s[1] == 0)
    }
}

/// Asks the processor to load `slot`'s cache line (a hint: no effect on results; nothing on other targets).
#[inline(always)]
fn prefetch<T>(slot: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache (it never faults, even on a bad address), and SSE is part of
    // the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((slot as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// The bit of a (separator, word) step in a node's child filter.
#[inline]
fn filter_bit(sep: u32, word: u32) -> u32 {
    1 << ((u64::from(sep) << 21 | u64::from(word)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59)
}

/// The patterns as a trie over words (see the module comment).
#[derive(Debug, Default, Clone)]
pub struct Trie {
    pub words: Vocab,
    /// Separators between two words of a pattern, folded; the text's are whitespace-collapsed before lookup.
    pub seps: Vocab,
    /// Per separator byte: the id of that one-byte separator (`NONE`); ASCII whitespace maps to `" "`'s.
    pub sep_byte: Vec<u32>,
    /// Per node `n` (plus one sentinel): `[outs, trails, filter]`; node `n`'s groups are
    /// `outs[nodes[n][0]..nodes[n + 1][0]]`, its trails `trails[nodes[n][1]..nodes[n + 1][1]]`, and `filter` has
    /// the `filter_bit` of each of its edges (0: no edge leaves it), so most steps no pattern takes end without a
    /// read of the edge table. Numbered breadth first: the shallow nodes every search reads lie together.
    pub nodes: Vec<[u32; 3]>,
    /// Groups of the patterns ending at a node with no trail.
    pub outs: Vec<u32>,
    /// `(start, end, group)`: a pattern ending at the node with trail `trail_text[start..end]`.
    pub trails: Vec<[u32; 3]>,
    pub trail_text: Vec<u8>,
    /// Edge table: `[key, child]`, key `node << 32 | sep << 21 | word` (never 0: node 0 has no edges here),
    /// length a power of two, at most half full; 0 is an empty slot.
    pub edges: Vec<[u64; 2]>,
    /// `(start, end, node)`: the lead `lead_text[start..end]` and its root node.
    pub leads: Vec<[u32; 3]>,
    pub lead_text: Vec<u8>,
    /// `(start, end, group)`: wordless patterns `pure_text[start..end]`.
    pub pure: Vec<[u32; 3]>,
    pub pure_text: Vec<u8>,
}

#[inline]
fn edge_key(node: u32, sep: u32, word: u32) -> u64 {
    (u64::from(node) << 32) | (u64::from(sep) << 21) | u64::from(word)
}

#[inline]
fn edge_slot(key: u64, mask: usize) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask
}

impl Trie {
    /// The child of `node` by separator `sep` then word `word`, or `NONE`.
    #[inline]
    pub fn child(&self, node: u32, sep: u32, word: u32) -> u32 {
        let key = edge_key(node, sep, word);
        let mask = self.edges.len() - 1;
        let mut i = edge_slot(key, mask);
        loop {
            let [k, v] = self.edges[i];
            if k == key {
                return v as u32;
            }
            if k == 0 {
                return NONE;
            }
            i = (i + 1) & mask;
        }
    }

    pub fn outs(&self, node: u32) -> &[u32] {
        let n = node as usize;
        &self.outs[self.nodes[n][0] as usize..self.nodes[n + 1][0] as usize]
    }

    pub fn trails(&self, node: u32) -> &[[u32; 3]] {
        let n = node as usize;
        &self.trails[self.nodes[n][1] as usize..self.nodes[n + 1][1] as usize]
    }

    /// Whether `node` may have a child by `sep` then `word` (false: it has none).
    #[inline]
    pub fn may_have_child(&self, node: u32, sep: u32, word: u32) -> bool {
        self.nodes[node as usize][2] & filter_bit(sep, word) != 0
    }

    /// Whether any edge leaves `node`.
    #[inline]
    pub fn has_children(&self, node: u32) -> bool {
        self.nodes[node as usize][2] != 0
    }

    /// The separator id of a text's separator already whitespace-collapsed.
    #[inline]
    pub fn sep_id(&self, collapsed: &[u8]) -> u32 {
        match collapsed {
            [b] => self.sep_byte[*b as usize],
            _ => self.seps.get(collapsed),
        }
    }

    /// Builds the trie of the marked, distinct patterns (`(marked, group)`).
    fn build(patterns: &[(Vec<u8>, u32)]) -> Result<Trie, CompileError> {
        struct Pattern<'a> {
            lead: &'a [u8],
            words: Vec<&'a [u8]>,
            seps: Vec<&'a [u8]>,
            trail: &'a [u8],
            group: u32,
        }
        let mut parsed = Vec::new();
        let mut pure: Vec<(&[u8], u32)> = Vec::new();
        for (m, group) in patterns {
            let pieces: Vec<&[u8]> = m.split(|&b| b == BOUNDARY).collect();
            if pieces.len() == 1 {
                pure.push((pieces[0], *group));
                continue;
            }
            // [lead, w1, s1, w2, ..., wk, trail]
            let inner = &pieces[1..pieces.len() - 1];
            parsed.push(Pattern {
                lead: pieces[0],
                words: inner.iter().step_by(2).copied().collect(),
                seps: inner.iter().skip(1).step_by(2).copied().collect(),
                trail: pieces[pieces.len() - 1],
                group: *group,
            });
        }
        let mut word_ids: HashMap<&[u8], u32> = HashMap::new();
        let mut words: Vec<Vec<u8>> = Vec::new();
        let mut sep_ids: HashMap<&[u8], u32> = HashMap::new();
        let mut seps: Vec<Vec<u8>> = Vec::new();
        for p in &parsed {
            for w in &p.words {
                word_ids.entry(w).or_insert_with(|| {
                    words.push(w.to_vec());
                    words.len() as u32 - 1
                });
            }
            for s in &p.seps {
                sep_ids.entry(s).or_insert_with(|| {
                    seps.push(s.to_vec());
                    seps.len() as u32 - 1
                });
            }
        }
        if words.len() as u32 >= MAX_WORDS || seps.len() as u32 >= LEAD_STEP {
            return Err(CompileError::TooManyKeys { words: words.len(), seps: seps.len() });
        }
        // Nodes, numbered here in order of creation (0 the root, then the lead roots), renumbered below.
        let mut lead_of: HashMap<&[u8], u32> = HashMap::new();
        let mut next = 1u32;
        for p in &parsed {
            if !p.lead.is_empty() {
                lead_of.entry(p.lead).or_insert_with(|| {
                    next += 1;
                    next - 1
                });
            }
        }
        let mut root = vec![NONE; words.len()];
        let mut edges: HashMap<u64, u32> = HashMap::new();
        let mut outs: Vec<Vec<u32>> = Vec::new();
        let mut trails: Vec<Vec<(&[u8], u32)>> = Vec::new();
        for p in &parsed {
            let first = word_ids[p.words[0]];
            let mut node = if p.lead.is_empty() {
                if root[first as usize] == NONE {
                    root[first as usize] = next;
                    next += 1;
                }
                root[first as usize]
            } else {
                *edges.entry(edge_key(lead_of[p.lead], LEAD_STEP, first)).or_insert_with(|| {
                    next += 1;
                    next - 1
                })
            };
            for (s, w) in p.seps.iter().zip(&p.words[1..]) {
                node = *edges.entry(edge_key(node, sep_ids[s], word_ids[w])).or_insert_with(|| {
                    next += 1;
                    next - 1
                });
            }
            let n = node as usize;
            if outs.len() <= n {
                outs.resize(n + 1, Vec::new());
                trails.resize(n + 1, Vec::new());
            }
            if p.trail.is_empty() {
                outs[n].push(p.group);
            } else {
                trails[n].push((p.trail, p.group));
            }
        }
        let count = next as usize;
        outs.resize(count, Vec::new());
        trails.resize(count, Vec::new());
        // Breadth-first numbering: the root, the lead roots, the root's children by first word, then each node's
        // children in key order.
        let mut kids: Vec<Vec<(u64, u32)>> = vec![Vec::new(); count];
        for (&k, &c) in &edges {
            kids[(k >> 32) as usize].push((k & 0xffff_ffff, c));
        }
        let mut lead_roots: Vec<u32> = lead_of.values().copied().collect();
        lead_roots.sort_unstable();
        let mut order: Vec<u32> = vec![0];
        order.extend(&lead_roots);
        order.extend(root.iter().copied().filter(|&n| n != NONE));
        let mut i = 0;
        while i < order.len() {
            let n = order[i] as usize;
            kids[n].sort_unstable();
            order.extend(kids[n].iter().map(|&(_, c)| c));
            i += 1;
        }
        if order.len() != count {
            return Err(CompileError::Unreachable { reachable: order.len(), nodes: count });
        }
        let mut new_id = vec![NONE; count];
        for (new, &old) in order.iter().enumerate() {
            new_id[old as usize] = new as u32;
        }
        let root: Vec<u32> = root.iter().map(|&n| if n == NONE { NONE } else { new_id[n as usize] }).collect();
        let mut t = Trie {
            words: Vocab::build(&words, &root),
            seps: Vocab::build(&seps, &vec![NONE; seps.len()]),
            ..Trie::default()
        };
        t.sep_byte =
            (0..=255u8).map(|b| if b.is_ascii_whitespace() { t.seps.get(b" ") } else { t.seps.get(&[b]) }).collect();
        for &old in &order {
            let n = old as usize;
            outs[n].sort_unstable();
            trails[n].sort_unstable();
            let filter =
                kids[n].iter().fold(0, |f, &(low, _)| f | filter_bit((low >> 21) as u32, low as u32 & (MAX_WORDS - 1)));
            t.nodes.push([t.outs.len() as u32, t.trails.len() as u32, filter]);
            t.outs.extend_from_slice(&outs[n]);
            for &(trail, group) in &trails[n] {
                let start = t.trail_text.len() as u32;
                t.trail_text.extend_from_slice(trail);
                t.trails.push([start, t.trail_text.len() as u32, group]);
            }
        }
        t.nodes.push([t.outs.len() as u32, t.trails.len() as u32, 0]);
        let size = (edges.len() * 2).next_power_of_two().max(16);
        t.edges = vec![[0, 0]; size];
        let mut sorted: Vec<(u64, u32)> = edges
            .into_iter()
            .map(|(k, c)| ((u64::from(new_id[(k >> 32) as usize]) << 32) | (k & 0xffff_ffff), new_id[c as usize]))
            .collect();
        sorted.sort_unstable();
        for (key, child) in sorted {
            let mut i = edge_slot(key, size - 1);
            while t.edges[i][0] != 0 {
                i = (i + 1) & (size - 1);
            }
            t.edges[i] = [key, u64::from(child)];
        }
        let mut leads: Vec<(&[u8], u32)> = lead_of.into_iter().collect();
        leads.sort_unstable();
        for (lead, node) in leads {
            let start = t.lead_text.len() as u32;
            t.lead_text.extend_from_slice(lead);
            t.leads.push([start, t.lead_text.len() as u32, new_id[node as usize]]);
        }
        pure.sort_unstable();
        for (p, group) in pure {
            let start = t.pure_text.len() as u32;
            t.pure_text.extend_from_slice(p);
            t.pure.push([start, t.pure_text.len() as u32, group]);
        }
        Ok(t)
    }

    fn check(&self, groups: usize) -> bool {
        let nodes = self.nodes.len().saturating_sub(1) as u32;
        let spans_ok = |list: &[[u32; 3]], text: &[u8], target: usize| {
            list.iter().all(|&[a, b, x]| a <= b && b as usize <= text.len() && (x as usize) < target)
        };
        self.words.check()
            && self.seps.check()
            && self.sep_byte.len() == 256
            && self.sep_byte.iter().all(|&s| s == NONE || (s as usize) < self.seps.len())
            && self.words.values().all(|n| n == NONE || n < nodes)
            && self.seps.values().all(|n| n == NONE)
            && !self.nodes.is_empty()
            && self.nodes.windows(2).all(|w| w[0][0] <= w[1][0] && w[0][1] <= w[1][1])
            && self.nodes.last().is_some_and(|l| l[0] as usize == self.outs.len() && l[1] as usize == self.trails.len())
            && self.outs.iter().all(|&g| (g as usize) < groups)
            && spans_ok(&self.trails, &self.trail_text, groups)
            && spans_ok(&self.leads, &self.lead_text, nodes as usize)
            && spans_ok(&self.pure, &self.pure_text, groups)
            && self.edges.len().is_power_of_two()
            && self.edges.iter().any(|e| e[0] == 0)
            && self.edges.iter().all(|&[k, v]| k == 0 || ((k >> 32) < u64::from(nodes) && v < u64::from(nodes)))
    }
}

/// The trie over the marked phrases and the phrase groups.
pub struct Compiled {
    pub trie: Trie,
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

/// Why phrases could not be compiled, or a compiled form could not be read. (`Display` by hand: this file is also
/// compiled into the build script, which has no dependencies.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileError {
    /// More distinct words or separators than the trie's 32-bit keys hold.
    TooManyKeys { words: usize, seps: usize },
    /// The trie's construction left nodes unreachable (a bug, reported rather than matched wrongly).
    Unreachable { reachable: usize, nodes: usize },
    /// A compiled form that does not start with this version's header.
    WrongHeader,
    /// A compiled form cut short.
    Truncated,
    /// A compiled form whose indexes point outside its own tables.
    Inconsistent,
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileError::TooManyKeys { words, seps } => {
                write!(f, "phrase trie: {words} words and {seps} separators: more than the trie's keys hold")
            }
            CompileError::Unreachable { reachable, nodes } => {
                write!(f, "phrase trie: {reachable} of {nodes} nodes reachable")
            }
            CompileError::WrongHeader => f.write_str("compiled phrase matcher: wrong header"),
            CompileError::Truncated => f.write_str("compiled phrase matcher: truncated"),
            CompileError::Inconsistent => f.write_str("compiled phrase matcher: inconsistent structure"),
        }
    }
}

impl std::error::Error for CompileError {}

/// Compiles the phrases (empty phrases never match and get no pattern).
pub fn compile(phrases: &[&str]) -> Result<Compiled, CompileError> {
    let mut group_of: HashMap<Vec<u8>, u32> = HashMap::new();
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
    let trie = Trie::build(&patterns)?;
    let mut group_start = Vec::with_capacity(members.len() + 1);
    let mut group_phrases = Vec::with_capacity(count as usize);
    for m in &members {
        group_start.push(group_phrases.len() as u32);
        group_phrases.extend_from_slice(m);
    }
    group_start.push(group_phrases.len() as u32);
    Ok(Compiled { trie, group_start, group_phrases, phrases: count, fingerprint: fingerprint(phrases.iter().copied()) })
}

/// Little-endian writer and reader of the compiled form's lists.
trait Item: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

impl Item for u8 {
    const SIZE: usize = 1;
    fn put(self, out: &mut Vec<u8>) {
        out.push(self);
    }
    fn get(b: &[u8]) -> Self {
        b[0]
    }
}

impl Item for u32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u32::from_le_bytes(b.try_into().expect("4 bytes"))
    }
}

impl Item for u64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }
}

impl<T: Item, const N: usize> Item for [T; N] {
    const SIZE: usize = T::SIZE * N;
    fn put(self, out: &mut Vec<u8>) {
        for x in self {
            x.put(out);
        }
    }
    fn get(b: &[u8]) -> Self {
        std::array::from_fn(|i| T::get(&b[i * T::SIZE..(i + 1) * T::SIZE]))
    }
}

fn put_list<T: Item>(out: &mut Vec<u8>, list: &[T]) {
    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
    for &x in list {
        x.put(out);
    }
}

fn take_list<T: Item>(b: &[u8]) -> Option<(Vec<T>, &[u8])> {
    let (n, rest) = b.split_at_checked(4)?;
    let n = u32::from_le_bytes(n.try_into().ok()?) as usize;
    let (body, rest) = rest.split_at_checked(n.checked_mul(T::SIZE)?)?;
    Some((body.chunks_exact(T::SIZE).map(T::get).collect(), rest))
}

impl Compiled {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&self.phrases.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        put_list(&mut out, &self.group_start);
        put_list(&mut out, &self.group_phrases);
        let t = &self.trie;
        for v in [&t.words, &t.seps] {
            put_list(&mut out, &v.slots);
            put_list(&mut out, &v.ends);
            put_list(&mut out, &v.text);
        }
        put_list(&mut out, &t.sep_byte);
        put_list(&mut out, &t.nodes);
        put_list(&mut out, &t.outs);
        put_list(&mut out, &t.trails);
        put_list(&mut out, &t.trail_text);
        put_list(&mut out, &t.edges);
        put_list(&mut out, &t.leads);
        put_list(&mut out, &t.lead_text);
        put_list(&mut out, &t.pure);
        put_list(&mut out, &t.pure_text);
        out
    }

    /// Reads a compiled form, checking its structure (bounds of every index); whether it was built from the
    /// caller's phrases is the caller's check (`phrases`, `fingerprint`).
    pub fn from_bytes(bytes: &[u8]) -> Result<Compiled, CompileError> {
        let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or(CompileError::WrongHeader)?;
        let (phrases, rest) = rest.split_at_checked(4).ok_or(CompileError::Truncated)?;
        let phrases = u32::from_le_bytes(phrases.try_into().expect("4 bytes"));
        let (fp, rest) = rest.split_at_checked(8).ok_or(CompileError::Truncated)?;
        let fingerprint = u64::from_le_bytes(fp.try_into().expect("8 bytes"));
        let mut rest = rest;
        macro_rules! take {
            () => {{
                let (list, r) = take_list(rest).ok_or(CompileError::Truncated)?;
                rest = r;
                list
            }};
        }
        let group_start: Vec<u32> = take!();
        let group_phrases: Vec<u32> = take!();
        let words = Vocab { slots: take!(), ends: take!(), text: take!() };
        let seps = Vocab { slots: take!(), ends: take!(), text: take!() };
        let trie = Trie {
            words,
            seps,
            sep_byte: take!(),
            nodes: take!(),
            outs: take!(),
            trails: take!(),
            trail_text: take!(),
            edges: take!(),
            leads: take!(),
            lead_text: take!(),
            pure: take!(),
            pure_text: take!(),
        };
        let groups_whole = group_start.first() == Some(&0)
            && group_start.windows(2).all(|w| w[0] <= w[1])
            && group_start.last().map(|&l| l as usize) == Some(group_phrases.len())
            && group_phrases.iter().all(|&p| p < phrases);
        if !rest.is_empty() || !groups_whole || !trie.check(group_start.len() - 1) {
            return Err(CompileError::Inconsistent);
        }
        Ok(Compiled { trie, group_start, group_phrases, phrases, fingerprint })
    }

    /// The phrase indexes of a pattern group.
    pub fn group(&self, g: u32) -> &[u32] {
        let g = g as usize;
        match (self.group_start.get(g), self.group_start.get(g + 1)) {
            (Some(&a), Some(&b)) => &self.group_phrases[a as usize..b as usize],
            _ => &[],
        }
    }
}
