//! `clinstream-lab eval openi --reports CSV --labels CSV`: Open-i (Indiana University) chest X-ray reports against
//! NegBio's labels. Each report becomes a note `INDICATION: … COMPARISON: … FINDINGS: … IMPRESSION: …` and runs
//! through the text stages; a variable counts as positive when its label is `present` (uncertain counts as
//! absent, as in the gold). Labels: Cardiomegaly, Effusion, Pneumonia, Pneumothorax, Edema; the report key is
//! `CXR<uid>`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;

use super::{EvalError, Prf, csv, read};
use crate::model::Note;
use crate::stages::Pipeline;
use crate::stages::clear::Label;

/// (variable, label column).
pub const VARIABLES: &[(&str, &str)] = &[
    ("cardiomegaly", "Cardiomegaly"),
    ("pleural_effusion", "Effusion"),
    ("pneumonia", "Pneumonia"),
    ("pneumothorax", "Pneumothorax"),
    ("pulmonary_edema", "Edema"),
];

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OpeniReport {
    pub per_variable: BTreeMap<String, Prf>,
    pub macro_f1: f64,
    pub n: u64,
}

pub fn run(pipeline: &Pipeline, reports: &Path, labels: &Path, show_errors: bool) -> Result<OpeniReport, EvalError> {
    let reports_rows = csv::records(&read(reports)?);
    let label_rows = csv::records(&read(labels)?);
    let format = |path: &Path, why: &str| EvalError::Format { path: path.display().to_string(), why: why.to_string() };
    let gold: HashMap<String, &HashMap<String, String>> =
        label_rows.iter().filter_map(|r| Some((r.get("filename")?.clone(), r))).collect();
    if gold.is_empty() {
        return Err(format(labels, "no rows with a `filename` column"));
    }
    for (variable, _) in VARIABLES {
        if !pipeline.variables().iter().any(|v| v.name() == *variable) {
            return Err(format(reports, &format!("the configuration defines no variable `{variable}`")));
        }
    }
    let mut counts: BTreeMap<&str, (u64, u64, u64)> = VARIABLES.iter().map(|(v, _)| (*v, (0, 0, 0))).collect();
    let mut n = 0;
    for r in &reports_rows {
        let Some(uid) = r.get("uid") else { return Err(format(reports, "no `uid` column")) };
        let Some(g) = gold.get(&format!("CXR{uid}")) else { continue };
        let mut text = String::new();
        for (column, header) in [
            ("indication", "INDICATION"),
            ("comparison", "COMPARISON"),
            ("findings", "FINDINGS"),
            ("impression", "IMPRESSION"),
        ] {
            if let Some(v) = r.get(column).filter(|v| !v.trim().is_empty()) {
                text.push_str(&format!("{header}: {}\n", v.trim()));
            }
        }
        let doc = pipeline.analyse(Note::from_text(&format!("openi-{uid}"), text));
        n += 1;
        for (variable, column) in VARIABLES {
            let predicted = doc.variables.iter().any(|v| v.variable == *variable && v.label == Label::Present);
            let truth = g.get(*column).is_some_and(|v| v.trim() == "1");
            let c = counts.get_mut(variable).expect("known variable");
            match (predicted, truth) {
                (true, true) => c.0 += 1,
                (true, false) => c.1 += 1,
                (false, true) => c.2 += 1,
                _ => {}
            }
            if show_errors && predicted != truth {
                eprintln!(
                    "CXR{uid} {variable}: predicted {predicted} gold {truth} | {}",
                    doc.note.text.replace('\n', " | ")
                );
            }
        }
    }
    let per_variable: BTreeMap<String, Prf> =
        counts.iter().map(|(v, &(tp, fp, fn_))| (v.to_string(), Prf::from_counts(tp, fp, fn_))).collect();
    let macro_f1 = per_variable.values().map(|p| p.f1).sum::<f64>() / per_variable.len() as f64;
    Ok(OpeniReport { per_variable, macro_f1, n })
}
