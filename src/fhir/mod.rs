//! The FHIR client: fetches attachments that DocumentReferences only reference (`attachment.url`).
//!
//! In: the `url` as written (a FHIR reference such as `Binary/123`, resolved against `fhir.base_url`, or an
//! absolute http(s) URL on `fhir.base_url`'s host or one of `fhir.allowed_hosts`). Out: the response body and its
//! `Content-Type` (`stages::decode::complete` reads a `Binary` resource or raw bytes), or a `DocError` whose code
//! says what happens to the event:
//!
//! * 404/410 → `attachment_not_found`, another 4xx → `attachment_fetch_refused`, a body over the size limit →
//!   `attachment_too_large`, a host not allowed → `attachment_host_not_allowed` (dead letters);
//! * connection errors, timeouts, 429 and 5xx → retried with the one `Backoff` (honouring `Retry-After`), never
//!   dead-lettered; after `fhir.halt_after_ms` → `fhir_unavailable` (halt, nothing committed);
//! * 401/403 → `fhir_unauthorized` (halt: a configuration error). With SMART, a 401 first drops the cached token
//!   and tries once more with a fresh one.
//!
//! One pooled HTTP/1.1 client (hyper-util, rustls with the platform's roots), at most `fhir.max_per_host`
//! requests in flight per host, `fhir.timeout_ms` per attempt. `Accept: application/fhir+json`. Logs and errors
//! name the host and the status only: never the URL's path or query (they carry ids), never content.

