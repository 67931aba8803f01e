//! `clinstream-lab eval openi --reports CSV --labels CSV`: Open-i (Indiana University) chest X-ray reports against
//! NegBio's labels. Each report becomes a note `INDICATION: … COMPARISON: … FINDINGS: … IMPRESSION: …` and runs
//! through the text stages; a variable counts as positive when its label is `present` (uncertain counts as
//! absent, as in the gold). Labels: Cardiomegaly, Effusion, Pneumonia, Pneumothorax, Edema; the report key is
//! `CXR<uid>`.
//!
//! With an LLM (`run_llm`, `--llm`): the CLEAR paper's extraction step beside the rule labels, on every `sample`-th
//! report — per variable, the CLEAR windows around the variable's target mentions in the report (`query::context`,
//! the windows alone) go to the `llm.*` endpoint with the query service's prompt and answer schema, asking whether
//! the report indicates the variable; `present` counts as positive. A report with no mention of the variable gets
//! no call and counts as negative (the method labels from entity windows only).

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
    /// Per variable, per predicted label (`present`, `uncertain`, `absent`, `not_mentioned`): the reports with that
    /// label and how many of them the gold marks positive — where uncertain and negated mentions fall in the gold.
    pub by_label: BTreeMap<String, BTreeMap<String, LabelCount>>,
}

/// Reports with one predicted label, and of them the gold positives.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct LabelCount {
    pub reports: u64,
    pub gold_positive: u64,
}

/// A CSV row by column name.
type Row = HashMap<String, String>;

/// The reports that have gold labels, as notes: (uid, note text, gold row).
fn notes<'a>(
    reports: &Path,
    report_rows: &'a [Row],
    gold: &HashMap<String, &'a Row>,
) -> Result<Vec<(String, String, &'a Row)>, EvalError> {
    let mut out = Vec::new();
    for r in report_rows {
        let Some(uid) = r.get("uid") else {
            return Err(EvalError::Format { path: reports.display().to_string(), why: "no `uid` column".into() });
        };
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
        out.push((uid.clone(), text, *g));
    }
    Ok(out)
}

/// Reads both files and checks the configuration has the variables: the report rows and the gold by file name.
fn load(pipeline: &Pipeline, reports: &Path, labels: &Path) -> Result<(Vec<Row>, Vec<Row>), EvalError> {
    let reports_rows = csv::records(&read(reports)?);
    let label_rows = csv::records(&read(labels)?);
    let format = |path: &Path, why: &str| EvalError::Format { path: path.display().to_string(), why: why.to_string() };
    if !label_rows.iter().any(|r| r.contains_key("filename")) {
        return Err(format(labels, "no rows with a `filename` column"));
    }
    for (variable, _) in VARIABLES {
        if !pipeline.variables().iter().any(|v| v.name() == *variable) {
            return Err(format(reports, &format!("the configuration defines no variable `{variable}`")));
        }
    }
    Ok((reports_rows, label_rows))
}

fn gold_of(label_rows: &[Row]) -> HashMap<String, &Row> {
    label_rows.iter().filter_map(|r| Some((r.get("filename")?.clone(), r))).collect()
}

/// Confusion counts → per-variable P/R/F1 and their macro-F1.
fn score(counts: &BTreeMap<&str, (u64, u64, u64)>) -> (BTreeMap<String, Prf>, f64) {
    let per_variable: BTreeMap<String, Prf> =
        counts.iter().map(|(v, &(tp, fp, fn_))| (v.to_string(), Prf::from_counts(tp, fp, fn_))).collect();
    let macro_f1 = per_variable.values().map(|p| p.f1).sum::<f64>() / per_variable.len().max(1) as f64;
    (per_variable, macro_f1)
}

fn count(c: &mut (u64, u64, u64), predicted: bool, truth: bool) {
    match (predicted, truth) {
        (true, true) => c.0 += 1,
        (true, false) => c.1 += 1,
        (false, true) => c.2 += 1,
        _ => {}
    }
}

fn zero_counts() -> BTreeMap<&'static str, (u64, u64, u64)> {
    VARIABLES.iter().map(|(v, _)| (*v, (0, 0, 0))).collect()
}

pub fn run(pipeline: &Pipeline, reports: &Path, labels: &Path, show_errors: bool) -> Result<OpeniReport, EvalError> {
    let (report_rows, label_rows) = load(pipeline, reports, labels)?;
    let gold = gold_of(&label_rows);
    let mut counts = zero_counts();
    let mut by_label: BTreeMap<String, BTreeMap<String, LabelCount>> = BTreeMap::new();
    let mut n = 0;
    for (uid, text, g) in notes(reports, &report_rows, &gold)? {
        let doc = pipeline.analyse(Note::from_text(&format!("openi-{uid}"), text));
        n += 1;
        for (variable, column) in VARIABLES {
            let label = doc.variables.iter().find(|v| v.variable == *variable).map_or(Label::NotMentioned, |v| v.label);
            let predicted = label == Label::Present;
            let truth = g.get(*column).is_some_and(|v| v.trim() == "1");
            count(counts.get_mut(variable).expect("known variable"), predicted, truth);
            let c = by_label.entry(variable.to_string()).or_default().entry(label.as_str().to_string()).or_default();
            c.reports += 1;
            c.gold_positive += u64::from(truth);
            if show_errors && predicted != truth {
                eprintln!(
                    "CXR{uid} {variable}: predicted {predicted} gold {truth} | {}",
                    doc.note.text.replace('\n', " | ")
                );
            }
        }
    }
    let (per_variable, macro_f1) = score(&counts);
    Ok(OpeniReport { per_variable, macro_f1, n, by_label })
}

