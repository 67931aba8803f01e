//! A real Qdrant server for the tests: `../shared/tools/qdrant/qdrant-server` (Qdrant built from its public
//! source; `CLINSTREAM_QDRANT_SERVER` names another binary) started per test on free loopback ports with
//! temporary storage, stopped with SIGTERM when dropped. `QDRANT_URL` (+ `QDRANT_API_KEY`) points the tests at an
//! external server or cluster instead; then nothing is started and each test uses its own collection.
//!
//! `make test` sets `CLINSTREAM_REQUIRE_QDRANT=1`: a missing server binary fails the test there. Elsewhere the
//! server tests say SKIPPED loudly and return.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A running server (or an external one).
pub struct QdrantServer {
    /// gRPC URL for `store.url` (`http://127.0.0.1:PORT`).
    pub url: String,
    pub http_port: u16,
    pub grpc_port: u16,
    pub api_key: String,
    child: Option<Child>,
    storage: Option<tempfile::TempDir>,
    binary: Option<PathBuf>,
    extra: Vec<(String, String)>,
}

fn server_binary() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CLINSTREAM_QDRANT_SERVER") {
        return Some(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/qdrant/qdrant-server");
    p.is_file().then_some(p)
}

/// A collection name no other test (or run) uses.
pub fn unique_collection(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("clinstream_{tag}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

impl QdrantServer {
    /// Starts a server (or uses `QDRANT_URL`); `None` (after a loud SKIPPED line) when there is none and the run
    /// does not require one.
    pub fn start() -> Option<QdrantServer> {
        Self::start_with(&[])
    }

    /// Like `start`, with extra `QDRANT__*` settings for a local server (e.g. an API key); `None` with an
    /// external `QDRANT_URL`, whose settings the test cannot choose.
    pub fn start_with(extra: &[(&str, &str)]) -> Option<QdrantServer> {
        if !extra.is_empty() && std::env::var("QDRANT_URL").is_ok() {
            eprintln!("SKIPPED: this test configures its own Qdrant server; QDRANT_URL points elsewhere");
            return None;
        }
        if let Ok(url) = std::env::var("QDRANT_URL") {
            return Some(QdrantServer {
                url,
                http_port: 0,
                grpc_port: 0,
                api_key: std::env::var("QDRANT_API_KEY").unwrap_or_default(),
                child: None,
                storage: None,
                binary: None,
                extra: Vec::new(),
            });
        }
        let Some(binary) = server_binary() else {
            assert!(
                std::env::var("CLINSTREAM_REQUIRE_QDRANT").is_err(),
                "no Qdrant server: ../shared/tools/qdrant/qdrant-server is missing (set CLINSTREAM_QDRANT_SERVER)"
            );
            eprintln!("SKIPPED: no Qdrant server binary (../shared/tools/qdrant/qdrant-server) and no QDRANT_URL");
            return None;
        };
        let storage = tempfile::tempdir().unwrap();
        let mut server = QdrantServer {
            url: String::new(),
            http_port: super::free_port(),
            grpc_port: super::free_port(),
            api_key: String::new(),
            child: None,
            storage: Some(storage),
            binary: Some(binary),
            extra: extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        let tls = extra.iter().any(|(k, v)| *k == "QDRANT__SERVICE__ENABLE_TLS" && *v == "true");
        server.url = format!("{}://127.0.0.1:{}", if tls { "https" } else { "http" }, server.grpc_port);
        server.restart();
        Some(server)
    }

    /// Whether this is a server the test started (and may kill).
    pub fn is_local(&self) -> bool {
        self.binary.is_some()
    }

    /// Starts the server process on the same ports and storage and waits until it is ready.
    pub fn restart(&mut self) {
        let (Some(binary), Some(storage)) = (&self.binary, &self.storage) else { return };
        let dir = storage.path();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("qdrant.log")).unwrap();
        let child = Command::new(binary)
            .env("QDRANT__SERVICE__HOST", "127.0.0.1")
            .env("QDRANT__SERVICE__HTTP_PORT", self.http_port.to_string())
            .env("QDRANT__SERVICE__GRPC_PORT", self.grpc_port.to_string())
            .env("QDRANT__STORAGE__STORAGE_PATH", dir.join("storage"))
            .env("QDRANT__STORAGE__SNAPSHOTS_PATH", dir.join("snapshots"))
            .env("QDRANT__TELEMETRY_DISABLED", "true")
            .env("QDRANT__LOG_LEVEL", "WARN")
            .envs(self.extra.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting the Qdrant server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.ready() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("the Qdrant server exited ({status}) before it was ready:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "the Qdrant server did not become ready:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ready for the tests: `/readyz` answers 200 on the REST port *and* the gRPC port (the one the store uses)
    /// accepts. Qdrant binds the two servers on separate threads, so REST can answer before gRPC listens — the
    /// first call of a test then failed with a transport error. With TLS, which the plain-HTTP probe cannot speak,
    /// both ports must accept.
    pub fn ready(&self) -> bool {
        let grpc = std::net::TcpStream::connect(("127.0.0.1", self.grpc_port)).is_ok();
        if self.url.starts_with("https://") {
            return grpc && std::net::TcpStream::connect(("127.0.0.1", self.http_port)).is_ok();
        }
        grpc && super::http_get(self.http_port, "/readyz").is_some_and(|(status, _)| status == 200)
    }

    /// SIGKILL (an outage without warning); `restart` brings it back on the same storage.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        self.storage
            .as_ref()
            .and_then(|s| std::fs::read_to_string(s.path().join("qdrant.log")).ok())
            .unwrap_or_default()
    }
}

impl Drop for QdrantServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM first (a clean shutdown), then make sure.
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Peers of the Qdrant server in distributed mode on loopback (`cluster.enabled`, a p2p port each, the first peer
/// the others bootstrap from), as production runs Qdrant. Each peer is a `QdrantServer` the test may SIGKILL and
/// restart on its storage. Never an external `QDRANT_URL` (its peers cannot be killed): SKIPPED there.
pub struct QdrantCluster {
    pub peers: Vec<QdrantServer>,
}

impl QdrantCluster {
    /// Starts `n` peers and waits until the first one sees all of them.
    pub fn start(n: usize) -> Option<QdrantCluster> {
        if std::env::var("QDRANT_URL").is_ok() {
            eprintln!("SKIPPED: this test starts and kills its own Qdrant peers; QDRANT_URL points elsewhere");
            return None;
        }
        let p2p: Vec<u16> = (0..n).map(|_| super::free_port()).collect();
        let mut peers = Vec::new();
        for (i, port) in p2p.iter().enumerate() {
            let mut extra = vec![
                ("QDRANT__CLUSTER__ENABLED".to_string(), "true".to_string()),
                ("QDRANT__CLUSTER__P2P__PORT".to_string(), port.to_string()),
                ("QDRANT_URI".to_string(), format!("http://127.0.0.1:{port}")),
            ];
            if i > 0 {
                extra.push(("QDRANT_BOOTSTRAP".to_string(), format!("http://127.0.0.1:{}", p2p[0])));
            }
            let extra: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            peers.push(QdrantServer::start_with(&extra)?);
        }
        let cluster = QdrantCluster { peers };
        super::wait_until(Duration::from_secs(120), "every Qdrant peer to join the cluster", || {
            cluster.peer_count() == n
        });
        Some(cluster)
    }

    /// The peers the first peer knows of.
    pub fn peer_count(&self) -> usize {
        super::http_get(self.peers[0].http_port, "/cluster")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|v| v["result"]["peers"].as_object().map(|p| p.len()))
            .unwrap_or(0)
    }

    /// Whether every replica of every shard of `collection` is active (after a peer came back: recovered).
    pub fn replicas_active(&self, collection: &str) -> bool {
        let path = format!("/collections/{collection}/cluster");
        self.peers.iter().all(|p| {
            let Some((200, body)) = super::http_get(p.http_port, &path) else { return false };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else { return false };
            let r = &v["result"];
            let states = r["local_shards"].as_array().into_iter().chain(r["remote_shards"].as_array()).flatten();
            let mut any = false;
            for s in states {
                any = true;
                if s["state"] != "Active" {
                    return false;
                }
            }
            any
        })
    }

    /// The exact number of chunk points (entity windows left out) of `collection`, read with consistency `all`
    /// (every replica answers).
    pub fn count_all(&self, collection: &str) -> Option<u64> {
        let path = format!("/collections/{collection}/points/count?consistency=all");
        let body = r#"{"exact": true, "filter": {"must_not": [{"key": "record", "match": {"value": "window"}}]}}"#;
        let (status, body) = super::http_post_json(self.peers[0].http_port, &path, body)?;
        if status != 200 {
            return None;
        }
        serde_json::from_str::<serde_json::Value>(&body).ok()?["result"]["count"].as_u64()
    }
}
