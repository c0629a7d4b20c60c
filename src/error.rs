//! The crate's one error type.

use crate::codec::DecodeError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("topic layout: {0}")]
    Topology(String),
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// A sink (Redis, CQL) failed; the flush is retried.
    #[error("sink: {0}")]
    Sink(String),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
