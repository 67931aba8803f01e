//! Avro encoding of the output records (`schemas/*.avsc`, compiled in).
//!
//! Framing, chosen by `kafka.schema_registry.url`:
//! * empty (default) — Avro single-object encoding: `C3 01`, the schema's CRC-64-AVRO (Rabin) fingerprint in
//!   little-endian, then the datum. Self-describing: a consumer holding the `.avsc` files recognises the schema.
//! * set — Confluent wire format: `00`, the registry's schema id (big-endian u32), then the datum.
//!
//! Records are built as `apache_avro::types::Value` by hand, field by field, so the schema (not serde's
//! integer mapping) decides the Avro types, and a schema change that the code does not follow fails the
//! round-trip tests instead of producing silently different bytes.

use apache_avro::Schema;
use apache_avro::types::Value;

use crate::WORKER_VERSION;
use crate::model::{DeadLetter, Document, VariableResult, Window};

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

/// One schema with its frame header.
#[derive(Debug, Clone)]
pub struct Encoder {
    schema: Schema,
    header: Vec<u8>,
}

impl Encoder {
    pub fn new(schema_json: &str, framing: Framing) -> Result<Self, apache_avro::Error> {
        let schema = Schema::parse_str(schema_json)?;
        let header = match framing {
            Framing::SingleObject => {
                use apache_avro::headers::{HeaderBuilder, RabinFingerprintHeader};
                RabinFingerprintHeader::from_schema(&schema).build_header()
            }
            Framing::Confluent(id) => {
                let mut h = vec![0x00];
                h.extend_from_slice(&id.to_be_bytes());
                h
            }
        };
        Ok(Self { schema, header })
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    pub fn header(&self) -> &[u8] {
        &self.header
    }

    /// Frame header + datum. Fails only when the value does not match the schema (a bug).
    pub fn encode(&self, value: Value) -> Result<Vec<u8>, apache_avro::Error> {
        let value = value.resolve(&self.schema)?;
        let datum =
            apache_avro::writer::datum::GenericDatumWriter::builder(&self.schema).build()?.write_value_to_vec(value)?;
        let mut out = Vec::with_capacity(self.header.len() + datum.len());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(&datum);
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
        Ok(apache_avro::reader::datum::GenericDatumReader::builder(&self.schema)
            .build()
            .and_then(|r| r.read_value(&mut reader))?)
    }
}

fn string(s: &str) -> Value {
    Value::String(s.to_string())
}

fn opt_string(s: Option<&str>) -> Value {
    match s {
        Some(s) => Value::Union(1, Box::new(string(s))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn long(n: usize) -> Value {
    Value::Long(i64::try_from(n).unwrap_or(i64::MAX))
}

fn record(fields: Vec<(&str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn window(w: &Window, text: Option<&str>) -> Value {
    let mentions = w
        .mentions
        .iter()
        .map(|m| {
            let a = m.assertion;
            record(vec![
                ("start", long(m.start)),
                ("end", long(m.end)),
                ("section", string(m.section)),
                ("weight", Value::Float(m.weight)),
                (
                    "assertion",
                    record(vec![
                        ("negated", Value::Boolean(a.negated)),
                        ("uncertain", Value::Boolean(a.uncertain)),
                        ("historical", Value::Boolean(a.historical)),
                        ("family", Value::Boolean(a.family)),
                        ("hypothetical", Value::Boolean(a.hypothetical)),
                    ]),
                ),
            ])
        })
        .collect();
    record(vec![
        ("start", long(w.start)),
        ("end", long(w.end)),
        ("section", string(w.section)),
        ("weight", Value::Float(w.weight)),
        ("tokens", long(w.tokens)),
        ("mentions", Value::Array(mentions)),
        ("text", opt_string(text)),
    ])
}

/// The `clinstream.variables.v1` record of one variable of one document.
pub fn variable_value(doc: &Document, v: &VariableResult, lexicon_version: &str, include_text: bool) -> Value {
    let n = &doc.note;
    let evidence =
        v.evidence.iter().map(|w| window(w, include_text.then(|| n.text.get(w.start..w.end)).flatten())).collect();
    let label_index = match v.label {
        crate::model::Label::Present => 0,
        crate::model::Label::Absent => 1,
        crate::model::Label::Uncertain => 2,
        crate::model::Label::NotMentioned => 3,
    };
    record(vec![
        ("doc_id", string(&n.doc_id)),
        ("version", opt_string(n.version.as_deref())),
        ("patient", opt_string(n.patient.as_deref())),
        ("encounter", opt_string(n.encounter.as_deref())),
        ("date", opt_string(n.date.as_deref())),
        ("entered_in_error", Value::Boolean(n.entered_in_error)),
        ("variable", string(&v.variable)),
        ("label", Value::Enum(label_index, v.label.as_str().to_string())),
        ("confidence", Value::Float(v.confidence)),
        ("evidence", Value::Array(evidence)),
        ("context_tokens", long(v.context_tokens)),
        ("mentions_found", long(v.mentions_found)),
        ("lexicon_version", string(lexicon_version)),
        ("worker_version", string(WORKER_VERSION)),
    ])
}

/// The `clinstream.kg.v1` record of one document (serde mapping; the delta holds strings, enums and arrays).
pub fn kg_value(delta: &crate::model::KgDelta) -> Result<Value, apache_avro::Error> {
    apache_avro::to_value(delta)
}

/// Where a dead-lettered record came from (positions only).
#[derive(Debug, Clone)]
pub struct SourcePosition<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
}

/// The `clinstream.dlq.v1` record: why, where from, and the original bytes.
pub fn dead_letter_value(letter: &DeadLetter, at: &SourcePosition<'_>, original: &[u8]) -> Value {
    record(vec![
        ("reason", string(letter.code().as_str())),
        ("stage", string(letter.stage().as_str())),
        ("detail", string(&letter.error.detail)),
        ("doc_id", opt_string(letter.doc_id.as_deref())),
        ("source_topic", string(at.topic)),
        ("source_partition", Value::Int(at.partition)),
        ("source_offset", Value::Long(at.offset)),
        (
            "source_timestamp_ms",
            match at.timestamp_ms {
                Some(t) => Value::Union(1, Box::new(Value::Long(t))),
                None => Value::Union(0, Box::new(Value::Null)),
            },
        ),
        ("worker_version", string(WORKER_VERSION)),
        ("value", Value::Bytes(original.to_vec())),
    ])
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
        let bytes = enc.encode(variable_value(&doc, pneumonia, "lex-1", false)).unwrap();
        let back = reader.read_value(&mut &bytes[..]).unwrap();
        assert_eq!(field(&back, "doc_id"), &Value::String("d1".into()));
        assert_eq!(field(&back, "version"), &Value::Union(1, Box::new(Value::String("2".into()))));
        assert_eq!(field(&back, "label"), &Value::Enum(0, "present".into()));
        let Value::Array(evidence) = field(&back, "evidence") else { panic!() };
        assert!(!evidence.is_empty());
        // No text unless configured.
        assert_eq!(field(&evidence[0], "text"), &Value::Union(0, Box::new(Value::Null)));
        let pneumothorax = doc.variables.iter().find(|v| v.variable == "pneumothorax").unwrap();
        let bytes = enc.encode(variable_value(&doc, pneumothorax, "lex-1", true)).unwrap();
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
            let bytes = vars.encode(variable_value(&doc, v, "lex", true)).unwrap();
            assert_eq!(field(&vars.decode(&bytes).unwrap(), "variable"), &Value::String(v.variable.clone()));
        }
        let kg = Encoder::new(KG_SCHEMA, Framing::SingleObject).unwrap();
        let delta = &doc.kg;
        let back = kg.decode(&kg.encode(kg_value(delta).unwrap()).unwrap()).unwrap();
        let Value::Array(nodes) = field(&back, "nodes") else { panic!() };
        assert_eq!(nodes.len(), delta.nodes.len());
        // A record framed for another schema is refused, not misread.
        let bytes = vars.encode(variable_value(&doc, &doc.variables[0], "lex", false)).unwrap();
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
        let back = enc.decode(&enc.encode(dead_letter_value(&letter, &at, &original)).unwrap()).unwrap();
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
        let framed = enc.encode(dead_letter_value(&letter, &at, b"v")).unwrap();
        let single = Encoder::new(DLQ_SCHEMA, Framing::SingleObject).unwrap();
        assert_eq!(field(&single.decode(&framed).unwrap(), "reason"), &Value::String("invalid_json".into()));
        let kg = Encoder::new(KG_SCHEMA, Framing::SingleObject).unwrap();
        let dlq_single = single.encode(dead_letter_value(&letter, &at, b"v")).unwrap();
        assert!(kg.decode(&dlq_single).is_err());
    }
}
