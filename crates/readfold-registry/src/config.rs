//! The `[schema_registry]` section; defaults and documentation are in
//! `config/default.toml`.

use serde::Deserialize;

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Base URL of the Confluent-compatible API; empty: no registry.
    pub url: String,
    /// HTTP basic auth; empty username: none.
    pub username: String,
    pub password: String,
    /// PEM file of the CAs for an https URL; empty: the system's.
    pub tls_ca_file: String,
    /// Per call.
    pub timeout_ms: u64,
}

/// Never prints the password.
impl std::fmt::Debug for RegistryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryConfig")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &if self.password.is_empty() { "" } else { "***" })
            .field("tls_ca_file", &self.tls_ca_file)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

impl RegistryConfig {
    pub fn is_on(&self) -> bool {
        !self.url.is_empty()
    }

    pub fn check(&self) -> Result<(), String> {
        if !self.is_on() {
            return Ok(());
        }
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(format!(
                "schema_registry.url {:?} must start with http:// or https://",
                self.url
            ));
        }
        if self.url.contains('@') {
            return Err(
                "schema_registry.url must not carry credentials: use schema_registry.username and password"
                    .into(),
            );
        }
        if self.timeout_ms == 0 {
            return Err("schema_registry.timeout_ms must be positive".into());
        }
        if !self.tls_ca_file.is_empty() && !self.url.starts_with("https://") {
            return Err("schema_registry.tls_ca_file is set but schema_registry.url is not https://".into());
        }
        Ok(())
    }
}
