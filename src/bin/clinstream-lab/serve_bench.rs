//! `clinstream-lab bench serve`: latency and throughput of the query service over HTTP, as clients see it.
//!
//! Indexes the documents (the worker's own `Indexer`: chunks and entity windows) into the embedded store and, when
//! `--url` is given, into a new collection on a Qdrant server (`--keep` keeps and reuses both); builds the service on each, serves it on loopback
//! and sends every question (up to `--requests`) as `POST /v1/context` and as `POST /v1/search` (the question as the
//! query, the patient filter, top 5), from 1 and from 8 concurrent clients, each client on one keep-alive
//! connection. Prints p50/p99 latency and requests/s per store, route and client count, and the ratios beside each
//! other: context against search (the CLEAR path against plain hybrid retrieval, the baseline), and 8 clients
//! against 1. With `--answers N` and an LLM endpoint in `llm.*`, also the first N questions as `POST /v1/answer`
//! from one client: the service's own time per answer (the request's time less the LLM's) and the generative
//! step's overhead (that less the answer's context), both from each response's `Server-Timing`, beside
//! `/v1/context`'s from the same run. Question and note text are never printed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Serialize;

use clinstream::config::Settings;
use clinstream::index::Indexer;
use clinstream::serve::{Service, routes};
use clinstream::stages::Pipeline;

#[derive(Debug, Serialize)]
pub struct Latency {
    pub store: String,
    pub route: &'static str,
    pub clients: usize,
    pub requests: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub requests_per_s: f64,
    /// Answers other than 200 (should be 0).
    pub errors: usize,
}

#[derive(Debug, Serialize)]
pub struct ServeBench {
    pub documents: usize,
    pub questions: usize,
    /// Seconds to index the documents, per store.
    pub indexing_s: Vec<(String, f64)>,
    pub results: Vec<Latency>,
    /// p99 of /v1/context ÷ p99 of /v1/search, per store and client count.
    pub context_vs_search_p99: Vec<(String, usize, f64)>,
    /// Requests/s at 8 clients ÷ at 1, per store and route.
    pub scaling_8_vs_1: Vec<(String, &'static str, f64)>,
    /// `/v1/answer`, per store (with `--answers`).
    pub answer: Vec<AnswerLatency>,
}

/// `/v1/answer` from one client: the request's time, the LLM's and the context's (as each response's
/// `Server-Timing` reports them) and the differences — the service's own time (the request's less the LLM's:
/// context, prompt, schema, citation check, HTTP both ways) and the generative step's overhead (that less the
/// context, which `/v1/context` also pays).
#[derive(Debug, Serialize)]
pub struct AnswerLatency {
    pub store: String,
    pub requests: usize,
    /// Answers other than 200.
    pub errors: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub llm_p50_ms: f64,
    pub llm_p99_ms: f64,
    /// Per request: its time less the LLM's.
    pub overhead_p50_ms: f64,
    pub overhead_p99_ms: f64,
    pub overhead_max_ms: f64,
    /// Per request: the context inside the answer (`Server-Timing: context`).
    pub answer_context_p50_ms: f64,
    pub answer_context_p99_ms: f64,
    /// Per request: its time less the LLM's and the context's — what the generative step adds.
    pub generation_overhead_p50_ms: f64,
    pub generation_overhead_p99_ms: f64,
    pub generation_overhead_max_ms: f64,
    /// `/v1/context` at 1 client in the same run (the context is part of the overhead).
    pub context_p99_ms: f64,
}

/// One answered `/v1/answer`: the request's time, the LLM's and the context's, in milliseconds.
struct Timed {
    took: f64,
    llm: f64,
    context: f64,
}

#[derive(serde::Deserialize)]
struct Question {
    patient: String,
    question: String,
}

/// What is sent: questions per run, the client counts, and how many answers (0: no `/v1/answer`).
#[derive(Debug, Clone, Copy)]
pub struct Load<'a> {
    pub requests: usize,
    pub clients: &'a [usize],
    pub answers: usize,
    /// `/v1/context` (and `/v1/answer`) with CPTF at this ratio.
    pub compress: Option<f32>,
}

