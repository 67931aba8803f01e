//! Kafka client plumbing shared by the Kafka source, the Kafka sink and the tools: client configuration, topic
//! administration (`admin`) and Schema Registry registration (`registry`). The consumer is a source
//! (`source::kafka`), the producer and the commit step a sink (`sink::kafka`), Avro a codec (`codec::avro`).
//!
//! See docs/kafka.md for the guarantees and the settings.

pub mod admin;
pub mod registry;

use rdkafka::ClientConfig;

use crate::config::KafkaSettings;

/// Client settings shared by the consumer, the producer and the admin client: bootstrap servers, then the
/// `kafka.common` passthrough, then the role's own map.
pub fn client_config(k: &KafkaSettings, role: &std::collections::BTreeMap<String, String>) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &k.bootstrap_servers);
    // Quiet librdkafka's own logging of connection churn; errors still arrive through the error callback.
    c.set("log.connection.close", "false");
    for (key, value) in k.common.iter().chain(role.iter()) {
        c.set(key, value);
    }
    c
}
