//! `clinstream produce`: publishes DocumentReference events from NDJSON files, Bundles, Bulk-FHIR exports or
//! stdin onto a topic (so trying the worker needs no other Kafka tool). Each event is one record, keyed by the
//! resource's `id` when it has one (so all versions of a document land on one partition, in order); the
//! bytes are sent unchanged, malformed ones included — the worker dead-letters those.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use tokio::sync::mpsc;

use crate::codec::avro::{self, Encoder};

use anyhow::{Context as _, anyhow};

use super::{EXIT_DEAD_LETTERS, runtime};
use crate::config::Settings;
use crate::error::{ErrorCode, RunError};
use crate::kafka::client_config;
use crate::model::Origin;
use crate::source::SourceEvent;
use crate::source::file::{self, Input};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, env = "CLINSTREAM_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long, short, required = true, num_args = 1..)]
    input: Vec<String>,
    /// Topic (default: the first of `kafka.topics`).
    #[arg(long, short)]
    topic: Option<String>,
    /// Create the worker's topics first (as `kafka.create_topics` does).
    #[arg(long)]
    create_topics: bool,
}

pub fn exec(args: Args) -> anyhow::Result<ExitCode> {
    let Args { config, input, topic, create_topics } = args;
    let settings = Settings::load(config.as_deref()).context("loading configuration")?;
    crate::telemetry::init_logging(&settings.log)?;
    let topic = topic
        .or_else(|| settings.kafka.topics.iter().find(|t| !t.starts_with('^')).cloned())
        .context("no --topic and no literal topic in kafka.topics")?;
    let inputs: Vec<Input> = input.iter().map(|i| Input::parse(i)).collect();
    let summary = runtime(&settings)?.block_on(async {
        if create_topics {
            crate::kafka::admin::ensure_topics(&settings.kafka).await?;
        }
        produce(&settings, &inputs, &topic).await
    })?;
    println!(
        "sent {} events to {topic} ({} without an id key, {} over 16 MiB skipped, {} over the broker's \
         message size limit not sent)",
        summary.sent, summary.without_key, summary.skipped_oversized, summary.too_large
    );
    // Like `run`: finished, but not everything went through.
    Ok(if summary.too_large > 0 { ExitCode::from(EXIT_DEAD_LETTERS) } else { ExitCode::SUCCESS })
}

/// What `produce` did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProduceSummary {
    pub sent: u64,
    pub without_key: u64,
    pub skipped_oversized: u64,
    /// Events the producer or the broker refused as over the message size limit (each reported on stderr).
    pub too_large: u64,
}

/// The `id` of a top-level JSON object, without parsing the whole event (`None` when absent or not JSON).
pub fn event_key(payload: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: Option<String>,
    }
    serde_json::from_slice::<Id>(payload).ok().and_then(|i| i.id)
}

pub async fn produce(settings: &Settings, inputs: &[Input], topic: &str) -> Result<ProduceSummary, RunError> {
    let k = &settings.kafka;
    let mut config = client_config(k, &k.producer);
    config.set("enable.idempotence", "true").set("message.timeout.ms", k.halt_after_ms.to_string());
    let producer: FutureProducer = config.create().map_err(|e| RunError::Config(format!("kafka producer: {e}")))?;
    let plan = file::plan(inputs)?;
    let (tx, mut rx) = mpsc::channel::<file::Item>(1024);
    // Events larger than the broker accepts are the broker's to refuse; read up to 16 MiB.
    let reader = file::spawn(plan, 16 * 1024 * 1024, tx);
    let mut summary = ProduceSummary::default();
    let mut deliveries: Vec<(Origin, usize, DeliveryFuture)> = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            SourceEvent::Failed(e) => return Err(e),
            SourceEvent::Record(envelope) => {
                let key = event_key(&envelope.payload);
                let mut record = FutureRecord::<str, [u8]>::to(topic).payload(&envelope.payload);
                match &key {
                    Some(k) => record = record.key(k.as_str()),
                    None => summary.without_key += 1,
                }
                let size = envelope.payload.len();
                loop {
                    match producer.send_result(record) {
                        Ok(delivery) => break deliveries.push((envelope.origin.clone(), size, delivery)),
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            record = back;
                            if deliveries.is_empty() {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            settle(&mut deliveries, &mut summary).await?;
                        }
                        Err((e, _)) if too_large(&e) => {
                            refused(&envelope.origin, size, &mut summary);
                            break;
                        }
                        Err((e, _)) => {
                            return Err(RunError::halt(ErrorCode::DeliveryFailed, e.to_string()));
                        }
                    }
                }
                if deliveries.len() >= 10_000 {
                    settle(&mut deliveries, &mut summary).await?;
                }
            }
            SourceEvent::Oversized { .. } => summary.skipped_oversized += 1,
            _ => {}
        }
    }
    settle(&mut deliveries, &mut summary).await?;
    let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    Ok(summary)
}

fn too_large(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageSizeTooLarge)
}

/// An event the producer or the broker refused as larger than its message limit: said on stderr with its place
/// (file and line, never content), counted, and the rest goes on.
fn refused(origin: &Origin, size: usize, summary: &mut ProduceSummary) {
    eprintln!("{origin}: event of {size} bytes is over the broker's message size limit; not sent");
    summary.too_large += 1;
}

/// Waits for the deliveries so far: counts the sent ones, reports refused-as-too-large ones, halts on any other
/// failure.
async fn settle(
    deliveries: &mut Vec<(Origin, usize, DeliveryFuture)>,
    summary: &mut ProduceSummary,
) -> Result<(), RunError> {
    let failed = |detail: String| RunError::halt(ErrorCode::DeliveryFailed, detail);
    for (origin, size, d) in deliveries.drain(..) {
        match d.await {
            Ok(Ok(_)) => summary.sent += 1,
            Ok(Err((e, _))) if too_large(&e) => refused(&origin, size, summary),
            Ok(Err((e, _))) => return Err(failed(format!("{origin}: {e}"))),
            Err(_) => return Err(failed("producer closed before delivery".to_string())),
        }
    }
    Ok(())
}

/// Reads every knowledge-graph delta on `topic` (read_committed, from the beginning to the current end of each
/// partition), for `clinstream kg materialize --topic`.
pub fn read_kg_topic(settings: &Settings, topic: &str) -> anyhow::Result<Vec<crate::model::KgDelta>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};
    let k = &settings.kafka;
    let consumer: BaseConsumer = client_config(k, &k.consumer)
        .set("group.id", format!("clinstream-materialize-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .context("kafka consumer")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .with_context(|| format!("metadata of {topic}"))?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    if partitions.is_empty() {
        return Err(anyhow!("topic {topic} has no partitions (does it exist?)"));
    }
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl).context("assign")?;
    let encoder = Encoder::new(avro::KG_SCHEMA, avro::Framing::SingleObject)?;
    let mut at_end: std::collections::HashSet<i32> = std::collections::HashSet::new();
    let mut deltas = Vec::new();
    while at_end.len() < partitions.len() {
        match consumer.poll(Duration::from_secs(30)) {
            None => return Err(anyhow!("no progress reading {topic} for 30 s")),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                let value = encoder
                    .decode(m.payload().unwrap_or_default())
                    .with_context(|| format!("{topic}[{}]@{}", m.partition(), m.offset()))?;
                let delta = apache_avro::from_value(&value)
                    .with_context(|| format!("{topic}[{}]@{}", m.partition(), m.offset()))?;
                deltas.push(delta);
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(anyhow!("reading {topic}: {e}")),
        }
    }
    Ok(deltas)
}
