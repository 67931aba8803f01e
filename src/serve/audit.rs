//! The audit trail: one record per query-service request — when, who, which patient, which route, the outcome,
//! what was returned (counts and document ids), the request id — as a FHIR R4 `AuditEvent`. Never the question,
//! never note text, never a key or a token.
//!
//! In: an `AuditRecord` built by the routes once a request's answer is known. Out: the record delivered to
//! `serve.audit.topic` on `kafka.bootstrap_servers` (an idempotent producer with `acks=all`, the worker outputs'
//! guarantee; keyed by request id), or, with no topic, written to the log under the target `clinstream::audit`
//! with patient and document ids replaced by keyed pseudonyms (HMAC-SHA-256 under `serve.audit.log_key`), since
//! logs must not carry identifiers. `record` returns once the record is delivered; when it cannot be within
//! `serve.audit.timeout_ms` the routes refuse the request with 503 (`serve.audit.fail_closed`, the default) or
//! answer it and count the failure. `clinstream_audit_records_total{sink, outcome}` counts both.

use std::time::{Duration, SystemTime};

use rdkafka::producer::{FutureProducer, FutureRecord};
use ring::hmac;
use serde_json::{Value, json};

use super::access::Who;
use super::{AnswerResponse, ContextResponse, SearchResponse};
use crate::config::Settings;
use crate::telemetry::metrics::metrics;

/// What happened in one request.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub request_id: String,
    pub recorded: SystemTime,
    /// `context` or `search` (`answer` as it comes).
    pub route: &'static str,
    /// None when the caller could not be identified (401).
    pub who: Option<Who>,
    /// The patient asked about (`Patient/123`), when the request named one.
    pub patient: Option<String>,
    pub status: u16,
    /// Windows and chunks (context) or hits (search) returned.
    pub returned: usize,
    /// The distinct documents the answer holds text of.
    pub documents: Vec<String>,
}

impl AuditRecord {
    /// The record as a FHIR R4 `AuditEvent`, identifiers written by `id` (as they are, or pseudonymised).
    pub fn event(&self, id: &dyn Fn(&str) -> String) -> Value {
        let outcome = match self.status {
            200..=299 => "0",
            400..=499 => "4",
            _ => "8",
        };
        let agent = match &self.who {
            Some(Who::Token { issuer, subject, client_id }) => json!({
                "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/extra-security-role-type",
                                     "code": "humanuser", "display": "human user"}]},
                "who": {"identifier": {"system": issuer, "value": subject.clone().unwrap_or_default()}},
                "altId": client_id.clone().unwrap_or_default(),
                "requestor": true
            }),
            Some(Who::Key { name }) => json!({
                "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/extra-security-role-type",
                                     "code": "dataprocessor", "display": "data processor"}]},
                "who": {"identifier": {"system": "urn:clinstream:api-key", "value": name}},
                "requestor": true
            }),
            Some(Who::Operator { user }) => json!({
                "type": {"coding": [{"system": "http://terminology.hl7.org/CodeSystem/extra-security-role-type",
                                     "code": "humanuser", "display": "human user"}]},
                "who": {"identifier": {"system": "urn:clinstream:local-operator", "value": user}},
                "requestor": true
            }),
            Some(Who::Anonymous) => json!({
                "who": {"display": "anonymous (serve.auth = false)"}, "requestor": true
            }),
            None => json!({"who": {"display": "unidentified"}, "requestor": true}),
        };
        let mut entity = vec![json!({
            "type": {"system": "http://terminology.hl7.org/CodeSystem/audit-entity-type", "code": "2",
                     "display": "System Object"},
            "role": {"system": "http://terminology.hl7.org/CodeSystem/object-role", "code": "24", "display": "Query"},
            "detail": [
                {"type": "request_id", "valueString": self.request_id},
                {"type": "returned", "valueString": self.returned.to_string()}
            ]
        })];
        if let Some(p) = &self.patient {
            entity.push(json!({
                "what": {"reference": id(p)},
                "type": {"system": "http://terminology.hl7.org/CodeSystem/audit-entity-type", "code": "1",
                         "display": "Person"},
                "role": {"system": "http://terminology.hl7.org/CodeSystem/object-role", "code": "1",
                         "display": "Patient"}
            }));
        }
        for d in &self.documents {
            entity.push(json!({
                "what": {"reference": id(&format!("DocumentReference/{d}"))},
                "type": {"system": "http://terminology.hl7.org/CodeSystem/audit-entity-type", "code": "2",
                         "display": "System Object"},
                "role": {"system": "http://terminology.hl7.org/CodeSystem/object-role", "code": "4",
                         "display": "Domain Resource"}
            }));
        }
        json!({
            "resourceType": "AuditEvent",
            "id": self.request_id,
            "type": {"system": "http://dicom.nema.org/resources/ontology/DCM", "code": "110112", "display": "Query"},
            "subtype": [{"system": "urn:clinstream:api", "code": format!("/v1/{}", self.route)}],
            "action": "E",
            "recorded": humantime::format_rfc3339_millis(self.recorded).to_string(),
            "outcome": outcome,
            "outcomeDesc": format!("HTTP {}", self.status),
            "agent": [agent],
            "source": {
                "observer": {"display": "clinstream query service"},
                "type": [{"system": "http://terminology.hl7.org/CodeSystem/security-source-type", "code": "4",
                          "display": "Application Server"}]
            },
            "entity": entity
        })
    }
}

