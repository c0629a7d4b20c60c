//! Configuration: `config/default.toml` (compiled in), an optional file over
//! it, then `READFOLD__SECTION__KEY` environment variables over both.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use toml::{Table, Value};

use crate::codec::WireFormat;
use crate::error::Error;
pub use crate::sinks::cql::CqlConfig;
use crate::validate::Limits;

/// The defaults, and the list of every key there is.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of the environment variables that override keys.
pub const ENV_PREFIX: &str = "READFOLD__";

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub topics: TopicsConfig,
    pub input: InputConfig,
    pub flush: FlushConfig,
    pub redis: RedisConfig,
    pub cql: CqlConfig,
    pub snapshot: SnapshotConfig,
    pub metrics: MetricsConfig,
    pub shutdown: ShutdownConfig,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    pub bootstrap_servers: String,
    pub group_id: String,
    pub instance_id: String,
    pub transaction_timeout_ms: u64,
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsConfig {
    pub read_reports: String,
    pub conversation_events: String,
    pub read_cursors: String,
    pub user_read_cursors: String,
    pub dlq: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub create: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputConfig {
    pub format: WireFormat,
    pub max_id_bytes: usize,
    pub max_seq: u64,
    pub check_partitioning: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlushConfig {
    pub interval_ms: u64,
    pub max_dirty: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    pub enabled: bool,
    pub url: String,
    pub key_prefix: String,
    pub timeout_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotConfig {
    pub interval_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownConfig {
    pub timeout_ms: u64,
}

impl Config {
    /// Defaults, then `file` if given, then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Config, Error> {
        let overlay = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
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
    ) -> Result<Config, Error> {
        let mut merged: Table = DEFAULT_TOML
            .parse()
            .map_err(|e| Error::Config(format!("built-in defaults: {e}")))?;
        let defaults = merged.clone();
        if let Some((name, text)) = file {
            let table: Table = text.parse().map_err(|e| Error::Config(format!("{name}: {e}")))?;
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
            .map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |msg: String| Err(Error::Config(msg));
        if self.topics.partitions < 1 {
            return bad(format!(
                "topics.partitions must be at least 1, not {}",
                self.topics.partitions
            ));
        }
        if self.topics.replication_factor < 1 {
            return bad("topics.replication_factor must be at least 1".into());
        }
        if self.flush.interval_ms == 0 || self.flush.max_dirty == 0 {
            return bad("flush.interval_ms and flush.max_dirty must be positive".into());
        }
        if self.kafka.group_id.is_empty() {
            return bad("kafka.group_id must not be empty".into());
        }
        let names = [
            &self.topics.read_reports,
            &self.topics.conversation_events,
            &self.topics.read_cursors,
            &self.topics.user_read_cursors,
            &self.topics.dlq,
        ];
        for (i, a) in names.iter().enumerate() {
            if a.is_empty() {
                return bad("topic names must not be empty".into());
            }
            if names[..i].contains(a) {
                return bad(format!("topic {a:?} is configured for two roles"));
            }
        }
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_id_bytes: self.input.max_id_bytes,
            max_seq: self.input.max_seq,
            format: self.input.format,
            check_partitioning: self.input.check_partitioning,
        }
    }

    /// `kafka.instance_id`, or the host name when empty.
    pub fn instance_id(&self) -> String {
        if !self.kafka.instance_id.is_empty() {
            return self.kafka.instance_id.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "readfold".into())
    }
}

/// The free-form table whose keys are not checked.
const PASSTHROUGH: &str = "kafka.properties";

fn check_known(table: &Table, defaults: &Table, path: &str, source: &str) -> Result<(), Error> {
    for (key, value) in table {
        let full = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match defaults.get(key) {
            None => return Err(Error::Config(format!("unknown key `{full}` in {source}"))),
            Some(Value::Table(inner)) if full != PASSTHROUGH => match value {
                Value::Table(given) => check_known(given, inner, &full, source)?,
                _ => return Err(Error::Config(format!("`{full}` in {source} must be a table"))),
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

fn apply_env(merged: &mut Table, defaults: &Table, name: &str, raw: &str) -> Result<(), Error> {
    let unknown = || Error::Config(format!("unknown key from environment variable {name}"));
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
            let value = typed_like(default, raw).ok_or_else(|| {
                Error::Config(format!("{name}={raw:?} is not a valid {}", default.type_str()))
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
        assert_eq!(c.input.format, WireFormat::Auto);
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
    }

    #[test]
    fn the_shipped_default_file_sets_every_key() {
        // config/default.toml is both the documentation and the defaults:
        // loading it as a user file must change nothing and name no unknown key.
        Config::from_sources(Some(("config/default.toml", DEFAULT_TOML)), env(&[])).unwrap();
    }
}
