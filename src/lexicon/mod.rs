//! The entity lexicon and the phrase matcher.
//!
//! The lexicon (`data/lexicon/`, built by `tools/build_lexicon.py` from open vocabularies, compiled into the
//! binary) maps terms to canonical concepts of six kinds. `Lexicon::builtin()` loads it once per process with the
//! trie over every term that `build.rs` compiled from the same file (so start-up reads it instead of building
//! it); callers add their own terms (CLEAR variable synonyms) with `Lexicon::with_extra`, which compiles a second,
//! small trie over those terms only and searches both.
//! Matching: ASCII case folding except for abbreviations (case-sensitive), word boundaries, whitespace runs
//! tolerated, longest-leftmost non-overlapping.

pub mod compile;
pub mod gloss;
pub mod matcher;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use matcher::{PhraseMatcher, find_all_of_prepared, select_longest};

pub use crate::model::EntityKind;

/// The vocabulary data could not be read or compiled (a build-time data error, or variable synonyms the matcher
/// cannot take). The message names the file line or the phrase's position, never a note's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LexiconError(pub String);

const CONCEPTS_TSV: &str = include_str!("../../data/lexicon/concepts.tsv");
const TERMS_TSV: &str = include_str!("../../data/lexicon/terms.tsv");
const VERSION: &str = include_str!("../../data/lexicon/VERSION");
/// `TERMS_TSV`'s phrase trie, compiled by `build.rs` (`compile::Compiled::to_bytes`).
const COMPILED_TERMS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lexicon-terms.trie"));

/// A canonical concept: id (`DOID:…`, `MESH:…`, `SYMP:…`, `CS:…`), kind, preferred term, source codes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Concept {
    pub id: String,
    pub kind: EntityKind,
    pub preferred: String,
    pub codes: Vec<String>,
}

/// One occurrence of a lexicon term in a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermMatch {
    pub start: usize,
    pub end: usize,
    /// Index into `Lexicon::concepts`.
    pub concept: u32,
}

pub struct Lexicon {
    /// The parsed vocabulary: shared, never copied, by every `with_extra` lexicon built on it.
    base: Arc<Base>,
    /// What `with_extra` added: concepts (indexes after the base's), their ids, terms (phrase indexes after the
    /// base's) and the small matcher over those terms.
    extra_concepts: Vec<Concept>,
    extra_by_id: HashMap<String, u32>,
    extra_terms: Vec<(String, bool)>,
    extra_term_concept: Vec<u32>,
    extra: Option<PhraseMatcher>,
    /// The glosses of this lexicon's compound terms (`with_glosses`), used by the mentions stage and alignment.
    glosses: Option<gloss::Glosses>,
    version: String,
}

struct Base {
    concepts: Vec<Concept>,
    /// Parent concepts (Disease Ontology `subClassOf`, MeSH tree parents), by concept index.
    parents: Vec<Vec<u32>>,
    /// The inverse of `parents` (children by concept index), built on first use.
    children: OnceLock<Vec<Vec<u32>>>,
    /// Concept ids are our own data, not input: the fast non-keyed hash is fine (start-up inserts 21k and looks
    /// up 92k).
    by_id: rustc_hash::FxHashMap<String, u32>,
    /// (term, case_sensitive) of each matcher phrase, and its concept.
    terms: TermTexts,
    term_concept: Vec<u32>,
    /// The matcher over `terms`: loaded from the build-time trie for the built-in lexicon, otherwise built on
    /// first use.
    matcher: OnceLock<Result<PhraseMatcher, LexiconError>>,
}

impl Base {
    fn matcher(&self) -> Result<&PhraseMatcher, LexiconError> {
        self.matcher.get_or_init(|| PhraseMatcher::new(self.terms.iter())).as_ref().map_err(Clone::clone)
    }
}

impl std::fmt::Debug for Lexicon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lexicon").field("concepts", &self.concept_count()).field("version", &self.version).finish()
    }
}

/// An extra term for `Lexicon::with_extra`: the text maps to an existing concept id, or to a new concept.
#[derive(Debug, Clone)]
pub struct ExtraTerm {
    pub text: String,
    pub concept_id: String,
    /// Kind and preferred term when `concept_id` is new.
    pub kind: EntityKind,
    pub preferred: String,
}

