//! `readfold replay`: read state as of any point in time, for analysts.
//!
//! Replay reads the input topics (read reports and conversation events)
//! from their beginning with a consumer of its own (assigned partitions, no
//! group membership, nothing committed, no sinks), folds them with the core
//! fold in one deterministic order, and writes one table.
//!
//! - [`range`]: where a replay stops (a record time, or offsets).
//! - [`order`]: the deterministic merge of every input partition.
//! - [`latency`]: per-message read latency, with bounded memory.
//! - [`replayer`]: the fold plus what analysts ask of it; pure.
//! - [`table`]: the three tables' columns and rows.
//! - [`output`]: JSON lines, CSV and Parquet writers.
//! - [`source`]: the Kafka side: partitions, their ends, one queue each.
//! - [`prefetch`]: reading and decoding on a thread of their own.
//! - progress (crate `readfold-progress`): a bar on a terminal, log lines elsewhere.

pub mod error;
pub mod latency;
pub mod order;
pub mod output;
pub mod prefetch;
pub mod range;
pub mod replayer;
pub mod run;
pub mod source;
pub mod table;
#[cfg(test)]
mod test_inputs;

pub use error::{Error, Result};
pub use output::Format;
pub use range::{parse_time, OffsetBound};
pub use readfold_progress::ProgressMode;
pub use run::{replay, ReplayOptions, Summary};
pub use table::TableKind;
