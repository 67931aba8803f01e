//! clinstream: a worker that turns a stream of clinical notes (FHIR R4 `DocumentReference`) into structured,
//! searchable data. See docs/architecture.md for the data flow.
//!
//! Module map:
//! * `app` — wiring: source → stages → sinks, backpressure, shutdown, the run summary.
//! * `bench` — benchmark helpers (`clinstream bench text`).
//! * `config` — typed settings: defaults → file → `CLINSTREAM__*` env; validation; secret redaction.
//! * `error` — every error code with its disposition (dead-letter / retry / halt).
//! * `embed` — the embedder: one ONNX Runtime model thread, batching across documents, a clonable handle.
//! * `index` — per document: units → SEOS/fixed chunks → vectors → points in the store (ids, versions).
//! * `store` — the vector store: Qdrant in-process (`qdrant-edge`) or a server (`qdrant-client`), same points.
//! * `eval` — evaluation commands over labelled sets (negex, openi, sdoh).
//! * `health` — `/metrics`, `/healthz`, `/readyz` on `metrics.addr`.
//! * `kg` — the reference consumer of the knowledge-graph stream (materialize to JSON / GraphML).
//! * `lexicon` — vocabularies and the phrase matcher (one automaton, word boundaries, longest match).
//! * `model` — the FHIR subset (serde) and internal types (`Note`, `Section`, `Sentence`, `Document`).
//! * `stages` — pure synchronous stages: decode, attachment, html, rtf, sections, sentences, mentions,
//!   assertion, clear (variables), kg (graph deltas).
//! * `source` — event sources (`file`: NDJSON, Bundles, Bulk FHIR, stdin).
//! * `sink` — outputs (`file`: notes.ndjson, dead_letters.ndjson) and their record types.
//! * `telemetry` — logging (PHI-free, structured) and every metric name (`telemetry::metrics`).
//! * `docs` — tables generated from the code for docs/.

pub mod app;
pub mod bench;
pub mod config;
pub mod docs;
pub mod embed;
pub mod error;
pub mod eval;
pub mod health;
pub mod index;
pub mod kafka;
pub mod kg;
pub mod lexicon;
pub mod model;
pub mod search;
pub mod sink;
pub mod source;
pub mod stages;
pub mod store;
pub mod telemetry;
