//! The query service against both stores with the real model (all-MiniLM-L6-v2 on ONNX Runtime, `make model`),
//! the Qdrant engine in-process and a real Qdrant server (`tests/common/qdrant.rs`): auth, patient isolation,
//! filters, bad requests, a store going down (503) and back, a new version of a note replacing the old one in
//! answers, neighbour expansion, metrics; and, as processes, `clinstream run` then `clinstream serve` on one
//! embedded store, `clinstream context` (the CLI twin) answering what the API answers, and a worker serving the
//! API while it consumes.
//!
//! The concept-label embeddings (about 22,000 labels) are built once and cached in the temp directory for every
//! test here (`serve.cache_dir`), as a restart finds them in production.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clinstream::config::{Secret, Settings};
use clinstream::http::Readiness;
use clinstream::index::Indexer;
use clinstream::serve::{Service, routes};
use clinstream::stages::Pipeline;
use serde_json::{Value, json};

const KEY: &str = "test-key-1";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn label_cache() -> PathBuf {
    std::env::temp_dir().join("clinstream-test-label-cache")
}

fn settings(dir: &Path) -> Option<Settings> {
    let mut s = common::model_settings(dir)?;
    s.serve.api_keys = Secret::new(format!("other-key, {KEY}"));
    s.serve.addr = "127.0.0.1:0".into();
    s.serve.cache_dir = label_cache().display().to_string();
    s.serve.max_budget_tokens = 2048;
    s.serve.max_body_bytes = 4096;
    s.serve.max_top = 20;
    Some(s)
}

fn server_settings(dir: &Path, server: &common::qdrant::QdrantServer) -> Option<Settings> {
    let mut s = settings(dir)?;
    s.store.kind = "qdrant".into();
    s.store.url = server.url.clone();
    s.store.api_key = Secret::new(server.api_key.clone());
    s.store.collection = common::qdrant::unique_collection("serve");
    s.store.timeout_ms = 5_000;
    Some(s)
}

fn note(id: &str, version: &str, status: &str, patient: &str, date: &str, doc_type: &str, text: &str) -> Vec<u8> {
    use base64::Engine;
    serde_json::to_vec(&json!({
        "resourceType": "DocumentReference", "id": id, "status": status, "date": date,
        "meta": {"versionId": version},
        "type": {"text": doc_type},
        "subject": {"reference": patient},
        "content": [{"attachment": {"contentType": "text/plain",
            "data": base64::engine::general_purpose::STANDARD.encode(text)}}]
    }))
    .unwrap()
}

fn filler(n: usize) -> String {
    ["The", "patient", "was", "seen", "today", "and", "vital", "signs", "were", "reviewed."]
        .iter()
        .cycle()
        .take(n)
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The notes every scenario starts from: p1 has effusion notes of two types and dates, p2 a pneumothorax.
fn records() -> Vec<Vec<u8>> {
    vec![
        note(
            "p1-a",
            "1",
            "current",
            "Patient/p1",
            "2024-01-10",
            "Radiology report",
            &format!(
                "FINDINGS: Small left pleural effusion. {}\n\nIMPRESSION: Small left pleural effusion.",
                filler(30)
            ),
        ),
        note(
            "p1-b",
            "1",
            "current",
            "Patient/p1",
            "2024-03-05",
            "Progress note",
            &format!(
                "HISTORY OF PRESENT ILLNESS: Dyspnea. {}\n\nASSESSMENT AND PLAN: Pleural effusion, enlarging; \
                 thoracentesis planned, treated with furosemide. {}",
                filler(40),
                filler(300)
            ),
        ),
        note(
            "p2-a",
            "1",
            "current",
            "Patient/p2",
            "2024-02-01",
            "Radiology report",
            "FINDINGS: Large right pneumothorax. No pleural effusion. The heart is not enlarged.\n\nIMPRESSION: Large \
             right pneumothorax.",
        ),
    ]
}

/// A running service over a store the test indexes into.
struct Running {
    port: u16,
    indexer: Arc<Indexer>,
    pipeline: Arc<Pipeline>,
}

impl Running {
    async fn start(s: &Settings) -> Running {
        let pipeline = Arc::new(Pipeline::new(s).unwrap());
        let indexer = Arc::new(Indexer::start(s, pipeline.compiled()).await.unwrap());
        let r = Running { port: 0, indexer, pipeline };
        for rec in records() {
            r.index(&rec).await;
        }
        // As a file run leaves the store: the summary trees' vectors stored.
        r.indexer.tree_work_settled().await;
        let service =
            Service::new(s, r.pipeline.clone(), r.indexer.embedder().clone(), r.indexer.store().clone()).unwrap();
        let clock = std::time::Instant::now();
        service.prepare().await.unwrap();
        eprintln!("label index ready in {:.1} s", clock.elapsed().as_secs_f64());
        let readiness = Readiness::default();
        readiness.set(true);
        let service = Arc::new(service);
        service.watch_store(Duration::from_millis(500));
        let (addr, _) = routes::serve(&s.serve.addr, service, readiness, std::future::pending()).await.unwrap();
        Running { port: addr.port(), ..r }
    }

    async fn index(&self, record: &[u8]) {
        let doc = Arc::new(self.pipeline.process(record).unwrap());
        self.indexer.index(&doc).await.unwrap();
    }

    async fn post(&self, path: &str, key: Option<&str>, body: &str) -> (u16, Value) {
        let (port, path, key, body) = (self.port, path.to_string(), key.map(str::to_string), body.to_string());
        tokio::task::spawn_blocking(move || request(port, "POST", &path, key.as_deref(), "application/json", &body))
            .await
            .unwrap()
    }

    async fn context(&self, body: Value) -> Value {
        let (status, v) = self.post("/v1/context", Some(KEY), &body.to_string()).await;
        assert_eq!(status, 200, "{v}");
        v
    }
}

/// One HTTP/1.1 request on loopback: (status, JSON body or the text as a string value); status 0 when nothing
/// listens.
fn request(port: u16, method: &str, path: &str, key: Option<&str>, content_type: &str, body: &str) -> (u16, Value) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return (0, Value::Null) };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = key.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: {content_type}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body.as_bytes()); // a server refusing early may close before reading it all
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).to_string();
    let status: u16 = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

