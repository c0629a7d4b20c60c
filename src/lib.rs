//! readfold: folds chat read reports into monotonic read cursors.
//!
//! The [`fold`] is pure; [`codec`] and [`validate`] turn bytes into its inputs;
//! the Kafka adapters in [`kafka`] and the [`processor`] move bytes around it.

pub mod bench;
pub mod codec;
pub mod config;
pub mod demo;
pub mod domain;
pub mod error;
pub mod fold;
pub mod kafka;
pub mod partitioner;
pub mod processor;
pub mod sinks;
pub mod tail;
pub mod telemetry;
pub mod validate;
