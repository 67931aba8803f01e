//! Token ids for the model: the model's own tokenizer (`tokenizers`, from `tokenizer.json`), with two shortcuts for
//! ASCII text through a BERT tokenizer, the worker's most expensive CPU step besides the text stages
//! (docs/benchmarks.md, "Where 2 cores go").
//!
//! 1. The BERT normalizer (`BertNormalizer`) tracks each character's alignment to the input for offsets, which the
//!    worker never reads. For ASCII text it reduces to two character maps — clean text (control characters dropped,
//!    tab/newline/return to a space) and ASCII lowercasing; Chinese-character spacing and accent stripping change
//!    nothing in ASCII. So when the tokenizer's normalizer is exactly a `BertNormalizer`, ASCII input is mapped here.
//! 2. When, besides, the pre-tokenizer is BERT's (split at whitespace, each punctuation character a word of its own)
//!    and the model is WordPiece, the mapped text is split into words and each word cut greedily longest-first
//!    against the vocabulary here ([`WordPieces`]): in ASCII, BERT's punctuation is exactly ASCII punctuation and its
//!    whitespace `\t\n\x0B\x0C\r `, so no Unicode tables and no intermediate strings per word. The special tokens the
//!    post-processor puts around one input and the tokenizer's truncation (right, no stride) are applied as the
//!    tokenizer does. Text holding an added token's content (`[SEP]`, `[MASK]`, ...) takes the full path, which
//!    matches those first. At start-up the shortcut is checked against the full tokenizer on probe inputs and left
//!    off if any differs.
//!
//! Otherwise (the second condition unmet) the mapped text goes through a copy of the tokenizer without its
//! normalizer; and anything else (non-ASCII text, another normalizer) through the full tokenizer. Every path gives
//! the full tokenizer's ids. Offsets always come from the full path (the map drops characters).

use rustc_hash::FxHashMap;
use tokenizers::{ModelWrapper, NormalizerWrapper, PreTokenizerWrapper, Tokenizer, TruncationDirection};

pub(crate) struct Tokens {
    full: Tokenizer,
    ascii: Option<Ascii>,
}

/// The ASCII shortcut: what the normalizer would have done, then either the word pieces cut here or the tokenizer
/// without its normalizer.
struct Ascii {
    bare: Tokenizer,
    clean_text: bool,
    lowercase: bool,
    pieces: Option<WordPieces>,
    /// Added tokens' contents, as written and lowercased: text holding one takes the full path, which matches them
    /// before normalizing.
    added: Vec<String>,
    /// Bytes that start an added token's content (a quick test before searching for them).
    added_first: [bool; 256],
}

/// BERT's pre-tokenizer and WordPiece for ASCII text, with the post-processor's special tokens and the truncation.
struct WordPieces {
    vocab: FxHashMap<Box<str>, u32>,
    unk: u32,
    /// Prefix of a piece that continues a word (`##`).
    continuing: String,
    /// A word longer than this is one unknown token.
    max_word: usize,
    /// Special tokens before and after one input.
    before: Vec<u32>,
    after: Vec<u32>,
    /// Most tokens of one input, special tokens included (the tokenizer's truncation).
    max_length: Option<usize>,
}

/// BERT's whitespace in ASCII (`char::is_whitespace`).
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

impl WordPieces {
    /// The shortcut for `full` when its pre-tokenizer is BERT's and its model WordPiece, with a truncation it can
    /// follow (right, no stride).
    fn of(full: &Tokenizer) -> Option<WordPieces> {
        let Some(PreTokenizerWrapper::BertPreTokenizer(_)) = full.get_pre_tokenizer() else { return None };
        let ModelWrapper::WordPiece(model) = full.get_model() else { return None };
        let max_length = match full.get_truncation() {
            None => None,
            Some(t) if t.stride == 0 && t.direction == TruncationDirection::Right => Some(t.max_length),
            Some(_) => return None,
        };
        let vocab: FxHashMap<Box<str>, u32> =
            tokenizers::Model::get_vocab(model).into_iter().map(|(k, v)| (k.into_boxed_str(), v)).collect();
        let unk = *vocab.get(model.unk_token.as_str())?;
        // The special tokens around one input: where the bare ids of a probe sit inside the ids with them.
        let bare = full.encode_fast("a", false).ok()?.get_ids().to_vec();
        let with = full.encode_fast("a", true).ok()?.get_ids().to_vec();
        let at = (0..=with.len().checked_sub(bare.len())?).find(|&i| with[i..i + bare.len()] == bare[..])?;
        Some(WordPieces {
            vocab,
            unk,
            continuing: model.continuing_subword_prefix.clone(),
            max_word: model.max_input_chars_per_word,
            before: with[..at].to_vec(),
            after: with[at + bare.len()..].to_vec(),
            max_length,
        })
    }

