//! Confluent Schema Registry client: registers the output schemas under `<topic>-value` at start-up and returns
//! the ids the Confluent wire format carries (see `avro`). Used only when `kafka.schema_registry.url` is set.
//!
//! The REST calls are the registry's stable v1 API (`POST /subjects/{subject}/versions`, `GET /schemas/ids/{id}`),
//! spoken over HTTP/1.1 with hyper (http or https; TLS through rustls with the platform's roots, which honour
//! `SSL_CERT_FILE`/`SSL_CERT_DIR`), with HTTP basic auth when a username is configured. Registering a schema
//! that is already registered returns its existing id, so every replica and every restart gets the same ids.
//!
//! Errors say what went wrong without echoing bodies that could carry configuration back into logs: the status,
//! the registry's numeric error code and its message (schema compatibility messages name fields, never data).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;

use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::codec::avro::{DLQ_SCHEMA, Framing, KG_SCHEMA, VARIABLES_SCHEMA};
use crate::config::{Endpoint, KafkaSettings, SchemaRegistrySettings};
use crate::error::ErrorCode;
use crate::error::RunError;
use crate::telemetry::metrics::metrics;

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The URL or credentials cannot work: a configuration error (the worker does not start).
    #[error("schema registry settings: {0}")]
    Config(String),
    /// The registry refused the schema or the credentials (4xx): retrying will not help.
    #[error("schema registry refused the request (HTTP {status}, error code {code}): {message}")]
    Refused { status: u16, code: i64, message: String },
    /// Unreachable, timed out or a server error: worth retrying.
    #[error("schema registry unavailable: {0}")]
    Unavailable(String),
}

impl RegistryError {
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Unavailable(_))
    }
}

#[derive(Deserialize)]
struct IdResponse {
    id: u32,
}

#[derive(Deserialize)]
struct SchemaResponse {
    schema: String,
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    error_code: i64,
    #[serde(default)]
    message: String,
}

/// A registry endpoint (cheap to clone).
#[derive(Clone)]
pub struct SchemaRegistry {
    endpoint: Endpoint,
    authorization: Option<String>,
    timeout: Duration,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaRegistry").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl SchemaRegistry {
    pub fn new(settings: &SchemaRegistrySettings) -> Result<Self, RegistryError> {
        let endpoint = Endpoint::parse(&settings.url).map_err(|e| RegistryError::Config(e.problems().join("; ")))?;
        let authorization = (!settings.username.is_empty()).then(|| {
            let pair = format!("{}:{}", settings.username, settings.password.expose());
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        let tls = if endpoint.https { Some(tls_connector()?) } else { None };
        Ok(Self { endpoint, authorization, timeout: Duration::from_millis(settings.timeout_ms), tls })
    }

    /// Registers `schema` (Avro JSON) under `subject` and returns its id; an identical schema already registered
    /// returns the existing id.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<u32, RegistryError> {
        let body = serde_json::json!({ "schema": schema }).to_string();
        let path = format!("/subjects/{}/versions", encode_path_segment(subject));
        let bytes = self.call("POST", &path, Some(body)).await?;
        serde_json::from_slice::<IdResponse>(&bytes)
            .map(|r| r.id)
            .map_err(|e| RegistryError::Unavailable(format!("unexpected registration response: {e}")))
    }

    /// The schema (Avro JSON) registered under `id`.
    pub async fn schema_by_id(&self, id: u32) -> Result<String, RegistryError> {
        let bytes = self.call("GET", &format!("/schemas/ids/{id}"), None).await?;
        serde_json::from_slice::<SchemaResponse>(&bytes)
            .map(|r| r.schema)
            .map_err(|e| RegistryError::Unavailable(format!("unexpected schema response: {e}")))
    }

    async fn call(&self, method: &str, path: &str, body: Option<String>) -> Result<Bytes, RegistryError> {
        match tokio::time::timeout(self.timeout, self.exchange(method, path, body)).await {
            Ok(result) => result,
            Err(_) => Err(RegistryError::Unavailable(format!("no answer within {} ms", self.timeout.as_millis()))),
        }
    }

    async fn exchange(&self, method: &str, path: &str, body: Option<String>) -> Result<Bytes, RegistryError> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| RegistryError::Unavailable(format!("{what}: {e}"));
        let tcp = TcpStream::connect((self.endpoint.host.as_str(), self.endpoint.port))
            .await
            .map_err(|e| unavailable("connect", &e))?;
        let _ = tcp.set_nodelay(true);
        let host_header = if (self.endpoint.https && self.endpoint.port == 443)
            || (!self.endpoint.https && self.endpoint.port == 80)
        {
            self.endpoint.host.clone()
        } else {
            format!("{}:{}", self.endpoint.host, self.endpoint.port)
        };
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.endpoint.prefix, path))
            .header("host", host_header)
            .header("accept", CONTENT_TYPE)
            .header("user-agent", concat!("clinstream/", env!("CARGO_PKG_VERSION")));
        if body.is_some() {
            request = request.header("content-type", CONTENT_TYPE);
        }
        if let Some(auth) = &self.authorization {
            request = request.header("authorization", auth);
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| RegistryError::Config(format!("request: {e}")))?;
        let response = match &self.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.endpoint.host.clone())
                    .map_err(|e| RegistryError::Config(format!("registry host name: {e}")))?;
                let stream = tls.connect(name, tcp).await.map_err(|e| unavailable("TLS handshake", &e))?;
                send(TokioIo::new(stream), request).await?
            }
            None => send(TokioIo::new(tcp), request).await?,
        };
        let status = response.status();
        let bytes =
            response.into_body().collect().await.map_err(|e| unavailable("reading the response", &e))?.to_bytes();
        if status.is_success() {
            return Ok(bytes);
        }
        let err: ErrorBody = serde_json::from_slice(&bytes).unwrap_or_default();
        let message: String = err.message.chars().take(300).collect();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::REQUEST_TIMEOUT
        {
            return Err(RegistryError::Unavailable(format!("HTTP {}: {message}", status.as_u16())));
        }
        Err(RegistryError::Refused { status: status.as_u16(), code: err.error_code, message })
    }
}