pub mod smart;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, USER_AGENT};
use http::{HeaderValue, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;
use tracing::warn;

use crate::backoff::Backoff;
use crate::config::FhirSettings;
use crate::error::{DocError, ErrorCode, Stage};
use crate::stages::decode::Fetched;
use crate::telemetry::metrics::metrics;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
pub(crate) type HttpClient = Client<Connector, Full<Bytes>>;

/// Why the client could not be built (a configuration error, said at start-up).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FhirConfigError(pub String);

/// Fetches referenced attachments; shared by every document task.
pub struct Fetcher {
    client: HttpClient,
    base: Option<String>,
    base_authority: Option<String>,
    allowed: Vec<String>,
    auth: Auth,
    per_host: Mutex<HashMap<String, Arc<Semaphore>>>,
    max_per_host: usize,
    timeout: Duration,
    halt_after: Duration,
    max_body: usize,
}

enum Auth {
    None,
    Bearer(HeaderValue),
    Smart(Box<smart::TokenSource>),
}

/// How one attempt ended, before the retry policy.
enum Attempt {
    Done(Fetched),
    Retry { why: String, after: Option<Duration> },
    Unauthorized(StatusCode),
    Fail(DocError),
}

impl Fetcher {
    /// Builds the client from `fhir.*`; `max_attachment_bytes` bounds what one fetch may read.
    pub fn new(s: &FhirSettings, max_attachment_bytes: usize) -> Result<Self, FhirConfigError> {
        let client = http_client()?;
        let base = s.base_url.trim().trim_end_matches('/');
        let (base, base_authority) = if base.is_empty() {
            (None, None)
        } else {
            let uri = Uri::try_from(base).map_err(|_| FhirConfigError("fhir.base_url: not a URL".into()))?;
            (Some(base.to_string()), uri.authority().map(|a| a.as_str().to_ascii_lowercase()))
        };
        let auth = if !s.smart.token_url.trim().is_empty() {
            Auth::Smart(Box::new(smart::TokenSource::new(
                &s.smart,
                client.clone(),
                Duration::from_millis(s.timeout_ms),
            )?))
        } else if !s.bearer_token.expose().is_empty() {
            let mut v = HeaderValue::try_from(format!("Bearer {}", s.bearer_token.expose()))
                .map_err(|_| FhirConfigError("fhir.bearer_token: not a valid header value".into()))?;
            v.set_sensitive(true);
            Auth::Bearer(v)
        } else {
            Auth::None
        };
        Ok(Self {
            client,
            base,
            base_authority,
            allowed: s.allowed_hosts.iter().map(|h| h.trim().to_ascii_lowercase()).collect(),
            auth,
            per_host: Mutex::default(),
            max_per_host: s.max_per_host,
            timeout: Duration::from_millis(s.timeout_ms),
            halt_after: Duration::from_millis(s.halt_after_ms),
            // A Binary resource carries the bytes as base64 inside JSON.
            max_body: max_attachment_bytes.saturating_mul(4) / 3 + 64 * 1024,
        })
    }

    /// The absolute URL for `url`, or why it may not be fetched.
    pub fn resolve(&self, url: &str) -> Result<Uri, DocError> {
        let url = url.trim();
        let not_allowed = |why: &str| DocError::new(ErrorCode::AttachmentHostNotAllowed, Stage::Fetch, why);
        if url.starts_with('#') {
            return Err(DocError::new(
                ErrorCode::AttachmentFetchRefused,
                Stage::Fetch,
                "attachment.url is a contained reference; contained Binary resources are not read",
            ));
        }
        let absolute = match url.split_once("://") {
            Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => {
                url.to_string()
            }
            Some(_) => return Err(not_allowed("attachment.url is neither an http(s) URL nor a FHIR reference")),
            None => {
                let Some(base) = &self.base else {
                    return Err(not_allowed("attachment.url is a relative reference and fhir.base_url is unset"));
                };
                if url.contains(':') || url.split(['/', '?']).any(|seg| seg == "..") {
                    return Err(not_allowed("attachment.url is not a FHIR reference (Type/id)"));
                }
                format!("{base}/{}", url.trim_start_matches('/'))
            }
        };
        let uri = Uri::try_from(absolute.as_str()).map_err(|_| not_allowed("attachment.url is not a valid URL"))?;
        let authority = uri.authority().map(|a| a.as_str().to_ascii_lowercase()).unwrap_or_default();
        if authority.contains('@') {
            return Err(not_allowed("attachment.url carries user information"));
        }
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let allowed = self.base_authority.as_deref() == Some(authority.as_str())
            || self.allowed.iter().any(|a| *a == authority || *a == host);
        if !allowed {
            return Err(not_allowed("attachment.url's host is not fhir.base_url's and not in fhir.allowed_hosts"));
        }
        Ok(uri)
    }

    /// Fetches `url` (as written in the attachment): retries transient failures until `fhir.halt_after_ms`.
    pub async fn fetch(&self, url: &str) -> Result<Fetched, DocError> {
        let uri = match self.resolve(url) {
            Ok(uri) => uri,
            Err(e) => {
                metrics().fhir_fetches.with_label_values(&["refused"]).inc();
                return Err(e);
            }
        };
        let host = uri.authority().map(|a| a.as_str().to_ascii_lowercase()).unwrap_or_default();
        let limit = self.limit(&host);
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10), self.halt_after);
        let mut fresh_token = false;
        loop {
            let attempt = {
                let _permit = limit.acquire().await.expect("the semaphore is never closed");
                let clock = Instant::now();
                let attempt = match tokio::time::timeout(self.timeout, self.attempt(&uri)).await {
                    Ok(a) => a,
                    Err(_) => Attempt::Retry { why: "timed out".into(), after: None },
                };
                metrics().fhir_fetch_duration.observe(clock.elapsed().as_secs_f64());
                attempt
            };
            let outcome = match &attempt {
                Attempt::Done(_) => "ok",
                Attempt::Retry { .. } => "retried",
                Attempt::Unauthorized(_) => "unauthorized",
                Attempt::Fail(e) if e.code == ErrorCode::AttachmentNotFound => "not_found",
                Attempt::Fail(e) if e.code == ErrorCode::AttachmentTooLarge => "too_large",
                Attempt::Fail(e) if e.code == ErrorCode::FhirUnavailable || e.code == ErrorCode::FhirUnauthorized => {
                    "retried"
                }
                Attempt::Fail(_) => "refused",
            };
            metrics().fhir_fetches.with_label_values(&[outcome]).inc();
            match attempt {
                Attempt::Done(fetched) => return Ok(fetched),
                Attempt::Fail(e) => return Err(e),
                Attempt::Unauthorized(status) => {
                    if let Auth::Smart(tokens) = &self.auth
                        && !fresh_token
                    {
                        // An expired or revoked token: one more try with a new one.
                        tokens.invalidate();
                        fresh_token = true;
                        continue;
                    }
                    return Err(DocError::new(
                        ErrorCode::FhirUnauthorized,
                        Stage::Fetch,
                        format!(
                            "the FHIR server at {host} answered {} (check fhir.bearer_token or fhir.smart.*)",
                            status.as_u16()
                        ),
                    ));
                }
                Attempt::Retry { why, after } => match backoff.failed_with(after) {
                    Some(wait) => {
                        warn!(
                            code = ErrorCode::FhirUnavailable.as_str(),
                            host = %host,
                            why = %why,
                            retry_in_ms = wait.as_millis() as u64,
                            "FHIR fetch failed; retrying."
                        );
                        tokio::time::sleep(wait).await;
                    }
                    None => {
                        return Err(DocError::new(
                            ErrorCode::FhirUnavailable,
                            Stage::Fetch,
                            format!("the FHIR server at {host} kept failing ({why}) for fhir.halt_after_ms"),
                        ));
                    }
                },
            }
        }
    }

    fn limit(&self, host: &str) -> Arc<Semaphore> {
        let mut map = self.per_host.lock().expect("per-host limits");
        map.entry(host.to_string()).or_insert_with(|| Arc::new(Semaphore::new(self.max_per_host))).clone()
    }

    async fn attempt(&self, uri: &Uri) -> Attempt {
        let mut request = Request::get(uri.clone())
            .header(ACCEPT, "application/fhir+json")
            .header(USER_AGENT, concat!("clinstream/", env!("CARGO_PKG_VERSION")));
        match &self.auth {
            Auth::None => {}
            Auth::Bearer(v) => request = request.header(AUTHORIZATION, v.clone()),
            Auth::Smart(tokens) => match tokens.token().await {
                Ok(v) => request = request.header(AUTHORIZATION, v),
                Err(smart::TokenError::Transient(why)) => return Attempt::Retry { why, after: None },
                Err(smart::TokenError::Refused(e)) => return Attempt::Fail(e),
            },
        }
        let request = request.body(Full::new(Bytes::new())).expect("a GET request builds");
        let response = match self.client.request(request).await {
            Ok(r) => r,
            Err(e) => return Attempt::Retry { why: transport_reason(&e), after: None },
        };
        let status = response.status();
        let retry_after = retry_after(response.headers().get(RETRY_AFTER));
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Attempt::Unauthorized(status);
        }
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT
        {
            return Attempt::Retry { why: format!("HTTP {}", status.as_u16()), after: retry_after };
        }
        if status == StatusCode::NOT_FOUND || status == StatusCode::GONE {
            return Attempt::Fail(DocError::new(
                ErrorCode::AttachmentNotFound,
                Stage::Fetch,
                format!("the FHIR server answered {} for attachment.url", status.as_u16()),
            ));
        }
        if !status.is_success() {
            return Attempt::Fail(DocError::new(
                ErrorCode::AttachmentFetchRefused,
                Stage::Fetch,
                format!("the FHIR server answered {} for attachment.url", status.as_u16()),
            ));
        }
        let too_large = |n: String| {
            Attempt::Fail(DocError::new(
                ErrorCode::AttachmentTooLarge,
                Stage::Fetch,
                format!("the fetched body is {n} bytes; the limit is {}", self.max_body),
            ))
        };
        if let Some(len) = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            && len > self.max_body as u64
        {
            return too_large(len.to_string());
        }
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
        match Limited::new(response.into_body(), self.max_body).collect().await {
            Ok(body) => Attempt::Done(Fetched { body: body.to_bytes().to_vec(), content_type }),
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                too_large(format!("more than {}", self.max_body))
            }
            Err(_) => Attempt::Retry { why: "the connection dropped while reading the body".into(), after: None },
        }
    }
}

