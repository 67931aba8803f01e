//! Output encodings, pure functions of the domain types: Avro records for the Kafka topics (`avro`, schemas in
//! `schemas/`) and the NDJSON records of file mode (`records`, documented in docs/outputs.md).

pub mod avro;
pub mod records;
