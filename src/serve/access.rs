//! Who is asking, and which patients they may ask about: the query service's authentication and access by patient.
//!
//! In: the `Authorization` header and `serve.auth`, `serve.api_keys`, `serve.oidc.*`. Out: a `Principal` (who,
//! for the audit trail; which patients, for every request) or a `Denied` (401, or 503 while the identity
//! provider's keys cannot be had).
//!
//! * A static key (`name:key` in `serve.api_keys`, compared in constant time) is a service account: every patient.
//! * A JWT from the identity provider (`oidc::Verifier`): SMART scopes decide. A `patient/…` read scope gives the
//!   patient named by the `serve.oidc.patient_claim` claim (SMART's launch context); `serve.oidc.patients_claim`
//!   gives a list (a care team's); `user/…` and `system/…` read scopes give every patient when
//!   `serve.oidc.allow_all_patients` is on, nothing otherwise. A read scope is `*.read`, `*.rs`,
//!   `DocumentReference.read` or `.rs`/`.r` (SMART v1 and v2). Anything else gives no patient: every request 403.
//! * `serve.auth = false`: an anonymous caller with every patient (a trusted network only).
//! * The CLI (`clinstream context`, `search`) runs as the local operator, every patient.
//!
//! A request for a patient outside the caller's set gets the same 403 whether or not the patient exists, decided
//! before anything is read. Nothing here logs a token, a key or a claim's value.

use std::collections::BTreeSet;
use std::sync::Arc;

use subtle::{Choice, ConstantTimeEq};

use super::oidc::{Claims, TokenError, Verifier};
use crate::config::ServeSettings;
use crate::query::reader::patient_reference;

/// Who made a request (recorded in the audit trail; never a key or a token).
#[derive(Debug, Clone, PartialEq)]
pub enum Who {
    /// A static key, by its configured name.
    Key { name: String },
    /// An identity provider's token: its subject and client.
    Token { issuer: String, subject: Option<String>, client_id: Option<String> },
    /// `serve.auth = false`.
    Anonymous,
    /// The command line, as the operating-system user running it.
    Operator { user: String },
}

/// The patients a caller may query.
#[derive(Debug, Clone, PartialEq)]
pub enum Patients {
    All,
    /// These references (`Patient/123`); empty = none.
    Only(BTreeSet<String>),
}

impl Patients {
    /// Whether `patient` (`Patient/123` or `123`) is within the set.
    pub fn permits(&self, patient: &str) -> bool {
        match self {
            Patients::All => true,
            Patients::Only(set) => set.contains(&patient_reference(patient)),
        }
    }
}

/// A caller the service has identified.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    pub who: Who,
    pub patients: Patients,
}

impl Principal {
    /// The command line's caller: every patient, recorded as the operating-system user.
    pub fn operator() -> Principal {
        let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
        Principal { who: Who::Operator { user }, patients: Patients::All }
    }
}

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq)]
pub struct Denied {
    /// 401 or 503.
    pub status: u16,
    pub code: &'static str,
    pub message: &'static str,
    /// The reason label of `clinstream_api_denials_total`.
    pub reason: &'static str,
}

impl Denied {
    fn unauthorized(message: &'static str, reason: &'static str) -> Denied {
        Denied { status: 401, code: "unauthorized", message, reason }
    }
}

impl From<TokenError> for Denied {
    fn from(e: TokenError) -> Denied {
        let reason = e.reason();
        match e {
            TokenError::Invalid(m) => Denied::unauthorized(m, reason),
            TokenError::Expired => Denied::unauthorized("the token has expired", reason),
            TokenError::Unavailable(m) => Denied { status: 503, code: "auth_unavailable", message: m, reason },
        }
    }
}

/// Identifies callers from their `Authorization` header.
#[derive(Debug)]
pub struct Authenticator {
    on: bool,
    keys: Vec<(String, String)>,
    verifier: Option<Arc<Verifier>>,
    patient_claim: String,
    patients_claim: String,
    allow_all: bool,
}

impl Authenticator {
    /// From `serve.*`; starts loading the identity provider's keys when one is configured (needs a Tokio runtime).
    pub fn new(s: &ServeSettings) -> Result<Authenticator, String> {
        s.check_auth()?;
        let verifier = if s.auth && s.oidc_enabled() { Some(Verifier::start(&s.oidc)?) } else { None };
        Ok(Authenticator {
            on: s.auth,
            keys: s.keys(),
            verifier,
            patient_claim: s.oidc.patient_claim.trim().to_string(),
            patients_claim: s.oidc.patients_claim.trim().to_string(),
            allow_all: s.oidc.allow_all_patients,
        })
    }

    /// The identity provider's verifier, when tokens are accepted.
    pub fn verifier(&self) -> Option<&Arc<Verifier>> {
        self.verifier.as_ref()
    }

    /// Identifies the caller of a request from its `Authorization` header value.
    pub async fn identify(&self, authorization: Option<&str>) -> Result<Principal, Denied> {
        if !self.on {
            return Ok(Principal { who: Who::Anonymous, patients: Patients::All });
        }
        let given = authorization
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or(Denied::unauthorized("send `Authorization: Bearer <key or token>`", "no_credentials"))?;
        if let Some(name) = key_name(given, &self.keys) {
            return Ok(Principal { who: Who::Key { name }, patients: Patients::All });
        }
        match &self.verifier {
            // A JWT has three dot-separated parts; anything else was meant as a key.
            Some(v) if given.split('.').count() == 3 => {
                let claims = v.verify(given).await?;
                Ok(self.principal(v, claims))
            }
            _ => Err(Denied::unauthorized("unknown API key", "unknown_key")),
        }
    }

