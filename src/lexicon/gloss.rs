//! Compound terms found by their parts' meanings: "pleural air collection" is a pneumothorax.
//!
//! Many findings are named by one Greco-Latin compound (pneumo·thorax, cardio·megaly, hepato·megaly, hemo·
//! pericardium) that reports also say in plain words, in any order and with words between ("air in the right
//! pleural space", "the cardiac silhouette is moderately enlarged"). A hand-written synonym list covers the
//! phrasings someone saw; this covers the construction.
//!
//! In: the lexicon and a table of combining forms (`data/lexicon/combining_forms.tsv`: form, prefix or suffix, the
//! plain words for it). Every one-word disease or symptom term that is exactly one prefix form then one suffix form
//! becomes a *gloss*: two word sets. Out (`find`, per sentence): a match wherever a word of one set and a word of
//! the other stand at most `MAX_GAP` words apart, with nothing between them that ends the phrase (punctuation
//! other than a hyphen or apostrophe, a coordinator); the concept is the compound term's. A negation between the
//! parts ("the heart is not enlarged", "pleural spaces without air") keeps them one phrase: the match spans it, and
//! the mention stage (`stages::mentions`) starts the mention after any assertion cue inside, so that assertion reads
//! it. Nearest partner first, then non-overlapping, leftmost. Pure; cannot fail once built.

use super::compile::{NONE, Vocab};
use super::matcher::Prepared;
use super::{Lexicon, LexiconError, TermMatch};

/// `data/lexicon/combining_forms.tsv`, compiled in.
pub const COMBINING_FORMS_TSV: &str = include_str!("../../data/lexicon/combining_forms.tsv");

/// Words allowed between the two parts.
pub const MAX_GAP: usize = 3;

/// Words that end a phrase: the parts on either side belong to different phrases. (A negation does not: "the heart
/// is not enlarged" names the compound, denied.)
const BREAKERS: &[&str] = &["and", "or", "nor", "but", "with", "versus", "vs", "than", "except"];

/// The glosses of a lexicon's compound terms.
#[derive(Debug, Default)]
pub struct Glosses {
    /// Gloss word (automaton pattern) → its (gloss, part 0 = prefix / 1 = suffix) pairs.
    parts: Vec<Vec<(u32, u8)>>,
    /// Gloss → (concept index, the compound term).
    glosses: Vec<(u32, String)>,
    /// The gloss words, ASCII case-insensitive, leftmost-longest: one pass over a note finds every candidate.
    words: Option<aho_corasick::AhoCorasick>,
    /// The same words by id (the automaton's pattern index): an ASCII text's gloss words are those of its words
    /// (`matcher::Prepared`) found here.
    vocab: Vocab,
    /// A filter over the gloss words' vocabulary hashes (`Vocab::keys`, which `matcher::Prepared` holds for every
    /// word of a text): one bit per value of a hash's top `FILTER_BITS` bits. A word whose bit is clear is no gloss
    /// word, and most of a text's words are passed over on it without a probe of `vocab`.
    filter: Vec<u64>,
}

/// Bits of a word's hash that index `Glosses::filter` (8 KB).
const FILTER_BITS: u32 = 16;

/// A word's bit in `Glosses::filter`, from its vocabulary hash.
#[inline]
fn filter_bit(hash: u64) -> usize {
    (hash >> (64 - FILTER_BITS)) as usize
}

/// A gloss word in a text: its span and its pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub start: usize,
    pub end: usize,
    word: u32,
}

/// One combining form of the table.
struct Form<'a> {
    form: &'a str,
    prefix: bool,
    words: Vec<&'a str>,
}

fn parse(table: &str) -> Result<Vec<Form<'_>>, LexiconError> {
    let mut out = Vec::new();
    for (n, line) in table.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let bad = || LexiconError(format!("combining forms line {}", n + 1));
        let mut f = line.split('\t');
        let (Some(form), Some(position), Some(words), None) = (f.next(), f.next(), f.next(), f.next()) else {
            return Err(bad());
        };
        let prefix = match position {
            "prefix" => true,
            "suffix" => false,
            _ => return Err(bad()),
        };
        let words: Vec<&str> = words.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
        if form.is_empty() || words.is_empty() || words.iter().any(|w| !w.chars().all(|c| c.is_ascii_lowercase())) {
            return Err(bad());
        }
        out.push(Form { form, prefix, words });
    }
    Ok(out)
}

