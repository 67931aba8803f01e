//! The query service's access control and audit trail against real parts: a real OpenID provider (npm
//! `oidc-provider` on loopback, `tools/oidc/provider.mjs`) minting the tokens, a real Kafka-protocol broker
//! receiving the audit records (read back with a `read_committed` consumer), the real model and the embedded store.
//!
//! Cases: a token for one patient gets 200 for that patient and the same 403 for another or for one that does not
//! exist; a care team's list; `system/*.read`; no clinical scope; ES256 and RS256; refused: no credentials, an
//! unknown key, another audience, another issuer, a tampered payload, `alg: none`, HS256 signed with the
//! provider's public key, an expired token; a key rotation at the provider picked up without a restart; the
//! provider down mid-run (known keys keep working, an unknown key is a 503) and at start-up (`/readyz` 503 until it
//! answers); every request audited exactly once on the topic; a request whose record cannot be delivered refused
//! (fail closed) or answered (fail open); PHI canaries in the question and the notes never in an audit record or
//! a log line.

mod common;
#[allow(unused_imports)] // the harness re-exports helpers this file does not use
mod kafka_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use clinstream::config::{Secret, Settings};
use common::oidc::{self, Provider};
use common::service::{self, call, ready};
use common::wait_until;
use rdkafka::message::Message;
use serde_json::{Value, json};

const NOTE_CANARY: &str = "ZEBRACANARY-Hollis-4471";
const QUESTION_CANARY: &str = "QUOKKACANARY-Marlow-9902";
const PATIENT: &str = "pat-alpha-7";
const OTHER: &str = "pat-beta-9";
const KEY: &str = "svc-key-Kq81";

fn settings(dir: &Path) -> Option<Settings> {
    let mut s = common::model_settings(dir)?;
    s.serve.api_keys = Secret::new(format!("ops:{KEY}"));
    s.serve.addr = "127.0.0.1:0".into();
    s.serve.cache_dir = std::env::temp_dir().join("clinstream-test-label-cache").display().to_string();
    s.serve.oidc.audience = "clinstream".into();
    s.serve.oidc.clock_skew_s = 0;
    s.serve.oidc.patients_claim = "patients".into();
    s.serve.oidc.allow_all_patients = true;
    s.serve.oidc.refresh_min_interval_ms = 200;
    s.serve.oidc.timeout_ms = 2_000;
    Some(s)
}

/// The two patients' notes: the first patient's carry a PHI canary.
fn notes() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("alpha-1", PATIENT, format!("FINDINGS: Small left pleural effusion. {NOTE_CANARY}.\n\nIMPRESSION: Effusion.")),
        ("alpha-2", PATIENT, "ASSESSMENT: Pleural effusion, enlarging; thoracentesis planned.".to_string()),
        ("beta-1", OTHER, "FINDINGS: Large right pneumothorax. No pleural effusion.".to_string()),
    ]
}

fn start(rt: &tokio::runtime::Runtime, s: &Settings) -> u16 {
    service::start(rt, s, &notes())
}

/// Requests sent, by request id, to check the audit topic against.
#[derive(Default)]
struct Sent(BTreeMap<String, u16>);

impl Sent {
    fn send(&mut self, port: u16, path: &str, bearer: Option<&str>, body: Value) -> (u16, Value) {
        let id = format!("t{}", self.0.len() + 1);
        let (status, v, answered) = call(port, path, bearer, &id, &body);
        assert_eq!(answered, id, "the request id comes back");
        self.0.insert(id, status);
        (status, v)
    }

    fn context(&mut self, port: u16, bearer: Option<&str>, patient: &str) -> (u16, Value) {
        let q = format!("Does the patient have a pleural effusion? {QUESTION_CANARY}");
        self.send(port, "/v1/context", bearer, json!({"patient": patient, "question": q}))
    }
}

