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
    #[error("{0}")]
    Tracing(String),
    #[error("badge stage: {0}")]
    Badge(#[source] readfold_badge::Error),
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
    /// A server's listener: the setting that names its address.
    #[error("{setting} {addr:?}: {source}")]
    Listen {
        setting: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A server started in the background for the demo.
    #[error("the {server} could not bind its address")]
    NotBound { server: &'static str },
    #[error("replay: {0}")]
    Replay(#[from] readfold_replay::Error),
    #[error("loadgen: {0}")]
    Loadgen(#[from] readfold_loadgen::Error),
    #[error("cannot print the OpenAPI document: {0}")]
    OpenApi(#[source] serde_json::Error),
    #[error("the demo script is invalid: {}", .0.detail)]
    DemoScript(readfold_wire::validate::Rejection),
    #[error(
        "the changelogs did not show the expected cursors within {0:?}; is `readfold` able to reach the broker?"
    )]
    DemoTimeout(std::time::Duration),
    #[error("query API: {0}")]
    QueryApi(#[source] std::io::Error),
}

impl From<rdkafka::error::KafkaError> for Error {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        Error::Kafka(e.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
