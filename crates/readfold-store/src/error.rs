//! Errors of the cursor stores, and which of them are worth retrying.

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot work; nothing to retry.
    #[error("configuration: {0}")]
    Config(String),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    // The driver's errors are large; boxed, they keep every Result small.
    #[error("cql: cannot connect: {0}")]
    CqlConnect(#[source] Box<scylla::errors::NewSessionError>),
    #[error("cql: {0}")]
    CqlExecute(#[source] Box<scylla::errors::ExecutionError>),
    #[error("cql: cannot prepare a statement: {0}")]
    CqlPrepare(#[source] Box<scylla::errors::PrepareError>),
    #[error("cql: schema agreement: {0}")]
    CqlSchemaAgreement(#[source] Box<scylla::errors::SchemaAgreementError>),
    #[error("cql: schema metadata: {0}")]
    CqlMetadata(#[source] Box<scylla::errors::MetadataError>),
    /// A result did not have the rows or types readfold wrote.
    #[error("cql: unexpected result: {0}")]
    CqlResult(#[source] BoxError),
    /// Validation bounds seqs by `input.max_seq`, which is at most i64::MAX.
    #[error("cql: sequence number {0} is beyond what the store can order (2^40 - 1)")]
    SeqOverflow(u64),
    /// A member joined and left more often than the store can order.
    #[error("cql: membership epoch {0} is beyond what the store can order (2^23 - 1)")]
    EpochOverflow(u64),
    #[error("cql: batch task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl From<redis::ParsingError> for Error {
    fn from(e: redis::ParsingError) -> Self {
        Error::Redis(e.into())
    }
}

macro_rules! boxed_from {
    ($($source:ty => $variant:ident),* $(,)?) => {
        $(impl From<$source> for Error {
            fn from(e: $source) -> Self {
                Error::$variant(Box::new(e))
            }
        })*
    };
}

boxed_from! {
    scylla::errors::NewSessionError => CqlConnect,
    scylla::errors::ExecutionError => CqlExecute,
    scylla::errors::PrepareError => CqlPrepare,
    scylla::errors::SchemaAgreementError => CqlSchemaAgreement,
    scylla::errors::MetadataError => CqlMetadata,
}

impl Error {
    /// Whether trying again later may succeed: an unreachable, restarting
    /// or overloaded server is; a configuration or a value the store cannot
    /// hold is not.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Config(_) | Error::SeqOverflow(_) | Error::EpochOverflow(_) => false,
            Error::Redis(e) => !matches!(
                e.kind(),
                redis::ErrorKind::InvalidClientConfig
                    | redis::ErrorKind::AuthenticationFailed
                    | redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            ),
            Error::CqlConnect(e) => !cql_refused_login(e),
            Error::CqlExecute(_)
            | Error::CqlPrepare(_)
            | Error::CqlSchemaAgreement(_)
            | Error::CqlMetadata(_)
            | Error::CqlResult(_)
            | Error::Task(_) => true,
        }
    }

    pub(crate) fn cql_result(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Error::CqlResult(Box::new(e))
    }
}

/// Whether the CQL server refused the login (bad credentials, or none given
/// where it wants some): the same credentials will not do better later.
fn cql_refused_login(e: &scylla::errors::NewSessionError) -> bool {
    use scylla::errors::{
        ConnectionError, ConnectionPoolError, ConnectionSetupRequestErrorKind, DbError, MetadataError,
        NewSessionError,
    };
    let NewSessionError::MetadataError(MetadataError::ConnectionPoolError(ConnectionPoolError::Broken {
        last_connection_error: ConnectionError::ConnectionSetupRequestError(setup),
    })) = e
    else {
        return false;
    };
    matches!(
        setup.error,
        ConnectionSetupRequestErrorKind::DbError(DbError::AuthenticationError, _)
            | ConnectionSetupRequestErrorKind::MissingAuthentication
    )
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_is_final_connection_trouble_is_not() {
        assert!(!Error::Config("x".into()).is_retriable());
        assert!(!Error::SeqOverflow(u64::MAX).is_retriable());
        let io = redis::RedisError::from(std::io::Error::other("connection refused"));
        assert!(Error::Redis(io).is_retriable());
    }
}
