//! librdkafka's callbacks, into readfold's logs: its log lines and its
//! client errors go to `tracing` (rust-rdkafka's default sends them to the
//! `log` crate, which readfold does not print).
//!
//! librdkafka treats every connection failure as passing: a broker that
//! rejects the credentials, or a TLS handshake that fails, is retried for
//! ever, and the caller only ever sees a timeout. [`CheckedContext`] keeps
//! the first such error, so that start-up can stop at once and say why.

use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Sends a librdkafka log line to `tracing`.
pub fn log_line(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", facility, "{message}")
        }
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", facility, "{message}")
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
    }
}

/// Logs a client error: a warning, except the end-of-partition notices
/// that readers which ask for them (`enable.partition.eof`) get as errors.
pub fn log_error(error: &KafkaError, reason: &str) {
    if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) {
        tracing::trace!(target: "librdkafka", %error, "{reason}");
    } else {
        tracing::warn!(target: "librdkafka", %error, "{reason}");
    }
}

/// Whether a client error will not pass by retrying: the broker rejected
/// the credentials, or TLS failed (wrong CA, wrong host, plaintext port).
pub fn is_setup_error(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SSL
                | RDKafkaErrorCode::SaslAuthenticationFailed
        )
    )
}

/// A client context that logs through `tracing` and remembers the first
/// setup error (see [`is_setup_error`]).
#[derive(Clone, Default)]
pub struct CheckedContext {
    setup_error: Arc<Mutex<Option<String>>>,
}

impl CheckedContext {
    /// The first setup error seen, as librdkafka described it (it names
    /// the mechanism and the broker, never the password).
    pub fn setup_error(&self) -> Option<String> {
        self.setup_error.lock().expect("setup error lock").clone()
    }
}

impl ClientContext for CheckedContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log_line(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if is_setup_error(&error) {
            let mut first = self.setup_error.lock().expect("setup error lock");
            first.get_or_insert_with(|| reason.to_owned());
        }
        log_error(&error, reason);
    }
}

/// A client context that only logs through `tracing`.
#[derive(Clone, Copy, Default)]
pub struct LogContext;

impl ClientContext for LogContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        log_line(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        log_error(&error, reason);
    }
}

impl rdkafka::consumer::ConsumerContext for LogContext {}

/// For the transactional producer: a failed delivery fails the
/// transaction's commit, which reports it; here it is only logged.
impl rdkafka::producer::ProducerContext for LogContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::producer::DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            tracing::debug!(target: "librdkafka", %error, "delivery failed");
        }
    }
}

/// For the reachability probe, a producer that never sends.
impl rdkafka::producer::ProducerContext for CheckedContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}
