//! Embedding and the vector store with the real parts: ONNX Runtime 1.31.1 running all-MiniLM-L6-v2 (`make model`),
//! the Qdrant engine in-process (qdrant-edge), and — when `QDRANT_URL` is set — a Qdrant server.
//!
//! Without the model files (a clone where `make model` has not run) these tests fail with that instruction, unless
//! `CLINSTREAM_SKIP_MODEL_TESTS=1`; `make test` runs `make model` first.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clinstream::config::Settings;
use clinstream::embed::Embedder;
use clinstream::index::Indexer;
use clinstream::stages::Pipeline;
use clinstream::store::{Filters, Query, Record, Store};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Settings pointing at the repository's model files, with a store in `dir`.
fn settings(dir: &Path) -> Option<Settings> {
    common::model_settings(dir)
}

/// A dense-only query for the `top` chunks nearest `dense`, with every payload field.
fn nearest(dense: Vec<f32>, top: usize) -> Query {
    Query {
        dense,
        sparse: Default::default(),
        filters: Default::default(),
        top,
        fields: None,
        record: Record::Chunks,
        matched: Vec::new(),
    }
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * y).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// The int8 model from `make model` (`embed.model_file = "model.int8.onnx"`): loads, gives unit vectors close to
/// the numpy reference of the fp32 encoder, and keeps the reference's similarity order between the sentences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_int8_model_stays_close_to_fp32() {
    let dir = tempfile::tempdir().unwrap();
    let Some((embedder, texts, want)) = with_reference(dir.path(), "model.int8.onnx").await else { return };
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let got = embedder.embed(&texts).await.unwrap();
    for (i, g) in got.iter().enumerate() {
        let c = cosine(g, &want[i]);
        assert!(c >= 0.97, "{:?}: int8 cosine to fp32 {c:.4}", texts[i]);
        assert!(c < 0.99999, "{:?}: cosine {c:.6} — is this the int8 file?", texts[i]);
    }
    // The nearest other sentence of each sentence is the same under int8 and fp32.
    let nearest = |v: &dyn Fn(usize, usize) -> f64, i: usize| {
        (0..texts.len()).filter(|&j| j != i).max_by(|&a, &b| v(i, a).total_cmp(&v(i, b))).unwrap()
    };
    let dot64 = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let fp32 = |i: usize, j: usize| dot64(&want[i], &want[j]);
    let int8 = |i: usize, j: usize| got[i].iter().zip(&got[j]).map(|(x, y)| f64::from(x * y)).sum::<f64>();
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(nearest(&int8, i), nearest(&fp32, i), "nearest neighbour of {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedder_matches_an_independent_numpy_forward_pass() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let embedder = tokio::task::spawn_blocking(move || Embedder::start(&s.embed)).await.unwrap().unwrap();
    assert_eq!(embedder.info().dim, 384);
    assert_eq!(embedder.info().max_tokens, 256, "max_seq_length from sentence_bert_config.json");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("tests/data/minilm_reference.json")).unwrap())
            .unwrap();
    let sentences = reference["sentences"].as_array().unwrap();
    let texts: Vec<&str> = sentences.iter().map(|s| s["text"].as_str().unwrap()).collect();
    // Same tokens as the Python tokenizer (special tokens included).
    let ids = embedder.encode(&texts).unwrap();
    for (s, ids) in sentences.iter().zip(&ids) {
        let want: Vec<u32> = s["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(ids, &want, "token ids of {:?}", s["text"]);
    }
    // Batched together (different lengths, so padding and masking are exercised) and one at a time.
    let batched = embedder.embed(&texts).await.unwrap();
    for (i, s) in sentences.iter().enumerate() {
        let want: Vec<f64> = s["vector"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let alone = embedder.embed(&texts[i..=i]).await.unwrap().remove(0);
        for (how, got) in [("batched", &batched[i]), ("alone", &alone)] {
            let c = cosine(got, &want);
            assert!(c >= 0.999, "{how} {:?}: cosine {c:.5} < 0.999", s["text"]);
            let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "unit length, got {norm}");
        }
    }
    // The published reference values of sentence-transformers for the first sentence.
    let first = &batched[0][..5];
    for (got, want) in first.iter().zip([0.0677, 0.0635, 0.0487, 0.0793, 0.0374]) {
        assert!((got - want).abs() < 5e-4, "{first:?}");
    }
    // Many concurrent callers: every answer goes back to its own caller.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let e = embedder.clone();
        let text = texts[i % texts.len()].to_string();
        tasks.push(tokio::spawn(async move { (i, e.embed(&[text.as_str()]).await.unwrap().remove(0)) }));
    }
    for t in tasks {
        let (i, v) = t.await.unwrap();
        assert!(cosine(&v, &batched[i % texts.len()].iter().map(|x| f64::from(*x)).collect::<Vec<_>>()) > 0.9999);
    }
}

/// `make model`'s half-precision file (`embed.model_file`) against the same independent reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_half_precision_model_matches_the_reference_too() {
    let dir = tempfile::tempdir().unwrap();
    let Some((embedder, texts, want)) = with_reference(dir.path(), "model.fp16.onnx").await else { return };
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let got = embedder.embed(&texts).await.unwrap();
    for ((text, v), want) in texts.iter().zip(&got).zip(&want) {
        let c = cosine(v, want);
        assert!(c >= 0.999, "fp16 {text:?}: cosine {c:.5} < 0.999");
    }
}

/// A query's request (`embed_now`) runs with what is queued instead of waiting `embed.linger_ms` for more inputs;
/// a document's (`embed`) alone waits the linger out. The vectors are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_does_not_wait_for_the_batching_linger() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.embed.linger_ms = 3_000;
    let embedder = tokio::task::spawn_blocking(move || Embedder::start(&s.embed)).await.unwrap().unwrap();
    let text = ["Is there a pleural effusion?"];
    let clock = std::time::Instant::now();
    let now = embedder.embed_now(&text).await.unwrap();
    let query = clock.elapsed();
    let clock = std::time::Instant::now();
    let batched = embedder.embed(&text).await.unwrap();
    let document = clock.elapsed();
    assert!(document >= std::time::Duration::from_millis(3_000), "a lone document request waits: {document:?}");
    assert!(query < std::time::Duration::from_millis(1_500), "a query does not wait the 3 s linger: {query:?}");
    assert_eq!(now, batched);
}

/// The embedder for another model file of the default model, with the numpy reference's sentences and fp32
/// vectors (tests/data/minilm_reference.json).
async fn with_reference(dir: &Path, model_file: &str) -> Option<(Embedder, Vec<String>, Vec<Vec<f64>>)> {
    let mut s = settings(dir)?;
    s.embed.model_file = model_file.into();
    let embedder = tokio::task::spawn_blocking(move || Embedder::start(&s.embed)).await.unwrap().unwrap();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("tests/data/minilm_reference.json")).unwrap())
            .unwrap();
    let sentences = reference["sentences"].as_array().unwrap();
    let texts = sentences.iter().map(|s| s["text"].as_str().unwrap().to_string()).collect();
    let vectors = sentences
        .iter()
        .map(|s| s["vector"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
        .collect();
    Some((embedder, texts, vectors))
}

/// The model digest (what the label cache is keyed on) tells the model files of one directory apart and is the
/// same for the same file in two processes' embedders; the model's name alone is the directory's and would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_digest_tells_model_files_apart() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let start = |file: &str| {
        let mut e = s.embed.clone();
        e.model_file = file.into();
        tokio::task::spawn_blocking(move || Embedder::start(&e))
    };
    let fp32 = start("model.onnx").await.unwrap().unwrap();
    let again = start("model.onnx").await.unwrap().unwrap();
    let int8 = start("model.int8.onnx").await.unwrap().unwrap();
    assert_eq!(fp32.info().name, int8.info().name, "one directory, one name");
    let (a, b, c) = (fp32.digest().await, again.digest().await, int8.digest().await);
    assert_eq!(a.len(), 40, "{a}");
    assert_eq!(a, b, "the same file, the same digest");
    assert_ne!(a, c, "fp32 and int8 files differ");
}

/// `bench embed` as the GPU measurements use it: a sweep prints one JSON line per combination, and `--check-cpu`
/// compares the benchmarked model (here fp16 on CPU) with fp32 on CPU per vector.
#[test]
fn bench_embed_sweeps_and_checks_against_the_cpu_reference() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let csv = dir.path().join("notes.csv");
    std::fs::write(
        &csv,
        "transcription\n\"HISTORY: Chest pain for two days. No fever. EXAM: Lungs clear. PLAN: Aspirin daily.\"\n\
         \"ASSESSMENT: Type 2 diabetes, stable. Denies polyuria. PLAN: Continue metformin. Follow up in 3 months.\"\n",
    )
    .unwrap();
    let out = common::lab()
        .args(["bench", "embed", "--csv"])
        .arg(&csv)
        .args(["--limit", "2", "--runs", "1", "--batch-tokens", "512,1024", "--check-cpu", "50"])
        .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
        .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
        .env("CLINSTREAM__EMBED__MODEL_FILE", "model.fp16.onnx")
        .env("CLINSTREAM__LOG__LEVEL", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2, "one line per combination");
    for (row, budget) in rows.iter().zip([512, 1024]) {
        assert_eq!(row["batch_tokens"], budget);
        assert_eq!(row["provider"], "cpu");
        assert!(row["tokens"].as_u64().unwrap() > 20, "{row}");
        let check = &row["check"];
        assert!(check["vectors"].as_u64().unwrap() >= 4, "{row}");
        assert!(check["min_cosine"].as_f64().unwrap() >= 0.999, "{row}");
        assert_eq!(check["below_0_999"], 0);
    }
}

/// `bench store --settled` (what the capacity benchmark's store bound reads) also reports, for the embedded store,
/// the time until the maintenance its writes started had finished — never before the points were durable — and
/// only when asked: without the flag the rows have no such fields.
#[test]
fn bench_store_reports_the_settled_time_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let bench = |extra: &[&str]| {
        let out = common::lab()
            .args(["bench", "store", "--docs", "60", "--chunks", "4", "--windows", "2", "--concurrency", "8"])
            .args(["--groups", "2048", "--runs", "1"])
            .args(extra)
            .env_remove("QDRANT_URL")
            // Maintenance after every few points, with indexes built, so there is maintenance to wait for.
            .env("CLINSTREAM__STORE__MAINTAIN_EVERY", "10")
            .env("CLINSTREAM__STORE__INDEX_THRESHOLD_KB", "1")
            .env("CLINSTREAM__LOG__LEVEL", "warn")
            .env("TMPDIR", dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rows.len(), 1, "one row: the embedded store, one group setting");
        assert_eq!(rows[0]["store"], "embedded");
        rows[0].clone()
    };
    let plain = bench(&[]);
    assert!(plain.get("settled_seconds").is_none() && plain.get("settled_docs_per_s").is_none(), "{plain}");
    let settled = bench(&["--settled"]);
    let (durable, done) = (settled["seconds"].as_f64().unwrap(), settled["settled_seconds"].as_f64().unwrap());
    assert!(done >= durable, "{settled}");
    let rate = settled["settled_docs_per_s"].as_f64().unwrap();
    assert!((rate - 60.0 / done).abs() < 1e-6 * rate.max(1.0), "{settled}");
    assert!(rate <= settled["docs_per_s"].as_f64().unwrap(), "{settled}");
}

/// `bench seos --bound-only` (what `make bench` measures beside each end-to-end run) gives each mode's bound from
/// the same model inputs as the full SEOS bench: the same embedded tokens, and the bound is the bare loop's rate
/// over the tokens per note; no `groups` reference is run; an unknown mode is refused.
#[test]
fn bench_seos_bound_only_gives_the_full_bench_bounds_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let csv = dir.path().join("notes.csv");
    let mut rows = String::from("transcription\n");
    for name in ["13-neurology", "1506-radiology", "19-urology"] {
        let text = std::fs::read_to_string(root().join(format!("tests/fixtures/mtsamples/{name}.txt"))).unwrap();
        rows.push_str(&format!("\"{}\"\n", text.replace('"', "\"\"")));
    }
    std::fs::write(&csv, rows).unwrap();
    let bench = |extra: &[&str]| {
        let out = common::lab()
            .args(["bench", "seos", "--csv"])
            .arg(&csv)
            .args(["--limit", "3", "--runs", "1"])
            .args(extra)
            .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
            .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
            .env("CLINSTREAM__LOG__LEVEL", "warn")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, full, err) = bench(&["--modes", "composed,fixed"]);
    assert!(ok, "{err}");
    let full: Value = serde_json::from_str(&full).unwrap();
    let (ok, bounds, err) = bench(&["--modes", "composed,fixed", "--bound-only"]);
    assert!(ok, "{err}");
    let bounds: Vec<Value> = serde_json::from_str(&bounds).unwrap();
    assert_eq!(bounds.iter().map(|b| b["mode"].as_str().unwrap()).collect::<Vec<_>>(), ["composed", "fixed"]);
    for b in &bounds {
        let mode = &full["modes"].as_array().unwrap().iter().find(|m| m["mode"] == b["mode"]).unwrap();
        assert_eq!(b["notes"], 3);
        assert_eq!(b["embedded_tokens"], mode["embedded_tokens"], "{b} vs {mode}");
        let tokens = b["embedded_tokens"].as_f64().unwrap();
        assert!(tokens > 500.0, "{b}");
        let bare = b["bare_tokens_per_s"].as_f64().unwrap();
        assert!(bare > 0.0, "{b}");
        let bound = b["bound_notes_per_s"].as_f64().unwrap();
        assert!((bound - bare / (tokens / 3.0)).abs() < 1e-9 * bound.max(1.0), "{b}");
    }
    let (ok, _, err) = bench(&["--modes", "composed,chunks", "--bound-only"]);
    assert!(!ok && err.contains("`chunks` is not groups, sentences, composed or fixed"), "{err}");
}

