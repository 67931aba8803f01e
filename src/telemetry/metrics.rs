//! Every Prometheus metric the worker exports, spelled in this one file (dashboards and alerts are built from
//! these names only; `tests/ops.rs` checks the dashboard against `NAMES`). Labels are low-cardinality: stage,
//! outcome, error code, entity kind, versions — never ids or text.
//!
//! The registry is process-wide (`metrics()`); the runner records what the stages measured (`Timings` on the
//! document) once per document, so the stages themselves stay free of side effects.

use std::sync::OnceLock;

use crate::error::{Disposition, ErrorCode};
use crate::model::EntityKind;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Every metric family name exported (without the `_bucket`/`_sum`/`_count` suffixes of histograms).
pub const NAMES: &[&str] = &[
    DOCUMENTS_CONSUMED,
    DOCUMENTS_FINISHED,
    DEAD_LETTERS,
    STAGE_DURATION,
    IN_FLIGHT,
    INPUT_BYTES,
    MENTIONS,
    CONTEXT_TOKENS,
    STARTUP_DURATION,
    BUILD_INFO,
    KAFKA_RECORDS_PRODUCED,
    KAFKA_COMMITS,
    KAFKA_RETRIES,
    KAFKA_REBUILDS,
    KAFKA_PAUSED,
    KAFKA_FETCH_REQUESTS,
    KAFKA_IDLE_PAUSES,
    KAFKA_REBALANCES,
    KAFKA_ASSIGNED,
    CONSUMER_LAG,
    KAFKA_COMMITTED_OFFSET,
    EMBED_BATCH_ITEMS,
    EMBED_BATCH_TOKENS,
    EMBED_TOKENS,
    EMBED_DURATION,
    EMBED_TOKENS_PER_SECOND,
    STORE_UPSERT_DURATION,
    STORE_POINTS,
    STORE_RETRIES,
    CHUNKS_PER_DOCUMENT,
    STORE_MAINTENANCE_DURATION,
    STORE_MAINTENANCE_SHARDS,
    STORE_GROUP_DOCUMENTS,
    STORE_WRITE_DURATION,
    API_REQUESTS,
    API_DURATION,
    API_DENIALS,
    AUDIT_RECORDS,
    LLM_REQUESTS,
    LLM_DURATION,
    LLM_CITATIONS_REFUSED,
    FHIR_FETCHES,
    FHIR_FETCH_DURATION,
];

/// Series that exist only per assigned Kafka partition (none in file mode, none before an assignment);
/// `tests/kafka.rs` reads them back from a Kafka-mode worker.
pub const PER_PARTITION: &[&str] = &[CONSUMER_LAG, KAFKA_COMMITTED_OFFSET];

