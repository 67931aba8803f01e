//! The output side of Kafka mode: results and dead letters onto their topics, and the commit step.
//!
//! Every record is keyed by document id (dead letters keep the original key). The producer is idempotent
//! (`enable.idempotence=true`, so librdkafka's own retries never duplicate or reorder); with
//! `kafka.transactions` it is transactional and each commit interval is one transaction holding the outputs
//! and the consumer offsets (`send_offsets_to_transaction`).
//!
//! `commit` is where the ack model lives: without transactions it first waits until every record handed to the
//! producer so far is delivered, then stores and commits the watermarks; a delivery that fails after
//! librdkafka's retries (`message.timeout.ms` = `kafka.halt_after_ms`) halts the worker before anything is
//! committed, so the affected events are redelivered after the restart.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{info, warn};

use super::avro::{self, Encoder, Framing, SourcePosition};
use super::consumer::{IntakeConsumer, KafkaRecord, Tp};
use super::{Backoff, client_config};
use crate::app::RunError;
use crate::config::Settings;
use crate::error::ErrorCode;
use crate::model::Document;
use crate::sink::DeadLetter;
use crate::sink::records::WORKER_VERSION;
use crate::telemetry::metrics::metrics;

/// Header names added to dead letters (next to the original headers).
pub mod headers {
    pub const REASON: &str = "clinstream.reason";
    pub const STAGE: &str = "clinstream.stage";
    pub const SOURCE_TOPIC: &str = "clinstream.source.topic";
    pub const SOURCE_PARTITION: &str = "clinstream.source.partition";
    pub const SOURCE_OFFSET: &str = "clinstream.source.offset";
    pub const WORKER_VERSION: &str = "clinstream.worker.version";
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

pub struct Output {
    producer: FutureProducer,
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
}

fn halt(code: ErrorCode, detail: impl Into<String>) -> RunError {
    RunError::Kafka { code, detail: detail.into() }
}

impl Output {
    pub async fn new(settings: &Settings, lexicon_version: &str, framing: [Framing; 3]) -> Result<Self, RunError> {
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
        let [fv, fk, fd] = framing;
        let enc =
            |schema: &str, f: Framing| Encoder::new(schema, f).map_err(|e| RunError::Config(format!("schema: {e}")));
        let mut output = Output {
            producer,
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
        };
        if output.transactional {
            output.init_transactions().await?;
        }
        Ok(output)
    }

    async fn init_transactions(&mut self) -> Result<(), RunError> {
        let mut backoff = Backoff::new(&self.settings);
        loop {
            let timeout = self.op_timeout;
            match tokio::task::block_in_place(|| self.producer.init_transactions(timeout)) {
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
    pub async fn document(&mut self, doc: &Document) -> Result<(), RunError> {
        let key = doc.note.doc_id.as_bytes();
        for v in &doc.variables {
            let value = avro::variable_value(doc, v, &self.lexicon_version, self.include_text);
            let bytes =
                self.variables.encode(value).map_err(|e| halt(ErrorCode::SinkIo, format!("variables record: {e}")))?;
            self.send(Out::Variables, Some(key), &bytes, None).await?;
        }
        if let Some(delta) = &doc.kg {
            let value = avro::kg_value(delta).map_err(|e| halt(ErrorCode::SinkIo, format!("kg record: {e}")))?;
            let bytes = self.kg.encode(value).map_err(|e| halt(ErrorCode::SinkIo, format!("kg record: {e}")))?;
            self.send(Out::Kg, Some(key), &bytes, None).await?;
        }
        Ok(())
    }

    /// Sends a dead letter: the original key and headers, `clinstream.*` headers, and the Avro envelope
    /// holding the original value.
    pub async fn dead_letter(&mut self, letter: &DeadLetter, record: &KafkaRecord) -> Result<(), RunError> {
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
        let at = SourcePosition {
            topic: &record.topic,
            partition: record.partition,
            offset: record.offset,
            timestamp_ms: m.timestamp().to_millis(),
        };
        let value = avro::dead_letter_value(letter, &at, record.payload());
        let bytes = self.dlq.encode(value).map_err(|e| halt(ErrorCode::SinkIo, format!("dead-letter record: {e}")))?;
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
            Out::Variables => self.settings.variables_topic.as_str(),
            Out::Kg => self.settings.kg_topic.as_str(),
            Out::Dlq => self.settings.dlq_topic.as_str(),
        };
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(h) = headers {
            record = record.headers(h);
        }
        let mut backoff = Backoff::new(&self.settings);
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
                Err((e, _)) => return Err(halt(ErrorCode::DeliveryFailed, format!("{} record: {e}", out.as_str()))),
            }
        }
    }