#[test]
fn a_missing_model_or_a_cuda_request_without_the_feature_fails_start_up_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    let mut missing = s.embed.clone();
    missing.model_dir = dir.path().join("nowhere").display().to_string();
    let e = Embedder::start(&missing).unwrap_err();
    assert!(e.to_string().contains("make model"), "{e}");
    s.embed.execution_provider = "cuda".into();
    let e = Embedder::start(&s.embed).unwrap_err();
    if cfg!(feature = "cuda") {
        assert!(e.to_string().contains("CUDA"), "{e}");
    } else {
        assert!(e.to_string().contains("without the `cuda` feature"), "{e}");
    }
}

/// The benchmark-only embedder: refused unless asked for, deterministic unit vectors of the model's width that
/// follow the tokens (shared tokens point alike), and named `synthetic` wherever the model's name goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_synthetic_embedder_is_refused_unless_asked_for_and_named_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.embed.execution_provider = "synthetic".into();
    let refused = s.validate().unwrap_err().to_string();
    assert!(refused.contains("embed.allow_synthetic"), "{refused}");
    s.embed.allow_synthetic = true;
    s.validate().unwrap();
    let embedder = Embedder::start_async(&s.embed).await.unwrap();
    assert_eq!(embedder.info().name, "synthetic");
    assert_eq!(embedder.info().provider, "synthetic");
    assert_eq!(embedder.info().dim, 384, "the model's width, from its config.json");
    let texts = ["no pleural effusion", "no pleural effusion", "small pleural effusion", "fractured left femur"];
    let v = embedder.embed(&texts).await.unwrap();
    assert_eq!(v[0], v[1], "deterministic");
    for x in &v {
        let norm: f32 = x.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!(dot(&v[0], &v[2]) > dot(&v[0], &v[3]), "inputs that share tokens point alike");
    // The build info of a run says so, and so do the points.
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = clinstream::app::start_indexer(&s, &pipeline).await.unwrap().unwrap();
    let info = clinstream::telemetry::metrics::metrics().build_info.with_label_values(&[
        clinstream::WORKER_VERSION,
        pipeline.lexicon().version(),
        "synthetic",
        "synthetic",
    ]);
    assert_eq!(info.get(), 1);
    let doc = Arc::new(pipeline.process(&note("syn-1", "1", "current", "Patient/s1", CARDIAC)).unwrap());
    assert!(indexer.index(&doc).await.unwrap() > 0);
    let hits = indexer.store().search(&nearest(v[0].clone(), 1)).await.unwrap();
    assert_eq!(hits[0].payload["model"], "synthetic");
}

fn note(id: &str, version: &str, status: &str, patient: &str, text: &str) -> Vec<u8> {
    use base64::Engine;
    serde_json::to_vec(&serde_json::json!({
        "resourceType": "DocumentReference", "id": id, "status": status,
        "meta": {"versionId": version},
        "subject": {"reference": patient},
        "content": [{"attachment": {"contentType": "text/plain",
            "data": base64::engine::general_purpose::STANDARD.encode(text)}}]
    }))
    .unwrap()
}

const CARDIAC: &str = "HISTORY OF PRESENT ILLNESS: The patient reports crushing substernal chest pain radiating to the left \
arm since this morning, with diaphoresis. Troponin was elevated.\n\nASSESSMENT AND PLAN: Acute myocardial \
infarction. Start aspirin, heparin and a beta blocker; cardiology consulted for catheterization.";
const RESPIRATORY: &str = "CHIEF COMPLAINT: Shortness of breath.\n\nHISTORY OF PRESENT ILLNESS: Three days of worsening \
dyspnea and productive cough with fever. No chest pain.\n\nASSESSMENT AND PLAN: Community-acquired pneumonia. \
Start ceftriaxone and azithromycin; chest x-ray shows right lower lobe consolidation.";

/// Settings for the server store against `server` (a fresh collection per test).
fn server_settings(dir: &Path, server: &common::qdrant::QdrantServer) -> Option<Settings> {
    let mut s = settings(dir)?;
    s.store.kind = "qdrant".into();
    s.store.url = server.url.clone();
    s.store.api_key = clinstream::config::Secret::new(server.api_key.clone());
    s.store.collection = common::qdrant::unique_collection("test");
    // Creating a sharded collection can take seconds on a loaded 2-core machine (CI, parallel suites).
    s.store.timeout_ms = 60_000;
    Some(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_indexes_replaces_versions_and_removes_entered_in_error() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    indexes_replaces_versions_and_removes_entered_in_error(s).await;
}

/// The same store test against a real Qdrant server (started by the harness, or `QDRANT_URL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_indexes_replaces_versions_and_removes_entered_in_error() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(s) = server_settings(dir.path(), &server) else { return };
    indexes_replaces_versions_and_removes_entered_in_error(s).await;
}

async fn indexes_replaces_versions_and_removes_entered_in_error(s: Settings) {
    let kind = if s.store.kind == "qdrant" { "qdrant" } else { "embedded" };
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
    let store = indexer.store().clone();
    let index = |bytes: Vec<u8>| {
        let doc = Arc::new(pipeline.process(&bytes).unwrap());
        let indexer = &indexer;
        async move { indexer.index(&doc).await.unwrap() }
    };
    let n_cardiac = index(note("doc-a", "1", "current", "Patient/p1", CARDIAC)).await;
    let n_resp = index(note("doc-b", "1", "current", "Patient/p2", RESPIRATORY)).await;
    assert!(n_cardiac >= 1 && n_resp >= 1);
    assert_eq!(store.count().await.unwrap(), n_cardiac + n_resp);
    // Idempotent: the same version again overwrites (same ids), it does not add.
    index(note("doc-a", "1", "current", "Patient/p1", CARDIAC)).await;
    assert_eq!(store.count().await.unwrap(), n_cardiac + n_resp);

    let search = |text: &str, patient: Option<&str>, section: Option<&str>| {
        let embedder = indexer.embedder().clone();
        let store = store.clone();
        let (text, patient, section) = (text.to_string(), patient.map(String::from), section.map(String::from));
        async move {
            let bm25 = clinstream::store::bm25::encoder(120.0).unwrap();
            let q = Query {
                dense: embedder.embed(&[text.as_str()]).await.unwrap().remove(0),
                sparse: clinstream::store::bm25::sparse_query(&bm25, &text),
                filters: clinstream::store::Filters {
                    patient,
                    sections: section.into_iter().collect(),
                    ..Default::default()
                },
                top: 3,
                fields: None,
                record: Record::Chunks,
                matched: Vec::new(),
            };
            store.search(&q).await.unwrap()
        }
    };
    let hits = search("shortness of breath and pneumonia", None, None).await;
    assert_eq!(hits[0].payload["doc_id"], "doc-b", "{hits:?}");
    let hits = search("cardiac ischemia with an elevated troponin", None, None).await;
    assert_eq!(hits[0].payload["doc_id"], "doc-a", "{hits:?}");
    // No query word is in the cardiac note (BM25 finds nothing): the dense vectors alone bring it up.
    let hits = search("heart attack", None, None).await;
    assert!(hits.iter().filter(|h| h.payload["doc_id"] == "doc-a").count() >= 2, "{hits:?}");
    // Filters: the patient filter wins over relevance; the section filter keeps only that section.
    let hits = search("shortness of breath and pneumonia", Some("Patient/p1"), None).await;
    assert!(!hits.is_empty() && hits.iter().all(|h| h.payload["patient"] == "Patient/p1"), "{hits:?}");
    let hits = search("antibiotics", None, Some("assessment_and_plan")).await;
    assert!(
        !hits.is_empty()
            && hits.iter().all(|h| h.payload["sections"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "assessment_and_plan"))
    );

    // The payload contract (ARCHITECTURE §4).
    let p = &search("pneumonia", Some("Patient/p2"), None).await[0].payload;
    for key in [
        "patient",
        "doc_id",
        "doc_version",
        "doc_date",
        "doc_type",
        "section",
        "section_weight",
        "chunk_index",
        "prev_chunk_id",
        "next_chunk_id",
        "text",
        "entity_kinds",
        "entity_terms",
        "vocabulary_version",
        "model",
    ] {
        assert!(p.contains_key(key), "payload lacks {key}: {p:?}");
    }
    assert_eq!(p["model"], "all-MiniLM-L6-v2");
    assert!(p["entity_terms"].as_array().unwrap().iter().any(|t| t.as_str().unwrap().contains("pneumonia")), "{p:?}");

    // A new version replaces the old one's points.
    index(note("doc-b", "2", "current", "Patient/p2", "PLAN: Pneumonia resolved; stop antibiotics.")).await;
    let hits = search("pneumonia", Some("Patient/p2"), None).await;
    assert!(!hits.is_empty() && hits.iter().all(|h| h.payload["doc_version"] == "2"), "{hits:?}");
    // entered-in-error removes every point of the document.
    let removed = index(note("doc-a", "2", "entered-in-error", "Patient/p1", CARDIAC)).await;
    assert_eq!(removed, 0);
    assert!(search("heart attack", Some("Patient/p1"), None).await.is_empty());
    // The work shows in the metrics (this process's registry).
    let body = clinstream::telemetry::metrics::metrics().render();
    let value = |prefix: &str| -> f64 {
        body.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
    };
    assert!(value("clinstream_embed_tokens_total ") > 0.0, "{body}");
    assert!(value("clinstream_qdrant_points_total{operation=\"upserted\"}") >= (n_cardiac + n_resp) as f64);
    assert!(value(&format!("clinstream_qdrant_upsert_duration_seconds_count{{store=\"{kind}\"}}")) >= 3.0, "{body}");
    drop(indexer);
}

/// Notes of one patient about different things, for RAPTOR's tree (several chunks each).
const TREE_NOTES: [&str; 5] = [
    CARDIAC,
    RESPIRATORY,
    "HISTORY OF PRESENT ILLNESS: Follow-up for type 2 diabetes mellitus. Hemoglobin A1c is 8.4 percent despite \
     metformin. She checks her glucose twice daily.\n\nASSESSMENT AND PLAN: Poorly controlled diabetes. Add \
     glipizide; diabetic foot examination and retinal screening ordered; dietitian referral.",
    "HISTORY OF PRESENT ILLNESS: Chest pain recurred on exertion two weeks after the myocardial infarction. \
     Troponin normal.\n\nASSESSMENT AND PLAN: Stable angina after infarction. Continue aspirin and the beta \
     blocker; add a statin and sublingual nitroglycerin; cardiac rehabilitation.",
    "HISTORY OF PRESENT ILLNESS: Cough has improved after the antibiotics for pneumonia; no fever.\n\nASSESSMENT \
     AND PLAN: Pneumonia resolving. Repeat chest x-ray in six weeks to confirm that the consolidation cleared.",
];

/// RAPTOR's tree with the embedded store: built as a patient's notes arrive, replaced whole, never another
/// patient's, left out of chunk searches, rebuilt without a retracted note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_keeps_each_patients_summary_tree() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    summary_trees(s).await;
}

/// The same against a real Qdrant server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_keeps_each_patients_summary_tree() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(mut s) = server_settings(dir.path(), &server) else { return };
    // Summaries stored by their members' mean vector here (no model call), by their text's embedding above.
    s.raptor.summary_vectors = "mean".into();
    summary_trees(s).await;
}

