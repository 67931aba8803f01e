//! Avro encoding of the output records (`schemas/*.avsc`, compiled in).
//!
//! Framing, chosen by `kafka.schema_registry.url`:
//! * empty (default) — Avro single-object encoding: `C3 01`, the schema's CRC-64-AVRO (Rabin) fingerprint in
//!   little-endian, then the datum. Self-describing: a consumer holding the `.avsc` files recognises the schema.
//! * set — Confluent wire format: `00`, the registry's schema id (big-endian u32), then the datum.
//!
//! Records are serialised straight from borrowed serde structs by the schema-aware serializer
//! (`GenericDatumWriter::write_ser`): the schema (not serde's integer mapping) decides the Avro types — a field whose
//! type does not fit its schema is an error, not different bytes — and no intermediate `Value` tree is built, resolved
//! and validated per record (that tree, with a hash map per record, was most of a Kafka worker's output cost). Each
//! schema is parsed and its names resolved once per process. A schema change that the code does not follow fails the
//! round-trip tests.

use std::sync::{Mutex, OnceLock};

use apache_avro::Schema;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use serde::Serialize;

use crate::WORKER_VERSION;
use crate::model::{Assertion, DeadLetter, Document, Label, VariableResult, Window};

pub const VARIABLES_SCHEMA: &str = include_str!("../../schemas/clinstream.variables.v1.avsc");
pub const KG_SCHEMA: &str = include_str!("../../schemas/clinstream.kg.v1.avsc");
pub const DLQ_SCHEMA: &str = include_str!("../../schemas/clinstream.dlq.v1.avsc");

/// A record could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("frame header does not match the schema")]
    Frame,
    #[error(transparent)]
    Avro(#[from] apache_avro::Error),
}

/// How encoded records are framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// Avro single-object encoding (the fingerprint is taken from the schema).
    SingleObject,
    /// Confluent Schema Registry wire format with this schema id.
    Confluent(u32),
}

/// A compiled-in schema, parsed once and kept for the process's life (there are three; `Encoder`s are made per
/// run and per client rebuild, and borrow it).
fn parsed(schema_json: &'static str) -> Result<&'static Schema, apache_avro::Error> {
    static PARSED: OnceLock<Mutex<Vec<(&'static str, &'static Schema)>>> = OnceLock::new();
    let mut parsed = PARSED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, schema)) = parsed.iter().find(|(json, _)| *json == schema_json) {
        return Ok(schema);
    }
    let schema: &'static Schema = Box::leak(Box::new(Schema::parse_str(schema_json)?));
    parsed.push((schema_json, schema));
    Ok(schema)
}

/// One schema with its frame header and its writer (names resolved once).
pub struct Encoder {
    schema: &'static Schema,
    writer: GenericDatumWriter<'static>,
    header: Vec<u8>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("schema", &self.schema.name()).field("header", &self.header).finish()
    }
}

impl Encoder {
    pub fn new(schema_json: &'static str, framing: Framing) -> Result<Self, apache_avro::Error> {
        let schema = parsed(schema_json)?;
        let header = match framing {
            Framing::SingleObject => {
                use apache_avro::headers::{HeaderBuilder, RabinFingerprintHeader};
                RabinFingerprintHeader::from_schema(schema).build_header()
            }
            Framing::Confluent(id) => {
                let mut h = vec![0x00];
                h.extend_from_slice(&id.to_be_bytes());
                h
            }
        };
        let writer = GenericDatumWriter::builder(schema).human_readable(false).build()?;
        Ok(Self { schema, writer, header })
    }

    pub fn schema(&self) -> &Schema {
        self.schema
    }

    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// Frame header + datum of a serde record. Fails only when the record does not fit the schema (a bug).
    pub fn encode<T: Serialize>(&self, record: &T) -> Result<Vec<u8>, apache_avro::Error> {
        let mut out = Vec::with_capacity(self.header.len() + 512);
        out.extend_from_slice(&self.header);
        self.writer.write_ser(&mut out, record)?;
        Ok(out)
    }

    /// Strips and checks the frame header, then decodes the datum (for tests and tools). A record in the
    /// Confluent wire format is read with this encoder's schema whatever its id (the tools read topics this worker
    /// wrote; a registry-aware consumer resolves the id instead).
    pub fn decode(&self, bytes: &[u8]) -> Result<Value, DecodeError> {
        let body = match bytes.strip_prefix(self.header.as_slice()) {
            Some(body) => body,
            None if bytes.len() >= 5 && bytes[0] == 0 => &bytes[5..],
            None => return Err(DecodeError::Frame),
        };
        let mut reader = body;
        Ok(apache_avro::reader::datum::GenericDatumReader::builder(self.schema)
            .build()
            .and_then(|r| r.read_value(&mut reader))?)
    }
}