impl Lexicon {
    /// The built-in lexicon, parsed once per process, with the trie `build.rs` compiled from the same terms.
    pub fn builtin() -> Arc<Lexicon> {
        static LEX: OnceLock<Arc<Lexicon>> = OnceLock::new();
        LEX.get_or_init(|| {
            let lexicon = Lexicon::parse(CONCEPTS_TSV, TERMS_TSV, VERSION.trim()).expect("built-in lexicon");
            let matcher = PhraseMatcher::from_compiled(COMPILED_TERMS, lexicon.base.terms.iter())
                .expect("the build-time trie of the built-in lexicon");
            let _ = lexicon.base.matcher.set(Ok(matcher));
            Arc::new(lexicon)
        })
        .clone()
    }

    pub fn parse(concepts_tsv: &str, terms_tsv: &str, version: &str) -> Result<Self, LexiconError> {
        let mut concepts = Vec::new();
        let mut by_id = rustc_hash::FxHashMap::default();
        let mut parent_ids: Vec<&str> = Vec::new();
        for (n, line) in lines(concepts_tsv).enumerate().filter(|(_, l)| !l.starts_with('#') && !l.is_empty()) {
            let mut c = fields(line);
            let (Some(id), Some(kind), Some(preferred), Some(codes), Some(parents), None) =
                (c.next(), c.next(), c.next(), c.next(), c.next(), c.next())
            else {
                return Err(LexiconError(format!("concepts line {}", n + 1)));
            };
            parent_ids.push(parents);
            let kind =
                EntityKind::parse(kind).ok_or_else(|| LexiconError(format!("concepts line {}: kind {kind}", n + 1)))?;
            by_id.insert(id.to_string(), concepts.len() as u32);
            concepts.push(Concept {
                id: id.to_string(),
                kind,
                preferred: preferred.to_string(),
                codes: codes.split('|').filter(|s| !s.is_empty()).map(str::to_string).collect(),
            });
        }
        let parents =
            parent_ids.iter().map(|ps| ps.split('|').filter_map(|p| by_id.get(p).copied()).collect()).collect();
        let mut terms = TermTexts::default();
        let mut term_concept = Vec::new();
        for (n, line) in lines(terms_tsv).enumerate().filter(|(_, l)| !l.starts_with('#') && !l.is_empty()) {
            let mut c = fields(line);
            let (Some(term), Some(id), Some(case_sensitive)) = (c.next(), c.next(), c.next()) else {
                return Err(LexiconError(format!("terms line {}", n + 1)));
            };
            let concept =
                *by_id.get(id).ok_or_else(|| LexiconError(format!("terms line {}: unknown concept", n + 1)))?;
            terms.push(term, case_sensitive == "1");
            term_concept.push(concept);
        }
        let base =
            Base { concepts, parents, children: OnceLock::new(), by_id, terms, term_concept, matcher: OnceLock::new() };
        Ok(Self {
            base: Arc::new(base),
            extra_concepts: Vec::new(),
            extra_by_id: HashMap::new(),
            extra_terms: Vec::new(),
            extra_term_concept: Vec::new(),
            extra: None,
            glosses: None,
            version: version.to_string(),
        })
    }

    /// This lexicon with the glosses of its compound terms (built for it: `gloss::Glosses::builtin(&lexicon)`).
    /// `with_extra` does not carry them over (its terms differ).
    pub fn with_glosses(mut self, glosses: gloss::Glosses) -> Self {
        self.glosses = Some(glosses);
        self
    }

    /// The glosses, when the lexicon has them.
    pub fn glosses(&self) -> Option<&gloss::Glosses> {
        self.glosses.as_ref()
    }

