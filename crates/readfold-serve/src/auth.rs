//! Bearer tokens: who is asking. With `auth.mode = "jwt"` every request
//! carries `Authorization: Bearer <JWT>` whose `sub` is the caller's user
//! id, checked with HS256 (a shared secret) or RS256 (an RSA public key).
//! With `auth.mode = "none"` the caller is trusted (a backend in front of
//! readfold checks users itself).

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{decode, Algorithm, DecodingKey, Validation};
use readfold_core::UserId;
use serde::Deserialize;

use crate::config::{AuthConfig, AuthMode};
use crate::error::ApiError;

/// Why the `[auth]` section cannot be used. Messages name files, never keys.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("auth: {0}")]
    Config(String),
    #[error("auth.key_file {path}: {source}")]
    KeyFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("auth: the {what} is not a valid key: {source}")]
    Key {
        what: &'static str,
        #[source]
        source: jsonwebtoken::errors::Error,
    },
}

/// Checks tokens, or trusts every caller.
pub enum Authenticator {
    Off,
    Jwt(Box<JwtChecker>),
}

/// The key and rules tokens are checked with.
pub struct JwtChecker {
    key: DecodingKey,
    validation: Validation,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

impl Authenticator {
    pub fn from_config(config: &AuthConfig) -> Result<Self, AuthError> {
        config.check().map_err(AuthError::Config)?;
        if config.mode == AuthMode::None {
            return Ok(Authenticator::Off);
        }
        let read = |path: &str| {
            std::fs::read(path).map_err(|source| AuthError::KeyFile {
                path: path.to_owned(),
                source,
            })
        };
        let (key, algorithm) = match config.algorithm.as_str() {
            "HS256" => {
                let secret = if config.key_file.is_empty() {
                    config.secret.as_bytes().to_vec()
                } else {
                    // A trailing newline is a common accident in secret files.
                    let mut s = read(&config.key_file)?;
                    while s.last().is_some_and(|b| b.is_ascii_whitespace()) {
                        s.pop();
                    }
                    s
                };
                let key = DecodingKey::from_secret(&secret).map_err(|source| AuthError::Key {
                    what: "HS256 secret",
                    source,
                })?;
                (key, Algorithm::HS256)
            }
            _ => {
                let pem = read(&config.key_file)?;
                let key = DecodingKey::from_rsa_pem(&pem).map_err(|source| AuthError::Key {
                    what: "RS256 public key",
                    source,
                })?;
                (key, Algorithm::RS256)
            }
        };
        // Only the configured algorithm: no algorithm confusion.
        let mut validation = Validation::new(algorithm);
        validation.leeway = config.leeway_s;
        validation.set_required_spec_claims(&["exp", "sub"]);
        if config.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&[&config.audience]);
        }
        if !config.issuer.is_empty() {
            validation.set_issuer(&[&config.issuer]);
        }
        Ok(Authenticator::Jwt(Box::new(JwtChecker { key, validation })))
    }

    pub fn is_on(&self) -> bool {
        matches!(self, Authenticator::Jwt(_))
    }

    /// The caller a token names.
    pub fn verify(&self, token: &str) -> Result<UserId, ApiError> {
        let Authenticator::Jwt(checker) = self else {
            return Err(ApiError::unauthorized("tokens are not checked here"));
        };
        let claims =
            decode::<Claims>(token, &checker.key, &checker.validation).map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => ApiError::unauthorized("the token has expired"),
                _ => ApiError::unauthorized("the token is not valid"),
            })?;
        claims
            .claims
            .sub
            .parse()
            .map_err(|_| ApiError::unauthorized("the token's sub is not a valid user id"))
    }
}

/// Who is asking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Access control is off: a trusted backend.
    Trusted,
    /// A user, by their token.
    User(UserId),
}

impl Caller {
    /// Whether the caller may see `user`'s private state.
    pub fn is(&self, user: &UserId) -> bool {
        match self {
            Caller::Trusted => true,
            Caller::User(u) => u == user,
        }
    }
}

impl<S> FromRequestParts<S> for Caller
where
    Arc<Authenticator>: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let auth = Arc::<Authenticator>::from_ref(state);
        if !auth.is_on() {
            return Ok(Caller::Trusted);
        }
        let token = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| ApiError::unauthorized("missing `Authorization: Bearer <token>`"))?;
        auth.verify(token.trim()).map(Caller::User)
    }
}
