//! The HTTP side of the query service (axum): `POST /v1/context`, `POST /v1/search`, `POST /v1/answer`, beside
//! `/metrics`, `/healthz`, `/readyz` (`http::router`).
//!
//! Every `/v1` request passes, in order: identification (`access::Authenticator`: 401 before the body is read, or
//! 503 while the identity provider's keys cannot be had), the body limit (413), the content type (415), JSON
//! decoding into the typed request (400 naming the field — serde's messages, which may quote values, are never
//! passed on), the patient check (403, the same whether the patient exists or not), the concurrency limit
//! (`serve.max_concurrent`; the rest wait) and the timeout (504). Store unavailable → 503 with `Retry-After`; other
//! store or model failures → 500. Every request, refused or answered, gets one audit record (`audit`; an answer
//! whose record is not delivered becomes a 503 with `serve.audit.fail_closed`) and an `X-Request-Id`; every answer
//! is counted by route and status, and timed by route (and in its `Server-Timing` header: the request's time in the
//! service, and for `/v1/answer` its context, its generative step and the LLM's time); nothing of the request is
//! logged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Extension;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::access::{Patients, Principal};
use super::api::{ErrorBody, ErrorDetail};
use super::audit::{self, AuditRecord, Returned};
use super::{
    AnswerError, AnswerResponse, ContextRequest, ContextResponse, ReadError, SearchRequest, SearchResponse, Service,
};
use crate::http::Readiness;
use crate::llm::LlmError;
use crate::query::reader::patient_reference;
use crate::store::StoreError;
use crate::telemetry::metrics::metrics;

#[derive(Clone)]
struct Api {
    service: Arc<Service>,
    permits: Arc<Semaphore>,
    timeout: Duration,
}

/// What a route's answer says of where its time went: `Server-Timing` metrics (name, duration) before `total`.
trait Timed {
    fn stages(&self) -> Vec<(&'static str, Duration)> {
        Vec::new()
    }
}

impl Timed for ContextResponse {}
impl Timed for SearchResponse {}
impl Timed for AnswerResponse {
    fn stages(&self) -> Vec<(&'static str, Duration)> {
        let t = self.timing;
        vec![("context", t.context), ("generate", t.generate), ("llm", t.llm)]
    }
}

/// The `Server-Timing` header (W3C Server Timing): each stage's and the whole request's time in milliseconds.
fn server_timing(stages: &[(&'static str, Duration)], total: Duration) -> HeaderValue {
    let metrics = stages.iter().copied().chain(std::iter::once(("total", total)));
    let value: Vec<String> = metrics.map(|(name, d)| format!("{name};dur={:.3}", d.as_secs_f64() * 1000.0)).collect();
    HeaderValue::from_str(&value.join(", ")).unwrap_or_else(|_| HeaderValue::from_static("total"))
}

/// The metrics of a `Server-Timing` header value that carry a duration: (name, milliseconds), in order.
pub fn parse_server_timing(value: &str) -> Vec<(String, f64)> {
    value
        .split(',')
        .filter_map(|metric| {
            let mut params = metric.split(';').map(str::trim);
            let name = params.next().filter(|n| !n.is_empty())?;
            let dur = params.find_map(|p| p.strip_prefix("dur="))?.parse().ok()?;
            Some((name.to_string(), dur))
        })
        .collect()
}

/// A JSON answer.
fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "response could not be encoded").into_response(),
    }
}

/// A JSON error answer.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody { error: ErrorDetail { code: code.to_string(), message: message.into() } };
    let mut r = json(status, &body);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

impl IntoResponse for ReadError {
    fn into_response(self) -> Response {
        match &self {
            ReadError::BadRequest(m) => error(StatusCode::BAD_REQUEST, "bad_request", m.clone()),
            ReadError::Store(StoreError::Unavailable { .. }) => {
                crate::http::set_store_reachable(false);
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the vector store is unavailable; retry later",
                )
            }
            ReadError::Store(StoreError::Failed(_)) => {
                tracing::warn!(error = %self, "A query-service request failed in the vector store.");
                error(StatusCode::INTERNAL_SERVER_ERROR, "store_failed", "the vector store refused the request")
            }
            ReadError::Embed(_) => {
                tracing::warn!(error = %self, "A query-service request failed in the embedding model.");
                error(StatusCode::INTERNAL_SERVER_ERROR, "embed_failed", "the embedding model failed")
            }
            ReadError::NotReady => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "the service is building its label index (first start with this model); retry shortly",
            ),
        }
    }
}

/// The route label of a `/v1` path.
fn route_of(path: &str) -> &'static str {
    match path {
        "/v1/context" => "context",
        "/v1/search" => "search",
        "/v1/answer" => "answer",
        _ => "other",
    }
}

