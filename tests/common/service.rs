//! The query service in a test process: notes indexed into the configured store, the API served on a free port in
//! a runtime the test owns (the test thread stays free for blocking calls), one-request HTTP calls, and the
//! process's log lines captured (to check what they never hold).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use clinstream::config::Settings;
use clinstream::http::Readiness;
use clinstream::index::Indexer;
use clinstream::serve::{Service, routes};
use clinstream::stages::Pipeline;
use serde_json::{Value, json};

/// Everything the process logs from now on, captured (one subscriber for the test binary).
pub fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Capture(Arc::clone(&sink)))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        buffer
    })
    .clone()
}

/// The captured log as text.
pub fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).to_string()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A current radiology report of `patient` (a bare id) as a DocumentReference.
pub fn note(id: &str, patient: &str, text: &str) -> Vec<u8> {
    use base64::Engine;
    serde_json::to_vec(&json!({
        "resourceType": "DocumentReference", "id": id, "status": "current", "date": "2024-02-01",
        "type": {"text": "Radiology report"},
        "subject": {"reference": format!("Patient/{patient}")},
        "content": [{"attachment": {"contentType": "text/plain",
            "data": base64::engine::general_purpose::STANDARD.encode(text)}}]
    }))
    .unwrap()
}

/// Indexes `notes` (id, patient, text) and serves the API in `rt`; returns the port.
pub fn start(rt: &tokio::runtime::Runtime, s: &Settings, notes: &[(&str, &str, String)]) -> u16 {
    rt.block_on(async {
        let pipeline = Arc::new(Pipeline::new(s).unwrap());
        let indexer = Indexer::start(s, pipeline.compiled()).await.unwrap();
        for (id, patient, text) in notes {
            let doc = Arc::new(pipeline.process(&note(id, patient, text)).unwrap());
            indexer.index(&doc).await.unwrap();
        }
        let service = Service::new(s, pipeline, indexer.embedder().clone(), indexer.store().clone()).unwrap();
        service.prepare().await.unwrap();
        let readiness = Readiness::default();
        readiness.set(true);
        let (addr, _) =
            routes::serve(&s.serve.addr, Arc::new(service), readiness, std::future::pending()).await.unwrap();
        addr.port()
    })
}

/// A runtime for `start`: two worker threads, time and I/O.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// One request: (status, JSON body, `X-Request-Id` answered).
pub fn call(port: u16, path: &str, bearer: Option<&str>, request_id: &str, body: &Value) -> (u16, Value, String) {
    let (status, body, head) = call_with_head(port, path, bearer, request_id, body);
    let id = header(&head, "x-request-id").unwrap_or_default().to_ascii_lowercase();
    (status, body, id)
}

/// A header's value in a response head (the name in any case).
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

/// As `call`, with the response's status line and headers in place of its request id.
pub fn call_with_head(
    port: u16,
    path: &str,
    bearer: Option<&str>,
    request_id: &str,
    body: &Value,
) -> (u16, Value, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let auth = bearer.map(|b| format!("Authorization: Bearer {b}\r\n")).unwrap_or_default();
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}X-Request-Id: {request_id}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).to_string();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null), head.to_string())
}

/// The metrics of a `Server-Timing` header in a response head: (name, milliseconds) in order.
pub fn server_timing(head: &str) -> Vec<(String, f64)> {
    clinstream::serve::routes::parse_server_timing(header(head, "server-timing").unwrap_or_default())
}

/// `/readyz` answers 200.
pub fn ready(port: u16) -> bool {
    super::http_get(port, "/readyz").is_some_and(|(s, _)| s == 200)
}