/// Runs the benchmark (its own runtime).
pub fn run(
    settings: &Settings,
    documents: &Path,
    questions: &Path,
    url: Option<&str>,
    load: &Load<'_>,
    keep: Option<&Path>,
) -> anyhow::Result<ServeBench> {
    let Load { requests, clients, answers, compress } = *load;
    let docs: Vec<String> =
        std::fs::read_to_string(documents)?.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
    let questions: Vec<Question> = std::fs::read_to_string(questions)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let questions: Vec<Question> = questions.into_iter().take(requests).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut stores: Vec<(String, Settings)> = Vec::new();
    let dir = match keep {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.to_path_buf()
        }
        None => tempfile_dir()?,
    };
    let mut embedded = settings.clone();
    embedded.store.kind = "embedded".into();
    embedded.store.path = dir.join("qdrant").display().to_string();
    stores.push(("embedded".into(), embedded));
    if let Some(url) = url {
        let mut server = settings.clone();
        server.store.kind = "qdrant".into();
        server.store.url = url.to_string();
        server.store.alias.clear();
        // With `--keep` the collection has a fixed name, reused like the kept embedded store (the server's own
        // storage keeps it between runs); otherwise one per run.
        server.store.collection = match keep {
            Some(_) => "clinstream-bench-serve-kept".to_string(),
            None => format!("clinstream-bench-serve-{}", std::process::id()),
        };
        stores.push(("qdrant".into(), server));
    }
    let mut out = ServeBench {
        documents: docs.len(),
        questions: questions.len(),
        indexing_s: Vec::new(),
        results: Vec::new(),
        context_vs_search_p99: Vec::new(),
        scaling_8_vs_1: Vec::new(),
        answer: Vec::new(),
    };
    anyhow::ensure!(answers == 0 || !settings.llm.base_url.trim().is_empty(), "--answers needs llm.base_url");
    let pipeline = Arc::new(Pipeline::new(settings)?);
    for (name, mut s) in stores {
        s.serve.auth = false;
        s.serve.addr = "127.0.0.1:0".into();
        let r: anyhow::Result<()> = rt.block_on(async {
            // A kept store that already holds the documents is reused (iterating on the service): the embedded one
            // by its directory, the server's by a marker written once its collection was fully indexed.
            let marker = dir.join(format!("indexed-{}", s.store.collection));
            let reuse = keep.is_some()
                && match name.as_str() {
                    "embedded" => Path::new(&s.store.path).join("edge_config.json").exists(),
                    _ => marker.exists(),
                };
            let indexer = Arc::new(Indexer::start(&s, pipeline.compiled()).await?);
            let reuse = reuse && indexer.store().count().await? > 0;
            let clock = Instant::now();
            if !reuse {
                index_all(&pipeline, &indexer, &docs).await?;
            }
            indexer.store().flush().await?;
            indexer.store().maintenance_idle().await;
            if keep.is_some() && name != "embedded" {
                std::fs::write(&marker, url.unwrap_or_default())?;
            }
            out.indexing_s.push((name.clone(), clock.elapsed().as_secs_f64()));
            eprintln!("{name}: {} documents indexed in {:.0} s", docs.len(), clock.elapsed().as_secs_f64());
            let service = Service::new(&s, pipeline.clone(), indexer.embedder().clone(), indexer.store().clone())?;
            service.prepare().await?;
            let readiness = clinstream::http::Readiness::default();
            let (addr, _) = routes::serve(&s.serve.addr, Arc::new(service), readiness, std::future::pending()).await?;
            let bodies = |route: &str| -> Vec<String> {
                questions
                    .iter()
                    .map(|q| match route {
                        "context" => {
                            let mut b =
                                serde_json::json!({"patient": q.patient, "question": q.question, "budget_tokens": 1024});
                            if let Some(r) = compress {
                                b["compress"] = serde_json::json!(r);
                            }
                            b
                        }
                        _ => serde_json::json!({"query": q.question, "patient": q.patient, "top": 5}),
                    })
                    .map(|v| v.to_string())
                    .collect()
            };
            for route in ["context", "search"] {
                let bodies = Arc::new(bodies(route));
                // Warm-up: the store's pages and the model's first calls.
                drive(addr, route, Arc::new(bodies.iter().take(20).cloned().collect()), 1).await?;
                for &c in clients {
                    let (latencies, errors, wall) = drive(addr, route, bodies.clone(), c).await?;
                    out.results.push(summarise(&name, route, c, latencies, errors, wall));
                }
            }
            if answers > 0 {
                let bodies: Vec<String> = bodies("context").into_iter().take(answers).collect();
                let (timed, errors) = drive_answers(addr, &bodies).await?;
                let context_p99 = out
                    .results
                    .iter()
                    .find(|r| r.store == name && r.route == "context" && r.clients == 1)
                    .map_or(0.0, |r| r.p99_ms);
                out.answer.push(summarise_answers(&name, timed, errors, context_p99));
            }
            Ok(())
        });
        r?;
    }
    for r in out.results.iter().filter(|r| r.route == "context") {
        if let Some(s) =
            out.results.iter().find(|x| x.route == "search" && x.store == r.store && x.clients == r.clients)
        {
            out.context_vs_search_p99.push((r.store.clone(), r.clients, r.p99_ms / s.p99_ms.max(1e-9)));
        }
    }
    for r in out.results.iter().filter(|r| r.clients == 1) {
        if let Some(s8) = out.results.iter().find(|x| x.route == r.route && x.store == r.store && x.clients == 8) {
            out.scaling_8_vs_1.push((r.store.clone(), r.route, s8.requests_per_s / r.requests_per_s.max(1e-9)));
        }
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(out)
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("clinstream-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Indexes every document with up to 32 in flight (as the worker would).
async fn index_all(pipeline: &Arc<Pipeline>, indexer: &Arc<Indexer>, docs: &[String]) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for line in docs {
        while tasks.len() >= 32 {
            tasks.join_next().await.transpose()?.transpose()?;
        }
        let (p, ix, line) = (pipeline.clone(), indexer.clone(), line.clone());
        tasks.spawn(async move {
            let doc = tokio::task::spawn_blocking(move || p.process(line.as_bytes()))
                .await?
                .map_err(|e| anyhow::anyhow!("a document was rejected: {}", e.error.code.as_str()))?;
            ix.index(&Arc::new(doc)).await.map_err(|e| anyhow::anyhow!("indexing: {}", e.code.as_str()))?;
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// Sends every body from `clients` clients (each on one keep-alive connection, taking the next body in turn);
/// returns each request's latency, the count of non-200 answers and the wall time.
async fn drive(
    addr: std::net::SocketAddr,
    route: &str,
    bodies: Arc<Vec<String>>,
    clients: usize,
) -> anyhow::Result<(Vec<Duration>, usize, Duration)> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let path = format!("/v1/{route}");
    let clock = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (bodies, next, path) = (bodies.clone(), next.clone(), path.clone());
        tasks.spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(conn);
            let mut latencies = Vec::new();
            let mut errors = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(body) = bodies.get(i) else { break };
                let (ok, _, took, _) = post(&mut sender, &path, body).await?;
                latencies.push(took);
                errors += usize::from(!ok);
            }
            Ok::<_, anyhow::Error>((latencies, errors))
        });
    }
    let mut all = Vec::new();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        let (l, e) = r??;
        all.extend(l);
        errors += e;
    }
    Ok((all, errors, clock.elapsed()))
}

