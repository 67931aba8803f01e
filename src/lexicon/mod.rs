//! The entity lexicon and the phrase matcher.
//!
//! The lexicon (`data/lexicon/`, built by `tools/build_lexicon.py` from open vocabularies, compiled into the
//! binary) maps terms to canonical concepts of six kinds. `Lexicon::builtin()` loads it once per process and builds
//! one automaton over every term; callers add their own terms (CLEAR variable synonyms) with `Lexicon::with_extra`.
//! Matching: ASCII case folding except for abbreviations (case-sensitive), word boundaries, whitespace runs
//! tolerated, longest-leftmost non-overlapping.

pub mod matcher;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use matcher::PhraseMatcher;

pub use crate::model::EntityKind;

/// The vocabulary data could not be read or compiled (a build-time data error, or variable synonyms the matcher
/// cannot take). The message names the file line or the phrase's position, never a note's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LexiconError(pub String);

const CONCEPTS_TSV: &str = include_str!("../../data/lexicon/concepts.tsv");
const TERMS_TSV: &str = include_str!("../../data/lexicon/terms.tsv");
const VERSION: &str = include_str!("../../data/lexicon/VERSION");

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
    concepts: Vec<Concept>,
    /// Parent concepts (Disease Ontology `subClassOf`, MeSH tree parents), by concept index.
    parents: Vec<Vec<u32>>,
    by_id: HashMap<String, u32>,
    /// Concept of each matcher phrase.
    term_concept: Vec<u32>,
    /// (term, case_sensitive) of each matcher phrase, kept to rebuild with extra terms.
    terms: Vec<(String, bool)>,
    /// Built on first use: the built-in lexicon is usually only the base of `with_extra`.
    matcher: OnceLock<Result<PhraseMatcher, LexiconError>>,
    version: String,
}

impl std::fmt::Debug for Lexicon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lexicon").field("concepts", &self.concepts.len()).field("version", &self.version).finish()
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
    /// The built-in lexicon, parsed and compiled once per process.
    pub fn builtin() -> Arc<Lexicon> {
        static LEX: OnceLock<Arc<Lexicon>> = OnceLock::new();
        LEX.get_or_init(|| Arc::new(Lexicon::parse(CONCEPTS_TSV, TERMS_TSV, VERSION.trim()).expect("built-in lexicon")))
            .clone()
    }

    pub fn parse(concepts_tsv: &str, terms_tsv: &str, version: &str) -> Result<Self, LexiconError> {
        let mut concepts = Vec::new();
        let mut by_id = HashMap::new();
        let mut parent_ids: Vec<&str> = Vec::new();
        for (n, line) in concepts_tsv.lines().enumerate().filter(|(_, l)| !l.starts_with('#') && !l.is_empty()) {
            let c: Vec<&str> = line.split('\t').collect();
            let [id, kind, preferred, codes, parents] = c[..] else {
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
        let mut terms = Vec::new();
        let mut term_concept = Vec::new();
        for (n, line) in terms_tsv.lines().enumerate().filter(|(_, l)| !l.starts_with('#') && !l.is_empty()) {
            let c: Vec<&str> = line.split('\t').collect();
            let [term, id, case_sensitive, ..] = c[..] else {
                return Err(LexiconError(format!("terms line {}", n + 1)));
            };
            let concept =
                *by_id.get(id).ok_or_else(|| LexiconError(format!("terms line {}: unknown concept", n + 1)))?;
            terms.push((term.to_string(), case_sensitive == "1"));
            term_concept.push(concept);
        }
        Ok(Self {
            concepts,
            parents,
            by_id,
            term_concept,
            terms,
            matcher: OnceLock::new(),
            version: version.to_string(),
        })
    }

    /// A copy with extra terms (variable synonyms); new concept ids become new concepts.
    pub fn with_extra(&self, extra: &[ExtraTerm]) -> Result<Self, LexiconError> {
        let mut concepts = self.concepts.clone();
        let mut parents = self.parents.clone();
        let mut by_id = self.by_id.clone();
        let mut terms = self.terms.clone();
        let mut term_concept = self.term_concept.clone();
        for e in extra {
            let idx = *by_id.entry(e.concept_id.clone()).or_insert_with(|| {
                concepts.push(Concept {
                    id: e.concept_id.clone(),
                    kind: e.kind,
                    preferred: e.preferred.clone(),
                    codes: vec![],
                });
                parents.push(Vec::new());
                (concepts.len() - 1) as u32
            });
            terms.push((e.text.to_lowercase(), false));
            term_concept.push(idx);
        }
        let lexicon = Self {
            concepts,
            parents,
            by_id,
            term_concept,
            terms,
            matcher: OnceLock::new(),
            version: self.version.clone(),
        };
        lexicon.warm()?;
        Ok(lexicon)
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn concepts(&self) -> &[Concept] {
        &self.concepts
    }

    pub fn concept(&self, index: u32) -> &Concept {
        &self.concepts[index as usize]
    }

    pub fn concept_index(&self, id: &str) -> Option<u32> {
        self.by_id.get(id).copied()
    }

    /// The concepts and all their descendants (children, grandchildren, ...).
    pub fn with_descendants(&self, roots: &[u32]) -> std::collections::HashSet<u32> {
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (child, ps) in self.parents.iter().enumerate() {
            for p in ps {
                children.entry(*p).or_default().push(child as u32);
            }
        }
        let mut seen: std::collections::HashSet<u32> = roots.iter().copied().collect();
        let mut queue: Vec<u32> = roots.to_vec();
        while let Some(c) = queue.pop() {
            for &k in children.get(&c).map(Vec::as_slice).unwrap_or(&[]) {
                if seen.insert(k) {
                    queue.push(k);
                }
            }
        }
        seen
    }

    /// Every term (lower-cased unless case-sensitive) with its concept index.
    pub fn terms(&self) -> impl Iterator<Item = (&str, u32)> {
        self.terms.iter().zip(&self.term_concept).map(|((t, _), c)| (t.as_str(), *c))
    }

    /// Builds the automaton now (it is otherwise built on first use); reports a build failure.
    pub fn warm(&self) -> Result<(), LexiconError> {
        self.matcher().map(|_| ())
    }

    fn matcher(&self) -> Result<&PhraseMatcher, LexiconError> {
        self.matcher
            .get_or_init(|| PhraseMatcher::new(self.terms.iter().map(|(t, cs)| (t.as_str(), *cs))))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Longest-leftmost matches of lexicon terms in `text`.
    pub fn find(&self, text: &str) -> Vec<TermMatch> {
        let Ok(matcher) = self.matcher() else { return Vec::new() };
        matcher
            .find(text)
            .into_iter()
            .map(|m| TermMatch { start: m.start, end: m.end, concept: self.term_concept[m.phrase as usize] })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_lexicon_finds_the_six_kinds() {
        let lex = Lexicon::builtin();
        assert!(lex.concepts().len() > 10_000);
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
