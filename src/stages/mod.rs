//! The pure stages: synchronous functions, no I/O, no async runtime. Each file is one stage; `Pipeline` runs
//! them in order for one event.
//!
//! In: the bytes of one event. Out: a `Document` (note, sections, sentences, mentions, variables) or a `Rejected` carrying the
//! dead-letter code and, when it was already known, the document id. Never panics (fuzzed: `fuzz/`).

pub mod assertion;
pub mod attachment;
pub mod charset;
pub mod chunk;
pub mod clear;
pub mod decode;
pub mod html;
pub mod kg;
pub mod mentions;
pub mod pdf;
pub mod rtf;
pub mod sections;
pub mod sentences;

use std::sync::{Arc, Mutex, OnceLock};

use crate::config::{ConfigError, Settings};
use crate::error::DocError;
use crate::lexicon::Lexicon;
use crate::model::Document;
pub use crate::model::Timings;

/// Why one event produced no document: the error, and the document id when it was read before the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub error: DocError,
    pub doc_id: Option<String>,
}

/// The settings that name things only the stages know (canonical section names, supported content types),
/// checked against the stages' tables. Part of `Pipeline::new`, so every command checks them before its first
/// event; `config.rs` itself imports nothing from the crate.
pub fn check_names(settings: &Settings) -> Result<(), ConfigError> {
    let mut problems = Vec::new();
    for (i, ct) in settings.decode.content_type_preference.iter().enumerate() {
        if !attachment::SUPPORTED_CONTENT_TYPES.contains(&ct.to_ascii_lowercase().as_str()) {
            problems.push(format!(
                "decode.content_type_preference[{i}]: `{ct}` is not a supported content type (supported: {})",
                attachment::SUPPORTED_CONTENT_TYPES.join(", ")
            ));
        }
    }
    for name in settings.sections.weights.keys() {
        if !sections::CANONICAL_SECTIONS.contains(&name.as_str()) {
            problems.push(format!(
                "sections.weights.{name}: unknown section name (known: {})",
                sections::CANONICAL_SECTIONS.join(", ")
            ));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(problems)) }
}

/// The stage parameters, resolved from settings once and shared by every worker thread.
#[derive(Debug, Clone)]
pub struct Pipeline {
    decode: decode::DecodeParams,
    sections: sections::SectionParams,
    sentences: sentences::SentenceParams,
    assertion: assertion::AssertionParams,
    compiled: Arc<Compiled>,
}

/// The lexicon extended with the variables' synonyms, and the compiled variables.
#[derive(Debug)]
pub struct Compiled {
    pub lexicon: Lexicon,
    pub variables: Vec<clear::Variable>,
    /// The variables of each target concept.
    pub targets: clear::TargetIndex,
    /// The knowledge-graph node id of each concept, hashed once per process.
    pub kg_ids: kg::ConceptIds,
}

type CompiledCache = Mutex<Vec<(crate::config::ClearSettings, Arc<Compiled>)>>;

impl Pipeline {
    /// Resolves settings and compiles the lexicon with the CLEAR variables (once per distinct variable set in a
    /// process). Fails with a message naming the variable and field when a definition is wrong.
    pub fn new(settings: &Settings) -> Result<Self, ConfigError> {
        check_names(settings)?;
        static CACHE: OnceLock<CompiledCache> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let found =
            cache.lock().expect("cache lock").iter().find(|(k, _)| *k == settings.clear).map(|(_, c)| c.clone());
        let compiled = match found {
            Some(c) => c,
            None => {
                let c = &settings.clear;
                let (lexicon, mut variables) =
                    clear::compile(&c.variables, c.window_words, c.token_budget, &Lexicon::builtin())?;
                clear::expand(&mut variables, &lexicon, clear::EXPANSION_TSV, c.expansion_min_score);
                let lexicon = if c.gloss_compounds {
                    let glosses = crate::lexicon::gloss::Glosses::builtin(&lexicon);
                    lexicon.with_glosses(glosses)
                } else {
                    lexicon
                };
                let targets = clear::TargetIndex::new(&variables);
                let kg_ids = kg::ConceptIds::new(&lexicon);
                let compiled = Arc::new(Compiled { lexicon, variables, targets, kg_ids });
                cache.lock().expect("cache lock").push((c.clone(), compiled.clone()));
                compiled
            }
        };
        Ok(Self {
            decode: decode::DecodeParams::from_settings(settings),
            sections: sections::SectionParams::from_settings(settings),
            sentences: sentences::SentenceParams::from_settings(settings),
            assertion: assertion::AssertionParams {
                forward_words: settings.assertion.forward_words,
                backward_words: settings.assertion.backward_words,
            },
            compiled,
        })
    }

