//! The registry's REST calls, one HTTP/1.1 connection each: readfold calls
//! the registry at start and when it meets a schema id it does not know,
//! so connection reuse is not worth its state.

use std::time::Duration;

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::config::RegistryConfig;
use crate::{Error, Result};

/// Confluent's content type; registries also take plain JSON.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// A Confluent-compatible schema registry.
#[derive(Clone)]
pub struct Registry {
    url: String,
    https: bool,
    host: String,
    port: u16,
    base_path: String,
    authorization: Option<String>,
    tls: Option<tokio_native_tls::TlsConnector>,
    timeout: Duration,
}

impl Registry {
    /// A client for `config.url`; nothing is sent until the first call.
    pub fn new(config: &RegistryConfig) -> Result<Registry> {
        config.check().map_err(Error::Config)?;
        let uri: Uri = config
            .url
            .parse()
            .map_err(|e| Error::Config(format!("schema_registry.url {:?}: {e}", config.url)))?;
        let https = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .ok_or_else(|| Error::Config(format!("schema_registry.url {:?} has no host", config.url)))?
            .trim_matches(['[', ']'])
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = if https {
            let mut builder = native_tls::TlsConnector::builder();
            if !config.tls_ca_file.is_empty() {
                let pem = std::fs::read(&config.tls_ca_file).map_err(|e| {
                    Error::Config(format!(
                        "schema_registry.tls_ca_file {:?}: {e}",
                        config.tls_ca_file
                    ))
                })?;
                let ca = native_tls::Certificate::from_pem(&pem).map_err(|e| {
                    Error::Config(format!(
                        "schema_registry.tls_ca_file {:?}: {e}",
                        config.tls_ca_file
                    ))
                })?;
                builder.add_root_certificate(ca);
            }
            let connector = builder.build().map_err(|source| Error::Tls {
                url: config.url.clone(),
                source,
            })?;
            Some(tokio_native_tls::TlsConnector::from(connector))
        } else {
            None
        };
        let authorization = (!config.username.is_empty()).then(|| {
            let pair = format!("{}:{}", config.username, config.password);
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        Ok(Registry {
            url: config.url.clone(),
            https,
            host,
            port,
            base_path: uri.path().trim_end_matches('/').to_owned(),
            authorization,
            tls,
            timeout: Duration::from_millis(config.timeout_ms),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Registers `schema` (Avro JSON) under `subject`, or finds it there
    /// already: its id either way.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<u32> {
        let path = format!("/subjects/{}/versions", encode_segment(subject));
        let answer = self
            .call(Method::POST, &path, Some(json!({ "schema": schema })))
            .await?;
        self.id_of(&answer)
    }

    /// The schema (Avro JSON) with this id; `None` if the registry has none.
    pub async fn schema(&self, id: u32) -> Result<Option<String>> {
        match self.call(Method::GET, &format!("/schemas/ids/{id}"), None).await {
            Ok(answer) => answer["schema"]
                .as_str()
                .map(|s| Some(s.to_owned()))
                .ok_or_else(|| self.answer(format!("no schema in {answer}"))),
            Err(Error::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The ids of every version registered under `subject` (empty if none).
    pub async fn subject_ids(&self, subject: &str) -> Result<Vec<u32>> {
        let path = format!("/subjects/{}/versions", encode_segment(subject));
        let versions = match self.call(Method::GET, &path, None).await {
            Ok(v) => v,
            Err(Error::Status { status: 404, .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut ids = Vec::new();
        for version in versions.as_array().into_iter().flatten() {
            let path = format!("/subjects/{}/versions/{version}", encode_segment(subject));
            let answer = self.call(Method::GET, &path, None).await?;
            ids.push(self.id_of(&answer)?);
        }
        Ok(ids)
    }

    fn id_of(&self, answer: &Value) -> Result<u32> {
        answer["id"]
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| self.answer(format!("no schema id in {answer}")))
    }

    fn answer(&self, detail: String) -> Error {
        Error::Answer {
            url: self.url.clone(),
            detail,
        }
    }

    /// One request on a new connection, within the timeout.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let timeout_ms = self.timeout.as_millis() as u64;
        tokio::time::timeout(self.timeout, self.call_once(method, path, body))
            .await
            .map_err(|_| Error::Timeout {
                url: self.url.clone(),
                timeout_ms,
            })?
    }

    async fn call_once(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let url = self.url.clone();
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| Error::Connect {
                url: url.clone(),
                source,
            })?;
        let authority = format!("{}:{}", self.host, self.port);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base_path))
            .header(hyper::header::HOST, authority)
            .header(hyper::header::ACCEPT, CONTENT_TYPE);
        if let Some(authorization) = &self.authorization {
            request = request.header(hyper::header::AUTHORIZATION, authorization);
        }
        let body = match body {
            Some(body) => {
                request = request.header(hyper::header::CONTENT_TYPE, CONTENT_TYPE);
                Bytes::from(body.to_string())
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(body))
            .map_err(|e| Error::Config(format!("schema_registry.url {url:?}: {e}")))?;
        let http = |source| Error::Http {
            url: url.clone(),
            source,
        };
        let response = if self.https {
            let tls = self.tls.as_ref().expect("https has a TLS connector");
            let stream = tls.connect(&self.host, tcp).await.map_err(|source| Error::Tls {
                url: url.clone(),
                source,
            })?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(http)?;
            tokio::spawn(connection);
            sender.send_request(request).await.map_err(http)?
        } else {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(http)?;
            tokio::spawn(connection);
            sender.send_request(request).await.map_err(http)?
        };
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.map_err(http)?.to_bytes();
        if !(200..300).contains(&status) {
            return Err(Error::Status {
                url,
                status,
                body: String::from_utf8_lossy(&bytes).chars().take(500).collect(),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| self.answer(format!("not JSON: {e}")))
    }
}

/// Percent-encodes a path segment (subject names are topic names plus a
/// suffix: letters, digits, `.`, `_`, `-`, which pass as they are).
fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str) -> RegistryConfig {
        RegistryConfig {
            url: url.into(),
            username: String::new(),
            password: String::new(),
            tls_ca_file: String::new(),
            timeout_ms: 1000,
        }
    }

    #[test]
    fn urls_are_split_and_checked() {
        let r = Registry::new(&config("http://127.0.0.1:8081/apis/ccompat/v7/")).unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.base_path.as_str(), r.https),
            ("127.0.0.1", 8081, "/apis/ccompat/v7", false)
        );
        let r = Registry::new(&config("https://registry.example")).unwrap();
        assert_eq!((r.port, r.base_path.as_str(), r.https), (443, "", true));
        for bad in ["ftp://x", "registry:8081", "http://user:pw@host:1"] {
            let e = Registry::new(&config(bad)).err().expect(bad).to_string();
            assert!(!e.contains("pw@"), "{e}");
        }
        assert_eq!(
            encode_segment("chat.read-cursors-value"),
            "chat.read-cursors-value"
        );
        assert_eq!(encode_segment("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn basic_auth_is_encoded_and_never_debug_printed() {
        let mut c = config("http://h:1");
        c.username = "rf".into();
        c.password = "s3cret".into();
        let r = Registry::new(&c).unwrap();
        assert_eq!(r.authorization.as_deref(), Some("Basic cmY6czNjcmV0"));
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