async fn send<T>(
    io: TokioIo<T>,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, RegistryError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| RegistryError::Unavailable(format!("HTTP handshake: {e}")))?;
    tokio::spawn(connection);
    sender.send_request(request).await.map_err(|e| RegistryError::Unavailable(format!("HTTP request: {e}")))
}

fn tls_connector() -> Result<tokio_rustls::TlsConnector, RegistryError> {
    let (config, roots) = crate::tls::client_config().map_err(|e| RegistryError::Config(format!("TLS: {e}")))?;
    if roots == 0 {
        return Err(RegistryError::Config(
            "no trusted CA certificates found for the https registry (install ca-certificates or set SSL_CERT_FILE)"
                .into(),
        ));
    }
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Percent-encodes what a subject name may hold that a path segment may not.
fn encode_path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The framing of the outputs `[variables, kg, dlq]`: Avro single-object encoding without a registry; with one,
/// each schema registered under `<topic>-value` and its id in the Confluent wire format. Transient failures are
/// retried with the Kafka backoff for up to `kafka.halt_after_ms`.
pub async fn output_framing(k: &KafkaSettings) -> Result<[Framing; 3], RunError> {
    if k.schema_registry.url.is_empty() {
        return Ok([Framing::SingleObject, Framing::SingleObject, Framing::SingleObject]);
    }
    let failed = |detail: String| RunError::halt(ErrorCode::SchemaRegistryFailed, detail);
    let registry = SchemaRegistry::new(&k.schema_registry).map_err(|e| RunError::Config(e.to_string()))?;
    let outputs = [(&k.variables_topic, VARIABLES_SCHEMA), (&k.kg_topic, KG_SCHEMA), (&k.dlq_topic, DLQ_SCHEMA)];
    let mut framing = [Framing::SingleObject, Framing::SingleObject, Framing::SingleObject];
    for (slot, (topic, schema)) in framing.iter_mut().zip(outputs) {
        let subject = value_subject(topic);
        let mut backoff = Backoff::kafka(k);
        let id = loop {
            match registry.register(&subject, schema).await {
                Ok(id) => break id,
                Err(e) if e.is_transient() => {
                    warn!(code = ErrorCode::SchemaRegistryFailed.as_str(), subject = %subject, error = %e, "Schema registration failed; retrying.");
                    metrics().retries.with_label_values(&["registry"]).inc();
                    match backoff.failed() {
                        Some(delay) => tokio::time::sleep(delay).await,
                        None => return Err(failed(format!("{subject}: {e} (for {} ms)", k.halt_after_ms))),
                    }
                }
                Err(e) => return Err(failed(format!("{subject}: {e}"))),
            }
        };
        info!(subject = %subject, schema_id = id, "Output schema registered.");
        *slot = Framing::Confluent(id);
    }
    Ok(framing)
}

/// `<topic>-value`, Confluent's default TopicNameStrategy for record values.
pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn settings(url: &str) -> SchemaRegistrySettings {
        SchemaRegistrySettings { url: url.into(), username: String::new(), password: Secret::new(""), timeout_ms: 500 }
    }

    #[test]
    fn urls_are_checked() {
        assert!(matches!(SchemaRegistry::new(&settings("ftp://r:1")), Err(RegistryError::Config(_))));
        assert!(matches!(SchemaRegistry::new(&settings("not a url")), Err(RegistryError::Config(_))));
        let e = SchemaRegistry::new(&settings("http://user:pw@r:8081")).unwrap_err().to_string();
        assert!(!e.contains("pw"), "{e}");
        let r = SchemaRegistry::new(&settings("http://registry.example:8081/sr/")).unwrap();
        assert_eq!(
            (r.endpoint.host.as_str(), r.endpoint.port, r.endpoint.prefix.as_str()),
            ("registry.example", 8081, "/sr")
        );
        let r = SchemaRegistry::new(&settings("http://registry.example")).unwrap();
        assert_eq!((r.endpoint.port, r.endpoint.prefix.as_str()), (80, ""));
    }

    #[test]
    fn subjects_are_path_safe() {
        assert_eq!(value_subject("clinstream.kg.v1"), "clinstream.kg.v1-value");
        assert_eq!(encode_path_segment("a b/c-value"), "a%20b%2Fc-value");
    }

    #[tokio::test]
    async fn an_unreachable_registry_is_transient() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let r = SchemaRegistry::new(&settings(&format!("http://127.0.0.1:{port}"))).unwrap();
        let e = r.register("t-value", "\"string\"").await.unwrap_err();
        assert!(e.is_transient(), "{e}");
    }
}