fn hit_patients(v: &Value) -> Vec<String> {
    v["hits"].as_array().unwrap().iter().map(|h| h["payload"]["patient"].as_str().unwrap_or("").to_string()).collect()
}

#[test]
fn tokens_decide_who_sees_which_patient_and_every_request_is_audited_once() {
    let _ = service::logs();
    if !oidc::available() {
        return;
    }
    let Some(broker) = kafka_support::shared_broker() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    let keys = dir.path().join("keys.json");
    let mut provider = Provider::start(&keys, 0, PATIENT);
    // Another issuer signing with the very same keys: only the `iss` check can refuse its tokens.
    let stranger = Provider::start(&keys, 0, PATIENT);
    let topic = kafka_support::Names::new("audit").variables;
    kafka_support::create_topic(&broker, &topic, 1);
    s.serve.oidc.issuer = provider.issuer.clone();
    s.kafka.bootstrap_servers = broker.clone();
    s.serve.audit.topic = topic.clone();
    let rt = service::runtime();
    let port = start(&rt, &s);
    wait_until(Duration::from_secs(60), "ready once the provider's keys are loaded", || ready(port));
    let mut sent = Sent::default();

    // A token for one patient (SMART patient/*.read with the `patient` claim).
    let app = provider.token("app", "patient/*.read", None);
    let (st, v) = sent.context(port, Some(&app), PATIENT);
    assert_eq!(st, 200, "{v}");
    assert!(!v["windows"].as_array().unwrap().is_empty(), "{v}");
    let (st, other) = sent.context(port, Some(&app), OTHER);
    let (st2, nobody) = sent.context(port, Some(&app), "pat-does-not-exist");
    assert_eq!((st, st2), (403, 403));
    assert_eq!(other, nobody, "no hint whether the patient exists");
    assert_eq!(other["error"]["code"], "forbidden");
    // A search without a patient is narrowed to the token's patient; naming another is refused.
    let (st, v) = sent.send(port, "/v1/search", Some(&app), json!({"query": "pleural effusion", "top": 10}));
    assert_eq!(st, 200, "{v}");
    let patients = hit_patients(&v);
    assert!(!patients.is_empty() && patients.iter().all(|p| p == &format!("Patient/{PATIENT}")), "{patients:?}");
    let (st, _) = sent.send(
        port,
        "/v1/search",
        Some(&app),
        json!({"query": "pneumothorax", "patient": format!("Patient/{OTHER}")}),
    );
    assert_eq!(st, 403);

    // A care team's list: its patients, never a search across them all.
    let team = provider.token("teamapp", "patient/*.read", None);
    assert_eq!(sent.context(port, Some(&team), PATIENT).0, 200);
    assert_eq!(sent.context(port, Some(&team), OTHER).0, 403);
    assert_eq!(sent.send(port, "/v1/search", Some(&team), json!({"query": "effusion"})).0, 403);
    // system/*.read with allow_all_patients: every patient; no clinical scope: none.
    let backend = provider.token("backend", "system/*.read", None);
    assert_eq!(sent.context(port, Some(&backend), OTHER).0, 200);
    let (st, v) = sent.send(port, "/v1/search", Some(&backend), json!({"query": "pleural", "top": 20}));
    assert_eq!(st, 200);
    assert!(hit_patients(&v).contains(&format!("Patient/{OTHER}")), "{v}");
    let plain = provider.token("nobody", "openid", None);
    assert_eq!(sent.context(port, Some(&plain), PATIENT).0, 403);
    // ES256 as well as RS256.
    let es = provider.token("app", "patient/*.read", Some("urn:clinstream:es"));
    assert_eq!(oidc::parts(&es).0["alg"], "ES256");
    assert_eq!(sent.context(port, Some(&es), PATIENT).0, 200);
    // A service account's static key: every patient, recorded by its name.
    assert_eq!(sent.context(port, Some(KEY), OTHER).0, 200);

    // Refused with 401.
    let refused = |sent: &mut Sent, bearer: Option<&str>, why: &str| {
        let (st, v) = sent.context(port, bearer, PATIENT);
        assert_eq!(st, 401, "{why}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized", "{why}");
        v["error"]["message"].as_str().unwrap().to_string()
    };
    refused(&mut sent, None, "no credentials");
    refused(&mut sent, Some("not-a-key"), "unknown key");
    let m = refused(&mut sent, Some(&provider.token("app", "patient/*.read", Some("urn:other"))), "audience");
    assert!(m.contains("audience"), "{m}");
    let m = refused(&mut sent, Some(&stranger.token("app", "patient/*.read", None)), "issuer");
    assert!(m.contains("issuer"), "{m}");
    let (header, mut claims) = oidc::parts(&app);
    claims["patient"] = json!(OTHER);
    let m = refused(&mut sent, Some(&oidc::assemble(&header, &claims, oidc::signature(&app))), "tampered");
    assert!(m.contains("signature"), "{m}");
    let (_, claims) = oidc::parts(&app);
    refused(&mut sent, Some(&oidc::assemble(&json!({"alg": "none", "typ": "JWT"}), &claims, "")), "alg none");
    // HS256 "signed" with the provider's public RSA key as the HMAC secret (the classic confusion).
    let public =
        provider.jwks()["keys"].as_array().unwrap().iter().find(|k| k["kid"] == header["kid"]).unwrap().clone();
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header {
            kid: header["kid"].as_str().map(str::to_string),
            ..jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256)
        },
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(public.to_string().as_bytes()),
    )
    .unwrap();
    refused(&mut sent, Some(&confused), "HS256 with the public key");
    // An expired token (2 s lifetime, no clock skew here).
    let short = provider.token("shortlived", "patient/*.read", None);
    wait_until(Duration::from_secs(30), "the short-lived token to be refused as expired", || {
        let (st, v) = sent.context(port, Some(&short), PATIENT);
        st == 401 && v["error"]["message"] == "the token has expired"
    });

    // A key rotation at the provider: its new tokens are accepted without a restart.
    let kid = provider.rotate();
    let rotated = provider.token("app", "patient/*.read", None);
    assert_eq!(oidc::parts(&rotated).0["kid"], kid.as_str());
    assert_eq!(sent.context(port, Some(&rotated), PATIENT).0, 200);

    // The provider down mid-run: known keys keep working; a token naming an unknown key cannot be checked (503).
    provider.stop();
    assert_eq!(sent.context(port, Some(&app), PATIENT).0, 200);
    let (mut header, claims) = oidc::parts(&app);
    header["kid"] = json!("a-key-nobody-published");
    let unknown = oidc::assemble(&header, &claims, oidc::signature(&app));
    wait_until(Duration::from_secs(30), "503 for an unknown key while the provider is down", || {
        let (st, v) = sent.context(port, Some(&unknown), PATIENT);
        st == 503 && v["error"]["code"] == "auth_unavailable"
    });

    // Every request exactly once on the audit topic, with who, whom and how it ended.
    let records = kafka_support::read_all(&broker, &topic, true);
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for m in &records {
        let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
        by_id.entry(key).or_default().push(serde_json::from_slice(m.payload().unwrap()).unwrap());
    }
    assert_eq!(by_id.len(), sent.0.len(), "one record per request: {:?}", by_id.keys().collect::<Vec<_>>());
    for (id, status) in &sent.0 {
        let events = &by_id[id];
        assert_eq!(events.len(), 1, "{id} audited {} times", events.len());
        let e = &events[0];
        assert_eq!(e["resourceType"], "AuditEvent");
        assert_eq!(e["outcomeDesc"], format!("HTTP {status}"), "{id}");
        assert_eq!(
            e["outcome"],
            if *status == 200 {
                "0"
            } else if *status < 500 {
                "4"
            } else {
                "8"
            }
        );
    }
    let first = &by_id["t1"][0];
    assert_eq!(first["agent"][0]["who"]["identifier"]["value"], "app");
    assert_eq!(first["agent"][0]["who"]["identifier"]["system"], s.serve.oidc.issuer.as_str());
    assert_eq!(first["agent"][0]["altId"], "app");
    let refs: Vec<&str> =
        first["entity"].as_array().unwrap().iter().filter_map(|x| x["what"]["reference"].as_str()).collect();
    assert!(refs.contains(&format!("Patient/{PATIENT}").as_str()), "{refs:?}");
    assert!(refs.contains(&"DocumentReference/alpha-1"), "the documents returned: {refs:?}");
    assert!(!refs.iter().any(|r| r.contains("beta")), "{refs:?}");
    let denied = &by_id["t2"][0];
    assert!(denied["entity"].to_string().contains(&format!("Patient/{OTHER}")), "the patient asked for: {denied}");
    assert!(!denied["entity"].to_string().contains("DocumentReference"), "nothing returned: {denied}");
    let by_key =
        by_id.values().flatten().find(|e| e["agent"][0]["who"]["identifier"]["system"] == "urn:clinstream:api-key");
    assert_eq!(by_key.unwrap()["agent"][0]["who"]["identifier"]["value"], "ops");
    let all: String = by_id.values().flatten().map(Value::to_string).collect();
    for secret in [NOTE_CANARY, QUESTION_CANARY, KEY, &app[..40], "pleural", "effusion"] {
        assert!(!all.contains(secret), "an audit record holds {secret}");
    }

    // Nothing of the questions, notes, keys, tokens or patients in the logs.
    let log = service::log_text();
    assert!(log.contains("signing keys are loaded"), "the logs were captured: {log}");
    for secret in [NOTE_CANARY, QUESTION_CANARY, KEY, &app[..40], PATIENT, OTHER] {
        assert!(!log.contains(secret), "a log line holds {secret}");
    }
    let metrics = common::http_get(port, "/metrics").unwrap().1;
    assert!(
        common::metric_value(&metrics, "clinstream_api_denials_total{reason=\"forbidden_patient\"}").unwrap() >= 6.0
    );
    assert!(
        common::metric_value(&metrics, "clinstream_audit_records_total{outcome=\"delivered\",sink=\"kafka\"}").unwrap()
            >= sent.0.len() as f64
    );
    drop(stranger);
}