/// Identifies the caller before the body is read: a 401 (or a 503 while the identity provider's keys cannot be
/// had) is answered and audited here; otherwise the `Principal` and the request id travel on to the route.
async fn authenticate(State(api): State<Api>, mut request: Request, next: Next) -> Response {
    let id = audit::request_id(request.headers().get("x-request-id").and_then(|v| v.to_str().ok()));
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match api.service.authenticator().identify(authorization).await {
        Ok(principal) => {
            request.extensions_mut().insert(Caller { principal, request_id: id.clone() });
            with_request_id(next.run(request).await, &id)
        }
        Err(denied) => {
            metrics().api_denials.with_label_values(&[denied.reason]).inc();
            let route = route_of(request.uri().path());
            let status = StatusCode::from_u16(denied.status).unwrap_or(StatusCode::UNAUTHORIZED);
            let record = AuditRecord {
                request_id: id.clone(),
                recorded: SystemTime::now(),
                route,
                who: None,
                patient: None,
                status: status.as_u16(),
                returned: 0,
                documents: Vec::new(),
            };
            // A refusal discloses nothing: it is answered even when its record could not be delivered (counted).
            let _ = api.service.auditor().record(&record).await;
            with_request_id(count(route, error(status, denied.code, denied.message)), &id)
        }
    }
}

/// Who asked, as `authenticate` found.
#[derive(Clone)]
struct Caller {
    principal: Principal,
    request_id: String,
}

fn with_request_id(mut r: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        r.headers_mut().insert("x-request-id", v);
    }
    r
}

fn count(route: &str, r: Response) -> Response {
    metrics().api_requests.with_label_values(&[route, r.status().as_str()]).inc();
    r
}

/// Decodes a JSON body into `T`; the error names the path of the bad field, never its value.
/// A refused body: status, code, message.
type Refusal = (StatusCode, &'static str, String);

fn decode<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, Refusal> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")));
    if !json {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "send Content-Type: application/json".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let why = match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("body is not valid JSON (line {}, column {})", inner.line(), inner.column())
            }
            _ => {
                // serde's message for an unknown field names the field, not a value; for wrong types it may quote
                // the value, so only the expected shape is said.
                let m = inner.to_string();
                if m.starts_with("unknown field") {
                    m.split(", expected").next().unwrap_or("unknown field").replace(" at line", ";").to_string()
                } else if m.starts_with("missing field") {
                    m.split(" at line").next().unwrap_or("missing field").to_string()
                } else {
                    "wrong type or value".to_string()
                }
            }
        };
        let at = if path == "." || path.is_empty() { String::new() } else { format!("{path}: ") };
        (StatusCode::BAD_REQUEST, "bad_request", format!("{at}{why}"))
    })?;
    // One JSON object and nothing after it (white space aside): `{...} junk` or a second object is refused.
    de.end().map_err(|_| (StatusCode::BAD_REQUEST, "bad_request", "body holds data after the JSON object".into()))?;
    Ok(value)
}

/// A request naming (or not) the patient it is about.
trait Scoped {
    fn patient(&self) -> Option<&str>;
    /// Narrows a request that named no patient to this one.
    fn narrow(&mut self, patient: String);
}

impl Scoped for ContextRequest {
    fn patient(&self) -> Option<&str> {
        Some(&self.patient)
    }
    fn narrow(&mut self, patient: String) {
        self.patient = patient;
    }
}

impl Scoped for SearchRequest {
    fn patient(&self) -> Option<&str> {
        self.patient.as_deref()
    }
    fn narrow(&mut self, patient: String) {
        self.patient = Some(patient);
    }
}

/// The patient check: a request for a patient outside the caller's set is refused (the same answer whether the
/// patient exists or not, before anything is read); a search naming no patient is narrowed to the caller's one
/// patient, or refused when the caller may see several but not all.
/// The refusal is the 403's message.
fn check_patient<T: Scoped>(principal: &Principal, request: &mut T) -> Result<(), &'static str> {
    match (&principal.patients, request.patient()) {
        (Patients::All, _) => Ok(()),
        (allowed, Some(p)) if p.trim().is_empty() || allowed.permits(p) => Ok(()),
        (_, Some(_)) => Err("this caller may not query that patient"),
        (Patients::Only(set), None) if set.len() == 1 => {
            request.narrow(set.iter().next().cloned().unwrap_or_default());
            Ok(())
        }
        (Patients::Only(_), None) => Err("name a patient this caller may query (`patient`)"),
    }
}