impl Glosses {
    /// The glosses of `lexicon`'s compounds under the built-in table.
    pub fn builtin(lexicon: &Lexicon) -> Glosses {
        Glosses::new(lexicon, COMBINING_FORMS_TSV).expect("built-in combining forms")
    }

    /// The glosses of `lexicon`'s one-word disease and symptom terms that split into a prefix and a suffix form
    /// of `table`.
    pub fn new(lexicon: &Lexicon, table: &str) -> Result<Glosses, LexiconError> {
        let forms = parse(table)?;
        let (prefixes, suffixes): (Vec<&Form>, Vec<&Form>) = forms.iter().partition(|f| f.prefix);
        let mut g = Glosses::default();
        let mut seen = std::collections::HashSet::new();
        let mut word_ids: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut words: Vec<&str> = Vec::new();
        for (term, _) in lexicon.terms() {
            if term.len() < 6 || !term.bytes().all(|b| b.is_ascii_lowercase()) || !seen.insert(term) {
                continue;
            }
            // The concept the matcher gives the term itself (the compound and its gloss mean the same).
            let Some(concept) = lexicon.term_concept(term) else { continue };
            if !lexicon.concept(concept).kind.is_finding() {
                continue;
            }
            for p in &prefixes {
                let Some(rest) = term.strip_prefix(p.form) else { continue };
                let Some(s) = suffixes.iter().find(|s| s.form == rest) else { continue };
                let id = g.glosses.len() as u32;
                g.glosses.push((concept, term.to_string()));
                for (part, form_words) in [(0u8, &p.words), (1u8, &s.words)] {
                    for &w in form_words.iter() {
                        let i = *word_ids.entry(w).or_insert_with(|| {
                            words.push(w);
                            g.parts.push(Vec::new());
                            words.len() - 1
                        });
                        g.parts[i].push((id, part));
                    }
                }
            }
        }
        if !words.is_empty() {
            let ac = aho_corasick::AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                .build(&words)
                .map_err(|e| LexiconError(format!("combining forms: {e}")))?;
            g.words = Some(ac);
            let strings: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
            g.vocab = Vocab::build(&strings, &vec![0; strings.len()]);
            g.filter = vec![0; (1 << FILTER_BITS) / 64];
            let mut keys = Vec::new();
            for w in &strings {
                let padded = [w.to_ascii_lowercase().as_slice(), &[0; 8]].concat();
                keys.clear();
                Vocab::keys(&padded, &[(0, w.len() as u32)], &mut keys);
                let bit = filter_bit(keys[0].1);
                g.filter[bit / 64] |= 1 << (bit % 64);
            }
        }
        Ok(g)
    }

    pub fn len(&self) -> usize {
        self.glosses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.glosses.is_empty()
    }

    /// The gloss words, by id.
    #[cfg(test)]
    fn vocab_words(&self) -> Vec<&str> {
        (0..self.vocab.len()).map(|i| std::str::from_utf8(self.vocab.string(i)).expect("ASCII")).collect()
    }

    /// The compound terms glossed, in order (for `explain` and tests).
    pub fn terms(&self) -> impl Iterator<Item = &str> {
        self.glosses.iter().map(|(_, t)| t.as_str())
    }

    /// Every gloss word in `text` (whole words), in text order: one pass per note, before `pairs` per sentence.
    pub fn hits(&self, text: &str) -> Vec<Hit> {
        let Some(ac) = &self.words else { return Vec::new() };
        let bytes = text.as_bytes();
        let is_word = |i: usize| bytes.get(i).is_some_and(|b| b.is_ascii_alphanumeric());
        ac.find_iter(text)
            .filter(|m| !(m.start() > 0 && is_word(m.start() - 1)) && !is_word(m.end()))
            .map(|m| Hit { start: m.start(), end: m.end(), word: m.pattern().as_u32() })
            .collect()
    }

    /// `hits` from the text's words, when the matcher has split it already. For an ASCII text the words are the
    /// maximal runs of ASCII letters and digits, and a whole-word match of a gloss word (all lower-case ASCII
    /// letters) is exactly such a run equal to it, ASCII case ignored: one lookup per word, no second pass. Other
    /// texts (where a word may hold non-ASCII letters) take the automaton.
    pub fn hits_prepared(&self, text: &str, p: &Prepared) -> Vec<Hit> {
        if !p.ascii {
            return self.hits(text);
        }
        if self.vocab.is_empty() {
            return Vec::new();
        }
        let mut hits = Vec::new();
        for (&(a, b), &key) in p.words.iter().zip(&p.keys) {
            let bit = filter_bit(key.1);
            if self.filter[bit / 64] >> (bit % 64) & 1 == 0 {
                continue;
            }
            let (word, _) = self.vocab.get_keyed(&p.folded, a as usize, b as usize, key);
            if word != NONE {
                hits.push(Hit { start: a as usize, end: b as usize, word });
            }
        }
        hits
    }

