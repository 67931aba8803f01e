//! Typed settings, layered: built-in defaults (`config/default.toml`, compiled in) → an optional config file →
//! `CLINSTREAM__SECTION__KEY` environment variables.
//!
//! Unknown keys are rejected (every struct denies unknown fields), so a typo fails at startup with the key's name
//! instead of being silently ignored. `Settings::validate` checks what types cannot (ranges, names, relations)
//! and reports every problem at once, each as `key: why`. Secrets are redacted whenever settings are printed
//! (`redacted_toml`), by key name, so passthrough maps (librdkafka properties) are covered too.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use http::Uri;
use serde::{Deserialize, Serialize};

/// The built-in defaults, compiled into the binary.
pub const DEFAULTS_TOML: &str = include_str!("../config/default.toml");

/// Prefix of environment overrides: `CLINSTREAM__DECODE__MAX_ATTACHMENT_BYTES=1048576`.
pub const ENV_PREFIX: &str = "CLINSTREAM";

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub input: InputSettings,
    pub decode: DecodeSettings,
    pub sections: SectionSettings,
    pub sentences: SentenceSettings,
    pub assertion: AssertionSettings,
    pub clear: ClearSettings,
    pub output: OutputSettings,
    pub pipeline: PipelineSettings,
    pub metrics: MetricsSettings,
    pub log: LogSettings,
    pub kafka: KafkaSettings,
    pub embed: EmbedSettings,
    pub chunking: ChunkSettings,
    pub store: StoreSettings,
    pub serve: ServeSettings,
    pub llm: LlmSettings,
    pub raptor: RaptorSettings,
    pub fhir: FhirSettings,
}

/// RAPTOR's per-patient summary tree (docs/read-side.md, "The summary tree"): built from the stored chunks as
/// notes arrive, retrieved with the chunks (`/v1/search` `strategy: tree`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RaptorSettings {
    /// Rebuild a patient's tree after each of their notes is written (before the note is acknowledged).
    pub enabled: bool,
    /// Tokens of one extractive summary.
    pub summary_tokens: usize,
    /// Summary levels above the chunks.
    pub max_levels: usize,
    /// The most clusters tried at one level (the Gaussian mixture's k, chosen by BIC).
    pub max_clusters: usize,
    /// PCA components the chunk vectors are reduced to before clustering.
    pub dims: usize,
    /// A patient's chunks read to build the tree, at most (the rest are left out of it).
    pub max_leaves: usize,
    /// The vector a summary is stored by: `text` (its text embedded, as in the paper: a model pass over the
    /// summaries a rebuild changes) or `mean` (its members' vectors averaged: no model call).
    pub summary_vectors: String,
    /// With `text` vectors: new summaries are stored with their members' mean vector and their text embedded after
    /// the note is acknowledged (one round per patient for the notes that arrived meanwhile); false embeds them
    /// before.
    pub background_vectors: bool,
    /// Summaries written by the LLM (`llm.*`) from their members' texts, in the background after each rebuild
    /// (never before a note is acknowledged); a node stays extractive until its summary is written.
    pub abstractive: bool,
    /// Tokens of the members' texts one abstractive summary is written from, at most.
    pub abstract_input_tokens: usize,
    /// CPTF-compressed extractive summaries: the share of each summary sentence's tokens kept (0 = off), by the
    /// token-importance model of `serve.compress_model_file`; the sentences are picked against
    /// `summary_tokens / compress`, so a summary of the same size quotes more of its cluster.
    pub compress: f32,
}

/// The LLM of the generative step (`POST /v1/answer`): an OpenAI-compatible chat-completions endpoint
/// (docs/read-side.md, "The generative step").
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LlmSettings {
    /// The API's base URL, up to and without `/chat/completions` (e.g. `http://vllm:8000/v1`); empty = no LLM
    /// (`/v1/answer` answers 501).
    pub base_url: String,
    /// The `model` asked for.
    pub model: String,
    /// Bearer key (`CLINSTREAM__LLM__API_KEY` from a Secret); empty = none.
    pub api_key: Secret,
    /// Everything one generation may take: waiting for a slot, every attempt and the pauses between them.
    pub timeout_ms: u64,
    /// Attempts after the first on connection errors, 429 and 5xx.
    pub max_retries: u32,
    pub retry_initial_ms: u64,
    /// Generations in flight at once per process; the rest wait (within `timeout_ms`).
    pub max_concurrent: usize,
    pub max_tokens: u32,
    pub temperature: f32,
    /// A directory with `answer.system.txt` and `answer.user.txt` (`{question}`, `{passages}`); empty = built-in.
    pub prompt_dir: String,
}

impl ServeSettings {
    /// The accepted API keys as (name, key) (blank entries ignored; a bare key is named by its position).
    pub fn keys(&self) -> Vec<(String, String)> {
        self.api_keys
            .expose()
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .enumerate()
            .map(|(i, entry)| match entry.split_once(':') {
                Some((name, key)) if !name.trim().is_empty() && !key.trim().is_empty() => {
                    (name.trim().to_string(), key.trim().to_string())
                }
                _ => (format!("key-{}", i + 1), entry.to_string()),
            })
            .collect()
    }

    /// Whether identity-provider tokens are accepted.
    pub fn oidc_enabled(&self) -> bool {
        !self.oidc.issuer.trim().is_empty()
    }

    /// Auth on with no way in would refuse every request, and a provider without an audience would accept tokens
    /// minted for any other service: configuration errors, said before serving.
    pub fn check_auth(&self) -> Result<(), String> {
        if self.auth && self.keys().is_empty() && !self.oidc_enabled() {
            return Err("serve.api_keys, serve.oidc.issuer: neither a key nor an identity provider while serve.auth \
                        is on (set CLINSTREAM__SERVE__API_KEYS from a Secret or serve.oidc.issuer, or serve.auth = \
                        false on a trusted network)"
                .into());
        }
        let o = &self.oidc;
        if self.oidc_enabled() {
            let url = |u: &str| {
                http::Uri::try_from(u.trim())
                    .ok()
                    .is_some_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some())
            };
            if !url(&o.issuer) {
                return Err("serve.oidc.issuer: must be an http(s) URL".into());
            }
            if !o.jwks_url.trim().is_empty() && !url(&o.jwks_url) {
                return Err("serve.oidc.jwks_url: must be an http(s) URL".into());
            }
            if o.audience.trim().is_empty() {
                return Err("serve.oidc.audience: required with serve.oidc.issuer (without it a token minted for \
                            any other service of the provider would be accepted)"
                    .into());
            }
            if o.algorithms.is_empty() {
                return Err("serve.oidc.algorithms: name at least one algorithm".into());
            }
            if let Some(bad) = o.algorithms.iter().find(|a| !OIDC_ALGORITHMS.contains(&a.trim())) {
                return Err(format!(
                    "serve.oidc.algorithms: `{bad}` is not an accepted algorithm (RS256, RS384, RS512, PS256, PS384, \
                     PS512, ES256, ES384, EdDSA; symmetric algorithms never)"
                ));
            }
            if o.patient_claim.trim().is_empty() || o.timeout_ms == 0 {
                return Err("serve.oidc.patient_claim: must not be empty; serve.oidc.timeout_ms: at least 1".into());
            }
        }
        if self.audit.timeout_ms == 0 {
            return Err("serve.audit.timeout_ms: must be at least 1".into());
        }
        Ok(())
    }
}

