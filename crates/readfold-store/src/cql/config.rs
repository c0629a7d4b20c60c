//! The `[cql]` section; defaults and documentation are in
//! `config/default.toml`.

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CqlConfig {
    pub enabled: bool,
    /// Comma-separated `host:port` list (a string, so that one environment
    /// variable can override it).
    pub contact_points: String,
    /// Created if missing; letters, digits and `_`, at most 48.
    pub keyspace: String,
    /// CQL map literal for `CREATE KEYSPACE ... WITH replication = ...`; only
    /// used when the keyspace does not exist yet.
    pub replication: String,
    /// Batches in flight at once.
    pub concurrency: usize,
    /// Rows per batch (each batch holds one conversation).
    pub max_batch_rows: usize,
    /// Connection and per-request timeout.
    pub timeout_ms: u64,
}

impl CqlConfig {
    /// The contact points, trimmed, empty entries dropped.
    pub fn contact_points(&self) -> Vec<String> {
        self.contact_points
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    pub fn check(&self) -> Result<(), String> {
        let bad = |msg: String| Err(msg);
        if self.contact_points().is_empty() {
            return bad("cql.contact_points must name at least one host".into());
        }
        if !valid_keyspace(&self.keyspace) {
            return bad(format!(
                "cql.keyspace {:?} must be 1 to 48 letters, digits or underscores",
                self.keyspace
            ));
        }
        if self.concurrency == 0 || self.max_batch_rows == 0 || self.timeout_ms == 0 {
            return bad("cql.concurrency, cql.max_batch_rows and cql.timeout_ms must be positive".into());
        }
        Ok(())
    }
}

/// Unquoted CQL keyspace names: `[A-Za-z0-9_]{1,48}`. The name is spliced into
/// statements, so nothing else is accepted.
fn valid_keyspace(name: &str) -> bool {
    (1..=48).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The `[cql]` defaults of `config/default.toml`.
    pub(crate) fn default_cql() -> CqlConfig {
        let defaults: toml::Table = include_str!("../../../../config/default.toml").parse().unwrap();
        defaults["cql"].clone().try_into().unwrap()
    }

    #[test]
    fn config_checks() {
        let config = default_cql();
        config.check().unwrap();
        assert_eq!(config.contact_points(), ["127.0.0.1:9042"]);
        let multi = CqlConfig {
            contact_points: " a:9042, ,b:9042 ".into(),
            ..default_cql()
        };
        assert_eq!(multi.contact_points(), ["a:9042", "b:9042"]);
        for keyspace in ["", "a-b", "x; DROP KEYSPACE y", &"k".repeat(49)] {
            let config = CqlConfig {
                keyspace: keyspace.into(),
                ..default_cql()
            };
            assert!(config.check().is_err(), "{keyspace:?}");
        }
        let zero = CqlConfig {
            concurrency: 0,
            ..default_cql()
        };
        assert!(zero.check().is_err());
    }
}
