//! The generative step, `POST /v1/answer`, against a real LLM behind an OpenAI-compatible server (llama.cpp's
//! `llama-server` with SmolLM2-135M, `tools/llm/build.sh`; or `CLINSTREAM_TEST_LLM_URL`), the real embedding model
//! and the embedded store. A 135M model answers poorly: these tests check the protocol, the JSON answer, the
//! citations (every one a passage of the context), the limits and the failures — never clinical correctness.
//!
//! Cases: an answer with citations inside the context and the notes it drew on; the prompt (seen through a
//! recording proxy in front of the server) holds the asking patient's passages and nothing of another patient's;
//! a too-slow LLM is a 504, a down one a 503 (and never blocks `/v1/context`), none configured a 501; access and
//! audit as for every route; no question, note text, prompt or completion in the logs.

mod common;

use std::path::Path;
use std::time::Duration;

use clinstream::config::{Secret, Settings};
use common::llm::LlmServer;
use common::proxy::SlowProxy;
use common::service::{self, call};
use serde_json::{Value, json};

const KEY: &str = "svc-key-answer";
const PATIENT: &str = "pat-answer-1";
const OTHER: &str = "pat-answer-2";
const MINE: &str = "OTTERCANARY-Pell-3381";
const THEIRS: &str = "HERONCANARY-Voss-7720";
const ASKED: &str = "LYNXCANARY-Quill-5512";

fn notes() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("ans-1", PATIENT, format!("FINDINGS: Small left pleural effusion ({MINE}).\n\nIMPRESSION: Pleural effusion.")),
        ("ans-2", PATIENT, "ASSESSMENT: No pneumothorax. Pleural effusion, stable.".to_string()),
        ("ans-3", OTHER, format!("FINDINGS: Large pleural effusion on the right ({THEIRS}).")),
    ]
}

fn settings(dir: &Path, llm: Option<(&str, &LlmServer)>) -> Option<Settings> {
    let mut s = common::model_settings(dir)?;
    s.serve.api_keys = Secret::new(format!("ops:{KEY}"));
    s.serve.addr = "127.0.0.1:0".into();
    s.serve.cache_dir = std::env::temp_dir().join("clinstream-test-label-cache").display().to_string();
    s.serve.default_budget_tokens = 512;
    if let Some((url, server)) = llm {
        s.llm.base_url = url.to_string();
        s.llm.model = server.model.clone();
        s.llm.api_key = Secret::new(server.key.clone());
        // A 2-core machine running the whole suite beside it: generous (a hang fails, slowness never); the deadline
        // cases set their own.
        s.llm.timeout_ms = 600_000;
        s.llm.max_tokens = 256;
    }
    Some(s)
}

/// The question every case asks (the canary in it must never reach a log).
fn question() -> Value {
    json!({"patient": PATIENT, "question": format!("Does the patient have a pleural effusion? {ASKED}")})
}

fn ask(port: u16, id: &str) -> (u16, Value) {
    let (st, v, _) = call(port, "/v1/answer", Some(KEY), id, &question());
    (st, v)
}