async fn summary_trees(mut s: Settings) {
    s.raptor.enabled = true;
    s.raptor.summary_tokens = 48;
    s.chunking.chunk_tokens = 32;
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Arc::new(Indexer::start(&s, pipeline.compiled()).await.unwrap());
    let store = indexer.store().clone();
    let index = |id: &str, version: &str, status: &str, patient: &str, text: &str| {
        let doc = Arc::new(pipeline.process(&note(id, version, status, patient, text)).unwrap());
        let indexer = Arc::clone(&indexer);
        async move { indexer.index(&doc).await.unwrap() }
    };
    let texts: std::collections::HashMap<String, &str> =
        TREE_NOTES.iter().enumerate().map(|(i, t)| (format!("t-{i}"), *t)).collect();
    // Patient 1's five notes all at once (their rebuilds meet in one lane), patient 2's one note beside them.
    let mut tasks: Vec<_> = TREE_NOTES
        .iter()
        .enumerate()
        .map(|(i, t)| tokio::spawn(index(&format!("t-{i}"), "1", "current", "Patient/t1", t)))
        .collect();
    tasks.push(tokio::spawn(index("u-0", "1", "current", "Patient/t2", RESPIRATORY)));
    for t in tasks {
        t.await.unwrap();
    }
    let p1 = Filters { patient: Some("Patient/t1".into()), ..Default::default() };
    let probe = indexer.embedder().embed(&["chest pain and pneumonia"]).await.unwrap().remove(0);
    let all = |record: Record, filters: Filters| {
        let (store, dense) = (store.clone(), probe.clone());
        async move {
            let q = Query {
                dense,
                sparse: Default::default(),
                filters,
                top: 500,
                fields: None,
                record,
                matched: Vec::new(),
            };
            store.search(&q).await.unwrap()
        }
    };
    let chunks = all(Record::Chunks, p1.clone()).await;
    let summaries = all(Record::Summaries, p1.clone()).await;
    assert!(chunks.len() >= 8, "{} chunks", chunks.len());
    assert!(!summaries.is_empty(), "no summary over {} chunks", chunks.len());
    assert_eq!(store.count_where(&p1, Record::Summaries).await.unwrap(), summaries.len());
    // Chunk searches never return a summary; the collapsed tree holds both.
    assert!(chunks.iter().all(|h| h.payload["record"] == "chunk"));
    assert_eq!(store.count_where(&p1, Record::Chunks).await.unwrap(), chunks.len());
    assert_eq!(all(Record::Tree, p1.clone()).await.len(), chunks.len() + summaries.len());
    let chunk_ids: std::collections::HashSet<&str> = chunks.iter().map(|h| h.id.as_str()).collect();
    let summary_ids: std::collections::HashSet<&str> = summaries.iter().map(|h| h.id.as_str()).collect();
    for h in &summaries {
        let p = &h.payload;
        assert_eq!(p["record"], "summary");
        assert_eq!(p["patient"], "Patient/t1");
        let level = p["level"].as_u64().unwrap();
        let children: Vec<&str> = p["children"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert!(children.len() >= 2, "{p:?}");
        let below = if level == 1 { &chunk_ids } else { &summary_ids };
        assert!(children.iter().all(|c| below.contains(c)), "level {level} children not in the level below");
        assert!(p["tokens"].as_u64().unwrap() <= 48);
        // Each line of the text is the sentence it cites, cut from its note.
        let sentences = p["sentences"].as_array().unwrap();
        let lines: Vec<&str> = p["text"].as_str().unwrap().lines().collect();
        assert_eq!(lines.len(), sentences.len());
        for (line, sentence) in lines.iter().zip(sentences) {
            let doc = sentence["doc_id"].as_str().unwrap();
            let (a, b) = (sentence["start"].as_u64().unwrap() as usize, sentence["end"].as_u64().unwrap() as usize);
            assert_eq!(*line, &texts[doc][a..b], "{doc} {a}..{b}");
        }
        assert!(p["doc_ids"].as_array().unwrap().iter().all(|d| texts.contains_key(d.as_str().unwrap())));
    }
    // With `summary_vectors = "text"` a summary is found by its own text (its vector is that text embedded, as the
    // paper does, once the background round has stored it); with `"mean"` its vector is its children's mean, which
    // no text embeds exactly.
    indexer.tree_work_settled().await;
    let text = summaries[0].payload["text"].as_str().unwrap().to_string();
    let own = indexer.embedder().embed(&[text.as_str()]).await.unwrap().remove(0);
    let q = Query {
        dense: own,
        sparse: Default::default(),
        filters: p1.clone(),
        top: 3,
        fields: None,
        record: Record::Summaries,
        matched: Vec::new(),
    };
    let found = store.search(&q).await.unwrap();
    if s.raptor.summary_vectors == "text" {
        assert!(found[0].score > 0.999, "{found:?}");
        assert!(found.iter().any(|h| h.id == summaries[0].id && h.score > 0.999), "{found:?}");
    } else {
        assert!(found.iter().all(|h| h.score < 0.999), "{found:?}");
    }
    // Patient 2's single chunk needs no summary, and no summary of patient 1 reaches them.
    let p2 = Filters { patient: Some("Patient/t2".into()), ..Default::default() };
    let p2_chunks = store.count_where(&p2, Record::Chunks).await.unwrap();
    let p2_summaries = all(Record::Summaries, p2.clone()).await;
    assert!(p2_summaries.iter().all(|h| h.payload["doc_ids"] == serde_json::json!(["u-0"])), "{p2_chunks} chunks");
    // The same notes again, one at a time: the same tree (ids are the clusters'), nothing added — so the
    // concurrent arrival above missed no note.
    for (i, t) in TREE_NOTES.iter().enumerate() {
        index(&format!("t-{i}"), "1", "current", "Patient/t1", t).await;
    }
    let mut again: Vec<String> = all(Record::Summaries, p1.clone()).await.into_iter().map(|h| h.id).collect();
    let mut before: Vec<String> = summaries.iter().map(|h| h.id.clone()).collect();
    again.sort();
    before.sort();
    assert_eq!(again, before);
    // A retracted note leaves the tree with it: no summary quotes it, none has its chunks as children.
    let retracted: Vec<String> = chunks.iter().filter(|h| h.payload["doc_id"] == "t-3").map(|h| h.id.clone()).collect();
    assert!(!retracted.is_empty());
    index("t-3", "2", "entered-in-error", "Patient/t1", TREE_NOTES[3]).await;
    let after = all(Record::Summaries, p1.clone()).await;
    assert!(!after.is_empty());
    for h in &after {
        assert!(!h.payload["doc_ids"].as_array().unwrap().iter().any(|d| d == "t-3"), "{:?}", h.payload["doc_ids"]);
        assert!(!h.payload["children"].as_array().unwrap().iter().any(|c| retracted.iter().any(|r| c == r)));
    }
    // The rebuilds are timed.
    let body = clinstream::telemetry::metrics::metrics().render();
    assert!(
        body.lines().any(|l| l.starts_with("clinstream_stage_duration_seconds_count{stage=\"tree\"}")
            && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v >= 1.0)),
        "{body}"
    );
}

/// Summary texts embedded off the acknowledgement path (`raptor.background_vectors`, the default), embedded store:
/// the rebuild stores every new summary with its members' mean vector and the pending flag and embeds nothing; the
/// background round then gives each the vector its text embeds to — the same vectors, ids and texts as a tree whose
/// summaries were embedded inside the rebuild — and a rebuild with nothing changed embeds and defers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_embeds_summary_texts_after_the_rebuild_as_the_rebuild_would() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let inline_dir = tempfile::tempdir().unwrap();
    let Some(mut inline) = settings(inline_dir.path()) else { return };
    inline.raptor.background_vectors = false;
    background_summary_vectors(s, inline).await;
}

/// The same against a real Qdrant server (two collections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_embeds_summary_texts_after_the_rebuild_as_the_rebuild_would() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(mut s) = server_settings(dir.path(), &server) else { return };
    let Some(mut inline) = server_settings(dir.path(), &server) else { return };
    // Two collections side by side: neither takes the alias.
    s.store.alias.clear();
    inline.store.alias.clear();
    inline.raptor.background_vectors = false;
    background_summary_vectors(s, inline).await;
}

async fn background_summary_vectors(mut s: Settings, mut inline: Settings) {
    for s in [&mut s, &mut inline] {
        // Rebuilt here, one call at a time, instead of after each note.
        s.raptor.enabled = false;
        s.raptor.summary_tokens = 48;
        s.chunking.chunk_tokens = 32;
        assert_eq!(s.raptor.summary_vectors, "text");
    }
    assert!(s.raptor.background_vectors, "the default");
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let tree = |s: Settings| {
        let pipeline = Arc::clone(&pipeline);
        async move {
            let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
            for (i, t) in TREE_NOTES.iter().enumerate() {
                let doc =
                    Arc::new(pipeline.process(&note(&format!("t-{i}"), "1", "current", "Patient/t1", t)).unwrap());
                indexer.index(&doc).await.unwrap();
            }
            let rebuild = indexer.rebuild_tree("Patient/t1").await.unwrap();
            (indexer, rebuild)
        }
    };
    let embedded = |body: &str| {
        common::metric_value(body, "clinstream_raptor_node_vectors_total{outcome=\"embedded\"}").unwrap_or(0.0)
    };
    let before = embedded(&clinstream::telemetry::metrics::metrics().render());
    let (indexer, rebuild) = tree(s).await;
    assert!(rebuild.written >= 1, "{rebuild:?}");
    assert_eq!((rebuild.embedded, rebuild.embedded_tokens, rebuild.deferred), (0, 0, rebuild.written), "{rebuild:?}");
    indexer.tree_work_settled().await;
    assert_eq!(indexer.tree_work_pending(), 0);
    let nodes = indexer.store().summaries("Patient/t1").await.unwrap();
    assert_eq!(nodes.len(), rebuild.written);
    let texts: Vec<&str> = nodes.values().map(|n| n.payload["text"].as_str().unwrap()).collect();
    let own = indexer.embedder().embed(&texts).await.unwrap();
    for (n, v) in nodes.values().zip(&own) {
        assert!(n.payload.get("vector_pending").is_none(), "{:?}", n.payload.get("level"));
        let cos: f32 = n.dense.iter().zip(v).map(|(a, b)| a * b).sum();
        assert!(cos > 0.999, "level {:?}: cosine {cos}", n.payload.get("level"));
    }
    let after = embedded(&clinstream::telemetry::metrics::metrics().render());
    assert!(after - before >= rebuild.written as f64, "{before} -> {after}");
    // Nothing changed: nothing embedded, nothing deferred, every vector kept.
    let again = indexer.rebuild_tree("Patient/t1").await.unwrap();
    assert_eq!((again.written, again.embedded, again.deferred), (rebuild.written, 0, 0), "{again:?}");
    assert_eq!(indexer.tree_work_pending(), 0);
    let kept = indexer.store().summaries("Patient/t1").await.unwrap();
    for (id, n) in &nodes {
        assert_eq!(kept[id].dense, n.dense);
        assert!(kept[id].payload.get("vector_pending").is_none());
    }
    // Embedded inside the rebuild instead: the same tree, the same vectors.
    let (other, inline_rebuild) = tree(inline).await;
    assert_eq!(
        (inline_rebuild.written, inline_rebuild.embedded, inline_rebuild.deferred),
        (rebuild.written, rebuild.written, 0)
    );
    let inline_nodes = other.store().summaries("Patient/t1").await.unwrap();
    let mut ids: Vec<&String> = nodes.keys().collect();
    let mut inline_ids: Vec<&String> = inline_nodes.keys().collect();
    ids.sort();
    inline_ids.sort();
    assert_eq!(ids, inline_ids);
    for (id, n) in &nodes {
        let m = &inline_nodes[id];
        assert_eq!(m.payload["text"], n.payload["text"]);
        let cos: f32 = n.dense.iter().zip(&m.dense).map(|(a, b)| a * b).sum();
        assert!(cos > 0.999, "{cos}");
    }
    for store in [indexer.store(), other.store()] {
        if let clinstream::store::Store::Server(server) = store.as_ref() {
            server.drop_collection().await.unwrap();
        }
    }
}

/// CPTF-compressed summaries (`raptor.compress`): a tree first built plain, then rebuilt by a worker with
/// compression on (the stored plain summaries are not reused), then off again. Compressed, each summary has the same
/// children, quotes at least as many sentences (more in all) within its tokens, keeps each cited sentence's words
/// in order, and is searched by its compressed text; a second rebuild keeps every summary as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_summaries_quote_more_within_their_tokens_and_keep_their_citations() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.raptor.enabled = true;
    s.raptor.summary_tokens = 48;
    s.chunking.chunk_tokens = 32;
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let texts: std::collections::HashMap<String, &str> =
        TREE_NOTES.iter().enumerate().map(|(i, t)| (format!("t-{i}"), *t)).collect();
    let p1 = Filters { patient: Some("Patient/t1".into()), ..Default::default() };
    let summaries = |indexer: Arc<Indexer>| {
        let p1 = p1.clone();
        async move {
            let dense = indexer.embedder().embed(&["chest pain"]).await.unwrap().remove(0);
            let q = Query {
                dense,
                sparse: Default::default(),
                filters: p1,
                top: 500,
                fields: None,
                record: Record::Summaries,
                matched: Vec::new(),
            };
            let mut hits = indexer.store().search(&q).await.unwrap();
            hits.sort_by(|a, b| a.id.cmp(&b.id));
            hits
        }
    };
    let cited = |p: &serde_json::Map<String, Value>| -> Vec<String> {
        p["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let (a, b) = (c["start"].as_u64().unwrap() as usize, c["end"].as_u64().unwrap() as usize);
                texts[c["doc_id"].as_str().unwrap()][a..b].to_string()
            })
            .collect()
    };
    // Built plain, note by note.
    let indexer = Arc::new(Indexer::start(&s, pipeline.compiled()).await.unwrap());
    for (i, t) in TREE_NOTES.iter().enumerate() {
        let doc = Arc::new(pipeline.process(&note(&format!("t-{i}"), "1", "current", "Patient/t1", t)).unwrap());
        indexer.index(&doc).await.unwrap();
    }
    let plain = summaries(Arc::clone(&indexer)).await;
    assert!(!plain.is_empty());
    // The summaries' vectors stored (embedded in the background) before the store is closed.
    indexer.tree_work_settled().await;
    indexer.store().flush().await.unwrap();
    drop(indexer);
    // Rebuilt with compression: every summary recomputed, none reused from the plain tree.
    s.raptor.compress = 0.5;
    let indexer = Arc::new(Indexer::start(&s, pipeline.compiled()).await.unwrap());
    indexer.rebuild_tree("Patient/t1").await.unwrap();
    let compressed = summaries(Arc::clone(&indexer)).await;
    let ids = |h: &[clinstream::store::Hit]| h.iter().map(|h| h.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&compressed), ids(&plain), "the same clusters");
    let (mut quoted_plain, mut quoted, mut shorter) = (0, 0, 0);
    for (c, p) in compressed.iter().zip(&plain) {
        let (c, p) = (&c.payload, &p.payload);
        assert_eq!(c["compressed"], true, "{c:?}");
        assert!(p.get("compressed").is_none());
        assert_eq!(c["children"], p["children"]);
        let lines: Vec<&str> = c["text"].as_str().unwrap().lines().collect();
        let n = lines.len();
        assert!(n >= p["sentences"].as_array().unwrap().len());
        assert!(c["tokens"].as_u64().unwrap() as usize <= 48 + n, "{c:?}");
        quoted += n;
        quoted_plain += p["sentences"].as_array().unwrap().len();
        // Each line keeps words of the sentence it cites, in their order.
        for (line, sentence) in lines.iter().zip(cited(c)) {
            let mut words = sentence.split_whitespace();
            assert!(line.split_whitespace().all(|w| words.any(|x| x == w)), "{line:?} is not cut from {sentence:?}");
            shorter += usize::from(line.len() < sentence.len());
        }
    }
    assert!(quoted > quoted_plain, "{quoted} sentences quoted compressed, {quoted_plain} plain");
    assert!(shorter > 0);
    // Searched by its compressed text (embedded in the background).
    indexer.tree_work_settled().await;
    let text = compressed[0].payload["text"].as_str().unwrap().to_string();
    let own = indexer.embedder().embed(&[text.as_str()]).await.unwrap().remove(0);
    let q = Query {
        dense: own,
        sparse: Default::default(),
        filters: p1.clone(),
        top: 1,
        fields: None,
        record: Record::Summaries,
        matched: Vec::new(),
    };
    let found = indexer.store().search(&q).await.unwrap();
    assert!(found[0].id == compressed[0].id && found[0].score > 0.999, "{found:?}");
    // Rebuilt again: every summary kept as it was.
    indexer.rebuild_tree("Patient/t1").await.unwrap();
    let again = summaries(Arc::clone(&indexer)).await;
    assert_eq!(
        again.iter().map(|h| (&h.id, &h.payload["text"], &h.payload["tokens"])).collect::<Vec<_>>(),
        compressed.iter().map(|h| (&h.id, &h.payload["text"], &h.payload["tokens"])).collect::<Vec<_>>()
    );
    // The summaries' vectors stored (embedded in the background) before the store is closed.
    indexer.tree_work_settled().await;
    indexer.store().flush().await.unwrap();
    drop(indexer);
    // Compression off again: the plain summaries come back.
    s.raptor.compress = 0.0;
    let indexer = Arc::new(Indexer::start(&s, pipeline.compiled()).await.unwrap());
    indexer.rebuild_tree("Patient/t1").await.unwrap();
    let back = summaries(Arc::clone(&indexer)).await;
    assert_eq!(
        back.iter().map(|h| (&h.id, &h.payload["text"])).collect::<Vec<_>>(),
        plain.iter().map(|h| (&h.id, &h.payload["text"])).collect::<Vec<_>>()
    );
    assert!(back.iter().all(|h| h.payload.get("compressed").is_none()));
}

