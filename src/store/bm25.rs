//! BM25 sparse vectors for hybrid search, shared by indexing and search: Qdrant's own tokenizer, stemmer and
//! stopwords (`qdrant-edge`), so the embedded engine and a server score the same terms.
//!
//! **Documents are encoded word by word from a cache.** The engine's word tokenizer (the default, the one used here)
//! splits a text at every character that is not alphanumeric and turns each piece into at most one term on its own
//! (lowercase, stopwords, the Snowball stemmer), so a text's terms are its pieces' terms in order. `sparse_document`
//! therefore asks the engine for each distinct piece once per thread (`EdgeBm25::embed_query` of the piece: its
//! term's id, or none) and keeps the answer in a bounded thread-local map (`PIECE_CACHE` entries, then emptied);
//! the counting and the BM25 weights are the engine's formula (`Bm25::term_frequency` in qdrant-edge), with the same
//! `k`, `b` and average length. The result is the engine's `embed_document` of the same text, bit for bit (tests
//! below compare them on random texts); stemming every word of every chunk had been about a sixth of the CPU
//! pool's time end to end. The one difference is deliberate: two different terms whose ids collide (32-bit hashes)
//! in one text have their counts added, where the engine keeps one of the two weights at random.

use std::cell::RefCell;

use qdrant_edge::bm25_embed::{EdgeBm25, EdgeBm25Config};
use rustc_hash::FxHashMap;

use super::{Sparse, StoreError};

/// Distinct pieces a thread keeps the terms of before it empties its cache (a few MB at most; clinical text's
/// vocabulary fits many times over, numbers and names come and go).
const PIECE_CACHE: usize = 1 << 16;

/// The BM25 encoder (`store.bm25_avg_len`: the average document length in tokens).
#[derive(Debug)]
pub struct Encoder {
    edge: EdgeBm25,
    k1: f64,
    b: f64,
    avg_len: f64,
}

pub fn encoder(avg_len: f64) -> Result<Encoder, StoreError> {
    let not_nan = qdrant_edge::external::ordered_float::NotNan::new(avg_len)
        .map_err(|_| StoreError::fatal("store.bm25_avg_len is not a number"))?;
    let config = EdgeBm25Config { avg_len: not_nan, ..Default::default() };
    let (k1, b) = (config.k.into_inner(), config.b.into_inner());
    let edge = EdgeBm25::new(config).map_err(|e| StoreError::fatal(format!("BM25: {e}")))?;
    Ok(Encoder { edge, k1, b, avg_len })
}

thread_local! {
    /// A piece of text (between non-alphanumeric characters) → its term's id, `None` for a stopword. Every
    /// `Encoder` tokenizes alike (only `avg_len` differs), so one cache serves them all.
    static TERMS: RefCell<FxHashMap<Box<str>, Option<u32>>> = RefCell::default();
}

impl Encoder {
    /// The term id of one piece (no separators in it), from this thread's cache.
    fn term(&self, cache: &mut FxHashMap<Box<str>, Option<u32>>, piece: &str) -> Option<u32> {
        if let Some(&id) = cache.get(piece) {
            return id;
        }
        if cache.len() >= PIECE_CACHE {
            cache.clear();
        }
        let id = self.edge.embed_query(piece).indices.first().copied();
        cache.insert(piece.into(), id);
        id
    }

    /// The text's terms by id with their counts (sorted by id), and how many terms it has.
    fn counts(&self, text: &str) -> (Vec<(u32, u32)>, usize) {
        let mut ids: Vec<u32> = TERMS.with_borrow_mut(|cache| {
            text.split(|c: char| !c.is_alphanumeric())
                .filter(|piece| !piece.is_empty())
                .filter_map(|piece| self.term(cache, piece))
                .collect()
        });
        let len = ids.len();
        ids.sort_unstable();
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for id in ids {
            match counts.last_mut() {
                Some((last, n)) if *last == id => *n += 1,
                _ => counts.push((id, 1)),
            }
        }
        (counts, len)
    }
}

/// A document's (or chunk's) BM25 vector: the engine's `embed_document`, computed from cached terms.
pub fn sparse_document(bm25: &Encoder, text: &str) -> Sparse {
    let (counts, len) = bm25.counts(text);
    let doc_len = len as f64;
    let (k1, b) = (bm25.k1, bm25.b);
    let mut sparse = Sparse { indices: Vec::with_capacity(counts.len()), values: Vec::with_capacity(counts.len()) };
    for (id, n) in counts {
        // The engine's weight, operation for operation (qdrant-edge `Bm25::term_frequency`).
        let n = f64::from(n);
        let mut tf = n * (k1 + 1.0);
        tf /= k1.mul_add(1.0 - b + b * doc_len / bm25.avg_len, n);
        sparse.indices.push(id);
        sparse.values.push(tf as f32);
    }
    sparse
}

