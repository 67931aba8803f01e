//! Vocabularies and matching: the phrase matcher shared by the entity lexicon and the ConText cues.

pub mod matcher;