pub const FHIR_FETCHES: &str = "clinstream_fhir_fetches_total";
pub const FHIR_FETCH_DURATION: &str = "clinstream_fhir_fetch_duration_seconds";
pub const API_REQUESTS: &str = "clinstream_api_requests_total";
pub const API_DURATION: &str = "clinstream_api_request_duration_seconds";
pub const API_DENIALS: &str = "clinstream_api_denials_total";
pub const AUDIT_RECORDS: &str = "clinstream_audit_records_total";
pub const LLM_REQUESTS: &str = "clinstream_llm_requests_total";
pub const LLM_DURATION: &str = "clinstream_llm_request_duration_seconds";
pub const LLM_CITATIONS_REFUSED: &str = "clinstream_llm_citations_refused_total";
pub const RAPTOR_ABSTRACTS: &str = "clinstream_raptor_abstracts_total";
pub const RAPTOR_SUMMARY_VECTORS: &str = "clinstream_raptor_node_vectors_total";
pub const DOCUMENTS_CONSUMED: &str = "clinstream_documents_consumed_total";
pub const DOCUMENTS_FINISHED: &str = "clinstream_documents_finished_total";
pub const DEAD_LETTERS: &str = "clinstream_dead_letters_total";
pub const STAGE_DURATION: &str = "clinstream_stage_duration_seconds";
pub const IN_FLIGHT: &str = "clinstream_in_flight_documents";
pub const INPUT_BYTES: &str = "clinstream_input_bytes_total";
pub const MENTIONS: &str = "clinstream_mentions_total";
pub const CONTEXT_TOKENS: &str = "clinstream_clear_context_tokens";
pub const STARTUP_DURATION: &str = "clinstream_startup_duration_seconds";
pub const BUILD_INFO: &str = "clinstream_build_info";
pub const KAFKA_RECORDS_PRODUCED: &str = "clinstream_kafka_records_produced_total";
pub const KAFKA_COMMITS: &str = "clinstream_kafka_commits_total";
pub const KAFKA_RETRIES: &str = "clinstream_kafka_retries_total";
pub const KAFKA_REBUILDS: &str = "clinstream_kafka_client_rebuilds_total";
pub const KAFKA_PAUSED: &str = "clinstream_kafka_paused";
pub const KAFKA_FETCH_REQUESTS: &str = "clinstream_kafka_fetch_requests_total";
pub const KAFKA_IDLE_PAUSES: &str = "clinstream_kafka_idle_pauses_total";
pub const KAFKA_REBALANCES: &str = "clinstream_kafka_rebalances_total";
pub const KAFKA_ASSIGNED: &str = "clinstream_kafka_assigned_partitions";
pub const CONSUMER_LAG: &str = "clinstream_consumer_lag_messages";
pub const KAFKA_COMMITTED_OFFSET: &str = "clinstream_kafka_committed_offset";
pub const EMBED_BATCH_ITEMS: &str = "clinstream_embed_batch_items";
pub const EMBED_BATCH_TOKENS: &str = "clinstream_embed_batch_tokens";
pub const EMBED_TOKENS: &str = "clinstream_embed_tokens_total";
pub const EMBED_DURATION: &str = "clinstream_embed_batch_duration_seconds";
pub const EMBED_TOKENS_PER_SECOND: &str = "clinstream_embed_tokens_per_second";
pub const STORE_UPSERT_DURATION: &str = "clinstream_qdrant_upsert_duration_seconds";
pub const STORE_POINTS: &str = "clinstream_qdrant_points_total";
pub const STORE_RETRIES: &str = "clinstream_qdrant_retries_total";
pub const CHUNKS_PER_DOCUMENT: &str = "clinstream_chunks_per_document";
pub const STORE_MAINTENANCE_DURATION: &str = "clinstream_qdrant_maintenance_duration_seconds";
pub const STORE_MAINTENANCE_SHARDS: &str = "clinstream_qdrant_maintenance_shards";
pub const STORE_GROUP_DOCUMENTS: &str = "clinstream_qdrant_group_documents";
pub const STORE_WRITE_DURATION: &str = "clinstream_qdrant_write_duration_seconds";

