//! `clinstream-lab eval sdoh --csv CSV`: the smoking and alcohol statements of SDOH-NLI (premise, hypothesis,
//! label). Each premise runs through the text stages as a SOCIAL HISTORY section; the `tobacco_use` and
//! `alcohol_use` mentions give a status — current (an affirmed mention), former (a historical mention), never
//! (only negated mentions), unknown — and each hypothesis is judged from that status:
//!
//! | hypothesis | true when |
//! |---|---|
//! | is currently a smoker / currently drinks alcohol | current |
//! | is currently not a smoker / currently does not drink alcohol | former or never |
//! | was a smoker / drank alcohol in the past | former |
//! | wasn't a smoker / did not drink alcohol in the past | never |

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::{EvalError, csv, read};
use crate::model::Note;
use crate::stages::Pipeline;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Current,
    Former,
    Never,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Current,
    NotCurrent,
    Past,
    NeverInPast,
}

/// The hypotheses scored, with their variable and claim.
const HYPOTHESES: &[(&str, &str, Claim)] = &[
    ("The person is currently a smoker.", "tobacco_use", Claim::Current),
    ("The person is currently not a smoker.", "tobacco_use", Claim::NotCurrent),
    ("The person was a smoker in the past.", "tobacco_use", Claim::Past),
    ("The person wasn't a smoker in the past.", "tobacco_use", Claim::NeverInPast),
    ("The person currently drinks alcohol.", "alcohol_use", Claim::Current),
    ("The person currently does not drink alcohol.", "alcohol_use", Claim::NotCurrent),
    ("The person drank alcohol in the past.", "alcohol_use", Claim::Past),
    ("The person did not drink alcohol in the past.", "alcohol_use", Claim::NeverInPast),
];

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct HypothesisScore {
    pub accuracy: f64,
    pub n: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SdohReport {
    pub accuracy: f64,
    pub n: u64,
    pub per_hypothesis: BTreeMap<String, HypothesisScore>,
}

/// The status of a variable from its evidence mentions in an analysed note.
fn status_in(doc: &crate::model::Document, variable: &str) -> Status {
    let Some(v) = doc.variables.iter().find(|v| v.variable == variable) else { return Status::Unknown };
    let mentions: Vec<_> = v.evidence.iter().flat_map(|w| &w.mentions).filter(|m| !m.assertion.family).collect();
    if mentions.is_empty() {
        return Status::Unknown;
    }
    let a = |f: fn(&crate::stages::assertion::Assertion) -> bool| mentions.iter().any(|m| f(&m.assertion));
    if a(|x| x.historical) {
        Status::Former
    } else if a(|x| !x.negated && !x.uncertain && !x.hypothetical) {
        Status::Current
    } else if a(|x| x.negated) {
        Status::Never
    } else {
        Status::Unknown
    }
}

/// The status of a variable in a social-history snippet.
pub fn status(pipeline: &Pipeline, text: &str, variable: &str) -> Status {
    status_in(&analyse(pipeline, text), variable)
}

fn analyse(pipeline: &Pipeline, text: &str) -> crate::model::Document {
    pipeline.analyse(Note::from_text("sdoh", format!("SOCIAL HISTORY: {text}\n")))
}

pub fn run(pipeline: &Pipeline, path: &Path, show_errors: bool) -> Result<SdohReport, EvalError> {
    let rows = csv::records(&read(path)?);
    // Each premise is analysed once; both variables' statuses come from that one analysis.
    let mut cache: BTreeMap<String, (Status, Status)> = BTreeMap::new();
    let mut per: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in &rows {
        let (Some(premise), Some(hypothesis), Some(label)) = (r.get("premise"), r.get("hypothesis"), r.get("label"))
        else {
            return Err(EvalError::Format {
                path: path.display().to_string(),
                why: "needs premise, hypothesis, label".into(),
            });
        };
        let Some(&(_, variable, claim)) = HYPOTHESES.iter().find(|(h, _, _)| h == hypothesis) else { continue };
        let (tobacco, alcohol) = *cache.entry(premise.clone()).or_insert_with(|| {
            let doc = analyse(pipeline, premise);
            (status_in(&doc, "tobacco_use"), status_in(&doc, "alcohol_use"))
        });
        let status = if variable == "tobacco_use" { tobacco } else { alcohol };
        let predicted = match claim {
            Claim::Current => status == Status::Current,
            Claim::NotCurrent => matches!(status, Status::Former | Status::Never),
            Claim::Past => status == Status::Former,
            Claim::NeverInPast => status == Status::Never,
        };
        let truth = label.trim().eq_ignore_ascii_case("true");
        let e = per.entry(hypothesis.clone()).or_default();
        e.1 += 1;
        if predicted == truth {
            e.0 += 1;
        } else if show_errors {
            eprintln!("{hypothesis} predicted {predicted} ({status:?}) gold {truth} | {premise}");
        }
    }
    let (correct, n) = per.values().fold((0, 0), |(c, n), &(c1, n1)| (c + c1, n + n1));
    Ok(SdohReport {
        accuracy: if n > 0 { correct as f64 / n as f64 } else { 0.0 },
        n,
        per_hypothesis: per
            .into_iter()
            .map(|(h, (c, n))| (h, HypothesisScore { accuracy: if n > 0 { c as f64 / n as f64 } else { 0.0 }, n }))
            .collect(),
    })
}