/// The terms of a text as BM25 counts them (Qdrant's tokenizer, stemmer and stopwords; ids), for comparing the
/// words of two texts ("lungs" and "lung" are one term, "the" none).
pub fn terms(text: &str) -> Vec<u32> {
    static ENCODER: std::sync::OnceLock<Option<Encoder>> = std::sync::OnceLock::new();
    ENCODER.get_or_init(|| encoder(256.0).ok()).as_ref().map(|b| b.edge.embed_query(text).indices).unwrap_or_default()
}

pub fn sparse_query(bm25: &Encoder, text: &str) -> Sparse {
    let v = bm25.edge.embed_query(text);
    Sparse { indices: v.indices, values: v.values }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The engine's own encoding of a document.
    fn engine(bm25: &Encoder, text: &str) -> (Vec<u32>, Vec<u32>) {
        let v = bm25.edge.embed_document(text);
        (v.indices, v.values.iter().map(|x| x.to_bits()).collect())
    }

    fn ours(bm25: &Encoder, text: &str) -> (Vec<u32>, Vec<u32>) {
        let v = sparse_document(bm25, text);
        (v.indices, v.values.iter().map(|x| x.to_bits()).collect())
    }

    #[test]
    fn documents_encode_as_the_engine_does_bit_for_bit() {
        let texts = [
            "",
            "   ",
            "The patient is a 67-year-old male with no history of COPD; lungs are clear. The lungs, the LUNG.",
            "HISTORY OF PRESENT ILLNESS:  She denies chest pain, dyspnea or fever (T 38.5°C).  B/P 120/80 mmHg.",
            "Ünïcödé façade naïve İstanbul ǅemal straße ΣΊΣΥΦΟΣ 東京 مرحبا x-ray s/p d/c'd 2007-03-04",
            "the and of to a in",
            "running runs ran runner runners RUNNING Running's",
        ];
        for avg in [256.0, 40.0, 1.0] {
            let bm25 = encoder(avg).unwrap();
            for t in texts {
                // Twice: the second answer comes from the thread's cache.
                assert_eq!(ours(&bm25, t), engine(&bm25, t), "{avg} {t:?}");
                assert_eq!(ours(&bm25, t), engine(&bm25, t), "{avg} {t:?} (cached)");
            }
        }
    }

    #[test]
    fn a_full_cache_is_emptied_and_answers_stay_the_same() {
        let bm25 = encoder(256.0).unwrap();
        // More distinct pieces than the cache keeps, in texts of 100 words.
        let words: Vec<String> = (0..PIECE_CACHE + 5_000).map(|i| format!("w{i}x")).collect();
        for chunk in words.chunks(100) {
            let text = chunk.join(" ");
            assert_eq!(ours(&bm25, &text), engine(&bm25, &text));
        }
        let size = TERMS.with_borrow(|c| c.len());
        assert!(size <= PIECE_CACHE, "the cache kept {size} pieces");
        let text = words[..300].join(", ");
        assert_eq!(ours(&bm25, &text), engine(&bm25, &text));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Random texts of words (any case, stopwords, digits, accents, other scripts) and separators (spaces,
        /// punctuation, combining marks, symbols) encode as the engine encodes them.
        #[test]
        fn random_texts_encode_as_the_engine_does(
            parts in prop::collection::vec(
                prop_oneof![
                    prop::sample::select(vec![
                        "the", "The", "and", "is", "no", "not", "Patient", "patients", "lung", "Lungs", "LUNGS",
                        "history", "historical", "denies", "denied", "fever", "febrile", "mg", "2007", "3x", "b12",
                        "naïve", "Straße", "İ", "ǅ", "ΣΊΣΥΦΟΣ", "東京", "ﬁne", "e\u{301}", "Ⅻ", "½", "x²",
                    ]).prop_map(str::to_string),
                    "[a-zA-Z0-9]{1,12}",
                    "\\PC{1,6}",
                ],
                0..80,
            ),
            seps in prop::collection::vec(
                prop::sample::select(vec![" ", "  ", ", ", ".", "-", "/", "'", "\n", "(", ")", ":", "\u{301}", "°", "\t"]),
                80,
            ),
            avg in prop::sample::select(vec![256.0, 12.0, 1.0]),
        ) {
            let text: String = parts.iter().zip(&seps).map(|(p, s)| format!("{p}{s}")).collect();
            let bm25 = encoder(avg).unwrap();
            prop_assert_eq!(ours(&bm25, &text), engine(&bm25, &text));
        }
    }
}
