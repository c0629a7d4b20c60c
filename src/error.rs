//! The command line's errors: each component's typed error, with its source.

use crate::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kafka(#[from] readfold_kafka::Error),
    #[error(transparent)]
    Store(#[from] readfold_store::Error),
    #[error(transparent)]
    Processor(#[from] readfold_processor::Error),
    #[error("auth: {0}")]
    Auth(#[from] readfold_serve::AuthError),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: String,
        #[source]
        source: metrics_exporter_prometheus::BuildError,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A demo or bench run did not see what it expected.
    #[error("{0}")]
    Run(String),
}

impl From<rdkafka::error::KafkaError> for Error {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        Error::Kafka(e.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