#[test]
fn a_provider_down_at_start_up_keeps_the_service_not_ready_and_audits_fail_closed() {
    let _ = service::logs();
    if !oidc::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    let provider_port = common::free_port();
    s.serve.oidc.issuer = format!("http://127.0.0.1:{provider_port}");
    // The audit topic's cluster: nothing listens there, so no record can be delivered.
    s.kafka.bootstrap_servers = format!("127.0.0.1:{}", common::free_port());
    s.serve.audit.topic = "audit".into();
    s.serve.audit.timeout_ms = 1_000;
    let rt = service::runtime();
    let port = start(&rt, &s);
    let mut sent = Sent::default();

    // No provider: not ready, and a token cannot be checked (503, never a pass).
    assert!(!ready(port), "ready without the provider's keys");
    let (header, claims) = (json!({"alg": "RS256", "kid": "k"}), json!({"patient": PATIENT}));
    let (st, v) = sent.context(port, Some(&oidc::assemble(&header, &claims, "c2ln")), PATIENT);
    assert_eq!((st, v["error"]["code"].as_str()), (503, Some("auth_unavailable")), "{v}");
    // A static key gets through, but its audit record cannot be delivered: refused (fail closed).
    let (st, v) = sent.context(port, Some(KEY), PATIENT);
    assert_eq!((st, v["error"]["code"].as_str()), (503, Some("audit_unavailable")), "{v}");

    // The provider comes up: the service becomes ready and accepts its tokens, without a restart.
    let provider = Provider::start(&dir.path().join("keys.json"), provider_port, PATIENT);
    wait_until(Duration::from_secs(60), "ready once the provider answers", || ready(port));
    let (st, v) = sent.context(port, Some(&provider.token("app", "patient/*.read", None)), PATIENT);
    assert_eq!((st, v["error"]["code"].as_str()), (503, Some("audit_unavailable")), "still audited first: {v}");

    // Fail open: answered, the failed record counted.
    s.serve.audit.fail_closed = false;
    s.store.path = dir.path().join("qdrant-open").display().to_string();
    let open = start(&rt, &s);
    wait_until(Duration::from_secs(60), "the second service ready", || ready(open));
    let (st, v) = sent.context(open, Some(&provider.token("app", "patient/*.read", None)), PATIENT);
    assert_eq!(st, 200, "{v}");
    let metrics = common::http_get(open, "/metrics").unwrap().1;
    assert!(
        common::metric_value(&metrics, "clinstream_audit_records_total{outcome=\"failed\",sink=\"kafka\"}").unwrap()
            >= 1.0
    );
}

