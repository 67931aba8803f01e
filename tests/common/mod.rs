//! Shared helpers for integration tests: the binary launcher, free ports, polling, settings, event builders,
//! loopback HTTP and metrics parsing, and the malformed-event corpus.
#![allow(dead_code)]

pub mod fhir;
pub mod llm;
pub mod oidc;
pub mod proxy;
pub mod qdrant;
pub mod service;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use clinstream::config::Settings;
use clinstream::error::ErrorCode;
use serde_json::{Value, json};
use sha1::Digest as _;

/// A string planted in inputs; it must never appear in errors, dead letters or logs.
pub const CANARY: &str = "CANARY-Jane-Roe-MRN-0042";

/// The `clinstream` binary with a clean environment: nothing of the caller's `CLINSTREAM__*`, `CLINSTREAM_CONFIG`
/// or `RUST_LOG` leaks in; JSON logs; metrics on a free port (tests run in parallel).
pub fn clinstream() -> Command {
    clean(Command::new(env!("CARGO_BIN_EXE_clinstream")))
}

/// The `clinstream-lab` binary (benchmarks, evaluations, vocabulary tools), with the same clean environment.
#[allow(dead_code)]
pub fn lab() -> Command {
    clean(Command::new(env!("CARGO_BIN_EXE_clinstream-lab")))
}

fn clean(mut cmd: Command) -> Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("CLINSTREAM__") || k == "CLINSTREAM_CONFIG" || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.env("CLINSTREAM__LOG__FORMAT", "json").env("CLINSTREAM__METRICS__ADDR", "127.0.0.1:0");
    // The concept-label vectors (`clinstream search`, `clinstream context`) are built once per model and shared by
    // every test process, as the services' tests share them, rather than under the working directory; keyed by the
    // model's and lexicon's checksums, so models never share them. A test that wants a cold cache sets its own.
    cmd.env("CLINSTREAM__SERVE__CACHE_DIR", std::env::temp_dir().join("clinstream-test-label-cache"));
    cmd
}

/// A loopback port nothing listens on, for a server a test starts (a worker's metrics, a broker, a Qdrant server),
/// never handed out twice in one test process. Chosen *below* the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`): the kernel never gives those ports to a `bind(0)` or to an outgoing
/// connection, so between this check and the server's own bind only another explicit bind could take it — not the
/// connections and port-0 listeners every test opens meanwhile. Where the range cannot be read, a port from
/// `bind(0)` (the kernel may hand it out again; the check above still holds within this process).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > 12_000);
    if let Some(low) = ephemeral_low {
        // Spread processes apart (sequential test binaries, several checkouts on one machine), then walk up.
        let span = u32::from(low - 10_000);
        let start = 10_000 + std::process::id().wrapping_mul(7919).wrapping_add(given.len() as u32) % span;
        for i in 0..span {
            let port = (10_000 + (start - 10_000 + i) % span) as u16;
            if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return port;
            }
        }
    }
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Polls `f` until it returns true (panics with `what` after `timeout`).
pub fn wait_until(timeout: Duration, what: &str, f: impl FnMut() -> bool) {
    assert!(try_wait_until(timeout, f), "timed out waiting for {what}");
}

/// Polls `f` until it returns true; false after `timeout`.
pub fn try_wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

pub fn settings() -> Settings {
    Settings::load_from(None, Some(Default::default())).expect("defaults load")
}

/// Default settings with the repository's model files (`make model`) and an embedded store in `dir`. Without the
/// model files this fails with that instruction, unless `CLINSTREAM_SKIP_MODEL_TESTS=1` (then a loud SKIPPED and
/// `None`).
pub fn model_settings(dir: &std::path::Path) -> Option<Settings> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if !root.join("models/all-MiniLM-L6-v2/model.onnx").is_file() {
        if std::env::var("CLINSTREAM_SKIP_MODEL_TESTS").is_ok() {
            eprintln!("SKIPPED: no model files (run `make model`)");
            return None;
        }
        panic!("models/ is missing: run `make model` (or set CLINSTREAM_SKIP_MODEL_TESTS=1)");
    }
    let mut s = settings();
    s.embed.model_dir = root.join("models/all-MiniLM-L6-v2").display().to_string();
    s.embed.ort_library = root.join("models/onnxruntime/libonnxruntime.so.1.31.1").display().to_string();
    s.store.path = dir.join("qdrant").display().to_string();
    Some(s)
}