/// What an answer returned, for the audit trail: how many passages or hits, and the distinct documents.
pub trait Returned {
    fn returned(&self) -> (usize, Vec<String>);
}

fn doc_of(payload: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    payload.get("doc_id").and_then(|d| d.as_str()).map(str::to_string)
}

impl Returned for ContextResponse {
    fn returned(&self) -> (usize, Vec<String>) {
        let docs: std::collections::BTreeSet<String> = self
            .windows
            .iter()
            .map(|w| w.doc_id.clone())
            .chain(self.chunks.iter().filter_map(|c| doc_of(&c.payload)))
            .chain(self.facts.iter().flat_map(|f| f.doc_ids.iter().cloned()))
            .collect();
        (self.windows.len() + self.chunks.len(), docs.into_iter().collect())
    }
}

impl Returned for SearchResponse {
    fn returned(&self) -> (usize, Vec<String>) {
        let docs: std::collections::BTreeSet<String> = self
            .hits
            .iter()
            .flat_map(|h| [Some(h), h.previous.as_deref(), h.next.as_deref()])
            .flatten()
            .filter_map(|h| doc_of(&h.payload))
            .collect();
        (self.hits.len(), docs.into_iter().collect())
    }
}

impl Returned for AnswerResponse {
    /// The passages the model was given, and their notes (its answer may draw on any of them).
    fn returned(&self) -> (usize, Vec<String>) {
        (self.passages, self.sources.clone())
    }
}

/// Why a record was not delivered.
#[derive(Debug, thiserror::Error)]
#[error("the audit record was not delivered: {0}")]
pub struct AuditError(String);

/// Where records go.
pub enum Auditor {
    Log { key: hmac::Key },
    Kafka { producer: FutureProducer, topic: String, timeout: Duration },
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auditor::Log { .. } => "Auditor::Log",
            Auditor::Kafka { .. } => "Auditor::Kafka",
        })
    }
}

impl Auditor {
    /// From `serve.audit.*` (and `kafka.*` for the topic's cluster).
    pub fn new(settings: &Settings) -> Result<Auditor, String> {
        let a = &settings.serve.audit;
        if a.topic.trim().is_empty() {
            let key = if a.log_key.expose().is_empty() {
                hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
                    .map_err(|_| "serve.audit: no random key could be made".to_string())?
            } else {
                hmac::Key::new(hmac::HMAC_SHA256, a.log_key.expose().as_bytes())
            };
            return Ok(Auditor::Log { key });
        }
        let k = &settings.kafka;
        let mut config = crate::kafka::client_config(k, &std::collections::BTreeMap::new());
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", a.timeout_ms.max(1).to_string())
            .set("linger.ms", "0");
        for (key, value) in &k.producer {
            // The worker's producer map, but never its transactional id: the audit producer is not transactional.
            if key != "transactional.id" {
                config.set(key, value);
            }
        }
        let producer: FutureProducer =
            config.create().map_err(|e| format!("serve.audit: the Kafka producer could not be made: {e}"))?;
        Ok(Auditor::Kafka { producer, topic: a.topic.trim().to_string(), timeout: Duration::from_millis(a.timeout_ms) })
    }

