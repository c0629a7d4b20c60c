//! The processor's own sections (`[flush]`, `[snapshot]`, `[shutdown]`) and
//! the settings it runs with; defaults and documentation are in
//! `config/default.toml`.

use std::time::Duration;

use readfold_kafka::{KafkaConfig, TopicsConfig};
use readfold_registry::RegistryConfig;
use readfold_store::cql::CqlConfig;
use readfold_store::redis::RedisConfig;
use readfold_wire::Limits;
use serde::Deserialize;

/// `[flush]`: when changed cursors are published.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlushConfig {
    pub interval_ms: u64,
    pub linger_ms: u64,
    pub min_interval_ms: u64,
    pub catch_up_interval_ms: u64,
    pub catch_up_max_interval_ms: u64,
    pub max_dirty: usize,
}

/// `[snapshot]`: how often changed cursors go to CQL.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    pub interval_ms: u64,
}

impl SnapshotConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.interval_ms == 0 {
            return Err("snapshot.interval_ms must be positive".into());
        }
        Ok(())
    }
}

/// `[state]`: local state checkpoints.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    pub dir: String,
    pub max_checkpoint_age_ms: u64,
    /// How long after a restart from checkpoints the check of their every
    /// page starts (pages a record reads are checked anyway).
    pub check_pages_after_ms: u64,
    /// Follow the changelogs of the partitions not owned (a warm standby).
    pub standby: bool,
}

/// `[shutdown]`: the bound on a graceful stop.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownConfig {
    pub timeout_ms: u64,
}

impl FlushConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.interval_ms == 0 || self.max_dirty == 0 {
            return Err("flush.interval_ms and flush.max_dirty must be positive".into());
        }
        Ok(())
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    pub fn linger(&self) -> Duration {
        Duration::from_millis(self.linger_ms)
    }

    pub fn min_interval(&self) -> Duration {
        Duration::from_millis(self.min_interval_ms)
    }

    pub fn catch_up_interval(&self) -> Duration {
        Duration::from_millis(self.catch_up_interval_ms)
    }

    pub fn catch_up_max_interval(&self) -> Duration {
        Duration::from_millis(self.catch_up_max_interval_ms)
    }
}

/// Everything one processor needs, section by section.
#[derive(Clone, Debug)]
pub struct Settings {
    pub kafka: KafkaConfig,
    pub topics: TopicsConfig,
    pub input: Limits,
    pub flush: FlushConfig,
    pub snapshot: SnapshotConfig,
    pub redis: RedisConfig,
    pub cql: CqlConfig,
    pub schema_registry: RegistryConfig,
    pub state: StateConfig,
    pub tracing: readfold_trace::TraceConfig,
}
