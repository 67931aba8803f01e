//! `/metrics`, `/healthz` and `/readyz` on `metrics.addr`: a minimal HTTP/1.1 responder (GET only, one request
//! per connection), enough for Prometheus and Kubernetes probes without an HTTP framework.
//!
//! `/healthz` is 200 while the process serves; `/readyz` is 200 once the source is open and the lexicon and
//! variables are compiled (and, with their issues, the model warm and the store reachable), 503 otherwise.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::telemetry::metrics::metrics;

/// Shared readiness flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
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