#[test]
fn answers_cite_only_their_context_and_the_llm_sees_only_the_asking_patient() {
    let _ = service::logs();
    let Some(server) = LlmServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Every byte the service sends the LLM passes a recording proxy (no delay).
    let proxy = SlowProxy::start(server.port, Duration::ZERO);
    let url = server.url.replacen(&format!(":{}", server.port), &format!(":{}", proxy.port), 1);
    let Some(s) = settings(dir.path(), Some((&url, &server))) else { return };
    let rt = service::runtime();
    let port = service::start(&rt, &s, &notes());

    let (st, v, head) = service::call_with_head(port, "/v1/answer", Some(KEY), "a1", &question());
    assert_eq!(st, 200, "{v}");
    // Where the time went: the context, the generative step's own work and the LLM's, inside the request's total.
    let timing = service::server_timing(&head);
    let names: Vec<&str> = timing.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["context", "generate", "llm", "total"], "{head}");
    let ms = |name: &str| timing.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(ms("context") > 0.0 && ms("llm") > 0.0 && ms("generate") >= 0.0, "{head}");
    assert!(ms("context") + ms("generate") + ms("llm") <= ms("total") + 0.01, "{head}");
    assert!((ms("llm") - v["llm_ms"].as_f64().unwrap()).abs() < 1.0, "{head} {v}");
    let (st, _, head) = service::call_with_head(port, "/v1/context", Some(KEY), "c1", &question());
    assert_eq!(st, 200);
    let timing = service::server_timing(&head);
    assert!(timing.len() == 1 && timing[0].0 == "total" && timing[0].1 > 0.0, "{head}");
    let passages = v["passages"].as_u64().unwrap() as usize;
    assert!(passages >= 1, "{v}");
    assert!(["present", "absent", "uncertain", "not_mentioned"].contains(&v["status"].as_str().unwrap()), "{v}");
    assert!(v["answer"].is_string() && v["model"].is_string(), "{v}");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
    let sources: Vec<&str> = v["sources"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    assert!(!sources.is_empty() && sources.iter().all(|d| d.starts_with("ans-") && *d != "ans-3"), "{sources:?}");
    for c in v["citations"].as_array().unwrap() {
        let n = c["passage"].as_u64().unwrap() as usize;
        assert!((1..=passages).contains(&n), "a citation outside the context: {c}");
        assert!(sources.contains(&c["doc_id"].as_str().unwrap()), "{c}");
        assert!(!c["text"].as_str().unwrap().is_empty());
    }
    assert!(v["rule_answer"]["status"].is_string(), "the rule vote beside the model's answer: {v}");

    // What reached the LLM: this patient's passages, nothing of the other patient's.
    let prompt = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).to_string();
    assert!(prompt.contains("/chat/completions") && prompt.contains("json_schema"), "{prompt}");
    assert!(prompt.contains(MINE), "the patient's own passage is in the prompt");
    assert!(!prompt.contains(THEIRS), "another patient's note reached the LLM");

    // Nothing of the question, the notes or the completion in the logs.
    let log = service::log_text();
    for secret in [MINE, THEIRS, ASKED, v["answer"].as_str().unwrap()] {
        assert!(secret.len() < 4 || !log.contains(secret), "the log holds {secret}");
    }
    let metrics = common::http_get(port, "/metrics").unwrap().1;
    assert!(common::metric_value(&metrics, "clinstream_llm_requests_total{outcome=\"ok\"}").unwrap() >= 1.0);
    assert!(
        common::metric_value(&metrics, "clinstream_api_requests_total{route=\"answer\",status=\"200\"}").unwrap()
            >= 1.0
    );
}

#[test]
fn a_slow_llm_is_a_504_a_down_one_a_503_and_none_a_501() {
    let _ = service::logs();
    let Some(server) = LlmServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let rt = service::runtime();

    // Slow: every chunk to and from the server held longer than the whole deadline.
    let slow = SlowProxy::start(server.port, Duration::from_secs(5));
    let url = server.url.replacen(&format!(":{}", server.port), &format!(":{}", slow.port), 1);
    let Some(mut s) = settings(dir.path(), Some((&url, &server))) else { return };
    s.llm.timeout_ms = 1_000;
    s.store.path = dir.path().join("slow").display().to_string();
    let port = service::start(&rt, &s, &notes());
    let (st, v) = ask(port, "s1");
    assert_eq!((st, v["error"]["code"].as_str()), (504, Some("llm_timeout")), "{v}");
    // The context route is not held by the LLM.
    let (st, _, _) = call(port, "/v1/context", Some(KEY), "s2", &json!({"patient": PATIENT, "question": "effusion?"}));
    assert_eq!(st, 200);

    // Down: nothing listens (port 1 on loopback is privileged and unused).
    let Some(mut s) = settings(dir.path(), Some(("http://127.0.0.1:1/v1", &server))) else { return };
    s.llm.max_retries = 1;
    s.llm.retry_initial_ms = 50;
    s.store.path = dir.path().join("down").display().to_string();
    let port = service::start(&rt, &s, &notes());
    let (st, v) = ask(port, "d1");
    assert_eq!((st, v["error"]["code"].as_str()), (503, Some("llm_unavailable")), "{v}");

    // None configured.
    let Some(mut s) = settings(dir.path(), None) else { return };
    s.store.path = dir.path().join("none").display().to_string();
    let port = service::start(&rt, &s, &notes());
    let (st, v) = ask(port, "n1");
    assert_eq!((st, v["error"]["code"].as_str()), (501, Some("llm_not_configured")), "{v}");
    // Another patient's answer is refused like every route's (a key has every patient; a bad key is 401).
    let (st, _, _) = call(port, "/v1/answer", Some("nope"), "n2", &json!({"patient": OTHER, "question": "q"}));
    assert_eq!(st, 401);
    drop(server);
}

