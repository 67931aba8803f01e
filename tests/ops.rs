//! Operations: `/metrics` passes promtool and carries no PHI; a real Prometheus server scrapes a running worker;
//! the dashboard queries only exported metrics; the Helm chart renders and lints with the real Helm library.
//!
//! promtool and prometheus come from Debian's `prometheus` package, the Helm library from PyPI
//! `helm-python-sdk` (installed into `.tools/helm` by `make tools`, which `make test` runs). Where one is missing
//! the test says so and skips, so `cargo test` on a bare machine still runs everything else.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

/// A worker reading stdin (kept open) with metrics on `port`.
fn worker(port: u16, out: &Path) -> Child {
    clinstream()
        .args(["run", "--no-progress", "--input", "-", "--out"])
        .arg(out)
        .env("CLINSTREAM__METRICS__ADDR", format!("127.0.0.1:{port}"))
        .env("CLINSTREAM__EMBED__ENABLED", "false")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Feeds canary-laden good and bad notes and waits until the worker has finished them.
fn feed(child: &mut Child, port: u16) -> usize {
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = Vec::new();
    for i in 0..5 {
        lines.push(bytes(&valid_doc(
            &format!("ok-{i}"),
            &format!("HPI: {CANARY} denies chest pain.\nASSESSMENT: Pneumonia.\n"),
        )));
    }
    // An id that is not a FHIR id (spaces): it could be anything, so it is never echoed.
    lines.push(
        format!("{{\"resourceType\":\"DocumentReference\",\"id\":\"{}\"}}", CANARY.replace('-', " ")).into_bytes(),
    );
    lines.push(b"not json at all".to_vec());
    for l in &lines {
        stdin.write_all(l).unwrap();
        stdin.write_all(b"\n").unwrap();
    }
    stdin.flush().unwrap();
    child.stdin = Some(stdin);
    let n = lines.len();
    wait_until(Duration::from_secs(60), "the worker to finish the fed documents", || {
        http_get(port, "/metrics").is_some_and(|(_, body)| {
            let written =
                metric_value(&body, "clinstream_documents_finished_total{outcome=\"written\"}").unwrap_or(0.0);
            let dead =
                metric_value(&body, "clinstream_documents_finished_total{outcome=\"dead_lettered\"}").unwrap_or(0.0);
            (written + dead) as usize == n
        })
    });
    n
}

fn stop(mut child: Child) -> String {
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn metrics_health_and_promtool_without_phi() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = worker(port, &dir.path().join("out"));
    wait_until(Duration::from_secs(60), "/healthz", || http_get(port, "/healthz").is_some_and(|(s, _)| s == 200));
    let n = feed(&mut child, port);
    let ready = http_get(port, "/readyz");
    assert_eq!(ready.as_ref().map(|r| r.0), Some(200), "ready while the source is open: {ready:?}");
    assert_eq!(http_get(port, "/nope").unwrap().0, 404);
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert_eq!(metric_value(&body, "clinstream_documents_consumed_total"), Some(n as f64));
    assert_eq!(metric_value(&body, "clinstream_dead_letters_total{error_code=\"invalid_id\"}"), Some(1.0));
    assert_eq!(metric_value(&body, "clinstream_dead_letters_total{error_code=\"invalid_json\"}"), Some(1.0));
    assert!(body.contains("clinstream_stage_duration_seconds_bucket{stage=\"entities\""));
    assert!(body.contains("clinstream_build_info{"));
    for name in clinstream::telemetry::metrics::NAMES {
        if clinstream::telemetry::metrics::PER_PARTITION.contains(name) {
            // Per assigned Kafka partition: absent in file mode (read back in tests/kafka.rs).
            assert!(!body.contains(name), "{name} without a Kafka partition");
            continue;
        }
        assert!(body.contains(name), "{name} is exported");
    }
    assert!(!body.contains("CANARY"), "no PHI in metrics");
    if have("promtool") {
        let mut p = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let o = p.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "promtool: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    } else {
        eprintln!("SKIPPED promtool check: promtool not installed (make tools)");
    }
    let logs = stop(child);
    assert!(!logs.contains("CANARY"), "no PHI in logs: {logs}");
    let dead = std::fs::read_to_string(dir.path().join("out/dead_letters.ndjson")).unwrap();
    assert_eq!(dead.lines().count(), 2);
    assert!(!dead.contains("CANARY"), "no PHI in dead letters (the invalid id is not echoed)");
}

/// A real Prometheus server on `prom_port` scraping the worker on `port` every second (data in `dir`).
fn prometheus(dir: &Path, port: u16, prom_port: u16) -> Child {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: clinstream\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"),
    )
    .unwrap();
    Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_real_prometheus_scrapes_the_worker() {
    if !have("prometheus") {
        eprintln!("SKIPPED Prometheus scrape test: prometheus not installed (make tools)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (port, prom_port) = (free_port(), free_port());
    let mut child = worker(port, &dir.path().join("out"));
    let mut prom = prometheus(dir.path(), port, prom_port);
    let n = feed(&mut child, port);
    let mut last = String::new();
    let found = (|| {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            if let Some((200, body)) = http_get(prom_port, "/api/v1/query?query=clinstream_documents_consumed_total") {
                let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                if let Some(value) = v["data"]["result"][0]["value"][1].as_str()
                    && value.parse::<f64>().ok() == Some(n as f64)
                {
                    return true;
                }
                last = body;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        false
    })();
    let _ = prom.kill();
    let _ = prom.wait();
    stop(child);
    assert!(found, "Prometheus never reported {n} consumed documents; last answer: {last}");
}

#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/clinstream.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10);
    let mut used = std::collections::BTreeSet::new();
    for e in &exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("clinstream_") {
            let name: String = rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            rest = &rest[i + name.len()..];
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .fold(name.clone(), |n, s| n.strip_suffix(s).map(str::to_string).unwrap_or(n));
            used.insert(base);
        }
    }
    for name in &used {
        assert!(
            clinstream::telemetry::metrics::NAMES.contains(&name.as_str()),
            "the dashboard uses {name}, which the worker does not export"
        );
    }
    assert!(used.len() >= 8, "{used:?}");
}

/// Renders the chart with `values` through the real Helm library; None when the library is not installed.
fn helm(values: serde_json::Value) -> Option<serde_json::Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Command::new("python3")
        .arg(root.join("tests/helm_check.py"))
        .arg(root.join("helm/clinstream"))
        .arg(values.to_string())
        .env("PYTHONPATH", root.join(".tools/helm"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    if stderr.contains("No module named 'helm_python'") {
        eprintln!("SKIPPED Helm test: helm-python-sdk not installed (make tools)");
        return None;
    }
    if !o.status.success() {
        return Some(serde_json::json!({"error": stderr}));
    }
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

#[test]
fn the_helm_chart_renders_and_lints() {
    let Some(default) = helm(serde_json::json!({})) else { return };
    assert!(default.get("error").is_none(), "{default}");
    assert_eq!(default["lint"]["errors"].as_array().map(Vec::len), Some(0), "lint: {}", default["lint"]);
    let m = &default["manifests"];
    let deployment = m["clinstream/templates/workers.yaml"].as_str().unwrap();
    for expected in [
        "kind: StatefulSet",
        "podManagementPolicy: Parallel",
        "fieldPath: metadata.name",
        "name: CLINSTREAM__KAFKA__TRANSACTIONAL_ID",
        "value: \"clinstream-$(POD_NAME)\"",
        "name: CLINSTREAM__KAFKA__GROUP_INSTANCE_ID",
        "value: \"$(POD_NAME)\"",
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "- ALL",
        "path: /healthz",
        "path: /readyz",
        "containerPort: 9464",
        "configMapRef:",
    ] {
        assert!(deployment.contains(expected), "deployment lacks {expected}:\n{deployment}");
    }
    assert!(!deployment.contains("nvidia.com/gpu"));
    let configmap = m["clinstream/templates/configmap.yaml"].as_str().unwrap();
    assert!(configmap.contains("CLINSTREAM__LOG__FORMAT: \"json\""), "{configmap}");
    assert!(configmap.contains("CLINSTREAM__METRICS__ADDR: \"0.0.0.0:9464\""), "{configmap}");
    assert!(m["clinstream/templates/pdb.yaml"].as_str().unwrap().contains("PodDisruptionBudget"));
    assert!(!m["clinstream/templates/hpa.yaml"].as_str().unwrap_or("").contains("HorizontalPodAutoscaler"));

    let gpu = helm(serde_json::json!({
        "gpu": {"enabled": true, "count": 1, "runtimeClassName": "nvidia"},
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "serviceMonitor": {"enabled": true},
        "keda": {"enabled": true},
        "secrets": {"qdrantApiKey": {"enabled": true, "secretName": "q", "key": "k"}}
    }))
    .unwrap();
    assert!(gpu.get("error").is_none(), "{gpu}");
    let m = &gpu["manifests"];
    let deployment = m["clinstream/templates/workers.yaml"].as_str().unwrap();
    for expected in
        ["nvidia.com/gpu: \"1\"", "runtimeClassName: nvidia", "nvidia.com/gpu.present", "NoSchedule", "secretKeyRef"]
    {
        assert!(deployment.contains(expected), "GPU deployment lacks {expected}:\n{deployment}");
    }
    assert!(deployment.contains("CLINSTREAM__STORE__API_KEY"), "the Qdrant API key reaches store.api_key");
    let configmap = m["clinstream/templates/configmap.yaml"].as_str().unwrap();
    for expected in [
        "CLINSTREAM__EMBED__EXECUTION_PROVIDER: \"cuda\"",
        "CLINSTREAM__EMBED__MODEL_FILE: \"model.fp16.onnx\"",
        "CLINSTREAM__EMBED__BATCH_TOKENS: \"65536\"",
        "CLINSTREAM__PIPELINE__IN_FLIGHT: \"1024\"",
        "CLINSTREAM__STORE__SHARDS: \"32\"",
    ] {
        assert!(configmap.contains(expected), "GPU values lack {expected}: {configmap}");
    }
    assert!(deployment.contains("cpu: \"8\""), "GPU pods take the GPU resources: {deployment}");
    // A key in `config` wins over the GPU settings, and appears once.
    let own =
        helm(serde_json::json!({"gpu": {"enabled": true}, "config": {"embed.model_file": "model.onnx"}})).unwrap();
    let configmap = own["manifests"]["clinstream/templates/configmap.yaml"].as_str().unwrap();
    assert_eq!(configmap.matches("CLINSTREAM__EMBED__MODEL_FILE").count(), 1, "{configmap}");
    assert!(configmap.contains("CLINSTREAM__EMBED__MODEL_FILE: \"model.onnx\""), "{configmap}");
    assert!(!deployment.contains("replicas:"), "KEDA owns the replica count");
    assert!(m["clinstream/templates/servicemonitor.yaml"].as_str().unwrap().contains("kind: ServiceMonitor"));
    let keda = m["clinstream/templates/keda.yaml"].as_str().unwrap();
    assert!(
        keda.contains("kind: ScaledObject") && keda.contains("kind: StatefulSet"),
        "KEDA scales the workers: {keda}"
    );
    let pods = m["clinstream/templates/service-pods.yaml"].as_str().unwrap();
    assert!(pods.contains("clusterIP: None"), "the StatefulSet's governing Service is headless: {pods}");

    // The Kafka ids come from the pod's name unless the configuration names them; static membership can be off.
    let own_ids = helm(serde_json::json!({
        "config": {"kafka.transactional_id": "fixed"},
        "kafka": {"staticMembership": false},
        "autoscaling": {"enabled": true}
    }))
    .unwrap();
    assert!(own_ids.get("error").is_none(), "{own_ids}");
    let m = &own_ids["manifests"];
    let workers = m["clinstream/templates/workers.yaml"].as_str().unwrap();
    assert!(!workers.contains("CLINSTREAM__KAFKA__TRANSACTIONAL_ID"), "config's id wins: {workers}");
    assert!(!workers.contains("CLINSTREAM__KAFKA__GROUP_INSTANCE_ID"), "static membership off: {workers}");
    assert!(
        m["clinstream/templates/configmap.yaml"]
            .as_str()
            .unwrap()
            .contains("CLINSTREAM__KAFKA__TRANSACTIONAL_ID: \"fixed\"")
    );
    let hpa = m["clinstream/templates/hpa.yaml"].as_str().unwrap();
    assert!(hpa.contains("kind: HorizontalPodAutoscaler") && hpa.contains("kind: StatefulSet"), "{hpa}");

    // Every CLINSTREAM__ variable the chart can set (ConfigMap and Secret references, all secrets on) must be a
    // setting the worker accepts: an unknown key would stop every pod at start-up.
    let kafka = helm(serde_json::json!({
        "args": ["run", "--no-progress"],
        "gpu": {"enabled": true},
        "config": {"kafka.enabled": "true", "kafka.bootstrap_servers": "kafka:9092",
                   "kafka.schema_registry.url": "https://registry:8081",
                   "kafka.common.security.protocol": "SASL_SSL", "kafka.common.sasl.mechanisms": "SCRAM-SHA-512"},
        "secrets": {"kafkaSasl": {"enabled": true}, "kafkaTls": {"enabled": true}, "qdrantApiKey": {"enabled": true},
                    "schemaRegistry": {"enabled": true}, "fhirBearerToken": {"enabled": true},
                    "fhirSmartKey": {"enabled": true}, "llmApiKey": {"enabled": true}}
    }))
    .unwrap();
    assert!(kafka.get("error").is_none(), "{kafka}");
    let m = &kafka["manifests"];
    let mut env: Vec<(String, String)> = Vec::new();
    for line in m["clinstream/templates/configmap.yaml"].as_str().unwrap().lines() {
        if let Some((k, v)) = line.trim().split_once(": ")
            && k.starts_with("CLINSTREAM__")
        {
            env.push((k.to_string(), v.trim_matches('"').to_string()));
        }
    }
    let deployment = m["clinstream/templates/workers.yaml"].as_str().unwrap();
    let lines: Vec<&str> = deployment.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("- name: CLINSTREAM__") {
            let value = match lines[i + 1].strip_prefix("value: ") {
                Some(v) => v.to_string(),
                None if name.ends_with("PASSWORD") || name.ends_with("API_KEY") || name.ends_with("TOKEN") => {
                    "secret-value".to_string()
                }
                None => "from-a-secret".to_string(),
            };
            env.push((format!("CLINSTREAM__{name}"), value));
        }
    }
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    for expected in [
        "CLINSTREAM__KAFKA__COMMON__SASL__USERNAME",
        "CLINSTREAM__KAFKA__COMMON__SASL__PASSWORD",
        "CLINSTREAM__KAFKA__COMMON__SSL__CA__LOCATION",
        "CLINSTREAM__STORE__API_KEY",
        "CLINSTREAM__KAFKA__SCHEMA_REGISTRY__USERNAME",
        "CLINSTREAM__KAFKA__SCHEMA_REGISTRY__PASSWORD",
        "CLINSTREAM__KAFKA__SCHEMA_REGISTRY__URL",
        "CLINSTREAM__FHIR__BEARER_TOKEN",
        "CLINSTREAM__FHIR__SMART__KEY_FILE",
        "CLINSTREAM__LLM__API_KEY",
        "CLINSTREAM__EMBED__MODEL_FILE",
        "CLINSTREAM__PIPELINE__IN_FLIGHT",
    ] {
        assert!(names.contains(&expected), "{expected} not set by the chart: {names:?}");
    }
    let out = clinstream().args(["config", "print"]).envs(env.iter().map(|(k, v)| (k, v))).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the chart's settings are refused: {}", String::from_utf8_lossy(&out.stderr));
    for expected in [
        "\"sasl.username\" = ",
        "\"ssl.ca.location\" = \"/etc/clinstream/kafka-tls/ca.crt\"",
        "url = \"https://registry:8081\"",
    ] {
        assert!(printed.contains(expected), "{expected} missing from the effective settings:\n{printed}");
    }
    assert!(!printed.contains("secret-value"), "passwords and keys are redacted when printed:\n{printed}");

    // The query service: its own Deployment and Service, pods the workers' selector never picks, the API keys
    // from a Secret, and settings the service accepts.
    let query = helm(serde_json::json!({
        "config": {"store.kind": "qdrant", "store.url": "http://qdrant:6334", "store.alias": "notes"},
        "queryService": {"enabled": true, "config": {"serve.max_budget_tokens": "4096"},
                         "oidc": {"issuer": "https://idp.example.org/realms/ward", "audience": "clinstream",
                                  "patientsClaim": "care_team_patients"},
                         "audit": {"topic": "clinstream.audit.v1", "logKey": {"secretName": "audit-key"}},
                         "llmApiKey": {"secretName": "llm-key"}},
        "secrets": {"qdrantApiKey": {"enabled": true}}
    }))
    .unwrap();
    assert!(query.get("error").is_none(), "{query}");
    assert_eq!(query["lint"]["errors"].as_array().map(Vec::len), Some(0), "lint: {}", query["lint"]);
    let m = &query["manifests"];
    let q = m["clinstream/templates/query-deployment.yaml"].as_str().unwrap();
    for expected in [
        "kind: Deployment",
        "args: [\"serve\"]",
        "app.kubernetes.io/name: clinstream-query",
        "containerPort: 8080",
        "path: /readyz",
        "CLINSTREAM__SERVE__API_KEYS",
        "secretKeyRef: {name: clinstream-api-keys, key: api-keys}",
        "CLINSTREAM__SERVE__MAX_BUDGET_TOKENS",
        "CLINSTREAM__STORE__API_KEY",
        "CLINSTREAM__SERVE__OIDC__ISSUER\n              value: \"https://idp.example.org/realms/ward\"",
        "CLINSTREAM__SERVE__OIDC__AUDIENCE\n              value: \"clinstream\"",
        "CLINSTREAM__SERVE__OIDC__PATIENTS_CLAIM\n              value: \"care_team_patients\"",
        "CLINSTREAM__SERVE__AUDIT__TOPIC\n              value: \"clinstream.audit.v1\"",
        "CLINSTREAM__SERVE__AUDIT__FAIL_CLOSED\n              value: \"true\"",
        "secretKeyRef: {name: audit-key, key: audit-log-key}",
        "CLINSTREAM__LLM__API_KEY",
        "secretKeyRef: {name: llm-key, key: api-key}",
    ] {
        assert!(q.contains(expected), "query deployment lacks {expected}:\n{q}");
    }
    let svc = m["clinstream/templates/query-service.yaml"].as_str().unwrap();
    assert!(svc.contains("kind: Service") && svc.contains("port: 8080") && svc.contains("clinstream-query"), "{svc}");
    let worker = m["clinstream/templates/workers.yaml"].as_str().unwrap();
    let worker_selector = worker.split("selector:").nth(1).unwrap().split("template:").next().unwrap();
    assert!(!worker_selector.contains("query"), "the workers' selector must not match query pods: {worker_selector}");
    let mut env: Vec<(String, String)> = Vec::new();
    let lines: Vec<&str> = q.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("- name: CLINSTREAM__") {
            let value =
                lines[i + 1].strip_prefix("value: ").map_or("k1,k2".to_string(), |v| v.trim_matches('"').to_string());
            env.push((format!("CLINSTREAM__{name}"), value));
        }
    }
    let out = clinstream().args(["config", "print"]).envs(env.iter().map(|(k, v)| (k, v))).output().unwrap();
    assert!(out.status.success(), "the service's settings are refused: {}", String::from_utf8_lossy(&out.stderr));
    let no_audience = helm(serde_json::json!({
        "config": {"store.kind": "qdrant"},
        "queryService": {"enabled": true, "oidc": {"issuer": "https://idp.example.org"}}
    }))
    .unwrap();
    assert!(
        no_audience["error"].as_str().is_some_and(|e| e.contains("audience")),
        "an issuer without an audience is refused: {no_audience}"
    );
    let embedded = helm(serde_json::json!({"queryService": {"enabled": true}})).unwrap();
    assert!(
        embedded["error"].as_str().is_some_and(|e| e.contains("store.kind")),
        "a query Deployment over a pod-local embedded store is refused: {embedded}"
    );

    let bad = helm(serde_json::json!({"image": {"repository": "x", "pullPolicy": "Sometimes"}})).unwrap();
    assert!(bad.get("error").is_some(), "values.schema.json rejects a bad pullPolicy: {bad}");
}

/// Every panel reads 0, not "no data", from start-up: a real Prometheus scrapes a worker that has not seen a
/// document yet and answers every dashboard expression (with `$namespace`/`$pod` as `.*`) with at least one
/// series — which also checks each expression is valid PromQL. Only the per-partition Kafka series are absent
/// until partitions are assigned (`metrics::PER_PARTITION`).
#[test]
fn every_dashboard_series_exists_from_start_up() {
    if !have("prometheus") {
        assert!(std::env::var("CLINSTREAM_REQUIRE_KAFKA").is_err(), "prometheus is missing (make tools)");
        eprintln!("SKIPPED dashboard series test: prometheus not installed (make tools)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (port, prom_port) = (free_port(), free_port());
    let child = worker(port, &dir.path().join("out"));
    wait_until(Duration::from_secs(60), "/readyz", || http_get(port, "/readyz").is_some_and(|(s, _)| s == 200));
    let mut prom = prometheus(dir.path(), port, prom_port);
    let query = |expr: &str| -> Option<serde_json::Value> {
        let encoded: String = expr
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (_, body) = http_get(prom_port, &format!("/api/v1/query?query={encoded}"))?;
        serde_json::from_str(&body).ok()
    };
    // At least three scrapes, so rate() over the panels' windows has samples to work with.
    wait_until(Duration::from_secs(60), "three scrapes", || {
        query("count_over_time(up[1m])").is_some_and(|v| {
            v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0) >= 3.0
        })
    });
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/clinstream.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            if clinstream::telemetry::metrics::PER_PARTITION.iter().any(|m| expr.contains(m)) {
                continue;
            }
            let expr = expr.replace("$namespace", ".*").replace("$pod", ".*");
            checked += 1;
            match query(&expr) {
                Some(v)
                    if v["status"] == "success" && v["data"]["result"].as_array().is_some_and(|r| !r.is_empty()) => {}
                other => problems.push(format!("{expr}\n  -> {other:?}")),
            }
        }
    }
    let _ = prom.kill();
    let _ = prom.wait();
    stop(child);
    assert!(checked >= 25, "only {checked} expressions checked");
    assert!(problems.is_empty(), "dashboard expressions with no data at start-up:\n{}", problems.join("\n"));
}
