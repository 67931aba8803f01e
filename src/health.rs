//! `/metrics`, `/healthz` and `/readyz` on `metrics.addr`: a minimal HTTP/1.1 responder (GET only, one request
//! per connection), enough for Prometheus and Kubernetes probes without an HTTP framework.
//!
//! `/healthz` is 200 while the process serves; `/readyz` is 200 once the source is open, the lexicon and
//! variables are compiled, the model warm and the store open — and then only while the vector store answers: while
//! the indexer is retrying an unavailable store, `/readyz` is 503 (the worker is alive, but not doing its job).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::telemetry::metrics::metrics;

/// Shared readiness flag (start-up done), combined with the store's state when read.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

/// False while the indexer retries an unavailable vector store (one store per process).
static STORE_REACHABLE: AtomicBool = AtomicBool::new(true);

/// Called by the indexer: false when a store call failed transiently, true when one succeeded.
pub fn set_store_reachable(reachable: bool) {
    STORE_REACHABLE.store(reachable, Ordering::SeqCst);
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst) && STORE_REACHABLE.load(Ordering::SeqCst)
    }
}

/// Binds `addr` (fails loudly when it cannot) and serves in a background task. Returns the bound address.
pub async fn serve(addr: &str, readiness: Readiness) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            let readiness = readiness.clone();
            tokio::spawn(async move {
                // Read up to the end of the headers (a request may arrive in several segments; answering and
                // closing early would reset the connection while the client is still writing).
                let mut buf = Vec::with_capacity(1024);
                let mut chunk = [0u8; 1024];
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
                    match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                        Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                        Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let request = String::from_utf8_lossy(&buf);
                let mut parts = request.split_whitespace();
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let path = path.split('?').next().unwrap_or("");
                let (status, content_type, body) = match (method, path) {
                    ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics().render()),
                    ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
                    ("GET", "/readyz") if readiness.get() => ("200 OK", "text/plain", "ready\n".to_string()),
                    ("GET", "/readyz") => ("503 Service Unavailable", "text/plain", "not ready\n".to_string()),
                    ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
                    _ => ("405 Method Not Allowed", "text/plain", "method not allowed\n".to_string()),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn status(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_whitespace().nth(1).unwrap_or("").to_string()
    }

    #[tokio::test]
    async fn readiness_follows_start_up_and_the_store() {
        let readiness = Readiness::default();
        let addr = serve("127.0.0.1:0", readiness.clone()).await.unwrap();
        assert_eq!(status(addr, "/readyz").await, "503", "not ready before start-up is done");
        readiness.set(true);
        assert_eq!(status(addr, "/readyz").await, "200");
        set_store_reachable(false);
        assert_eq!(status(addr, "/readyz").await, "503", "not ready while the store is unavailable");
        assert_eq!(status(addr, "/healthz").await, "200", "but alive");
        set_store_reachable(true);
        assert_eq!(status(addr, "/readyz").await, "200");
    }
}