/// `clinstream-lab eval qa --llm`: every sampled question's context goes to the model with the service's prompt and
/// schema, and the report scores its statuses beside the rule vote's, with its tokens and time — against the real
/// server, through the recording proxy, so the test also sees that only the asked patient's text reached it.
#[test]
fn eval_qa_asks_the_llm_and_scores_it_beside_the_rule_vote() {
    let Some(server) = LlmServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let proxy = SlowProxy::start(server.port, Duration::ZERO);
    let url = server.url.replacen(&format!(":{}", server.port), &format!(":{}", proxy.port), 1);
    let Some(s) = settings(dir.path(), Some((&url, &server))) else { return };
    let doc = |id: &str, patient: &str, text: &str| {
        use base64::Engine as _;
        json!({"resourceType": "DocumentReference", "id": id, "status": "current", "date": "2024-01-02",
            "subject": {"reference": format!("Patient/{patient}")},
            "content": [{"attachment": {"contentType": "text/plain",
                "data": base64::engine::general_purpose::STANDARD.encode(text)}}]})
        .to_string()
    };
    let docs = [
        doc("e-a", "a", &format!("FINDINGS: Small right pleural effusion ({MINE}).\nIMPRESSION: Pleural effusion.")),
        doc("e-b", "b", &format!("FINDINGS: No pleural effusion ({THEIRS}). Heart size is enlarged.")),
    ];
    let question = |patient: &str, q: &str, answer: &str| {
        json!({"patient": patient, "question": q, "variable": "v", "answer": answer, "needle_doc_id": "",
            "evidence": []})
        .to_string()
    };
    let questions = [
        question("a", "Is there a pleural effusion?", "yes"),
        question("b", "Does the patient have cardiomegaly?", "yes"),
        question("a", "Does the patient have cardiomegaly?", "no"),
        question("b", "Is there a pleural effusion?", "no"),
    ];
    let (documents, questions_path) = (dir.path().join("documents.ndjson"), dir.path().join("questions.jsonl"));
    std::fs::write(&documents, docs.join("\n")).unwrap();
    std::fs::write(&questions_path, questions.join("\n")).unwrap();
    let rt = service::runtime();
    let report = rt.block_on(async {
        let pipeline = clinstream::stages::Pipeline::new(&s).unwrap();
        let embedder = clinstream::embed::Embedder::start_async(&s.embed).await.unwrap();
        let llm = clinstream::llm::Llm::new(&s.llm).unwrap().expect("an endpoint");
        let templates = clinstream::query::answer::Templates::default();
        let eval_llm = clinstream::eval::qa::EvalLlm { llm: &llm, templates: &templates };
        let strategies = vec!["clear".to_string()];
        let cache = dir.path().join("cache");
        let run = clinstream::eval::qa::QaRun {
            documents: &documents,
            questions: &questions_path,
            budget_tokens: 128,
            window_words: 150,
            strategies: &strategies,
            label_cache: &cache,
            show_errors: false,
            chunker: None,
            fusion: clinstream::store::Fusion::of(&s.store),
            bm25_avg_len: s.store.bm25_avg_len,
            match_concepts: s.serve.match_concepts,
            summaries: None,
            llm: Some(&eval_llm),
            sample: 2,
            importance: None,
            tree: Default::default(),
        };
        clinstream::eval::qa::run(&pipeline, &embedder, &run).await.unwrap()
    });
    let clear = &report.strategies[0];
    assert_eq!(clear.questions, 2, "every second question: {clear:?}");
    let l = clear.llm.as_ref().expect("an LLM report");
    assert_eq!((l.asked, l.failed, l.citations_refused), (2, 0, 0), "{l:?}");
    assert!((0.0..=1.0).contains(&l.accuracy), "{l:?}");
    assert_eq!(l.rule_accuracy, clear.answer_accuracy, "the rule vote over the same questions: {l:?}");
    assert!(l.prompt_tokens_mean > 0.0 && l.completion_tokens_mean > 0.0 && l.ms_max > 0, "{l:?}");
    // The questions asked were patient a's effusion and a's cardiomegaly: b's note never reached the model.
    let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).to_string();
    assert!(sent.contains(MINE) && !sent.contains(THEIRS), "only the asked patient's notes reach the LLM");
}

