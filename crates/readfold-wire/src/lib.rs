//! readfold's wire contract, pure: no I/O.
//!
//! - [`codec`]: Avro encode/decode of the compiled-in `schemas/`.
//! - [`validate`]: input bytes to a fold input, or a dead-letter reason.
//! - [`changelog`]: the changelog records a flush produces, and the one
//!   changelog decoder every reader uses.
//! - [`checkpoint`]: the local state checkpoint of a partition.
//! - [`dead_letter`]: the dead-letter record of a rejected input.
//! - [`confluent`]: the output in the Confluent wire format, for consumers
//!   that use a schema registry.
//! - [`describe`]: any topic's records as JSON.

pub mod badge;
pub mod changelog;
pub mod checkpoint;
pub mod codec;
pub mod confluent;
pub mod dead_letter;
pub mod describe;
pub mod validate;

/// The record header that carries a W3C trace context (topology.md,
/// "Trace context"), on the read reports and the changelogs.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// The same, as librdkafka's header lookups take it.
pub const TRACEPARENT_HEADER_C: &std::ffi::CStr = c"traceparent";

pub use changelog::{ChangelogEntry, ChangelogKind, OutRecord, OutputLayout, OutputTopics, OwnUpdate};
pub use validate::{Limits, RejectReason, Rejection};
