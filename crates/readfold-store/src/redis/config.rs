//! The `[redis]` section; defaults and documentation are in
//! `config/default.toml`.

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    pub enabled: bool,
    /// `redis://[user:password@]host:port/db`, or `rediss://` for TLS.
    pub url: String,
    /// First part of every key.
    pub key_prefix: String,
    /// Connect and response timeout of one call.
    pub timeout_ms: u64,
}

impl RedisConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.key_prefix.is_empty() {
            return Err("redis.key_prefix must not be empty".into());
        }
        if self.timeout_ms == 0 {
            return Err("redis.timeout_ms must be positive".into());
        }
        Ok(())
    }
}
