//! Extractors whose rejections are [`ApiError`]s that name the parameter,
//! instead of axum's plain-text ones.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// The parameter a deserialization error is about, and why.
fn describe<E: std::fmt::Display>(err: serde_path_to_error::Error<E>) -> (String, String) {
    let path = err.path().to_string();
    let reason = err.into_inner().to_string();
    // A missing field has path "."; its name is in the message.
    let name = if path != "." {
        path
    } else if let Some(rest) = reason.strip_prefix("missing field `") {
        rest.split('`').next().unwrap_or("?").to_owned()
    } else {
        "?".to_owned()
    };
    (name, reason)
}

/// Query parameters.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(ApiQuery).map_err(|e| {
            let (name, reason) = describe(e);
            ApiError::bad_request("invalid_query", format!("query parameter `{name}`: {reason}"))
        })
    }
}

/// A JSON body; the extractor must be the handler's last argument.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if !json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON (Content-Type: application/json)",
            ));
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::bad_request("malformed_json", e.body_text()))?;
        let mut de = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            if e.inner().is_syntax() || e.inner().is_eof() {
                ApiError::bad_request("malformed_json", e.into_inner().to_string())
            } else {
                let (name, reason) = describe(e);
                ApiError::bad_request("invalid_field", format!("field `{name}`: {reason}"))
            }
        })?;
        de.end()
            .map_err(|e| ApiError::bad_request("malformed_json", e.to_string()))?;
        Ok(ApiJson(value))
    }
}

/// Path parameters.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|e| ApiError::bad_request("invalid_path", e.body_text()))
    }
}
