//! CLEAR's result for one variable: its label, confidence and the evidence windows it was decided from.

use serde::Serialize;

use crate::model::mention::Assertion;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Label {
    Present,
    Absent,
    Uncertain,
    NotMentioned,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Present => "present",
            Label::Absent => "absent",
            Label::Uncertain => "uncertain",
            Label::NotMentioned => "not_mentioned",
        }
    }
}

/// A target mention inside an evidence window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvidenceMention {
    pub start: usize,
    pub end: usize,
    pub section: &'static str,
    pub weight: f32,
    pub assertion: Assertion,
}

/// One merged window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Window {
    pub start: usize,
    pub end: usize,
    /// The heaviest section among its mentions.
    pub section: &'static str,
    pub weight: f32,
    pub tokens: usize,
    pub mentions: Vec<EvidenceMention>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariableResult {
    pub variable: String,
    pub label: Label,
    pub confidence: f32,
    pub evidence: Vec<Window>,
    /// Tokens in the kept windows (bounded by the budget).
    pub context_tokens: usize,
    /// Target mentions found before the budget cut.
    pub mentions_found: usize,
}