/// A long run rewrites points (re-delivered or re-processed notes, new versions); the embedded engine runs no
/// optimizers itself, so the store's background maintenance (`store.maintain_every`) flushes and optimises, and
/// the data stays whole through it and after a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_maintenance_keeps_data_whole_while_points_are_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.store.maintain_every = 10;
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
    let store = indexer.store().clone();
    let before = clinstream::telemetry::metrics::metrics().store_maintenance_duration.get_sample_count();
    let mut expected = 0;
    for round in 0..12 {
        for (id, text) in [("doc-a", CARDIAC), ("doc-b", RESPIRATORY)] {
            let doc = Arc::new(pipeline.process(&note(id, "1", "current", "Patient/p1", text)).unwrap());
            let n = indexer.index(&doc).await.unwrap();
            if round == 0 {
                expected += n;
            }
        }
    }
    store.maintenance_idle().await;
    let runs = clinstream::telemetry::metrics::metrics().store_maintenance_duration.get_sample_count() - before;
    assert!(runs >= 2, "maintenance ran {runs} times over {} rewritten points", expected * 12);
    assert_eq!(store.count().await.unwrap(), expected, "rewrites replace, maintenance keeps every live point");
    store.flush().await.unwrap();
    drop(indexer);
    drop(store);
    let reopened = clinstream::store::Store::open_existing(&s.store).await.unwrap();
    assert_eq!(reopened.count().await.unwrap(), expected, "after a reopen");
}

/// Shards written evenly fall due for maintenance together; `store.maintain_concurrency` bounds how many are
/// maintained at once, the others wait their turn, and every shard is still maintained and its data whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_maintains_at_most_maintain_concurrency_shards_at_once() {
    let fixtures = root().join("tests/fixtures/mtsamples");
    let mut texts: Vec<String> =
        std::fs::read_dir(&fixtures).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect();
    texts.sort();
    for slots in [1usize, 2] {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut s) = settings(dir.path()) else { return };
        s.embed.execution_provider = "synthetic".into();
        s.embed.allow_synthetic = true;
        s.store.shards = 6;
        s.store.maintain_every = 10;
        s.store.index_threshold_kb = 1;
        s.store.maintain_concurrency = slots;
        let pipeline = Arc::new(Pipeline::new(&s).unwrap());
        let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
        let store = indexer.store().clone();
        let before = clinstream::telemetry::metrics::metrics().store_maintenance_duration.get_sample_count();
        let docs: Vec<_> = (0..60)
            .map(|i| {
                let text = &texts[i % texts.len()];
                Arc::new(
                    pipeline
                        .process(&note(&format!("doc-{i}"), "1", "current", &format!("Patient/{}", i % 7), text))
                        .unwrap(),
                )
            })
            .collect();
        let written: Vec<usize> = futures_util::future::join_all(docs.iter().map(|d| indexer.index(d)))
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        store.maintenance_idle().await;
        let runs = clinstream::telemetry::metrics::metrics().store_maintenance_duration.get_sample_count() - before;
        assert!(runs >= 6, "every shard was due and maintained: {runs} maintenances");
        let peak = store.maintenance_peak();
        assert!((1..=slots).contains(&peak), "{peak} shards maintained at once, at most {slots} allowed");
        assert_eq!(store.count().await.unwrap(), written.iter().sum::<usize>(), "every point kept");
    }
}

/// A file run ends its process without waiting out an index maintenance (`store.maintenance_wait_ms = 0`): the
/// maintenance is dropped as after a crash, and the store it leaves holds exactly what a run that waited for it
/// holds — the same chunk count and the same answers — after a reopen. Many small maintenances with HNSW graphs
/// (`maintain_every` 20, `index_threshold_kb` 1) make one likely to be running when the run ends; the verdict does
/// not depend on whether one was.
#[test]
fn a_file_run_exits_without_waiting_for_index_maintenance_and_leaves_its_store_whole() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let fixtures = root().join("tests/fixtures/mtsamples");
    let mut texts: Vec<String> =
        std::fs::read_dir(&fixtures).unwrap().map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap()).collect();
    texts.sort();
    let input = dir.path().join("notes.ndjson");
    let mut lines = Vec::new();
    for i in 0..240 {
        let text = &texts[i % texts.len()];
        lines.push(
            String::from_utf8(note(&format!("n-{i}"), "1", "current", &format!("Patient/{}", i % 17), text)).unwrap(),
        );
    }
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let run = |name: &str, wait_ms: &str| {
        let store = dir.path().join(name);
        let out = common::clinstream()
            .args(["run", "--no-progress", "--input", input.to_str().unwrap(), "--out"])
            .arg(dir.path().join(format!("out-{name}")))
            .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
            .env("CLINSTREAM__EMBED__EXECUTION_PROVIDER", "synthetic")
            .env("CLINSTREAM__EMBED__ALLOW_SYNTHETIC", "true")
            .env("CLINSTREAM__STORE__PATH", &store)
            .env("CLINSTREAM__STORE__MAINTAIN_EVERY", "20")
            .env("CLINSTREAM__STORE__INDEX_THRESHOLD_KB", "1")
            .env("CLINSTREAM__STORE__MAINTENANCE_WAIT_MS", wait_ms)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut settings = s.store.clone();
        settings.path = store.display().to_string();
        settings
    };
    let (waited, left) = (run("waited", "600000"), run("left", "0"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let waited = clinstream::store::Store::open_existing(&waited).await.unwrap();
        let left = clinstream::store::Store::open_existing(&left).await.unwrap();
        let n = waited.count().await.unwrap();
        assert!(n >= 240, "every note has chunks: {n}");
        assert_eq!(left.count().await.unwrap(), n, "the store left mid-maintenance holds every chunk");
        // The same nearest chunks within one patient (a small filtered set is searched exactly, HNSW or not).
        let norm = (0..384).map(|i| (((i * 7919) % 101) as f32 - 50.0).powi(2)).sum::<f32>().sqrt();
        let probe: Vec<f32> = (0..384).map(|i| (((i * 7919) % 101) as f32 - 50.0) / norm).collect();
        for patient in ["Patient/3", "Patient/11"] {
            let mut q = nearest(probe.clone(), 5);
            q.filters.patient = Some(patient.to_string());
            let ids = |hits: Vec<clinstream::store::Hit>| hits.into_iter().map(|h| h.id).collect::<Vec<_>>();
            let a = ids(waited.search(&q).await.unwrap());
            assert_eq!(a.len(), 5);
            assert_eq!(ids(left.search(&q).await.unwrap()), a, "the same answers from both stores");
        }
    });
}

/// `make run`'s job in miniature: `clinstream run` indexes examples/ into the embedded store, and a new process
/// (`clinstream search`) reopens it and finds the relevant note, with its payload, by query and by filters.
#[test]
fn run_then_search_round_trip_through_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let cmd = |args: &[&str]| {
        common::clinstream()
            .args(args)
            .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
            .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
            .env("CLINSTREAM__STORE__PATH", &s.store.path)
            .output()
            .unwrap()
    };
    let out = dir.path().join("out");
    let examples = root().join("examples");
    let run = cmd(&["run", "--no-progress", "--input", examples.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(3), "{}", String::from_utf8_lossy(&run.stderr));
    let search = cmd(&["search", "--query", "shortness of breath", "--json", "--top", "5"]);
    assert!(search.status.success(), "{}", String::from_utf8_lossy(&search.stderr));
    let hits: Vec<Value> =
        String::from_utf8(search.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(hits.len(), 5);
    let top = &hits[0]["payload"];
    assert!(top["text"].as_str().unwrap().to_lowercase().contains("shortness of breath"), "{top}");
    // Filtered: one patient's chunks only, and the text view prints doc id, section and a snippet.
    let patient = top["patient"].as_str().unwrap().to_string();
    let search = cmd(&["search", "--query", "cough", "--patient", &patient]);
    let text = String::from_utf8(search.stdout).unwrap();
    assert!(text.contains(&format!("patient {patient}")) && text.contains("section "), "{text}");
    let headers: Vec<&str> = text.lines().filter(|l| l.contains("  doc ") && l.contains("  chunk ")).collect();
    assert!(!headers.is_empty() && headers.iter().all(|l| l.ends_with(&format!("patient {patient}"))), "{text}");
    // Logs never carry note text.
    let logs = String::from_utf8_lossy(&run.stderr);
    assert!(!logs.to_lowercase().contains("shortness of breath"));
}

/// The server sink, against a real Qdrant when `QDRANT_URL` is set (no Qdrant server package exists in the
/// registries these machines reach): collection bootstrap, idempotent re-upsert, version replacement, search.
/// The server store reopens an existing collection (checking its dimension instead of recreating it), and a
/// re-upsert and a new version behave as in the embedded store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_reopens_checks_the_dimension_and_replaces_versions() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(s) = server_settings(dir.path(), &server) else { return };
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
    let store: Arc<Store> = indexer.store().clone();
    let doc = Arc::new(pipeline.process(&note("doc-b", "1", "current", "Patient/p2", RESPIRATORY)).unwrap());
    let n = indexer.index(&doc).await.unwrap();
    indexer.index(&doc).await.unwrap();
    assert_eq!(store.count().await.unwrap(), n, "re-upsert is idempotent");
    // Reopening checks the existing collection's dimension instead of recreating it.
    Store::open(&s.store, 384).await.unwrap();
    assert!(Store::open(&s.store, 768).await.is_err());
    let v2 =
        Arc::new(pipeline.process(&note("doc-b", "2", "current", "Patient/p2", "PLAN: pneumonia resolved.")).unwrap());
    let n2 = indexer.index(&v2).await.unwrap();
    assert_eq!(store.count().await.unwrap(), n2, "the old version's points are gone");
}

/// SEOS chunks of real notes (MTSamples fixtures), as snapshots: where the cuts fall, which sections, the overlap,
/// the tokens. Also checked with the real tokenizer: no chunk is over `chunking.chunk_tokens`, and chunks start
/// with exactly the configured overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seos_chunks_of_real_notes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    // The exact method: every sentence group embedded (the cheaper modes are compared with it below).
    s.chunking.seos_vectors = "groups".into();
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
    for name in ["1288-soap--chart--progress-notes", "13-neurology", "1506-radiology"] {
        let text = std::fs::read_to_string(root().join(format!("tests/fixtures/mtsamples/{name}.txt"))).unwrap();
        let doc = Arc::new(pipeline.analyse(clinstream::model::Note::from_text(name, text)));
        let chunks = indexer.chunker().chunk(&doc).await.unwrap().chunks;
        let mut out = String::new();
        for (i, c) in chunks.iter().enumerate() {
            let body = &doc.note.text[c.start..c.end];
            let real = indexer.embedder().count_tokens(body);
            assert!(real <= s.chunking.chunk_tokens, "{name} chunk {i}: {real} tokens");
            if i > 0 && chunks[i - 1].sections == c.sections {
                assert_eq!(c.overlap_units, s.chunking.overlap_sentences, "{name} chunk {i}");
            }
            let sections: Vec<&str> = c.sections.iter().map(|&k| doc.sections[k].name).collect();
            let head: String = body.chars().take(50).collect();
            out.push_str(&format!(
                "{i:>2} {:<40} overlap {} tokens {:>3}  {}\n",
                sections.join(","),
                c.overlap_units,
                c.tokens,
                head.replace('\n', " ")
            ));
        }
        insta::with_settings!({snapshot_suffix => name, prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!("seos", out);
        });
    }
}