/// The OpenAPI document against the running service (`/v1/context`, `/v1/search`) with Schemathesis (PyPI, `make tools` puts it in
/// .tools/schemathesis): every check, a fixed seed and a bounded number of examples per operation, failing on any
/// finding — a 5xx, a response outside the document, a valid request refused, an invalid one accepted, auth not
/// enforced. `CLINSTREAM_SCHEMATHESIS_SEED` and `CLINSTREAM_SCHEMATHESIS_EXAMPLES` change the run.
#[test]
fn the_service_keeps_its_openapi_contract_under_schemathesis() {
    let _ = service::logs();
    let tool = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/schemathesis");
    if !tool.join("schemathesis").is_dir() {
        assert!(
            std::env::var("CLINSTREAM_REQUIRE_SCHEMATHESIS").as_deref() != Ok("1"),
            "Schemathesis missing: run `make tools` (.tools/schemathesis)"
        );
        eprintln!("SKIPPED: Schemathesis missing (run `make tools`)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let rt = service::runtime();
    let port = start(&rt, &s);
    let seed = std::env::var("CLINSTREAM_SCHEMATHESIS_SEED").unwrap_or_else(|_| "20261127".into());
    let examples = std::env::var("CLINSTREAM_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "50".into());
    let out = std::process::Command::new("python3")
        .args(["-m", "schemathesis.cli", "run"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json"))
        .args(["--url", &format!("http://127.0.0.1:{port}")])
        .args(["--header", &format!("Authorization: Bearer {KEY}")])
        .args(["--checks", "all", "--seed", &seed, "--max-examples", &examples, "--workers", "1"])
        // No LLM here: /v1/answer would answer 501 to everything (its contract is tests/answer.rs's).
        .args(["--exclude-path", "/v1/answer"])
        .args(["--report-dir"])
        .arg(dir.path().join("report"))
        .current_dir(dir.path()) // its caches land there, not in the clone
        .env("PYTHONPATH", &tool)
        .env("SCHEMATHESIS_HOOKS", "")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let summary: Vec<&str> = text.lines().rev().take(12).collect::<Vec<_>>().into_iter().rev().collect();
    eprintln!("Schemathesis (seed {seed}, {examples} examples per operation):\n{}", summary.join("\n"));
    assert!(out.status.success(), "Schemathesis found problems (seed {seed}):\n{text}");
    // "Test cases: N generated, M passed, ...": M must be more than none (a bare "0 passed" check would also
    // match "370 passed").
    let passed = text
        .lines()
        .find(|l| l.contains("generated,"))
        .and_then(|l| l.split(',').find_map(|part| part.trim().strip_suffix(" passed")?.trim().parse::<u64>().ok()));
    assert!(passed.is_some_and(|n| n > 0), "Schemathesis ran nothing:\n{text}");
}