pub fn settings_with(env: &[(&str, &str)]) -> Settings {
    Settings::load_from(None, Some(env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())).unwrap()
}

pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn sha1_b64(bytes: &[u8]) -> String {
    b64(&sha1::Sha1::digest(bytes))
}

/// A DocumentReference with the given id and attachments.
pub fn doc_with(id: &str, attachments: Vec<Value>) -> Value {
    json!({
        "resourceType": "DocumentReference",
        "id": id,
        "status": "current",
        "subject": {"reference": "Patient/p1", "display": CANARY},
        "content": attachments.into_iter().map(|a| json!({"attachment": a})).collect::<Vec<_>>(),
    })
}

/// A valid text/plain DocumentReference holding `text`.
pub fn valid_doc(id: &str, text: &str) -> Value {
    doc_with(id, vec![json!({"contentType": "text/plain; charset=utf-8", "data": b64(text.as_bytes())})])
}

pub fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn att(content_type: &str, data: &[u8]) -> Value {
    json!({"contentType": content_type, "data": b64(data)})
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn without(mut v: Value, key: &str) -> Value {
    v.as_object_mut().unwrap().remove(key);
    v
}

/// One malformed event and the code it must be dead-lettered with.
pub struct Case {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    pub code: ErrorCode,
}

/// The malformed-event corpus: one entry per kind of bad input (49 kinds).
pub fn malformed_corpus() -> Vec<Case> {
    use ErrorCode::*;
    let note = format!("HISTORY: {CANARY} has chest pain.");
    let good = valid_doc("doc-1", &note);
    let d = |a: Value| bytes(&doc_with("doc-1", vec![a]));
    let raw = |s: &str| s.as_bytes().to_vec();
    // Depth only matters where the worker reads: serde_json skips unknown fields without recursing.
    let deep = format!(
        r#"{{"resourceType":"DocumentReference","id":"a","content":[{{"attachment":{{"size":{}{}}}}}]}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let mut cases = vec![
        Case { name: "truncated JSON", bytes: raw(r#"{"resourceType":"DocumentReference","id":"#), code: InvalidJson },
        Case { name: "empty event", bytes: vec![], code: InvalidJson },
        Case { name: "binary garbage", bytes: vec![0xff, 0xfe, 0x00, 0x01, 0x80], code: InvalidJson },
        Case { name: "trailing garbage", bytes: raw(r#"{"resourceType":"DocumentReference"} x"#), code: InvalidJson },
        Case {
            name: "bad escape",
            bytes: raw(r#"{"resourceType":"DocumentReference","id":"a\x"}"#),
            code: InvalidJson,
        },
        Case {
            name: "lone surrogate",
            bytes: raw(r#"{"resourceType":"DocumentReference","id":"\ud800"}"#),
            code: InvalidJson,
        },
        Case { name: "single quotes", bytes: raw(r#"{'resourceType':'DocumentReference'}"#), code: InvalidJson },
        Case { name: "JSON array", bytes: raw(r#"[{"resourceType":"DocumentReference"}]"#), code: NotAnObject },
        Case { name: "JSON string", bytes: raw(&format!("\"{CANARY}\"")), code: NotAnObject },
        Case { name: "JSON number", bytes: raw("42"), code: NotAnObject },
        Case { name: "JSON null", bytes: raw("null"), code: NotAnObject },
        Case { name: "deeply nested JSON", bytes: deep.into_bytes(), code: JsonTooDeep },
        Case {
            name: "duplicate id key",
            bytes: raw(r#"{"resourceType":"DocumentReference","id":"a","id":"b","content":[]}"#),
            code: DuplicateKey,
        },
        Case {
            name: "duplicate resourceType key",
            bytes: raw(r#"{"resourceType":"DocumentReference","resourceType":"Patient"}"#),
            code: DuplicateKey,
        },
        Case {
            name: "missing resourceType",
            bytes: bytes(&without(good.clone(), "resourceType")),
            code: MissingResourceType,
        },
        Case {
            name: "wrong resourceType",
            bytes: bytes(&with(good.clone(), "resourceType", json!("Patient"))),
            code: WrongResourceType,
        },
        Case {
            name: "resourceType in wrong case",
            bytes: bytes(&with(good.clone(), "resourceType", json!("documentreference"))),
            code: WrongResourceType,
        },
        Case {
            name: "resourceType not a string",
            bytes: bytes(&with(good.clone(), "resourceType", json!(7))),
            code: InvalidFhir,
        },
        Case { name: "missing id", bytes: bytes(&without(good.clone(), "id")), code: MissingId },
        Case {
            name: "id with spaces",
            bytes: bytes(&with(good.clone(), "id", json!(CANARY.replace('-', " ")))),
            code: InvalidId,
        },
        Case {
            name: "huge id string",
            bytes: bytes(&with(good.clone(), "id", json!("x".repeat(200_000)))),
            code: InvalidId,
        },
        Case { name: "empty id", bytes: bytes(&with(good.clone(), "id", json!(""))), code: InvalidId },
        Case { name: "id not a string", bytes: bytes(&with(good.clone(), "id", json!(12345))), code: InvalidFhir },
        Case {
            name: "unknown status",
            bytes: bytes(&with(good.clone(), "status", json!("final"))),
            code: InvalidStatus,
        },
        Case {
            name: "status not a string",
            bytes: bytes(&with(good.clone(), "status", json!({"x": CANARY}))),
            code: InvalidFhir,
        },
        Case {
            name: "subject not an object",
            bytes: bytes(&with(good.clone(), "subject", json!(CANARY))),
            code: InvalidFhir,
        },
        Case { name: "missing content", bytes: bytes(&without(good.clone(), "content")), code: NoContent },
        Case { name: "empty content", bytes: bytes(&with(good.clone(), "content", json!([]))), code: NoContent },
        Case {
            name: "content not an array",
            bytes: bytes(&with(good.clone(), "content", json!({"attachment": {}}))),
            code: InvalidFhir,
        },
        Case {
            name: "content without attachment",
            bytes: bytes(&with(good.clone(), "content", json!([{}]))),
            code: NoContent,
        },
        Case {
            name: "attachment not an object",
            bytes: bytes(&with(good.clone(), "content", json!([{"attachment": CANARY}]))),
            code: InvalidFhir,
        },
        Case {
            name: "attachment without data or url",
            bytes: d(json!({"contentType": "text/plain"})),
            code: EmptyAttachment,
        },
        Case { name: "empty data", bytes: d(json!({"contentType": "text/plain", "data": ""})), code: EmptyAttachment },
        Case {
            name: "url only",
            bytes: d(json!({"contentType": "text/plain", "url": "Binary/1"})),
            code: AttachmentByReference,
        },
        Case { name: "broken PDF", bytes: d(att("application/pdf", b"%PDF-1.4 CANARY")), code: PdfMalformed },
        Case {
            name: "scanned PDF (no text layer)",
            bytes: d(att("application/pdf", &clinstream::stages::pdf::write_text_pdf(&[vec![]]))),
            code: PdfNoText,
        },
        Case { name: "PNG image", bytes: d(att("image/png", b"\x89PNG\r\n\x1a\n")), code: UnsupportedContentType },
        Case {
            name: "data without contentType",
            bytes: d(json!({"data": b64(note.as_bytes())})),
            code: MissingContentType,
        },
        Case {
            name: "invalid base64 symbols",
            bytes: d(json!({"contentType": "text/plain", "data": "!!!!"})),
            code: InvalidBase64,
        },
        Case {
            name: "url-safe base64 alphabet",
            bytes: d(json!({"contentType": "text/plain", "data": "a-_b"})),
            code: InvalidBase64,
        },
        Case {
            name: "base64 bad length",
            bytes: d(json!({"contentType": "text/plain", "data": "abcde"})),
            code: InvalidBase64,
        },
        Case {
            name: "wrong size",
            bytes: d(json!({"contentType": "text/plain", "data": b64(note.as_bytes()), "size": 3})),
            code: SizeMismatch,
        },
        Case {
            name: "negative size",
            bytes: d(json!({"contentType": "text/plain", "data": b64(note.as_bytes()), "size": -1})),
            code: InvalidFhir,
        },
        Case {
            name: "size not a number",
            bytes: d(json!({"contentType": "text/plain", "data": b64(note.as_bytes()), "size": CANARY})),
            code: InvalidFhir,
        },
        Case {
            name: "wrong hash",
            bytes: d(json!({"contentType": "text/plain", "data": b64(note.as_bytes()), "hash": sha1_b64(b"other")})),
            code: HashMismatch,
        },
        Case {
            name: "hash not base64 SHA-1",
            bytes: d(json!({"contentType": "text/plain", "data": b64(note.as_bytes()), "hash": "not-a-hash"})),
            code: InvalidHash,
        },
        Case {
            name: "oversized attachment",
            bytes: d(att("text/plain", &vec![b'a'; 5 * 1024 * 1024])),
            code: AttachmentTooLarge,
        },
        Case {
            name: "unknown charset",
            bytes: d(att("text/plain; charset=koi8-r", note.as_bytes())),
            code: UnsupportedCharset,
        },
        Case {
            name: "invalid UTF-8",
            bytes: d(att("text/plain; charset=utf-8", b"caf\xe9 CANARY")),
            code: InvalidUtf8,
        },
        Case { name: "UTF-16 without BOM", bytes: d(att("text/plain; charset=utf-16", b"a\0b\0")), code: InvalidUtf16 },
        Case { name: "UTF-16 odd length", bytes: d(att("text/plain", b"\xff\xfea\0b")), code: InvalidUtf16 },
        Case { name: "NUL bytes in text", bytes: d(att("text/plain", b"CANARY\0\0\0binary")), code: BinaryContent },
        Case { name: "whitespace-only text", bytes: d(att("text/plain", b" \n\t \r\n")), code: EmptyNote },
        Case {
            name: "markup-only HTML",
            bytes: d(att("text/html", b"<html><head><title>CANARY</title></head><body><br/></body></html>")),
            code: EmptyNote,
        },
        Case { name: "RTF without header", bytes: d(att("text/rtf", b"CANARY plain text")), code: InvalidRtf },
        Case { name: "unbalanced RTF", bytes: d(att("text/rtf", br"{\rtf1 CANARY}}")), code: InvalidRtf },
    ];
    cases.sort_by_key(|c| c.name);
    cases
}

/// One HTTP/1.1 exchange on loopback (`head` holds `Connection: close`): (status, body, de-chunked), or None when
/// nothing answers or the answer cannot be read within `timeout`.
pub fn http_exchange(port: u16, head: &str, body: &str, timeout: Duration) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let chunked = head.lines().any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding: chunked"));
    Some((status, if chunked { dechunk(body)? } else { body.to_string() }))
}

/// GET on loopback: (status, body), or None when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    http_exchange(port, &head, "", Duration::from_secs(5))
}

/// POST a JSON body on loopback: (status, body), or None when nothing answers.
pub fn http_post_json(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    http_exchange(port, &head, body, Duration::from_secs(60))
}

/// The body of a `Transfer-Encoding: chunked` response.
pub fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// The value of one exposition-format series (name with its labels, exactly as printed).
pub fn metric_value(body: &str, series: &str) -> Option<f64> {
    body.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))?.rsplit(' ').next()?.parse().ok()
}
