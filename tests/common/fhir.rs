//! A real FHIR server for the intake tests, and a harness in front of it.
//!
//! * `FhirServer`: PyPI `fhirsnake` (installed into `.tools/fhir` by `make tools`; FastAPI + uvicorn; serves
//!   `resources/<Type>/<id>.json`, `GET /<Type>/<id>`, `PUT /<Type>/<id>`) started per test on a free loopback port
//!   with an empty resource directory; resources are uploaded with `PUT`, as against any FHIR server, and also
//!   written to that directory, so that a `restart` serves them from the start, as a real server would.
//!   `CLINSTREAM_TEST_FHIR=http://host:port/base` points the tests at another server (plain http) instead.
//!   `make test` sets `CLINSTREAM_REQUIRE_FHIR=1`: a missing fhirsnake fails there; elsewhere the tests say SKIPPED.
//! * `Harness`: what fhirsnake does not do, written here: a SMART Backend Services token endpoint (`POST /token`,
//!   verifies the client assertion's signature, algorithm, `iss`/`sub`/`aud`/`exp` and `jti` reuse, issues
//!   short-lived tokens), bearer checking, planned faults (statuses answered before forwarding, with
//!   `Retry-After`), token revocation, and raw bodies (`/raw/...`: the Binary's bytes with its content type).
//!   `/fhir/...` forwards to the FHIR server.
#![allow(dead_code)]

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde_json::{Value, json};

use super::{free_port, try_wait_until};

/// A FHIR server: fhirsnake started for the test, or an external one.
pub struct FhirServer {
    /// The base URL (`http://127.0.0.1:PORT`), without a trailing slash.
    pub base_url: String,
    host: String,
    port: u16,
    prefix: String,
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
}

fn fhirsnake_dir() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/fhir");
    p.join("fhirsnake/main.py").is_file().then_some(p)
}

