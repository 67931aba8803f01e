//! The output side of Kafka mode: results and dead letters onto their topics, and the commit step.
//!
//! Every record is keyed by document id (dead letters keep the original key). The producer is idempotent
//! (`enable.idempotence=true`, so librdkafka's own retries never duplicate or reorder); with
//! `kafka.transactions` it is transactional and each commit interval is one transaction holding the outputs
//! and the consumer offsets (`send_offsets_to_transaction`).
//!
//! `checkpoint` is the outputs side of the ack core (`crate::ack`): without transactions it first waits until every
//! record handed to the producer so far is delivered, then commits the watermarks the ack core hands out; a delivery that fails after
//! librdkafka's retries (`message.timeout.ms` = `kafka.halt_after_ms`) halts the worker before anything is
//! committed, so the affected events are redelivered after the restart.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::{Handed, Outputs};
use crate::WORKER_VERSION;
use crate::ack::{Acks, Batch};
use crate::backoff::Backoff;
use crate::codec::avro::{self, Encoder, Framing, SourcePosition};
use crate::config::Settings;
use crate::error::{DocError, ErrorCode, RunError, Stage};
use crate::kafka::client_config;
use crate::model::{DeadLetter, Document};
use crate::source::kafka::{IntakeConsumer, KafkaRecord};
use crate::telemetry::metrics::metrics;

/// Header names added to dead letters (next to the original headers).
pub mod headers {
    pub const REASON: &str = "clinstream.reason";
    pub const STAGE: &str = "clinstream.stage";
    pub const SOURCE_TOPIC: &str = "clinstream.source.topic";
    pub const SOURCE_PARTITION: &str = "clinstream.source.partition";
    pub const SOURCE_OFFSET: &str = "clinstream.source.offset";
    pub const WORKER_VERSION: &str = "clinstream.worker.version";
    /// The entry index when the dead letter is one entry of a Bundle message (its value is that entry).
    pub const BUNDLE_ENTRY: &str = "clinstream.bundle.entry";
}

/// Output records' labels (the `output` label of `clinstream_kafka_records_produced_total`).
#[derive(Debug, Clone, Copy)]
enum Out {
    Variables,
    Kg,
    Dlq,
}

impl Out {
    fn as_str(self) -> &'static str {
        match self {
            Out::Variables => "variables",
            Out::Kg => "kg",
            Out::Dlq => "dlq",
        }
    }
}

/// Kafka mode's outputs side: the producer, the encoders, and the consumer it commits through.
pub struct Output {
    producer: FutureProducer,
    /// The producer's configuration, kept to build a new one after a fatal idempotence error.
    producer_config: ClientConfig,
    consumer: Arc<IntakeConsumer>,
    transactional: bool,
    /// Deliveries not yet confirmed, oldest first.
    deliveries: Vec<(Out, DeliveryFuture)>,
    /// Records sent in the open transaction.
    in_transaction: usize,
    variables: Encoder,
    kg: Encoder,
    dlq: Encoder,
    include_text: bool,
    lexicon_version: String,
    settings: crate::config::KafkaSettings,
    op_timeout: Duration,
    /// The producer's `message.max.bytes` (librdkafka's default 1,000,000 unless configured).
    max_message: usize,
}

/// Room for the record's framing and headers within `message.max.bytes`.
const RECORD_OVERHEAD: usize = 512;

fn halt(code: ErrorCode, detail: impl Into<String>) -> RunError {
    RunError::halt(code, detail)
}

