//! Evaluation commands over labelled sets (paths given on the command line; the product never reads them by
//! itself). Each returns a serialisable report; `main` prints it as JSON or as a short table.

pub mod csv;
pub mod kg_synthea;
pub mod negex;
pub mod openi;
pub mod qa;
pub mod sdoh;

use serde::Serialize;

/// Precision / recall / F1 of one positive class.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Prf {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub tp: u64,
    pub fp: u64,
    #[serde(rename = "fn")]
    pub fn_: u64,
}

impl Prf {
    pub fn from_counts(tp: u64, fp: u64, fn_: u64) -> Self {
        let precision = if tp + fp > 0 { tp as f64 / (tp + fp) as f64 } else { 0.0 };
        let recall = if tp + fn_ > 0 { tp as f64 / (tp + fn_) as f64 } else { 0.0 };
        let f1 = if precision + recall > 0.0 { 2.0 * precision * recall / (precision + recall) } else { 0.0 };
        Self { precision, recall, f1, tp, fp, fn_ }
    }
}

/// An evaluation input could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("could not read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {why}")]
    Format { path: String, why: String },
}

pub fn read(path: &std::path::Path) -> Result<String, EvalError> {
    std::fs::read_to_string(path).map_err(|source| EvalError::Io { path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prf() {
        let p = Prf::from_counts(8, 2, 2);
        assert!((p.precision - 0.8).abs() < 1e-9 && (p.recall - 0.8).abs() < 1e-9 && (p.f1 - 0.8).abs() < 1e-9);
        assert_eq!(Prf::from_counts(0, 0, 0).f1, 0.0);
    }
}
