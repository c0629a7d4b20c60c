//! Kafka adapters around the fold: topic layout, the changelog and
//! dead-letter record builders, state restore, and client configuration.

pub mod admin;
pub mod input;
pub mod records;
pub mod restore;

use rdkafka::ClientConfig;

use crate::config::Config;

/// The settings every client shares: brokers and the passthrough properties.
pub fn base_client_config(config: &Config) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    for (key, value) in &config.kafka.properties {
        client.set(key, value);
    }
    client
}

/// Header names on dead-letter records.
pub mod headers {
    pub const REASON: &str = "readfold.reason";
    pub const DETAIL: &str = "readfold.detail";
    pub const SOURCE_TOPIC: &str = "readfold.source.topic";
    pub const SOURCE_PARTITION: &str = "readfold.source.partition";
    pub const SOURCE_OFFSET: &str = "readfold.source.offset";
    /// Present when a dead letter's key or value was cut: original sizes.
    pub const TRUNCATED: &str = "readfold.truncated";
}