impl Output {
    pub async fn new(
        settings: &Settings,
        lexicon_version: &str,
        framing: [Framing; 3],
        consumer: Arc<IntakeConsumer>,
    ) -> Result<Self, RunError> {
        let k = &settings.kafka;
        let mut config = client_config(k, &std::collections::BTreeMap::new());
        // librdkafka requires message.timeout.ms <= transaction.timeout.ms (60 s unless configured).
        let transaction_timeout_ms = k.property_ms(&k.producer, "transaction.timeout.ms", 60_000);
        let message_timeout_ms =
            if k.transactions { k.halt_after_ms.min(transaction_timeout_ms) } else { k.halt_after_ms };
        config
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", message_timeout_ms.to_string())
            .set("linger.ms", "5")
            .set("compression.type", "lz4");
        if k.transactions {
            config.set("transactional.id", k.effective_transactional_id());
        }
        for (key, value) in &k.producer {
            config.set(key, value);
        }
        let producer: FutureProducer = config.create().map_err(|e| RunError::Config(format!("kafka producer: {e}")))?;
        let producer_config = config;
        let [fv, fk, fd] = framing;
        let enc = |schema: &'static str, f: Framing| {
            Encoder::new(schema, f).map_err(|e| RunError::Config(format!("schema: {e}")))
        };
        let mut output = Output {
            producer,
            producer_config,
            consumer,
            transactional: k.transactions,
            deliveries: Vec::new(),
            in_transaction: 0,
            variables: enc(avro::VARIABLES_SCHEMA, fv)?,
            kg: enc(avro::KG_SCHEMA, fk)?,
            dlq: enc(avro::DLQ_SCHEMA, fd)?,
            include_text: settings.output.include_text,
            lexicon_version: lexicon_version.to_string(),
            settings: k.clone(),
            op_timeout: Duration::from_millis(k.retry_max_ms.max(10_000)),
            max_message: k.property_ms(&k.producer, "message.max.bytes", 1_000_000) as usize,
        };
        if output.transactional {
            output.init_transactions().await?;
        }
        Ok(output)
    }

    async fn init_transactions(&mut self) -> Result<(), RunError> {
        let mut backoff = Backoff::kafka(&self.settings);
        loop {
            let timeout = self.op_timeout;
            let producer = self.producer.clone();
            match blocking(move || producer.init_transactions(timeout)).await {
                Ok(()) => break,
                Err(e) => {
                    warn!(error = %e, "Initialising Kafka transactions failed; retrying.");
                    metrics().retries.with_label_values(&["init"]).inc();
                    match backoff.failed() {
                        Some(d) => tokio::time::sleep(d).await,
                        None => return Err(halt(ErrorCode::KafkaUnavailable, format!("init_transactions: {e}"))),
                    }
                }
            }
        }
        self.producer
            .begin_transaction()
            .map_err(|e| halt(ErrorCode::CommitFailed, format!("begin_transaction: {e}")))?;
        info!("Kafka transactions initialised.");
        Ok(())
    }

    /// Sends a document's outputs: one variables record per CLEAR variable and one knowledge-graph delta.
    /// Encodes every output of the document first; when one is over the producer's message size limit, nothing
    /// is sent and the document is refused (dead-lettered by the runner), so the others go on.
    async fn send_document(&mut self, doc: &Document) -> Result<Handed, RunError> {
        let key = doc.note.doc_id.as_bytes();
        let mut records = Vec::with_capacity(doc.variables.len() + 1);
        for v in &doc.variables {
            let record = avro::VariableRecord::new(doc, v, &self.lexicon_version, self.include_text);
            let bytes = self
                .variables
                .encode(&record)
                .map_err(|e| halt(ErrorCode::SinkIo, format!("variables record: {e}")))?;
            records.push((Out::Variables, bytes));
        }
        let bytes = self.kg.encode(&doc.kg).map_err(|e| halt(ErrorCode::SinkIo, format!("kg record: {e}")))?;
        records.push((Out::Kg, bytes));
        // librdkafka counts key, value and record overhead against message.max.bytes.
        if let Some((out, bytes)) =
            records.iter().find(|(_, b)| b.len() + key.len() + RECORD_OVERHEAD > self.max_message)
        {
            let detail = format!(
                "the {} record is {} bytes; the producer's message.max.bytes is {}",
                out.as_str(),
                bytes.len(),
                self.max_message
            );
            return Ok(Handed::Refused(DocError::new(ErrorCode::OutputTooLarge, Stage::Sink, detail)));
        }
        for (out, bytes) in records {
            self.send(out, Some(key), &bytes, None).await?;
        }
        Ok(Handed::Written)
    }

    /// Sends a dead letter: the original key and headers, `clinstream.*` headers, and the Avro envelope
    /// holding the original value.
    async fn send_dead_letter(&mut self, letter: &DeadLetter, record: &KafkaRecord) -> Result<(), RunError> {
        let m = &record.message;
        let mut hdrs = OwnedHeaders::new();
        if let Some(original) = m.headers() {
            for h in original.iter() {
                hdrs = hdrs.insert(Header { key: h.key, value: h.value });
            }
        }
        let partition = record.partition.to_string();
        let offset = record.offset.to_string();
        for (key, value) in [
            (headers::REASON, letter.code().as_str()),
            (headers::STAGE, letter.stage().as_str()),
            (headers::SOURCE_TOPIC, &*record.topic),
            (headers::SOURCE_PARTITION, partition.as_str()),
            (headers::SOURCE_OFFSET, offset.as_str()),
            (headers::WORKER_VERSION, WORKER_VERSION),
        ] {
            hdrs = hdrs.insert(Header { key, value: Some(value) });
        }
        if let Some(entry) = &record.entry {
            let index = entry.index.to_string();
            hdrs = hdrs.insert(Header { key: headers::BUNDLE_ENTRY, value: Some(index.as_str()) });
        }
        let at = SourcePosition {
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            timestamp_ms: m.timestamp().to_millis(),
        };
        let dead_letter = avro::DeadLetterRecord::new(letter, &at, record.payload());
        let bytes =
            self.dlq.encode(&dead_letter).map_err(|e| halt(ErrorCode::SinkIo, format!("dead-letter record: {e}")))?;
        self.send(Out::Dlq, m.key(), &bytes, Some(hdrs)).await
    }

    async fn send(
        &mut self,
        out: Out,
        key: Option<&[u8]>,
        payload: &[u8],
        headers: Option<OwnedHeaders>,
    ) -> Result<(), RunError> {
        let topic = match out {
            Out::Variables => self.settings.variables_topic.clone(),
            Out::Kg => self.settings.kg_topic.clone(),
            Out::Dlq => self.settings.dlq_topic.clone(),
        };
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(h) = headers {
            record = record.headers(h);
        }
        let mut backoff = Backoff::kafka(&self.settings);
        loop {
            match self.producer.send_result(record) {
                Ok(delivery) => {
                    self.deliveries.push((out, delivery));
                    self.in_transaction += 1;
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The producer's queue is full (broker slow or away): let deliveries drain, then retry.
                    record = back;
                    metrics().retries.with_label_values(&["deliver"]).inc();
                    match backoff.failed() {
                        Some(d) => tokio::time::sleep(d.min(Duration::from_millis(100))).await,
                        None => return Err(halt(ErrorCode::DeliveryFailed, "producer queue stayed full")),
                    }
                }
                Err((e, back)) if self.recoverable() => {
                    // The producer is in a fatal state (see `await_deliveries`): settle what it still holds, send
                    // that again through a new producer, then this record.
                    warn!(error = %e, "The producer refused a record after a fatal error; replacing it.");
                    record = back;
                    self.await_deliveries().await?;
                    if self.recoverable() {
                        self.replace_producer(&mut backoff).await?;
                    }
                }
                Err((e, _)) => return Err(halt(ErrorCode::DeliveryFailed, format!("{} record: {e}", out.as_str()))),
            }
        }
    }

    /// True when the producer hit a fatal error that a new producer overcomes without losing anything: with
    /// idempotence only (no transactions), every record it did not deliver comes back with its delivery report
    /// and is sent again. (A transactional producer's fatal error halts: its open transaction is lost with it,
    /// and the restarted worker resumes from the last committed transaction.)
    fn recoverable(&self) -> bool {
        !self.transactional && self.producer.client().fatal_error().is_some()
    }

    /// Replaces a producer that hit a fatal error with a new one (a new producer id, sequence numbers from zero).
    /// The typical cause: a broker that lost the idempotent producer's state across a restart answers
    /// `OutOfOrderSequenceNumber`, which librdkafka makes fatal. Retried with the Kafka backoff; halts after it.
    async fn replace_producer(&mut self, backoff: &mut Backoff) -> Result<(), RunError> {
        let (code, _) = self.producer.client().fatal_error().unwrap_or((RDKafkaErrorCode::Fatal, String::new()));
        warn!(code = ErrorCode::DeliveryFailed.as_str(), cause = ?code, "Producer hit a fatal error; replacing it.");
        metrics().retries.with_label_values(&["producer"]).inc();
        match backoff.failed() {
            Some(d) => tokio::time::sleep(d).await,
            None => return Err(halt(ErrorCode::DeliveryFailed, format!("producer fatal error persists: {code:?}"))),
        }
        let fresh: FutureProducer = self
            .producer_config
            .create()
            .map_err(|e| halt(ErrorCode::DeliveryFailed, format!("new kafka producer: {e}")))?;
        let old = std::mem::replace(&mut self.producer, fresh);
        // Dropping a producer purges and joins its thread (up to 0.5 s): off the async workers.
        tokio::task::spawn_blocking(move || drop(old));
        Ok(())
    }

    /// Waits until every record sent so far is delivered. A failed delivery halts (nothing is committed) —
    /// except after a fatal producer error without transactions (`recoverable`): the records it did not deliver
    /// are sent again, in their order, through a new producer, so nothing is lost (a record the broker did take
    /// before the error may appear twice, as at-least-once allows).
    async fn await_deliveries(&mut self) -> Result<(), RunError> {
        let mut backoff = Backoff::kafka(&self.settings);
        loop {
            let mut undelivered: Vec<(Out, OwnedMessage)> = Vec::new();
            for (out, delivery) in std::mem::take(&mut self.deliveries) {
                match delivery.await {
                    Ok(Ok(_)) => metrics().records_produced.with_label_values(&[out.as_str()]).inc(),
                    Ok(Err((_, message))) if self.recoverable() => undelivered.push((out, message)),
                    Ok(Err((e, _))) => {
                        return Err(halt(
                            ErrorCode::DeliveryFailed,
                            format!("{} record not delivered: {e}", out.as_str()),
                        ));
                    }
                    Err(_) => return Err(halt(ErrorCode::DeliveryFailed, "producer closed before delivery")),
                }
            }
            if undelivered.is_empty() {
                return Ok(());
            }
            self.replace_producer(&mut backoff).await?;
            info!(records = undelivered.len(), "Sending the undelivered records again through the new producer.");
            for (out, message) in undelivered {
                let headers = message.headers().cloned();
                // Boxed: `send` itself settles deliveries (and so may come back here) when the producer is fatal.
                Box::pin(self.send(out, message.key(), message.payload().unwrap_or_default(), headers)).await?;
            }
        }
    }

    /// Makes the outputs sent so far durable and commits the watermarks the ack core allows (assigned
    /// partitions, above what was committed). A commit the group refuses goes back to the ack core.
    async fn commit(&mut self, acks: &mut Acks) -> Result<(), RunError> {
        let batch = acks.take();
        let mut tpl = TopicPartitionList::new();
        for (tp, offset) in &batch {
            tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(*offset))
                .map_err(|e| halt(ErrorCode::CommitFailed, format!("offset list: {e}")))?;
        }
        if self.transactional {
            if self.in_transaction == 0 && batch.is_empty() {
                return Ok(());
            }
            self.commit_transaction(&tpl).await?;
        } else {
            self.await_deliveries().await?;
            if batch.is_empty() {
                return Ok(());
            }
            if !self.commit_offsets(&tpl).await? {
                // The group refused it (a rebalance). Nothing is recorded as committed, and the watermarks go back:
                // a partition that stays ours is committed at the next tick even when no further document arrives
                // on it (its documents are finished, so committing them is safe); one that moved is dropped then.
                acks.refused(batch);
                return Ok(());
            }
        }
        acks.committed(&batch);
        record_committed_metrics(&batch);
        Ok(())
    }

    /// Commits `tpl`; `Ok(false)` when the group refused it because a rebalance took the partitions.
    async fn commit_offsets(&mut self, tpl: &TopicPartitionList) -> Result<bool, RunError> {
        let _ = self.consumer.store_offsets(tpl);
        let mut backoff = Backoff::kafka(&self.settings);
        loop {
            let (consumer, offsets) = (Arc::clone(&self.consumer), tpl.clone());
            match blocking(move || consumer.commit(&offsets, CommitMode::Sync)).await {
                Ok(()) => {
                    metrics().commits.with_label_values(&["ok"]).inc();
                    return Ok(true);
                }
                Err(e) if lost_ownership(&e) => {
                    // The group moved on (a rebalance); the next owner redelivers from its committed offset.
                    warn!(error = %e, "Commit refused after a rebalance; the new owner redelivers.");
                    metrics().commits.with_label_values(&["failed"]).inc();
                    return Ok(false);
                }
                Err(e) => {
                    // A consumer in a fatal state (fenced) commits nothing ever again: halt now, not after
                    // `kafka.halt_after_ms` of retries (the restarted worker redelivers what is uncommitted).
                    if let Some(error) = crate::source::kafka::fatal(&self.consumer) {
                        metrics().commits.with_label_values(&["failed"]).inc();
                        return Err(error);
                    }
                    warn!(code = ErrorCode::KafkaUnavailable.as_str(), error = %e, "Commit failed; retrying.");
                    metrics().commits.with_label_values(&["failed"]).inc();
                    metrics().retries.with_label_values(&["commit"]).inc();
                    match backoff.failed() {
                        Some(d) => tokio::time::sleep(d).await,
                        None => return Err(halt(ErrorCode::CommitFailed, format!("offset commit: {e}"))),
                    }
                }
            }
        }
    }

    async fn commit_transaction(&mut self, tpl: &TopicPartitionList) -> Result<(), RunError> {
        let timeout = self.op_timeout;
        let mut backoff = Backoff::kafka(&self.settings);
        if tpl.count() > 0 {
            let cgm = Arc::new(
                self.consumer
                    .group_metadata()
                    .ok_or_else(|| halt(ErrorCode::CommitFailed, "no consumer group metadata"))?,
            );
            loop {
                let (producer, offsets, cgm) = (self.producer.clone(), tpl.clone(), Arc::clone(&cgm));
                match blocking(move || producer.send_offsets_to_transaction(&offsets, &cgm, timeout)).await {
                    Ok(()) => break,
                    Err(e) => self.transaction_failed("send_offsets_to_transaction", e, &mut backoff).await?,
                }
            }
        }
        loop {
            let producer = self.producer.clone();
            match blocking(move || producer.commit_transaction(timeout)).await {
                Ok(()) => break,
                Err(e) => self.transaction_failed("commit_transaction", e, &mut backoff).await?,
            }
        }
        metrics().commits.with_label_values(&["ok"]).inc();
        // Everything in the committed transaction is delivered; count it.
        self.await_deliveries().await?;
        self.in_transaction = 0;
        self.producer.begin_transaction().map_err(|e| halt(ErrorCode::CommitFailed, format!("begin_transaction: {e}")))
    }

    /// A transactional call failed: wait and retry when retriable; otherwise abort (when possible) and halt —
    /// the restarted worker resumes from the last committed transaction.
    async fn transaction_failed(&mut self, what: &str, e: KafkaError, backoff: &mut Backoff) -> Result<(), RunError> {
        metrics().commits.with_label_values(&["failed"]).inc();
        let (retriable, abortable) = match &e {
            KafkaError::Transaction(t) => (t.is_retriable(), t.txn_requires_abort()),
            _ => (false, false),
        };
        if retriable {
            warn!(error = %e, what, "Transaction step failed; retrying.");
            metrics().retries.with_label_values(&["commit"]).inc();
            if let Some(d) = backoff.failed() {
                tokio::time::sleep(d).await;
                return Ok(());
            }
        }
        if abortable {
            let timeout = self.op_timeout;
            let producer = self.producer.clone();
            let _ = blocking(move || producer.abort_transaction(timeout)).await;
        }
        Err(halt(ErrorCode::CommitFailed, format!("{what}: {e}")))
    }

    /// Which of the round's Kafka clients is in a fatal state (`"consumer"` or `"producer"`), if one is: such a
    /// client never works again, and the worker rebuilds both (`app::run_kafka`).
    pub fn fatal_client(&self) -> Option<&'static str> {
        if self.consumer.client().fatal_error().is_some() {
            Some("consumer")
        } else if self.producer.client().fatal_error().is_some() {
            Some("producer")
        } else {
            None
        }
    }

    /// On a halt: aborts the open transaction (best effort; a restarted worker with the same transactional id
    /// fences it anyway). Without transactions, records already sent may still be delivered — they are
    /// idempotent by key and reproduced after the restart.
    pub async fn abort(&mut self) {
        if self.transactional {
            let started = Instant::now();
            let timeout = self.op_timeout;
            let producer = self.producer.clone();
            if let Err(e) = blocking(move || producer.abort_transaction(timeout)).await {
                warn!(error = %e, took_ms = started.elapsed().as_millis() as u64, "Could not abort the transaction.");
            }
        }
    }
}

