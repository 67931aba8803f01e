//! The read side's method: what a clinical question is about (`align`), and the context that answers it
//! (`context`: CLEAR windows across one patient's notes, chosen by alignment × section weight, merged, without
//! copy-forward duplicates, cut to a token budget, with the answer those windows support).
//!
//! Both are pure given their inputs (the lexicon, the compiled CLEAR variables, a concept-label index with its
//! embeddings, the patient's processed notes); the embedder and the stores are the callers' edge. Nothing here logs
//! a question or note text.

pub mod align;
pub mod context;
pub mod windows;

pub use align::{Aligned, Alignment, Found, LabelIndex};
pub use context::{Answer, Context, ContextParams, ContextWindow, PatientNote};
pub use windows::{StoredWindow, WindowNote};
