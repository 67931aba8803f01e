//! Token ids for the model: the model's own tokenizer (`tokenizers`, from `tokenizer.json`), with one shortcut.
//!
//! A BERT tokenizer normalizes every input through `NormalizedString`, which tracks each character's alignment to
//! the input for offsets — a quarter of an indexing worker's CPU on 2 cores (docs/benchmarks.md), although the worker
//! only needs ids. For ASCII text the BERT normalizer (`BertNormalizer`) reduces to two character maps — clean text
//! (control characters dropped, tab/newline/return to a space) and ASCII lowercasing; Chinese-character spacing and
//! accent stripping change nothing in ASCII. So when the tokenizer's normalizer is exactly a `BertNormalizer`, ASCII
//! input is mapped here and encoded by a copy of the tokenizer without a normalizer (same pre-tokenizer, vocabulary,
//! truncation and special tokens): the same ids, about 1.6–2× faster. Anything else (non-ASCII text, another
//! normalizer) takes the full path. Offsets always come from the full path (the map drops characters).

use tokenizers::{NormalizerWrapper, Tokenizer};

pub(crate) struct Tokens {
    full: Tokenizer,
    ascii: Option<Ascii>,
}

/// The ASCII shortcut: the tokenizer without its normalizer, and what the normalizer would have done.
struct Ascii {
    bare: Tokenizer,
    clean_text: bool,
    lowercase: bool,
}

impl Tokens {
    pub(crate) fn new(full: Tokenizer) -> Tokens {
        let ascii = match full.get_normalizer() {
            Some(NormalizerWrapper::BertNormalizer(n)) => {
                let mut bare = full.clone();
                bare.with_normalizer(None::<NormalizerWrapper>).is_ok().then(|| Ascii {
                    bare,
                    clean_text: n.clean_text,
                    lowercase: n.lowercase,
                })
            }
            _ => None,
        };
        Tokens { full, ascii }
    }

    /// The full tokenizer (offsets, warm-up).
    pub(crate) fn full(&self) -> &Tokenizer {
        &self.full
    }

    /// Token ids of `text`, with the special tokens when `special`, truncated as the tokenizer is configured.
    pub(crate) fn ids(&self, text: &str, special: bool) -> tokenizers::Result<Vec<u32>> {
        match &self.ascii {
            Some(a) if text.is_ascii() => {
                let mapped: String = text
                    .chars()
                    .filter_map(|c| match c {
                        '\t' | '\n' | '\r' if a.clean_text => Some(' '),
                        c if a.clean_text && c.is_ascii_control() => None,
                        c if a.lowercase => Some(c.to_ascii_lowercase()),
                        c => Some(c),
                    })
                    .collect();
                Ok(a.bare.encode_fast(mapped.as_str(), special)?.get_ids().to_vec())
            }
            _ => Ok(self.full.encode_fast(text, special)?.get_ids().to_vec()),
        }
    }

    /// Whether the ASCII shortcut is on (tests).
    #[cfg(test)]
    fn has_shortcut(&self) -> bool {
        self.ascii.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2/tokenizer.json");
        let mut t =
            Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{} ({e}): run `make model`", path.display()));
        t.with_padding(None);
        t.with_truncation(Some(tokenizers::TruncationParams { max_length: 256, ..Default::default() })).unwrap();
        t
    }

    /// The shortcut gives the full tokenizer's ids for every kind of ASCII input: clinical text with punctuation,
    /// capitals, digits, tabs, newlines, carriage returns, other control characters, DEL, only spaces, nothing, and
    /// text past the truncation limit; non-ASCII text takes the full path. Random ASCII strings too (seeded).
    #[test]
    fn the_ascii_shortcut_gives_the_full_tokenizers_ids() {
        let t = tokenizer();
        let tokens = Tokens::new(t.clone());
        assert!(tokens.has_shortcut(), "the BERT normalizer is recognised");
        let long = "Pt c/o SOB & CP x3d; BP 150/90, HR 110. ".repeat(40);
        let mut cases: Vec<String> = [
            "HISTORY OF PRESENT ILLNESS: 67-year-old male with CHF (EF 25%), s/p CABG in 2009.",
            "No pleural effusion\tor pneumothorax.\r\nIMPRESSION:\u{7}  Normal\u{0}study\u{7f}.",
            "Dx: T2DM; meds: metformin 500mg b.i.d., lisinopril-HCTZ 20/12.5.",
            "   ",
            "",
            "\u{1}\u{2}\u{1b}[31m",
            "Naïve café — résumé 肺炎",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        cases.push(long);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let len = (seed % 120) as usize;
            let s: String = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % 128) as u8 as char
                })
                .collect();
            cases.push(s);
        }
        for text in &cases {
            for special in [true, false] {
                let want = t.encode(text.as_str(), special).unwrap().get_ids().to_vec();
                assert_eq!(tokens.ids(text, special).unwrap(), want, "{text:?} (special tokens: {special})");
            }
        }
    }

    /// Another normalizer: no shortcut, the full path.
    #[test]
    fn another_normalizer_takes_the_full_path() {
        let mut t = tokenizer();
        t.with_normalizer(Some(NormalizerWrapper::Lowercase(tokenizers::normalizers::Lowercase))).unwrap();
        let tokens = Tokens::new(t.clone());
        assert!(!tokens.has_shortcut());
        let text = "Chest X-ray: no acute findings.";
        assert_eq!(tokens.ids(text, true).unwrap(), t.encode(text, true).unwrap().get_ids());
    }
}