pub struct Metrics {
    registry: Registry,
    pub documents_consumed: IntCounter,
    /// `outcome`: written | dead_lettered.
    pub documents_finished: IntCounterVec,
    /// `error_code`: an `ErrorCode::as_str()`.
    pub dead_letters: IntCounterVec,
    /// `stage`: decode | sections | sentences | entities | variables | kg | sink.
    pub stage_duration: HistogramVec,
    pub in_flight: IntGauge,
    pub input_bytes: IntCounter,
    /// `kind`: the six entity kinds.
    pub mentions: IntCounterVec,
    /// Context tokens kept per (document, variable) — the CLEAR budget at work.
    pub context_tokens: Histogram,
    pub startup_duration: prometheus::Gauge,
    /// Always 1; labels `version`, `lexicon_version`, `model`, `execution_provider`.
    pub build_info: IntGaugeVec,
    /// `output`: variables | kg | dlq — records confirmed delivered.
    pub records_produced: IntCounterVec,
    /// `outcome`: ok | failed.
    pub commits: IntCounterVec,
    /// `operation`: deliver | commit | admin | init | registry — transient failures retried.
    pub retries: IntCounterVec,
    /// `client`: consumer | producer — the client found in a fatal state when the worker rebuilt both in-process.
    pub kafka_rebuilds: IntCounterVec,
    /// 1 while the assigned partitions are paused because the in-flight budget is exhausted.
    pub paused: IntGauge,
    /// Fetch requests the input consumer sent (from librdkafka's statistics, every 5 s).
    pub fetch_requests: IntCounter,
    /// Idle pauses against a broker that answers empty fetches at once (`kafka.idle_backoff_ms`).
    pub idle_pauses: IntCounter,
    /// `kind`: assign | revoke.
    pub rebalances: IntCounterVec,
    pub assigned: IntGauge,
    /// `topic`, `partition` (assigned ones only): messages between the committed watermark and the partition's end.
    pub consumer_lag: IntGaugeVec,
    /// `topic`, `partition` (assigned ones only): the offset this worker last committed.
    pub committed_offset: IntGaugeVec,
    /// Inputs per model batch.
    pub embed_batch_items: Histogram,
    /// Tokens per model batch, padding included (longest × inputs).
    pub embed_batch_tokens: Histogram,
    /// Real (unpadded) tokens embedded.
    pub embed_tokens: IntCounter,
    pub embed_duration: Histogram,
    /// Real tokens per second of the latest batch.
    pub embed_tokens_per_second: prometheus::Gauge,
    /// `store`: embedded | qdrant. Time of one upsert request (wait=true), retries excluded.
    pub store_upsert_duration: HistogramVec,
    /// `operation`: upserted | deleted_documents.
    pub store_points: IntCounterVec,
    /// Transient store failures retried.
    pub store_retries: IntCounter,
    pub chunks_per_document: Histogram,
    /// Embedded store: one background flush + optimisation (`store.maintain_every`).
    pub store_maintenance_duration: Histogram,
    /// Embedded store, `state`: running | waiting: shards being maintained now, and shards due and waiting for a
    /// slot (`store.maintain_concurrency`).
    pub store_maintenance_shards: IntGaugeVec,
    /// Documents per grouped store write (`store::Writer`: one upsert of their points, one delete of their older
    /// versions).
    pub store_group_documents: Histogram,
    /// Time of one grouped store write (upserts and the delete of older versions); its sum over a run's length is
    /// how busy the one writer was.
    pub store_write_duration: Histogram,
    /// `route`: context | search | other; `status`: the HTTP status code. Query-service requests answered.
    pub api_requests: IntCounterVec,
    /// `route`: context | search. Time from request to response, auth and queueing included.
    pub api_duration: HistogramVec,
    /// `reason`: one of `DENIAL_REASONS`. Query-service requests refused for who asked (401, 403, and 503 while the
    /// identity provider's keys cannot be had).
    pub api_denials: IntCounterVec,
    /// `sink`: kafka | log; `outcome`: delivered | failed. Audit records of query-service requests.
    pub audit_records: IntCounterVec,
    /// `outcome`: ok | timeout | unavailable | failed | unusable. Generations asked of the LLM (`/v1/answer`).
    pub llm_requests: IntCounterVec,
    /// Time of one generation at the LLM endpoint (permit wait and retries included).
    pub llm_duration: Histogram,
    /// Citations the LLM made of passages outside the context it was given (dropped).
    pub llm_citations_refused: IntCounter,
    /// `outcome`: written | failed | unusable | replaced. Abstractive summaries of RAPTOR's nodes asked of the LLM
    /// (`raptor.abstractive`): stored; the LLM failed (timeout, unavailable, refused); it answered nothing usable;
    /// the node was rebuilt away before its summary was stored.
    pub raptor_abstracts: IntCounterVec,
    /// `outcome`: `embedded` (summaries whose text vector was stored off the acknowledgement path,
    /// `raptor.background_vectors`) or `failed` (rounds that stored nothing: the model or the store failed).
    pub raptor_summary_vectors: IntCounterVec,
    /// `outcome`: one of `FETCH_OUTCOMES`. Attachment fetches by reference, each attempt counted.
    pub fhir_fetches: IntCounterVec,
    /// Time of one fetch attempt (connection, response and body), whatever its outcome.
    pub fhir_fetch_duration: Histogram,
}

/// Every `reason` of `clinstream_api_denials_total`: no credentials, an unknown key, an invalid or expired token,
/// the identity provider's keys unavailable, a patient outside the caller's set.
pub const DENIAL_REASONS: &[&str] =
    &["no_credentials", "unknown_key", "token_invalid", "token_expired", "auth_unavailable", "forbidden_patient"];