    /// The gloss matches among `hits` (those of one sentence, in order): non-overlapping, leftmost, each with its
    /// nearest partner.
    pub fn pairs(&self, text: &str, hits: &[Hit]) -> Vec<TermMatch> {
        let mut found: Vec<TermMatch> = Vec::new();
        for (a, h) in hits.iter().enumerate() {
            let parts = &self.parts[h.word as usize];
            for other in &hits[a + 1..] {
                if !gap_ok(&text[h.end..other.start]) {
                    break;
                }
                let other_parts = &self.parts[other.word as usize];
                let hit = parts.iter().find_map(|&(g, part)| {
                    other_parts.iter().any(|&(g2, part2)| g2 == g && part2 != part).then_some(g)
                });
                if let Some(g) = hit {
                    found.push(TermMatch { start: h.start, end: other.end, concept: self.glosses[g as usize].0 });
                    break;
                }
            }
        }
        // Leftmost, then shortest; drop what overlaps a kept match.
        found.sort_by_key(|m| (m.start, m.end));
        let mut out: Vec<TermMatch> = Vec::with_capacity(found.len());
        for m in found {
            if out.last().is_none_or(|l| m.start >= l.end) {
                out.push(m);
            }
        }
        out
    }

    /// The gloss matches in `text[start..end]` (one sentence), in text order, non-overlapping.
    pub fn find(&self, text: &str, start: usize, end: usize) -> Vec<TermMatch> {
        let hits: Vec<Hit> = self.hits(&text[..end]).into_iter().filter(|h| h.start >= start).collect();
        self.pairs(text, &hits)
    }
}