/// The LLM's labels beside the rule labels on the same sampled reports (`run_llm`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OpeniLlmReport {
    /// Reports labelled (every `sample`-th with gold).
    pub n: u64,
    pub rule: BTreeMap<String, Prf>,
    pub rule_macro_f1: f64,
    pub llm: BTreeMap<String, Prf>,
    pub llm_macro_f1: f64,
    /// Calls made (a report and variable with at least one window).
    pub calls: u64,
    /// Report and variable pairs without a mention (no call; negative).
    pub no_window: u64,
    /// Calls that failed or answered something unusable (counted negative).
    pub failed: u64,
    pub prompt_tokens_mean: f64,
    pub completion_tokens_mean: f64,
    pub ms_mean: f64,
}

/// CLEAR's LLM extraction step on every `sample`-th report (module docs); windows of `window_words` words each side,
/// at most `budget` CLEAR tokens a variable.
pub async fn run_llm(
    pipeline: &Pipeline,
    reports: &Path,
    labels: &Path,
    llm: &super::qa::EvalLlm<'_>,
    sample: usize,
    budget: usize,
    window_words: usize,
) -> Result<OpeniLlmReport, EvalError> {
    use crate::query::{Alignment, ContextParams, PatientNote, answer, context};
    let (report_rows, label_rows) = load(pipeline, reports, labels)?;
    let gold = gold_of(&label_rows);
    let (variables, lexicon) = (pipeline.variables(), pipeline.lexicon());
    let (mut rule, mut by_llm) = (zero_counts(), zero_counts());
    let mut r = OpeniLlmReport {
        n: 0,
        rule: BTreeMap::new(),
        rule_macro_f1: 0.0,
        llm: BTreeMap::new(),
        llm_macro_f1: 0.0,
        calls: 0,
        no_window: 0,
        failed: 0,
        prompt_tokens_mean: 0.0,
        completion_tokens_mean: 0.0,
        ms_mean: 0.0,
    };
    let (mut prompt, mut completion, mut ms) = (0u64, 0u64, 0u64);
    for (uid, text, g) in notes(reports, &report_rows, &gold)?.into_iter().step_by(sample.max(1)) {
        let doc = pipeline.analyse(Note::from_text(&format!("openi-{uid}"), text));
        r.n += 1;
        for (variable, column) in VARIABLES {
            let truth = g.get(*column).is_some_and(|v| v.trim() == "1");
            let predicted = doc.variables.iter().any(|v| v.variable == *variable && v.label == Label::Present);
            count(rule.get_mut(variable).expect("known variable"), predicted, truth);
            let Some(vi) = variables.iter().position(|v| v.name() == *variable) else { continue };
            let mut a = Alignment::default();
            for &c in variables[vi].targets() {
                a.concepts.insert(c, 1.0);
                a.answer_concepts.insert(c);
            }
            a.variable = Some(vi);
            let note = [PatientNote::from(&doc)];
            let params = ContextParams::new(budget, window_words);
            let c = context::assemble(&note, &a, variables, lexicon, params, &crate::stages::clear::count_tokens);
            let said = if c.windows.is_empty() {
                r.no_window += 1;
                false
            } else {
                let passages: Vec<answer::Passage> = c.windows.iter().map(answer::Passage::from).collect();
                let question = format!("Does the report indicate {}?", variable.replace('_', " "));
                let messages = answer::messages(llm.templates, &question, &passages);
                let clock = std::time::Instant::now();
                let reply = llm.llm.chat(&messages, Some(&answer::schema(passages.len()))).await;
                ms += clock.elapsed().as_millis() as u64;
                r.calls += 1;
                match reply.ok().and_then(|c| {
                    prompt += c.prompt_tokens;
                    completion += c.completion_tokens;
                    answer::parse(&c.content, passages.len()).ok()
                }) {
                    Some(g) => g.status == "present",
                    None => {
                        r.failed += 1;
                        false
                    }
                }
            };
            count(by_llm.get_mut(variable).expect("known variable"), said, truth);
        }
    }
    (r.rule, r.rule_macro_f1) = score(&rule);
    (r.llm, r.llm_macro_f1) = score(&by_llm);
    let calls = r.calls.max(1) as f64;
    (r.prompt_tokens_mean, r.completion_tokens_mean, r.ms_mean) =
        (prompt as f64 / calls, completion as f64 / calls, ms as f64 / calls);
    Ok(r)
}