impl FhirServer {
    /// Starts fhirsnake (or uses `CLINSTREAM_TEST_FHIR`); `None` after a loud SKIPPED line when there is none and
    /// the run does not require one.
    pub fn start() -> Option<FhirServer> {
        if let Ok(url) = std::env::var("CLINSTREAM_TEST_FHIR") {
            let rest = url.trim_end_matches('/').strip_prefix("http://").expect("CLINSTREAM_TEST_FHIR: http:// only");
            let (authority, prefix) =
                rest.split_once('/').map(|(a, p)| (a, format!("/{p}"))).unwrap_or((rest, String::new()));
            let (host, port) =
                authority.split_once(':').map(|(h, p)| (h, p.parse().unwrap())).unwrap_or((authority, 80));
            return Some(FhirServer {
                base_url: url.trim_end_matches('/').to_string(),
                host: host.to_string(),
                port,
                prefix,
                child: None,
                dir: None,
            });
        }
        let Some(tools) = fhirsnake_dir() else {
            assert!(
                std::env::var("CLINSTREAM_REQUIRE_FHIR").is_err(),
                "fhirsnake is missing: run `make tools` (or set CLINSTREAM_TEST_FHIR)"
            );
            eprintln!("SKIPPED: no FHIR server (run `make tools`, or set CLINSTREAM_TEST_FHIR)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("resources/Binary")).unwrap();
        let mut server = FhirServer {
            base_url: String::new(),
            host: "127.0.0.1".into(),
            port: 0,
            prefix: String::new(),
            child: None,
            dir: Some(dir),
        };
        server.spawn(&tools, free_port());
        Some(server)
    }

    fn spawn(&mut self, tools: &Path, port: u16) {
        let dir = self.dir.as_ref().unwrap().path();
        let python_path = format!("{}:{}", tools.display(), tools.join("fhirsnake").display());
        let child = Command::new("python3")
            .args([
                "-m",
                "uvicorn",
                "main:app",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--log-level",
                "warning",
            ])
            .current_dir(dir)
            .env("PYTHONPATH", python_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs fhirsnake");
        self.child = Some(child);
        self.port = port;
        self.base_url = format!("http://127.0.0.1:{port}");
        assert!(
            try_wait_until(Duration::from_secs(30), || super::http_get(port, "/").is_some_and(|(s, _)| s == 200)),
            "fhirsnake did not start"
        );
    }

    pub fn is_local(&self) -> bool {
        self.child.is_some()
    }

    /// Stops the local server (connections refused until `restart`); what was PUT is kept (see `put`).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the local server again on the same port, with everything PUT before (as a real server keeps its
    /// data over a restart; fhirsnake reads its resource directory at start-up, nothing is served half-loaded).
    pub fn restart(&mut self) {
        self.stop();
        let port = self.port;
        self.spawn(&fhirsnake_dir().unwrap(), port);
    }

    /// `PUT /<resourceType>/<id>`.
    pub fn put(&self, resource: &Value) {
        let path = format!(
            "{}/{}/{}",
            self.prefix,
            resource["resourceType"].as_str().unwrap(),
            resource["id"].as_str().unwrap()
        );
        let status =
            http_request(&self.host, self.port, "PUT", &path, Some(&serde_json::to_vec(resource).unwrap()), &[])
                .map(|(s, _, _)| s);
        assert!(matches!(status, Some(200 | 201)), "PUT {path}: {status:?}");
        // fhirsnake keeps PUTs in memory only: the file makes the resource survive `restart`.
        if let Some(dir) = &self.dir {
            let kind = dir.path().join("resources").join(resource["resourceType"].as_str().unwrap());
            std::fs::create_dir_all(&kind).unwrap();
            let file = kind.join(format!("{}.json", resource["id"].as_str().unwrap()));
            std::fs::write(file, serde_json::to_vec(resource).unwrap()).unwrap();
        }
    }

    /// `GET` on the server: (status, content type, body).
    pub fn get(&self, path: &str) -> Option<(u16, String, Vec<u8>)> {
        http_request(
            &self.host,
            self.port,
            "GET",
            &format!("{}{path}", self.prefix),
            None,
            &[("Accept", "application/fhir+json")],
        )
    }
}

impl Drop for FhirServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One HTTP/1.1 request (Connection: close): (status, content type, body).
pub fn http_request(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Option<(u16, String, Vec<u8>)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((host, port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Type: application/fhir+json\r\nContent-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    if let Some(b) = body {
        s.write_all(b).ok()?;
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    let split = out.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&out[..split]).to_string();
    let mut body = out[split + 4..].to_vec();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body)?;
    }
    Some((status, header("content-type").unwrap_or_default(), body))
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[..line_end]).ok()?.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

/// How the harness checks `Authorization` on `/fhir/...` and `/raw/...`.
#[derive(Clone)]
pub enum HarnessAuth {
    None,
    /// A static bearer token.
    Static(String),
    /// SMART Backend Services: assertions verified with this public key (PEM) and algorithm.
    Smart {
        public_pem: Vec<u8>,
        algorithm: jsonwebtoken::Algorithm,
        client_id: String,
        expires_in: u64,
    },
}

struct Shared {
    upstream_host: String,
    upstream_port: u16,
    upstream_prefix: String,
    auth: HarnessAuth,
    token_url: Mutex<String>,
    faults: Mutex<VecDeque<u16>>,
    valid_tokens: Mutex<HashSet<String>>,
    seen_jti: Mutex<HashSet<String>>,
    revoke_every: u32,
    pub tokens_issued: AtomicU32,
    pub assertions_refused: AtomicU32,
    pub requests: AtomicU32,
    pub unauthorized: AtomicU32,
    pub faults_answered: AtomicU32,
    delay_ms: AtomicU32,
    in_flight: AtomicU32,
    max_in_flight: AtomicU32,
}

/// The harness in front of a FHIR server.
pub struct Harness {
    pub port: u16,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

impl Harness {
    /// Serves on a free loopback port. `revoke_every` > 0 revokes every issued token after that many requests.
    pub fn start(upstream: &FhirServer, auth: HarnessAuth, revoke_every: u32) -> Harness {
        let shared = Arc::new(Shared {
            upstream_host: upstream.host.clone(),
            upstream_port: upstream.port,
            upstream_prefix: upstream.prefix.clone(),
            auth,
            token_url: Mutex::default(),
            faults: Mutex::default(),
            valid_tokens: Mutex::default(),
            seen_jti: Mutex::default(),
            revoke_every,
            tokens_issued: AtomicU32::new(0),
            assertions_refused: AtomicU32::new(0),
            requests: AtomicU32::new(0),
            unauthorized: AtomicU32::new(0),
            faults_answered: AtomicU32::new(0),
            delay_ms: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            max_in_flight: AtomicU32::new(0),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        *shared.token_url.lock().unwrap() = format!("http://127.0.0.1:{port}/token");
        let app = axum::Router::new()
            .route("/token", post(token))
            .route("/fhir/{*rest}", get(forward))
            .route("/raw/{*rest}", get(raw))
            .with_state(Arc::clone(&shared));
        runtime.spawn(async move { axum::serve(listener, app).await });
        Harness { port, shared, _runtime: runtime }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/fhir", self.port)
    }

    pub fn token_url(&self) -> String {
        self.shared.token_url.lock().unwrap().clone()
    }

    /// Answers the next requests to `/fhir` and `/raw` with these statuses first (429/503 carry `Retry-After: 1`).
    pub fn plan_faults(&self, statuses: &[u16]) {
        self.shared.faults.lock().unwrap().extend(statuses);
    }

    pub fn tokens_issued(&self) -> u32 {
        self.shared.tokens_issued.load(Ordering::SeqCst)
    }
    pub fn assertions_refused(&self) -> u32 {
        self.shared.assertions_refused.load(Ordering::SeqCst)
    }
    pub fn requests(&self) -> u32 {
        self.shared.requests.load(Ordering::SeqCst)
    }
    pub fn unauthorized(&self) -> u32 {
        self.shared.unauthorized.load(Ordering::SeqCst)
    }
    pub fn faults_answered(&self) -> u32 {
        self.shared.faults_answered.load(Ordering::SeqCst)
    }
    /// Every `/fhir` answer waits this long first.
    pub fn set_delay(&self, ms: u32) {
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }
    /// The most `/fhir` requests that were in the harness at once.
    pub fn max_in_flight(&self) -> u32 {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

fn form_value(body: &str, key: &str) -> Option<String> {
    body.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then(|| {
            let bytes = v.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < bytes.len() {
                match bytes[i] {
                    b'%' if i + 3 <= bytes.len() => {
                        out.push(
                            u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("3F"), 16)
                                .unwrap_or(b'?'),
                        );
                        i += 3;
                    }
                    b'+' => {
                        out.push(b' ');
                        i += 1;
                    }
                    b => {
                        out.push(b);
                        i += 1;
                    }
                }
            }
            String::from_utf8_lossy(&out).to_string()
        })
    })
}

async fn token(State(s): State<Arc<Shared>>, body: String) -> Response {
    let HarnessAuth::Smart { public_pem, algorithm, client_id, expires_in } = &s.auth else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let refuse = |why: &str| {
        s.assertions_refused.fetch_add(1, Ordering::SeqCst);
        json_response(StatusCode::UNAUTHORIZED, json!({"error": "invalid_client", "error_description": why}))
    };
    if form_value(&body, "grant_type").as_deref() != Some("client_credentials")
        || form_value(&body, "client_assertion_type").as_deref()
            != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
    {
        return refuse("grant");
    }
    let Some(assertion) = form_value(&body, "client_assertion") else { return refuse("no assertion") };
    let key = match algorithm {
        jsonwebtoken::Algorithm::RS384 => jsonwebtoken::DecodingKey::from_rsa_pem(public_pem),
        _ => jsonwebtoken::DecodingKey::from_ec_pem(public_pem),
    }
    .unwrap();
    let mut v = jsonwebtoken::Validation::new(*algorithm);
    v.set_audience(&[s.token_url.lock().unwrap().clone()]);
    v.set_issuer(std::slice::from_ref(client_id));
    v.sub = Some(client_id.clone());
    v.set_required_spec_claims(&["exp", "iss", "sub", "aud"]);
    let claims = match jsonwebtoken::decode::<Value>(&assertion, &key, &v) {
        Ok(d) => d.claims,
        Err(_) => return refuse("assertion"),
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    if claims["exp"].as_u64().unwrap_or(0) > now + 300 + 5 {
        return refuse("exp too far ahead");
    }
    let jti = claims["jti"].as_str().unwrap_or_default().to_string();
    if jti.is_empty() || !s.seen_jti.lock().unwrap().insert(jti) {
        return refuse("jti reused");
    }
    let n = s.tokens_issued.fetch_add(1, Ordering::SeqCst);
    let access = format!("tok-{n}-{now}");
    s.valid_tokens.lock().unwrap().insert(access.clone());
    json_response(
        StatusCode::OK,
        json!({"access_token": access, "token_type": "bearer", "expires_in": expires_in, "scope": form_value(&body, "scope")}),
    )
}

fn json_response(status: StatusCode, v: Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Checks auth and planned faults; `Some(response)` when the request is answered here.
fn gate(s: &Shared, headers: &HeaderMap) -> Option<Response> {
    let n = s.requests.fetch_add(1, Ordering::SeqCst) + 1;
    let bearer =
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let authorized = match &s.auth {
        HarnessAuth::None => true,
        HarnessAuth::Static(t) => bearer == Some(t.as_str()),
        HarnessAuth::Smart { .. } => bearer.is_some_and(|b| s.valid_tokens.lock().unwrap().contains(b)),
    };
    if !authorized {
        s.unauthorized.fetch_add(1, Ordering::SeqCst);
        return Some(StatusCode::UNAUTHORIZED.into_response());
    }
    if s.revoke_every > 0 && n.is_multiple_of(s.revoke_every) {
        s.valid_tokens.lock().unwrap().clear();
    }
    if let Some(status) = s.faults.lock().unwrap().pop_front() {
        s.faults_answered.fetch_add(1, Ordering::SeqCst);
        let status = StatusCode::from_u16(status).unwrap();
        return Some((status, [(header::RETRY_AFTER, "1")], "{\"resourceType\":\"OperationOutcome\"}").into_response());
    }
    None
}

async fn upstream_get(s: &Arc<Shared>, rest: &str) -> Option<(u16, String, Vec<u8>)> {
    let s = Arc::clone(s);
    let path = format!("{}/{rest}", s.upstream_prefix);
    tokio::task::spawn_blocking(move || {
        http_request(&s.upstream_host, s.upstream_port, "GET", &path, None, &[("Accept", "application/fhir+json")])
    })
    .await
    .unwrap()
}

async fn forward(State(s): State<Arc<Shared>>, UrlPath(rest): UrlPath<String>, headers: HeaderMap) -> Response {
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let delay = s.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(u64::from(delay))).await;
    }
    let response = forward_inner(&s, &rest, &headers).await;
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

async fn forward_inner(s: &Arc<Shared>, rest: &str, headers: &HeaderMap) -> Response {
    if let Some(r) = gate(s, headers) {
        return r;
    }
    match upstream_get(s, rest).await {
        Some((status, _, body)) => (
            StatusCode::from_u16(status).unwrap(),
            [(header::CONTENT_TYPE, "application/fhir+json; charset=utf-8")],
            Bytes::from(body),
        )
            .into_response(),
        None => StatusCode::BAD_GATEWAY.into_response(),
    }
}

async fn raw(State(s): State<Arc<Shared>>, UrlPath(rest): UrlPath<String>, headers: HeaderMap) -> Response {
    if let Some(r) = gate(&s, &headers) {
        return r;
    }
    match upstream_get(&s, &rest).await {
        Some((200, _, body)) => {
            let binary: Value = serde_json::from_slice(&body).unwrap();
            let bytes = base64::engine::general_purpose::STANDARD.decode(binary["data"].as_str().unwrap()).unwrap();
            let ct = binary["contentType"].as_str().unwrap_or("application/octet-stream").to_string();
            (StatusCode::OK, [(header::CONTENT_TYPE, ct)], Bytes::from(bytes)).into_response()
        }
        Some((status, _, _)) => StatusCode::from_u16(status).unwrap().into_response(),
        None => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// A fresh key pair from openssl (`make tools` installs it): (private PKCS#8 PEM path, public PEM bytes).
pub fn key_pair(dir: &Path, algorithm: &str) -> (PathBuf, Vec<u8>) {
    let private = dir.join(format!("{algorithm}.key.pem"));
    let public = dir.join(format!("{algorithm}.pub.pem"));
    let gen_args: &[&str] = match algorithm {
        "RS384" => &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        _ => &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
    };
    let ok = Command::new("openssl")
        .args(gen_args)
        .arg("-out")
        .arg(&private)
        .stderr(Stdio::null())
        .status()
        .expect("openssl (make tools)");
    assert!(ok.success());
    let ok = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public)
        .status()
        .unwrap();
    assert!(ok.success());
    (private, std::fs::read(public).unwrap())
}
