//! `clinstream-lab eval negex --pairs TSV`: the NegEx / genConText test kit format — one concept-in-sentence pair
//! per row: `report, concept, sentence, negation (Affirmed|Negated), temporality (Recent|Historical|Not
//! particular), experiencer (Patient|Family member|Other)`, tab-separated with a header.
//!
//! The concept is located in its sentence (case-insensitively, any whitespace between its words; an occurrence
//! written in capitals, as the kit marks it, is preferred), the sentence is split with the product's sentence
//! splitter, and the assertion stage runs on the sentence holding the concept. Negated is the positive class
//! for precision / recall / F1; temporality maps historical → Historical, hypothetical → Not particular,
//! otherwise Recent; experiencer maps family → not Patient.

use std::path::Path;

use serde::Serialize;

use super::{EvalError, Prf, read};
use crate::stages::assertion::{self, AssertionParams, ContextRules};
use crate::stages::sentences::{self, SentenceParams};

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Accuracy {
    pub accuracy: f64,
    pub correct: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NegexReport {
    pub negation: Prf,
    pub temporality: Accuracy,
    pub experiencer: Accuracy,
    pub n: u64,
    /// Rows whose concept could not be found in the sentence (scored as affirmed / recent / patient).
    pub concept_not_found: u64,
}

pub fn run(path: &Path, show_errors: bool) -> Result<NegexReport, EvalError> {
    let text = read(path)?;
    let format = |why: String| EvalError::Format { path: path.display().to_string(), why };
    let mut lines = text.lines();
    let header = lines.next().ok_or_else(|| format("empty file".into()))?;
    let cols: Vec<&str> = header.split('\t').collect();
    let col =
        |name: &str| cols.iter().position(|c| c.trim() == name).ok_or_else(|| format(format!("no column {name}")));
    let (c_concept, c_sentence, c_neg, c_temp, c_exp) =
        (col("concept")?, col("sentence")?, col("negation")?, col("temporality")?, col("experiencer")?);
    let rules = ContextRules::builtin();
    let params = AssertionParams::default();
    let sp = SentenceParams { max_sentence_bytes: 4000 };
    let (mut tp, mut fp, mut fn_, mut n, mut temp_ok, mut exp_ok, mut missing) = (0, 0, 0, 0u64, 0, 0, 0);
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let get = |c: usize| f.get(c).copied().ok_or_else(|| format(format!("row {}: too few columns", i + 2)));
        let (concept, sentence) = (get(c_concept)?, get(c_sentence)?);
        let a = match locate(sentence, concept) {
            Some(span) => {
                let mut sents = Vec::new();
                sentences::split_span(sentence, 0, sentence.len(), 0, &sp, &mut sents);
                let s = sents
                    .iter()
                    .find(|s| s.start <= span.0 && span.1 <= s.end)
                    .map_or((0, sentence.len()), |s| (s.start, s.end));
                assertion::assert_sentence(sentence, s, &[span], &[crate::model::EntityKind::Disease], rules, &params)
                    [0]
            }
            None => {
                missing += 1;
                Default::default()
            }
        };
        n += 1;
        let gold_neg = get(c_neg)?.trim() == "Negated";
        if show_errors && (a.negated != gold_neg) {
            eprintln!("row {}: negated={} gold={} | {concept} | {sentence}", i + 2, a.negated, gold_neg);
        }
        match (a.negated, gold_neg) {
            (true, true) => tp += 1,
            (true, false) => fp += 1,
            (false, true) => fn_ += 1,
            _ => {}
        }
        let predicted_temp = if a.historical {
            "Historical"
        } else if a.hypothetical {
            "Not particular"
        } else {
            "Recent"
        };
        if predicted_temp == get(c_temp)?.trim() {
            temp_ok += 1;
        }
        if a.family == (get(c_exp)?.trim() != "Patient") {
            exp_ok += 1;
        }
    }
    let acc = |correct: u64| Accuracy { accuracy: if n > 0 { correct as f64 / n as f64 } else { 0.0 }, correct };
    Ok(NegexReport {
        negation: Prf::from_counts(tp, fp, fn_),
        temporality: acc(temp_ok),
        experiencer: acc(exp_ok),
        n,
        concept_not_found: missing,
    })
}

/// Finds `concept` in `sentence`: case-insensitive, any whitespace between words; prefers an occurrence
/// written in capitals.
pub fn locate(sentence: &str, concept: &str) -> Option<(usize, usize)> {
    let words: Vec<&str> = concept.split_whitespace().collect();
    let first = words.first()?;
    let lower = sentence.to_ascii_lowercase();
    let mut candidates = Vec::new();
    let mut from = 0;
    while let Some(pos) = lower[from..].find(&first.to_ascii_lowercase()) {
        let start = from + pos;
        let mut end = start + first.len();
        let mut ok = true;
        for w in &words[1..] {
            let rest = &lower[end..];
            let skipped = rest.len() - rest.trim_start().len();
            if skipped == 0 || !rest[skipped..].starts_with(&w.to_ascii_lowercase()) {
                ok = false;
                break;
            }
            end += skipped + w.len();
        }
        if ok {
            candidates.push((start, end));
        }
        from = start + 1;
        if !sentence.is_char_boundary(from) {
            from = (from..sentence.len()).find(|&i| sentence.is_char_boundary(i)).unwrap_or(sentence.len());
        }
    }
    let caps = |&(s, e): &(usize, usize)| {
        let t = &sentence[s..e];
        t.chars().any(|c| c.is_ascii_uppercase()) && !t.chars().any(|c| c.is_ascii_lowercase())
    };
    candidates.iter().copied().find(caps).or_else(|| candidates.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_prefers_capitals_and_tolerates_spacing() {
        assert_eq!(locate("Staph bacteremia; no STAPH   BACTEREMIA now", "staph bacteremia"), Some((21, 39)));
        assert_eq!(locate("no fever", "fever"), Some((3, 8)));
        assert_eq!(locate("no fever", "cough"), None);
    }

    #[test]
    fn scores_a_small_kit_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kit.tsv");
        std::fs::write(
            &path,
            "report\tconcept\tsentence\tnegation\ttemporality\texperiencer\n\
             1\tfever\tThe patient denies FEVER.\tNegated\tRecent\tPatient\n\
             1\tcough\tShe has a COUGH.\tAffirmed\tRecent\tPatient\n\
             2\tdiabetes\tHer mother has DIABETES.\tAffirmed\tRecent\tFamily member\n\
             2\tstroke\tHistory of STROKE in 2001.\tAffirmed\tHistorical\tPatient\n\
             3\trash\tNo RASH was seen.\tAffirmed\tRecent\tPatient\n",
        )
        .unwrap();
        let r = run(&path, false).unwrap();
        assert_eq!(r.n, 5);
        assert_eq!((r.negation.tp, r.negation.fp, r.negation.fn_), (1, 1, 0));
        assert_eq!(r.temporality.correct, 5);
        assert_eq!(r.experiencer.correct, 5);
    }
}