    fn principal(&self, v: &Verifier, claims: Claims) -> Principal {
        let mut patients = BTreeSet::new();
        let mut all = false;
        for scope in claims.scopes() {
            let Some((context, rest)) = scope.split_once('/') else { continue };
            if !reads_notes(rest) {
                continue;
            }
            match context {
                "patient" => {
                    if let Some(p) = claims.other.get(&self.patient_claim).and_then(|p| p.as_str())
                        && !p.trim().is_empty()
                    {
                        patients.insert(patient_reference(p));
                    }
                }
                "user" | "system" if self.allow_all => all = true,
                _ => {}
            }
        }
        if !self.patients_claim.is_empty() {
            let listed = match claims.other.get(&self.patients_claim) {
                Some(serde_json::Value::Array(a)) => a.iter().filter_map(|p| p.as_str()).map(str::to_string).collect(),
                Some(serde_json::Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
                _ => Vec::new(),
            };
            patients.extend(listed.iter().filter(|p| !p.trim().is_empty()).map(|p| patient_reference(p)));
        }
        let who = Who::Token { issuer: v.issuer().to_string(), subject: claims.sub, client_id: claims.client_id };
        Principal { who, patients: if all { Patients::All } else { Patients::Only(patients) } }
    }
}

/// Whether a scope's resource part (after `patient/`, `user/`, `system/`) reads notes: `*` or `DocumentReference`,
/// with `read` (SMART v1) or a v2 permission string holding `r` or `s`.
fn reads_notes(rest: &str) -> bool {
    let Some((resource, permission)) = rest.split_once('.') else { return false };
    if !matches!(resource, "*" | "DocumentReference") {
        return false;
    }
    permission == "read"
        || permission == "*"
        || (!permission.is_empty()
            && permission.chars().all(|c| "cruds".contains(c))
            && permission.chars().any(|c| c == 'r' || c == 's'))
}

/// The name of the key `given` is, compared in constant time against every key (the time taken says nothing of
/// how much of a key was right, nor which key it was).
fn key_name(given: &str, keys: &[(String, String)]) -> Option<String> {
    let mut found: Option<&str> = None;
    for (name, key) in keys {
        let hit: Choice = key.as_bytes().ct_eq(given.as_bytes());
        if bool::from(hit) && found.is_none() {
            found = Some(name);
        }
    }
    found.map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(keys: &str) -> ServeSettings {
        let mut s = crate::config::Settings::load_from(None, Some(Default::default())).unwrap().serve;
        s.api_keys = crate::config::Secret::new(keys);
        s
    }

    #[test]
    fn keys_match_exactly_and_are_known_by_name() {
        let s = settings("alpha, ops:beta-key");
        let keys = s.keys();
        assert_eq!(key_name("alpha", &keys).as_deref(), Some("key-1"));
        assert_eq!(key_name("beta-key", &keys).as_deref(), Some("ops"));
        for miss in ["alph", "alphaa", "", "ops:beta-key", "ops"] {
            assert_eq!(key_name(miss, &keys), None, "{miss}");
        }
        assert_eq!(key_name("alpha", &[]), None);
    }

    #[test]
    fn read_scopes_of_smart_v1_and_v2() {
        for yes in ["*.read", "DocumentReference.read", "*.rs", "DocumentReference.r", "*.cruds", "*.*"] {
            assert!(reads_notes(yes), "{yes}");
        }
        for no in ["Observation.read", "*.write", "*.c", "*.cud", "DocumentReference", "*.", "*.rx"] {
            assert!(!reads_notes(no), "{no}");
        }
    }

    #[test]
    fn patients_are_compared_as_references() {
        let only = Patients::Only(["Patient/p1".to_string()].into());
        assert!(only.permits("p1") && only.permits("Patient/p1") && only.permits(" p1 "));
        assert!(!only.permits("p2") && !only.permits("Patient/p10") && !only.permits("Group/p1"));
        assert!(!Patients::Only(BTreeSet::new()).permits("p1"));
        assert!(Patients::All.permits("anyone"));
    }

    #[tokio::test]
    async fn keys_and_auth_off() {
        let a = Authenticator::new(&settings("ops:k1")).unwrap();
        let p = a.identify(Some("Bearer k1")).await.unwrap();
        assert_eq!(p, Principal { who: Who::Key { name: "ops".into() }, patients: Patients::All });
        assert_eq!(a.identify(Some("Bearer k2")).await.unwrap_err().status, 401);
        assert_eq!(a.identify(None).await.unwrap_err().reason, "no_credentials");
        assert_eq!(a.identify(Some("Basic k1")).await.unwrap_err().status, 401);
        // Without an identity provider, a JWT-shaped credential is just an unknown key.
        assert_eq!(a.identify(Some("Bearer a.b.c")).await.unwrap_err().reason, "unknown_key");
        let mut off = settings("");
        off.auth = false;
        let a = Authenticator::new(&off).unwrap();
        assert_eq!(a.identify(None).await.unwrap().who, Who::Anonymous);
    }

    #[test]
    fn misconfiguration_is_refused_before_serving() {
        assert!(Authenticator::new(&settings("")).is_err(), "auth on, no key, no provider");
        let mut s = settings("");
        s.oidc.issuer = "http://127.0.0.1:1".into();
        assert!(s.check_auth().unwrap_err().contains("audience"), "an issuer without an audience");
        s.oidc.audience = "clinstream".into();
        s.oidc.algorithms = vec!["HS256".into()];
        assert!(s.check_auth().unwrap_err().contains("HS256"));
        s.oidc.algorithms = vec!["RS256".into()];
        assert!(s.check_auth().is_ok());
        s.oidc.issuer = "not a url".into();
        assert!(s.check_auth().is_err());
    }
}