/// Runs a request under the concurrency limit and the timeout, counting, timing and auditing it.
async fn answer<T, R, E, F, Fut>(
    api: &Api,
    route: &'static str,
    timeout: Duration,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    work: F,
) -> Response
where
    T: DeserializeOwned + Scoped,
    R: serde::Serialize + Returned + Timed,
    E: IntoResponse,
    F: FnOnce(Arc<Service>, T) -> Fut,
    Fut: std::future::Future<Output = Result<R, E>>,
{
    let clock = Instant::now();
    let mut record = AuditRecord {
        request_id: caller.request_id.clone(),
        recorded: SystemTime::now(),
        route,
        who: Some(caller.principal.who.clone()),
        patient: None,
        status: 0,
        returned: 0,
        documents: Vec::new(),
    };
    let response = async {
        let body = match body {
            Ok(b) => b,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("body larger than {} bytes (serve.max_body_bytes)", api.service.settings().max_body_bytes),
                );
            }
            Err(_) => return error(StatusCode::BAD_REQUEST, "bad_request", "the body could not be read"),
        };
        let mut request: T = match decode(&headers, &body) {
            Ok(r) => r,
            Err((status, code, message)) => return error(status, code, message),
        };
        if let Err(message) = check_patient(&caller.principal, &mut request) {
            record.patient = request.patient().filter(|p| !p.trim().is_empty()).map(patient_reference);
            metrics().api_denials.with_label_values(&["forbidden_patient"]).inc();
            return error(StatusCode::FORBIDDEN, "forbidden", message);
        }
        record.patient = request.patient().filter(|p| !p.trim().is_empty()).map(patient_reference);
        let work = async {
            let _permit = api.permits.acquire().await;
            work(api.service.clone(), request).await
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(r)) => {
                crate::http::set_store_reachable(true);
                (record.returned, record.documents) = r.returned();
                let mut response = json(StatusCode::OK, &r);
                let timing = server_timing(&r.stages(), clock.elapsed());
                response.headers_mut().insert(header::HeaderName::from_static("server-timing"), timing);
                response
            }
            Ok(Err(e)) => e.into_response(),
            Err(_) => error(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                format!(
                    "not answered within {} ms (serve.timeout_ms, + llm.timeout_ms for answers)",
                    timeout.as_millis()
                ),
            ),
        }
    }
    .await;
    record.status = response.status().as_u16();
    let response = match api.service.auditor().record(&record).await {
        Ok(()) => response,
        Err(e) if api.service.settings().audit.fail_closed => {
            tracing::warn!(error = %e, route, "A query-service request was refused: its audit record was not delivered.");
            error(StatusCode::SERVICE_UNAVAILABLE, "audit_unavailable", "the request could not be audited; retry later")
        }
        Err(e) => {
            tracing::warn!(error = %e, route, "A query-service request was answered without its audit record.");
            response
        }
    };
    metrics().api_duration.with_label_values(&[route]).observe(clock.elapsed().as_secs_f64());
    count(route, response)
}

async fn context(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let t = api.timeout;
    answer(
        &api,
        "context",
        t,
        caller,
        headers,
        body,
        |s, r: ContextRequest| async move { s.reader().context(&r).await },
    )
    .await
}

/// `POST /v1/answer`: the context, then one generation; its deadline adds `llm.timeout_ms` to `serve.timeout_ms`.
async fn generate(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let t = api.timeout + api.service.llm_timeout().unwrap_or_default();
    answer(&api, "answer", t, caller, headers, body, |s, r: ContextRequest| async move { s.answer(&r).await }).await
}

async fn search(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let t = api.timeout;
    answer(&api, "search", t, caller, headers, body, |s, r: SearchRequest| async move { s.reader().search(&r).await })
        .await
}

impl IntoResponse for AnswerError {
    fn into_response(self) -> Response {
        match self {
            AnswerError::Read(e) => e.into_response(),
            AnswerError::NotConfigured => error(
                StatusCode::NOT_IMPLEMENTED,
                "llm_not_configured",
                "no LLM is configured for answers (llm.base_url)",
            ),
            AnswerError::Llm(LlmError::Timeout) => {
                error(StatusCode::GATEWAY_TIMEOUT, "llm_timeout", "the LLM did not answer within llm.timeout_ms")
            }
            AnswerError::Llm(LlmError::Unavailable(why)) => {
                tracing::warn!(why, "An answer failed: the LLM endpoint is unavailable.");
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "llm_unavailable",
                    "the LLM endpoint is unavailable; retry later",
                )
            }
            AnswerError::Llm(LlmError::Failed(why)) => {
                tracing::warn!(why, "An answer failed at the LLM endpoint.");
                error(StatusCode::BAD_GATEWAY, "llm_failed", "the LLM endpoint failed")
            }
            AnswerError::Unusable(e) => {
                tracing::warn!(error = %e, "An answer failed: the LLM's answer was unusable.");
                error(StatusCode::BAD_GATEWAY, "llm_failed", "the LLM's answer was not the JSON asked for")
            }
        }
    }
}

