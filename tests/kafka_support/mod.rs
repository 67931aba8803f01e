//! Test harness for Kafka mode: a real Kafka-protocol broker, the worker as a child process, and plain
//! librdkafka clients to feed input and read outputs.
//!
//! Broker: `CLINSTREAM_TEST_KAFKA=host:port` points the tests at an existing cluster (Apache Kafka, Redpanda...);
//! otherwise each test binary starts noida-db from `.tools/noida` (installed by `make tools`) on a free port.
//! Topics and groups get a unique suffix per test, and are created through the admin API, so the tests work on
//! any broker. When no broker can be had the tests say SKIPPED — unless `CLINSTREAM_REQUIRE_KAFKA=1` (set by
//! `make test`), where that is a failure.

#![allow(dead_code)]

mod registry;
pub use registry::TestRegistry;

use std::collections::{BTreeMap, HashMap};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

pub const NOIDA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/.tools/noida/noida_db/noida-db");

/// A noida-db broker child, stopped when dropped. A watchdog shell also stops it if the test process dies.
pub struct Broker {
    pub addr: String,
    pub port: u16,
    pub data_dir: PathBuf,
    child: Option<Child>,
}

pub use crate::common::{free_port, try_wait_until, wait_until};

impl Broker {
    /// Starts noida-db on `port` with `data_dir` (kept across restarts).
    pub fn start(port: u16, data_dir: &Path) -> Broker {
        let mut b = Broker { addr: format!("127.0.0.1:{port}"), port, data_dir: data_dir.to_path_buf(), child: None };
        b.restart();
        b
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "broker already running");
        let script = format!(
            "'{NOIDA}' start --only kafka --host 127.0.0.1 --kafka-port {} --data-dir '{}' >>'{}/broker.log' 2>&1 & b=$!; \
             trap 'kill $b 2>/dev/null; wait $b; exit 0' TERM; \
             while kill -0 {} 2>/dev/null && kill -0 $b 2>/dev/null; do sleep 0.2; done; kill $b 2>/dev/null; wait $b",
            self.port,
            self.data_dir.display(),
            self.data_dir.display(),
            std::process::id()
        );
        let child = Command::new("sh").arg("-c").arg(script).spawn().expect("starting noida-db");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&self.addr).is_err() {
            assert!(Instant::now() < deadline, "noida-db did not start on {}", self.addr);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the broker (SIGTERM to the watchdog, which stops noida-db and waits for it to exit: a closed port
    /// alone does not mean its data is on disk, and a broker restarted on the same directory before that would
    /// start from older data).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&self.addr).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The broker shared by a test binary: `CLINSTREAM_TEST_KAFKA`, or a noida-db started once. `None` = skip.
pub fn shared_broker() -> Option<String> {
    static BROKER: OnceLock<Option<(String, Option<Broker>)>> = OnceLock::new();
    let b = BROKER.get_or_init(|| {
        if let Ok(addr) = std::env::var("CLINSTREAM_TEST_KAFKA") {
            return Some((addr, None));
        }
        if !Path::new(NOIDA).exists() {
            return None;
        }
        let dir = tempfile::Builder::new().prefix("clinstream-broker").tempdir().unwrap().keep();
        let broker = Broker::start(free_port(), &dir);
        Some((broker.addr.clone(), Some(broker)))
    });
    match b {
        Some((addr, _)) => Some(addr.clone()),
        None => {
            assert!(
                std::env::var("CLINSTREAM_REQUIRE_KAFKA").as_deref() != Ok("1"),
                "no Kafka broker: run `make tools` (noida-db in .tools/noida) or set CLINSTREAM_TEST_KAFKA"
            );
            eprintln!("SKIPPED: no Kafka broker (run `make tools`, or set CLINSTREAM_TEST_KAFKA=host:port)");
            None
        }
    }
}

/// Noida-db can be started by this harness (for tests that stop and restart their own broker).
pub fn can_start_broker() -> bool {
    if Path::new(NOIDA).exists() {
        return true;
    }
    assert!(std::env::var("CLINSTREAM_REQUIRE_KAFKA").as_deref() != Ok("1"), "noida-db missing: run `make tools`");
    eprintln!("SKIPPED: this test starts and stops its own noida-db broker (run `make tools`)");
    false
}

/// A directory for worker logs; kept (and its path printed) with `CLINSTREAM_KEEP_TEST_DIRS=1`.
pub fn test_dir() -> tempfile::TempDir {
    let mut dir = tempfile::Builder::new().prefix("clinstream-kafka-test").tempdir().unwrap();
    if std::env::var("CLINSTREAM_KEEP_TEST_DIRS").as_deref() == Ok("1") {
        eprintln!("worker logs in {}", dir.path().display());
        dir.disable_cleanup(true);
    }
    dir
}

/// The heavy tests take turns: each runs worker processes on a 2-core machine.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unique names for one test: input topic, output topics, group.
#[derive(Debug, Clone)]
pub struct Names {
    pub input: String,
    pub variables: String,
    pub kg: String,
    pub dlq: String,
    pub group: String,
}

impl Names {
    pub fn new(test: &str) -> Names {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::UNIX_EPOCH.elapsed().map(|d| d.subsec_nanos()).unwrap_or(0);
        let suffix = format!("{test}-{}-{}-{nanos}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        Names {
            input: format!("in-{suffix}"),
            variables: format!("vars-{suffix}"),
            kg: format!("kg-{suffix}"),
            dlq: format!("dlq-{suffix}"),
            group: format!("g-{suffix}"),
        }
    }
}

fn client(addr: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", addr);
    c
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

pub fn create_topic(addr: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = client(addr).create().unwrap();
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let r = rt().block_on(admin.create_topics([&topic], &AdminOptions::new())).unwrap();
    for x in r {
        match x {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err(e) => panic!("create topic {name}: {e:?}"),
        }
    }
}

/// One input record.
#[derive(Debug, Clone)]
pub struct Event {
    pub key: Option<String>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, String)>,
}

impl Event {
    pub fn doc(id: &str, text: &str) -> Event {
        Event { key: Some(id.to_string()), value: valid_doc_bytes(id, text), headers: vec![] }
    }
}

pub fn valid_doc_bytes(id: &str, text: &str) -> Vec<u8> {
    use base64::Engine as _;
    serde_json::to_vec(&serde_json::json!({
        "resourceType": "DocumentReference",
        "id": id,
        "status": "current",
        "subject": {"reference": format!("Patient/{}", id.len() % 7)},
        "content": [{"attachment": {
            "contentType": "text/plain; charset=utf-8",
            "data": base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
        }}]
    }))
    .unwrap()
}

const TEXTS: &[&str] = &[
    "HISTORY OF PRESENT ILLNESS: Patient reports chest pain and shortness of breath.\nASSESSMENT AND PLAN: Pneumonia. Started amoxicillin. Denies fever.",
    "ASSESSMENT: Type 2 diabetes mellitus, on metformin. No evidence of pneumonia.\nPLAN: Check hemoglobin A1c.",
    "SOCIAL HISTORY: Former smoker, quit 10 years ago. Drinks alcohol socially.\nIMPRESSION: Possible pleural effusion.",
    "FAMILY HISTORY: Mother had breast cancer.\nASSESSMENT AND PLAN: Hypertension, continue lisinopril.",
];

/// `n` valid events with ids `{prefix}-{i}`.
pub fn documents(prefix: &str, n: usize) -> Vec<Event> {
    documents_from(prefix, 0..n)
}

fn documents_from(prefix: &str, ids: std::ops::Range<usize>) -> Vec<Event> {
    ids.map(|i| Event::doc(&format!("{prefix}-{i}"), TEXTS[i % TEXTS.len()])).collect()
}

/// Produces `count` more documents after `events` (made by [`documents`] with this prefix), their ids continuing
/// those, and appends them to `events`.
pub fn produce_more(addr: &str, topic: &str, prefix: &str, events: &mut Vec<Event>, count: usize) {
    let more = documents_from(prefix, events.len()..events.len() + count);
    produce(addr, topic, &more);
    events.extend(more);
}

pub fn produce(addr: &str, topic: &str, events: &[Event]) {
    let producer: ThreadedProducer<DefaultProducerContext> =
        client(addr).set("enable.idempotence", "true").set("linger.ms", "5").create().unwrap();
    for e in events {
        let mut headers = OwnedHeaders::new();
        for (k, v) in &e.headers {
            headers = headers.insert(Header { key: k, value: Some(v.as_bytes()) });
        }
        let mut record = BaseRecord::to(topic).payload(&e.value).headers(headers);
        if let Some(k) = &e.key {
            record = record.key(k.as_bytes());
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

fn partitions_of(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    md.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect()
}

/// Every record of `topic` (read_committed or read_uncommitted), reading each partition to its end.
pub fn read_all(addr: &str, topic: &str, read_committed: bool) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = client(addr)
        .set("group.id", format!("reader-{}", free_port()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .create()
        .unwrap();
    let parts = partitions_of(&consumer, topic);
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut at_end: HashMap<i32, bool> = parts.iter().map(|p| (*p, false)).collect();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while at_end.values().any(|e| !e) {
        assert!(Instant::now() < deadline, "reading {topic} did not reach the end");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                at_end.insert(m.partition(), false);
                out.push(m.detach());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    out
}

/// Record counts per key.
pub fn counts_by_key(messages: &[OwnedMessage]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for msg in messages {
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        *m.entry(key).or_insert(0) += 1;
    }
    m
}

/// (committed offset, end offset) per partition of `topic` for `group`.
pub fn committed_and_end(addr: &str, group: &str, topic: &str) -> Vec<(i32, i64, i64)> {
    let consumer: BaseConsumer = client(addr).set("group.id", group).create().unwrap();
    let parts = partitions_of(&consumer, topic);
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        tpl.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    parts
        .iter()
        .map(|p| {
            let (_, high) = consumer.fetch_watermarks(topic, *p, Duration::from_secs(10)).unwrap();
            let c = match committed.find_partition(topic, *p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            };
            (*p, c, high)
        })
        .collect()
}

/// A worker child process with its log file.
pub struct Worker {
    pub child: Child,
    pub log: PathBuf,
    pub stdout: PathBuf,
}

pub struct WorkerConfig<'a> {
    pub addr: &'a str,
    pub names: &'a Names,
    pub transactions: bool,
    pub extra: Vec<(&'a str, String)>,
    pub dir: &'a Path,
    pub tag: &'a str,
}

impl<'a> WorkerConfig<'a> {
    /// Defaults: no transactions, no extra settings.
    pub fn new(addr: &'a str, names: &'a Names, dir: &'a Path, tag: &'a str) -> Self {
        WorkerConfig { addr, names, transactions: false, extra: vec![], dir, tag }
    }
}

impl Worker {
    pub fn start(c: &WorkerConfig<'_>) -> Worker {
        let log = c.dir.join(format!("{}.log", c.tag));
        let stdout = c.dir.join(format!("{}.out", c.tag));
        let mut cmd = crate::common::clinstream();
        let n = c.names;
        cmd.arg("run")
            .env("CLINSTREAM__LOG__LEVEL", "info")
            .env("CLINSTREAM__KAFKA__ENABLED", "true")
            .env("CLINSTREAM__KAFKA__BOOTSTRAP_SERVERS", c.addr)
            .env("CLINSTREAM__KAFKA__GROUP_ID", &n.group)
            .env("CLINSTREAM__KAFKA__TOPICS", &n.input)
            .env("CLINSTREAM__KAFKA__VARIABLES_TOPIC", &n.variables)
            .env("CLINSTREAM__KAFKA__KG_TOPIC", &n.kg)
            .env("CLINSTREAM__KAFKA__DLQ_TOPIC", &n.dlq)
            .env("CLINSTREAM__KAFKA__CREATE_TOPICS", "true")
            .env("CLINSTREAM__KAFKA__CREATE_PARTITIONS", "4")
            .env("CLINSTREAM__KAFKA__COMMIT_INTERVAL_MS", "200")
            .env("CLINSTREAM__KAFKA__TRANSACTIONS", c.transactions.to_string())
            .env("CLINSTREAM__KAFKA__TRANSACTIONAL_ID", format!("tx-{}", n.group))
            .env("CLINSTREAM__PIPELINE__WORKERS", "2")
            // Text outputs only, unless a test turns indexing on through `extra` (applied after these).
            .env("CLINSTREAM__EMBED__ENABLED", "false")
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&log).unwrap());
        for (k, v) in &c.extra {
            cmd.env(k, v);
        }
        Worker { child: cmd.spawn().expect("starting the worker"), log, stdout }
    }

    /// Still running (not exited)?
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn sigterm(&self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
    }

    pub fn sigkill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for exit (panics after `timeout`, killing it) and returns the exit code.
    pub fn wait(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                self.sigkill();
                panic!("worker did not exit within {timeout:?}; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// The last `n` lines of the log (for failure messages).
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Distinct keys on `topic` (read_uncommitted: progress, not the final check).
pub fn distinct_keys(addr: &str, topic: &str) -> usize {
    counts_by_key(&read_all(addr, topic, false)).len()
}

/// The number of CLEAR variables in the default configuration (records per document on the variables topic).
pub fn variables_per_document() -> usize {
    clinstream::config::Settings::load_from(None, Some(Default::default())).unwrap().clear.variables.len()
}
