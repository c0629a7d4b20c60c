//! `readfold loadgen`: a realistic chat workload for the input topics, from
//! a seed, at a constant offered rate, so that every throughput and latency
//! figure can be repeated.
//!
//! - [`workload`]: the pure generator (no I/O): conversations with Zipf
//!   sizes, sends, delayed reads, duplicates, stale reports, joins, leaves.
//! - [`zipf`]: the size distribution.
//! - [`run`]: the adapter that produces the records at a constant rate.

pub mod random;
pub mod run;
pub mod workload;
pub mod zipf;

pub use run::{run, LoadgenOptions, LoadgenSummary};
pub use workload::{Generated, Workload, WorkloadSpec};

/// Why a load run stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid workload: {0}")]
    Spec(String),
    #[error(transparent)]
    Kafka(#[from] readfold_kafka::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