/// Whether the text between two gloss words keeps them in one phrase: at most `MAX_GAP` words, no breaker word,
/// no punctuation but hyphens and apostrophes.
fn gap_ok(gap: &str) -> bool {
    let mut words = 0;
    for piece in gap.split(|c: char| c.is_whitespace() || c == '-' || c == '\'') {
        if piece.is_empty() {
            continue;
        }
        if !piece.chars().all(char::is_alphanumeric) {
            return false;
        }
        words += 1;
        if words > MAX_GAP || BREAKERS.iter().any(|b| piece.eq_ignore_ascii_case(b)) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glosses() -> (std::sync::Arc<Lexicon>, Glosses) {
        let lexicon = Lexicon::builtin();
        let g = Glosses::builtin(&lexicon);
        (lexicon, g)
    }

    fn found(g: &Glosses, lexicon: &Lexicon, text: &str) -> Vec<(String, String)> {
        g.find(text, 0, text.len())
            .into_iter()
            .map(|m| (text[m.start..m.end].to_string(), lexicon.concept(m.concept).preferred.to_lowercase()))
            .collect()
    }

    #[test]
    fn the_builtin_table_glosses_the_lexicons_compounds() {
        let (_, g) = glosses();
        let terms: Vec<&str> = g.terms().collect();
        for t in ["pneumothorax", "hemothorax", "cardiomegaly", "hepatomegaly", "splenomegaly", "pneumoperitoneum"] {
            assert!(terms.contains(&t), "{t} not glossed: {terms:?}");
        }
        // Only compounds: no word is glossed that is not prefix + suffix.
        assert!(!terms.contains(&"pneumonia") && !terms.contains(&"thorax"), "{terms:?}");
    }

    #[test]
    fn plain_phrasings_find_the_compound() {
        let (lexicon, g) = glosses();
        let cases = [
            ("Small pleural air collection at the apex.", "pleural air", "pneumothorax"),
            ("There is air in the right pleural space.", "air in the right pleural", "pneumothorax"),
            (
                "The cardiac silhouette is moderately enlarged.",
                "cardiac silhouette is moderately enlarged",
                "cardiomegaly",
            ),
            ("Enlargement of the heart.", "Enlargement of the heart", "cardiomegaly"),
            ("The liver is enlarged.", "liver is enlarged", "hepatomegaly"),
            ("Blood in the pleural space.", "Blood in the pleural", "hemothorax"),
            // A negation between the parts keeps them one phrase (the mention stage starts after the cue).
            ("The heart is not enlarged.", "heart is not enlarged", "cardiomegaly"),
            ("The heart is not significantly enlarged.", "heart is not significantly enlarged", "cardiomegaly"),
            ("The pleural spaces without air.", "pleural spaces without air", "pneumothorax"),
        ];
        for (text, span, concept) in cases {
            let f = found(&g, &lexicon, text);
            assert_eq!(f.len(), 1, "{text}: {f:?}");
            assert_eq!(f[0].0, span, "{text}");
            assert!(f[0].1.contains(concept), "{text}: {f:?}");
        }
    }

    #[test]
    fn breakers_distance_and_other_sentences_stop_a_gloss() {
        let (lexicon, g) = glosses();
        for text in [
            "No pleural effusion or air space disease.",
            "Heart size normal, large hiatal hernia.",
            "Air is seen in the bowel; the pleural spaces are clear.",
            "The heart appears to be somewhat mildly enlarged.",
            "Pleural thickening versus fluid.",
            "Liver: not enlarged",
            "The heart is not small and enlarged.",
            "The heart is not at all enlarged.",
        ] {
            assert!(found(&g, &lexicon, text).is_empty(), "{text}: {:?}", found(&g, &lexicon, text));
        }
        // Only inside the range given (one sentence).
        let text = "The heart. Enlarged nodes.";
        assert!(g.find(text, 0, 10).is_empty() && g.find(text, 10, text.len()).is_empty());
        assert_eq!(g.find(text, 0, text.len()).len(), 0, "the full stop breaks it");
    }

    /// The gloss words found from the matcher's split of a text are the automaton's whole-word matches: on real
    /// notes, on texts built from gloss words, their prefixes, case changes and punctuation, and on non-ASCII text.
    #[test]
    fn gloss_words_from_the_word_split_are_the_automatons() {
        let (lexicon, g) = glosses();
        let words = g.vocab_words();
        assert!(words.len() > 10, "{words:?}");
        let mut texts: Vec<String> = vec![
            include_str!("../../tests/fixtures/mtsamples/1288-soap--chart--progress-notes.txt").to_string(),
            include_str!("../../tests/fixtures/mtsamples/17-cardiovascular--pulmonary.txt").to_string(),
            "Air in the right pleural space; AIR-pleural? the Heart is enlarged.".to_string(),
            "café air\u{e9}pleural air\u{e9} heart\u{2014}enlarged".to_string(),
        ];
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let seps = [" ", "  ", "-", ",", "'", "\n", "", "x", "7", ". "];
        for _ in 0..2000 {
            let mut t = String::new();
            for _ in 0..next(8) {
                let w = words[next(words.len())];
                let w = match next(4) {
                    0 => w.to_ascii_uppercase(),
                    1 => w[..next(w.len()) + 1].to_string(),
                    _ => w.to_string(),
                };
                t.push_str(&w);
                t.push_str(seps[next(seps.len())]);
            }
            texts.push(t);
        }
        let mut found = 0;
        for text in &texts {
            let p = crate::lexicon::matcher::prepare(text);
            let (a, b) = (g.hits(text), g.hits_prepared(text, &p));
            let key = |h: &Vec<Hit>| h.iter().map(|h| (h.start, h.end, h.word)).collect::<Vec<_>>();
            assert_eq!(key(&a), key(&b), "{text:?}");
            found += a.len();
        }
        assert!(found > 1000, "{found}");
        // And through the lexicon, with its matches.
        let text = "Air in the right pleural space; no chest pain.";
        let plain = lexicon.with_extra(&[]).unwrap();
        assert_eq!(plain.find_with_gloss_hits(text), (lexicon.find(text), Vec::new()));
        let glossed = lexicon.with_extra(&[]).unwrap().with_glosses(Glosses::builtin(&lexicon));
        let (matches, hits) = glossed.find_with_gloss_hits(text);
        assert_eq!(matches, lexicon.find(text));
        assert_eq!(hits.iter().map(|h| &text[h.start..h.end]).collect::<Vec<_>>(), ["Air", "pleural"]);
    }

    #[test]
    fn bad_tables_are_errors() {
        let lexicon = Lexicon::builtin();
        for table in ["pneumo\tprefix", "pneumo\tmiddle\tair", "pneumo\tprefix\tAir", "pneumo\tprefix\t"] {
            assert!(Glosses::new(&lexicon, table).is_err(), "{table:?}");
        }
        let g = Glosses::new(&lexicon, "# nothing\n").unwrap();
        assert!(g.is_empty() && g.find("air in the pleural space", 0, 24).is_empty());
    }
}