/// Fetching notes that DocumentReferences only reference (`attachment.url`): docs/intake.md.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FhirSettings {
    /// Base URL relative references (`Binary/123`) resolve against; empty with no `allowed_hosts` = fetching off.
    pub base_url: String,
    /// Hosts (host or host:port) absolute attachment URLs may point at; the base URL's host is always allowed.
    pub allowed_hosts: Vec<String>,
    /// A static bearer token (`CLINSTREAM__FHIR__BEARER_TOKEN` from a Secret); empty = none (or SMART below).
    pub bearer_token: Secret,
    /// Per-request timeout (connect + response + body).
    pub timeout_ms: u64,
    /// Requests in flight at once per host.
    pub max_per_host: usize,
    /// Transient failures (connection errors, timeouts, 429, 5xx) are retried this long; then the worker halts.
    pub halt_after_ms: u64,
    pub smart: SmartSettings,
}

/// SMART Backend Services (client-credentials grant with a signed JWT assertion).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SmartSettings {
    /// The authorization server's token endpoint; empty = SMART off.
    pub token_url: String,
    pub client_id: String,
    /// PEM private key (PKCS#8 RSA or EC P-384) the assertion is signed with.
    pub key_file: String,
    /// `RS384` or `ES384`.
    pub algorithm: String,
    /// `kid` header of the assertion (the key's id in the registered JWK Set); empty = none.
    pub key_id: String,
    /// Scopes asked for.
    pub scope: String,
}

impl FhirSettings {
    /// Whether references are fetched at all.
    pub fn fetching(&self) -> bool {
        !self.base_url.trim().is_empty() || !self.allowed_hosts.is_empty()
    }
}

/// The query service (`clinstream serve`, or `serve.enabled` beside a worker): docs/read-side.md.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServeSettings {
    /// `clinstream run` serves the API too, in the same process and on the same store handle.
    pub enabled: bool,
    /// Listen address of the API (host:port; port 0 picks a free port).
    pub addr: String,
    /// Require `Authorization: Bearer …` on the API routes: a static key or an identity provider's token.
    pub auth: bool,
    /// Static keys of service accounts, comma-separated, each `name:key` (a bare key is named `key-1`, `key-2`, …
    /// by position); the name is what the audit trail records (`CLINSTREAM__SERVE__API_KEYS` from a Secret).
    pub api_keys: Secret,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// `budget_tokens` when a request gives none, and the most a request may ask for.
    pub default_budget_tokens: usize,
    pub max_budget_tokens: usize,
    /// Most hits `/v1/search` returns.
    pub max_top: usize,
    /// Most requests handled at once (the rest wait in line); a request past `timeout_ms` gets 504.
    pub max_concurrent: usize,
    pub timeout_ms: u64,
    /// Words each side of a mention in a context window (at most `store.window_words`).
    pub window_words: usize,
    /// After the CLEAR windows, fill what is left of the budget with the patient's chunks nearest the question
    /// (dense search, same filters); a request's `fill` overrides it.
    pub fill: bool,
    /// `/v1/search` (`hybrid`, `tree`): the query is aligned to concepts as a context's question is, and a chunk
    /// that mentions an aligned answer concept counts as a full BM25 match, whatever words it uses (the chunks'
    /// `concepts`; docs/read-side.md). false: the query's words only.
    pub match_concepts: bool,
    /// Counts context tokens with this `tokenizer.json` (the downstream LLM's); empty = the embedding model's.
    pub tokenizer: String,
    /// CPTF (a request's `compress`): the token-importance model inside `embed.model_dir`, loaded on the first
    /// request that asks for it.
    pub compress_model_file: String,
    /// Where the concept-label embeddings are cached (per model and lexicon version); empty = not cached.
    pub cache_dir: String,
    pub oidc: OidcSettings,
    pub audit: AuditSettings,
}

/// The settings of `store.payload_indexes`, fewest indexes first (`store` says which fields each one indexes).
pub const PAYLOAD_INDEX_SETTINGS: &[&str] = &["lookups", "filters", "all"];

/// The signature algorithms `serve.oidc.algorithms` may name: asymmetric only (never HMAC, never `none`).
pub const OIDC_ALGORITHMS: &[&str] = &["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

/// Bearer JWT access tokens from an OpenID Connect / OAuth 2.0 provider (docs/read-side.md, "Security model").
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OidcSettings {
    /// The provider's issuer URL (the tokens' `iss`); its keys are discovered from
    /// `{issuer}/.well-known/openid-configuration`. Empty = tokens are not accepted (static keys only).
    pub issuer: String,
    /// The `aud` a token must carry (required with an issuer).
    pub audience: String,
    /// The JWK Set URL, when the provider publishes no discovery document; empty = discovered.
    pub jwks_url: String,
    /// Signature algorithms accepted (asymmetric only: RS256/384/512, PS256/384/512, ES256/384, EdDSA).
    pub algorithms: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub clock_skew_s: u64,
    /// The claim naming the one patient a `patient/…` scope is for (SMART's launch context).
    pub patient_claim: String,
    /// A claim listing the patients the caller may see (a care team's list: an array of ids or references);
    /// empty = not used.
    pub patients_claim: String,
    /// `user/…` and `system/…` read scopes may query every patient; false = those scopes grant nothing.
    pub allow_all_patients: bool,
    /// Least time between two key-set fetches asked for by tokens with an unknown `kid`.
    pub refresh_min_interval_ms: u64,
    /// Per request to the provider (discovery, keys).
    pub timeout_ms: u64,
}

/// One audit record per query-service request (docs/read-side.md, "Audit trail").
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// Kafka topic (on `kafka.bootstrap_servers`) receiving one FHIR `AuditEvent` per request; empty = the log.
    pub topic: String,
    /// A request whose audit record was not delivered is refused with 503 (true) or answered anyway (false, and
    /// counted as a failed audit).
    pub fail_closed: bool,
    /// How long a request waits for its record's delivery.
    pub timeout_ms: u64,
    /// Key of the pseudonyms that replace patient and document ids in audit records written to the log
    /// (HMAC-SHA-256); empty = a key made at start, so log records correlate within one process only.
    pub log_key: Secret,
}

