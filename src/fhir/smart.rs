//! SMART Backend Services: access tokens by the client-credentials grant with a signed JWT assertion.
//!
//! In: `fhir.smart.*` (token endpoint, client id, a PKCS#8 PEM key, RS384 or ES384, optional `kid`, scopes).
//! Out: `Authorization: Bearer …` header values, cached until shortly before `expires_in` runs out; one request
//! at a time refreshes. The assertion: `iss` = `sub` = client id, `aud` = the token endpoint, `exp` 5 minutes
//! ahead (the most SMART allows), a unique `jti`. The endpoint refusing the client (400/401/403) is
//! `fhir_unauthorized`; an unreachable endpoint, 429 or 5xx is transient (the caller's backoff applies).
//! The key and tokens are never logged.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::header::{ACCEPT, CONTENT_TYPE};
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

use super::{FhirConfigError, HttpClient};
use crate::config::SmartSettings;
use crate::error::{DocError, ErrorCode, Stage};
use crate::telemetry::metrics::metrics;

/// Why no token came back.
pub enum TokenError {
    /// Unreachable, timed out, 429 or 5xx: retry.
    Transient(String),
    /// The endpoint refused the client: a configuration error.
    Refused(DocError),
}

struct Cached {
    value: HeaderValue,
    until: Instant,
}

/// Issues and caches access tokens.
pub struct TokenSource {
    client: HttpClient,
    token_url: Uri,
    client_id: String,
    key: EncodingKey,
    header: Header,
    scope: String,
    timeout: Duration,
    cached: Mutex<Option<Cached>>,
    refresh: tokio::sync::Mutex<()>,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    exp: u64,
    iat: u64,
    jti: String,
}

#[derive(serde::Deserialize)]
struct TokenResponse {
    access_token: String,
    expires_in: Option<u64>,
}

impl TokenSource {
    /// Reads and checks the key (at start-up: a bad key is a configuration error, not a halt mid-stream).
    pub fn new(s: &SmartSettings, client: HttpClient, timeout: Duration) -> Result<Self, FhirConfigError> {
        let pem = std::fs::read(&s.key_file)
            .map_err(|e| FhirConfigError(format!("fhir.smart.key_file: cannot read ({})", e.kind())))?;
        let (algorithm, key) = match s.algorithm.as_str() {
            "RS384" => (Algorithm::RS384, EncodingKey::from_rsa_pem(&pem)),
            "ES384" => (Algorithm::ES384, EncodingKey::from_ec_pem(&pem)),
            _ => return Err(FhirConfigError("fhir.smart.algorithm: must be RS384 or ES384".into())),
        };
        let key = key.map_err(|_| {
            FhirConfigError(format!("fhir.smart.key_file: not a PEM private key for {} (PKCS#8)", s.algorithm))
        })?;
        let mut header = Header::new(algorithm);
        header.typ = Some("JWT".into());
        header.kid = Some(s.key_id.clone()).filter(|k| !k.is_empty());
        let token_url =
            Uri::try_from(s.token_url.trim()).map_err(|_| FhirConfigError("fhir.smart.token_url: not a URL".into()))?;
        let source = Self {
            client,
            token_url,
            client_id: s.client_id.clone(),
            key,
            header,
            scope: s.scope.clone(),
            timeout,
            cached: Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
        };
        // Sign once now, so a key that does not fit the algorithm stops the worker at start-up.
        source.assertion().map_err(|_| {
            FhirConfigError(format!("fhir.smart.key_file: the key cannot sign {} assertions", s.algorithm))
        })?;
        Ok(source)
    }

    /// A valid access token (from the cache, or a new one).
    pub async fn token(&self) -> Result<HeaderValue, TokenError> {
        if let Some(v) = self.cached_value() {
            return Ok(v);
        }
        let _one_at_a_time = self.refresh.lock().await;
        if let Some(v) = self.cached_value() {
            return Ok(v);
        }
        let (value, lifetime) = match tokio::time::timeout(self.timeout, self.request()).await {
            Ok(r) => r?,
            Err(_) => return Err(TokenError::Transient("the token endpoint timed out".into())),
        };
        metrics().fhir_fetches.with_label_values(&["token"]).inc();
        // Renew a little before the server's expiry (clock skew, requests in flight).
        let margin = (lifetime / 10).min(Duration::from_secs(30));
        *self.cached.lock().expect("token cache") =
            Some(Cached { value: value.clone(), until: Instant::now() + lifetime - margin });
        Ok(value)
    }

    /// Forgets the cached token (the FHIR server answered 401 with it).
    pub fn invalidate(&self) {
        *self.cached.lock().expect("token cache") = None;
    }

    fn cached_value(&self) -> Option<HeaderValue> {
        let cached = self.cached.lock().expect("token cache");
        cached.as_ref().filter(|c| Instant::now() < c.until).map(|c| c.value.clone())
    }

    fn assertion(&self) -> Result<String, jsonwebtoken::errors::Error> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let seed = format!("{}:{}:{}:{n}", std::process::id(), now.as_nanos(), self.client_id);
        let jti = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, seed.as_bytes()).to_string();
        let aud = self.token_url.to_string();
        let claims = Claims {
            iss: &self.client_id,
            sub: &self.client_id,
            aud: &aud,
            exp: now.as_secs() + 300,
            iat: now.as_secs(),
            jti,
        };
        jsonwebtoken::encode(&self.header, &claims, &self.key)
    }

    async fn request(&self) -> Result<(HeaderValue, Duration), TokenError> {
        let refused = |why: String| TokenError::Refused(DocError::new(ErrorCode::FhirUnauthorized, Stage::Fetch, why));
        let assertion = self.assertion().map_err(|_| refused("the SMART assertion could not be signed".into()))?;
        let body = form(&[
            ("grant_type", "client_credentials"),
            ("scope", &self.scope),
            ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
            ("client_assertion", &assertion),
        ]);
        let request = Request::post(self.token_url.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a POST request builds");
        let response = self
            .client
            .request(request)
            .await
            .map_err(|_| TokenError::Transient("the token endpoint could not be reached".into()))?;
        let status = response.status();
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(TokenError::Transient(format!("the token endpoint answered {}", status.as_u16())));
        }
        if !status.is_success() {
            return Err(refused(format!(
                "the SMART token endpoint refused the client with {} (check fhir.smart.client_id, key_file, \
                 algorithm, key_id, scope)",
                status.as_u16()
            )));
        }
        let body = Limited::new(response.into_body(), 256 * 1024)
            .collect()
            .await
            .map_err(|_| TokenError::Transient("the token response could not be read".into()))?
            .to_bytes();
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| refused("the token endpoint's answer has no access_token".into()))?;
        let mut value = HeaderValue::try_from(format!("Bearer {}", parsed.access_token))
            .map_err(|_| refused("the access token is not a valid header value".into()))?;
        value.set_sensitive(true);
        Ok((value, Duration::from_secs(parsed.expires_in.unwrap_or(300).max(1))))
    }
}

/// `application/x-www-form-urlencoded`.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| {
        let mut out = String::with_capacity(s.len());
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    };
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_encoding() {
        assert_eq!(form(&[("a b", "x/y:z"), ("s", "system/Binary.read")]), "a%20b=x%2Fy%3Az&s=system%2FBinary.read");
    }
}