/// Every `outcome` of `clinstream_fhir_fetches_total`: `ok`; `not_found` (404/410); `refused` (another 4xx, or
/// not a Binary); `too_large`; `retried` (connection error, timeout, 429, 5xx — retried); `unauthorized`
/// (401/403, token refused); `token` (a SMART access token fetched).
pub const FETCH_OUTCOMES: &[&str] = &["ok", "not_found", "refused", "too_large", "retried", "unauthorized", "token"];

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
    r.register(Box::new(m.clone())).expect("metric names are unique");
    m
}

impl Metrics {
    fn new() -> Self {
        let r = Registry::new();
        let latency =
            vec![0.00002, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5];
        Metrics {
            documents_consumed: register(
                &r,
                IntCounter::new(DOCUMENTS_CONSUMED, "Events taken from the source.").unwrap(),
            ),
            documents_finished: register(
                &r,
                IntCounterVec::new(Opts::new(DOCUMENTS_FINISHED, "Events finished, by outcome."), &["outcome"])
                    .unwrap(),
            ),
            dead_letters: register(
                &r,
                IntCounterVec::new(Opts::new(DEAD_LETTERS, "Dead-lettered events, by error code."), &["error_code"])
                    .unwrap(),
            ),
            stage_duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(STAGE_DURATION, "Time per document in each stage.").buckets(latency),
                    &["stage"],
                )
                .unwrap(),
            ),
            in_flight: register(&r, IntGauge::new(IN_FLIGHT, "Documents being processed now.").unwrap()),
            input_bytes: register(&r, IntCounter::new(INPUT_BYTES, "Bytes of input consumed.").unwrap()),
            mentions: register(
                &r,
                IntCounterVec::new(Opts::new(MENTIONS, "Entity mentions found, by kind."), &["kind"]).unwrap(),
            ),
            context_tokens: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(CONTEXT_TOKENS, "Context tokens kept per document and CLEAR variable.")
                        .buckets(vec![0.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0]),
                )
                .unwrap(),
            ),
            startup_duration: register(
                &r,
                prometheus::Gauge::new(
                    STARTUP_DURATION,
                    "Start-up time: lexicon and variables, and the embedding model when indexing.",
                )
                .unwrap(),
            ),
            build_info: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(BUILD_INFO, "Build and model information (always 1)."),
                    &["version", "lexicon_version", "model", "execution_provider"],
                )
                .unwrap(),
            ),
            records_produced: register(
                &r,
                IntCounterVec::new(
                    Opts::new(KAFKA_RECORDS_PRODUCED, "Output records delivered to Kafka, by output."),
                    &["output"],
                )
                .unwrap(),
            ),
            commits: register(
                &r,
                IntCounterVec::new(
                    Opts::new(KAFKA_COMMITS, "Offset (or transaction) commits, by outcome."),
                    &["outcome"],
                )
                .unwrap(),
            ),
            retries: register(
                &r,
                IntCounterVec::new(
                    Opts::new(KAFKA_RETRIES, "Transient Kafka failures retried, by operation."),
                    &["operation"],
                )
                .unwrap(),
            ),
            kafka_rebuilds: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        KAFKA_REBUILDS,
                        "In-process rebuilds of the Kafka consumer and producer, by the client found in a fatal state.",
                    ),
                    &["client"],
                )
                .unwrap(),
            ),
            paused: register(
                &r,
                IntGauge::new(KAFKA_PAUSED, "1 while intake is paused because the in-flight budget is exhausted.")
                    .unwrap(),
            ),
            fetch_requests: register(
                &r,
                IntCounter::new(
                    KAFKA_FETCH_REQUESTS,
                    "Fetch requests sent by the input consumer (librdkafka statistics).",
                )
                .unwrap(),
            ),
            idle_pauses: register(
                &r,
                IntCounter::new(
                    KAFKA_IDLE_PAUSES,
                    "Pauses of a caught-up intake against a broker that answers empty fetches at once.",
                )
                .unwrap(),
            ),
            rebalances: register(
                &r,
                IntCounterVec::new(Opts::new(KAFKA_REBALANCES, "Consumer-group rebalances, by kind."), &["kind"])
                    .unwrap(),
            ),
            assigned: register(&r, IntGauge::new(KAFKA_ASSIGNED, "Input partitions assigned to this worker.").unwrap()),
            consumer_lag: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(CONSUMER_LAG, "Messages not yet committed, per assigned input partition."),
                    &["topic", "partition"],
                )
                .unwrap(),
            ),
            committed_offset: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        KAFKA_COMMITTED_OFFSET,
                        "Offset last committed by this worker, per assigned input partition.",
                    ),
                    &["topic", "partition"],
                )
                .unwrap(),
            ),
            embed_batch_items: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(EMBED_BATCH_ITEMS, "Inputs per embedding batch.")
                        .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
                )
                .unwrap(),
            ),
            embed_batch_tokens: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(EMBED_BATCH_TOKENS, "Tokens per embedding batch, padding included.")
                        .buckets(vec![64.0, 256.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0]),
                )
                .unwrap(),
            ),
            embed_tokens: register(&r, IntCounter::new(EMBED_TOKENS, "Tokens embedded (padding excluded).").unwrap()),
            embed_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(EMBED_DURATION, "Model time per embedding batch.")
                        .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
                )
                .unwrap(),
            ),
            embed_tokens_per_second: register(
                &r,
                prometheus::Gauge::new(EMBED_TOKENS_PER_SECOND, "Embedding throughput of the latest batch.").unwrap(),
            ),
            store_upsert_duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(STORE_UPSERT_DURATION, "Time per vector-store upsert (wait=true).")
                        .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
                    &["store"],
                )
                .unwrap(),
            ),
            store_points: register(
                &r,
                IntCounterVec::new(
                    Opts::new(STORE_POINTS, "Vector-store points written, by operation."),
                    &["operation"],
                )
                .unwrap(),
            ),
            store_retries: register(
                &r,
                IntCounter::new(STORE_RETRIES, "Transient vector-store failures retried.").unwrap(),
            ),
            chunks_per_document: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(CHUNKS_PER_DOCUMENT, "Chunks indexed per document.")
                        .buckets(vec![0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
                )
                .unwrap(),
            ),
            store_maintenance_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        STORE_MAINTENANCE_DURATION,
                        "Embedded store: one background flush and optimisation (vacuum, merge, index).",
                    )
                    .buckets(vec![0.01, 0.05, 0.25, 1.0, 5.0, 25.0, 120.0]),
                )
                .unwrap(),
            ),
            store_maintenance_shards: register(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        STORE_MAINTENANCE_SHARDS,
                        "Embedded store: shards being maintained (running) and due, waiting for a slot (waiting).",
                    ),
                    &["state"],
                )
                .unwrap(),
            ),
            store_group_documents: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        STORE_GROUP_DOCUMENTS,
                        "Documents per grouped vector-store write (one upsert of their points, one delete of their older versions).",
                    )
                    .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
                )
                .unwrap(),
            ),
            store_write_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        STORE_WRITE_DURATION,
                        "Time of one grouped vector-store write (upserts, then the delete of older versions).",
                    )
                    .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
                )
                .unwrap(),
            ),
            api_requests: register(
                &r,
                IntCounterVec::new(Opts::new(API_REQUESTS, "Query-service requests answered."), &["route", "status"])
                    .unwrap(),
            ),
            api_duration: register(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(API_DURATION, "Query-service request latency.")
                        .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
                    &["route"],
                )
                .unwrap(),
            ),
            api_denials: register(
                &r,
                IntCounterVec::new(
                    Opts::new(API_DENIALS, "Query-service requests refused for who asked, by reason."),
                    &["reason"],
                )
                .unwrap(),
            ),
            audit_records: register(
                &r,
                IntCounterVec::new(
                    Opts::new(AUDIT_RECORDS, "Audit records of query-service requests, by sink and outcome."),
                    &["sink", "outcome"],
                )
                .unwrap(),
            ),
            llm_requests: register(
                &r,
                IntCounterVec::new(Opts::new(LLM_REQUESTS, "Generations asked of the LLM, by outcome."), &["outcome"])
                    .unwrap(),
            ),
            raptor_abstracts: register(
                &r,
                IntCounterVec::new(
                    Opts::new(RAPTOR_ABSTRACTS, "Abstractive summaries of RAPTOR's nodes asked of the LLM, by outcome."),
                    &["outcome"],
                )
                .unwrap(),
            ),
            raptor_summary_vectors: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        RAPTOR_SUMMARY_VECTORS,
                        "RAPTOR summaries embedded after their rebuild (embedded), or rounds that failed (failed).",
                    ),
                    &["outcome"],
                )
                .unwrap(),
            ),
            llm_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(LLM_DURATION, "Time of one generation at the LLM endpoint.")
                        .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
                )
                .unwrap(),
            ),
            llm_citations_refused: register(
                &r,
                IntCounter::new(LLM_CITATIONS_REFUSED, "Citations the LLM made of passages outside its context.")
                    .unwrap(),
            ),
            fhir_fetches: register(
                &r,
                IntCounterVec::new(
                    Opts::new(FHIR_FETCHES, "Attachment fetches by reference, by outcome."),
                    &["outcome"],
                )
                .unwrap(),
            ),
            fhir_fetch_duration: register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(FHIR_FETCH_DURATION, "Time per attachment fetch attempt.")
                        .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
                )
                .unwrap(),
            ),
            registry: r,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding never fails");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// Every `stage` label of `clinstream_stage_duration_seconds`: the text stages (`Timings::stages`), the outputs
