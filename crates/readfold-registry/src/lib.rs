//! A client of Confluent-compatible schema registries: what readfold needs
//! to write its output in the Confluent wire format (register each topic's
//! key and value schema under the TopicNameStrategy subjects
//! `<topic>-key` and `<topic>-value`) and to check framed input (look up
//! the schema of an id).
//!
//! - [`config`]: the `[schema_registry]` section.
//! - [`client`]: the HTTP(S) calls.

pub mod client;
pub mod config;

pub use client::Registry;
pub use config::RegistryConfig;

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("schema_registry: {0}")]
    Config(String),
    #[error("schema registry {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("schema registry {url}: TLS: {source}")]
    Tls {
        url: String,
        #[source]
        source: native_tls::Error,
    },
    #[error("schema registry {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("schema registry {url}: no answer within {timeout_ms} ms")]
    Timeout { url: String, timeout_ms: u64 },
    /// The registry answered with an error status.
    #[error("schema registry {url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("schema registry {url}: unexpected answer: {detail}")]
    Answer { url: String, detail: String },
}

impl Error {
    /// Whether trying again later may help: an unreachable or failing
    /// registry may come back; a refusal (4xx) or a bad setting will not.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Config(_) | Error::Tls { .. } | Error::Answer { .. } => false,
            Error::Status { status, .. } => *status >= 500 || *status == 429,
            Error::Connect { .. } | Error::Http { .. } | Error::Timeout { .. } => true,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
