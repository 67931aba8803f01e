//! clinstream: a worker that turns a stream of clinical notes (FHIR R4 `DocumentReference`) into structured,
//! searchable data. See docs/architecture.md for the data flow and the layer order.
//!
//! Module map, lowest layer first (a module imports only from modules above it in this list; `tests/layers.rs`
//! checks it):
//! * `config` — typed settings: defaults → file → `CLINSTREAM__*` env; validation; secret redaction. Imports
//!   nothing from the crate.
//! * `error` — every error code with its disposition (dead-letter / retry / halt), and the typed errors of a run.
//! * `tls` — the TLS client configuration of every outbound HTTPS client (rustls, ring, the platform's roots).
//! * `backoff` — the one capped exponential backoff (Kafka, Schema Registry, the store).
//! * `model` — domain types: the FHIR subset, `Note`, `Section`, `Sentence`, mentions and assertions, variable
//!   results, knowledge-graph deltas, `Document`, `Origin`, `DeadLetter`.
//! * `telemetry` — logging (PHI-free, structured), every metric name, the process's health flags.
//! * `pool` — the documents' CPU pool: every document's CPU-bound steps, the oldest document's first.
//! * `lexicon` — vocabularies and the phrase matcher (one automaton, word boundaries, longest match).
//! * `stages` — pure synchronous stages: decode, attachment, charset, html, rtf, sections, sentences, mentions,
//!   assertion, clear (variables), kg (graph deltas), chunk planning.
//! * `codec` — output encodings: Avro records (`avro`) and the NDJSON file records (`records`).
//! * `embed` — the embedder: one ONNX Runtime model thread, batching across documents, a clonable handle.
//! * `store` — the vector store: Qdrant in-process (`qdrant-edge`) or a server (`qdrant-client`), and BM25.
//! * `query` — the read side's method: question–entity alignment (lexicon + label embeddings), entity windows as
//!   stored (`windows`; the indexer builds them there too), CLEAR context assembly across a patient's notes
//!   (windows, section weights, copy-forward, budget, answer), the patient's facts, the label index, and
//!   `Reader`, which runs it over the embedder and the store for one request (`context`, `search`).
//! * `fhir` — the FHIR client: attachments fetched by reference (bearer or SMART Backend Services auth, retries,
//!   per-host limits).
//! * `llm` — the LLM client of the generative steps: one OpenAI-compatible chat-completions endpoint (deadline,
//!   retries, concurrency limit; prompts and completions never logged).
//! * `index` — per document: units → SEOS/fixed chunks → vectors → points in the store (ids, versions); RAPTOR's
//!   trees and, in the background, their abstractive summaries.
//! * `kafka` — Kafka client plumbing: client config, topic admin, Schema Registry.
//! * `source` — intakes: `file` (NDJSON, Bundles, Bulk FHIR, stdin) and `kafka` (consumer group).
//! * `sink` — outputs: `file` (NDJSON files) and `kafka` (producer, dead letters, the commit step).
//! * `ack` — the ack core: per-partition watermarks, assigned set, committed ledger, dead-letter guard.
//! * `runner` — the one in-order runner: in-flight FIFO, completion at the front, drain, summary.
//! * `http` — `/metrics`, `/healthz`, `/readyz` (axum).
//! * `serve` — the query service: `POST /v1/context`, `POST /v1/search` over `query::Reader` (routes, auth,
//!   limits, errors, metrics, the OpenAPI document).
//! * `app` — wiring of file mode and Kafka mode.
//! * `kg` — the reference consumer of the knowledge-graph stream (materialize to JSON / GraphML).
//! * `eval` — evaluation over labelled sets (negex, openi, sdoh, kg-synthea, qa); run by `clinstream-lab eval`.
//! * `cli` — the `clinstream` command line: parsing, dispatch, one module per command.
//!
//! The second binary, `clinstream-lab` (src/bin/clinstream-lab: benchmarks, evaluations, the vocabulary build),
//! uses this library from outside and is not shipped with the worker.

pub mod ack;
pub mod app;
pub mod backoff;
pub mod cli;
pub mod codec;
pub mod config;
pub mod embed;
pub mod error;
pub mod eval;
pub mod fhir;
pub mod http;
pub mod index;
pub mod kafka;
pub mod kg;
pub mod lexicon;
pub mod llm;
pub mod model;
pub mod pool;
pub mod query;
pub mod runner;
pub mod serve;
pub mod sink;
pub mod source;
pub mod stages;
pub mod store;
pub mod telemetry;
pub mod tls;

/// The version of this worker, written into every output record and the build-info metric.
pub const WORKER_VERSION: &str = env!("CARGO_PKG_VERSION");
