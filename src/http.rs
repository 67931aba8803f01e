//! `/metrics`, `/healthz` and `/readyz` on `metrics.addr`, served by axum (hyper underneath), so the query
//! service can add its routes to the same server library.
//!
//! `/healthz` is 200 while the process serves; `/readyz` is 200 once the source is open, the lexicon and
//! variables are compiled, the model warm and the store open — and then only while the vector store answers: while
//! the indexer is retrying an unavailable store, `/readyz` is 503 (the worker is alive, but not doing its job).
//! Other paths are 404, other methods 405. Requests carry no body the server reads, and nothing is logged.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

pub use crate::telemetry::health::{Readiness, set_store_reachable};
use crate::telemetry::metrics::metrics;

/// The health and metrics routes.
pub fn router(readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(readiness)
}

async fn render_metrics() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics().render())
}

async fn ready(State(readiness): State<Readiness>) -> (StatusCode, &'static str) {
    if readiness.get() { (StatusCode::OK, "ready\n") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready\n") }
}

/// Binds `addr` (fails loudly when it cannot) and serves in a background task. Returns the bound address.
pub async fn serve(addr: &str, readiness: Readiness) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = router(readiness);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "The metrics and health server stopped.");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn status(addr: SocketAddr, method: &str, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_whitespace().nth(1).unwrap_or("").to_string()
    }

    #[tokio::test]
    async fn readiness_follows_start_up_and_the_store() {
        let readiness = Readiness::default();
        let addr = serve("127.0.0.1:0", readiness.clone()).await.unwrap();
        assert_eq!(status(addr, "GET", "/readyz").await, "503", "not ready before start-up is done");
        readiness.set(true);
        assert_eq!(status(addr, "GET", "/readyz").await, "200");
        set_store_reachable(false);
        assert_eq!(status(addr, "GET", "/readyz").await, "503", "not ready while the store is unavailable");
        assert_eq!(status(addr, "GET", "/healthz").await, "200", "but alive");
        set_store_reachable(true);
        assert_eq!(status(addr, "GET", "/readyz").await, "200");
        assert_eq!(status(addr, "GET", "/nowhere").await, "404");
        assert_eq!(status(addr, "POST", "/metrics").await, "405");
    }
}