/// The embedding model and its batching (docs/embedding.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EmbedSettings {
    /// Embed and index chunks; `false` (or `run --no-embed`) runs every other stage (text-only workers).
    pub enabled: bool,
    /// A sentence-transformers model exported to ONNX: `model.onnx` + `tokenizer.json` (+ optional
    /// `sentence_bert_config.json`, `config.json`).
    pub model_dir: String,
    /// The graph inside `model_dir`: `model.onnx` (fp32), or `model.fp16.onnx` (`make model`'s half-precision
    /// variant, for CUDA).
    pub model_file: String,
    /// The ONNX Runtime shared library (`ORT_DYLIB_PATH` is used when this is empty).
    pub ort_library: String,
    /// `cpu` or `cuda` (CUDA fails start-up when the provider cannot be registered; it never falls back); for
    /// benchmarks only, `synthetic` (vectors hashed from the token ids, no model run; needs `allow_synthetic`).
    pub execution_provider: String,
    /// Accept `execution_provider = "synthetic"`: a benchmark of everything around the model. Never in production:
    /// its vectors mean nothing.
    pub allow_synthetic: bool,
    pub cuda_device: i32,
    /// ONNX Runtime intra-op threads; 0 = its default (one per physical core).
    pub intra_threads: usize,
    /// Whether ONNX Runtime's intra-op threads spin-wait for the next piece of work (its default) or sleep: a
    /// spinning thread hands work over faster but holds a core, which on a small machine the rest of the process
    /// (alignment, context assembly, a store in process) needs.
    pub intra_spinning: bool,
    /// Longest input in tokens (special tokens included); 0 = the model's own (`max_seq_length`, else
    /// `max_position_embeddings`).
    pub max_tokens: usize,
    /// Tokens per batch, padding counted (longest input × inputs).
    pub batch_tokens: usize,
    /// Inputs per batch at most.
    pub max_batch: usize,
    /// How long a partial batch waits for more inputs.
    pub linger_ms: u64,
    /// Model output to use: a pooled `[batch, dim]` output by name, or empty = `sentence_embedding` when present,
    /// else mean pooling of the first `[batch, seq, dim]` output. The vector is L2-normalised either way.
    pub output: String,
    /// Requests waiting for the model thread at most (backpressure to the documents).
    pub queue: usize,
}

/// How notes become chunks (docs/embedding.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChunkSettings {
    /// `seos` (semantic: cut at the largest embedding shifts) or `fixed` (pack sentences up to the budget).
    pub strategy: String,
    /// SEOS: neighbours on each side in a sentence group.
    pub group_neighbours: usize,
    /// Tokens per chunk at most (without the model's special tokens); also sets SEOS's breakpoint count.
    pub chunk_tokens: usize,
    /// Sentences repeated from the previous chunk at the start of the next.
    pub overlap_sentences: usize,
    /// Whether a chunk may span a section boundary.
    pub cross_sections: bool,
    /// SEOS: where the vectors come from. `groups` (exact): every sentence group embedded, then every chunk;
    /// `sentences`: every sentence embedded once, group vectors composed from them, chunks embedded;
    /// `composed`: every sentence embedded once, group and chunk vectors both composed (docs/embedding.md).
    pub seos_vectors: String,
}

/// Where chunk vectors go (docs/embedding.md).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// `embedded` (the Qdrant engine in-process, at `path`), `qdrant` (a server at `url`) or `none`.
    pub kind: String,
    /// Embedded store directory (relative to the working directory).
    pub path: String,
    pub collection: String,
    /// Qdrant server gRPC URL (`https://` for TLS).
    pub url: String,
    /// Qdrant API key (empty = none). Prefer `CLINSTREAM__STORE__API_KEY` from a Secret.
    pub api_key: Secret,
    /// Keep vectors and payload on disk (server collections and the embedded store).
    pub on_disk: bool,
    /// Points per upsert request.
    pub upsert_batch: usize,
    /// Group commit: the most points the store writer applies as one group (one upsert of the group's points in
    /// requests of `upsert_batch`, one delete of its documents' older versions); 0 = every document alone.
    pub group_points: usize,
    /// Groups applied at once at most (a server applies them in parallel up to its shards and update threads).
    pub group_concurrency: usize,
    pub timeout_ms: u64,
    /// Transient store failures are retried with capped backoff for this long, then the worker halts.
    pub halt_after_ms: u64,
    /// BM25 average chunk length (words) for the sparse vector.
    pub bm25_avg_len: f64,
    /// Hybrid search: the dense ranking's share of the fused score when no candidate holds the question's rare words
    /// (`store::Fusion`; 1 = dense alone, 0 = BM25 alone).
    pub dense_weight: f32,
    /// Hybrid search: the dense share when the best BM25 candidate holds all of the question's rare words (its score
    /// is the question's IDF mass); linearly between the two. Equal to `dense_weight`: one fixed weight.
    pub dense_weight_matched: f32,
    /// Hybrid search: a chunk whose BM25 score holds at least this share of the question's IDF mass counts as a
    /// full match (`store::Fusion::share`).
    pub bm25_full_share: f32,
    /// Hybrid search: below `bm25_full_share` a chunk's BM25 share counts `share × (share / full)^(power − 1)`, so a
    /// partial match — the question's common words, however often repeated — fades; 1 = linear (no fading).
    pub bm25_partial_power: f32,
    /// Embedded store: after this many points written or deleted, flush the segments and run Qdrant's optimizers
    /// (vacuum, merge, index) in the background; 0 = only flush at shutdown.
    pub maintain_every: u64,
    /// Embedded store: threads a maintenance may use to build a segment's HNSW graph; 0 = a quarter of the cores,
    /// at least one.
    pub maintain_threads: usize,
    /// Embedded store: shards maintained at once; a shard due for maintenance while that many run waits its turn.
    /// 0 = as many as fit a quarter of the cores at `maintain_threads` each, at least one.
    pub maintain_concurrency: usize,
    /// Embedded store: how many nice steps below the worker a maintenance runs (Linux; 0 = the same priority).
    pub maintain_nice: i32,
    /// Embedded store: a maintenance's optimisation (merges, graphs, payload indexes) runs in Linux's idle
    /// scheduling class, on CPU time no other thread wants; false: at `maintain_nice` like its flush.
    pub maintain_idle: bool,
    /// Embedded store: a segment whose vectors pass this many KB is rebuilt by maintenance with its HNSW graph and
    /// compact payload indexes; 0 = never (exact search).
    pub index_threshold_kb: usize,
    /// Server collections the worker creates: shards, replicas of each shard, and how many replicas confirm a
    /// write.
    pub shards: u32,
    pub replication_factor: u32,
    pub write_consistency: u32,
    /// `none`, or `int8`: scalar quantization of the dense vectors (kept in RAM; the originals stay for rescoring).
    pub quantization: String,
    /// Payload indexes: `lookups` (`patient` and `doc_id`, what every clinstream read and delete starts from),
    /// `filters` (also the fields clinstream's reads filter on after those) or `all` (also `section`,
    /// `entity_kinds` and `entity_terms`, for tools that query the collection directly across patients).
    pub payload_indexes: String,
    /// HNSW graph of the dense vectors: edges per node and the construction beam.
    /// At exit, how long a running index maintenance may go on before the process ends without it.
    pub maintenance_wait_ms: u64,
    pub hnsw_m: u64,
    pub hnsw_ef_construct: u64,
    /// An alias readers use (`clinstream search`, the query service). Empty: none. The worker creates it pointing
    /// at `collection` when it does not exist; switching it to a new collection is the model-swap step
    /// (docs/operations.md).
    pub alias: String,
    /// Entity windows stored beside the chunks: words each side of a mention (windows of one note that overlap
    /// or touch merge); 0 = none stored (the query service then has no CLEAR context).
    pub window_words: usize,
}

