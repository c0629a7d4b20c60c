//! readfold's cursor stores outside Kafka. Each store has a write half that
//! max-merges a flush's batches, so that a replay or a racing writer never
//! lowers a stored cursor, and a read half that returns a conversation in
//! the core's read model.
//!
//! - [`redis`]: hot cursors, one hash per conversation, a Lua max-merge.
//! - [`cql`]: durable snapshots in ScyllaDB or Cassandra, max-wins through
//!   write timestamps.

use std::future::Future;

use readfold_core::flush::{ConversationBatch, UserBatch};
use readfold_core::{ConversationId, ConversationView};

pub mod cql;
pub mod error;
pub mod mentions;
pub mod redis;

pub use error::{Error, Result};

/// Connects a store, retrying with backoff while the error is retriable: a
/// process without its stores cannot flush or answer anyway, and exiting
/// would only churn restarts. Configuration errors fail at once.
pub async fn connect_with_retry<T, F, Fut>(store: &'static str, connect: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut failures = 0;
    loop {
        match connect().await {
            Err(e) if e.is_retriable() => {
                failures += 1;
                let delay = readfold_core::backoff::delay(failures);
                tracing::warn!(sink = store, error = %e, retry_in_ms = delay.as_millis() as u64, "sink unreachable at start; retrying");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// How a secret shows in `Debug` output: whether it is set, never what.
pub(crate) fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "***"
    }
}

/// A store of cursors: what the processor writes and readers read.
pub trait CursorStore {
    /// The store's name in metrics and logs.
    const NAME: &'static str;

    /// Max-merges one flush, one conversation per batch. Returns how many
    /// values were raised or rows written.
    fn write(&self, batches: &[ConversationBatch]) -> impl Future<Output = Result<u64>> + Send;

    /// Max-merges one flush's private state (private cursors, unread marks),
    /// one user per batch. Returns how many values were raised or written.
    fn write_private(&self, batches: &[UserBatch]) -> impl Future<Output = Result<u64>> + Send;

    /// The calls (script calls, statements) a write of these batches sends,
    /// for metrics: by default, one per conversation and per user.
    fn calls(&self, batches: &[ConversationBatch], private: &[UserBatch]) -> usize {
        batches.len() + private.len()
    }

    /// One conversation as readers see it; `None` when the store holds
    /// nothing of it.
    fn read(
        &self,
        conversation: &ConversationId,
    ) -> impl Future<Output = Result<Option<ConversationView>>> + Send;

    /// One cheap round trip to the server: whether it answers now (for
    /// readiness checks).
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;
}