/// `clinstream-lab eval qa --strategy tree+llm`: each asked patient's tree gets abstractive summaries written by the
/// LLM (the summary prompt, the patient's chunks), searched by their embedding and counted in the budget by their
/// own tokens; another patient's notes never reach the model.
#[test]
fn eval_qa_builds_the_tree_with_abstractive_summaries() {
    let Some(server) = LlmServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let proxy = SlowProxy::start(server.port, Duration::ZERO);
    let url = server.url.replacen(&format!(":{}", server.port), &format!(":{}", proxy.port), 1);
    let Some(mut s) = settings(dir.path(), Some((&url, &server))) else { return };
    s.llm.max_tokens = 64;
    let mut docs: Vec<String> = tree_notes(MINE)
        .iter()
        .enumerate()
        .map(|(i, t)| String::from_utf8(service::note(&format!("t-{i}"), "a", t)).unwrap())
        .collect();
    docs.push(
        String::from_utf8(service::note("u-0", "b", &format!("FINDINGS: No effusion ({THEIRS}).").to_string()))
            .unwrap(),
    );
    let questions = [
        json!({"patient": "a", "question": "What do the notes say about pneumonia?", "variable": "v", "answer": "yes",
            "needle_doc_id": "", "evidence": ["Pneumonia resolving."]})
        .to_string(),
    ];
    let (documents, questions_path) = (dir.path().join("documents.ndjson"), dir.path().join("questions.jsonl"));
    std::fs::write(&documents, docs.join("\n")).unwrap();
    std::fs::write(&questions_path, questions.join("\n")).unwrap();
    let rt = service::runtime();
    let report = rt.block_on(async {
        let pipeline = clinstream::stages::Pipeline::new(&s).unwrap();
        let embedder = clinstream::embed::Embedder::start_async(&s.embed).await.unwrap();
        let llm = clinstream::llm::Llm::new(&s.llm).unwrap().expect("an endpoint");
        let templates = clinstream::query::answer::Templates::load_summary("").unwrap();
        let summarizer = clinstream::eval::qa::EvalLlm { llm: &llm, templates: &templates };
        let strategies = vec!["tree".to_string(), "tree+llm".to_string()];
        let cache = dir.path().join("cache");
        let run = clinstream::eval::qa::QaRun {
            documents: &documents,
            questions: &questions_path,
            budget_tokens: 256,
            window_words: 150,
            strategies: &strategies,
            label_cache: &cache,
            show_errors: false,
            chunker: None,
            fusion: clinstream::store::Fusion::of(&s.store),
            bm25_avg_len: s.store.bm25_avg_len,
            match_concepts: s.serve.match_concepts,
            summaries: Some((&summarizer, 1536)),
            llm: None,
            sample: 1,
            importance: None,
            tree: clinstream::query::raptor::TreeParams { summary_tokens: 48, ..Default::default() },
        };
        clinstream::eval::qa::run(&pipeline, &embedder, &run).await.unwrap()
    });
    let (written, not) = report.abstracts.expect("abstracts counted");
    assert!(written >= 1 && not == 0, "{written} written, {not} not");
    for r in &report.strategies {
        assert_eq!((r.questions, r.over_budget, r.isolation_violations), (1, 0, 0), "{r:?}");
    }
    let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).to_string();
    assert!(sent.contains("Summary:") && sent.contains(MINE), "the summary prompt over patient a's chunks");
    assert!(!sent.contains(THEIRS), "another patient's note reached the LLM");
}

