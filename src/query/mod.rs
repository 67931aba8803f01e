//! The read side's method: what a clinical question is about (`align`), the context that answers it (`context`:
//! CLEAR windows across one patient's notes, chosen by alignment × section weight, merged, without copy-forward
//! duplicates, cut to a token budget, with the answer those windows support), the stored windows as note
//! fragments (`windows`; the write side builds them there too), the patient's facts (`facts`), and the
//! concept-label index (`labels`), the generative step's prompt and answer check (`answer`), and CPTF token
//! filtering of windows by attention importance (`cptf`), and RAPTOR's summary tree over a patient's chunks
//! (`raptor`).
//!
//! `reader` runs the method over its edges — the embedder, the store, the label cache — for one request; it is
//! what the query service and `clinstream context` call. Everything else here is pure given its inputs (the
//! lexicon, the compiled CLEAR variables, a label index with its embeddings, the patient's notes). `api` holds
//! the requests and answers. Nothing here logs a question or note text.

pub mod align;
pub mod answer;
pub mod api;
pub mod context;
pub mod cptf;
pub mod facts;
pub mod labels;
pub mod raptor;
pub mod reader;
pub mod windows;

pub use align::{Aligned, Alignment, Found, LabelIndex};
pub use context::{Answer, Context, ContextParams, ContextWindow, PatientNote};
pub use reader::{ReadError, Reader};
pub use windows::{StoredWindow, WindowNote};