    /// Delivers one record (waits for the broker's acknowledgement with Kafka).
    pub async fn record(&self, record: &AuditRecord) -> Result<(), AuditError> {
        let (sink, result) = match self {
            Auditor::Log { key } => {
                let event = pseudonymised(key, record);
                tracing::info!(target: "clinstream::audit", audit_event = %event, "Audit record.");
                ("log", Ok(()))
            }
            Auditor::Kafka { producer, topic, timeout } => {
                let payload = record.event(&|id: &str| id.to_string()).to_string();
                let delivery = producer.send(
                    FutureRecord::to(topic).key(record.request_id.as_bytes()).payload(payload.as_bytes()),
                    *timeout,
                );
                let result = match tokio::time::timeout(*timeout + Duration::from_millis(500), delivery).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => {
                        Err(AuditError(e.rdkafka_error_code().map_or("refused".into(), |c| format!("{c:?}"))))
                    }
                    Err(_) => Err(AuditError("not acknowledged in time".into())),
                };
                ("kafka", result)
            }
        };
        let outcome = if result.is_ok() { "delivered" } else { "failed" };
        metrics().audit_records.with_label_values(&[sink, outcome]).inc();
        result
    }
}

/// The record's event with every patient and document id replaced by its keyed pseudonym (the first 96 bits of
/// HMAC-SHA-256, hex): the same id gives the same pseudonym under one key, and whoever holds the key can find an
/// id's records; the log itself holds no identifier.
fn pseudonymised(key: &hmac::Key, record: &AuditRecord) -> Value {
    record.event(&|id: &str| {
        let tag = hmac::sign(key, id.as_bytes());
        let hex: String = tag.as_ref()[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("pseudonym:{hex}")
    })
}

/// A request id: the caller's `X-Request-Id` when it is short and plain (letters, digits, `-`, `.`; FHIR's id
/// rule), otherwise 32 random hex digits.
pub fn request_id(given: Option<&str>) -> String {
    if let Some(g) = given.map(str::trim)
        && (1..=64).contains(&g.len())
        && g.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return g.to_string();
    }
    let mut bytes = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AuditRecord {
        AuditRecord {
            request_id: "r-1".into(),
            recorded: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            route: "context",
            who: Some(Who::Token {
                issuer: "https://idp.example.org".into(),
                subject: Some("dr-who".into()),
                client_id: Some("ward-app".into()),
            }),
            patient: Some("Patient/p1".into()),
            status: 200,
            returned: 3,
            documents: vec!["d1".into(), "d2".into()],
        }
    }

    #[test]
    fn an_audit_event_says_who_whom_what_and_how_it_ended() {
        let e = record().event(&|id: &str| id.to_string());
        assert_eq!(e["resourceType"], "AuditEvent");
        assert_eq!(e["id"], "r-1");
        assert_eq!(e["outcome"], "0");
        assert_eq!(e["recorded"], "2027-01-15T08:00:00.000Z");
        assert_eq!(e["subtype"][0]["code"], "/v1/context");
        assert_eq!(e["agent"][0]["who"]["identifier"]["value"], "dr-who");
        assert_eq!(e["agent"][0]["altId"], "ward-app");
        let refs: Vec<&str> =
            e["entity"].as_array().unwrap().iter().filter_map(|x| x["what"]["reference"].as_str()).collect();
        assert_eq!(refs, ["Patient/p1", "DocumentReference/d1", "DocumentReference/d2"]);
        let mut denied = record();
        denied.status = 403;
        denied.who = Some(Who::Key { name: "ops".into() });
        let e = denied.event(&|id: &str| id.to_string());
        assert_eq!(e["outcome"], "4");
        assert_eq!(e["agent"][0]["who"]["identifier"]["value"], "ops");
    }

    #[tokio::test]
    async fn the_log_sink_pseudonymises_identifiers() {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"k");
        let text = pseudonymised(&key, &record()).to_string();
        for id in ["p1", "d1", "d2"] {
            assert!(!text.contains(id), "{id} in {text}");
        }
        assert!(text.contains("dr-who") && text.contains("r-1"), "who and the request id stay: {text}");
        assert_eq!(text, pseudonymised(&key, &record()).to_string(), "stable under one key");
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"other");
        assert_ne!(text, pseudonymised(&other, &record()).to_string(), "keyed");
        Auditor::Log { key }.record(&record()).await.unwrap();
    }

    #[test]
    fn request_ids_are_plain_or_made() {
        assert_eq!(request_id(Some("abc-123.x")), "abc-123.x");
        for bad in [None, Some(""), Some("has space"), Some("new\nline"), Some(&"x".repeat(65)[..])] {
            let made = request_id(bad);
            assert_eq!(made.len(), 32, "{bad:?}");
            assert!(made.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        assert_ne!(request_id(None), request_id(None));
    }
}