/// `clinstream-lab eval openi --llm`: CLEAR's extraction step — each variable's windows in a report go to the model,
/// which labels it; scored beside the rule labels on the same reports. A report without a mention of a variable
/// gets no call.
#[test]
fn eval_openi_labels_each_variable_with_the_llm_from_its_windows() {
    let Some(server) = LlmServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let proxy = SlowProxy::start(server.port, Duration::ZERO);
    let url = server.url.replacen(&format!(":{}", server.port), &format!(":{}", proxy.port), 1);
    let Some(s) = settings(dir.path(), Some((&url, &server))) else { return };
    let reports = dir.path().join("reports.csv");
    let labels = dir.path().join("labels.csv");
    std::fs::write(
        &reports,
        format!(
            "uid,MeSH,Problems,image,indication,comparison,findings,impression\n\
             1,x,x,x,Cough.,None.,Heart size is enlarged. No pleural effusion ({MINE}).,Cardiomegaly.\n\
             2,x,x,x,Pain.,None.,The lungs are clear.,No acute disease.\n\
             3,x,x,x,Fever.,None.,Right lower lobe pneumonia ({THEIRS}).,Pneumonia.\n"
        ),
    )
    .unwrap();
    std::fs::write(
        &labels,
        "filename,Cardiomegaly,Effusion,Pneumonia,Pneumothorax,Edema\nCXR1,1,0,0,0,0\nCXR2,0,0,0,0,0\n\
         CXR3,0,0,1,0,0\n",
    )
    .unwrap();
    let rt = service::runtime();
    let r = rt.block_on(async {
        let pipeline = clinstream::stages::Pipeline::new(&s).unwrap();
        let llm = clinstream::llm::Llm::new(&s.llm).unwrap().expect("an endpoint");
        let templates = clinstream::query::answer::Templates::default();
        let eval_llm = clinstream::eval::qa::EvalLlm { llm: &llm, templates: &templates };
        // Every second report: 1 and 3.
        clinstream::eval::openi::run_llm(&pipeline, &reports, &labels, &eval_llm, 2, 256, s.clear.window_words)
            .await
            .unwrap()
    });
    assert_eq!(r.n, 2, "{r:?}");
    // Report 1 mentions cardiomegaly and an effusion, report 3 a pneumonia: three calls; the other seven pairs have
    // no mention and no call.
    assert_eq!((r.calls, r.no_window, r.failed), (3, 7, 0), "{r:?}");
    assert_eq!(r.rule["cardiomegaly"].tp + r.rule["pneumonia"].tp, 2, "the rules label both: {r:?}");
    for p in r.llm.values() {
        assert!((0.0..=1.0).contains(&p.f1) && p.tp + p.fn_ <= 1, "{r:?}");
    }
    assert!(r.prompt_tokens_mean > 0.0 && r.ms_mean > 0.0, "{r:?}");
    // The two reports' windows reached the model (each call holds one report's text only).
    let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).to_string();
    assert!(sent.contains(MINE) && sent.contains(THEIRS), "the windows are the prompts' passages");
}

/// Notes of one patient about different things (several chunks each), each naming the patient's canary.
fn tree_notes(canary: &str) -> Vec<String> {
    [
        "HISTORY: Chest pain on exertion for two weeks, relieved by rest. Troponin normal.\n\nPLAN: Stable angina. \
         Continue aspirin and the beta blocker; add a statin and sublingual nitroglycerin; stress test ordered.",
        "HISTORY: Three days of worsening dyspnea and productive cough with fever.\n\nPLAN: Community-acquired \
         pneumonia. Start ceftriaxone and azithromycin; chest x-ray shows right lower lobe consolidation.",
        "HISTORY: Follow-up for type 2 diabetes mellitus. Hemoglobin A1c is 8.4 percent despite metformin.\n\n\
         PLAN: Poorly controlled diabetes. Add glipizide; retinal screening ordered; dietitian referral.",
        "HISTORY: Cough has improved after the antibiotics for pneumonia; no fever.\n\nPLAN: Pneumonia resolving. \
         Repeat chest x-ray in six weeks to confirm that the consolidation cleared.",
    ]
    .iter()
    .map(|t| format!("{t} Patient code {canary}."))
    .collect()
}