/// Kafka mode (docs/kafka.md). The three passthrough maps go to librdkafka unchanged; secrets in them are
/// redacted by key when settings are printed.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub enabled: bool,
    pub bootstrap_servers: String,
    pub group_id: String,
    /// Static group membership (`group.instance.id`): a restarted replica with the same id takes its
    /// partitions back at once instead of waiting for the old member's session to expire. Empty = dynamic.
    pub group_instance_id: String,
    pub topics: Vec<String>,
    pub variables_topic: String,
    pub kg_topic: String,
    pub dlq_topic: String,
    pub create_topics: bool,
    pub create_partitions: i32,
    pub replication_factor: i32,
    pub transactions: bool,
    pub transactional_id: String,
    pub commit_interval_ms: u64,
    /// Commit as soon as the worker has been idle this long after finishing a record (nothing in flight, no record
    /// arriving), rather than at the next `commit_interval_ms`; 0 = only at the interval.
    pub commit_idle_ms: u64,
    pub pause_after_ms: u64,
    /// Against a broker that answers empty fetches at once (seen in librdkafka's statistics), how long intake
    /// pauses once it is caught up before fetching again; 0 never pauses. Apache Kafka is never paused for it.
    pub idle_backoff_ms: u64,
    pub drain_timeout_ms: u64,
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    pub halt_after_ms: u64,
    /// In-process rebuilds of the consumer and producer after a fatal client error, at most this many within
    /// `rebuilds_window_ms`; 0 = halt at once (`consumer_fatal` / `delivery_failed`).
    pub rebuilds_max: usize,
    pub rebuilds_window_ms: u64,
    pub dead_letters: DeadLetterLimit,
    /// Confluent Schema Registry: when `url` is set, outputs use its wire format with registered schema ids.
    pub schema_registry: SchemaRegistrySettings,
    #[serde(default, deserialize_with = "librdkafka_properties")]
    pub common: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "librdkafka_properties")]
    pub consumer: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "librdkafka_properties")]
    pub producer: BTreeMap<String, String>,
}

/// A librdkafka property value as the config layers deliver it: the `config` crate splits dotted keys
/// (`"fetch.wait.max.ms"`) into nested tables and may parse values into numbers or booleans.
#[derive(Deserialize)]
#[serde(untagged)]
enum PropValue {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nested(BTreeMap<String, PropValue>),
}

fn flatten_props(prefix: &str, map: BTreeMap<String, PropValue>, out: &mut BTreeMap<String, String>) {
    for (k, v) in map {
        let key = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
        match v {
            PropValue::Text(s) => drop(out.insert(key, s)),
            PropValue::Int(i) => drop(out.insert(key, i.to_string())),
            PropValue::Float(f) => drop(out.insert(key, f.to_string())),
            PropValue::Bool(b) => drop(out.insert(key, b.to_string())),
            PropValue::Nested(m) => flatten_props(&key, m, out),
        }
    }
}

/// Reads a passthrough map back into flat librdkafka property names.
fn librdkafka_properties<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let nested = BTreeMap::<String, PropValue>::deserialize(d)?;
    let mut out = BTreeMap::new();
    flatten_props("", nested, &mut out);
    Ok(out)
}

/// `kafka.schema_registry`: empty `url` = Avro single-object encoding, no registry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistrySettings {
    /// `http://host:8081` or `https://...` (a path prefix is kept); empty = no registry.
    pub url: String,
    /// HTTP basic auth (Confluent Cloud: the API key); empty = none.
    pub username: String,
    /// Prefer `CLINSTREAM__KAFKA__SCHEMA_REGISTRY__PASSWORD` from a Secret.
    pub password: Secret,
    /// Per request.
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterLimit {
    pub window: usize,
    pub max_ratio: f64,
    pub max_consecutive: u64,
}