    /// The ids of normalized ASCII `text` (with the special tokens when `special`), truncated.
    fn ids(&self, text: &str, special: bool) -> Vec<u32> {
        let b = text.as_bytes();
        let (before, after): (&[u32], &[u32]) = if special { (&self.before, &self.after) } else { (&[], &[]) };
        let limit = self.max_length.map_or(usize::MAX, |m| m.saturating_sub(before.len() + after.len()));
        let mut out = Vec::with_capacity(before.len() + (b.len() / 3).min(limit) + after.len());
        out.extend_from_slice(before);
        let mut piece = String::new();
        let mut i = 0;
        while i < b.len() && out.len() - before.len() < limit {
            if is_space(b[i]) {
                i += 1;
                continue;
            }
            let end = if b[i].is_ascii_punctuation() {
                i + 1
            } else {
                let mut j = i + 1;
                while j < b.len() && !is_space(b[j]) && !b[j].is_ascii_punctuation() {
                    j += 1;
                }
                j
            };
            self.word(&text[i..end], &mut piece, &mut out);
            i = end;
        }
        out.truncate(before.len() + limit.min(out.len() - before.len()));
        out.extend_from_slice(after);
        out
    }

    /// One word's pieces, longest first from the left (WordPiece); a word with a part no piece covers, or longer
    /// than the model's word limit, is one unknown token.
    fn word(&self, word: &str, piece: &mut String, out: &mut Vec<u32>) {
        if word.len() > self.max_word {
            out.push(self.unk);
            return;
        }
        let first = out.len();
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len();
            let found = loop {
                let id = if start == 0 {
                    self.vocab.get(&word[..end])
                } else {
                    piece.clear();
                    piece.push_str(&self.continuing);
                    piece.push_str(&word[start..end]);
                    self.vocab.get(piece.as_str())
                };
                if let Some(&id) = id {
                    break Some(id);
                }
                end -= 1;
                if end == start {
                    break None;
                }
            };
            let Some(id) = found else {
                out.truncate(first);
                out.push(self.unk);
                return;
            };
            out.push(id);
            start = end;
        }
    }
}

impl Tokens {
    pub(crate) fn new(full: Tokenizer) -> Tokens {
        let ascii = match full.get_normalizer() {
            Some(NormalizerWrapper::BertNormalizer(n)) => {
                let mut bare = full.clone();
                let mut added = Vec::new();
                let mut added_first = [false; 256];
                for t in full.get_added_tokens_decoder().into_values() {
                    for content in [t.content.clone(), t.content.to_lowercase()] {
                        if let Some(&b) = content.as_bytes().first() {
                            added_first[b as usize] = true;
                            added.push(content);
                        }
                    }
                }
                bare.with_normalizer(None::<NormalizerWrapper>).is_ok().then(|| Ascii {
                    bare,
                    clean_text: n.clean_text,
                    lowercase: n.lowercase,
                    pieces: WordPieces::of(&full),
                    added,
                    added_first,
                })
            }
            _ => None,
        };
        let mut tokens = Tokens { full, ascii };
        // The word pieces cut here must be the tokenizer's: checked on probes, left off otherwise.
        if !tokens.agrees_on_probes()
            && let Some(a) = tokens.ascii.as_mut()
        {
            a.pieces = None;
        }
        tokens
    }

    /// The full tokenizer (offsets, warm-up).
    pub(crate) fn full(&self) -> &Tokenizer {
        &self.full
    }