/// The cheaper SEOS modes on real notes: every sentence is embedded once (`sentences` then embeds the chunks,
/// `composed` composes them too), the model sees far fewer tokens than with the exact method, the plans keep every
/// planner invariant with the real tokenizer, most cuts fall where the exact method puts them, and a composed
/// chunk vector points where the embedded one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cheaper_seos_modes_agree_with_the_exact_method() {
    let dir = tempfile::tempdir().unwrap();
    let Some(base) = settings(dir.path()) else { return };
    let pipeline = Arc::new(Pipeline::new(&base).unwrap());
    let chunker = |mode: &str| {
        let mut s = base.clone();
        s.chunking.seos_vectors = mode.into();
        let embedder = Embedder::start(&s.embed).unwrap();
        clinstream::index::Chunker::new(&s, embedder, pipeline.compiled()).unwrap()
    };
    let (exact, sentences, composed) = (chunker("groups"), chunker("sentences"), chunker("composed"));
    let (mut cuts_exact, mut cuts_shared, mut note_tokens, mut unit_count) = (0usize, 0usize, 0usize, 0usize);
    let mut spent = [0usize; 3];
    let mut cosines = Vec::new();
    for name in ["1288-soap--chart--progress-notes", "13-neurology", "1506-radiology", "175-surgery", "19-urology"] {
        let text = std::fs::read_to_string(root().join(format!("tests/fixtures/mtsamples/{name}.txt"))).unwrap();
        let doc = Arc::new(pipeline.analyse(clinstream::model::Note::from_text(name, text)));
        let units = exact.units(&doc);
        note_tokens += units.iter().map(|u| u.tokens).sum::<usize>();
        unit_count += units.len();
        let e = exact.chunk(&doc).await.unwrap();
        let st = sentences.chunk(&doc).await.unwrap();
        let c = composed.chunk(&doc).await.unwrap();
        for (i, x) in [&e, &st, &c].iter().enumerate() {
            spent[i] += x.embedded_tokens;
            assert_eq!(x.chunks.len(), x.vectors.len());
            for ch in &x.chunks {
                assert!(ch.tokens <= base.chunking.chunk_tokens, "{name}: {} tokens", ch.tokens);
            }
            let own: Vec<usize> =
                x.chunks.iter().flat_map(|ch| ch.units.start + ch.overlap_units..ch.units.end).collect();
            assert_eq!(own, (0..units.len()).collect::<Vec<_>>(), "{name}: every unit once, in order");
        }
        // Same plan for `sentences` and `composed` (both take the shifts from composed groups).
        assert_eq!(st.chunks, c.chunks, "{name}");
        let starts = |x: &clinstream::index::Chunked| -> Vec<usize> {
            x.chunks.iter().map(|ch| ch.units.start + ch.overlap_units).collect()
        };
        let (a, b) = (starts(&e), starts(&st));
        cuts_exact += a.len();
        cuts_shared += a.iter().filter(|x| b.contains(x)).count();
        // `sentences` embeds the same chunk texts as the exact method where the plans agree.
        for (ch, v) in c.chunks.iter().zip(&c.vectors) {
            if let Some(k) = e.chunks.iter().position(|x| x.units == ch.units) {
                let dot: f32 = v.iter().zip(&e.vectors[k]).map(|(x, y)| x * y).sum();
                cosines.push(dot);
            }
        }
    }
    assert!(note_tokens > 1_000, "the fixtures are real notes");
    // Exact: about three model tokens per note token for the groups plus one for the chunks.
    assert!(spent[0] as f64 > 3.0 * note_tokens as f64, "{spent:?} vs {note_tokens}");
    // Composed: each unit's tokens once, plus the model's special tokens per unit.
    let special = exact.embedder().info().special_tokens;
    assert!(
        spent[2] >= note_tokens && spent[2] <= note_tokens + unit_count * special + note_tokens / 50,
        "composed: {} model tokens for {note_tokens} note tokens in {unit_count} units",
        spent[2]
    );
    // Sentences: the sentences once plus the chunks — well under the exact method's groups plus chunks.
    assert!(spent[1] > spent[2] && (spent[1] as f64) < 0.65 * spent[0] as f64, "{spent:?}");
    assert!((spent[2] as f64) < 0.35 * spent[0] as f64, "{spent:?}");
    let agreement = cuts_shared as f64 / cuts_exact as f64;
    assert!(agreement >= 0.6, "chunk starts shared with the exact plan: {agreement:.3}");
    let mean = cosines.iter().sum::<f32>() / cosines.len().max(1) as f32;
    assert!(!cosines.is_empty() && mean > 0.85, "composed vs embedded chunk vectors: mean cosine {mean:.3}");
}

/// Production collection settings from config reach the collection the worker creates (shards, HNSW, int8
/// quantization), the reader alias is created and read through, and an existing collection of another shape
/// (distance, missing sparse vector) is refused with a clear error — the worker stops at start-up (checked with
/// `clinstream run` too) instead of writing into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_collections_get_the_configured_settings_and_a_foreign_shape_is_refused() {
    use qdrant_client::qdrant::{
        CreateCollectionBuilder, Distance, SparseVectorParamsBuilder, SparseVectorsConfigBuilder, VectorParamsBuilder,
        VectorsConfigBuilder,
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(mut s) = server_settings(dir.path(), &server) else { return };
    s.store.shards = 2;
    s.store.quantization = "int8".into();
    s.store.hnsw_m = 32;
    s.store.hnsw_ef_construct = 200;
    s.store.alias = common::qdrant::unique_collection("alias");
    Store::open(&s.store, 384).await.unwrap();
    let mut client = qdrant_client::Qdrant::from_url(&server.url);
    if !server.api_key.is_empty() {
        client = client.api_key(server.api_key.clone());
    }
    let client = client.build().unwrap();
    let config = client.collection_info(&s.store.collection).await.unwrap().result.unwrap().config.unwrap();
    let params = config.params.unwrap();
    assert_eq!(params.shard_number, 2);
    let hnsw = config.hnsw_config.unwrap();
    assert_eq!((hnsw.m, hnsw.ef_construct), (Some(32), Some(200)));
    let dense = match params.vectors_config.unwrap().config.unwrap() {
        qdrant_client::qdrant::vectors_config::Config::ParamsMap(m) => m.map["dense"],
        other => panic!("{other:?}"),
    };
    assert!(dense.quantization_config.is_some(), "int8 quantization configured on the dense vector");
    let aliases = client.list_aliases().await.unwrap().aliases;
    assert!(aliases.iter().any(|a| a.alias_name == s.store.alias && a.collection_name == s.store.collection));
    // A reader goes through the alias.
    let reader = Store::open_existing(&s.store).await.unwrap();
    assert_eq!(reader.count().await.unwrap(), 0);
    // Hybrid search on the int8 collection (dense prefetch rescored with oversampling) finds what was written.
    let writer = Store::open(&s.store, 384).await.unwrap();
    let points: Vec<_> = (0..8)
        .map(|i| clinstream::store::Point {
            id: clinstream::store::point_id("q8", "1", i),
            dense: (0..384).map(|d| ((d * (i + 1)) % 7) as f32 - 3.0).collect(),
            sparse: Default::default(),
            payload: serde_json::json!({"doc_id": format!("q8-{i}")}).as_object().unwrap().clone(),
        })
        .collect();
    writer.upsert(points.clone()).await.unwrap();
    let hits = reader.search(&nearest(points[5].dense.clone(), 1)).await.unwrap();
    assert_eq!(hits.first().map(|h| h.payload["doc_id"].clone()), Some(Value::from("q8-5")), "{hits:?}");

    // Collections of another shape.
    let euclid = common::qdrant::unique_collection("euclid");
    let mut vectors = VectorsConfigBuilder::default();
    vectors.add_named_vector_params("dense", VectorParamsBuilder::new(384, Distance::Euclid));
    let mut sparse = SparseVectorsConfigBuilder::default();
    sparse.add_named_vector_params("bm25", SparseVectorParamsBuilder::default());
    client
        .create_collection(CreateCollectionBuilder::new(&euclid).vectors_config(vectors).sparse_vectors_config(sparse))
        .await
        .unwrap();
    let no_sparse = common::qdrant::unique_collection("nosparse");
    let mut vectors = VectorsConfigBuilder::default();
    vectors.add_named_vector_params("dense", VectorParamsBuilder::new(384, Distance::Cosine));
    client.create_collection(CreateCollectionBuilder::new(&no_sparse).vectors_config(vectors)).await.unwrap();
    for (collection, why) in [(&euclid, "with Euclid distance"), (&no_sparse, "has no `bm25` sparse vector")] {
        let mut other = s.store.clone();
        other.collection = collection.clone();
        other.alias = String::new();
        let e = Store::open(&other, 384).await.unwrap_err().to_string();
        assert!(e.contains(why) && e.contains(collection.as_str()), "{e}");
    }
    // The worker stops at start-up, before reading anything.
    let o = common::clinstream()
        .args(["run", "--input", "examples", "--out"])
        .arg(dir.path().join("out"))
        .current_dir(root())
        .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
        .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
        .env("CLINSTREAM__STORE__KIND", "qdrant")
        .env("CLINSTREAM__STORE__URL", &server.url)
        .env("CLINSTREAM__STORE__API_KEY", &server.api_key)
        .env("CLINSTREAM__STORE__COLLECTION", &euclid)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("with Euclid distance") && stderr.contains("store_failed"), "{stderr}");
    assert!(!dir.path().join("out/notes.ndjson").exists(), "nothing was processed");
}

/// A server that requires an API key: the worker's key opens it; a wrong key is a clear, non-retried error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_with_an_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = common::qdrant::QdrantServer::start_with(&[("QDRANT__SERVICE__API_KEY", "k-123")]) else {
        return;
    };
    server.api_key = "k-123".into();
    let Some(mut s) = server_settings(dir.path(), &server) else { return };
    Store::open(&s.store, 384).await.unwrap();
    s.store.api_key = clinstream::config::Secret::new("wrong");
    let e = Store::open(&s.store, 384).await.unwrap_err();
    assert!(!e.is_transient(), "a refused key is not retried: {e}");
    assert!(e.to_string().contains("Unauthenticated") || e.to_string().contains("PermissionDenied"), "{e}");
    assert!(!e.to_string().contains("wrong"), "the key is never in messages: {e}");
}

/// Peak resident memory of a process while it runs (kB), sampled from /proc every 50 ms.
fn peak_rss_kb(child: &mut std::process::Child) -> u64 {
    let mut peak = 0;
    while matches!(child.try_wait(), Ok(None)) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        peak = peak.max(rss);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    peak
}

/// A slow store: the worker reaches the Qdrant server through a proxy that holds every chunk 20 ms, stalls all
/// traffic for 500 ms of every 2 s and holds every 40th chunk for 500 ms, past the 250 ms store timeout, so calls
/// time out (the count-based stall makes sure of it on a loaded machine, where calls can miss the windows; a
/// loaded run once did). Every note is still written (timeouts are retried, never dead-lettered), the store holds
/// the same points as a run without the proxy, and backpressure keeps the peak memory within a margin of that
/// run's (the in-flight budget and the bounded channel, not the input size).
#[test]
fn a_slow_store_slows_the_worker_without_dead_letters_or_unbounded_memory() {
    slow_store(3);
}

/// The slow store at `make chaos` size: 24 real notes 40 times over (960 events, several minutes behind the
/// stalling proxy).
#[test]
#[ignore = "full size: make chaos"]
fn chaos_slow_store_at_length() {
    slow_store(40);
}

/// 24 real notes, `rounds` times over under other ids, through the stalling proxy and directly.
fn slow_store(rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start_with(&[("QDRANT__LOG_LEVEL", "WARN")]) else { return };
    let Some(s) = settings(dir.path()) else { return };
    let mut events = String::new();
    let fixtures = root().join("tests/fixtures/mtsamples");
    let mut names: Vec<_> = std::fs::read_dir(&fixtures).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    let mut n = 0u64;
    for round in 0..rounds {
        for (i, path) in names.iter().filter(|p| p.extension().is_some_and(|e| e == "txt")).enumerate() {
            let text = std::fs::read_to_string(path).unwrap();
            let bytes = note(&format!("slow-{round}-{i}"), "1", "current", &format!("Patient/p{i}"), &text);
            events.push_str(std::str::from_utf8(&bytes).unwrap());
            events.push('\n');
            n += 1;
        }
    }
    let input = dir.path().join("events.ndjson");
    std::fs::write(&input, &events).unwrap();
    let run = |tag: &str, port: u16, timeout_ms: &str| {
        let collection = common::qdrant::unique_collection(tag);
        let mut child = common::clinstream()
            .args(["run", "--no-progress", "--input"])
            .arg(&input)
            .arg("--out")
            .arg(dir.path().join(tag))
            .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
            .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
            .env("CLINSTREAM__CHUNKING__STRATEGY", "fixed")
            .env("CLINSTREAM__STORE__KIND", "qdrant")
            .env("CLINSTREAM__STORE__URL", format!("http://127.0.0.1:{port}"))
            .env("CLINSTREAM__STORE__COLLECTION", &collection)
            .env("CLINSTREAM__STORE__TIMEOUT_MS", timeout_ms)
            .env("CLINSTREAM__STORE__UPSERT_BATCH", "16")
            .env("CLINSTREAM__PIPELINE__IN_FLIGHT", "8")
            .env("CLINSTREAM__PIPELINE__SOURCE_CHANNEL", "4")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join(format!("{tag}.log"))).unwrap())
            .spawn()
            .unwrap();
        let peak = peak_rss_kb(&mut child);
        let out = child.wait_with_output().unwrap();
        let log = std::fs::read_to_string(dir.path().join(format!("{tag}.log"))).unwrap();
        assert_eq!(out.status.code(), Some(0), "{tag}: {}\n{log}", String::from_utf8_lossy(&out.stdout));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut store_settings = s.store.clone();
        store_settings.kind = "qdrant".into();
        store_settings.url = server.url.clone();
        store_settings.collection = collection;
        let points = rt.block_on(async { Store::open_existing(&store_settings).await.unwrap().count().await.unwrap() });
        (peak, points, String::from_utf8_lossy(&out.stdout).into_owned(), log)
    };
    let clock = std::time::Instant::now();
    let (fast_peak, fast_points, fast_summary, _) = run("direct", server.grpc_port, "10000");
    let direct_s = clock.elapsed().as_secs_f64();
    let ms = std::time::Duration::from_millis;
    let proxy = common::proxy::SlowProxy::start_with_stalls(server.grpc_port, ms(20), ms(2000), ms(500));
    let clock = std::time::Instant::now();
    let (slow_peak, slow_points, slow_summary, slow_log) = run("slow", proxy.port, "250");
    let slow_s = clock.elapsed().as_secs_f64();
    eprintln!(
        "peak RSS direct {fast_peak} kB, through the slow proxy {slow_peak} kB; points {fast_points}/{slow_points}"
    );
    let count = |summary: &str, label: &str| -> Option<u64> {
        summary.lines().find_map(|l| l.trim().strip_prefix(label)?.trim().parse().ok())
    };
    for summary in [&fast_summary, &slow_summary] {
        assert_eq!(count(summary, "documents written"), Some(n), "{summary}");
        assert_eq!(count(summary, "dead-lettered"), Some(0), "{summary}");
    }
    assert_eq!(slow_points, fast_points, "the same points through the slow store");
    assert!(slow_log.contains("Vector store unavailable"), "the short timeout was hit and retried:\n{slow_log}");
    assert!(proxy.forwarded.load(std::sync::atomic::Ordering::SeqCst) > 0);
    assert!(slow_peak < fast_peak + fast_peak / 2, "memory grew with the slow store: {fast_peak} -> {slow_peak} kB");
    let retried = slow_log.matches("Vector store unavailable").count();
    println!(
        "FIGURES slow store: {n} events through a proxy holding each chunk 20 ms, stalling 500 ms of every 2 s and \
         every 40th chunk \
         (store timeout 250 ms): {n} written, 0 dead letters, {retried} timed-out store calls retried, points \
         {slow_points} = direct {fast_points}, peak RSS {slow_peak} kB vs {fast_peak} kB direct, {slow_s:.0} s vs \
         {direct_s:.0} s direct"
    );
}

