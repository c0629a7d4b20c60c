//! The `[serve]` and `[auth]` sections; defaults and documentation are in
//! `config/default.toml`.

use serde::Deserialize;

/// `[serve]`: where the query API listens and how much one request may ask.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    pub listen: String,
    /// Most messages in one read-counts request, and most conversations in
    /// one unread request.
    pub max_items: usize,
    /// Who-read page size when the caller gives none, and the largest one.
    pub default_page: usize,
    pub max_page: usize,
    /// How long a conversation's view may be answered from this instance's
    /// cache; 0: always from the stores.
    pub cache_ms: u64,
    /// Conversations the cache holds at most.
    pub cache_entries: usize,
}

impl ServeConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.max_items == 0 || self.default_page == 0 || self.max_page < self.default_page {
            return Err(
                "serve.max_items and serve.default_page must be positive, and serve.max_page at least serve.default_page"
                    .into(),
            );
        }
        Ok(())
    }
}

/// How callers are authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication: for a service behind a backend that checks callers.
    None,
    /// A JWT bearer token whose `sub` is the caller's user id.
    Jwt,
}

/// `[auth]`: bearer tokens, shared by the query API and the gateway.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// `HS256` (a shared secret) or `RS256` (an RSA public key, PEM).
    pub algorithm: String,
    /// HS256: the secret itself. Prefer `key_file`.
    pub secret: String,
    /// HS256: a file holding the secret; RS256: the public key, PEM.
    pub key_file: String,
    /// When set, tokens must carry this `aud`.
    pub audience: String,
    /// When set, tokens must carry this `iss`.
    pub issuer: String,
    /// Clock skew allowed on `exp` and `nbf`, seconds.
    pub leeway_s: u64,
}

// Never print the secret.
impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("mode", &self.mode)
            .field("algorithm", &self.algorithm)
            .field("secret", &if self.secret.is_empty() { "" } else { "<redacted>" })
            .field("key_file", &self.key_file)
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .field("leeway_s", &self.leeway_s)
            .finish()
    }
}

impl AuthConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.mode == AuthMode::None {
            return Ok(());
        }
        match self.algorithm.as_str() {
            "HS256" if self.secret.is_empty() && self.key_file.is_empty() => {
                Err("auth.algorithm HS256 needs auth.secret or auth.key_file".into())
            }
            "RS256" if self.key_file.is_empty() => {
                Err("auth.algorithm RS256 needs auth.key_file (a PEM public key)".into())
            }
            "HS256" | "RS256" => Ok(()),
            other => Err(format!(
                "auth.algorithm {other:?} is not supported (HS256 or RS256)"
            )),
        }
    }
}