    /// Token ids of `text`, with the special tokens when `special`, truncated as the tokenizer is configured.
    pub(crate) fn ids(&self, text: &str, special: bool) -> tokenizers::Result<Vec<u32>> {
        match &self.ascii {
            Some(a) if text.is_ascii() => {
                // The mapped text holds every added token the input holds, as written or lowercased (the map only
                // lowercases and drops control characters), so one look suffices.
                let mapped = a.map(text);
                if a.holds_added(&mapped) {
                    return Ok(self.full.encode_fast(text, special)?.get_ids().to_vec());
                }
                match &a.pieces {
                    Some(p) => Ok(p.ids(&mapped, special)),
                    None => Ok(a.bare.encode_fast(mapped.as_str(), special)?.get_ids().to_vec()),
                }
            }
            _ => Ok(self.full.encode_fast(text, special)?.get_ids().to_vec()),
        }
    }

    /// Whether the shortcut gives the full tokenizer's ids on probe inputs (words, pieces, punctuation, an unknown
    /// character, an over-long word, truncation), with and without the special tokens.
    fn agrees_on_probes(&self) -> bool {
        let long_word = "pneumonoultramicroscopicsilicovolcanoconiosis".repeat(3);
        let past_limit = "Chest pain, shortness of breath; BP 150/90. ".repeat(200);
        let probes = [
            "HISTORY: 67-year-old male with CHF (EF 25%), s/p CABG x3 in 2009; on metformin 500mg b.i.d.",
            "No pleural effusion\tor pneumothorax.\r\nIMPRESSION:  Normal study~ `quoted` {x}|<y>=z^w_v$u#t@s!",
            long_word.as_str(),
            past_limit.as_str(),
            "",
            "   ",
        ];
        probes.iter().all(|p| {
            [true, false].iter().all(|&special| {
                let full = self.full.encode_fast(*p, special).map(|e| e.get_ids().to_vec());
                matches!((full, self.ids(p, special)), (Ok(f), Ok(s)) if f == s)
            })
        })
    }

    /// Whether the ASCII shortcut is on, and whether it cuts the word pieces itself (tests).
    #[cfg(test)]
    fn shortcuts(&self) -> (bool, bool) {
        (self.ascii.is_some(), self.ascii.as_ref().is_some_and(|a| a.pieces.is_some()))
    }
}

impl Ascii {
    /// What the BERT normalizer does to ASCII text.
    fn map(&self, text: &str) -> String {
        // Made at its final size: collecting char by char grew it in steps.
        let mut out = String::with_capacity(text.len());
        out.extend(text.chars().filter_map(|c| match c {
            '\t' | '\n' | '\r' if self.clean_text => Some(' '),
            c if self.clean_text && c.is_ascii_control() => None,
            c if self.lowercase => Some(c.to_ascii_lowercase()),
            c => Some(c),
        }));
        out
    }