/// side (`sink`), indexing as a whole (`index`) and its parts (`embed`, `qdrant`, `tree`: a patient's RAPTOR tree
/// rebuilt).
pub const STAGES: &[&str] = &[
    "decode",
    "fetch",
    "sections",
    "sentences",
    "entities",
    "variables",
    "kg",
    "sink",
    "index",
    "embed",
    "qdrant",
    "tree",
];

/// The process-wide metrics. Label sets known in advance are created at zero, so dashboards and alerts see
/// every series (e.g. `clinstream_kafka_commits_total{outcome="failed"} 0`) before the first event.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = Metrics::new();
        for output in ["variables", "kg", "dlq"] {
            m.records_produced.with_label_values(&[output]);
        }
        for outcome in ["ok", "failed"] {
            m.commits.with_label_values(&[outcome]);
        }
        for operation in ["deliver", "commit", "admin", "init", "registry"] {
            m.retries.with_label_values(&[operation]);
        }
        for client in ["consumer", "producer"] {
            m.kafka_rebuilds.with_label_values(&[client]);
        }
        for kind in ["assign", "revoke"] {
            m.rebalances.with_label_values(&[kind]);
        }
        for operation in ["upserted", "deleted_documents"] {
            m.store_points.with_label_values(&[operation]);
        }
        for store in ["embedded", "qdrant"] {
            m.store_upsert_duration.with_label_values(&[store]);
        }
        for state in ["running", "waiting"] {
            m.store_maintenance_shards.with_label_values(&[state]);
        }
        for outcome in ["written", "dead_lettered"] {
            m.documents_finished.with_label_values(&[outcome]);
        }
        for code in ErrorCode::ALL.iter().filter(|c| c.disposition() == Disposition::DeadLetter) {
            m.dead_letters.with_label_values(&[code.as_str()]);
        }
        for stage in STAGES {
            m.stage_duration.with_label_values(&[stage]);
        }
        for kind in EntityKind::ALL {
            m.mentions.with_label_values(&[kind.as_str()]);
        }
        for outcome in FETCH_OUTCOMES {
            m.fhir_fetches.with_label_values(&[outcome]);
        }
        for reason in DENIAL_REASONS {
            m.api_denials.with_label_values(&[reason]);
        }
        for outcome in ["ok", "timeout", "unavailable", "failed", "unusable"] {
            m.llm_requests.with_label_values(&[outcome]);
        }
        for outcome in ["written", "failed", "unusable", "replaced"] {
            m.raptor_abstracts.with_label_values(&[outcome]);
        }
        for outcome in ["embedded", "failed"] {
            m.raptor_summary_vectors.with_label_values(&[outcome]);
        }
        for sink in ["kafka", "log"] {
            for outcome in ["delivered", "failed"] {
                m.audit_records.with_label_values(&[sink, outcome]);
            }
        }
        for route in ["context", "search"] {
            m.api_duration.with_label_values(&[route]);
            m.api_requests.with_label_values(&[route, "200"]);
        }
        m
    })
}
