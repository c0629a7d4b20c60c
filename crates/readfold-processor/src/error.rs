//! The processor's errors, and the one rule of which are retried: by the
//! flush loop (with backoff, nothing committed meanwhile) and by the
//! start-up connection loop.

use rdkafka::error::KafkaError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kafka(#[from] readfold_kafka::Error),
    #[error(transparent)]
    Store(#[from] readfold_store::Error),
    /// The transaction was aborted; the same work is retried.
    #[error("kafka transaction aborted: {0}")]
    Transaction(#[source] KafkaError),
    /// The producer was fenced by a newer incarnation or broke for good.
    #[error("kafka transaction failed fatally (fenced or broken producer), stopping: {0}")]
    FatalTransaction(#[source] KafkaError),
    /// A commit or an abort did not settle (librdkafka leaves it
    /// unfinished), so whether the flush counts is unknown: the processor
    /// starts over from what was committed, with new producers.
    #[error(
        "a kafka transaction's commit or abort did not settle, starting over from the committed state: {0}"
    )]
    UnsettledTransaction(#[source] KafkaError),
    /// The stores did not take a flush (or not in time), so its
    /// transaction was aborted; retried like the stores' own failures.
    #[error("the stores did not take the flush in time; its transaction was aborted")]
    StoresNotWritten,
    /// A flush's records stopped before their last chunk (its encoding was
    /// cut short), so its transaction was aborted rather than committed
    /// with part of them.
    #[error("the flush's records stopped before their last chunk; its transaction was aborted")]
    RecordsCutShort,
    #[error("the consumer failed fatally: {0}")]
    Consumer(#[source] KafkaError),
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Registry(#[from] readfold_registry::Error),
    #[error("{0}")]
    Tracing(String),
}

impl From<KafkaError> for Error {
    fn from(e: KafkaError) -> Self {
        Error::Kafka(e.into())
    }
}

impl Error {
    /// Whether the broker refused a transaction's offsets because the group
    /// moved on since the flush took its group metadata (under the consumer
    /// protocol every assignment change bumps the member epoch): tried
    /// again at once with the current metadata.
    pub fn is_stale_group_member(&self) -> bool {
        use rdkafka::types::RDKafkaErrorCode as Code;
        matches!(self, Error::Transaction(e) if matches!(
            e.rdkafka_error_code(),
            Some(Code::IllegalGeneration | Code::StaleMemberEpoch | Code::UnknownMemberId | Code::RebalanceInProgress)
        ))
    }

    /// Whether the operation may succeed later without anyone stepping in.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Kafka(e) => e.is_retriable(),
            Error::Store(e) => e.is_retriable(),
            Error::Transaction(_) | Error::StoresNotWritten | Error::RecordsCutShort => true,
            Error::Registry(e) => e.is_retriable(),
            Error::FatalTransaction(_)
            | Error::UnsettledTransaction(_)
            | Error::Consumer(_)
            | Error::Task(_)
            | Error::Tracing(_) => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn aborted_transactions_and_unreachable_stores_are_retried_fencing_is_not() {
        let aborted = Error::Transaction(KafkaError::Global(RDKafkaErrorCode::RequestTimedOut));
        assert!(aborted.is_retriable());
        let fenced = Error::FatalTransaction(KafkaError::Global(RDKafkaErrorCode::ProducerFenced));
        assert!(!fenced.is_retriable());
        let store = Error::Store(readfold_store::Error::Config("bad".into()));
        assert!(!store.is_retriable());
        let broker = Error::from(KafkaError::Global(RDKafkaErrorCode::AllBrokersDown));
        assert!(broker.is_retriable());
        let fenced_in_flush = Error::from(KafkaError::Global(RDKafkaErrorCode::ProducerFenced));
        assert!(!fenced_in_flush.is_retriable());
    }
}