fn doc_ids(v: &Value) -> Vec<String> {
    v["windows"].as_array().unwrap().iter().map(|w| w["doc_id"].as_str().unwrap().to_string()).collect()
}

/// The notes of the fill chunks (`chunks` of a `clear` response).
fn chunk_doc_ids(v: &Value) -> Vec<String> {
    let chunks = v.get("chunks").and_then(|c| c.as_array()).cloned().unwrap_or_default();
    chunks.iter().map(|c| c["payload"]["doc_id"].as_str().unwrap().to_string()).collect()
}

async fn serves_context_and_search(mut s: Settings) {
    // With RAPTOR's trees on: the summaries stored beside the chunks change nothing the other routes answer.
    s.raptor.enabled = true;
    let api = Running::start(&s).await;
    let effusion =
        json!({"patient": "Patient/p1", "question": "Is there fluid in the pleural space?", "budget_tokens": 512});

    // Auth: no key, a wrong key → 401 (before the body is looked at); a listed key → 200.
    let (status, v) = api.post("/v1/context", None, &effusion.to_string()).await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "unauthorized");
    assert_eq!(api.post("/v1/context", Some("nope"), &effusion.to_string()).await.0, 401);
    assert_eq!(api.post("/v1/search", None, "{}").await.0, 401);

    // CLEAR context: the aligned entity, windows from p1's notes only, in date order, inside the budget.
    let v = api.context(effusion.clone()).await;
    assert_eq!(v["strategy"], "clear", "{v}");
    assert_eq!(v["patient"], "Patient/p1");
    assert!(
        v["entities"].as_array().unwrap().iter().any(|e| e["label"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("effusion")),
        "{v}"
    );
    let ids = doc_ids(&v);
    assert!(ids.contains(&"p1-a".to_string()) && ids.contains(&"p1-b".to_string()), "{ids:?}");
    let dates: Vec<&str> = v["windows"].as_array().unwrap().iter().map(|w| w["date"].as_str().unwrap()).collect();
    assert!(dates.windows(2).all(|d| d[0] <= d[1]), "date order: {dates:?}");
    assert!(v["tokens"].as_u64().unwrap() <= 512 && v["tokens"].as_u64().unwrap() > 0);
    assert_eq!(v["answer"]["status"], "present", "{v}");
    assert!(!v["answer"]["supporting"].as_array().unwrap().is_empty());
    for w in v["windows"].as_array().unwrap() {
        assert!(w["text"].as_str().unwrap().to_lowercase().contains("effusion"), "{w}");
        assert!(w["end"].as_u64() > w["start"].as_u64());
        assert!(!w["concepts"].as_array().unwrap().is_empty() && !w["assertions"].as_array().unwrap().is_empty());
    }
    // The note is about 350 words; the ±150-word window around the mention is not the whole note.
    let long = v["windows"].as_array().unwrap().iter().find(|w| w["doc_id"] == "p1-b").unwrap();
    assert!(long["text"].as_str().unwrap().split_whitespace().count() < 250, "{long}");
    // Fill: what the windows left of the budget holds p1's chunks nearest the question, none overlapping a window;
    // the tokens count both and stay inside the budget.
    let window_tokens: u64 = v["windows"].as_array().unwrap().iter().map(|w| w["tokens"].as_u64().unwrap()).sum();
    let chunks = v["chunks"].as_array().expect("fill chunks");
    assert!(!chunks.is_empty() && v["tokens"].as_u64().unwrap() > window_tokens, "{v}");
    for c in chunks {
        assert_eq!(c["payload"]["patient"], "Patient/p1", "{c}");
        // The fields that cite the chunk come back, not the indexed copies of its entities and concepts.
        for field in ["doc_id", "doc_version", "doc_date", "section", "text", "chunk_index"] {
            assert!(c["payload"].get(field).is_some(), "{field} missing: {c}");
        }
        assert!(c["payload"].get("entities").is_none() && c["payload"].get("concepts").is_none(), "{c}");
        let (cs, ce) = (c["payload"]["start"].as_u64().unwrap(), c["payload"]["end"].as_u64().unwrap());
        assert!(
            v["windows"].as_array().unwrap().iter().all(|w| w["doc_id"] != c["payload"]["doc_id"]
                || ce <= w["start"].as_u64().unwrap()
                || w["end"].as_u64().unwrap() <= cs),
            "a fill chunk overlaps a window: {c}"
        );
    }
    // Each window and chunk says which path produced it: the effusion's own mentions, the patient's nearest chunks.
    assert!(v["answer_mentions"].as_u64().unwrap() >= 1, "{v}");
    let paths: Vec<&str> = v["windows"].as_array().unwrap().iter().map(|w| w["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"answer_target") && paths.iter().all(|p| ["answer_target", "related"].contains(p)));
    assert!(chunks.iter().all(|c| c["path"] == "dense"), "{v}");

    // The lexicon finds no mention of what is asked (p3's one note names an effusion, never a pneumothorax): the
    // windows of related entities get three quarters of the budget at most, the nearest chunks the rest, and the
    // response says so. (Words no lexicon term matches fill the note, so nothing else becomes a related window.)
    let words: Vec<String> = (0..400).map(|i| format!("xq{i}")).collect();
    let text = format!("FINDINGS: Small left pleural effusion. {}", words.join(" "));
    api.index(&note("p3-a", "1", "current", "Patient/p3", "2024-05-01", "Radiology report", &text)).await;
    let missed = api
        .context(json!({"patient": "Patient/p3", "question": "Is there a pneumothorax?", "budget_tokens": 1024}))
        .await;
    assert_eq!(missed["answer_mentions"], 0, "{missed}");
    assert_eq!(missed["answer"]["status"], "not_mentioned", "{missed}");
    let windows = missed["windows"].as_array().unwrap();
    let related_tokens: u64 = windows.iter().map(|w| w["tokens"].as_u64().unwrap()).sum();
    assert!(related_tokens <= 1024 * 3 / 4, "{missed}");
    assert!(windows.iter().all(|w| w["path"] == "related"), "{missed}");
    assert_eq!(missed["strategy"], if windows.is_empty() { "dense_fallback" } else { "clear" }, "{missed}");
    let filled = missed.get("chunks").and_then(|c| c.as_array()).cloned().unwrap_or_default();
    assert!(
        !filled.is_empty() && filled.iter().all(|c| c["path"] == "dense" && c["payload"]["patient"] == "Patient/p3"),
        "{missed}"
    );
    assert!(missed["tokens"].as_u64().unwrap() > related_tokens, "{missed}");
    // Where it is mentioned (p2), its window is the answer target's.
    let found = api.context(json!({"patient": "Patient/p2", "question": "Is there a pneumothorax?"})).await;
    assert_eq!(found["answer"]["status"], "present", "{found}");
    assert!(found["windows"].as_array().unwrap().iter().any(|w| w["path"] == "answer_target"), "{found}");
    // A finding denied in plain words ("The heart is not enlarged"): absent, with the denial in its window.
    let denied = api.context(json!({"patient": "Patient/p2", "question": "Is the heart enlarged?"})).await;
    assert_eq!(denied["answer"]["status"], "absent", "{denied}");
    assert!(
        denied["windows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["path"] == "answer_target" && w["text"].as_str().unwrap().contains("The heart is not enlarged")),
        "{denied}"
    );

    // CPTF with the real token-importance model: each window cut to about half its tokens — its most important
    // words, the mentions and cues always — so the windows hold fewer tokens, and the answer is the same.
    let compressed = api
        .context(json!({"patient": "Patient/p1", "question": "Is there fluid in the pleural space?",
            "budget_tokens": 512, "fill": false, "compress": 0.5}))
        .await;
    let cws = compressed["windows"].as_array().unwrap();
    assert!(!cws.is_empty(), "{compressed}");
    for w in cws {
        let before = w["compressed_from"].as_u64().expect("filtered windows say so");
        let after = w["tokens"].as_u64().unwrap();
        assert!(after < before, "{w}");
        assert!(w["text"].as_str().unwrap().to_lowercase().contains("effusion"), "the mention stays: {w}");
        assert!(w["end"].as_u64().unwrap() - w["start"].as_u64().unwrap() > w["text"].as_str().unwrap().len() as u64);
    }
    assert!(compressed["tokens"].as_u64().unwrap() <= 512);
    assert_eq!(compressed["answer"]["status"], v["answer"]["status"], "{compressed}");
    assert!(v["windows"].as_array().unwrap().iter().all(|w| w.get("compressed_from").is_none()));

    let windows_only = api
        .context(json!({"patient": "Patient/p1", "question": "Is there fluid in the pleural space?",
            "budget_tokens": 512, "fill": false}))
        .await;
    assert!(windows_only.get("chunks").is_none_or(|c| c.as_array().unwrap().is_empty()), "{windows_only}");
    assert_eq!(windows_only["tokens"].as_u64().unwrap(), window_tokens);
    assert_eq!(windows_only["windows"], v["windows"], "fill changes nothing in the windows");
    assert_eq!(windows_only["answer"], v["answer"], "the answer comes from the windows");
    let fact = v["facts"].as_array().unwrap().iter().find(|f| f["documents"] == 2).expect("a fact over both notes");
    assert_eq!(fact["last_date"], "2024-03-05");
    // The knowledge graph's relations of the effusion in p1's notes: the furosemide its plan treats it with, dated.
    let rel = fact["relations"].as_array().unwrap();
    let furosemide = rel.iter().find(|r| r["label"] == "Furosemide").unwrap_or_else(|| panic!("{fact}"));
    assert_eq!(furosemide["type"], "diagnosis_medication", "{fact}");
    assert_eq!((furosemide["direction"].as_str(), furosemide["kind"].as_str()), (Some("from"), Some("medication")));
    assert_eq!(furosemide["confidence"], 0.9, "a cue between them: {fact}");
    assert_eq!(furosemide["doc_ids"], json!(["p1-b"]));
    assert_eq!(furosemide["last_date"], "2024-03-05");
    // A bare id is the same patient.
    let bare = api
        .context(json!({"patient": "p1", "question": "Is there fluid in the pleural space?", "budget_tokens": 512}))
        .await;
    assert_eq!(doc_ids(&bare), ids);

    // Isolation: p2's answer comes from p2's note only (negated effusion there), never p1's windows.
    let v = api.context(json!({"patient": "Patient/p2", "question": "Is there fluid in the pleural space?"})).await;
    assert!(doc_ids(&v).iter().all(|d| d.starts_with("p2-")), "{v}");
    assert_eq!(v["answer"]["status"], "absent", "{v}");
    // A patient without notes: nothing aligns in their record → the dense fallback, with no one else's chunks.
    let v = api.context(json!({"patient": "Patient/nobody", "question": "Is there a pleural effusion?"})).await;
    assert_eq!(v["strategy"], "dense_fallback", "{v}");
    assert_eq!(v["answer"]["status"], "not_mentioned");
    assert!(
        v["windows"].as_array().unwrap().is_empty() && v.get("chunks").is_none_or(|c| c.as_array().unwrap().is_empty()),
        "{v}"
    );
    // A question about nothing in the lexicon falls back to p1's nearest chunks, and says so.
    let v = api.context(json!({"patient": "Patient/p1", "question": "What did the team review today?"})).await;
    assert_eq!(v["strategy"], "dense_fallback", "{v}");
    let chunks = v["chunks"].as_array().unwrap();
    assert!(!chunks.is_empty() && chunks.iter().all(|c| c["payload"]["patient"] == "Patient/p1"), "{v}");
    assert!(chunks.iter().all(|c| c["path"] == "dense"), "{v}");

    // Filters: dates, document types, sections.
    let q = |extra: Value| {
        let mut b = effusion.clone();
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    // The fill chunks obey the same filters.
    for (extra, only) in [
        (json!({"since": "2024-02-01"}), "p1-b"),
        (json!({"until": "2024-01-31"}), "p1-a"),
        (json!({"document_types": ["Radiology report"]}), "p1-a"),
    ] {
        let v = api.context(q(extra.clone())).await;
        assert_eq!(doc_ids(&v), [only], "{extra}");
        assert!(chunk_doc_ids(&v).iter().all(|d| d == only), "{extra} → {v}");
    }
    let v = api.context(q(json!({"sections": ["assessment_and_plan"]}))).await;
    assert_eq!(doc_ids(&v), ["p1-b"]);
    assert!(chunk_doc_ids(&v).iter().all(|d| d == "p1-b"), "{v}");
    assert!(v["windows"].as_array().unwrap().iter().all(|w| w["section"] == "assessment_and_plan"));

    // Bad requests: clear 4xx messages that name the field, never echo values.
    for (body, field) in [
        (json!({"patient": "p1", "question": "SECRET?", "budget_tokens": 999999}), "budget_tokens"),
        (json!({"patient": "p1", "question": "SECRET?", "budget_tokens": 0}), "budget_tokens"),
        (json!({"patient": "p1", "question": "   "}), "question"),
        (json!({"patient": "", "question": "SECRET?"}), "patient"),
        (json!({"patient": "p1", "question": "SECRET?", "since": "yesterday"}), "since"),
        (json!({"patient": "p1", "question": "SECRET?", "sincе": "2024-01-01"}), "unknown field"),
        (json!({"patient": "p1"}), "question"),
        (json!({"patient": 7, "question": "SECRET?"}), "patient"),
        (json!({"patient": "p1", "question": "SECRET?", "compress": 1.5}), "compress"),
        (json!({"patient": "p1", "question": "SECRET?", "compress": 0}), "compress"),
    ] {
        let (status, v) = api.post("/v1/context", Some(KEY), &body.to_string()).await;
        assert_eq!(status, 400, "{body} → {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field) && !message.contains("SECRET"), "{body} → {message}");
    }
    let (status, _) = api.post("/v1/context", Some(KEY), "{\"patient\": ").await;
    assert_eq!(status, 400);
    let port = api.port;
    let huge = format!("{{\"patient\": \"p1\", \"question\": \"{}\"}}", "x".repeat(10_000));
    let (status, v) =
        tokio::task::spawn_blocking(move || request(port, "POST", "/v1/context", Some(KEY), "application/json", &huge))
            .await
            .unwrap();
    assert_eq!(status, 413, "{v}");
    let (status, _) =
        tokio::task::spawn_blocking(move || request(port, "POST", "/v1/context", Some(KEY), "text/plain", "{}"))
            .await
            .unwrap();
    assert_eq!(status, 415);
    let (status, v) =
        tokio::task::spawn_blocking(move || request(port, "GET", "/v1/context", Some(KEY), "application/json", ""))
            .await
            .unwrap();
    assert_eq!(status, 405);
    assert_eq!(v["error"]["code"], "method_not_allowed", "the documented error body: {v}");
    // Data after the JSON object is refused, not ignored.
    for trailing in ["{\"patient\": \"p1\", \"question\": \"effusion?\"} junk", "{\"query\": \"a\"} {\"query\": \"b\"}"]
    {
        let route = if trailing.contains("patient") { "/v1/context" } else { "/v1/search" };
        let (status, v) = api.post(route, Some(KEY), trailing).await;
        assert_eq!(status, 400, "{route}: {v}");
        assert_eq!(v["error"]["message"], "body holds data after the JSON object", "{v}");
    }
    let (status, _) = api.post("/v1/search", Some(KEY), "{\"query\": \"effusion\"}  \n").await;
    assert_eq!(status, 200, "trailing white space is fine");
    let (status, v) =
        tokio::task::spawn_blocking(move || request(port, "POST", "/v2/nothing", Some(KEY), "application/json", "{}"))
            .await
            .unwrap();
    assert_eq!(status, 404, "{v}");
    let (status, v) = api.post("/v1/search", Some(KEY), &json!({"query": "effusion", "top": 1000}).to_string()).await;
    assert_eq!(status, 400, "{v}");

    // Search: hybrid over chunks with filters, and neighbours through the stored ids.
    let (status, v) = api
        .post(
            "/v1/search",
            Some(KEY),
            &json!({"query": "pleural effusion thoracentesis", "patient": "p1", "top": 5}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let hits = v["hits"].as_array().unwrap();
    assert!(!hits.is_empty() && hits.iter().all(|h| h["payload"]["patient"] == "Patient/p1"), "{v}");
    assert!(hits.iter().all(|h| h["payload"]["record"] == "chunk"), "windows never come back as chunks");
    let (_, v) = api
        .post(
            "/v1/search",
            Some(KEY),
            &json!({"query": "pleural effusion", "document_types": ["Radiology report"], "top": 10}).to_string(),
        )
        .await;
    let hits = v["hits"].as_array().unwrap();
    assert!(
        hits.iter().any(|h| h["payload"]["doc_id"] == "p2-a")
            && hits.iter().all(|h| h["payload"]["doc_type"] == "Radiology report"),
        "{v}"
    );
    let (_, v) = api
        .post(
            "/v1/search",
            Some(KEY),
            &json!({"query": "lung", "since": "2024-02-01", "until": "2024-02-28", "top": 10}).to_string(),
        )
        .await;
    assert!(v["hits"].as_array().unwrap().iter().all(|h| h["payload"]["doc_id"] == "p2-a"), "{v}");
    let pneumothorax = api
        .pipeline
        .lexicon()
        .concepts()
        .find(|c| c.preferred.eq_ignore_ascii_case("pneumothorax"))
        .map(|c| c.id.clone())
        .unwrap();
    let (_, v) = api
        .post("/v1/search", Some(KEY), &json!({"query": "findings", "concepts": [pneumothorax], "top": 10}).to_string())
        .await;
    let hits = v["hits"].as_array().unwrap();
    assert!(
        !hits.is_empty()
            && hits.iter().all(|h| h["payload"]["concepts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c.as_str() == Some(pneumothorax.as_str()))),
        "{v}"
    );
    let (_, v) = api
        .post(
            "/v1/search",
            Some(KEY),
            &json!({"query": "vital signs were reviewed", "patient": "p1", "top": 3, "neighbours": true}).to_string(),
        )
        .await;
    let with_neighbour = v["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| !h["payload"]["prev_chunk_id"].is_null())
        .expect("a hit past the first chunk");
    assert_eq!(with_neighbour["previous"]["id"], with_neighbour["payload"]["prev_chunk_id"], "{with_neighbour}");
    assert_eq!(with_neighbour["previous"]["payload"]["doc_id"], with_neighbour["payload"]["doc_id"]);

    // The collapsed tree (`strategy: tree`): the patient's chunks and summaries ranked together by the fused
    // dense and BM25 score — exactly the store's own ranking of that record set for the service's query, not the
    // dense ranking alone — and only that patient's.
    use clinstream::store::{Filters, Query, Record, Sparse, bm25};
    let store = api.indexer.store().clone();
    let p1 = Filters { patient: Some("Patient/p1".into()), ..Default::default() };
    let any = api.indexer.embedder().embed(&["findings"]).await.unwrap().remove(0);
    let ask_store = |record: Record, dense: Vec<f32>, sparse: Sparse, top: usize, matched: Vec<String>| {
        let (store, filters) = (store.clone(), p1.clone());
        let q = Query { dense, sparse, filters, top, fields: None, record, matched };
        async move { store.search(&q).await.unwrap() }
    };
    // The query's vector and the concepts the service matches for it (`serve.match_concepts`): its answer
    // concepts, aligned as a context's question is (the query embedded with its phrases, as the service does: the
    // filler chunks tie, and a vector embedded alone differs in the last digit, which can order ties otherwise).
    let labels =
        clinstream::query::labels::label_index(&api.pipeline, api.indexer.embedder(), &label_cache()).await.unwrap();
    let matched_for = |query: &str| {
        let (embedder, pipeline, labels, query) = (api.indexer.embedder(), &api.pipeline, &labels, query.to_string());
        async move {
            use clinstream::query::align;
            let phrases = align::phrases(&query);
            let refs: Vec<&str> = phrases.iter().map(String::as_str).collect();
            let vectors = embedder.embed(&refs).await.unwrap();
            let (lexicon, variables) = (pipeline.lexicon(), pipeline.variables());
            let params = align::AlignParams::default();
            let alignment = align::align(&query, &vectors, lexicon, variables, labels, None, params);
            (vectors[0].clone(), clinstream::query::reader::matched_concepts(&alignment, lexicon))
        }
    };
    let summaries = ask_store(Record::Summaries, any.clone(), Sparse::default(), 100, Vec::new()).await;
    assert!(!summaries.is_empty(), "p1's notes have a summary tree");
    let text = summaries[0].payload["text"].as_str().unwrap().to_string();
    let (status, v) = api
        .post(
            "/v1/search",
            Some(KEY),
            &json!({"query": text, "patient": "p1", "top": 20, "strategy": "tree"}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let hits = v["hits"].as_array().unwrap();
    let sparse = bm25::sparse_query(&bm25::encoder(s.store.bm25_avg_len).unwrap(), &text);
    let ids = |hits: Vec<clinstream::store::Hit>| hits.into_iter().map(|h| h.id).collect::<Vec<String>>();
    let (vector, matched) = matched_for(&text).await;
    // The store's ranking of twice the hits, less those whose text lies wholly inside hits above them (an
    // extractive summary of chunks already returned), cut to 20.
    let spans = |p: &serde_json::Map<String, Value>| -> Vec<(String, u64, u64)> {
        let span = |v: &Value| {
            (v["doc_id"].as_str().unwrap().to_string(), v["start"].as_u64().unwrap(), v["end"].as_u64().unwrap())
        };
        match p["record"].as_str() {
            Some("summary") => p["sentences"].as_array().unwrap().iter().map(span).collect(),
            _ => vec![span(&Value::Object(p.clone()))],
        }
    };
    let mut taken: Vec<(String, u64, u64)> = Vec::new();
    let (mut repeats, mut want, mut summaries_found) = (Vec::new(), Vec::new(), 0);
    for h in ask_store(Record::Tree, vector.clone(), sparse, 40, matched).await {
        let own = spans(&h.payload);
        summaries_found += usize::from(h.payload["record"] == "summary");
        if own.iter().all(|(d, a, b)| taken.iter().any(|(e, x, y)| d == e && x <= a && b <= y)) {
            repeats.push(h.payload["record"].as_str().unwrap().to_string());
            continue;
        }
        taken.extend(own);
        want.push(h.id);
    }
    want.truncate(20);
    assert!(summaries_found > 0, "a summary's own text finds summaries");
    // This query's summary quotes chunks of the same repeated sentences that rank above it: it is dropped.
    assert!(repeats.iter().any(|r| r == "summary"), "{repeats:?}");
    let dense_only = ids(ask_store(Record::Tree, vector, Sparse::default(), 20, Vec::new()).await);
    let got: Vec<String> = hits.iter().map(|h| h["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(got, want, "{repeats:?} dropped");
    assert_ne!(got, dense_only, "the fused ranking differs from the dense one for this query");
    assert!(hits.iter().all(|h| h["payload"]["patient"] == "Patient/p1"), "{v}");
    // Hybrid and dense searches stay on chunks; a tree without a patient, or an unknown strategy, is refused.
    for strategy in ["hybrid", "dense"] {
        let (_, v) = api
            .post(
                "/v1/search",
                Some(KEY),
                &json!({"query": text, "patient": "p1", "top": 20, "strategy": strategy}).to_string(),
            )
            .await;
        assert!(v["hits"].as_array().unwrap().iter().all(|h| h["payload"]["record"] == "chunk"), "{strategy}: {v}");
    }
    // A query in words no chunk holds, naming the finding by a synonym: the chunks that mention it count as full
    // BM25 matches — each scores `dense_weight_matched` × its cosine + the rest (the whole BM25 share), so they
    // come before every chunk that does not mention it, whatever the dense model thinks of the word.
    let hydrothorax = matched_for("hydrothorax").await.1;
    assert!(hydrothorax.contains(&"MESH:D010996".to_string()), "{hydrothorax:?}");
    let search_for = |query: &str, strategy: &str| {
        let body = json!({"query": query, "patient": "p1", "top": 20, "strategy": strategy}).to_string();
        let api = &api;
        async move {
            let (status, v) = api.post("/v1/search", Some(KEY), &body).await;
            assert_eq!(status, 200, "{v}");
            v["hits"].as_array().unwrap().clone()
        }
    };
    let search = |strategy: &str| search_for("hydrothorax", strategy);
    let (hybrid, dense) = (search("hybrid").await, search("dense").await);
    let mentions = |h: &Value| h["payload"]["concepts"].as_array().unwrap().iter().any(|c| c == "MESH:D010996");
    let first_other = hybrid.iter().position(|h| !mentions(h)).unwrap_or(hybrid.len());
    assert!(first_other > 0 && hybrid[first_other..].iter().all(|h| !mentions(h)), "mentions first: {hybrid:?}");
    let cosine = |id: &Value| dense.iter().find(|h| h["id"] == *id).unwrap()["score"].as_f64().unwrap();
    let w = s.store.dense_weight_matched as f64;
    for h in &hybrid[..first_other] {
        let want = w * cosine(&h["id"]) + (1.0 - w);
        assert!((h["score"].as_f64().unwrap() - want).abs() < 1e-4, "{h} against {want}");
        // Each says how it was found: the concept match, no word of the query, its cosine.
        let found = &h["found"];
        assert_eq!((found["concept"].as_bool(), found.get("words")), (Some(true), None), "{h}");
        assert!((found["dense"].as_f64().unwrap() - cosine(&h["id"])).abs() < 1e-4, "{h}");
    }
    assert!(hybrid[first_other..].iter().all(|h| h["found"].get("concept").is_none()), "{hybrid:?}");
    // A dense search's hits: their cosine, no other ranking.
    for h in &dense {
        assert_eq!(h["found"], json!({"dense": h["score"]}), "{h}");
    }
    // Found by a query's words: their BM25 score over the query's IDF mass, above 0 only for a chunk holding it.
    let effusion = search_for("effusion", "hybrid").await;
    let by_words: Vec<&Value> = effusion.iter().filter(|h| h["found"].get("words").is_some()).collect();
    assert!(!by_words.is_empty(), "{effusion:?}");
    for h in by_words {
        let share = h["found"]["words"].as_f64().unwrap();
        let holds = h["payload"]["text"].as_str().unwrap().to_lowercase().contains("effusion");
        assert!(holds && share > 0.0, "{h}");
    }
    let (status, v) = api.post("/v1/search", Some(KEY), &json!({"query": "x", "strategy": "tree"}).to_string()).await;
    assert_eq!(status, 400, "{v}");
    let (status, _) = api.post("/v1/search", Some(KEY), &json!({"query": "x", "strategy": "raptor"}).to_string()).await;
    assert!(status == 400 || status == 422, "{status}");

    // A new version replaces the old one in answers; entered-in-error removes it.
    api.index(&note(
        "p1-a",
        "2",
        "current",
        "Patient/p1",
        "2024-01-10",
        "Radiology report",
        "IMPRESSION: No pleural effusion. Lungs are clear.",
    ))
    .await;
    let v = api.context(q(json!({"document_types": ["Radiology report"]}))).await;
    let w = &v["windows"].as_array().unwrap()[0];
    assert_eq!((w["doc_id"].as_str(), w["doc_version"].as_str()), (Some("p1-a"), Some("2")), "{v}");
    assert_eq!(v["windows"].as_array().unwrap().len(), 1, "version 1's windows are gone: {v}");
    assert_eq!(v["answer"]["status"], "absent");
    api.index(&note("p1-a", "3", "entered-in-error", "Patient/p1", "2024-01-10", "Radiology report", "x")).await;
    let v = api.context(q(json!({"document_types": ["Radiology report"]}))).await;
    assert!(doc_ids(&v).is_empty(), "{v}");

    // Metrics by route and status; no request content in them.
    let (_, metrics) = common::http_get(api.port, "/metrics").unwrap();
    assert!(
        common::metric_value(&metrics, "clinstream_api_requests_total{route=\"context\",status=\"200\"}").unwrap()
            >= 10.0
    );
    assert!(
        common::metric_value(&metrics, "clinstream_api_requests_total{route=\"context\",status=\"400\"}").unwrap()
            >= 8.0
    );
    let unauthorized = |route: &str| {
        common::metric_value(&metrics, &format!("clinstream_api_requests_total{{route=\"{route}\",status=\"401\"}}"))
            .unwrap_or(0.0)
    };
    assert!(unauthorized("context") >= 2.0 && unauthorized("search") >= 1.0, "401s counted by route");
    assert!(common::metric_value(&metrics, "clinstream_api_denials_total{reason=\"no_credentials\"}").unwrap() >= 2.0);
    assert!(common::metric_value(&metrics, "clinstream_api_denials_total{reason=\"unknown_key\"}").unwrap() >= 1.0);
    assert!(metrics.contains("clinstream_api_request_duration_seconds_bucket{route=\"search\""));
    assert!(!metrics.contains("SECRET") && !metrics.contains("pleural"));
}

/// data/variables/expansion.tsv is what `clinstream-lab vocab expand --min 0.7 --max 50` gives with the shipped model,
/// lexicon and variables (regenerate it when one of them changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_expansion_table_is_current() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.clear.expansion_min_score = 0.0;
    let pipeline = Pipeline::new(&s).unwrap();
    let embedder = clinstream::embed::Embedder::start_async(&s.embed).await.unwrap();
    let index = clinstream::query::labels::label_index(&pipeline, &embedder, &label_cache()).await.unwrap();
    let got = index.expansions(pipeline.lexicon(), pipeline.variables(), 0.7, 50);
    let shipped: Vec<(String, String, f32)> = clinstream::stages::clear::EXPANSION_TSV
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            (c[0].to_string(), c[1].to_string(), c[2].parse().unwrap())
        })
        .collect();
    assert_eq!(got.len(), shipped.len(), "regenerate: clinstream-lab vocab expand --min 0.7 --max 50");
    for ((v, c, score), (sv, sc, ss)) in got.iter().zip(&shipped) {
        assert_eq!(pipeline.variables()[*v].name(), sv);
        assert_eq!(&pipeline.lexicon().concept(*c).id, sc);
        assert!((score - ss).abs() < 2e-3, "{sv} {sc}: {score} vs {ss}");
    }
    // The default threshold adds only another vocabulary's copy of a variable's own concept.
    let mut d = s.clone();
    d.clear.expansion_min_score =
        Settings::load_from(None, Some(Default::default())).unwrap().clear.expansion_min_score;
    let expanded = Pipeline::new(&d).unwrap();
    let ptx = |p: &Pipeline| p.variables().iter().find(|v| v.name() == "pneumothorax").unwrap().targets().len();
    assert_eq!(ptx(&expanded), ptx(&pipeline) + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_serves_context_and_search() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    serves_context_and_search(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_serves_context_and_search() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(s) = server_settings(dir.path(), &server) else { return };
    serves_context_and_search(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_going_down_answers_503_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = common::qdrant::QdrantServer::start() else { return };
    if !server.is_local() {
        eprintln!("SKIPPED: this test kills its own Qdrant server; QDRANT_URL points elsewhere");
        return;
    }
    let Some(s) = server_settings(dir.path(), &server) else { return };
    let api = Running::start(&s).await;
    let body = json!({"patient": "p1", "question": "Is there a pleural effusion?"}).to_string();
    assert_eq!(api.post("/v1/context", Some(KEY), &body).await.0, 200);
    server.kill();
    let (status, v) = api.post("/v1/context", Some(KEY), &body).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "store_unavailable");
    let (status, _) = api.post("/v1/search", Some(KEY), &json!({"query": "effusion"}).to_string()).await;
    assert_eq!(status, 503);
    assert_eq!(common::http_get(api.port, "/readyz").unwrap().0, 503, "not ready while the store is down");
    assert_eq!(common::http_get(api.port, "/healthz").unwrap().0, 200, "but alive");
    server.restart();
    // Readiness comes back without any request (a not-ready pod gets none): the service probes the store.
    common::wait_until(Duration::from_secs(60), "/readyz recovers by itself", || {
        common::http_get(api.port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
    assert_eq!(request(api.port, "POST", "/v1/context", Some(KEY), "application/json", &body).0, 200);
    assert_eq!(common::http_get(api.port, "/readyz").unwrap().0, 200);
}

/// `clinstream run` (file mode) writes an embedded store; then `clinstream serve` reads it, `clinstream context`
/// answers what the API answers; and a worker with `serve.enabled` answers while it consumes stdin.
#[test]
fn run_then_serve_and_a_worker_serving_while_it_consumes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_) = settings(dir.path()) else { return };
    let input = dir.path().join("notes.ndjson");
    let lines: Vec<String> = records().iter().map(|r| String::from_utf8(r.clone()).unwrap()).collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let env = |c: &mut std::process::Command, port: u16| {
        c.env("CLINSTREAM__EMBED__MODEL_DIR", root().join("models/all-MiniLM-L6-v2"))
            .env("CLINSTREAM__EMBED__ORT_LIBRARY", root().join("models/onnxruntime/libonnxruntime.so.1.31.1"))
            .env("CLINSTREAM__STORE__PATH", dir.path().join("qdrant"))
            .env("CLINSTREAM__SERVE__CACHE_DIR", label_cache())
            .env("CLINSTREAM__SERVE__API_KEYS", KEY)
            .env("CLINSTREAM__SERVE__ADDR", format!("127.0.0.1:{port}"))
            .env("CLINSTREAM__METRICS__ADDR", "127.0.0.1:0")
            .current_dir(dir.path());
    };
    let mut run = common::clinstream();
    env(&mut run, 0);
    let out = run
        .args(["run", "--no-progress", "--input"])
        .arg(&input)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // serve on the store the run left.
    let port = common::free_port();
    let mut serve = common::clinstream();
    env(&mut serve, port);
    let mut child =
        serve.arg("serve").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    common::wait_until(Duration::from_secs(300), "serve is ready", || {
        common::http_get(port, "/readyz").is_some_and(|(s, _)| s == 200)
    });
    let body = json!({"patient": "Patient/p1", "question": "Is there a pleural effusion?", "budget_tokens": 300});
    let (status, api) = request(port, "POST", "/v1/context", Some(KEY), "application/json", &body.to_string());
    assert_eq!(status, 200, "{api}");
    assert_eq!(api["strategy"], "clear");
    std::process::Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exits cleanly on SIGTERM: {status:?}");
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(
        !stderr.contains("pleural") && !stderr.contains("Is there"),
        "no question or note text in the log: {stderr}"
    );

    // The CLI twin computes the same answer.
    let mut twin = common::clinstream();
    env(&mut twin, 0);
    let out = twin
        .args([
            "context",
            "--patient",
            "Patient/p1",
            "--question",
            "Is there a pleural effusion?",
            "--budget",
            "300",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli, api, "the CLI twin and the API answer alike");
    // The twin runs as the local operator, says so, and audits the access to the log with ids pseudonymised.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("running as the local operator"), "{stderr}");
    assert!(stderr.contains("AuditEvent") && stderr.contains("urn:clinstream:local-operator"), "{stderr}");
    assert!(stderr.contains("pseudonym:") && !stderr.contains("Patient/p1") && !stderr.contains("p1-a"), "{stderr}");
    assert!(!stderr.contains("pleural") && !stderr.contains("Is there"), "no question or note text: {stderr}");

    // One process: a worker consuming stdin serves the API on its own store handle.
    let port = common::free_port();
    let mut worker = common::clinstream();
    env(&mut worker, port);
    worker.env("CLINSTREAM__SERVE__ENABLED", "true").env("CLINSTREAM__STORE__PATH", dir.path().join("qdrant2"));
    let mut child = worker
        .args(["run", "--no-progress", "--input", "-", "--out"])
        .arg(dir.path().join("out2"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(lines[0].as_bytes()).unwrap();
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
    common::wait_until(Duration::from_secs(300), "the worker's API answers from what it indexed", || {
        let (status, v) = request(port, "POST", "/v1/context", Some(KEY), "application/json", &body.to_string());
        status == 200 && v["strategy"] == "clear"
    });
    stdin.write_all(lines[1].as_bytes()).unwrap();
    stdin.write_all(b"\n").unwrap();
    stdin.flush().unwrap();
    common::wait_until(Duration::from_secs(60), "the second note shows up while the worker still runs", || {
        let (_, v) = request(port, "POST", "/v1/context", Some(KEY), "application/json", &body.to_string());
        v["windows"].as_array().is_some_and(|w| w.iter().any(|w| w["doc_id"] == "p1-b"))
    });
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// While the label index is being built (the first start with a model: a cold `serve.cache_dir`), the service
/// answers `/v1/context` at once with 503 `not_ready` and `Retry-After` — not after its timeout — and `/v1/search`
/// normally (by the query's words alone until the labels are there for its concept matches). The build is held at its first progress report, so the request certainly
/// arrives during it, whatever the machine's speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn context_during_the_label_build_is_503_not_ready_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.serve.cache_dir = dir.path().join("cold-cache").display().to_string();
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Arc::new(Indexer::start(&s, pipeline.compiled()).await.unwrap());
    for rec in records() {
        indexer.index(&Arc::new(pipeline.process(&rec).unwrap())).await.unwrap();
    }
    let service = Arc::new(Service::new(&s, pipeline, indexer.embedder().clone(), indexer.store().clone()).unwrap());
    let readiness = Readiness::default();
    let (addr, _) =
        routes::serve(&s.serve.addr, Arc::clone(&service), readiness.clone(), std::future::pending()).await.unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (started_tx, release_rx) = (std::sync::Mutex::new(started_tx), std::sync::Mutex::new(release_rx));
    let building = {
        let service = Arc::clone(&service);
        tokio::spawn(async move {
            let hold = move |done: usize, _total: usize| {
                if done == 0 {
                    let _ = started_tx.lock().unwrap().send(());
                    // Held until the test has asked (or gone): the sender's drop ends the wait.
                    let _ = release_rx.lock().unwrap().recv();
                }
            };
            let _ = service.reader().prepare_with(&hold).await;
        })
    };
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(120)).expect("the build started"))
        .await
        .unwrap();
    let port = addr.port();
    let body = json!({"patient": "p1", "question": "Is there a pleural effusion?"}).to_string();
    let (status, v) =
        tokio::task::spawn_blocking(move || request(port, "POST", "/v1/context", Some(KEY), "application/json", &body))
            .await
            .unwrap();
    // Queued behind the build it would have waited for serve.timeout_ms and been answered 504 `timeout`.
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "not_ready", "{v}");
    let search = json!({"query": "effusion", "patient": "p1"}).to_string();
    let (status, v) = tokio::task::spawn_blocking(move || {
        request(port, "POST", "/v1/search", Some(KEY), "application/json", &search)
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "search does not wait for the label index: {v}");
    assert_eq!(common::http_get(port, "/readyz").unwrap().0, 503, "not ready while building");
    drop(release_tx);
    building.abort();
}