/// `clinstream.variables.v1`: one variable of one document.
#[derive(Debug, Serialize)]
pub struct VariableRecord<'a> {
    doc_id: &'a str,
    version: Option<&'a str>,
    patient: Option<&'a str>,
    encounter: Option<&'a str>,
    date: Option<&'a str>,
    entered_in_error: bool,
    variable: &'a str,
    /// Serialised by variant name: the schema's `Label` symbols.
    label: Label,
    confidence: f32,
    evidence: Vec<WindowRecord<'a>>,
    context_tokens: i64,
    mentions_found: i64,
    lexicon_version: &'a str,
    worker_version: &'a str,
}

#[derive(Debug, Serialize)]
struct WindowRecord<'a> {
    start: i64,
    end: i64,
    section: &'a str,
    weight: f32,
    tokens: i64,
    mentions: Vec<MentionRecord<'a>>,
    text: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct MentionRecord<'a> {
    start: i64,
    end: i64,
    section: &'a str,
    weight: f32,
    /// The schema's `Assertion` record: the five flags in its order.
    assertion: Assertion,
}

fn long(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn window<'a>(w: &'a Window, text: Option<&'a str>) -> WindowRecord<'a> {
    WindowRecord {
        start: long(w.start),
        end: long(w.end),
        section: w.section,
        weight: w.weight,
        tokens: long(w.tokens),
        mentions: w
            .mentions
            .iter()
            .map(|m| MentionRecord {
                start: long(m.start),
                end: long(m.end),
                section: m.section,
                weight: m.weight,
                assertion: m.assertion,
            })
            .collect(),
        text,
    }
}

impl<'a> VariableRecord<'a> {
    pub fn new(doc: &'a Document, v: &'a VariableResult, lexicon_version: &'a str, include_text: bool) -> Self {
        let n = &doc.note;
        VariableRecord {
            doc_id: &n.doc_id,
            version: n.version.as_deref(),
            patient: n.patient.as_deref(),
            encounter: n.encounter.as_deref(),
            date: n.date.as_deref(),
            entered_in_error: n.entered_in_error,
            variable: &v.variable,
            label: v.label,
            confidence: v.confidence,
            evidence: v
                .evidence
                .iter()
                .map(|w| window(w, include_text.then(|| n.text.get(w.start..w.end)).flatten()))
                .collect(),
            context_tokens: long(v.context_tokens),
            mentions_found: long(v.mentions_found),
            lexicon_version,
            worker_version: WORKER_VERSION,
        }
    }
}

/// Where a dead-lettered record came from (positions only).
#[derive(Debug, Clone)]
pub struct SourcePosition<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
}

/// `clinstream.dlq.v1`: why, where from, and the original bytes.
#[derive(Debug, Serialize)]
pub struct DeadLetterRecord<'a> {
    reason: &'static str,
    stage: &'static str,
    detail: &'a str,
    doc_id: Option<&'a str>,
    source_topic: &'a str,
    source_partition: i32,
    source_offset: i64,
    source_timestamp_ms: Option<i64>,
    worker_version: &'static str,
    #[serde(with = "serde_bytes_ref")]
    value: &'a [u8],
}