impl KafkaSettings {
    /// A numeric librdkafka property as the client will see it: the role's map (`consumer`/`producer`), then
    /// `common`, then librdkafka's default.
    pub fn property_ms(&self, role: &BTreeMap<String, String>, key: &str, default: u64) -> u64 {
        role.get(key).or_else(|| self.common.get(key)).and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    /// The transactional id: configured, or `clinstream-<hostname>`.
    pub fn effective_transactional_id(&self) -> String {
        if !self.transactional_id.is_empty() {
            return self.transactional_id.clone();
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
            .unwrap_or_else(|| "local".to_string());
        format!("clinstream-{host}")
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub enabled: bool,
    pub addr: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct InputSettings {
    pub max_message_bytes: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DecodeSettings {
    pub max_attachment_bytes: usize,
    pub content_type_preference: Vec<String>,
    pub verify_hash: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SectionSettings {
    pub default_weight: f32,
    pub weights: BTreeMap<String, f32>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SentenceSettings {
    pub max_sentence_bytes: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AssertionSettings {
    pub forward_words: usize,
    pub backward_words: usize,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClearSettings {
    pub window_words: usize,
    pub token_budget: usize,
    /// The variables' embedding expansion (data/variables/expansion.tsv, `clinstream-lab vocab expand`): concepts whose
    /// label is at least this close to a variable's labels become its targets too; 0 = none.
    pub expansion_min_score: f32,
    /// Compound terms also found by their parts' plain words ("pleural air collection" → pneumothorax;
    /// data/lexicon/combining_forms.tsv, src/lexicon/gloss.rs).
    pub gloss_compounds: bool,
    #[serde(default)]
    pub variables: Vec<VariableDef>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputSettings {
    pub include_text: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    pub workers: usize,
    /// Nice steps below the worker's other threads at which the CPU pool's threads run (Linux; 0 = the same).
    pub workers_nice: i32,
    /// Threads of the async runtime (awaiting, the store and Kafka clients); 0 = a quarter of the cores, at
    /// least 2. CPU-bound steps never run there.
    pub async_threads: usize,
    pub in_flight: usize,
    pub source_channel: usize,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Auto,
    Json,
    Text,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub level: String,
}

/// Configuration could not be loaded or is invalid. The message names the key.
/// A variable definition (config `[[clear.variables]]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VariableDef {
    pub name: String,
    /// Kind of the variable's own synonym concept (default `disease`).
    #[serde(default = "default_kind")]
    pub kind: String,
    /// Lexicon concept ids (`DOID:552`, `MESH:D006332`, ...).
    #[serde(default)]
    pub concepts: Vec<String>,
    /// Extra phrases that mention the variable.
    #[serde(default)]
    pub synonyms: Vec<String>,
    /// Also target every descendant of `concepts`.
    #[serde(default = "yes")]
    pub include_descendants: bool,
    /// Only these canonical sections (empty = all).
    #[serde(default)]
    pub sections: Vec<String>,
    /// Never these canonical sections.
    #[serde(default)]
    pub exclude_sections: Vec<String>,
    /// Window half-width in words (default `clear.window_words`).
    #[serde(default)]
    pub window_words: Option<usize>,
    /// Context-token budget (default `clear.token_budget`).
    #[serde(default)]
    pub token_budget: Option<usize>,
    /// How mentions combine into a label: `weighted` (each mention votes with its section weight; the heaviest
    /// label wins) or `any_present` (CheXpert-style: one affirmed mention makes it present, else uncertain, else
    /// absent).
    #[serde(default)]
    pub decision: Decision,
    /// Count historical mentions as present (a history of the condition); when false they count as absent
    /// (the variable means current use, e.g. tobacco).
    #[serde(default = "yes")]
    pub historical_is_present: bool,
    /// Count a finding named in a differential with no other hedge ("small effusion versus pleural thickening")
    /// as present rather than uncertain: the coding convention of indexers and labellers who code every finding a
    /// report names as a candidate (docs/clear.md). Default false: a differential is uncertain.
    #[serde(default)]
    pub differential_is_present: bool,
    /// The head noun of each of `concepts`' preferred names said alone ("effusion" for pleural effusion, "edema"
    /// for pulmonary edema) is a mention too in `elliptic_sections`, unless another site's anatomy term stands
    /// right before it or is attached after it by a preposition (docs/clear.md).
    #[serde(default)]
    pub elliptic_heads: bool,
    /// Canonical sections where a head said alone counts (with `elliptic_heads`): those that hold an imaging
    /// result. Elsewhere — an examination, the history, the review of systems, a plan — a bare "edema" is the
    /// limbs' and a bare "effusion" a joint's (docs/clear.md).
    #[serde(default = "default_elliptic_sections")]
    pub elliptic_sections: Vec<String>,
}

fn default_elliptic_sections() -> Vec<String> {
    ["findings", "impression", "imaging", "body"].map(String::from).to_vec()
}

fn default_kind() -> String {
    "disease".to_string()
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    #[default]
    Weighted,
    AnyPresent,
}

/// The parts of `kafka.schema_registry.url` (parsing only: configuration validation uses it without touching the
/// certificate store).
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash (a registry behind a proxy path).
    pub prefix: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, ConfigError> {
        let bad = |why: String| ConfigError::Invalid(vec![why]);
        let uri: Uri = url
            .trim_end_matches('/')
            .parse()
            .map_err(|e| bad(format!("kafka.schema_registry.url is not a URL: {e}")))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(bad("kafka.schema_registry.url must start with http:// or https://".into()));
            }
        };
        let authority = uri.authority().ok_or_else(|| bad("kafka.schema_registry.url has no host".into()))?;
        if authority.as_str().contains('@') {
            return Err(bad(
                "put registry credentials in kafka.schema_registry.username/password, not in the URL".into()
            ));
        }
        Ok(Endpoint {
            https,
            host: authority.host().trim_start_matches('[').trim_end_matches(']').to_string(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("could not load configuration: {0}")]
    Load(String),
    #[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<String>),
}

impl ConfigError {
    /// Each problem as `key: why` (one for a load failure).
    pub fn problems(&self) -> Vec<String> {
        match self {
            ConfigError::Load(why) => vec![why.clone()],
            ConfigError::Invalid(problems) => problems.clone(),
        }
    }
}

impl Settings {
    /// Defaults → `file` → the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// Like `load`, with an explicit environment map instead of the process's (for tests).
    pub fn load_from(file: Option<&Path>, env: Option<BTreeMap<String, String>>) -> Result<Self, ConfigError> {
        use config::{Config, Environment, File, FileFormat};
        let mut builder = Config::builder().add_source(File::from_str(DEFAULTS_TOML, FileFormat::Toml));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::Load(format!("config file {} does not exist", path.display())));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml).required(true));
        }
        let mut environment = Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("decode.content_type_preference")
            .with_list_parse_key("kafka.topics")
            .with_list_parse_key("fhir.allowed_hosts");
        if let Some(env) = env {
            environment = environment.source(Some(env.into_iter().collect()));
        }
        let settings: Settings = builder
            .add_source(environment)
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::Load(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what the types cannot; reports every problem, each as `key: why`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.input.max_message_bytes == 0 {
            problems.push("input.max_message_bytes: must be greater than 0".to_string());
        }
        if self.decode.max_attachment_bytes == 0 {
            problems.push("decode.max_attachment_bytes: must be greater than 0".to_string());
        }
        if self.decode.content_type_preference.is_empty() {
            problems.push("decode.content_type_preference: must name at least one content type".to_string());
        }
        check_weight(&mut problems, "sections.default_weight", self.sections.default_weight);
        for (name, weight) in &self.sections.weights {
            check_weight(&mut problems, &format!("sections.weights.{name}"), *weight);
        }
        if self.sentences.max_sentence_bytes < 64 {
            problems.push("sentences.max_sentence_bytes: must be at least 64".to_string());
        }
        if self.assertion.forward_words == 0 || self.assertion.backward_words == 0 {
            problems.push("assertion.forward_words / assertion.backward_words: must be at least 1".to_string());
        }
        if self.clear.window_words == 0 {
            problems.push("clear.window_words: must be at least 1".to_string());
        }
        if self.clear.token_budget < 16 {
            problems.push("clear.token_budget: must be at least 16".to_string());
        }
        if self.pipeline.in_flight == 0 {
            problems.push("pipeline.in_flight: must be at least 1".to_string());
        }
        if self.pipeline.source_channel == 0 {
            problems.push("pipeline.source_channel: must be at least 1".to_string());
        }
        if self.pipeline.workers > 1024 {
            problems.push("pipeline.workers: must be at most 1024 (0 = one per core)".to_string());
        }
        if !(0..=19).contains(&self.pipeline.workers_nice) {
            problems.push("pipeline.workers_nice: must be between 0 (the worker's priority) and 19".to_string());
        }
        if self.metrics.addr.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!("metrics.addr: `{}` is not host:port (e.g. 0.0.0.0:9464)", self.metrics.addr));
        }
        self.validate_kafka(&mut problems);
        self.validate_embed(&mut problems);
        self.validate_serve(&mut problems);
        self.validate_fhir(&mut problems);
        let r = &self.raptor;
        if !["text", "mean"].contains(&r.summary_vectors.as_str()) {
            problems.push(format!("raptor.summary_vectors: `{}` is not text or mean", r.summary_vectors));
        }
        if r.summary_tokens < 16 || r.max_levels == 0 || r.max_clusters == 0 || r.dims == 0 || r.max_leaves < 2 {
            problems.push(
                "raptor.summary_tokens: must be at least 16; raptor.max_levels, raptor.max_clusters, raptor.dims: at \
                 least 1; raptor.max_leaves: at least 2"
                    .into(),
            );
        }
        if r.abstractive && (!r.enabled || self.llm.base_url.trim().is_empty()) {
            problems.push("raptor.abstractive: needs raptor.enabled and an LLM (llm.base_url)".into());
        }
        if r.abstract_input_tokens < 64 {
            problems.push("raptor.abstract_input_tokens: must be at least 64".into());
        }
        if !(0.0..=1.0).contains(&r.compress) {
            problems.push("raptor.compress: must be between 0 (off) and 1".into());
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            problems.push(format!("log.level: not a valid filter ({e})"));
        }
        if problems.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(problems)) }
    }

    fn validate_fhir(&self, problems: &mut Vec<String>) {
        let f = &self.fhir;
        let base = f.base_url.trim();
        if !base.is_empty() {
            let ok = http::Uri::try_from(base).ok().filter(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() && u.query().is_none()
            });
            if ok.is_none() {
                problems.push(
                    "fhir.base_url: must be an http(s) URL without a query (e.g. https://fhir.example.org/r4)".into(),
                );
            }
        }
        if f.allowed_hosts.iter().any(|h| h.trim().is_empty() || h.contains('/')) {
            problems.push("fhir.allowed_hosts: each entry is a host or host:port, without scheme or path".into());
        }
        if f.timeout_ms == 0 || f.max_per_host == 0 || f.halt_after_ms == 0 {
            problems.push("fhir.timeout_ms, fhir.max_per_host, fhir.halt_after_ms: must be at least 1".into());
        }
        let s = &f.smart;
        if !s.token_url.trim().is_empty() {
            if !matches!(
                http::Uri::try_from(s.token_url.trim()).ok().and_then(|u| u.scheme_str().map(str::to_owned)).as_deref(),
                Some("http" | "https")
            ) {
                problems.push("fhir.smart.token_url: must be an http(s) URL".into());
            }
            if s.client_id.trim().is_empty() || s.key_file.trim().is_empty() {
                problems.push(
                    "fhir.smart.client_id, fhir.smart.key_file: required when fhir.smart.token_url is set".into(),
                );
            }
            if !matches!(s.algorithm.as_str(), "RS384" | "ES384") {
                problems.push("fhir.smart.algorithm: must be RS384 or ES384".into());
            }
            if !f.bearer_token.expose().is_empty() {
                problems.push("fhir.bearer_token: set either a static token or fhir.smart.token_url, not both".into());
            }
        }
    }

    fn validate_serve(&self, problems: &mut Vec<String>) {
        let v = &self.serve;
        if v.addr.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!("serve.addr: `{}` is not host:port (e.g. 0.0.0.0:8080)", v.addr));
        }
        if v.default_budget_tokens < 16 || v.default_budget_tokens > v.max_budget_tokens {
            problems
                .push("serve.default_budget_tokens: must be at least 16 and at most serve.max_budget_tokens".into());
        }
        if v.max_top == 0 || v.max_concurrent == 0 || v.max_body_bytes < 1024 || v.timeout_ms == 0 {
            problems.push(
                "serve.max_top, serve.max_concurrent, serve.timeout_ms: must be at least 1; serve.max_body_bytes: \
                 at least 1024"
                    .into(),
            );
        }
        if v.window_words == 0 || v.window_words > self.store.window_words.max(1) {
            problems.push(format!(
                "serve.window_words: must be between 1 and store.window_words ({}): the stored windows hold only \
                 that much context",
                self.store.window_words
            ));
        }
        if v.enabled
            && let Err(why) = v.check_auth()
        {
            problems.push(why);
        }
    }

    fn validate_embed(&self, problems: &mut Vec<String>) {
        let (e, c, st) = (&self.embed, &self.chunking, &self.store);
        if !["cpu", "cuda", "synthetic"].contains(&e.execution_provider.as_str()) {
            problems.push(format!("embed.execution_provider: `{}` is not cpu or cuda", e.execution_provider));
        }
        if e.execution_provider == "synthetic" && !e.allow_synthetic {
            problems.push(
                "embed.execution_provider: `synthetic` gives vectors that mean nothing (a benchmark of the worker \
                 without the model's cost); set embed.allow_synthetic = true to ask for it"
                    .to_string(),
            );
        }
        if e.max_batch == 0 {
            problems.push("embed.max_batch: must be at least 1".to_string());
        }
        if e.queue == 0 {
            problems.push("embed.queue: must be at least 1".to_string());
        }
        if e.max_tokens != 0 && e.max_tokens < 16 {
            problems.push("embed.max_tokens: must be 0 (the model's) or at least 16".to_string());
        }
        if e.max_tokens != 0 && e.batch_tokens < e.max_tokens {
            problems.push("embed.batch_tokens: must be at least embed.max_tokens".to_string());
        }
        if !["seos", "fixed"].contains(&c.strategy.as_str()) {
            problems.push(format!("chunking.strategy: `{}` is not seos or fixed", c.strategy));
        }
        if c.chunk_tokens < 16 {
            problems.push("chunking.chunk_tokens: must be at least 16".to_string());
        }
        if e.max_tokens != 0 && c.chunk_tokens + 2 > e.max_tokens {
            problems.push("chunking.chunk_tokens: must leave room for 2 special tokens within embed.max_tokens".into());
        }
        if c.overlap_sentences > 4 {
            problems.push("chunking.overlap_sentences: must be at most 4".to_string());
        }
        if !["groups", "sentences", "composed"].contains(&c.seos_vectors.as_str()) {
            problems.push(format!("chunking.seos_vectors: `{}` is not groups, sentences or composed", c.seos_vectors));
        }
        if c.group_neighbours > 8 {
            problems.push("chunking.group_neighbours: must be at most 8".to_string());
        }
        match st.kind.as_str() {
            "embedded" if st.path.trim().is_empty() => problems.push("store.path: must not be empty".to_string()),
            "qdrant" if st.url.trim().is_empty() => problems.push("store.url: must not be empty".to_string()),
            "embedded" | "qdrant" | "none" => {}
            other => problems.push(format!("store.kind: `{other}` is not embedded, qdrant or none")),
        }
        if st.collection.trim().is_empty() {
            problems.push("store.collection: must not be empty".to_string());
        }
        if !(1..=4096).contains(&st.upsert_batch) {
            problems.push("store.upsert_batch: must be between 1 and 4096".to_string());
        }
        if !(1..=64).contains(&st.group_concurrency) {
            problems.push("store.group_concurrency: must be between 1 and 64".to_string());
        }
        if st.group_points > 1_000_000 {
            problems.push("store.group_points: must be at most 1000000 (0 = no grouping)".to_string());
        }
        if !(st.bm25_avg_len.is_finite() && st.bm25_avg_len > 0.0) {
            problems.push("store.bm25_avg_len: must be a positive number".to_string());
        }
        if !(0.0..=1.0).contains(&st.dense_weight) {
            problems.push("store.dense_weight: must be between 0 and 1".to_string());
        }
        if !(0.0..=1.0).contains(&st.dense_weight_matched) {
            problems.push("store.dense_weight_matched: must be between 0 and 1".to_string());
        }
        if !(st.bm25_full_share > 0.0 && st.bm25_full_share <= 1.0) {
            problems.push("store.bm25_full_share: must be above 0 and at most 1".to_string());
        }
        if !(st.bm25_partial_power.is_finite() && st.bm25_partial_power >= 1.0) {
            problems.push("store.bm25_partial_power: must be a number of at least 1".to_string());
        }
        if !(0..=19).contains(&st.maintain_nice) {
            problems.push("store.maintain_nice: must be between 0 (the worker's priority) and 19".to_string());
        }
        if st.shards == 0 || (st.kind == "embedded" && st.shards > 64) {
            problems.push("store.shards: must be at least 1 (and at most 64 for the embedded store)".to_string());
        }
        if st.replication_factor == 0 {
            problems.push("store.replication_factor: must be at least 1".to_string());
        }
        if st.write_consistency == 0 || st.write_consistency > st.replication_factor {
            problems.push("store.write_consistency: must be between 1 and store.replication_factor".to_string());
        }
        if !["none", "int8"].contains(&st.quantization.as_str()) {
            problems.push(format!("store.quantization: `{}` is not none or int8", st.quantization));
        }
        if !PAYLOAD_INDEX_SETTINGS.contains(&st.payload_indexes.as_str()) {
            problems.push(format!("store.payload_indexes: `{}` is not lookups, filters or all", st.payload_indexes));
        }
        if st.hnsw_m != 0 && !(4..=128).contains(&st.hnsw_m) {
            problems.push("store.hnsw_m: must be 0 (no graph) or between 4 and 128".to_string());
        }
        if !(4..=4096).contains(&st.hnsw_ef_construct) {
            problems.push("store.hnsw_ef_construct: must be between 4 and 4096".to_string());
        }
        if st.alias == st.collection {
            problems.push("store.alias: must differ from store.collection".to_string());
        }
    }

    fn validate_kafka(&self, problems: &mut Vec<String>) {
        let k = &self.kafka;
        if !k.enabled {
            return;
        }
        let mut need = |key: &str, value: &str| {
            if value.trim().is_empty() {
                problems.push(format!("kafka.{key}: must not be empty"));
            }
        };
        need("bootstrap_servers", &k.bootstrap_servers);
        need("group_id", &k.group_id);
        need("variables_topic", &k.variables_topic);
        need("kg_topic", &k.kg_topic);
        need("dlq_topic", &k.dlq_topic);
        if k.topics.is_empty() || k.topics.iter().any(|t| t.trim().is_empty()) {
            problems.push("kafka.topics: must name at least one topic (or ^regex), none empty".to_string());
        }
        for t in &k.topics {
            if [&k.variables_topic, &k.kg_topic, &k.dlq_topic].contains(&t) {
                problems.push(format!("kafka.topics: `{t}` is also an output topic"));
            }
        }
        let registry = &k.schema_registry;
        if !registry.url.is_empty() {
            if let Err(e) = Endpoint::parse(&registry.url) {
                problems.extend(e.problems());
            }
            if registry.timeout_ms == 0 {
                problems.push("kafka.schema_registry.timeout_ms: must be at least 1".to_string());
            }
        }
        if k.create_partitions < 1 {
            problems.push("kafka.create_partitions: must be at least 1".to_string());
        }
        if k.replication_factor < 1 {
            problems.push("kafka.replication_factor: must be at least 1".to_string());
        }
        if k.commit_interval_ms == 0 {
            problems.push("kafka.commit_interval_ms: must be at least 1".to_string());
        }
        if k.retry_initial_ms == 0 || k.retry_max_ms < k.retry_initial_ms {
            problems.push("kafka.retry_initial_ms / retry_max_ms: need 0 < initial <= max".to_string());
        }
        if k.halt_after_ms < k.retry_max_ms {
            problems.push("kafka.halt_after_ms: must be at least kafka.retry_max_ms".to_string());
        }
        let session_ms = k.property_ms(&k.consumer, "session.timeout.ms", 45_000);
        if k.drain_timeout_ms >= session_ms {
            problems.push(format!(
                "kafka.drain_timeout_ms: must be below the consumer's session.timeout.ms ({session_ms})"
            ));
        }
        if k.dead_letters.window == 0 || !(0.0..=1.0).contains(&k.dead_letters.max_ratio) {
            problems.push("kafka.dead_letters: window must be >= 1 and max_ratio between 0.0 and 1.0".to_string());
        }
        if k.dead_letters.max_consecutive == 0 {
            problems.push("kafka.dead_letters.max_consecutive: must be at least 1".to_string());
        }
        for (map, props) in [("common", &k.common), ("consumer", &k.consumer), ("producer", &k.producer)] {
            for key in props.keys() {
                if MANAGED_KAFKA_KEYS.contains(&key.as_str()) {
                    problems.push(format!("kafka.{map}.\"{key}\": set by clinstream (use the kafka.* setting)"));
                }
            }
        }
    }

    /// The weight of a canonical section.
    pub fn section_weight(&self, name: &str) -> f32 {
        self.sections.weights.get(name).copied().unwrap_or(self.sections.default_weight)
    }

    /// The effective settings as TOML, with secrets redacted.
    pub fn redacted_toml(&self) -> String {
        let mut value = toml::Value::try_from(self).expect("settings always serialize to TOML");
        redact(&mut value);
        toml::to_string_pretty(&value).expect("a TOML value always prints")
    }

    /// Async runtime threads (resolving 0 = a quarter of the cores, at least 2).
    pub fn async_threads(&self) -> usize {
        match self.pipeline.async_threads {
            0 => (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) / 4).max(2),
            n => n,
        }
    }

    /// Worker threads to use (resolving 0 = one per core).
    pub fn worker_threads(&self) -> usize {
        match self.pipeline.workers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        }
    }
}