    /// Whether `text` holds an added token's content, as written or lowercased.
    fn holds_added(&self, text: &str) -> bool {
        text.bytes().any(|b| self.added_first[b as usize]) && self.added.iter().any(|a| text.contains(a.as_str()))
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

    /// Fixed cases (clinical text with punctuation, capitals, digits, tabs, newlines, carriage returns, other
    /// control characters, DEL, only spaces, nothing, added tokens' contents as written, lowercased and broken by a
    /// control character, non-ASCII text, text past the truncation limit, an over-long word), 2,000 random ASCII
    /// strings and 2,000 random texts of the vocabulary's words and pieces glued, cased and punctuated at random
    /// (seeded).
    fn cases(t: &Tokenizer) -> Vec<String> {
        let mut cases: Vec<String> = [
            "HISTORY OF PRESENT ILLNESS: 67-year-old male with CHF (EF 25%), s/p CABG in 2009.",
            "No pleural effusion\tor pneumothorax.\r\nIMPRESSION:\u{7}  Normal\u{0}study\u{7f}.",
            "Dx: T2DM; meds: metformin 500mg b.i.d., lisinopril-HCTZ 20/12.5.",
            "   ",
            "",
            "\u{1}\u{2}\u{1b}[31m",
            "Naïve café — résumé 肺炎",
            "x [SEP] y [CLS][MASK] z",
            "a [sep] b [Pad] c",
            "[SE\u{1}P] and [UNK]",
            "Chest X-ray: [redacted] (see above).",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        cases.push("Pt c/o SOB & CP x3d; BP 150/90, HR 110. ".repeat(40));
        cases.push(format!("a {} b", "pneumonoultramicroscopicsilicovolcanoconiosis".repeat(3)));
        cases.push("hepatosplenomegaly".repeat(20));
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let len = (next() % 120) as usize;
            cases.push((0..len).map(|_| (next() % 128) as u8 as char).collect());
        }
        let mut words: Vec<String> = t.get_vocab(false).into_keys().filter(|w| w.is_ascii()).collect();
        words.sort();
        let seps = [" ", " ", " ", "", "", "-", ".", ", ", "/", "\n", "\t", "(", ")", ":", "'", "  "];
        for _ in 0..2000 {
            let n = (next() % 40) as usize;
            let mut text = String::new();
            for _ in 0..n {
                let w = &words[(next() % words.len() as u64) as usize];
                let w = w.trim_start_matches("##");
                match next() % 4 {
                    0 => text.push_str(&w.to_uppercase()),
                    1 => {
                        text.extend(w.chars().enumerate().map(|(i, c)| if i == 0 { c.to_ascii_uppercase() } else { c }))
                    }
                    _ => text.push_str(w),
                }
                text.push_str(seps[(next() % seps.len() as u64) as usize]);
            }
            cases.push(text);
        }
        cases
    }

    fn assert_same_ids(tokens: &Tokens, t: &Tokenizer) {
        for text in &cases(t) {
            for special in [true, false] {
                let want = t.encode(text.as_str(), special).unwrap().get_ids().to_vec();
                assert_eq!(tokens.ids(text, special).unwrap(), want, "{text:?} (special tokens: {special})");
            }
        }
    }

    /// The word pieces cut here are the full tokenizer's ids for every kind of ASCII input, with the tokenizer's
    /// truncation and without; non-ASCII text and text holding an added token take the full path.
    #[test]
    fn the_word_pieces_cut_here_are_the_full_tokenizers_ids() {
        let t = tokenizer();
        let tokens = Tokens::new(t.clone());
        assert_eq!(tokens.shortcuts(), (true, true), "BERT's normalizer, pre-tokenizer and WordPiece are recognised");
        assert_same_ids(&tokens, &t);
        let mut untruncated = t.clone();
        untruncated.with_truncation(None).unwrap();
        let tokens = Tokens::new(untruncated.clone());
        assert_eq!(tokens.shortcuts(), (true, true));
        assert_same_ids(&tokens, &untruncated);
    }

    /// With another pre-tokenizer the BERT normalizer's maps still apply, then the tokenizer without its
    /// normalizer: the same ids.
    #[test]
    fn another_pre_tokenizer_gets_the_normalizers_maps_only() {
        let mut t = tokenizer();
        t.with_pre_tokenizer(Some(PreTokenizerWrapper::Whitespace(tokenizers::pre_tokenizers::whitespace::Whitespace)));
        let tokens = Tokens::new(t.clone());
        assert_eq!(tokens.shortcuts(), (true, false));
        assert_same_ids(&tokens, &t);
    }

    /// A truncation the word pieces cannot follow (from the left) leaves them off.
    #[test]
    fn a_left_truncation_leaves_the_word_pieces_off() {
        let mut t = tokenizer();
        t.with_truncation(Some(tokenizers::TruncationParams {
            max_length: 16,
            direction: TruncationDirection::Left,
            ..Default::default()
        }))
        .unwrap();
        let tokens = Tokens::new(t.clone());
        assert_eq!(tokens.shortcuts(), (true, false));
        let text = "Chest pain, shortness of breath; BP 150/90. ".repeat(5);
        assert_eq!(tokens.ids(&text, true).unwrap(), t.encode(text.as_str(), true).unwrap().get_ids());
    }

    /// Another normalizer: no shortcut, the full path.
    #[test]
    fn another_normalizer_takes_the_full_path() {
        let mut t = tokenizer();
        t.with_normalizer(Some(NormalizerWrapper::Lowercase(tokenizers::normalizers::Lowercase))).unwrap();
        let tokens = Tokens::new(t.clone());
        assert_eq!(tokens.shortcuts(), (false, false));
        let text = "Chest X-ray: no acute findings.";
        assert_eq!(tokens.ids(text, true).unwrap(), t.encode(text, true).unwrap().get_ids());
    }
}
