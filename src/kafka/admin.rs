//! Topic creation through the admin API (`kafka.create_topics`): the input topics named literally (not regexes)
//! and the three output topics. Existing topics are left as they are.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use tracing::{info, warn};

use super::client_config;
use crate::backoff::Backoff;
use crate::config::KafkaSettings;
use crate::error::ErrorCode;
use crate::error::RunError;
use crate::telemetry::metrics::metrics;

/// The topics `kafka.create_topics` creates.
pub fn wanted_topics(k: &KafkaSettings) -> Vec<&str> {
    let mut topics: Vec<&str> = k.topics.iter().filter(|t| !t.starts_with('^')).map(String::as_str).collect();
    topics.extend([k.variables_topic.as_str(), k.kg_topic.as_str(), k.dlq_topic.as_str()]);
    topics
}

/// Creates the missing topics, retrying while the cluster is unreachable (up to `kafka.halt_after_ms`).
pub async fn ensure_topics(k: &KafkaSettings) -> Result<(), RunError> {
    let admin: AdminClient<DefaultClientContext> =
        client_config(k, &k.common).create().map_err(|e| RunError::Config(format!("kafka admin client: {e}")))?;
    let topics = wanted_topics(k);
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, k.create_partitions, TopicReplication::Fixed(k.replication_factor)))
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(10)))
        .request_timeout(Some(Duration::from_secs(10)));
    let mut backoff = Backoff::kafka(k);
    loop {
        match admin.create_topics(&new, &opts).await {
            Ok(results) => {
                let mut retry = false;
                for r in results {
                    match r {
                        Ok(topic) => info!(topic = %topic, "Created topic."),
                        Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((topic, code)) if is_transient(code) => {
                            warn!(topic = %topic, error = %code, "Topic creation failed; retrying.");
                            retry = true;
                        }
                        Err((topic, code)) => {
                            return Err(RunError::Config(format!("kafka: cannot create topic {topic}: {code}")));
                        }
                    }
                }
                if !retry {
                    return Ok(());
                }
            }
            Err(e) => warn!(error = %e, "Kafka admin request failed; retrying."),
        }
        metrics().retries.with_label_values(&["admin"]).inc();
        match backoff.failed() {
            Some(delay) => tokio::time::sleep(delay).await,
            None => {
                return Err(RunError::halt(
                    ErrorCode::KafkaUnavailable,
                    format!("could not create topics within {} ms", k.halt_after_ms),
                ));
            }
        }
    }
}

fn is_transient(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::NotController
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NetworkException
    )
}