/// One JSON `POST` on a keep-alive connection: whether it was answered 200, the body, the time from send to
/// the last byte, and the `Server-Timing` metrics (name, milliseconds).
async fn post(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    body: &str,
) -> anyhow::Result<(bool, Bytes, Duration, Vec<(String, f64)>)> {
    let request = http::Request::post(path)
        .header(http::header::HOST, "bench")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let start = Instant::now();
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let ok = response.status() == http::StatusCode::OK;
    let timing = response
        .headers()
        .get("server-timing")
        .and_then(|v| v.to_str().ok())
        .map(routes::parse_server_timing)
        .unwrap_or_default();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((ok, bytes, start.elapsed(), timing))
}

/// Sends each body as `POST /v1/answer` in turn on one keep-alive connection: per answered request its time, the
/// LLM's and the context's (`Server-Timing`), and the count of answers other than 200.
async fn drive_answers(addr: std::net::SocketAddr, bodies: &[String]) -> anyhow::Result<(Vec<Timed>, usize)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let (mut timed, mut errors) = (Vec::new(), 0);
    for body in bodies {
        let (ok, _, took, timing) = post(&mut sender, "/v1/answer", body).await?;
        let took = took.as_secs_f64() * 1000.0;
        let ms = |name: &str| timing.iter().find(|(n, _)| n == name).map(|t| t.1);
        match (ok, ms("llm"), ms("context")) {
            (true, Some(llm), Some(context)) => timed.push(Timed { took, llm, context }),
            _ => errors += 1,
        }
    }
    Ok((timed, errors))
}

