//! readfold's pure core. Nothing here performs I/O, reads a clock it was not
//! given, or knows about Kafka, Redis or CQL; the crate's dependencies keep it
//! that way.
//!
//! - [`domain`]: ids, sequence numbers, cursor keys.
//! - [`fold`]: the max-merge fold of read reports and conversation events.
//! - [`read_model`]: unread, read counts and who-read, from any store's cursors.
//! - [`recent_reads`]: a big group's recent messages' read counts, kept as cursors move.
//! - [`badge`]: each user's totals over their conversations, for the app badge.
//! - [`flush`]: what a flush publishes, planned from partition state.
//! - [`backoff`]: the retry policy of flushes and connections.
//! - [`pacing`]: how long a catch-up's next flush waits.
//! - [`schedule`]: when the processor flushes, snapshots, pauses and resumes.
//! - [`partitioner`]: Kafka's murmur2 partitioner, which places conversations.

pub mod backoff;
pub mod badge;
pub mod domain;
pub mod flush;
pub mod fold;
pub mod pacing;
pub mod partitioner;
pub mod read_model;
pub mod recent_reads;
pub mod schedule;

pub use domain::{ConversationId, CursorKey, IdError, Seq, UserId};
pub use read_model::{ConversationView, MemberCursor, MessageRef, Mute, OwnCursor};
