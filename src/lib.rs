//! The `readfold` command line, assembled from the workspace's crates:
//! `readfold-core` (the pure fold and read model), `readfold-wire` (the
//! Avro contract), `readfold-kafka` and `readfold-store` (adapters) and
//! `readfold-processor`. This crate holds what only the application needs:
//! the whole configuration and the commands.

pub mod badges;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod gateway;
pub mod loadgen;
pub mod ops;
pub mod replay;
pub mod run;
pub mod serve;
pub mod tail;