/// A private CA and a server certificate for 127.0.0.1 signed by it (openssl, as an operator would make them).
fn private_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl is needed for the TLS test (Debian: apt-get install openssl)");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=clinstream test CA"];
    run(&[&["req", "-x509"][..], &ec, &ca].concat());
    run(&[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]].concat());
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

/// TLS to the server: Qdrant serving TLS with a certificate from a private CA. The worker writes over
/// `https://` when the CA is trusted (`SSL_CERT_FILE`, as the platform's trust store is extended in a pod), and
/// `clinstream search` reads the notes back over it; with the CA not trusted the worker does not talk to the
/// server at all: it retries the connection (a transient store failure) and stops after `store.halt_after_ms`
/// with `store_unavailable`, before consuming anything.
#[test]
fn server_store_over_tls_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = private_ca(dir.path());
    let (cert, key) = (cert.to_str().unwrap().to_string(), key.to_str().unwrap().to_string());
    let Some(server) = common::qdrant::QdrantServer::start_with(&[
        ("QDRANT__SERVICE__ENABLE_TLS", "true"),
        ("QDRANT__TLS__CERT", &cert),
        ("QDRANT__TLS__KEY", &key),
    ]) else {
        return;
    };
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let Some(s) = settings(dir.path()) else { return };
    let mut events = Vec::new();
    for i in 0..3 {
        events.extend(note(&format!("tls-{i}"), "1", "current", "Patient/tls", "ASSESSMENT: Pneumonia, improving."));
        events.push(b'\n');
    }
    let input = dir.path().join("events.ndjson");
    std::fs::write(&input, &events).unwrap();
    let collection = common::qdrant::unique_collection("tls");
    let worker = |tag: &str, trust: Option<&Path>| {
        let mut cmd = common::clinstream();
        cmd.args(["run", "--no-progress", "--input"])
            .arg(&input)
            .arg("--out")
            .arg(dir.path().join(tag))
            .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
            .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
            .env("CLINSTREAM__STORE__KIND", "qdrant")
            .env("CLINSTREAM__STORE__URL", &server.url)
            .env("CLINSTREAM__STORE__COLLECTION", &collection)
            .env("CLINSTREAM__STORE__HALT_AFTER_MS", "3000")
            .env("SSL_CERT_DIR", dir.path().join("no-certs"));
        match trust {
            Some(ca) => cmd.env("SSL_CERT_FILE", ca),
            None => cmd.env("SSL_CERT_FILE", dir.path().join("no-such-ca.pem")),
        };
        cmd.output().unwrap()
    };
    let untrusted = worker("untrusted", None);
    let log = String::from_utf8_lossy(&untrusted.stderr);
    assert_eq!(untrusted.status.code(), Some(1), "an untrusted server stops the worker:\n{log}");
    assert!(log.contains("store_unavailable"), "{log}");
    let consumed = std::fs::read_to_string(dir.path().join("untrusted/notes.ndjson")).unwrap_or_default();
    assert!(consumed.is_empty(), "nothing is consumed before the store is reachable");

    let trusted = worker("trusted", Some(&ca));
    let stdout = String::from_utf8_lossy(&trusted.stdout);
    assert_eq!(trusted.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&trusted.stderr));
    let written = stdout.lines().find_map(|l| l.trim().strip_prefix("documents written")?.trim().parse::<u64>().ok());
    assert_eq!(written, Some(3), "{stdout}");
    let search = common::clinstream()
        .args(["search", "--query", "pneumonia", "--patient", "Patient/tls", "--json", "-k", "10"])
        .env("CLINSTREAM__EMBED__MODEL_DIR", &s.embed.model_dir)
        .env("CLINSTREAM__EMBED__ORT_LIBRARY", &s.embed.ort_library)
        .env("CLINSTREAM__STORE__KIND", "qdrant")
        .env("CLINSTREAM__STORE__URL", &server.url)
        .env("CLINSTREAM__STORE__COLLECTION", &collection)
        .env("SSL_CERT_FILE", &ca)
        .output()
        .unwrap();
    let hits = String::from_utf8_lossy(&search.stdout);
    assert!(search.status.success(), "{}", String::from_utf8_lossy(&search.stderr));
    let mut docs: Vec<String> = hits
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["payload"]["doc_id"].as_str().unwrap().to_string())
        .collect();
    docs.sort();
    docs.dedup();
    assert_eq!(docs, ["tls-0", "tls-1", "tls-2"], "read back over TLS");
}

/// `eval qa` on a small self-written set in the development set's format: two patients, each with a chest X-ray
/// report among other notes, questions worded like a user would (one names the finding, one does not). Every
/// strategy keeps to the budget and to the patient's own notes; CLEAR finds the evidence and answers from it; the
/// label embeddings are cached and the cache is reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_qa_on_a_small_record_set() {
    use base64::Engine as _;
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let doc = |id: &str, patient: &str, date: &str, text: &str| {
        serde_json::json!({
            "resourceType": "DocumentReference", "id": id, "status": "current", "date": date,
            "subject": {"reference": format!("Patient/{patient}")},
            "content": [{"attachment": {"contentType": "text/plain",
                "data": base64::engine::general_purpose::STANDARD.encode(text)}}]
        })
        .to_string()
    };
    let filler = "HISTORY OF PRESENT ILLNESS: The patient presents for follow-up of knee pain after a fall. \
                  PLAN: Physical therapy twice weekly, ibuprofen as needed.";
    let docs = [
        doc("a-1", "a", "2019-01-02", filler),
        doc(
            "a-cxr",
            "a",
            "2019-02-03",
            "FINDINGS: The heart is normal in size. Small right pleural effusion. \
             No pneumothorax.\nIMPRESSION: Small right pleural effusion.",
        ),
        doc("b-1", "b", "2019-03-04", filler),
        doc(
            "b-cxr",
            "b",
            "2019-04-05",
            "FINDINGS: Heart size is enlarged. The lungs are clear. No pleural \
             effusion.\nIMPRESSION: Cardiomegaly. No acute pulmonary disease.",
        ),
    ];
    let question = |patient: &str, q: &str, answer: &str, evidence: &[&str]| {
        serde_json::json!({"patient": patient, "question": q, "variable": "v", "answer": answer,
            "needle_doc_id": "", "evidence": evidence})
        .to_string()
    };
    let questions = [
        question("qd-a", "Is there a pleural effusion?", "yes", &["Small right pleural effusion."]),
        question("qd-a", "Does the chest film show an effusion?", "yes", &["Small right pleural effusion."]),
        question("qd-b", "Is there a pleural effusion?", "no", &["No pleural effusion."]),
        question("qd-b", "Does the patient have cardiomegaly?", "yes", &["Cardiomegaly."]),
        question("qd-a", "Does the patient have cardiomegaly?", "no", &[]),
    ];
    let (documents, questions_path) = (dir.path().join("documents.ndjson"), dir.path().join("questions.jsonl"));
    std::fs::write(&documents, docs.join("\n")).unwrap();
    // Questions name the patient by bare id with the set's prefix: map to the ids used above.
    std::fs::write(&questions_path, questions.join("\n").replace("qd-a", "a").replace("qd-b", "b")).unwrap();
    let pipeline = Pipeline::new(&s).unwrap();
    let embedder = Embedder::start_async(&s.embed).await.unwrap();
    let strategies: Vec<String> =
        ["clear", "clear-windows", "dense", "bm25", "hybrid", "hybrid-rrf", "tree", "tree+hybrid", "tree+cptf"]
            .map(String::from)
            .to_vec();
    // `tree+cptf`: the summaries compressed by the token-importance model, as `raptor.compress` does.
    let importance = clinstream::embed::importance::Importance::load(&s.embed, &s.serve.compress_model_file).unwrap();
    let cache = dir.path().join("cache");
    let run = clinstream::eval::qa::QaRun {
        documents: &documents,
        questions: &questions_path,
        budget_tokens: 64,
        window_words: 150,
        strategies: &strategies,
        label_cache: &cache,
        show_errors: false,
        chunker: None,
        fusion: clinstream::store::Fusion::of(&s.store),
        bm25_avg_len: s.store.bm25_avg_len,
        match_concepts: s.serve.match_concepts,
        summaries: None,
        llm: None,
        sample: 1,
        importance: Some(&importance),
        tree: (&s.raptor).into(),
    };
    let r = clinstream::eval::qa::run(&pipeline, &embedder, &run).await.unwrap();
    assert_eq!((r.documents, r.patients), (4, 2));
    assert_eq!(r.strategies.len(), strategies.len());
    for st in &r.strategies {
        assert_eq!(st.questions, 5);
        assert_eq!(st.with_evidence, 4);
        assert_eq!(st.isolation_violations, 0, "{st:?}");
        assert!(st.max_tokens <= 64 && st.over_budget == 0, "{st:?}");
    }
    // Ranked figures for the chunk strategies only, each a share, Hit@k growing with k; MRR within Hit@1..Hit@10.
    for st in &r.strategies {
        if st.strategy.starts_with("clear") {
            assert!(st.hit_at_1.is_none() && st.mrr.is_none(), "{st:?}");
            continue;
        }
        let (h1, h5, h10, mrr) = (st.hit_at_1.unwrap(), st.hit_at_5.unwrap(), st.hit_at_10.unwrap(), st.mrr.unwrap());
        assert!((0.0..=1.0).contains(&h1) && h1 <= h5 && h5 <= h10 && h10 <= 1.0, "{st:?}");
        assert!(mrr >= h1 && mrr <= 1.0, "{st:?}");
    }
    let dense = r.strategies.iter().find(|st| st.strategy == "dense").unwrap();
    assert_eq!(dense.hit_at_10, Some(1.0), "the evidence is among these short notes' few chunks: {dense:?}");
    let clear = &r.strategies[0];
    assert_eq!(clear.strategy, "clear");
    assert_eq!(clear.unaligned, 0);
    assert_eq!(clear.evidence_recall, 1.0, "{clear:?}");
    assert_eq!(clear.answer_accuracy, 1.0, "{clear:?}");
    let windows = &r.strategies[1];
    assert_eq!(windows.strategy, "clear-windows");
    assert_eq!((windows.evidence_recall, windows.answer_accuracy), (1.0, 1.0), "{windows:?}");
    assert!(windows.mean_tokens < r.strategies[2].mean_tokens, "entity windows are smaller than chunks: {r:?}");
    // The fill adds chunks in what the windows left of the budget; the answers stay the windows'.
    assert!(clear.mean_tokens > windows.mean_tokens, "{r:?}");
    // The label embeddings were cached, and a second run reads them instead of embedding again.
    let files: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let written = std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    // Again with the indexer's own chunks (`--chunks index`, composed SEOS vectors): the chunk strategies keep
    // isolation and the budget, and find the evidence in these short notes.
    let mut composed = s.clone();
    composed.chunking.seos_vectors = "composed".into();
    let chunker = clinstream::index::Chunker::new(&composed, embedder.clone(), pipeline.compiled()).unwrap();
    let again = clinstream::eval::qa::run(
        &pipeline,
        &embedder,
        &clinstream::eval::qa::QaRun { chunker: Some(&chunker), ..run.clone() },
    )
    .await
    .unwrap();
    assert_eq!(std::fs::metadata(&files[0]).unwrap().modified().unwrap(), written);
    assert_eq!(again.strategies[0].answer_accuracy, 1.0);
    for st in &again.strategies[1..] {
        assert_eq!(st.isolation_violations, 0, "{st:?}");
        assert!(st.max_tokens <= 64 && st.over_budget == 0, "{st:?}");
    }
    assert_eq!(again.strategies[2].evidence_recall, 1.0, "dense over index chunks: {:?}", again.strategies[2]);

    // Multi-note questions: a patient whose three notes affirm one medication gets a question whose evidence is
    // one sentence of each; patient a (whose notes share only common words) gets none. With room for the whole
    // record, every strategy reaches all three notes.
    let med = |id: &str, date: &str, text: &str| doc(id, "c", date, text);
    let multi_docs = [
        docs[0].clone(),
        docs[1].clone(),
        med("c-1", "2020-01-01", "PLAN: Started metformin 500 mg twice daily for diabetes."),
        med("c-2", "2020-02-01", "ASSESSMENT: Tolerating metformin without nausea. Walks daily."),
        med("c-3", "2020-03-01", "PLAN: Increase metformin to 1000 mg twice daily. Recheck in three months."),
    ];
    let multi_documents = dir.path().join("multi.ndjson");
    std::fs::write(&multi_documents, multi_docs.join("\n")).unwrap();
    let multi = clinstream::eval::qa::multi_note_questions(&pipeline, &multi_documents, 1, 0.9).unwrap();
    let for_c: Vec<&Value> = multi.iter().filter(|q| q["patient"] == "c").collect();
    assert_eq!(for_c.len(), 1, "{multi:?}");
    assert!(multi.iter().all(|q| q["patient"] != "a"), "{multi:?}");
    let q = for_c[0];
    assert!(q["question"].as_str().unwrap().to_lowercase().contains("metformin"), "{q}");
    assert_eq!(q["evidence_doc_ids"], serde_json::json!(["c-1", "c-2", "c-3"]));
    assert_eq!(q["evidence"].as_array().unwrap().len(), 3);
    let multi_questions = dir.path().join("multi.jsonl");
    std::fs::write(&multi_questions, multi.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")).unwrap();
    let wide = clinstream::eval::qa::run(
        &pipeline,
        &embedder,
        &clinstream::eval::qa::QaRun {
            documents: &multi_documents,
            questions: &multi_questions,
            budget_tokens: 1024,
            ..run.clone()
        },
    )
    .await
    .unwrap();
    for st in &wide.strategies {
        if st.strategy == "clear-windows" {
            continue;
        }
        assert_eq!(st.evidence_notes, Some(1.0), "{st:?}");
    }
}

