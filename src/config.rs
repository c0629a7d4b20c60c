//! Configuration: `config/default.toml` (compiled in), an optional file over
//! it, then `READFOLD__SECTION__KEY` environment variables over both.

use std::path::Path;

use readfold_badge::BadgeConfig;
use readfold_gateway::GatewayConfig;
use readfold_kafka::{KafkaConfig, TopicsConfig};
use readfold_processor::{FlushConfig, Settings, ShutdownConfig, SnapshotConfig, StateConfig};
use readfold_registry::RegistryConfig;
use readfold_serve::{AuthConfig, ServeConfig};
use readfold_store::cql::CqlConfig;
use readfold_store::redis::RedisConfig;
use readfold_wire::Limits;
use serde::Deserialize;
use toml::{Table, Value};

/// The defaults, and the list of every key there is.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of the environment variables that override keys.
pub const ENV_PREFIX: &str = "READFOLD__";

/// Why a configuration cannot be used. Messages name the key, the file or
/// the environment variable, and never echo a value that may be a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {source}")]
    Parse {
        origin: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("unknown key `{key}` in {origin}")]
    UnknownKey { key: String, origin: String },
    #[error("`{key}` in {origin} must be a table")]
    NotATable { key: String, origin: String },
    #[error("unknown key from environment variable {0}")]
    UnknownEnv(String),
    #[error("{name}={raw:?} is not a valid {expected}")]
    BadEnv {
        name: String,
        raw: String,
        expected: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub topics: TopicsConfig,
    pub input: Limits,
    pub flush: FlushConfig,
    pub redis: RedisConfig,
    pub cql: CqlConfig,
    pub snapshot: SnapshotConfig,
    pub serve: ServeConfig,
    pub auth: AuthConfig,
    pub gateway: GatewayConfig,
    pub badge: BadgeConfig,
    pub schema_registry: RegistryConfig,
    pub state: StateConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub tracing: readfold_trace::TraceConfig,
    pub shutdown: ShutdownConfig,
}

/// How log lines are written (to stderr).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event, colored on a terminal.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: String,
}

impl Config {
    /// Defaults, then `file` if given, then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let overlay = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                Some((path.display().to_string(), text))
            }
            None => None,
        };
        Self::from_sources(
            overlay.as_ref().map(|(n, t)| (n.as_str(), t.as_str())),
            std::env::vars(),
        )
    }

    /// Pure form of [`Config::load`]: an optional (name, text) file and the
    /// environment as pairs.
    pub fn from_sources(
        file: Option<(&str, &str)>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut merged: Table = DEFAULT_TOML.parse().map_err(|source| ConfigError::Parse {
            origin: "built-in defaults".into(),
            source,
        })?;
        let defaults = merged.clone();
        if let Some((name, text)) = file {
            let table: Table = text.parse().map_err(|source| ConfigError::Parse {
                origin: name.to_owned(),
                source,
            })?;
            check_known(&table, &defaults, "", name)?;
            merge(&mut merged, table);
        }
        let mut env: Vec<_> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        env.sort();
        for (name, raw) in env {
            apply_env(&mut merged, &defaults, &name, &raw)?;
        }
        let config: Config = Value::Table(merged)
            .try_into()
            .map_err(|source| ConfigError::Parse {
                origin: "the configuration".into(),
                source,
            })?;
        config.check()?;
        Ok(config)
    }

    /// The built-in defaults alone (`config/default.toml`).
    pub fn defaults() -> Config {
        Self::from_sources(None, Vec::new()).expect("config/default.toml is valid (tested)")
    }

    /// Every section's own checks.
    fn check(&self) -> Result<(), ConfigError> {
        self.kafka.check().map_err(ConfigError::Invalid)?;
        self.topics.check().map_err(ConfigError::Invalid)?;
        self.input.check().map_err(ConfigError::Invalid)?;
        self.flush.check().map_err(ConfigError::Invalid)?;
        self.snapshot.check().map_err(ConfigError::Invalid)?;
        self.redis.check().map_err(ConfigError::Invalid)?;
        self.cql.check().map_err(ConfigError::Invalid)?;
        self.serve.check().map_err(ConfigError::Invalid)?;
        self.auth.check().map_err(ConfigError::Invalid)?;
        self.tracing.check().map_err(ConfigError::Invalid)?;
        self.badge.check().map_err(ConfigError::Invalid)?;
        self.schema_registry.check().map_err(ConfigError::Invalid)?;
        if self.cql.enabled && self.input.max_seq > readfold_store::cql::write::MAX_CURSOR {
            return Err(ConfigError::Invalid(format!(
                "input.max_seq {} is above {}, the highest cursor the CQL store can order \
                 (see topology.md); lower it or set cql.enabled = false",
                self.input.max_seq,
                readfold_store::cql::write::MAX_CURSOR
            )));
        }
        Ok(())
    }

    /// What a processor runs with.
    pub fn processor_settings(&self) -> Settings {
        Settings {
            kafka: self.kafka.clone(),
            topics: self.topics.clone(),
            input: self.input.clone(),
            flush: self.flush.clone(),
            snapshot: self.snapshot.clone(),
            redis: self.redis.clone(),
            cql: self.cql.clone(),
            schema_registry: self.schema_registry.clone(),
            state: self.state.clone(),
            tracing: self.tracing.clone(),
        }
    }
}