/// Another method than POST on a `/v1` route: the documented error body, `Allow: POST`, and counted.
async fn method_not_allowed() -> Response {
    let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "use POST");
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
    count("other", r)
}

async fn not_found() -> Response {
    count(
        "other",
        error(StatusCode::NOT_FOUND, "not_found", "no such route (POST /v1/context, POST /v1/search, POST /v1/answer)"),
    )
}

/// The API routes with health and metrics.
pub fn router(service: Arc<Service>, readiness: Readiness) -> Router {
    let s = service.settings();
    let api = Api {
        permits: Arc::new(Semaphore::new(s.max_concurrent)),
        timeout: Duration::from_millis(s.timeout_ms),
        service: service.clone(),
    };
    let v1 = Router::new()
        .route("/v1/context", post(context).fallback(method_not_allowed))
        .route("/v1/search", post(search).fallback(method_not_allowed))
        .route("/v1/answer", post(generate).fallback(method_not_allowed))
        .layer(DefaultBodyLimit::max(s.max_body_bytes))
        .route_layer(middleware::from_fn_with_state(api.clone(), authenticate))
        .with_state(api);
    // Not ready before the identity provider's keys are loaded (tokens could not be checked).
    let readiness = match service.authenticator().verifier() {
        Some(v) => readiness.gated(v.ready_flag()),
        None => readiness,
    };
    crate::http::router(readiness).merge(v1).fallback(not_found)
}

/// Binds `addr` (fails loudly when it cannot) and serves the API in a background task until `shutdown`
/// resolves. Returns the bound address.
pub async fn serve(
    addr: &str,
    service: Arc<Service>,
    readiness: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = router(service, readiness);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %e, "The query service stopped.");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_reads_back_what_it_writes() {
        let stages = [("context", Duration::from_micros(14_210)), ("llm", Duration::from_millis(9_507))];
        let value = server_timing(&stages, Duration::from_micros(9_522_118));
        assert_eq!(value.to_str().unwrap(), "context;dur=14.210, llm;dur=9507.000, total;dur=9522.118");
        let read = parse_server_timing(value.to_str().unwrap());
        assert_eq!(read, [("context".into(), 14.21), ("llm".into(), 9507.0), ("total".into(), 9522.118)]);
        // Other parameters and metrics without a duration, as other servers and proxies write them.
        let read = parse_server_timing(r#"cache;desc="hit", db;desc=x;dur=3.5,  ,app;dur=bad, edge;dur=1"#);
        assert_eq!(read, [("db".into(), 3.5), ("edge".into(), 1.0)]);
    }

    #[test]
    fn bad_bodies_name_the_field_never_the_value() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let status_and_text = |(status, code, message): Refusal| {
            let body = futures_body(error(status, code, message));
            (status, body)
        };
        let (s, b) =
            status_and_text(decode::<ContextRequest>(&h, br#"{"patient": "p", "questoin": "SECRET"}"#).unwrap_err());
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(b.contains("questoin") && !b.contains("SECRET"), "{b}");
        let (_, b) = status_and_text(decode::<ContextRequest>(&h, br#"{"patient": "p", "question": 7}"#).unwrap_err());
        assert!(b.contains("question") && !b.contains('7'), "{b}");
        let (_, b) = status_and_text(decode::<ContextRequest>(&h, br#"{"patient": "p"}"#).unwrap_err());
        assert!(b.contains("missing field `question`"), "{b}");
        let (_, b) = status_and_text(decode::<ContextRequest>(&h, br#"{"patient": "SECRET", "#).unwrap_err());
        assert!(b.contains("not valid JSON") && !b.contains("SECRET"), "{b}");
        let (_, b) = status_and_text(
            decode::<ContextRequest>(&h, br#"{"patient": "p", "question": "q", "budget_tokens": -3}"#).unwrap_err(),
        );
        assert!(b.contains("budget_tokens") && !b.contains("-3"), "{b}");
        let ok: ContextRequest =
            decode(&h, br#"{"patient": "p", "question": "q", "sections": ["impression"]}"#).unwrap();
        assert_eq!(ok.sections, ["impression"]);
        let (s, _) = status_and_text(decode::<ContextRequest>(&HeaderMap::new(), b"{}").unwrap_err());
        assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }

    fn futures_body(r: Response) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            use http_body_util::BodyExt;
            let bytes = r.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(bytes.to_vec()).unwrap()
        })
    }
}
