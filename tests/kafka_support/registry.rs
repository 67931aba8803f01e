//! A Schema Registry for the tests, speaking the two calls of Confluent's REST API (v1) the worker uses:
//! `POST /subjects/{subject}/versions` and `GET /schemas/ids/{id}`, with basic auth and the registry's error
//! bodies. No Schema Registry server can be installed on these machines (none in PyPI, Debian or npm), so this one
//! stands in; `SCHEMA_REGISTRY_URL` (with `SCHEMA_REGISTRY_USER`/`SCHEMA_REGISTRY_PASSWORD` when it needs them)
//! runs the same test against a real registry (Confluent, Karapace, Redpanda, Apicurio's ccompat API).
//!
//! It checks what a real one checks: the content type, the JSON body, and (when set) the credentials; an
//! identical schema under a subject gets its existing id; a subject marked incompatible answers 409 as a registry
//! with a compatibility rule does.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use base64::Engine as _;

#[derive(Default)]
struct State {
    /// Schema text by id (ids start at 101, so a test cannot pass by accident with 0 or 1).
    schemas: BTreeMap<u32, String>,
    /// Ids registered under each subject.
    subjects: BTreeMap<String, Vec<u32>>,
    incompatible: Vec<String>,
    /// Requests that broke the protocol (wrong content type, bad JSON, missing credentials).
    protocol_errors: Vec<String>,
}

pub struct TestRegistry {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl TestRegistry {
    /// Listens on loopback; `auth` = Some((user, password)) requires basic auth.
    pub fn start(auth: Option<(&str, &str)>) -> TestRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let expected = auth
            .map(|(u, p)| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = handle(stream, &shared, expected.as_deref());
            }
        });
        TestRegistry { url, state }
    }

    /// Registration under `subject` will be refused as incompatible.
    pub fn refuse(&self, subject: &str) {
        self.state.lock().unwrap().incompatible.push(subject.to_string());
    }

    pub fn ids(&self, subject: &str) -> Vec<u32> {
        self.state.lock().unwrap().subjects.get(subject).cloned().unwrap_or_default()
    }

    pub fn protocol_errors(&self) -> Vec<String> {
        self.state.lock().unwrap().protocol_errors.clone()
    }
}

fn handle(stream: TcpStream, state: &Mutex<State>, auth: Option<&str>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body)?;
    let (status, reply) = answer(state, auth, &method, &path, &headers, &body);
    let reply = reply.to_string();
    let mut out = stream;
    write!(
        out,
        "HTTP/1.1 {status} X\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    )?;
    out.flush()
}

fn error(status: u16, code: u32, message: &str) -> (u16, serde_json::Value) {
    (status, serde_json::json!({ "error_code": code, "message": message }))
}

fn answer(
    state: &Mutex<State>,
    auth: Option<&str>,
    method: &str,
    path: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> (u16, serde_json::Value) {
    let mut s = state.lock().unwrap();
    if let Some(expected) = auth
        && headers.get("authorization").map(String::as_str) != Some(expected)
    {
        return error(401, 40101, "Unauthorized");
    }
    if method == "GET"
        && let Some(id) = path.strip_prefix("/schemas/ids/")
    {
        return match id.parse::<u32>().ok().and_then(|id| s.schemas.get(&id)) {
            Some(schema) => (200, serde_json::json!({ "schema": schema })),
            None => error(404, 40403, "Schema not found"),
        };
    }
    let Some(subject) = path.strip_prefix("/subjects/").and_then(|p| p.strip_suffix("/versions")) else {
        return error(404, 404, "HTTP 404 Not Found");
    };
    if method != "POST" {
        return error(405, 405, "HTTP 405 Method Not Allowed");
    }
    let content_type = headers.get("content-type").cloned().unwrap_or_default();
    if !content_type.starts_with("application/vnd.schemaregistry.v1+json")
        && !content_type.starts_with("application/json")
    {
        s.protocol_errors.push(format!("content type {content_type:?}"));
        return error(415, 415, "HTTP 415 Unsupported Media Type");
    }
    let schema = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => match v.get("schema").and_then(|s| s.as_str()) {
            Some(schema) if serde_json::from_str::<serde_json::Value>(schema).is_ok() => schema.to_string(),
            _ => {
                s.protocol_errors.push("body without a JSON schema string".into());
                return error(422, 42201, "Input schema is an invalid Avro schema");
            }
        },
        Err(_) => {
            s.protocol_errors.push("body is not JSON".into());
            return error(400, 400, "Unrecognized field");
        }
    };
    if s.incompatible.iter().any(|x| x == subject) {
        return error(409, 409, "Schema being registered is incompatible with an earlier schema for subject");
    }
    let existing = s.subjects.get(subject).into_iter().flatten().copied().find(|id| s.schemas[id] == schema);
    let id = match existing {
        Some(id) => id,
        None => {
            let id = 101 + s.schemas.len() as u32;
            s.schemas.insert(id, schema);
            s.subjects.entry(subject.to_string()).or_default().push(id);
            id
        }
    };
    (200, serde_json::json!({ "id": id }))
}