/// The free-form table whose keys are not checked.
const PASSTHROUGH: &str = "kafka.properties";

fn check_known(table: &Table, defaults: &Table, path: &str, source: &str) -> Result<(), ConfigError> {
    for (key, value) in table {
        let full = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match defaults.get(key) {
            None => {
                return Err(ConfigError::UnknownKey {
                    key: full,
                    origin: source.to_owned(),
                })
            }
            Some(Value::Table(inner)) if full != PASSTHROUGH => match value {
                Value::Table(given) => check_known(given, inner, &full, source)?,
                _ => {
                    return Err(ConfigError::NotATable {
                        key: full,
                        origin: source.to_owned(),
                    })
                }
            },
            Some(_) => {}
        }
    }
    Ok(())
}

fn merge(base: &mut Table, overlay: Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn apply_env(merged: &mut Table, defaults: &Table, name: &str, raw: &str) -> Result<(), ConfigError> {
    let unknown = || ConfigError::UnknownEnv(name.to_owned());
    let parts: Vec<String> = name[ENV_PREFIX.len()..]
        .split("__")
        .map(str::to_ascii_lowercase)
        .collect();
    match parts.as_slice() {
        [section, table, prop] if format!("{section}.{table}") == PASSTHROUGH => {
            let key = prop.replace('_', ".");
            let props = merged
                .get_mut(section.as_str())
                .and_then(|s| s.as_table_mut())
                .and_then(|s| s.get_mut(table.as_str()))
                .and_then(|t| t.as_table_mut())
                .ok_or_else(unknown)?;
            props.insert(key, Value::String(raw.to_owned()));
            Ok(())
        }
        [section, key] => {
            let default = defaults
                .get(section.as_str())
                .and_then(|s| s.as_table())
                .and_then(|s| s.get(key.as_str()))
                .ok_or_else(unknown)?;
            let value = typed_like(default, raw).ok_or_else(|| ConfigError::BadEnv {
                name: name.to_owned(),
                raw: raw.to_owned(),
                expected: default.type_str(),
            })?;
            merged
                .get_mut(section.as_str())
                .and_then(|s| s.as_table_mut())
                .ok_or_else(unknown)?
                .insert(key.clone(), value);
            Ok(())
        }
        _ => Err(unknown()),
    }
}

/// Parses an environment string as the type of the key's default.
fn typed_like(default: &Value, raw: &str) -> Option<Value> {
    match default {
        Value::String(_) => Some(Value::String(raw.to_owned())),
        Value::Integer(_) => raw.trim().parse().ok().map(Value::Integer),
        Value::Boolean(_) => raw.trim().parse().ok().map(Value::Boolean),
        Value::Float(_) => raw.trim().parse().ok().map(Value::Float),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_load_and_are_consistent() {
        let c = Config::from_sources(None, env(&[])).unwrap();
        assert_eq!(c.topics.read_reports, "chat.read-reports");
        assert_eq!(c.kafka.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(c.input.format, readfold_wire::codec::WireFormat::Auto);
        assert!(c.kafka.properties.is_empty());
    }

    #[test]
    fn file_then_environment_override() {
        let file = "[flush]\ninterval_ms = 50\n[kafka.properties]\n\"security.protocol\" = \"SSL\"\n";
        let c = Config::from_sources(
            Some(("my.toml", file)),
            env(&[
                ("READFOLD__TOPICS__READ_REPORTS", "prod.reports"),
                ("READFOLD__KAFKA__BOOTSTRAP_SERVERS", "b1:9092,b2:9092"),
                ("READFOLD__TOPICS__PARTITIONS", "24"),
                ("READFOLD__INPUT__CHECK_PARTITIONING", "false"),
                ("READFOLD__KAFKA__PROPERTIES__SASL_MECHANISM", "PLAIN"),
                ("UNRELATED", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(c.flush.interval_ms, 50);
        assert_eq!(c.topics.read_reports, "prod.reports");
        assert_eq!(c.kafka.bootstrap_servers, "b1:9092,b2:9092");
        assert_eq!(c.topics.partitions, 24);
        assert!(!c.input.check_partitioning);
        assert_eq!(c.kafka.properties["security.protocol"], "SSL");
        assert_eq!(c.kafka.properties["sasl.mechanism"], "PLAIN");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::from_sources(Some(("my.toml", "[flush]\nintervl_ms = 5\n")), env(&[])).unwrap_err();
        assert!(err.to_string().contains("`flush.intervl_ms` in my.toml"), "{err}");
        let err = Config::from_sources(Some(("my.toml", "[flsh]\n")), env(&[])).unwrap_err();
        assert!(err.to_string().contains("`flsh`"), "{err}");
        let err = Config::from_sources(None, env(&[("READFOLD__FLUSH__INTERVL_MS", "5")])).unwrap_err();
        assert!(err.to_string().contains("READFOLD__FLUSH__INTERVL_MS"), "{err}");
    }

    #[test]
    fn badly_typed_values_are_errors() {
        let err = Config::from_sources(None, env(&[("READFOLD__TOPICS__PARTITIONS", "many")])).unwrap_err();
        assert!(err.to_string().contains("READFOLD__TOPICS__PARTITIONS"), "{err}");
        let err = Config::from_sources(None, env(&[("READFOLD__INPUT__FORMAT", "xml")])).unwrap_err();
        assert!(err.to_string().contains("xml"), "{err}");
        let err = Config::from_sources(None, env(&[("READFOLD__TOPICS__PARTITIONS", "0")])).unwrap_err();
        assert!(err.to_string().contains("partitions"), "{err}");
        // A zero interval would snapshot without pause.
        let err = Config::from_sources(None, env(&[("READFOLD__SNAPSHOT__INTERVAL_MS", "0")])).unwrap_err();
        assert!(err.to_string().contains("snapshot.interval_ms"), "{err}");
    }

    #[test]
    fn max_seq_must_fit_the_cql_timestamps_when_cql_is_on() {
        let big = [("READFOLD__INPUT__MAX_SEQ", "2000000000000")];
        let err = Config::from_sources(None, env(&big)).unwrap_err();
        assert!(err.to_string().contains("input.max_seq"), "{err}");
        let without_cql = [big[0], ("READFOLD__CQL__ENABLED", "false")];
        assert!(Config::from_sources(None, env(&without_cql)).is_ok());
    }

    #[test]
    fn the_shipped_default_file_sets_every_key() {
        // config/default.toml is both the documentation and the defaults:
        // loading it as a user file must change nothing and name no unknown key.
        Config::from_sources(Some(("config/default.toml", DEFAULT_TOML)), env(&[])).unwrap();
    }
}
