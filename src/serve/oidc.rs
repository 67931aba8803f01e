//! Bearer JWT access tokens from an OpenID Connect / OAuth 2.0 provider, checked against its published keys.
//!
//! In: `serve.oidc.*` (issuer, audience, accepted algorithms, clock skew) and a token. Out: the token's claims
//! (`Claims`), or why it was refused (`TokenError`: a 401, or a 503 while the provider's keys cannot be had).
//!
//! Keys: the JWK Set at the issuer's discovered `jwks_uri` (`{issuer}/.well-known/openid-configuration`) or at
//! `serve.oidc.jwks_url`, loaded in the background from start-up (retried with backoff; until then `ready()` is
//! false, `/readyz` says 503 and tokens get 503, never a pass) and fetched again when a token names a `kid` the
//! set does not hold (a key rotation at the provider), at most once per `refresh_min_interval_ms`. A provider that
//! goes down keeps the keys already known working.
//!
//! Checks: the header's `alg` is one of `serve.oidc.algorithms` (asymmetric only: `none` does not parse and HMAC
//! is never accepted, so a public key cannot be used as an HMAC secret), the key named by `kid` is a signing key of
//! the same family (and of the same `alg` when the JWK names one), the signature, `iss` = the issuer, `aud` holds
//! the audience, `exp` required and `nbf` honoured with `clock_skew_s`. Tokens and claims are never logged.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::{Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::backoff::Backoff;
use crate::config::OidcSettings;
use crate::fhir::HttpClient;

/// The largest discovery document or key set read.
const MAX_DOCUMENT: usize = 1 << 20;

/// An accepted signature algorithm by name: asymmetric ones only (`config::OIDC_ALGORITHMS`).
pub fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name.trim() {
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

/// What the service reads from a valid token.
#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    #[serde(default)]
    pub sub: Option<String>,
    /// The OAuth client (`client_id`; `azp` as some providers name it).
    #[serde(default, alias = "azp")]
    pub client_id: Option<String>,
    /// Space-separated scopes (`scope`), or a list (`scp`, as Entra ID and Okta write them).
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub scp: Option<ScopeList>,
    /// Every other claim (the patient and patient-list claims are read from here by name).
    #[serde(flatten)]
    pub other: HashMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ScopeList {
    One(String),
    Many(Vec<String>),
}

impl Claims {
    /// Every scope the token carries.
    pub fn scopes(&self) -> Vec<String> {
        let mut all: Vec<String> = self.scope.iter().flat_map(|s| s.split_whitespace()).map(str::to_string).collect();
        match &self.scp {
            Some(ScopeList::One(s)) => all.extend(s.split_whitespace().map(str::to_string)),
            Some(ScopeList::Many(v)) => all.extend(v.iter().cloned()),
            None => {}
        }
        all
    }
}

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenError {
    /// 401: the token is malformed, expired, for another audience or issuer, badly signed, or names no known key.
    #[error("{0}")]
    Invalid(&'static str),
    /// 401: the token was valid until its `exp` (plus the clock skew).
    #[error("the token has expired")]
    Expired,
    /// 503: the provider's keys could not be had (not loaded yet, or an unknown `kid` while the provider is down).
    #[error("{0}")]
    Unavailable(&'static str),
}

impl TokenError {
    /// The reason label of `clinstream_api_denials_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            TokenError::Expired => "token_expired",
            TokenError::Invalid(_) => "token_invalid",
            TokenError::Unavailable(_) => "auth_unavailable",
        }
    }
}

struct Key {
    key: DecodingKey,
    family: Family,
    alg: Option<Algorithm>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Family {
    Rsa,
    Ec,
    Ed,
}

fn family(a: Algorithm) -> Option<Family> {
    match a {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Some(Family::Rsa),
        Algorithm::ES256 | Algorithm::ES384 => Some(Family::Ec),
        Algorithm::EdDSA => Some(Family::Ed),
        _ => None,
    }
}

/// The signing keys of a JWK Set by `kid` (keys without `kid`, encryption keys and symmetric keys are left out).
fn keys_of(set: &JwkSet) -> HashMap<String, Key> {
    let mut out = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = jwk.common.key_id.clone() else { continue };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let family = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Family::Rsa,
            AlgorithmParameters::EllipticCurve(_) => Family::Ec,
            AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
            AlgorithmParameters::OctetKey(_) => continue,
        };
        let alg = jwk.common.key_algorithm.and_then(|a| match a {
            KeyAlgorithm::RS256 => Some(Algorithm::RS256),
            KeyAlgorithm::RS384 => Some(Algorithm::RS384),
            KeyAlgorithm::RS512 => Some(Algorithm::RS512),
            KeyAlgorithm::PS256 => Some(Algorithm::PS256),
            KeyAlgorithm::PS384 => Some(Algorithm::PS384),
            KeyAlgorithm::PS512 => Some(Algorithm::PS512),
            KeyAlgorithm::ES256 => Some(Algorithm::ES256),
            KeyAlgorithm::ES384 => Some(Algorithm::ES384),
            KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
            _ => None,
        });
        if let Ok(key) = DecodingKey::from_jwk(jwk) {
            out.insert(kid, Key { key, family, alg });
        }
    }
    out
}

