//! The `[redis]` section; defaults and documentation are in
//! `config/default.toml`.

use serde::Deserialize;

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    pub enabled: bool,
    /// `redis://[user:password@]host:port/db`, or `rediss://` for TLS.
    pub url: String,
    /// ACL user and password; when set, they win over the URL's.
    pub username: String,
    pub password: String,
    /// PEM file of the CAs that sign the server's certificate (`rediss://`);
    /// empty: the system's.
    pub tls_ca_file: String,
    /// First part of every key.
    pub key_prefix: String,
    /// Connect and response timeout of one call.
    pub timeout_ms: u64,
    /// Conversations one merge script call takes, at most; 1 keeps every
    /// call within one Redis Cluster slot.
    pub conversations_per_call: usize,
}

/// Never prints the password, in the URL or apart.
impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("enabled", &self.enabled)
            .field("url", &self.url_for_logs())
            .field("username", &self.username)
            .field("password", &crate::redacted(&self.password))
            .field("tls_ca_file", &self.tls_ca_file)
            .field("key_prefix", &self.key_prefix)
            .field("timeout_ms", &self.timeout_ms)
            .field("conversations_per_call", &self.conversations_per_call)
            .finish()
    }
}

/// Beyond this, a call only holds Redis longer: the gain from sharing one
/// call's overhead ends at a few dozen conversations. (A call's arguments
/// are bounded too, which alone keeps it under 683 conversations.)
pub const MAX_CONVERSATIONS_PER_CALL: usize = 512;

impl RedisConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.key_prefix.is_empty() {
            return Err("redis.key_prefix must not be empty".into());
        }
        if self.timeout_ms == 0 {
            return Err("redis.timeout_ms must be positive".into());
        }
        if !(1..=MAX_CONVERSATIONS_PER_CALL).contains(&self.conversations_per_call) {
            return Err(format!(
                "redis.conversations_per_call must be 1 to {MAX_CONVERSATIONS_PER_CALL}, not {}",
                self.conversations_per_call
            ));
        }
        if !self.tls_ca_file.is_empty() && !self.url.starts_with("rediss://") {
            return Err("redis.tls_ca_file is set but redis.url is not rediss:// (TLS)".into());
        }
        Ok(())
    }

    /// The URL with any password in it replaced by `***`, for logs.
    pub fn url_for_logs(&self) -> String {
        redact_url(&self.url)
    }
}

/// `scheme://user:secret@host` -> `scheme://user:***@host`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            // A bare `user@` in redis URLs is a password (AUTH <password>).
            format!("{scheme}://{hidden}@{host}{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(redact_url("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(redact_url("rediss://rf:s3cret@h:1/0"), "rediss://rf:***@h:1/0");
        assert_eq!(redact_url("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(redact_url("redis://s3cret@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("redis://u:p@ss@h:1/"), "redis://u:***@h:1/");
        let config = RedisConfig {
            enabled: true,
            url: "rediss://rf:s3cret@h:1/".into(),
            username: "rf".into(),
            password: "t0psecret".into(),
            tls_ca_file: String::new(),
            key_prefix: "p".into(),
            timeout_ms: 1,
            conversations_per_call: 1,
        };
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("t0psecret"),
            "{debug}"
        );
    }
}
