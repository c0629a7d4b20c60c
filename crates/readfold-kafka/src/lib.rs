//! readfold's Kafka adapters, around the pure core and wire crates:
//!
//! - [`config`]: the `[kafka]` and `[topics]` sections, client settings.
//! - [`context`]: librdkafka's logs and errors into `tracing`; start-up
//!   errors that retrying will not cure.
//! - [`admin`]: topic creation and the layout checks the fold relies on.
//! - [`producer`]: a producer of the inputs, placed as readfold expects.
//! - [`batch_producer`]: many records to one topic in one librdkafka call.
//! - [`brokers`]: waiting for a client's first broker connection.
//! - [`reader`]: committed-record readers (tail, changelogs).
//! - [`queue_batch`]: a librdkafka queue, read a batch at a time.
//! - [`partition_queue`]: one partition's queue, read that way.
//! - [`routed_queue`]: a group member's fetched messages, routed to one
//!   queue and read that way.
//! - [`changelog`]: the changelog reader: restore, read, follow.
//! - [`standby`]: a warm standby: the changelogs of partitions this
//!   instance does not own, followed, so that a takeover reads tails only.

pub mod admin;
pub mod batch_producer;
pub mod brokers;
pub mod changelog;
pub mod config;
pub mod context;
pub mod error;
pub mod partition_queue;
pub mod producer;
pub mod queue_batch;
pub mod reader;
pub mod routed_queue;
pub mod standby;

pub use config::{GroupProtocol, KafkaConfig, TopicsConfig};
pub use error::{is_fatal, Error, Result};

/// The (topic, partition)s a rebalance callback names, owned, for a run
/// loop to apply after the poll.
pub fn partitions_of(tpl: &rdkafka::TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

/// Milliseconds since the Unix epoch, as readfold stamps the records it
/// writes (record times, `updated_at`, report and event times).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