/// The provider's keys and the rules tokens are checked by.
pub struct Verifier {
    settings: OidcSettings,
    issuer: String,
    client: HttpClient,
    keys: std::sync::RwLock<Arc<HashMap<String, Key>>>,
    /// One fetch at a time; the time of the last one (successful or not).
    fetching: Mutex<Option<Instant>>,
    ready: Arc<AtomicBool>,
    algorithms: Vec<Algorithm>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier").field("ready", &self.ready()).finish_non_exhaustive()
    }
}

impl Verifier {
    /// Builds the verifier and starts loading the provider's keys in the background (needs a Tokio runtime).
    pub fn start(settings: &OidcSettings) -> Result<Arc<Verifier>, String> {
        let client = crate::fhir::http_client().map_err(|e| format!("serve.oidc: {e}"))?;
        let algorithms = settings.algorithms.iter().filter_map(|a| algorithm(a)).collect();
        let v = Arc::new(Verifier {
            issuer: settings.issuer.trim().to_string(),
            settings: settings.clone(),
            client,
            keys: Default::default(),
            fetching: Mutex::new(None),
            ready: Arc::new(AtomicBool::new(false)),
            algorithms,
        });
        // Held weakly: a verifier dropped before the provider ever answered stops its loader.
        let me = Arc::downgrade(&v);
        tokio::spawn(async move {
            let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10), Duration::MAX);
            loop {
                let Some(v) = me.upgrade() else { break };
                match v.refresh().await {
                    Ok(()) => {
                        tracing::info!("The identity provider's signing keys are loaded.");
                        break;
                    }
                    Err(why) => {
                        tracing::warn!(why, "The identity provider's signing keys could not be loaded; retrying.");
                        drop(v);
                        tokio::time::sleep(backoff.failed().unwrap_or(Duration::from_secs(10))).await;
                    }
                }
            }
        });
        Ok(v)
    }

    /// The issuer tokens must come from.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Whether the keys have been loaded once (the service is not ready before).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The flag `ready()` reads, for `/readyz`.
    pub fn ready_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ready)
    }

    /// Checks a token; the claims when it is valid.
    pub async fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Invalid("the token is malformed"))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(TokenError::Invalid("the token's signature algorithm is not accepted"));
        }
        if !self.ready() {
            return Err(TokenError::Unavailable("the identity provider's keys are not loaded yet"));
        }
        let kid = header.kid.ok_or(TokenError::Invalid("the token names no key (kid)"))?;
        let mut keys = self.current();
        if !keys.contains_key(&kid) {
            self.refresh_for_unknown_kid().await?;
            keys = self.current();
        }
        let key = keys.get(&kid).ok_or(TokenError::Invalid("the token's key (kid) is not the provider's"))?;
        if Some(key.family) != family(header.alg) || key.alg.is_some_and(|a| a != header.alg) {
            return Err(TokenError::Invalid("the token's algorithm does not match its key"));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[self.settings.audience.trim()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = self.settings.clock_skew_s;
        validation.validate_nbf = true;
        jsonwebtoken::decode::<Claims>(token, &key.key, &validation).map(|d| d.claims).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            TokenError::Invalid(match e.kind() {
                K::ExpiredSignature => return TokenError::Expired,
                K::ImmatureSignature => "the token is not valid yet (nbf)",
                K::InvalidAudience => "the token is for another audience",
                K::InvalidIssuer => "the token is from another issuer",
                K::InvalidSignature => "the token's signature does not verify",
                K::MissingRequiredClaim(_) => "the token lacks a required claim (exp, iss, aud)",
                _ => "the token is not valid",
            })
        })
    }

    fn current(&self) -> Arc<HashMap<String, Key>> {
        Arc::clone(&self.keys.read().expect("key set"))
    }

    /// A fetch for a token naming an unknown key: at most one per `refresh_min_interval_ms`, one at a time (tokens
    /// arriving meanwhile wait for it and then look again).
    async fn refresh_for_unknown_kid(&self) -> Result<(), TokenError> {
        let min = Duration::from_millis(self.settings.refresh_min_interval_ms);
        let mut last = self.fetching.lock().await;
        if last.is_some_and(|t| t.elapsed() < min) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let result = self.fetch().await;
        match result {
            Ok(keys) => {
                *self.keys.write().expect("key set") = Arc::new(keys);
                Ok(())
            }
            Err(why) => {
                tracing::warn!(why, "The identity provider's keys could not be fetched again.");
                Err(TokenError::Unavailable("the identity provider cannot be reached to fetch its keys"))
            }
        }
    }

    /// The first load (start-up), marking the verifier ready.
    async fn refresh(&self) -> Result<(), String> {
        let mut last = self.fetching.lock().await;
        *last = Some(Instant::now());
        let keys = self.fetch().await?;
        if keys.is_empty() {
            return Err("the provider's key set holds no signing key with a kid".into());
        }
        *self.keys.write().expect("key set") = Arc::new(keys);
        self.ready.store(true, Ordering::SeqCst);
        Ok(())
    }

    async fn fetch(&self) -> Result<HashMap<String, Key>, String> {
        let jwks_url = if self.settings.jwks_url.trim().is_empty() {
            let discovery = format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'));
            let doc: serde_json::Value = self.get_json(&discovery).await?;
            if doc.get("issuer").and_then(|i| i.as_str()) != Some(self.issuer.as_str()) {
                return Err("the discovery document names another issuer".into());
            }
            doc.get("jwks_uri").and_then(|u| u.as_str()).ok_or("the discovery document has no jwks_uri")?.to_string()
        } else {
            self.settings.jwks_url.trim().to_string()
        };
        let set: JwkSet = self.get_json(&jwks_url).await?;
        Ok(keys_of(&set))
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let uri = Uri::try_from(url).map_err(|_| "not a URL".to_string())?;
        let request = Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|_| "the request could not be built".to_string())?;
        let timeout = Duration::from_millis(self.settings.timeout_ms);
        let response = tokio::time::timeout(timeout, self.client.request(request))
            .await
            .map_err(|_| "the provider did not answer in time".to_string())?
            .map_err(|_| "the provider could not be reached".to_string())?;
        if !response.status().is_success() {
            return Err(format!("the provider answered {}", response.status().as_u16()));
        }
        let body = tokio::time::timeout(timeout, Limited::new(response.into_body(), MAX_DOCUMENT).collect())
            .await
            .map_err(|_| "the provider did not answer in time".to_string())?
            .map_err(|_| "the provider's answer could not be read".to_string())?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|_| "the provider's answer is not the expected JSON".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_names_are_exactly_the_accepted_algorithms() {
        for a in crate::config::OIDC_ALGORITHMS {
            assert!(algorithm(a).is_some(), "{a}");
        }
    }

    #[test]
    fn only_asymmetric_algorithms_are_accepted() {
        for a in ["RS256", "ES256", "PS512", "EdDSA"] {
            assert!(algorithm(a).is_some(), "{a}");
        }
        for a in ["HS256", "HS512", "none", "rs256", ""] {
            assert!(algorithm(a).is_none(), "{a}");
        }
    }

    #[test]
    fn key_sets_keep_signing_keys_with_ids_only() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r1", "use": "sig", "alg": "RS256", "e": "AQAB",
             "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"},
            {"kty": "EC", "kid": "e1", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "oct", "kid": "h1", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "e": "AQAB",
             "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"},
            {"kty": "EC", "crv": "P-256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
        ]}))
        .unwrap();
        let keys = keys_of(&set);
        let mut ids: Vec<&str> = keys.keys().map(String::as_str).collect();
        ids.sort();
        assert_eq!(ids, ["e1", "r1"], "no symmetric key, no encryption key, no key without an id");
        assert_eq!(keys["r1"].family, Family::Rsa);
        assert_eq!(keys["r1"].alg, Some(Algorithm::RS256));
        assert_eq!(keys["e1"].family, Family::Ec);
    }

    #[test]
    fn scopes_come_from_scope_or_scp() {
        let c: Claims =
            serde_json::from_value(serde_json::json!({"scope": "patient/*.read openid", "patient": "p1"})).unwrap();
        assert_eq!(c.scopes(), ["patient/*.read", "openid"]);
        assert_eq!(c.other["patient"], "p1");
        let c: Claims = serde_json::from_value(serde_json::json!({"scp": ["user/*.read"], "azp": "app"})).unwrap();
        assert_eq!(c.scopes(), ["user/*.read"]);
        assert_eq!(c.client_id.as_deref(), Some("app"));
    }

    #[test]
    fn expiry_has_its_own_reason() {
        assert_eq!(TokenError::Expired.reason(), "token_expired");
        assert_eq!(TokenError::Invalid("the token is for another audience").reason(), "token_invalid");
        assert_eq!(TokenError::Unavailable("x").reason(), "auth_unavailable");
    }
}