/// Writes through the store writer as the indexer makes them, many documents at once: grouped on a server (small
/// groups, several at once), one document at a time on the embedded store. Whatever the grouping, each document
/// ends with exactly its last write's points — older versions gone, a rewrite with fewer chunks leaves none behind,
/// and two writes of one document apply in the order they were asked.
async fn grouped_writes_keep_exactly_each_documents_last_points(s: Settings, expect_groups: bool) {
    use clinstream::store::{Point, Writer, point_id, window_id};
    let store = Arc::new(Store::open(&s.store, 384).await.unwrap());
    let writer = Writer::start(store.clone(), 24, 4);
    let doc_points = |doc: usize, version: &str, chunks: usize| -> Vec<Point> {
        let doc_id = format!("w{doc}");
        let payload = |record: &str| {
            serde_json::json!({"doc_id": doc_id, "doc_version": version, "patient": format!("Patient/w{doc}"),
                               "record": record})
            .as_object()
            .unwrap()
            .clone()
        };
        let mut points: Vec<Point> = (0..chunks)
            .map(|i| Point {
                id: point_id(&doc_id, version, i),
                dense: (0..384).map(|d| ((d + doc * 7 + i) % 11) as f32 - 5.0).collect(),
                sparse: Default::default(),
                payload: payload("chunk"),
            })
            .collect();
        points.push(Point {
            id: window_id(&doc_id, version, 0),
            dense: Vec::new(),
            sparse: Default::default(),
            payload: payload("window"),
        });
        points
    };
    let m = clinstream::telemetry::metrics::metrics();
    let (groups0, grouped0) = (m.store_group_documents.get_sample_count(), m.store_group_documents.get_sample_sum());
    let docs = 40;
    // Version 1 of every document, all at once.
    let mut tasks = Vec::new();
    for d in 0..docs {
        let (w, p) = (writer.clone(), doc_points(d, "1", 3));
        tasks.push(tokio::spawn(async move { w.write(&format!("w{d}"), p).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    // Then, all at once: even documents get version 2 with two chunks; document 1 is rewritten as version 1 with
    // one chunk; document 5 gets a version with no points at all; document 3 gets versions 2 then 3 from one task
    // (in that order).
    let mut tasks = Vec::new();
    for d in (0..docs).step_by(2) {
        let (w, p) = (writer.clone(), doc_points(d, "2", 2));
        tasks.push(tokio::spawn(async move { w.write(&format!("w{d}"), p).await }));
    }
    let (w, p) = (writer.clone(), doc_points(1, "1", 1));
    tasks.push(tokio::spawn(async move { w.write("w1", p).await }));
    let w = writer.clone();
    tasks.push(tokio::spawn(async move { w.write("w5", Vec::new()).await }));
    let w = writer.clone();
    let (p2, p3) = (doc_points(3, "2", 4), doc_points(3, "3", 2));
    tasks.push(tokio::spawn(async move {
        w.write("w3", p2).await?;
        w.write("w3", p3).await
    }));
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    for d in 0..docs {
        let (version, chunks) = match d {
            1 => ("1", 1),
            3 => ("3", 2),
            5 => ("1", 0),
            d if d % 2 == 0 => ("2", 2),
            _ => ("1", 3),
        };
        let f = Filters { patient: Some(format!("Patient/w{d}")), ..Default::default() };
        assert_eq!(store.count_where(&f, Record::Chunks).await.unwrap(), chunks, "chunks of w{d}");
        assert_eq!(store.count_where(&f, Record::Windows).await.unwrap(), usize::from(d != 5), "windows of w{d}");
        let ids: Vec<String> = (0..chunks).map(|i| point_id(&format!("w{d}"), version, i).to_string()).collect();
        assert_eq!(store.chunks(&ids).await.unwrap().len(), chunks, "w{d} holds its last version's chunks");
    }
    assert_eq!(store.count().await.unwrap(), 20 * 2 + 20 * 3 - 2 - 1 - 3);
    let (groups, grouped) =
        (m.store_group_documents.get_sample_count() - groups0, m.store_group_documents.get_sample_sum() - grouped0);
    if expect_groups {
        assert!(groups > 0 && grouped / groups as f64 > 1.0, "documents were written in groups: {grouped} in {groups}");
    }
    // Durable for whoever opens the store next.
    store.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_grouped_writes_keep_exactly_each_documents_last_points() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(s) = server_settings(dir.path(), &server) else { return };
    grouped_writes_keep_exactly_each_documents_last_points(s, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_grouped_writes_keep_exactly_each_documents_last_points() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    grouped_writes_keep_exactly_each_documents_last_points(s, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_embedded_store_grouped_writes_keep_exactly_each_documents_last_points() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.store.shards = 3;
    grouped_writes_keep_exactly_each_documents_last_points(s.clone(), true).await;
    // The documents are spread over the three shards' directories.
    for i in 0..3 {
        assert!(Path::new(&s.store.path).join(format!("shard-{i}")).join("edge_config.json").exists(), "shard-{i}");
    }
    // A writer configured with another count is refused (documents are placed by it); a reader follows the store.
    s.store.shards = 1;
    let refused = Store::open(&s.store, 384).await.unwrap_err().to_string();
    assert!(refused.contains("has 3 shard(s) but store.shards = 1"), "{refused}");
    let reader = Store::open_existing(&s.store).await.unwrap();
    assert_eq!(reader.count().await.unwrap(), 20 * 2 + 20 * 3 - 2 - 1 - 3);
}

/// A store of several shards answers as one: the same points in one shard and in three give the same dense
/// ranking, the same counts and the same windows, and hybrid search finds the chunk that matches both ways first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_embedded_store_answers_as_one_shard_does() {
    use clinstream::store::{Point, Sparse, point_id, window_id};
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    let mut stores = Vec::new();
    for shards in [1u32, 3] {
        let mut st = s.store.clone();
        st.shards = shards;
        st.path = dir.path().join(format!("store-{shards}")).display().to_string();
        stores.push(Store::open(&st, 8).await.unwrap());
    }
    let mut points = Vec::new();
    for d in 0..30usize {
        let doc_id = format!("doc-{d}");
        let payload = |record: &str| {
            serde_json::json!({"doc_id": doc_id, "doc_version": "1", "patient": format!("Patient/{}", d % 4),
                               "record": record})
            .as_object()
            .unwrap()
            .clone()
        };
        for c in 0..2usize {
            // Distinct directions (no ties in the ranking).
            let dense: Vec<f32> = (0..8).map(|k| (d as f32 * 1.3 + c as f32 * 0.7 + k as f32 * 2.1).sin()).collect();
            let sparse = Sparse { indices: vec![d as u32, 100 + c as u32], values: vec![2.0 - c as f32, 0.5] };
            points.push(Point { id: point_id(&doc_id, "1", c), dense, sparse, payload: payload("chunk") });
        }
        points.push(Point {
            id: window_id(&doc_id, "1", 0),
            dense: Vec::new(),
            sparse: Sparse::default(),
            payload: payload("window"),
        });
    }
    for store in &stores {
        store.upsert(points.clone()).await.unwrap();
    }
    // Chunk 0 of doc-7.
    let probe = points[21].dense.clone();
    let dense_only = nearest(probe.clone(), 10);
    let ranked = |hits: Vec<clinstream::store::Hit>| hits.into_iter().map(|h| h.id).collect::<Vec<_>>();
    let one = ranked(stores[0].search(&dense_only).await.unwrap());
    let three = ranked(stores[1].search(&dense_only).await.unwrap());
    assert_eq!(one.len(), 10);
    assert_eq!(one, three, "dense ranking across shards");
    let patient = Filters { patient: Some("Patient/2".into()), ..Default::default() };
    for store in &stores {
        assert_eq!(store.count().await.unwrap(), 60);
        assert_eq!(store.count_where(&patient, Record::Windows).await.unwrap(), 7);
        assert_eq!(store.windows(&patient, 1000).await.unwrap().len(), 7);
        assert_eq!(store.windows(&patient, 3).await.unwrap().len(), 3, "the limit holds across shards");
        // Chunk 0 of doc-7 matches the dense probe exactly and weighs sparse term 7 most: first in both rankings.
        let hybrid = Query {
            dense: probe.clone(),
            sparse: Sparse { indices: vec![7], values: vec![1.0] },
            filters: Filters::default(),
            top: 5,
            fields: None,
            record: Record::Chunks,
            matched: Vec::new(),
        };
        let hits = store.search(&hybrid).await.unwrap();
        assert_eq!(hits[0].id, point_id("doc-7", "1", 0).to_string());
        let wanted = [point_id("doc-29", "1", 1).to_string(), point_id("doc-0", "1", 0).to_string()];
        let got: Vec<String> = store.chunks(&wanted).await.unwrap().into_iter().map(|h| h.id).collect();
        assert_eq!(got, wanted, "chunks by id, in the order asked, from any shard");
    }
}

/// A Qdrant cluster, not one node: three peers in distributed mode on loopback, the collection with three shards
/// and two replicas of each, indexed through the first peer. The third peer is SIGKILLed a third of the way through
/// the stream and brought back two thirds of the way: no document fails (no dead letter, the indexer never gives
/// up), and once the peer's replicas have recovered, every point is there exactly once on every replica (counted
/// with consistency `all`, against what each write reported). `make chaos` runs it at length with the peer away a
/// minute (`chaos_qdrant_cluster_peer_away_a_minute`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qdrant_cluster_loses_a_peer_mid_stream_and_gets_it_back_whole() {
    cluster_loses_a_peer(60, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "full size: make chaos"]
async fn chaos_qdrant_cluster_peer_away_a_minute() {
    cluster_loses_a_peer(1_200, Duration::from_secs(60)).await;
}

/// Indexes `n` notes into a three-peer cluster; the third peer is killed at n/3 and restarted at 2n/3 or, when
/// later, once it has been away `away`.
async fn cluster_loses_a_peer(n: usize, away: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut cluster) = common::qdrant::QdrantCluster::start(3) else { return };
    let Some(mut s) = server_settings(dir.path(), &cluster.peers[0]) else { return };
    s.store.shards = 3;
    s.store.replication_factor = 2;
    s.store.write_consistency = 1;
    let collection = s.store.collection.clone();
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = Indexer::start(&s, pipeline.compiled()).await.unwrap();
    let mut written = 0u64;
    let (mut killed, mut back, mut during) = (None, None, 0);
    let clock = std::time::Instant::now();
    for i in 0..n {
        if i == n / 3 {
            tokio::task::block_in_place(|| cluster.peers[2].kill());
            killed = Some(std::time::Instant::now());
        }
        if back.is_none() && i >= 2 * n / 3 && killed.is_some_and(|k| k.elapsed() >= away) {
            tokio::task::block_in_place(|| cluster.peers[2].restart());
            back = Some(std::time::Instant::now());
        }
        let text = if i % 2 == 0 { CARDIAC } else { RESPIRATORY };
        let record = note(&format!("cluster-{i}"), "1", "current", &format!("Patient/c{}", i % 7), text);
        let doc = Arc::new(pipeline.process(&record).unwrap());
        let points = indexer.index(&doc).await.unwrap_or_else(|e| panic!("document {i} failed: {e}"));
        assert!(points >= 1);
        written += points as u64;
        if killed.is_some() && back.is_none() {
            during += 1;
        }
    }
    if back.is_none() {
        let left = away.saturating_sub(killed.map_or(Duration::ZERO, |k| k.elapsed()));
        tokio::time::sleep(left).await;
        tokio::task::block_in_place(|| cluster.peers[2].restart());
        back = Some(std::time::Instant::now());
    }
    // A version replacing the first note once the peer is back: its old points go from every replica.
    let first = Arc::new(pipeline.process(&note("cluster-0", "1", "current", "Patient/c0", CARDIAC)).unwrap());
    let second = Arc::new(pipeline.process(&note("cluster-0", "2", "current", "Patient/c0", RESPIRATORY)).unwrap());
    let (old, new) = (indexer.index(&first).await.unwrap() as u64, indexer.index(&second).await.unwrap() as u64);
    written = written - old + new;
    let recovered = tokio::task::block_in_place(|| {
        common::wait_until(Duration::from_secs(180), "the restarted peer's replicas to recover", || {
            cluster.replicas_active(&collection)
        });
        let recovered = back.map(|b| b.elapsed()).unwrap_or_default();
        let mut last = None;
        let whole = common::try_wait_until(Duration::from_secs(60), || {
            last = cluster.count_all(&collection);
            last == Some(written)
        });
        assert!(whole, "every replica holds every point: counted {last:?} with consistency all, {written} written");
        recovered
    });
    assert_eq!(indexer.store().count().await.unwrap() as u64, written);
    println!(
        "FIGURES Qdrant cluster: 3 peers, 3 shards x 2 replicas; {n} notes, peer 3 SIGKILLed at {} and away {:.0} s \
         ({during} notes indexed meanwhile); 0 failed documents; replicas active {:.1} s after the restart; {written} \
         chunk points with consistency all = written; {:.0} s",
        n / 3,
        killed.zip(back).map_or(0.0, |(k, b)| (b - k).as_secs_f64()),
        recovered.as_secs_f64(),
        clock.elapsed().as_secs_f64()
    );
}

/// Hybrid fusion scales BM25 by the question's IDF mass (`Store::idf_mass`): the store's own IDF of each term —
/// Qdrant's `ln((N − n + 0.5) / (n + 0.5) + 1)` over the points with a BM25 vector — summed; a term no point holds
/// adds nothing. Read from the store, so it is the same figure whichever patient asks.
async fn idf_mass_is_the_stores_own_idf(s: Settings) {
    use clinstream::store::{Point, bm25, point_id};
    let store = Store::open(&s.store, 8).await.unwrap();
    let encoder = bm25::encoder(s.store.bm25_avg_len).unwrap();
    let texts: Vec<String> = (0..12)
        .map(|i| match i {
            0 | 1 => format!("The patient has a small pleural effusion, note {i}."),
            2..=9 => format!("The patient walked {i} blocks today."),
            _ => format!("Follow-up visit {i} in clinic."),
        })
        .collect();
    let points: Vec<Point> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let doc_id = format!("idf-{i}");
            Point {
                id: point_id(&doc_id, "1", 0),
                dense: (0..8).map(|k| ((i * 8 + k) as f32).sin()).collect(),
                sparse: bm25::sparse_document(&encoder, t),
                payload: serde_json::json!({"doc_id": doc_id, "doc_version": "1", "patient": "Patient/x",
                                            "record": "chunk", "text": t})
                .as_object()
                .unwrap()
                .clone(),
            }
        })
        .collect();
    store.upsert(points).await.unwrap();
    let idf = |n: f32, df: f32| ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
    let mass = |q: &str| {
        let (store, query) = (&store, bm25::sparse_query(&encoder, q));
        async move { store.idf_mass(&query).await.unwrap() }
    };
    // "patient" in 10 of 12, "effusion" in 2; "zebra" in none.
    let expected = idf(12.0, 10.0) + idf(12.0, 2.0);
    let got = mass("Does the patient have an effusion? zebra").await;
    assert!((got - expected).abs() < 1e-3, "{got} against {expected}");
    assert!((mass("effusions").await - idf(12.0, 2.0)).abs() < 1e-3, "stemmed as the documents were");
    assert_eq!(mass("zebra").await, 0.0);
    assert_eq!(mass("Is there any?").await, 0.0, "stopwords only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_idf_mass_is_its_own_idf() {
    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path()) else { return };
    idf_mass_is_the_stores_own_idf(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_idf_mass_is_its_own_idf() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(s) = server_settings(dir.path(), &server) else { return };
    idf_mass_is_the_stores_own_idf(s).await;
}

/// The payload indexes a store gets: `patient` and `doc_id` by default (`lookups`), the fields clinstream's reads
/// also filter on with `filters`, three more with `all`; reopened with fewer, a store keeps the indexes it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_indexes_are_the_lookups_unless_more_are_asked_for() {
    use clinstream::store::{DIRECT_QUERY_FIELDS, FILTER_FIELDS, INTEGER_FIELDS, LOOKUP_FIELDS};
    use std::collections::BTreeSet;
    let set = |groups: &[&[&str]]| -> BTreeSet<String> {
        groups.iter().flat_map(|g| g.iter()).map(|f| f.to_string()).collect()
    };
    let lookups = set(&[LOOKUP_FIELDS]);
    let filters = set(&[LOOKUP_FIELDS, FILTER_FIELDS, INTEGER_FIELDS]);
    let all = set(&[LOOKUP_FIELDS, FILTER_FIELDS, INTEGER_FIELDS, DIRECT_QUERY_FIELDS]);
    assert_eq!(lookups, set(&[&["patient", "doc_id"]]));
    assert!(filters.contains("doc_type") && filters.contains("doc_day") && !filters.contains("entity_terms"));
    assert_eq!(all.len(), filters.len() + 3);
    // The default is the lookups.
    let defaults = clinstream::config::Settings::load_from(None, Some(Default::default())).unwrap();
    assert_eq!(defaults.store.payload_indexes, "lookups");
    let steps = [("lookups", &lookups), ("filters", &filters), ("lookups", &filters), ("all", &all), ("filters", &all)];

    // Embedded: the shard's own schema, read with the engine after the store is closed.
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    let embedded = |path: PathBuf| -> BTreeSet<String> {
        let shard = qdrant_edge::EdgeShard::load(&path, None).unwrap();
        shard.info().unwrap().payload_schema.keys().map(|k| k.to_string()).collect()
    };
    let path = PathBuf::from(&s.store.path);
    for (setting, want) in steps {
        s.store.payload_indexes = setting.into();
        let store = Store::open(&s.store, 384).await.unwrap();
        store.flush().await.unwrap();
        drop(store);
        assert_eq!(&embedded(path.clone()), want, "embedded store opened with {setting}");
    }
    let mut bad = s.store.clone();
    bad.payload_indexes = "some".into();
    let mut settings_bad = s.clone();
    settings_bad.store = bad;
    let e = settings_bad.validate().unwrap_err().to_string();
    assert!(e.contains("store.payload_indexes") && e.contains("lookups, filters or all"), "{e}");

    // A Qdrant server: the collection's payload schema.
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(mut s) = server_settings(dir.path(), &server) else { return };
    let mut client = qdrant_client::Qdrant::from_url(&server.url);
    if !server.api_key.is_empty() {
        client = client.api_key(server.api_key.clone());
    }
    let client = client.build().unwrap();
    for (setting, want) in steps {
        s.store.payload_indexes = setting.into();
        Store::open(&s.store, 384).await.unwrap();
        let info = client.collection_info(&s.store.collection).await.unwrap().result.unwrap();
        let have: BTreeSet<String> = info.payload_schema.keys().cloned().collect();
        assert_eq!(&have, want, "server collection opened with {setting}");
    }
}

/// Hybrid search with partial BM25 matches fading (`store.bm25_full_share`, `store.bm25_partial_power`), read from
/// the settings by either store. A patient's three chunks: dense prefers `hpi` a little over `plan` and `imp`;
/// `plan` holds only the question's common word, which it repeats (0.3 of the question's IDF mass); `imp` holds the
/// rare word once in a longer chunk than the average (0.65 of it). Linear shares put `plan` above `hpi`, the default
/// fading keeps their dense order; `imp` comes first either way. The IDFs are the store's own (other patients'
/// chunks set them); the chunks' BM25 weights are set from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_fades_partial_bm25_matches_in_hybrid_search() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.store.path = dir.path().join("store").display().to_string();
    fading_partial_bm25_matches(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_fades_partial_bm25_matches_in_hybrid_search() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(s) = server_settings(dir.path(), &server) else { return };
    fading_partial_bm25_matches(s).await;
}

async fn fading_partial_bm25_matches(mut s: Settings) {
    use clinstream::store::{Point, Sparse, point_id};
    const COMMON: u32 = 1;
    const RARE: u32 = 2;
    const OTHER: u32 = 9;
    s.store.shards = 1;
    assert_eq!((s.store.bm25_full_share, s.store.bm25_partial_power), (0.6, 4.0), "the shipped defaults");
    // Unit vectors at a chosen cosine to the probe (the first axis), each in its own plane.
    let at = |cos: f32, axis: usize| {
        let mut v = vec![0.0f32; 8];
        v[0] = cos;
        v[axis] = (1.0 - cos * cos).sqrt();
        v
    };
    let point = |doc: &str, patient: &str, dense: Vec<f32>, terms: &[(u32, f32)]| Point {
        id: point_id(doc, "1", 0),
        dense,
        sparse: Sparse { indices: terms.iter().map(|t| t.0).collect(), values: terms.iter().map(|t| t.1).collect() },
        payload: serde_json::json!({"doc_id": doc, "doc_version": "1", "patient": patient, "record": "chunk"})
            .as_object()
            .unwrap()
            .clone(),
    };
    // Other patients: the common word in most chunks, the rare one in one.
    let mut others: Vec<Point> = (0..12)
        .map(|i| point(&format!("other-{i}"), "Patient/other", at(0.1, 3 + i % 5), &[(COMMON, 1.0), (OTHER, 1.0)]))
        .collect();
    others.push(point("other-rare", "Patient/other", at(0.1, 7), &[(RARE, 1.0)]));
    let patients = |plan: f32, imp: f32| {
        vec![
            point("hpi", "Patient/p", at(0.60, 1), &[(OTHER, 1.0)]),
            point("plan", "Patient/p", at(0.58, 2), &[(COMMON, plan)]),
            point("imp", "Patient/p", at(0.58, 3), &[(RARE, imp)]),
        ]
    };
    let question = Sparse { indices: vec![COMMON, RARE], values: vec![1.0, 1.0] };
    let hybrid = Query {
        dense: at(1.0, 1),
        sparse: question.clone(),
        filters: Filters { patient: Some("Patient/p".into()), ..Default::default() },
        top: 3,
        fields: None,
        record: Record::Chunks,
        matched: Vec::new(),
    };
    let id = |doc: &str| point_id(doc, "1", 0).to_string();
    for (name, power, want) in [("linear", 1.0, ["imp", "plan", "hpi"]), ("fading", 4.0, ["imp", "hpi", "plan"])] {
        let mut st = s.store.clone();
        st.bm25_partial_power = power;
        if st.kind == "embedded" {
            st.path = format!("{}-{name}", s.store.path);
        } else {
            st.collection = common::qdrant::unique_collection("fading");
        }
        let store = Store::open(&st, 8).await.unwrap();
        store.upsert(others.clone()).await.unwrap();
        store.upsert(patients(1.0, 1.0)).await.unwrap();
        // Document frequencies are set now; rewriting the same terms with other weights keeps them.
        let mass = store.idf_mass(&question).await.unwrap();
        let common = store.idf_mass(&Sparse { indices: vec![COMMON], values: vec![1.0] }).await.unwrap();
        let rare = mass - common;
        assert!(common > 0.0 && rare > common * 1.5, "the rare word weighs more: {common} and {rare}");
        store.upsert(patients(0.3 * mass / common, 0.65 * mass / rare)).await.unwrap();
        let got: Vec<String> = store.search(&hybrid).await.unwrap().into_iter().map(|h| h.id).collect();
        assert_eq!(got, want.map(id), "{name}: {want:?}");
    }
}

/// `serve.match_concepts` at the store: a patient's three chunks — `plan` holds the query's word weakly, `ekg`
/// holds none of its words, `cxr` names the finding in other words (its `concepts` hold the aligned concept) and is
/// the farthest by the dense vector. Words alone rank `cxr` last; with the concept matched it counts as a full BM25
/// match and comes first. Another patient's chunk with the same concept, and with a concept filter of the caller's
/// the chunks outside it, stay out (the query's filters hold for the matched ranking too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_counts_a_chunk_that_mentions_a_matched_concept_as_a_full_match() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path()) else { return };
    s.store.path = dir.path().join("store").display().to_string();
    matched_concepts_count_in_hybrid_search(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_counts_a_chunk_that_mentions_a_matched_concept_as_a_full_match() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = common::qdrant::QdrantServer::start() else { return };
    let Some(mut s) = server_settings(dir.path(), &server) else { return };
    s.store.collection = common::qdrant::unique_collection("matched");
    matched_concepts_count_in_hybrid_search(s).await;
}

async fn matched_concepts_count_in_hybrid_search(mut s: Settings) {
    use clinstream::store::{Point, Sparse, point_id};
    const COMMON: u32 = 1;
    const OTHER: u32 = 9;
    const CARDIOMEGALY: &str = "MESH:D006332";
    s.store.shards = 2;
    let at = |cos: f32, axis: usize| {
        let mut v = vec![0.0f32; 8];
        v[0] = cos;
        v[axis] = (1.0 - cos * cos).sqrt();
        v
    };
    let point = |doc: &str, patient: &str, dense: Vec<f32>, terms: &[(u32, f32)], concepts: &[&str]| Point {
        id: point_id(doc, "1", 0),
        dense,
        sparse: Sparse { indices: terms.iter().map(|t| t.0).collect(), values: terms.iter().map(|t| t.1).collect() },
        payload: serde_json::json!({"doc_id": doc, "doc_version": "1", "patient": patient, "record": "chunk",
                                    "concepts": concepts})
        .as_object()
        .unwrap()
        .clone(),
    };
    let mut points: Vec<Point> = (0..8)
        .map(|i| point(&format!("other-{i}"), "Patient/other", at(0.1, 3 + i % 5), &[(COMMON, 1.0), (OTHER, 1.0)], &[]))
        .collect();
    points.push(point("other-cxr", "Patient/other", at(0.9, 4), &[], &[CARDIOMEGALY]));
    points.extend([
        point("plan", "Patient/p", at(0.60, 1), &[(COMMON, 0.3)], &["MESH:D003924"]),
        point("ekg", "Patient/p", at(0.58, 2), &[(OTHER, 1.0)], &[]),
        point("cxr", "Patient/p", at(0.50, 3), &[(OTHER, 1.0)], &[CARDIOMEGALY]),
    ]);
    let store = Store::open(&s.store, 8).await.unwrap();
    store.upsert(points).await.unwrap();
    let query = |matched: &[&str]| Query {
        dense: at(1.0, 5),
        sparse: Sparse { indices: vec![COMMON], values: vec![1.0] },
        filters: Filters { patient: Some("Patient/p".into()), ..Default::default() },
        top: 3,
        fields: None,
        record: Record::Chunks,
        matched: matched.iter().map(|c| c.to_string()).collect(),
    };
    let id = |doc: &str| point_id(doc, "1", 0).to_string();
    let ranked = |hits: Vec<clinstream::store::Hit>| hits.into_iter().map(|h| h.id).collect::<Vec<_>>();
    assert_eq!(ranked(store.search(&query(&[])).await.unwrap()), ["plan", "ekg", "cxr"].map(id), "words only");
    let got = ranked(store.search(&query(&[CARDIOMEGALY])).await.unwrap());
    assert_eq!(got, ["cxr", "plan", "ekg"].map(id), "the mention counts as the query's words would");
    assert!(!got.contains(&id("other-cxr")), "another patient's mention stays out");
    // The caller's own concept filter holds for the matched ranking too: only `plan` holds its concept.
    let mut filtered = query(&[CARDIOMEGALY]);
    filtered.filters.concepts = vec!["MESH:D003924".into()];
    assert_eq!(ranked(store.search(&filtered).await.unwrap()), [id("plan")], "the filter is kept");
    // A query none of whose words any point holds still ranks the mentions first (no BM25 mass to scale by).
    let mut unknown = query(&[CARDIOMEGALY]);
    unknown.sparse = Sparse { indices: vec![77], values: vec![1.0] };
    assert_eq!(ranked(store.search(&unknown).await.unwrap())[0], id("cxr"));
}