    /// A lexicon with extra terms (variable synonyms) on top of this one's; new concept ids become new concepts.
    /// The parsed base is shared, not copied, and its trie is reused: only the extra terms are compiled.
    pub fn with_extra(&self, extra: &[ExtraTerm]) -> Result<Self, LexiconError> {
        self.base.matcher()?;
        let mut out = Self {
            base: self.base.clone(),
            extra_concepts: self.extra_concepts.clone(),
            extra_by_id: self.extra_by_id.clone(),
            extra_terms: self.extra_terms.clone(),
            extra_term_concept: self.extra_term_concept.clone(),
            extra: None,
            glosses: None,
            version: self.version.clone(),
        };
        for e in extra {
            let idx = match out.concept_index(&e.concept_id) {
                Some(idx) => idx,
                None => {
                    let idx = out.concept_count() as u32;
                    out.extra_concepts.push(Concept {
                        id: e.concept_id.clone(),
                        kind: e.kind,
                        preferred: e.preferred.clone(),
                        codes: vec![],
                    });
                    out.extra_by_id.insert(e.concept_id.clone(), idx);
                    idx
                }
            };
            out.extra_terms.push((e.text.to_lowercase(), false));
            out.extra_term_concept.push(idx);
        }
        out.extra = Some(PhraseMatcher::new(out.extra_terms.iter().map(|(t, c)| (t.as_str(), *c)))?);
        Ok(out)
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    fn concept_count(&self) -> usize {
        self.base.concepts.len() + self.extra_concepts.len()
    }

    /// Every concept, in index order (`TermMatch::concept` indexes this sequence).
    pub fn concepts(&self) -> impl Iterator<Item = &Concept> {
        self.base.concepts.iter().chain(&self.extra_concepts)
    }

    pub fn concept(&self, index: u32) -> &Concept {
        let i = index as usize;
        self.base.concepts.get(i).unwrap_or_else(|| &self.extra_concepts[i - self.base.concepts.len()])
    }

    pub fn concept_index(&self, id: &str) -> Option<u32> {
        self.base.by_id.get(id).or_else(|| self.extra_by_id.get(id)).copied()
    }

    /// The concepts and all their descendants (children, grandchildren, ...). Concepts added by `with_extra` have
    /// neither parents nor children.
    pub fn with_descendants(&self, roots: &[u32]) -> std::collections::HashSet<u32> {
        let children = self.base.children.get_or_init(|| {
            let mut children = vec![Vec::new(); self.base.parents.len()];
            for (child, ps) in self.base.parents.iter().enumerate() {
                for &p in ps {
                    children[p as usize].push(child as u32);
                }
            }
            children
        });
        let mut seen: std::collections::HashSet<u32> = roots.iter().copied().collect();
        let mut queue: Vec<u32> = roots.to_vec();
        while let Some(c) = queue.pop() {
            for &k in children.get(c as usize).map(Vec::as_slice).unwrap_or(&[]) {
                if seen.insert(k) {
                    queue.push(k);
                }
            }
        }
        seen
    }

    /// Every term (lower-cased unless case-sensitive) with its concept index.
    pub fn terms(&self) -> impl Iterator<Item = (&str, u32)> {
        let base = self.base.terms.iter().zip(self.base.term_concept.iter().copied()).map(|((t, _), c)| (t, c));
        base.chain(self.extra_terms.iter().zip(&self.extra_term_concept).map(|((t, _), c)| (t.as_str(), *c)))
    }

    /// Builds the trie now (it is otherwise built on first use); reports a build failure.
    pub fn warm(&self) -> Result<(), LexiconError> {
        self.base.matcher().map(|_| ())
    }

    /// The concept of the term whose text is exactly `text` (the last such term), if the lexicon has one.
    pub fn term_concept(&self, text: &str) -> Option<u32> {
        let extra = self.extra.as_ref().and_then(|m| {
            let found = m.exact(text).into_iter().filter(|&p| self.extra_terms[p as usize].0 == text).max();
            found.map(|p| self.extra_term_concept[p as usize])
        });
        extra.or_else(|| {
            let found = self.base.matcher().ok()?.exact(text);
            let found = found.into_iter().filter(|&p| self.base.terms.get(p as usize) == text).max();
            found.map(|p| self.base.term_concept[p as usize])
        })
    }

    /// Longest-leftmost matches of lexicon terms in `text`.
    pub fn find(&self, text: &str) -> Vec<TermMatch> {
        self.find_prepared(text, &matcher::prepare(text))
    }

    /// `find`, and the gloss words of the text (`gloss::Glosses::hits`; none without glosses), from one split of
    /// the text into words.
    pub fn find_with_gloss_hits(&self, text: &str) -> (Vec<TermMatch>, Vec<gloss::Hit>) {
        self.find_with_gloss_hits_prepared(text, &matcher::prepare(text))
    }

    /// `find_with_gloss_hits` on a text already prepared (`matcher::prepare(text)`), for callers that read its
    /// words again (the ConText cues of each sentence).
    pub fn find_with_gloss_hits_prepared(
        &self,
        text: &str,
        prepared: &matcher::Prepared,
    ) -> (Vec<TermMatch>, Vec<gloss::Hit>) {
        let hits = self.glosses.as_ref().map(|g| g.hits_prepared(text, prepared)).unwrap_or_default();
        (self.find_prepared(text, prepared), hits)
    }

    fn find_prepared(&self, text: &str, prepared: &matcher::Prepared) -> Vec<TermMatch> {
        let Ok(base) = self.base.matcher() else { return Vec::new() };
        let n = self.base.terms.len() as u32;
        let found = match &self.extra {
            Some(extra) => find_all_of_prepared(&[(base, 0), (extra, n)], text, prepared),
            None => find_all_of_prepared(&[(base, 0)], text, prepared),
        };
        select_longest(found)
            .into_iter()
            .map(|m| {
                let concept = match m.phrase.checked_sub(n) {
                    Some(p) => self.extra_term_concept[p as usize],
                    None => self.base.term_concept[m.phrase as usize],
                };
                TermMatch { start: m.start, end: m.end, concept }
            })
            .collect()
    }
}

/// Term texts in one buffer: start-up parses 92k of them, one allocation instead of one each.
#[derive(Default)]
struct TermTexts {
    text: String,
    /// (start, end, case_sensitive) in `text`.
    spans: Vec<(u32, u32, bool)>,
}

impl TermTexts {
    fn push(&mut self, term: &str, case_sensitive: bool) {
        let start = self.text.len() as u32;
        self.text.push_str(term);
        self.spans.push((start, self.text.len() as u32, case_sensitive));
    }