/// The pooled HTTP/1.1 client (http and https; TLS as every outbound client has it: `tls::client_config`).
pub(crate) fn http_client() -> Result<HttpClient, FhirConfigError> {
    let (tls, _) = crate::tls::client_config().map_err(|e| FhirConfigError(format!("TLS: {e}")))?;
    let connector =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().wrap_connector(
            {
                let mut http = HttpConnector::new();
                http.enforce_http(false);
                http.set_nodelay(true);
                http.set_connect_timeout(Some(Duration::from_secs(10)));
                http
            },
        );
    Ok(Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector))
}

/// A transport error's kind, without the URL.
fn transport_reason(e: &hyper_util::client::legacy::Error) -> String {
    if e.is_connect() { "connection failed".into() } else { "the connection failed mid-request".into() }
}

/// `Retry-After` in seconds (the HTTP-date form is treated as absent), capped at a minute.
fn retry_after(v: Option<&HeaderValue>) -> Option<Duration> {
    let secs: u64 = v?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(60)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    fn fetcher(base: &str, allowed: &[&str]) -> Fetcher {
        let mut s = Settings::load_from(None, Some(Default::default())).unwrap().fhir;
        s.base_url = base.into();
        s.allowed_hosts = allowed.iter().map(|a| a.to_string()).collect();
        Fetcher::new(&s, 1 << 20).unwrap()
    }

    #[test]
    fn references_resolve_against_the_base_and_hosts_are_checked() {
        let f = fetcher("https://fhir.example.org/r4/", &["docs.example.org"]);
        assert_eq!(f.resolve("Binary/123").unwrap().to_string(), "https://fhir.example.org/r4/Binary/123");
        assert_eq!(f.resolve("/Binary/1").unwrap().to_string(), "https://fhir.example.org/r4/Binary/1");
        assert!(f.resolve("https://FHIR.example.org/r4/Binary/9").is_ok());
        assert!(f.resolve("http://docs.example.org:8080/x.pdf").is_ok());
        for bad in [
            "https://evil.example.com/Binary/1",
            "ftp://fhir.example.org/x",
            "urn:uuid:1",
            "../secret",
            "Binary/../../x",
        ] {
            assert_eq!(f.resolve(bad).unwrap_err().code, ErrorCode::AttachmentHostNotAllowed, "{bad}");
        }
        assert_eq!(
            f.resolve("https://u:p@fhir.example.org/r4/x").unwrap_err().code,
            ErrorCode::AttachmentHostNotAllowed
        );
        assert_eq!(f.resolve("#bin").unwrap_err().code, ErrorCode::AttachmentFetchRefused);
        let no_base = fetcher("", &["docs.example.org"]);
        assert_eq!(no_base.resolve("Binary/1").unwrap_err().code, ErrorCode::AttachmentHostNotAllowed);
        let e = no_base.resolve("https://other.example.org/Binary/secret-id?patient=John").unwrap_err();
        assert!(!e.detail.contains("secret-id") && !e.detail.contains("John"), "{}", e.detail);
    }

    #[test]
    fn retry_after_seconds() {
        assert_eq!(retry_after(Some(&HeaderValue::from_static("3"))), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(Some(&HeaderValue::from_static("9999"))), Some(Duration::from_secs(60)));
        assert_eq!(retry_after(Some(&HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"))), None);
    }
}