/// Kafka mode's outputs: documents and dead letters to the producer; a checkpoint commits.
impl Outputs<KafkaRecord> for Output {
    async fn document(&mut self, doc: &Document, _record: &KafkaRecord) -> Result<Handed, RunError> {
        self.send_document(doc).await
    }

    async fn dead_letter(&mut self, letter: &DeadLetter, record: Option<&KafkaRecord>) -> Result<(), RunError> {
        match record {
            Some(record) => self.send_dead_letter(letter, record).await,
            None => Err(halt(ErrorCode::SinkIo, "a Kafka dead letter without its record")),
        }
    }

    async fn checkpoint(&mut self, acks: &mut Acks) -> Result<(), RunError> {
        self.commit(acks).await
    }
}

/// Runs a blocking librdkafka call (commit, transaction step) on the blocking pool, off the async workers.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(call).await.unwrap_or(Err(KafkaError::Canceled))
}

/// Exports committed offsets as `clinstream_kafka_committed_offset`.
fn record_committed_metrics(batch: &Batch) {
    for (tp, offset) in batch {
        metrics().committed_offset.with_label_values(&[&*tp.0, &tp.1.to_string()]).set(*offset);
    }
}

fn lost_ownership(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::RebalanceInProgress
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::AssignmentLost
        )
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    use super::*;
    use crate::ack::Ledger;

    /// A broker that forgot the idempotent producer's state (a restarted test broker does) answers
    /// `OutOfOrderSequenceNumber`, which librdkafka makes fatal for the producer. Without transactions the output
    /// side replaces the producer and sends what the old one did not deliver: every record arrives. librdkafka's
    /// mock cluster injects the error, so no broker is needed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fatal_idempotence_error_replaces_the_producer_and_loses_nothing() {
        let mock = MockCluster::new(1).unwrap();
        let mut settings = Settings::load_from(None, Some(Default::default())).unwrap();
        settings.kafka.bootstrap_servers = mock.bootstrap_servers();
        settings.kafka.halt_after_ms = 60_000;
        for topic in [&settings.kafka.kg_topic, &settings.kafka.variables_topic, &settings.kafka.dlq_topic] {
            mock.create_topic(topic, 1, 1).unwrap();
        }
        mock.create_topic(&settings.kafka.topics[0], 1, 1).unwrap();
        let ledger = Arc::new(Ledger::default());
        let (intake, _rx) = crate::source::kafka::start(&settings, &ledger).unwrap();
        let consumer = Arc::clone(&intake.consumer);
        let mut out = Output::new(
            &settings,
            "test",
            [Framing::SingleObject, Framing::SingleObject, Framing::SingleObject],
            consumer,
        )
        .await
        .unwrap();
        let send_range = async |out: &mut Output, range: std::ops::Range<usize>| {
            for i in range {
                out.send(Out::Kg, Some(format!("doc-{i}").as_bytes()), b"value", None).await.unwrap();
            }
        };
        send_range(&mut out, 0..20).await;
        out.await_deliveries().await.unwrap();
        assert!(out.producer.client().fatal_error().is_none());
        let replaced = metrics().retries.with_label_values(&["producer"]).get();

        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER; 2],
        );
        send_range(&mut out, 20..60).await;
        out.await_deliveries().await.expect("the records come through a new producer");
        assert!(metrics().retries.with_label_values(&["producer"]).get() > replaced, "the producer was replaced");
        assert!(out.producer.client().fatal_error().is_none(), "the new producer is healthy");
        send_range(&mut out, 60..70).await;
        out.await_deliveries().await.unwrap();

        let reader: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", mock.bootstrap_servers())
            .set("group.id", "reader")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        reader.subscribe(&[&settings.kafka.kg_topic]).unwrap();
        let mut keys = std::collections::BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while keys.len() < 70 && Instant::now() < deadline {
            if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
                keys.insert(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
            }
        }
        let missing: Vec<usize> = (0..70).filter(|i| !keys.contains(&format!("doc-{i}"))).collect();
        assert!(missing.is_empty(), "records lost: {missing:?}");
        intake.close();
    }
}