    fn len(&self) -> usize {
        self.spans.len()
    }

    fn get(&self, i: usize) -> &str {
        let (a, b, _) = self.spans[i];
        &self.text[a as usize..b as usize]
    }

    fn iter(&self) -> impl Iterator<Item = (&str, bool)> + Clone {
        self.spans.iter().map(|&(a, b, cs)| (&self.text[a as usize..b as usize], cs))
    }
}

/// The lines of a TSV file (`\n` or `\r\n`), found with SIMD `memchr` (start-up parses 114k of them).
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    memchr::memchr_iter(b'\n', text.as_bytes()).chain(std::iter::once(text.len())).filter_map(move |end| {
        if start > text.len() {
            return None;
        }
        let line = &text[start..end];
        start = end + 1;
        Some(line.strip_suffix('\r').unwrap_or(line))
    })
}

/// The tab-separated fields of a line.
fn fields(line: &str) -> impl Iterator<Item = &str> {
    let mut start = 0;
    memchr::memchr_iter(b'\t', line.as_bytes()).chain(std::iter::once(line.len())).map(move |end| {
        let field = &line[start..end];
        start = end + 1;
        field
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_lexicon_finds_the_six_kinds() {
        let lex = Lexicon::builtin();
        assert!(lex.concepts().count() > 10_000);
        assert!(lex.version().starts_with("clinstream-lexicon-"));
        let text =
            "Pt with HTN and chest pain, on aspirin; CBC ordered; CT scan of the abdomen showed pleural effusions.";
        let found: Vec<(&str, EntityKind)> =
            lex.find(text).iter().map(|m| (&text[m.start..m.end], lex.concept(m.concept).kind)).collect();
        for expected in [
            ("HTN", EntityKind::Disease),
            ("chest pain", EntityKind::Symptom),
            ("aspirin", EntityKind::Medication),
            ("CBC", EntityKind::Lab),
            ("abdomen", EntityKind::Anatomy),
            ("pleural effusions", EntityKind::Disease),
        ] {
            assert!(found.contains(&expected), "{expected:?} not in {found:?}");
        }
        assert!(!found.iter().any(|(t, _)| *t == "Pt"), "stop words are not entities: {found:?}");
    }

    /// Body parts are named in both numbers: MeSH's plural headings have their singular ("Joints" → "joint"),
    /// short names their plural ("leg" → "legs"), each the same concept; words that are no regular plural keep
    /// their form ("pons", "pelvis") and give no false singular.
    #[test]
    fn body_parts_are_named_in_both_numbers() {
        let lex = Lexicon::builtin();
        for (one, many) in [("joint", "joints"), ("extremity", "extremities"), ("finger", "fingers"), ("leg", "legs")] {
            let (a, b) = (lex.term_concept(one), lex.term_concept(many));
            assert!(a.is_some() && a == b, "{one} / {many}: {a:?} {b:?}");
            assert_eq!(lex.concept(a.unwrap()).kind, EntityKind::Anatomy, "{one}");
        }
        assert!(lex.term_concept("pons").is_some());
        for junk in ["pon", "pelvi", "cortice", "factor viiis"] {
            assert!(lex.term_concept(junk).is_none(), "{junk}");
        }
    }

    #[test]
    fn tsv_lines_and_fields() {
        let text = "a\tb\r\n#c\n\nd\te\tf";
        let got: Vec<Vec<&str>> = lines(text).map(|l| fields(l).collect()).collect();
        assert_eq!(got, vec![vec!["a", "b"], vec!["#c"], vec![""], vec!["d", "e", "f"]]);
        assert_eq!(lines("x\n").collect::<Vec<_>>(), vec!["x", ""]);
        let std_lines: Vec<&str> = TERMS_TSV.lines().collect();
        assert_eq!(
            lines(TERMS_TSV).filter(|l| !l.is_empty()).collect::<Vec<_>>(),
            std_lines.into_iter().filter(|l| !l.is_empty()).collect::<Vec<_>>()
        );
    }

    /// The trie compiled at build time finds exactly what one compiled now from the same terms finds, and a
    /// compiled form of other phrases (or a damaged one) is refused.
    #[test]
    fn the_build_time_trie_matches_one_built_now() {
        let loaded = Lexicon::builtin();
        let built = Lexicon::parse(CONCEPTS_TSV, TERMS_TSV, VERSION.trim()).unwrap();
        built.warm().unwrap();
        let texts = [
            "Pt with HTN, DM2 and CHF; no chest pain. MS and ms. Pleural  effusions\nbilaterally; s/p CABG.",
            include_str!("../../tests/fixtures/mtsamples/1288-soap--chart--progress-notes.txt"),
            include_str!("../../tests/fixtures/mtsamples/17-cardiovascular--pulmonary.txt"),
            include_str!("../../tests/fixtures/mtsamples/1948-pain-management.txt"),
        ];
        for text in texts {
            let (a, b) = (loaded.find(text), built.find(text));
            assert!(a.len() > 3);
            assert_eq!(a, b);
        }
        let terms = loaded.base.terms.iter();
        assert!(PhraseMatcher::from_compiled(COMPILED_TERMS, terms.clone().take(10)).is_err());
        let mut damaged = COMPILED_TERMS.to_vec();
        damaged.truncate(damaged.len() / 2);
        assert!(PhraseMatcher::from_compiled(&damaged, terms.clone()).is_err());
        assert!(PhraseMatcher::from_compiled(b"not an automaton", terms).is_err());
    }

    #[test]
    fn exact_term_lookup() {
        let lex = Lexicon::builtin();
        let htn = lex.term_concept("htn").expect("htn is a term");
        assert_eq!(lex.concept(htn).id, "DOID:10763");
        assert_eq!(lex.term_concept("htn and"), None);
        assert_eq!(lex.term_concept("ht"), None);
        let by_map: HashMap<&str, u32> = lex.terms().collect();
        for t in ["chest pain", "aspirin", "MS", "pleural effusions"] {
            assert_eq!(lex.term_concept(t), by_map.get(t).copied(), "{t}");
        }
    }

    #[test]
    fn descendants_follow_the_hierarchies() {
        let lex = Lexicon::builtin();
        let pneumonia = lex.concept_index("DOID:552").unwrap();
        let all = lex.with_descendants(&[pneumonia]);
        let names: Vec<&str> = all.iter().map(|&c| lex.concept(c).preferred.as_str()).collect();
        assert!(names.contains(&"aspiration pneumonia") && names.contains(&"bacterial pneumonia"), "{names:?}");
        assert!(!names.contains(&"asthma"));
    }

    #[test]
    fn extra_terms_map_to_new_or_existing_concepts() {
        let lex = Lexicon::builtin();
        let extra = lex
            .with_extra(&[ExtraTerm {
                text: "enlarged cardiac silhouette".into(),
                concept_id: "MESH:D006332".into(),
                kind: EntityKind::Disease,
                preferred: "cardiomegaly".into(),
            }])
            .unwrap();
        let text = "There is an enlarged cardiac silhouette.";
        let m = extra.find(text);
        assert_eq!(m.len(), 1);
        assert_eq!(extra.concept(m[0].concept).id, "MESH:D006332");
    }
}
