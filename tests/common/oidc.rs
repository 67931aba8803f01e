//! A real OpenID provider for the tests: npm `oidc-provider` (installed by `make tools` into .tools/oidc) run by
//! `tools/oidc/provider.mjs` on loopback, and a client for its token endpoint. Tokens come from the provider;
//! the tests only ask for them (client-credentials grant) and, for the refusal cases, alter what it minted.
//!
//! Without Node or the package the tests say SKIPPED — unless `CLINSTREAM_REQUIRE_OIDC=1` (set by `make test`),
//! where that is a failure.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn modules() -> PathBuf {
    root().join(".tools/oidc/node_modules")
}

/// Whether the provider can be run here (Node and the package); a failure under `CLINSTREAM_REQUIRE_OIDC=1`.
pub fn available() -> bool {
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let package = modules().join("oidc-provider/package.json").is_file();
    if node && package {
        return true;
    }
    assert!(
        std::env::var("CLINSTREAM_REQUIRE_OIDC").as_deref() != Ok("1"),
        "no OpenID provider: run `make tools` (Node and npm oidc-provider in .tools/oidc)"
    );
    eprintln!("SKIPPED: no OpenID provider (run `make tools`: Node and npm oidc-provider in .tools/oidc)");
    false
}

/// One provider process.
pub struct Provider {
    child: Child,
    pub issuer: String,
    pub port: u16,
}

impl Provider {
    /// Starts a provider signing with the keys in `keys` (made there when the file does not exist) on `port` (0 =
    /// any free port, read back from what the provider prints once it listens).
    pub fn start(keys: &Path, port: u16, patient: &str) -> Provider {
        let mut child = Command::new("node")
            .arg(root().join("tools/oidc/provider.mjs"))
            .args(["--modules", &modules().display().to_string()])
            .args(["--keys", &keys.display().to_string()])
            .args(["--port", &port.to_string(), "--patient", patient])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("the provider did not start: {line:?}"));
        let issuer = v["issuer"].as_str().unwrap().to_string();
        let port = issuer.rsplit(':').next().unwrap().parse().unwrap();
        Provider { child, issuer, port }
    }

    /// An access token for `client` (secret: the id + `-secret`) with `scope`, for `resource` (None = the default,
    /// audience `clinstream`, RS256).
    pub fn token(&self, client: &str, scope: &str, resource: Option<&str>) -> String {
        let mut form = format!("grant_type=client_credentials&scope={}", scope.replace('/', "%2F").replace('*', "%2A"));
        if let Some(r) = resource {
            form.push_str(&format!("&resource={}", r.replace(':', "%3A")));
        }
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{client}:{client}-secret"));
        let (status, body) = post(
            self.port,
            "/token",
            &[("Authorization", &format!("Basic {basic}")), ("Content-Type", "application/x-www-form-urlencoded")],
            &form,
        );
        assert_eq!(status, 200, "token for {client}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["access_token"].as_str().unwrap().to_string()
    }

    /// A new signing key at the provider (the old one stays published); returns its `kid`.
    pub fn rotate(&self) -> String {
        let (status, body) = post(self.port, "/_test/rotate", &[], "");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["kid"].as_str().unwrap().to_string()
    }

    /// The provider's published key set.
    pub fn jwks(&self) -> Value {
        let (status, body) = get(self.port, "/jwks");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A token's header and claims, decoded (no check).
pub fn parts(token: &str) -> (Value, Value) {
    let mut it = token.split('.');
    let mut next = || {
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(it.next().unwrap()).unwrap();
        serde_json::from_slice::<Value>(&b).unwrap()
    };
    let header = next();
    (header, next())
}

/// A token with this header and claims and the given signature part (base64url, as written).
pub fn assemble(header: &Value, claims: &Value, signature: &str) -> String {
    let e = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
    format!("{}.{}.{signature}", e(header), e(claims))
}

/// The signature part of a token.
pub fn signature(token: &str) -> &str {
    token.rsplit('.').next().unwrap()
}

fn exchange(port: u16, head: &str, body: &str) -> (u16, String) {
    super::http_exchange(port, head, body, Duration::from_secs(30)).unwrap_or((0, String::new()))
}

fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    exchange(port, &head, body)
}

fn get(port: u16, path: &str) -> (u16, String) {
    exchange(port, &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"), "")
}