impl StoreSettings {
    /// `maintain_threads`, resolved (0 = a quarter of the cores, at least 1).
    pub fn maintain_threads(&self) -> usize {
        match self.maintain_threads {
            0 => (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) / 4).max(1),
            n => n,
        }
    }

    /// `maintain_concurrency`, resolved (0 = a quarter of the cores over `maintain_threads`, at least 1).
    pub fn maintain_concurrency(&self) -> usize {
        match self.maintain_concurrency {
            0 => {
                let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
                (cores / 4 / self.maintain_threads()).max(1)
            }
            n => n,
        }
    }
}

/// librdkafka properties clinstream sets itself; the passthrough maps may not override them, because the
/// delivery guarantees depend on them.
pub const MANAGED_KAFKA_KEYS: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "group.instance.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "transactional.id",
    "isolation.level",
];

fn check_weight(problems: &mut Vec<String>, key: &str, weight: f32) {
    if !(0.0..=1.0).contains(&weight) || weight.is_nan() {
        problems.push(format!("{key}: must be between 0.0 and 1.0"));
    }
}

/// Key names whose values are secrets, wherever they appear (typed fields or passthrough maps): judged by the
/// key's last segment (`sasl.password`, `api_key`, `ssl.key.pem`), so `token_budget` is not a secret.
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    let segments: Vec<&str> = k.split(['.', '_', '-']).filter(|s| !s.is_empty()).collect();
    let last = segments.last().copied().unwrap_or("");
    let prev = segments.len().checked_sub(2).map_or("", |i| segments[i]);
    matches!(last, "password" | "passwd" | "secret" | "token" | "credential" | "credentials" | "pem" | "apikey")
        || (last == "key" && matches!(prev, "api" | "private" | "access" | "secret" | "ssl"))
        || k.contains("jaas")
}

