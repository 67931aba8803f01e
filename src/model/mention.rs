//! Entity mentions: the six entity kinds, a mention's span and concept, and its ConText assertion flags.

use serde::Serialize;

/// The six entity kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    Medication,
    Symptom,
    Disease,
    Procedure,
    Lab,
    Anatomy,
}

impl EntityKind {
    /// Every kind, in declaration order.
    pub const ALL: [EntityKind; 6] = [
        EntityKind::Medication,
        EntityKind::Symptom,
        EntityKind::Disease,
        EntityKind::Procedure,
        EntityKind::Lab,
        EntityKind::Anatomy,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "medication" => Self::Medication,
            "symptom" => Self::Symptom,
            "disease" => Self::Disease,
            "procedure" => Self::Procedure,
            "lab" => Self::Lab,
            "anatomy" => Self::Anatomy,
            _ => return None,
        })
    }

    /// Whether the kind names a finding about the patient (a disease or a symptom), as opposed to a drug, a
    /// procedure, a measurement or a site.
    pub fn is_finding(self) -> bool {
        matches!(self, Self::Disease | Self::Symptom)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Medication => "medication",
            Self::Symptom => "symptom",
            Self::Disease => "disease",
            Self::Procedure => "procedure",
            Self::Lab => "lab",
            Self::Anatomy => "anatomy",
        }
    }
}

/// The assertion flags of one mention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Assertion {
    pub negated: bool,
    pub uncertain: bool,
    pub historical: bool,
    pub family: bool,
    pub hypothetical: bool,
    /// Uncertain only because the finding is named in a differential ("atelectasis versus pneumonia"), with no
    /// other hedge: `uncertain` is set too. A variable with `differential_is_present` counts it as present.
    pub differential: bool,
}

impl Assertion {
    /// Affirmed: about the patient, now, and neither negated nor uncertain nor hypothetical.
    pub fn is_affirmed(&self) -> bool {
        !(self.negated || self.uncertain || self.historical || self.family || self.hypothetical)
    }

    /// Whether it votes uncertain: uncertain (unless only by a differential that counts as present) or
    /// hypothetical.
    pub fn votes_uncertain(&self, differential_is_present: bool) -> bool {
        self.uncertain && !(self.differential && differential_is_present) || self.hypothetical
    }

    /// The flags that are set, as short names (`neg unc hist fam hyp`), or `aff` when none is.
    pub fn short(&self) -> String {
        let names: Vec<&str> = [
            (self.negated, "neg"),
            (self.uncertain, "unc"),
            (self.historical, "hist"),
            (self.family, "fam"),
            (self.hypothetical, "hyp"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if names.is_empty() { "aff".to_string() } else { names.join(" ") }
    }
}

/// One entity mention.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mention {
    pub kind: EntityKind,
    /// Index into the lexicon's concepts.
    #[serde(skip)]
    pub concept: u32,
    pub start: usize,
    pub end: usize,
    /// Index into the note's sentences.
    pub sentence: usize,
    /// Index into the note's sections.
    pub section: usize,
    pub assertion: Assertion,
}
