//! Errors of the Kafka adapters, and which of them are worth retrying.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The topics break what the fold relies on; nothing to retry.
    #[error("topic layout: {0}")]
    Topology(String),
    #[error("topic {0:?} does not exist")]
    NoSuchTopic(String),
    #[error("{topic}: did not reach the end within {within:?}")]
    Timeout { topic: String, within: Duration },
    #[error("{topic} [{partition}]: a transaction stayed open for more than {within:?}")]
    OpenTransaction {
        topic: String,
        partition: i32,
        within: Duration,
    },
    #[error("the producer dropped a delivery report")]
    DeliveryCanceled,
    /// The brokers refused the connection for good: wrong credentials,
    /// or a TLS setup that cannot work.
    #[error("kafka: cannot connect to {bootstrap}: {reason} (check kafka.properties: security.protocol, sasl.*, ssl.*)")]
    Setup { bootstrap: String, reason: String },
}

impl Error {
    /// Whether trying again later may succeed: broker, network and
    /// transaction-abort errors are; fatal or fencing errors, client
    /// configuration and topic layout are not.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Kafka(e) => {
                !is_fatal(e) && !matches!(e, KafkaError::ClientCreation(_) | KafkaError::ClientConfig(..))
            }
            Error::Topology(_) | Error::NoSuchTopic(_) | Error::Setup { .. } => false,
            Error::Timeout { .. } | Error::OpenTransaction { .. } | Error::DeliveryCanceled => true,
        }
    }
}

/// Whether librdkafka says the client (a transactional producer above all)
/// cannot go on: it was fenced by a newer incarnation, or hit a fatal error.
pub fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(inner) => inner.is_fatal(),
        _ => matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::ProducerFenced)
        ),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_and_layout_are_final_broker_trouble_is_not() {
        let fenced = Error::Kafka(KafkaError::Global(RDKafkaErrorCode::ProducerFenced));
        assert!(!fenced.is_retriable());
        let down = Error::Kafka(KafkaError::Global(RDKafkaErrorCode::AllBrokersDown));
        assert!(down.is_retriable());
        assert!(!Error::Topology("x".into()).is_retriable());
        assert!(Error::DeliveryCanceled.is_retriable());
    }
}