pub const REDACTED: &str = "***redacted***";

/// Replaces every value under a secret-looking key with `REDACTED`.
pub fn redact(value: &mut toml::Value) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table.iter_mut() {
                // An empty value is "not set", not a secret; printing it says so.
                if is_secret_key(k) && !v.is_table() && v.as_str() != Some("") {
                    *v = toml::Value::String(REDACTED.to_string());
                } else {
                    redact(v);
                }
            }
        }
        toml::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// A secret string: its `Debug` and `Display` never show the value, and it serializes redacted.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The value, for the one place that hands it to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Empty means "not set": nothing to hide, and printing it says so.
        s.serialize_str(if self.0.is_empty() { "" } else { REDACTED })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn defaults_load_and_validate() {
        let s = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!(s.decode.max_attachment_bytes, 4 * 1024 * 1024);
        assert_eq!(s.section_weight("assessment_and_plan"), 1.0);
        assert_eq!(s.section_weight("history_of_present_illness"), 0.9);
        assert!(s.section_weight("family_history") < 0.9);
    }

    #[test]
    fn env_overrides_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[decode]\nmax_attachment_bytes = 1000\n[sections.weights]\nplan = 0.5\n").unwrap();
        let s = Settings::load_from(Some(&file), env(&[])).unwrap();
        assert_eq!(s.decode.max_attachment_bytes, 1000);
        assert_eq!(s.section_weight("plan"), 0.5);
        assert_eq!(s.section_weight("assessment"), 1.0, "maps merge key by key");
        let s = Settings::load_from(
            Some(&file),
            env(&[
                ("CLINSTREAM__DECODE__MAX_ATTACHMENT_BYTES", "2000"),
                ("CLINSTREAM__DECODE__CONTENT_TYPE_PREFERENCE", "text/html,text/plain"),
                ("CLINSTREAM__OUTPUT__INCLUDE_TEXT", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(s.decode.max_attachment_bytes, 2000);
        assert_eq!(s.decode.content_type_preference, vec!["text/html", "text/plain"]);
        assert!(s.output.include_text);
    }

    /// Every numeric and boolean key, set to a value of the wrong type through its environment variable, is
    /// refused at load with the key named (strings take any text; their allowed values are checked by `validate`).
    #[test]
    fn every_key_with_a_wrong_type_is_refused_with_its_name() {
        let defaults = toml::Value::try_from(Settings::load_from(None, env(&[])).unwrap()).unwrap();
        let mut checked = 0;
        for (section, table) in defaults.as_table().unwrap() {
            let Some(table) = table.as_table() else { continue };
            for (key, value) in table {
                let bad = match value {
                    toml::Value::Integer(_) | toml::Value::Float(_) => "not-a-number",
                    toml::Value::Boolean(_) => "maybe",
                    _ => continue,
                };
                let var = format!("CLINSTREAM__{}__{}", section.to_uppercase(), key.to_uppercase());
                let err = Settings::load_from(None, env(&[(&var, bad)])).unwrap_err().to_string();
                assert!(err.contains(&format!("{section}.{key}")), "{var}={bad}: {err}");
                checked += 1;
            }
        }
        assert!(checked >= 40, "only {checked} keys checked");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = Settings::load_from(None, env(&[("CLINSTREAM__DECODE__MAX_ATACHMENT_BYTES", "1")])).unwrap_err();
        assert!(err.to_string().contains("max_atachment_bytes"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[nonsense]\nx = 1\n").unwrap();
        let err = Settings::load_from(Some(&file), env(&[])).unwrap_err();
        assert!(err.to_string().contains("nonsense"), "{err}");
    }

    #[test]
    fn validate_names_each_wrong_key() {
        let err = Settings::load_from(
            None,
            env(&[
                ("CLINSTREAM__SECTIONS__WEIGHTS__NOT_A_SECTION", "0.5"),
                ("CLINSTREAM__SECTIONS__WEIGHTS__PLAN", "1.5"),
                ("CLINSTREAM__PIPELINE__IN_FLIGHT", "0"),
                ("CLINSTREAM__DECODE__CONTENT_TYPE_PREFERENCE", "application/pdf"),
                ("CLINSTREAM__CHUNKING__SEOS_VECTORS", "exact"),
                ("CLINSTREAM__RAPTOR__SUMMARY_TOKENS", "8"),
                ("CLINSTREAM__RAPTOR__ABSTRACTIVE", "true"),
                ("CLINSTREAM__RAPTOR__ABSTRACT_INPUT_TOKENS", "10"),
                ("CLINSTREAM__RAPTOR__COMPRESS", "1.5"),
                ("CLINSTREAM__STORE__BM25_FULL_SHARE", "0"),
                ("CLINSTREAM__STORE__BM25_PARTIAL_POWER", "0.5"),
                ("CLINSTREAM__STORE__MAINTAIN_NICE", "-5"),
                ("CLINSTREAM__PIPELINE__WORKERS_NICE", "20"),
            ]),
        )
        .unwrap_err();
        let msg = err.to_string();
        // Section names and content types are checked against the stages' tables when the pipeline is built
        // (`stages::check_names`, tested there).
        for key in [
            "sections.weights.plan: must be between",
            "pipeline.in_flight",
            "chunking.seos_vectors: `exact` is not groups, sentences or composed",
            "raptor.summary_tokens: must be at least 16",
            "raptor.abstractive: needs raptor.enabled and an LLM (llm.base_url)",
            "raptor.abstract_input_tokens: must be at least 64",
            "raptor.compress: must be between 0 (off) and 1",
            "store.bm25_full_share: must be above 0 and at most 1",
            "store.bm25_partial_power: must be a number of at least 1",
            "store.maintain_nice: must be between 0",
            "pipeline.workers_nice: must be between 0",
        ] {
            assert!(msg.contains(key), "missing {key} in {msg}");
        }
    }

    #[test]
    fn librdkafka_passthrough_keeps_dotted_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.toml");
        std::fs::write(
            &path,
            "[kafka.consumer]\n\"fetch.wait.max.ms\" = \"100\"\n\"session.timeout.ms\" = 30000\n\
             [kafka.common]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.password\" = \"hunter2\"\n",
        )
        .unwrap();
        let s = Settings::load_from(Some(&path), env(&[])).unwrap();
        assert_eq!(s.kafka.consumer.get("fetch.wait.max.ms").map(String::as_str), Some("100"));
        assert_eq!(s.kafka.consumer.get("session.timeout.ms").map(String::as_str), Some("30000"));
        assert_eq!(s.kafka.common.get("security.protocol").map(String::as_str), Some("SASL_SSL"));
        let printed = s.redacted_toml();
        assert!(!printed.contains("hunter2") && printed.contains("fetch.wait.max.ms"), "{printed}");
    }

    #[test]
    fn kafka_settings_are_validated_when_enabled() {
        let err = Settings::load_from(
            None,
            env(&[
                ("CLINSTREAM__KAFKA__ENABLED", "true"),
                ("CLINSTREAM__KAFKA__TOPICS", "clinstream.kg.v1"),
                ("CLINSTREAM__KAFKA__DRAIN_TIMEOUT_MS", "60000"),
                ("CLINSTREAM__KAFKA__CREATE_PARTITIONS", "0"),
            ]),
        )
        .unwrap_err()
        .to_string();
        for key in [
            "kafka.topics: `clinstream.kg.v1` is also an output topic",
            "kafka.drain_timeout_ms",
            "kafka.create_partitions",
        ] {
            assert!(err.contains(key), "missing {key} in {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.toml");
        std::fs::write(&path, "[kafka]\nenabled = true\n[kafka.consumer]\n\"enable.auto.commit\" = \"true\"\n")
            .unwrap();
        let err = Settings::load_from(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(err.contains("kafka.consumer.\"enable.auto.commit\": set by clinstream"), "{err}");
    }

    #[test]
    fn missing_config_file_is_an_error() {
        let err = Settings::load_from(Some(Path::new("/nonexistent/clinstream.toml")), env(&[])).unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }

    #[test]
    fn secrets_are_redacted_in_printed_settings_and_debug() {
        let mut v: toml::Value = toml::from_str(
            "[kafka]\nbootstrap = \"b:9092\"\n[kafka.properties]\n\"sasl.password\" = \"hunter2\"\n\"ssl.key.pem\" = \"PEM\"\n[qdrant]\napi_key = \"k\"\n",
        )
        .unwrap();
        redact(&mut v);
        let printed = toml::to_string(&v).unwrap();
        assert!(!is_secret_key("token_budget") && is_secret_key("auth_token") && is_secret_key("sasl.jaas.config"));
        assert!(!printed.contains("hunter2") && !printed.contains("PEM") && !printed.contains("\"k\""), "{printed}");
        assert!(printed.contains("b:9092"));
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), format!("{REDACTED} {REDACTED}"));
        assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{REDACTED}\""));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn printed_settings_round_trip() {
        let s = Settings::load_from(None, env(&[])).unwrap();
        let back: Settings = toml::from_str(&s.redacted_toml()).unwrap();
        assert_eq!(back, s);
    }
}