fn tree_settings(s: &mut Settings) {
    s.raptor.enabled = true;
    s.raptor.abstractive = true;
    s.raptor.summary_tokens = 48;
    s.chunking.chunk_tokens = 32;
    s.llm.max_tokens = 64;
}

/// Both patients' tree notes: (id, patient, text).
fn both_trees() -> Vec<(String, &'static str, String)> {
    tree_notes(MINE)
        .into_iter()
        .enumerate()
        .map(|(i, t)| (format!("ab-{i}"), PATIENT, t))
        .chain(tree_notes(THEIRS).into_iter().enumerate().map(|(i, t)| (format!("ob-{i}"), OTHER, t)))
        .collect()
}

/// RAPTOR's abstractive summaries (`raptor.abstractive`): written by the LLM in the background, never before a note
/// is acknowledged. With an LLM that accepts connections and never answers, every note is still indexed and its
/// tree built (extractive), the summaries wait. With the real LLM: `abstracts_written`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_gets_abstractive_summaries_in_the_background_from_one_patients_text() {
    use clinstream::stages::Pipeline;
    use std::sync::Arc;

    let _ = service::logs();
    let Some(server) = LlmServer::start() else { return };
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let silent_url = format!("http://127.0.0.1:{}/v1", silent.local_addr().unwrap().port());
    let Some(mut s) = settings(dir.path(), Some((&silent_url, &server))) else { return };
    tree_settings(&mut s);
    s.llm.timeout_ms = 3_600_000;
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = clinstream::index::Indexer::start(&s, pipeline.compiled()).await.unwrap();
    for (id, patient, text) in &both_trees() {
        let doc = Arc::new(pipeline.process(&service::note(id, patient, text)).unwrap());
        indexer.index(&doc).await.unwrap();
    }
    assert!(indexer.tree_work_pending() >= 1, "the summaries wait for the LLM");
    let extractive = indexer.store().summaries(&format!("Patient/{PATIENT}")).await.unwrap();
    assert!(!extractive.is_empty(), "the tree is built without the LLM");
    assert!(extractive.values().all(|n| n.payload.get("abstract").is_none() && n.payload["text"].is_string()));
    drop(indexer);

    let dir = tempfile::tempdir().unwrap();
    let Some(s) = settings(dir.path(), Some((&server.url, &server))) else { return };
    abstracts_written(s, &server).await;
    drop(silent);
}

/// The same against a real Qdrant server, summaries stored by their members' mean vector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_store_gets_abstractive_summaries_in_the_background_from_one_patients_text() {
    let _ = service::logs();
    let Some(server) = LlmServer::start() else { return };
    let Some(qdrant) = common::qdrant::QdrantServer::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let Some(mut s) = settings(dir.path(), Some((&server.url, &server))) else { return };
    s.store.kind = "qdrant".into();
    s.store.url = qdrant.url.clone();
    s.store.api_key = Secret::new(qdrant.api_key.clone());
    s.store.collection = common::qdrant::unique_collection("abstracts");
    s.store.timeout_ms = 60_000;
    s.raptor.summary_vectors = "mean".into();
    abstracts_written(s, &server).await;
}

