//! The container image run as the Helm chart runs it.
//!
//! Each test builds an image from the binary under test with `tools/image/build.sh` (the same Containerfile as
//! `make image`: the Dockerfile's runtime stage on a Debian bookworm base made with mmdebstrap), renders the chart
//! through the real Helm library, and starts the container under podman (runc) with what the rendered Deployment
//! says: image, args, environment (the ConfigMap and the container's own env), the security context (read-only root
//! filesystem, every capability dropped, no privilege escalation, uid/gid 10001), the volumes at their mount paths
//! (emptyDirs as tmpfs), the probes' paths and the termination grace period. A chart change that breaks the pod
//! breaks these tests. The one difference: the pod's network is the host's (a test broker on loopback), so the
//! metrics port is moved to a free one after checking that the chart's containerPort is the one it listens on.
//!
//! Needs podman, runc and mmdebstrap (Debian; `make tools` installs them) and the Helm library (`make tools`);
//! without them the tests skip loudly, and fail under `CLINSTREAM_REQUIRE_IMAGE=1` (`make test`).

mod common;
#[allow(unused_imports)]
mod kafka_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]).env("CONTAINERS_CONF", root().join("tools/image/containers.conf"));
    c
}

/// Builds `localhost/clinstream:test` from the binary under test once per test process; None (a loud skip) when
/// the container tools are missing, a failure under CLINSTREAM_REQUIRE_IMAGE=1.
fn image() -> Option<&'static str> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    const TAG: &str = "localhost/clinstream:test";
    let built = BUILT.get_or_init(|| {
        let missing: Vec<&str> = ["podman", "runc", "mmdebstrap"]
            .into_iter()
            .filter(|t| {
                !Command::new("sh")
                    .arg("-c")
                    .arg(format!("command -v {t} >/dev/null"))
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .collect();
        if !missing.is_empty() {
            return Err(format!("{} not installed (make tools)", missing.join(", ")));
        }
        let o = Command::new(root().join("tools/image/build.sh"))
            .arg(TAG)
            .env("BIN", env!("CARGO_BIN_EXE_clinstream"))
            .output()
            .unwrap();
        if !o.status.success() {
            panic!(
                "tools/image/build.sh failed: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(())
    });
    match built {
        Ok(()) => Some(TAG),
        Err(why) => {
            assert!(
                std::env::var("CLINSTREAM_REQUIRE_IMAGE").as_deref() != Ok("1"),
                "container test cannot run: {why}"
            );
            eprintln!("SKIPPED container test: {why}");
            None
        }
    }
}

/// The chart rendered with `values`, each manifest parsed; None when the Helm library is missing (loud skip, or a
/// failure under CLINSTREAM_REQUIRE_IMAGE=1).
fn chart(values: Value) -> Option<Value> {
    let o = Command::new("python3")
        .arg(root().join("tests/helm_check.py"))
        .arg(root().join("helm/clinstream"))
        .arg(values.to_string())
        .arg("--objects")
        .env("PYTHONPATH", root().join(".tools/helm"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    if stderr.contains("No module named") {
        assert!(std::env::var("CLINSTREAM_REQUIRE_IMAGE").as_deref() != Ok("1"), "Helm library missing: {stderr}");
        eprintln!("SKIPPED container test: the Helm library or PyYAML is not installed (make tools)");
        return None;
    }
    assert!(o.status.success(), "chart did not render: {stderr}");
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    Some(out["objects"].clone())
}

/// What the rendered chart says about the worker's pod, as a `podman run` command.
struct Pod {
    args: Vec<String>,
    env: Vec<(String, String)>,
    image: String,
    grace: u64,
    liveness: String,
    readiness: String,
    podman: Vec<String>,
}

fn pod(objects: &Value, input: &Path, output: &Path) -> Pod {
    let first = |path: &str| objects[path][0].clone();
    let workers = first("clinstream/templates/workers.yaml");
    assert_eq!(workers["kind"], "StatefulSet", "the workers keep their names across restarts");
    let configmap = first("clinstream/templates/configmap.yaml");
    let spec = &workers["spec"]["template"]["spec"];
    // The first replica's name, as the StatefulSet gives it.
    let pod_name = format!("{}-0", workers["metadata"]["name"].as_str().unwrap());
    let c = &spec["containers"][0];
    let mut env: Vec<(String, String)> = Vec::new();
    for from in c["envFrom"].as_array().into_iter().flatten() {
        if from.get("configMapRef").is_some() {
            for (k, v) in configmap["data"].as_object().unwrap() {
                if k.starts_with("CLINSTREAM__") {
                    env.push((k.clone(), v.as_str().unwrap().to_string()));
                }
            }
        }
    }
    for e in c["env"].as_array().into_iter().flatten() {
        // Plain values with `$(VAR)` references to earlier variables, as Kubernetes expands them, and the pod's
        // name (no secrets in these values).
        let value = match (e["value"].as_str(), e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
            (Some(v), _) => env.iter().fold(v.to_string(), |v, (k, x)| v.replace(&format!("$({k})"), x)),
            (None, Some("metadata.name")) => pod_name.clone(),
            _ => panic!("only plain env values and the pod's name in these values: {e}"),
        };
        env.push((e["name"].as_str().unwrap().to_string(), value));
    }
    let (psc, csc) = (&spec["securityContext"], &c["securityContext"]);
    let mut podman = vec!["--network".to_string(), "host".to_string()];
    let user = psc["runAsUser"].as_u64().or(csc["runAsUser"].as_u64()).expect("the chart sets runAsUser");
    let group = psc["runAsGroup"].as_u64().or(csc["runAsGroup"].as_u64()).unwrap_or(user);
    podman.push(format!("--user={user}:{group}"));
    if csc["readOnlyRootFilesystem"].as_bool() == Some(true) {
        podman.push("--read-only".into());
    }
    if csc["allowPrivilegeEscalation"].as_bool() == Some(false) {
        podman.push("--security-opt=no-new-privileges".into());
    }
    for cap in csc["capabilities"]["drop"].as_array().into_iter().flatten() {
        podman.push(format!("--cap-drop={}", cap.as_str().unwrap()));
    }
    let volumes = spec["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().unwrap() {
        let (name, path) = (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap());
        let volume = volumes.iter().find(|v| v["name"] == name).expect("every mount has a volume");
        // `input` and `output` are what a user points at claims (`volumes.input`/`volumes.output`): here the test's
        // directories; any other emptyDir becomes a tmpfs.
        if name == "input" {
            podman.push(format!(
                "--volume={}:{path}{}",
                input.display(),
                if m["readOnly"] == true { ":ro" } else { "" }
            ));
        } else if name == "output" {
            podman.push(format!("--volume={}:{path}", output.display()));
        } else if volume.get("emptyDir").is_some() {
            podman.push(format!("--tmpfs={path}:rw,mode=1777"));
        } else {
            panic!("the test does not know the volume {name} at {path}");
        }
    }
    let args = c["args"].as_array().map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect());
    let port = c["ports"].as_array().unwrap().iter().find(|p| p["name"] == "metrics").expect("a metrics port");
    let listen = env.iter().find(|(k, _)| k == "CLINSTREAM__METRICS__ADDR").map(|(_, v)| v.clone()).unwrap();
    assert_eq!(
        listen.rsplit(':').next().unwrap().parse::<u64>().ok(),
        port["containerPort"].as_u64(),
        "the chart's containerPort is where the worker listens"
    );
    let probe = |p: &str| {
        assert_eq!(c[p]["httpGet"]["port"], "metrics", "{p} probes the metrics port");
        c[p]["httpGet"]["path"].as_str().unwrap().to_string()
    };
    Pod {
        args: args.unwrap_or_default(),
        env,
        image: c["image"].as_str().unwrap().to_string(),
        grace: spec["terminationGracePeriodSeconds"].as_u64().unwrap_or(30),
        liveness: probe("livenessProbe"),
        readiness: probe("readinessProbe"),
        podman,
    }
}

fn writable_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut perms = std::fs::metadata(dir.path()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o777);
    std::fs::set_permissions(dir.path(), perms).unwrap();
    dir
}

fn image_values(tag: &str) -> Value {
    let (repository, tag) = tag.rsplit_once(':').unwrap();
    serde_json::json!({"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}})
}

#[test]
fn the_image_processes_examples_as_the_chart_runs_it() {
    let Some(tag) = image() else { return };
    let Some(objects) = chart(image_values(tag)) else { return };
    let output = writable_dir();
    let p = pod(&objects, &root().join("examples"), output.path());
    assert_eq!(p.image, tag, "the chart runs the image it names");
    assert!(p.podman.contains(&"--read-only".to_string()), "read-only root: {:?}", p.podman);
    assert!(p.podman.iter().any(|a| a == "--cap-drop=ALL"), "all capabilities dropped: {:?}", p.podman);
    assert!(p.podman.iter().any(|a| a == "--user=10001:10001"), "non-root: {:?}", p.podman);
    let inspect = podman().args(["image", "inspect", tag, "--format", "{{.Config.User}}"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&inspect.stdout).trim(), "10001:10001", "the image's own user");
    let name = format!("clinstream-examples-{}", std::process::id());
    let mut cmd = podman();
    cmd.args(["run", "--rm", "--name", &name]).args(&p.podman);
    for (k, v) in &p.env {
        cmd.arg(format!("--env={k}={v}"));
    }
    cmd.arg("--env=CLINSTREAM__METRICS__ADDR=127.0.0.1:0").arg(tag).args(&p.args);
    let o = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    // examples/ holds one note that is only referenced by url: finished with one dead letter (exit 3, README).
    assert_eq!(o.status.code(), Some(3), "{stdout}{stderr}");
    let read = |f: &str| std::fs::read_to_string(output.path().join(f)).unwrap_or_default();
    let dead_letters = read("dead_letters.ndjson");
    let dead: Vec<&str> = dead_letters.lines().collect();
    assert_eq!(dead.len(), 1, "{dead_letters}");
    assert!(dead[0].contains("attachment_by_reference"), "{}", dead[0]);
    assert!(read("notes.ndjson").lines().count() >= 40, "every other example is processed");
    assert!(read("variables.ndjson").lines().count() > 100);
    assert!(output.path().join("qdrant").is_dir(), "the embedded store lives in the output volume");
    // The measuring tools are another binary, not shipped: the worker has no `bench`, `eval` or `vocab`, and
    // there is no `clinstream-lab` in the image.
    for lab in ["bench", "eval", "vocab"] {
        let o = podman().args(["run", "--rm", "--network=none", tag, lab, "--help"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "`clinstream {lab}` in the image: {stderr}");
        assert!(stderr.contains(&format!("unrecognized subcommand '{lab}'")), "{stderr}");
    }
    let o = podman()
        .args(["run", "--rm", "--network=none", "--entrypoint=/usr/local/bin/clinstream-lab", tag, "--help"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "clinstream-lab is in the image");
    let help = podman().args(["run", "--rm", "--network=none", tag, "--help"]).output().unwrap();
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("context"));
}

/// The worker's pod in Kafka mode as the chart renders it (with `config` added to the chart's config), on the test
/// broker; None when the Helm library is missing (loud skip).
fn kafka_pod(
    tag: &str,
    broker: &kafka_support::Broker,
    names: &kafka_support::Names,
    config: Value,
    (input, output): (&Path, &Path),
) -> Option<Pod> {
    let mut values = image_values(tag);
    values["args"] = serde_json::json!(["run", "--no-progress"]);
    let mut c = serde_json::json!({
        "log.format": "json", "log.level": "info", "metrics.addr": "0.0.0.0:9464",
        "embed.model_dir": "/opt/clinstream/models/all-MiniLM-L6-v2",
        "embed.ort_library": "/opt/onnxruntime/libonnxruntime.so.1.31.1",
        "store.kind": "embedded", "store.path": "/data/output/qdrant",
        "kafka.enabled": "true", "kafka.bootstrap_servers": broker.addr, "kafka.group_id": names.group,
        "kafka.topics": names.input, "kafka.variables_topic": names.variables,
        "kafka.kg_topic": names.kg, "kafka.dlq_topic": names.dlq, "kafka.create_topics": "true",
        "kafka.create_partitions": "2",
    });
    for (k, v) in config.as_object().unwrap() {
        c[k] = v.clone();
    }
    values["config"] = c;
    let objects = chart(values)?;
    Some(pod(&objects, input, output))
}

/// A container started from `p` (detached), removed when dropped; its metrics on `port`.
struct Container {
    name: String,
    port: u16,
}

impl Container {
    fn start(tag: &str, p: &Pod, name: &str) -> Container {
        let port = common::free_port();
        let _ = podman().args(["rm", "-f", name]).output();
        let mut cmd = podman();
        cmd.args(["run", "-d", "--name", name]).args(&p.podman);
        for (k, v) in &p.env {
            cmd.arg(format!("--env={k}={v}"));
        }
        cmd.arg(format!("--env=CLINSTREAM__METRICS__ADDR=127.0.0.1:{port}")).arg(tag).args(&p.args);
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "podman run: {}", String::from_utf8_lossy(&o.stderr));
        Container { name: name.to_string(), port }
    }

    fn logs(&self) -> String {
        let o = podman().args(["logs", &self.name]).output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    }

    fn ok(&self, path: &str) -> bool {
        common::http_get(self.port, path).is_some_and(|(status, _)| status == 200)
    }

    /// Documents finished, from the worker's metrics.
    fn finished(&self) -> f64 {
        common::http_get(self.port, "/metrics")
            .map(|(_, body)| {
                body.lines()
                    .filter(|l| l.starts_with("clinstream_documents_finished_total{"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            })
            .unwrap_or(0.0)
    }

    fn exit_code(&self) -> String {
        let code = podman().args(["inspect", &self.name, "--format", "{{.State.ExitCode}}"]).output().unwrap();
        String::from_utf8_lossy(&code.stdout).trim().to_string()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", &self.name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

fn produce_examples(broker: &kafka_support::Broker, topic: &str) -> usize {
    let path = root().join("examples/synthea/DocumentReference.ndjson");
    let n = std::fs::read_to_string(&path).unwrap().lines().filter(|l| !l.trim().is_empty()).count();
    let produce = common::clinstream()
        .env("CLINSTREAM__KAFKA__BOOTSTRAP_SERVERS", &broker.addr)
        .args(["produce", "--topic", topic, "--input"])
        .arg(path)
        .output()
        .unwrap();
    assert!(produce.status.success(), "{}", String::from_utf8_lossy(&produce.stderr));
    n
}

fn broker_for(test: &str) -> Option<(tempfile::TempDir, kafka_support::Broker)> {
    if !kafka_support::can_start_broker() {
        assert!(std::env::var("CLINSTREAM_REQUIRE_IMAGE").as_deref() != Ok("1"), "no broker for {test}");
        eprintln!("SKIPPED container Kafka test: no noida-db (make tools)");
        return None;
    }
    let dir = kafka_support::test_dir();
    std::fs::create_dir_all(dir.path().join("broker")).unwrap();
    let broker = kafka_support::Broker::start(common::free_port(), &dir.path().join("broker"));
    Some((dir, broker))
}

#[test]
fn the_image_consumes_serves_probes_and_drains_on_sigterm() {
    let Some(tag) = image() else { return };
    let Some((_dir, broker)) = broker_for("the container test") else { return };
    let names = kafka_support::Names::new("image");
    let config = serde_json::json!({"kafka.group_instance_id": "replica-0"});
    let (input, output) = (tempfile::tempdir().unwrap(), writable_dir());
    let Some(p) = kafka_pod(tag, &broker, &names, config, (input.path(), output.path())) else { return };
    let c = Container::start(tag, &p, &format!("clinstream-kafka-{}", std::process::id()));
    assert!(common::try_wait_until(Duration::from_secs(90), || c.ok(&p.liveness)), "liveness never 200: {}", c.logs());
    assert!(
        common::try_wait_until(Duration::from_secs(90), || c.ok(&p.readiness)),
        "readiness never 200: {}",
        c.logs()
    );

    // Events in through the topic the chart configured; the worker in the container processes them.
    let n = produce_examples(&broker, &names.input);
    assert!(
        common::try_wait_until(Duration::from_secs(180), || c.finished() >= n as f64),
        "{} of {n} finished: {}",
        c.finished(),
        c.logs()
    );
    let metrics = common::http_get(c.port, "/metrics").unwrap().1;
    assert!(metrics.contains("clinstream_build_info{"), "metrics served from the container");

    // SIGTERM as the kubelet sends it: the worker drains, commits and exits 0 within the grace period.
    let clock = Instant::now();
    let stop = podman().args(["stop", "-t", &p.grace.to_string(), &c.name]).output().unwrap();
    let took = clock.elapsed();
    assert!(stop.status.success(), "{}", String::from_utf8_lossy(&stop.stderr));
    assert_eq!(c.exit_code(), "0", "clean exit after SIGTERM: {}", c.logs());
    assert!(took < Duration::from_secs(p.grace), "drained in {took:?}, grace {}s", p.grace);
    drop(broker);
}

/// Exactly-once across a replica's crash, as the StatefulSet runs it: the chart's pod with transactions on (its
/// transactional id and static member id derived from the pod's stable name) processes every note inside one
/// open transaction (a commit interval longer than the test, no commit when idle), is SIGKILLed, and its successor
/// — the same pod name, so the same ids — starts at once. The successor's `init_transactions` fences the dead
/// replica's open transaction (aborted, not left to `transaction.timeout.ms`, here 15 minutes), reprocesses from the
/// committed offsets and commits at SIGTERM: a `read_committed` consumer sees every note's outputs exactly once,
/// while the log holds the aborted first copies too. Had the successor waited for the timeout, the deadlines here
/// (minutes) would pass.
#[test]
fn a_killed_replicas_successor_fences_its_open_transaction_at_once() {
    let Some(tag) = image() else { return };
    let Some((_dir, broker)) = broker_for("the successor test") else { return };
    let names = kafka_support::Names::new("succ");
    let config = serde_json::json!({
        "kafka.transactions": "true", "kafka.commit_interval_ms": "3600000", "kafka.commit_idle_ms": "0",
        "kafka.producer.transaction.timeout.ms": "900000",
    });
    let (input, output) = (tempfile::tempdir().unwrap(), writable_dir());
    let Some(p) = kafka_pod(tag, &broker, &names, config, (input.path(), output.path())) else { return };
    let pod_name = p.env.iter().find(|(k, _)| k == "POD_NAME").map(|(_, v)| v.clone()).expect("POD_NAME");
    let id = |key: &str| p.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    assert_eq!(id("CLINSTREAM__KAFKA__TRANSACTIONAL_ID"), Some(format!("clinstream-{pod_name}")));
    assert_eq!(id("CLINSTREAM__KAFKA__GROUP_INSTANCE_ID"), Some(pod_name.clone()));
    let name = format!("clinstream-succ-{}", std::process::id());
    let n = produce_examples(&broker, &names.input);
    let first = Container::start(tag, &p, &name);
    assert!(
        common::try_wait_until(Duration::from_secs(240), || first.finished() >= n as f64),
        "{} of {n} finished: {}",
        first.finished(),
        first.logs()
    );
    // Every note's outputs are in the open transaction: none is visible to a read_committed consumer yet.
    assert!(
        common::try_wait_until(Duration::from_secs(60), || kafka_support::distinct_keys(&broker.addr, &names.kg) == n),
        "the outputs were not sent: {}",
        first.logs()
    );
    let committed = kafka_support::counts_by_key(&kafka_support::read_all(&broker.addr, &names.kg, true));
    assert!(committed.is_empty(), "nothing committed before the kill: {committed:?}");
    let kill = podman().args(["kill", "--signal", "KILL", &name]).output().unwrap();
    assert!(kill.status.success(), "{}", String::from_utf8_lossy(&kill.stderr));
    drop(first);

    // The successor: the same pod (name, env, volumes), started at once.
    let successor = Container::start(tag, &p, &name);
    let started = Instant::now();
    assert!(
        common::try_wait_until(Duration::from_secs(240), || successor.finished() >= n as f64),
        "the successor finished {} of {n}: {}",
        successor.finished(),
        successor.logs()
    );
    let stop = podman().args(["stop", "-t", &p.grace.to_string(), &name]).output().unwrap();
    assert!(stop.status.success(), "{}", String::from_utf8_lossy(&stop.stderr));
    assert_eq!(successor.exit_code(), "0", "clean exit after SIGTERM: {}", successor.logs());
    let took = started.elapsed();
    let committed = kafka_support::counts_by_key(&kafka_support::read_all(&broker.addr, &names.kg, true));
    assert_eq!(committed.len(), n, "every note's graph delta committed once the successor stopped");
    assert!(committed.values().all(|&c| c == 1), "exactly once for read_committed: {committed:?}");
    let all = kafka_support::counts_by_key(&kafka_support::read_all(&broker.addr, &names.kg, false));
    assert!(all.values().all(|&c| c == 2), "the log holds the aborted first copy and the committed one: {all:?}");
    println!(
        "FIGURES successor fencing: {n} notes in the killed replica's open transaction, aborted by its successor \
         (same pod name); the successor processed and committed them in {:.1} s (transaction timeout 900 s)",
        took.as_secs_f64()
    );
}