/// Bytes as Avro `bytes` (serde's default for a slice is a sequence).
mod serde_bytes_ref {
    pub fn serialize<S: serde::Serializer>(v: &&[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
}

impl<'a> DeadLetterRecord<'a> {
    pub fn new(letter: &'a DeadLetter, at: &SourcePosition<'a>, original: &'a [u8]) -> Self {
        DeadLetterRecord {
            reason: letter.code().as_str(),
            stage: letter.stage().as_str(),
            detail: &letter.error.detail,
            doc_id: letter.doc_id.as_deref(),
            source_topic: at.topic,
            source_partition: at.partition,
            source_offset: at.offset,
            source_timestamp_ms: at.timestamp_ms,
            worker_version: WORKER_VERSION,
            value: original,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use crate::error::{DocError, ErrorCode, Stage};
    use crate::source::Origin;
    use crate::stages::Pipeline;
    use apache_avro::GenericSingleObjectReader;
    use base64::Engine as _;

    fn document() -> Document {
        let settings = Settings::load_from(None, Some(Default::default())).unwrap();
        let pipeline = Pipeline::new(&settings).unwrap();
        let text = "HISTORY OF PRESENT ILLNESS: Cough and fever.\nASSESSMENT AND PLAN: Pneumonia; no pneumothorax. \
                    Start amoxicillin.\n";
        let event = serde_json::json!({
            "resourceType": "DocumentReference", "id": "d1", "status": "current",
            "meta": {"versionId": "2"}, "subject": {"reference": "Patient/p1"},
            "content": [{"attachment": {"contentType": "text/plain",
                "data": base64::engine::general_purpose::STANDARD.encode(text)}}]
        });
        pipeline.process(&serde_json::to_vec(&event).unwrap()).unwrap()
    }

    fn field<'a>(v: &'a Value, name: &str) -> &'a Value {
        let Value::Record(fields) = v else { panic!("not a record") };
        &fields.iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("no field {name}")).1
    }

    #[test]
    fn single_object_frames_read_back_with_apache_avros_own_reader() {
        let doc = document();
        let enc = Encoder::new(VARIABLES_SCHEMA, Framing::SingleObject).unwrap();
        assert_eq!(&enc.header()[..2], &[0xC3, 0x01]);
        assert_eq!(enc.header().len(), 10);
        let reader = GenericSingleObjectReader::builder().schema(enc.schema().clone()).build().unwrap();
        let pneumonia = doc.variables.iter().find(|v| v.variable == "pneumonia").unwrap();
        let bytes = enc.encode(&VariableRecord::new(&doc, pneumonia, "lex-1", false)).unwrap();
        let back = reader.read_value(&mut &bytes[..]).unwrap();
        assert_eq!(field(&back, "doc_id"), &Value::String("d1".into()));
        assert_eq!(field(&back, "version"), &Value::Union(1, Box::new(Value::String("2".into()))));
        assert_eq!(field(&back, "label"), &Value::Enum(0, "present".into()));
        let Value::Array(evidence) = field(&back, "evidence") else { panic!() };
        assert!(!evidence.is_empty());
        // No text unless configured.
        assert_eq!(field(&evidence[0], "text"), &Value::Union(0, Box::new(Value::Null)));
        let pneumothorax = doc.variables.iter().find(|v| v.variable == "pneumothorax").unwrap();
        let bytes = enc.encode(&VariableRecord::new(&doc, pneumothorax, "lex-1", true)).unwrap();
        let back = enc.decode(&bytes).unwrap();
        assert_eq!(field(&back, "label"), &Value::Enum(1, "absent".into()));
        let Value::Array(evidence) = field(&back, "evidence") else { panic!() };
        let Value::Union(1, text) = field(&evidence[0], "text") else { panic!("text expected with include_text") };
        assert!(matches!(&**text, Value::String(t) if t.contains("pneumothorax")));
    }

    #[test]
    fn every_variable_and_the_kg_delta_fit_their_schemas() {
        let doc = document();
        let vars = Encoder::new(VARIABLES_SCHEMA, Framing::SingleObject).unwrap();
        for v in &doc.variables {
            let bytes = vars.encode(&VariableRecord::new(&doc, v, "lex", true)).unwrap();
            assert_eq!(field(&vars.decode(&bytes).unwrap(), "variable"), &Value::String(v.variable.clone()));
        }
        let kg = Encoder::new(KG_SCHEMA, Framing::SingleObject).unwrap();
        let delta = &doc.kg;
        let back = kg.decode(&kg.encode(delta).unwrap()).unwrap();
        let Value::Array(nodes) = field(&back, "nodes") else { panic!() };
        assert_eq!(nodes.len(), delta.nodes.len());
        // A record framed for another schema is refused, not misread.
        let bytes = vars.encode(&VariableRecord::new(&doc, &doc.variables[0], "lex", false)).unwrap();
        assert!(kg.decode(&bytes).is_err());
    }

    #[test]
    fn dead_letters_keep_the_original_bytes() {
        let enc = Encoder::new(DLQ_SCHEMA, Framing::SingleObject).unwrap();
        let letter = DeadLetter {
            error: DocError::new(ErrorCode::InvalidJson, Stage::Decode, "expected value at line 1 column 1"),
            origin: Origin::Kafka { topic: "in".into(), partition: 3, offset: 42, entry: None },
            doc_id: None,
        };
        let original = b"\x00\xffnot json".to_vec();
        let at = SourcePosition { topic: "in", partition: 3, offset: 42, timestamp_ms: Some(1_700_000_000_000) };
        let back = enc.decode(&enc.encode(&DeadLetterRecord::new(&letter, &at, &original)).unwrap()).unwrap();
        assert_eq!(field(&back, "reason"), &Value::String("invalid_json".into()));
        assert_eq!(field(&back, "source_partition"), &Value::Int(3));
        assert_eq!(field(&back, "source_offset"), &Value::Long(42));
        assert_eq!(field(&back, "value"), &Value::Bytes(original));
    }

    #[test]
    fn confluent_framing_is_magic_byte_and_big_endian_schema_id() {
        let enc = Encoder::new(DLQ_SCHEMA, Framing::Confluent(0x0102_0304)).unwrap();
        assert_eq!(enc.header(), &[0, 1, 2, 3, 4]);
        // The tools read either framing with the compiled schema; a foreign single-object fingerprint is refused.
        let letter = DeadLetter {
            error: DocError::new(ErrorCode::InvalidJson, Stage::Decode, "x"),
            origin: Origin::Kafka { topic: "in".into(), partition: 0, offset: 1, entry: None },
            doc_id: None,
        };
        let at = SourcePosition { topic: "in", partition: 0, offset: 1, timestamp_ms: None };
        let framed = enc.encode(&DeadLetterRecord::new(&letter, &at, b"v")).unwrap();
        let single = Encoder::new(DLQ_SCHEMA, Framing::SingleObject).unwrap();
        assert_eq!(field(&single.decode(&framed).unwrap(), "reason"), &Value::String("invalid_json".into()));
        let kg = Encoder::new(KG_SCHEMA, Framing::SingleObject).unwrap();
        let dlq_single = single.encode(&DeadLetterRecord::new(&letter, &at, b"v")).unwrap();
        assert!(kg.decode(&dlq_single).is_err());
    }

    /// The schema-aware serializer writes exactly what apache-avro's generic path (serde → `Value`, resolved
    /// against the schema, validated, encoded) writes for the same records.
    #[test]
    fn records_are_the_bytes_of_the_generic_avro_path() {
        fn generic<T: Serialize>(enc: &Encoder, record: &T) -> Vec<u8> {
            let value = apache_avro::to_value(record).unwrap().resolve(enc.schema()).unwrap();
            let datum = GenericDatumWriter::builder(enc.schema()).build().unwrap().write_value_to_vec(value).unwrap();
            [enc.header(), &datum[..]].concat()
        }
        let doc = document();
        let vars = Encoder::new(VARIABLES_SCHEMA, Framing::SingleObject).unwrap();
        assert!(doc.variables.iter().any(|v| !v.evidence.is_empty()));
        for v in &doc.variables {
            for include_text in [false, true] {
                let record = VariableRecord::new(&doc, v, "lex", include_text);
                assert_eq!(vars.encode(&record).unwrap(), generic(&vars, &record), "{}", v.variable);
            }
        }
        let kg = Encoder::new(KG_SCHEMA, Framing::Confluent(7)).unwrap();
        assert!(!doc.kg.nodes.is_empty() && !doc.kg.edges.is_empty());
        assert_eq!(kg.encode(&doc.kg).unwrap(), generic(&kg, &doc.kg));
        let dlq = Encoder::new(DLQ_SCHEMA, Framing::SingleObject).unwrap();
        let letter = DeadLetter {
            error: DocError::new(ErrorCode::InvalidJson, Stage::Decode, "x"),
            origin: Origin::Kafka { topic: "in".into(), partition: 0, offset: 1, entry: None },
            doc_id: Some("d1".into()),
        };
        for timestamp_ms in [None, Some(1_700_000_000_000)] {
            let at = SourcePosition { topic: "in", partition: 2, offset: 9, timestamp_ms };
            let record = DeadLetterRecord::new(&letter, &at, b"\x00\xffbytes");
            assert_eq!(dlq.encode(&record).unwrap(), generic(&dlq, &record));
        }
        // One parse per schema for the process, however many encoders.
        assert!(std::ptr::eq(vars.schema(), Encoder::new(VARIABLES_SCHEMA, Framing::Confluent(1)).unwrap().schema()));
    }
}