/// With the real LLM behind a recording proxy: every node of both patients' trees gets an abstract and its model
/// beside its extractive text and citations, is searched by the abstract's embedding (`summary_vectors = "text"`),
/// and each request to the LLM holds one patient's text only; re-indexing the same notes rebuilds the same nodes,
/// which keep their abstracts and ask the LLM nothing more; nothing of the notes or the abstracts is logged.
async fn abstracts_written(mut s: Settings, server: &LlmServer) {
    use clinstream::stages::Pipeline;
    use clinstream::store::{Filters, Query, Record};
    use std::sync::Arc;

    let proxy = SlowProxy::start(server.port, Duration::ZERO);
    s.llm.base_url = server.url.replacen(&format!(":{}", server.port), &format!(":{}", proxy.port), 1);
    tree_settings(&mut s);
    let notes = both_trees();
    let pipeline = Arc::new(Pipeline::new(&s).unwrap());
    let indexer = clinstream::index::Indexer::start(&s, pipeline.compiled()).await.unwrap();
    let index_all = || async {
        for (id, patient, text) in &notes {
            let doc = Arc::new(pipeline.process(&service::note(id, patient, text)).unwrap());
            indexer.index(&doc).await.unwrap();
        }
        indexer.tree_work_settled().await;
    };
    let store = indexer.store().clone();
    let requests = || {
        let sent = String::from_utf8_lossy(&proxy.sent.lock().unwrap()).to_string();
        sent.split("POST /").filter(|r| !r.is_empty()).map(str::to_string).collect::<Vec<_>>()
    };
    index_all().await;
    let mut abstracts = Vec::new();
    for patient in [PATIENT, OTHER] {
        let nodes = store.summaries(&format!("Patient/{patient}")).await.unwrap();
        assert!(!nodes.is_empty(), "{patient} has a tree");
        for n in nodes.values() {
            let a = n.payload.get("abstract").and_then(Value::as_str).unwrap_or_default();
            assert!(!a.trim().is_empty(), "a node without an abstract: {:?}", n.payload.get("level"));
            assert!(n.payload["abstract_model"].is_string(), "the model that wrote it");
            assert!(n.payload["text"].is_string() && n.payload["sentences"].is_array(), "the citations stay");
            abstracts.push((n.id.clone(), a.to_string(), patient));
        }
    }
    if s.raptor.summary_vectors == "text" {
        // Searched by the abstract: its own embedding finds it.
        let (id, text, _) = abstracts.iter().find(|(_, _, p)| *p == PATIENT).unwrap().clone();
        let own = indexer.embedder().embed(&[text.as_str()]).await.unwrap().remove(0);
        let mine = Filters { patient: Some(format!("Patient/{PATIENT}")), ..Default::default() };
        let q = Query {
            dense: own,
            sparse: Default::default(),
            filters: mine,
            top: 3,
            fields: None,
            record: Record::Summaries,
            matched: Vec::new(),
        };
        let found = store.search(&q).await.unwrap();
        assert!(found.iter().any(|h| h.id == id && h.score > 0.999), "{found:?}");
    }
    // Each request to the LLM holds one patient's text.
    let asked = requests();
    assert!(asked.len() >= abstracts.len(), "{} requests for {} nodes", asked.len(), abstracts.len());
    assert!(asked.iter().any(|r| r.contains(MINE)) && asked.iter().any(|r| r.contains(THEIRS)));
    assert!(asked.iter().all(|r| !(r.contains(MINE) && r.contains(THEIRS))), "two patients in one request");
    // The same notes again: the same nodes, their abstracts kept, nothing more asked.
    index_all().await;
    for patient in [PATIENT, OTHER] {
        let nodes = store.summaries(&format!("Patient/{patient}")).await.unwrap();
        let before: Vec<_> = abstracts.iter().filter(|(_, _, p)| *p == patient).collect();
        assert_eq!(nodes.len(), before.len());
        for (id, text, _) in before {
            assert_eq!(nodes[id].payload["abstract"].as_str(), Some(text.as_str()));
        }
    }
    assert_eq!(requests().len(), asked.len(), "kept abstracts are not asked again");
    let metrics = clinstream::telemetry::metrics::metrics().render();
    assert!(
        common::metric_value(&metrics, "clinstream_raptor_abstracts_total{outcome=\"written\"}").unwrap()
            >= abstracts.len() as f64
    );
    // Nothing of the notes or the abstracts in the logs.
    let log = service::log_text();
    for secret in [MINE, THEIRS].into_iter().chain(abstracts.iter().map(|(_, a, _)| a.as_str())) {
        assert!(secret.len() < 12 || !log.contains(secret), "the log holds note or abstract text");
    }
}