    /// Waits until every record sent so far is delivered. A failed delivery halts (nothing is committed).
    async fn await_deliveries(&mut self) -> Result<(), RunError> {
        for (out, delivery) in self.deliveries.drain(..) {
            match delivery.await {
                Ok(Ok(_)) => metrics().records_produced.with_label_values(&[out.as_str()]).inc(),
                Ok(Err((e, _))) => {
                    return Err(halt(ErrorCode::DeliveryFailed, format!("{} record not delivered: {e}", out.as_str())));
                }
                Err(_) => return Err(halt(ErrorCode::DeliveryFailed, "producer closed before delivery")),
            }
        }
        Ok(())
    }

    /// Makes the outputs sent so far durable and commits `watermarks` (next offset to read, per partition).
    /// Partitions no longer assigned, and offsets not above what was committed, are left out.
    pub async fn commit(
        &mut self,
        consumer: &IntakeConsumer,
        watermarks: &mut HashMap<Tp, i64>,
    ) -> Result<(), RunError> {
        let ctx = consumer.context();
        let mut tpl = TopicPartitionList::new();
        let mut batch = Vec::new();
        for (tp, offset) in watermarks.drain() {
            if !ctx.is_assigned(&tp) || ctx.committed(&tp).is_some_and(|c| c >= offset) {
                continue;
            }
            tpl.add_partition_offset(&tp.0, tp.1, Offset::Offset(offset))
                .map_err(|e| halt(ErrorCode::CommitFailed, format!("offset list: {e}")))?;
            batch.push((tp, offset));
        }
        if self.transactional {
            if self.in_transaction == 0 && batch.is_empty() {
                return Ok(());
            }
            self.commit_transaction(consumer, &tpl).await?;
        } else {
            self.await_deliveries().await?;
            if batch.is_empty() {
                return Ok(());
            }
            if !self.commit_offsets(consumer, &tpl).await? {
                // The group refused it (a rebalance). Nothing is recorded as committed, and the watermarks go back:
                // a partition that stays ours is committed at the next tick even when no further document arrives
                // on it (its documents are finished, so committing them is safe); one that moved is dropped then.
                for (tp, offset) in batch {
                    let w = watermarks.entry(tp).or_insert(offset);
                    *w = (*w).max(offset);
                }
                return Ok(());
            }
        }
        for (tp, offset) in batch {
            ctx.record_committed(tp, offset);
        }
        Ok(())
    }

    /// Commits `tpl`; `Ok(false)` when the group refused it because a rebalance took the partitions.
    async fn commit_offsets(&mut self, consumer: &IntakeConsumer, tpl: &TopicPartitionList) -> Result<bool, RunError> {
        let _ = consumer.store_offsets(tpl);
        let mut backoff = Backoff::new(&self.settings);
        loop {
            match tokio::task::block_in_place(|| consumer.commit(tpl, CommitMode::Sync)) {
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

    async fn commit_transaction(
        &mut self,
        consumer: &IntakeConsumer,
        tpl: &TopicPartitionList,
    ) -> Result<(), RunError> {
        let timeout = self.op_timeout;
        let mut backoff = Backoff::new(&self.settings);
        if tpl.count() > 0 {
            let cgm =
                consumer.group_metadata().ok_or_else(|| halt(ErrorCode::CommitFailed, "no consumer group metadata"))?;
            loop {
                match tokio::task::block_in_place(|| self.producer.send_offsets_to_transaction(tpl, &cgm, timeout)) {
                    Ok(()) => break,
                    Err(e) => self.transaction_failed("send_offsets_to_transaction", e, &mut backoff).await?,
                }
            }
        }
        loop {
            match tokio::task::block_in_place(|| self.producer.commit_transaction(timeout)) {
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
            let _ = tokio::task::block_in_place(|| self.producer.abort_transaction(timeout));
        }
        Err(halt(ErrorCode::CommitFailed, format!("{what}: {e}")))
    }

    /// On a halt: aborts the open transaction (best effort; a restarted worker with the same transactional id
    /// fences it anyway). Without transactions, records already sent may still be delivered — they are
    /// idempotent by key and reproduced after the restart.
    pub fn abort(&mut self) {
        if self.transactional {
            let started = Instant::now();
            let timeout = self.op_timeout;
            if let Err(e) = tokio::task::block_in_place(|| self.producer.abort_transaction(timeout)) {
                warn!(error = %e, took_ms = started.elapsed().as_millis() as u64, "Could not abort the transaction.");
            }
        }
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