fn summarise_answers(store: &str, timed: Vec<Timed>, errors: usize, context_p99_ms: f64) -> AnswerLatency {
    let at = |mut v: Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        percentile(&v, q)
    };
    let total: Vec<f64> = timed.iter().map(|t| t.took).collect();
    let llm: Vec<f64> = timed.iter().map(|t| t.llm).collect();
    let overhead: Vec<f64> = timed.iter().map(|t| t.took - t.llm).collect();
    let context: Vec<f64> = timed.iter().map(|t| t.context).collect();
    let generation: Vec<f64> = timed.iter().map(|t| t.took - t.llm - t.context).collect();
    AnswerLatency {
        store: store.to_string(),
        requests: timed.len(),
        errors,
        p50_ms: at(total.clone(), 0.5),
        p99_ms: at(total, 0.99),
        llm_p50_ms: at(llm.clone(), 0.5),
        llm_p99_ms: at(llm, 0.99),
        overhead_p50_ms: at(overhead.clone(), 0.5),
        overhead_p99_ms: at(overhead.clone(), 0.99),
        overhead_max_ms: at(overhead, 1.0),
        answer_context_p50_ms: at(context.clone(), 0.5),
        answer_context_p99_ms: at(context, 0.99),
        generation_overhead_p50_ms: at(generation.clone(), 0.5),
        generation_overhead_p99_ms: at(generation.clone(), 0.99),
        generation_overhead_max_ms: at(generation, 1.0),
        context_p99_ms,
    }
}

/// The `q` quantile of sorted values (nearest rank; 0 for none).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1).min(sorted.len().saturating_sub(1));
    sorted.get(rank).copied().unwrap_or(0.0)
}

fn summarise(
    store: &str,
    route: &'static str,
    clients: usize,
    mut l: Vec<Duration>,
    errors: usize,
    wall: Duration,
) -> Latency {
    l.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let sorted: Vec<f64> = l.iter().copied().map(ms).collect();
    let at = |q: f64| percentile(&sorted, q);
    Latency {
        store: store.to_string(),
        route,
        clients,
        requests: l.len(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        max_ms: l.last().copied().map_or(0.0, ms),
        requests_per_s: l.len() as f64 / wall.as_secs_f64().max(1e-9),
        errors,
    }
}