    /// The compiled lexicon and variables, shared with the sinks.
    pub fn compiled(&self) -> Arc<Compiled> {
        self.compiled.clone()
    }

    pub fn lexicon(&self) -> &Lexicon {
        &self.compiled.lexicon
    }

    pub fn variables(&self) -> &[clear::Variable] {
        &self.compiled.variables
    }

    /// The text stages after decoding: sections, sentences, mentions, variables.
    pub fn analyse(&self, note: crate::model::Note) -> Document {
        let clock = std::time::Instant::now();
        let mut timings = Timings::default();
        let lap = |slot: &mut std::time::Duration, last: &mut std::time::Duration| {
            let now = clock.elapsed();
            *slot = now - *last;
            *last = now;
        };
        let mut last = std::time::Duration::ZERO;
        let sections = sections::split(&note.text, &self.sections);
        lap(&mut timings.sections, &mut last);
        let sentences = sentences::split(&note.text, &sections, &self.sentences);
        lap(&mut timings.sentences, &mut last);
        let mentions = mentions::extract(
            &note.text,
            &sections,
            &sentences,
            &self.compiled.lexicon,
            assertion::ContextRules::builtin(),
            &self.assertion,
        );
        lap(&mut timings.entities, &mut last);
        let variables =
            clear::evaluate(&note.text, &sections, &mentions, &self.compiled.variables, &self.compiled.targets);
        lap(&mut timings.variables, &mut last);
        let c = &self.compiled;
        let delta = kg::delta(&note, &sections, &mentions, &c.lexicon, &c.kg_ids, crate::WORKER_VERSION);
        lap(&mut timings.kg, &mut last);
        Document { note, sections, sentences, mentions, variables, kg: delta, timings }
    }

    /// Runs every stage over one event whose note is inline (a referenced one is `attachment_by_reference`).
    pub fn process(&self, bytes: &[u8]) -> Result<Document, Rejected> {
        match self.start(bytes)? {
            Step::Done(doc) => Ok(*doc),
            Step::Fetch(pending) => Err(Rejected {
                error: DocError::decode(
                    crate::error::ErrorCode::AttachmentByReference,
                    "the note is only available by attachment.url and this command does not fetch",
                ),
                doc_id: Some(pending.doc_id().to_string()),
            }),
        }
    }

    /// Runs the stages over one event as far as they go without I/O: to the document, or to the fetch of a
    /// referenced attachment (the worker fetches, then calls `resume`).
    pub fn start(&self, bytes: &[u8]) -> Result<Step, Rejected> {
        let clock = std::time::Instant::now();
        let doc = decode::parse(bytes, &self.decode).map_err(|error| Rejected { error, doc_id: None })?;
        let doc_id = doc.id.clone().filter(|id| decode::is_valid_id(id));
        let note = match decode::start(doc, &self.decode).map_err(|error| Rejected { error, doc_id })? {
            decode::Decoded::Note(note) => *note,
            decode::Decoded::Fetch(pending) => return Ok(Step::Fetch(pending)),
        };
        let decode = clock.elapsed();
        let mut doc = self.analyse(note);
        doc.timings.decode = decode;
        Ok(Step::Done(Box::new(doc)))
    }

    /// The stages after a fetch: the fetched body decoded by the same rules as inline data, then the text stages.
    pub fn resume(&self, pending: Box<decode::Pending>, fetched: decode::Fetched) -> Result<Document, Rejected> {
        let clock = std::time::Instant::now();
        let doc_id = Some(pending.doc_id().to_string());
        let note = decode::complete(*pending, fetched, &self.decode).map_err(|error| Rejected { error, doc_id })?;
        let decode = clock.elapsed();
        let mut doc = self.analyse(note);
        doc.timings.decode = decode;
        Ok(doc)
    }
}

/// How far `Pipeline::start` got.
#[derive(Debug)]
pub enum Step {
    Done(Box<Document>),
    Fetch(Box<decode::Pending>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_only_the_stages_know_are_checked_when_the_pipeline_is_built() {
        let env = [
            ("CLINSTREAM__SECTIONS__WEIGHTS__NOT_A_SECTION", "0.5"),
            ("CLINSTREAM__DECODE__CONTENT_TYPE_PREFERENCE", "image/tiff"),
        ];
        let settings =
            Settings::load_from(None, Some(env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()))
                .expect("config.rs itself does not know these names");
        let msg = Pipeline::new(&settings).unwrap_err().to_string();
        for key in ["sections.weights.not_a_section: unknown section name", "decode.content_type_preference[0]"] {
            assert!(msg.contains(key), "missing {key} in {msg}");
        }
        let defaults = Settings::load_from(None, Some(Default::default())).unwrap();
        assert!(check_names(&defaults).is_ok());
    }
}
