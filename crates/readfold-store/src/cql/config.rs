//! The `[cql]` section; defaults and documentation are in
//! `config/default.toml`.

#[derive(Clone, serde::Deserialize)]
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
    /// Rows per batch.
    pub max_batch_rows: usize,
    /// Small conversations (partitions) one batch may hold, when they have
    /// the same replicas; 1: a batch holds one conversation.
    pub partitions_per_batch: usize,
    /// Connection and per-request timeout.
    pub timeout_ms: u64,
    /// PasswordAuthenticator credentials; empty username: no login.
    pub username: String,
    pub password: String,
    /// Connect over TLS, checking the server's certificate.
    pub tls: bool,
    /// PEM file of the CAs that sign the servers' certificates; empty: the
    /// system's.
    pub tls_ca_file: String,
}

/// Never prints the password.
impl std::fmt::Debug for CqlConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqlConfig")
            .field("enabled", &self.enabled)
            .field("contact_points", &self.contact_points)
            .field("keyspace", &self.keyspace)
            .field("replication", &self.replication)
            .field("concurrency", &self.concurrency)
            .field("max_batch_rows", &self.max_batch_rows)
            .field("partitions_per_batch", &self.partitions_per_batch)
            .field("timeout_ms", &self.timeout_ms)
            .field("username", &self.username)
            .field("password", &crate::redacted(&self.password))
            .field("tls", &self.tls)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
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

    /// The configured half of the name of the store written to, for local
    /// checkpoints ("the CQL store that held this state"): the contact
    /// points, sorted, and the keyspace; `CqlStore::store_name` adds the
    /// tables' ids. Listing the same cluster's nodes otherwise gives another
    /// name, which only costs a restart one full snapshot.
    pub fn store_name(&self) -> String {
        let mut points = self.contact_points();
        points.sort();
        format!("{}/{}", points.join(","), self.keyspace)
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
        if !(1..=MAX_PARTITIONS_PER_BATCH).contains(&self.partitions_per_batch) {
            return bad(format!(
                "cql.partitions_per_batch must be 1 to {MAX_PARTITIONS_PER_BATCH} (got {})",
                self.partitions_per_batch
            ));
        }
        if !self.tls_ca_file.is_empty() && !self.tls {
            return bad("cql.tls_ca_file is set but cql.tls is false".into());
        }
        if self.username.is_empty() != self.password.is_empty() {
            return bad("cql.username and cql.password go together: set both or neither".into());
        }
        Ok(())
    }
}

/// The most partitions one batch may span: beyond Cassandra's default
/// warning threshold (10) tenfold, for servers set up with a higher one.
const MAX_PARTITIONS_PER_BATCH: usize = 100;

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
        let reordered = CqlConfig {
            contact_points: "b:9042,a:9042".into(),
            ..multi.clone()
        };
        assert_eq!(reordered.store_name(), "a:9042,b:9042/readfold");
        assert_eq!(reordered.store_name(), multi.store_name());
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
        for partitions in [0, 101] {
            let config = CqlConfig {
                partitions_per_batch: partitions,
                ..default_cql()
            };
            let err = config.check().unwrap_err();
            assert!(err.contains("partitions_per_batch"), "{err}");
        }
    }
}
