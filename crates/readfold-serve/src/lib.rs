//! `readfold serve`: the query API. An HTTP/JSON service that answers the
//! questions the cursors exist for (unread counts, "N read", who-read, a
//! member's cursor), reading Redis first and CQL when Redis lacks the
//! answer, through the core's read model. It keeps no state of its own, so
//! any number of instances can run side by side.
//!
//! - [`api`]: the endpoints and their OpenAPI document.
//! - [`source`]: Redis first, CQL as the fallback.
//! - [`auth`]: optional JWT bearer tokens (HS256, RS256).
//! - [`client`]: a small HTTP/1.1 client, for the demo, the benches and tests.

pub mod api;
pub mod auth;
pub mod cache;
pub mod client;
pub mod config;
pub mod error;
pub mod extract;
pub mod source;
pub mod telemetry;
pub mod threads;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::Router;

pub use api::{ApiLimits, AppState};
pub use auth::{AuthError, Authenticator, Caller};
pub use config::{AuthConfig, AuthMode, ServeConfig};
pub use source::{ReadSource, Source};

/// The OpenAPI 3 document of the API, generated from the handlers.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api::api_router().into_openapi()
}

/// The API's router: the endpoints, `/openapi.json` and `/healthz`.
pub fn router(state: AppState) -> Router {
    let (router, doc) = api::api_router().with_state(state).split_for_parts();
    let spec = axum::body::Bytes::from(doc.to_json().expect("the OpenAPI document serializes"));
    router
        .route(
            "/openapi.json",
            get(move || {
                let spec = spec.clone();
                async move { ([(CONTENT_TYPE, "application/json")], spec) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Binds `listen` and answers until `shutdown` completes; in-flight requests
/// finish first. Returns the bound address through `bound` as soon as it is
/// known (useful with port 0).
pub async fn serve(
    listen: &str,
    state: AppState,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    bound(addr);
    tracing::info!(%addr, "query API listening");
    axum::serve(listener.tap_io(no_delay), router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Sends small responses at once: with Nagle's algorithm on, a response
/// written in two parts waits for the client's delayed ACK (40 ms on Linux).
pub fn no_delay(stream: &mut tokio::net::TcpStream) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
}

/// Builds the shared state; `cache` answers repeated conversation reads.
pub fn state(
    source: ReadSource,
    auth: Authenticator,
    limits: ApiLimits,
    cache: cache::ViewCache,
) -> AppState {
    AppState {
        source: Arc::new(source),
        auth: Arc::new(auth),
        limits,
        cache: Arc::new(cache),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{SystemTime, UNIX_EPOCH};

    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    use super::*;
    use crate::client::HttpClient;

    const SECRET: &str = "test-secret-of-some-length";

    fn limits() -> ApiLimits {
        ApiLimits {
            max_items: 3,
            default_page: 2,
            max_page: 5,
            max_id_bytes: 64,
        }
    }

    fn auth(mode: AuthMode) -> Authenticator {
        Authenticator::from_config(&AuthConfig {
            mode,
            algorithm: "HS256".into(),
            secret: SECRET.into(),
            key_file: String::new(),
            audience: String::new(),
            issuer: String::new(),
            leeway_s: 0,
        })
        .unwrap()
    }

    fn token(sub: &str, expires_in: i64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let claims = json!({ "sub": sub, "exp": now + expires_in });
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()).unwrap(),
        )
        .unwrap()
    }

    /// A server with no stores behind it, on a free port.
    async fn server(mode: AuthMode) -> String {
        let state = state(
            ReadSource::new(None, None),
            auth(mode),
            limits(),
            cache::ViewCache::new(std::time::Duration::ZERO, 1),
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            serve(
                "127.0.0.1:0",
                state,
                |addr| {
                    let _ = tx.send(addr);
                },
                std::future::pending(),
            )
            .await
            .unwrap();
        });
        rx.await.unwrap().to_string()
    }

    async fn error_code(
        client: &mut HttpClient,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, String, String) {
        let response = client
            .request(method, path, body.map(|b| b.as_bytes().to_vec()))
            .await
            .unwrap();
        let json = response.json().unwrap();
        (
            response.status,
            json["code"].as_str().unwrap_or_default().to_owned(),
            json["message"].as_str().unwrap_or_default().to_owned(),
        )
    }

    #[tokio::test]
    async fn invalid_parameters_get_400_naming_them() {
        let mut c = HttpClient::new(server(AuthMode::None).await);
        let (status, code, message) = error_code(
            &mut c,
            "GET",
            "/v1/conversations/G/messages/3/readers?sender=A&limit=x",
            None,
        )
        .await;
        assert_eq!((status, code.as_str()), (400, "invalid_query"));
        assert!(message.contains("`limit`"), "{message}");
        let (status, _, message) =
            error_code(&mut c, "GET", "/v1/conversations/G/messages/3/readers", None).await;
        assert_eq!(status, 400);
        assert!(message.contains("`sender`"), "{message}");
        let (status, code, _) = error_code(
            &mut c,
            "GET",
            "/v1/conversations/G/messages/three/readers?sender=A",
            None,
        )
        .await;
        assert_eq!((status, code.as_str()), (400, "invalid_path"));
        let (status, _, message) =
            error_code(&mut c, "GET", "/v1/conversations/G/messages/3/receivers", None).await;
        assert_eq!(status, 400);
        assert!(message.contains("`sender`"), "{message}");
        let (status, code, message) = error_code(
            &mut c,
            "POST",
            "/v1/conversations/G/read-counts",
            Some(r#"{"messages":[{"seq":"x","sender":"A"}]}"#),
        )
        .await;
        assert_eq!((status, code.as_str()), (400, "invalid_field"));
        assert!(message.contains("seq"), "{message}");
        let (status, code, _) =
            error_code(&mut c, "POST", "/v1/conversations/G/read-counts", Some("{")).await;
        assert_eq!((status, code.as_str()), (400, "malformed_json"));
        let four = r#"{"messages":[{"seq":1,"sender":"A"},{"seq":1,"sender":"A"},{"seq":1,"sender":"A"},{"seq":1,"sender":"A"}]}"#;
        let (status, code, _) =
            error_code(&mut c, "POST", "/v1/conversations/G/read-counts", Some(four)).await;
        assert_eq!((status, code.as_str()), (400, "too_many_items"));
        let (status, code, _) = error_code(
            &mut c,
            "GET",
            "/v1/conversations/G/messages/3/readers?sender=A&limit=6",
            None,
        )
        .await;
        assert_eq!((status, code.as_str()), (400, "invalid_query"));
    }

    #[tokio::test]
    async fn unknown_conversations_are_404_for_a_trusted_caller() {
        let mut c = HttpClient::new(server(AuthMode::None).await);
        let (status, code, _) = error_code(&mut c, "GET", "/v1/conversations/nobody-knows", None).await;
        assert_eq!((status, code.as_str()), (404, "not_found"));
        // Unknown conversations in a badge list are entries, not errors.
        let r = c
            .post_json("/v1/users/u/unread", &json!({ "conversations": ["x", "y"] }))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        let body = r.json().unwrap();
        assert_eq!(body["conversations"][1]["member"], false);
        assert_eq!(body["conversations"][1]["source"], "none");
    }

    #[tokio::test]
    async fn tokens_are_checked_and_users_see_only_their_own() {
        let addr = server(AuthMode::Jwt).await;
        let mut anonymous = HttpClient::new(addr.clone());
        let (status, code, _) = error_code(&mut anonymous, "GET", "/v1/conversations/G", None).await;
        assert_eq!((status, code.as_str()), (401, "unauthorized"));
        let mut expired = HttpClient::new(addr.clone()).with_token(token("alice", -60));
        let (status, _, message) = error_code(&mut expired, "GET", "/v1/conversations/G", None).await;
        assert_eq!(status, 401);
        assert!(message.contains("expired"), "{message}");
        let mut forged = HttpClient::new(addr.clone()).with_token(format!("{}x", token("alice", 60)));
        assert_eq!(
            error_code(&mut forged, "GET", "/v1/conversations/G", None)
                .await
                .0,
            401
        );
        let mut alice = HttpClient::new(addr).with_token(token("alice", 60));
        let (status, code, _) = error_code(&mut alice, "GET", "/v1/conversations/G", None).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "forbidden"),
            "not a member (nor does it exist)"
        );
        let (status, code, _) = error_code(
            &mut alice,
            "POST",
            "/v1/users/bob/unread",
            Some(r#"{"conversations":[]}"#),
        )
        .await;
        assert_eq!((status, code.as_str()), (403, "forbidden"));
        let own = alice
            .post_json("/v1/users/alice/unread", &json!({ "conversations": [] }))
            .await
            .unwrap();
        assert_eq!(own.status, 200);
    }

    #[tokio::test]
    async fn the_openapi_document_is_served_and_names_every_endpoint() {
        let mut c = HttpClient::new(server(AuthMode::None).await);
        let r = c.get("/openapi.json").await.unwrap();
        assert_eq!(r.status, 200);
        let doc = r.json().unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        for path in [
            "/v1/conversations/{conversation_id}",
            "/v1/conversations/{conversation_id}/read-counts",
            "/v1/conversations/{conversation_id}/messages/{seq}/readers",
            "/v1/conversations/{conversation_id}/messages/{seq}/receivers",
            "/v1/users/{user_id}/badge",
            "/v1/conversations/{conversation_id}/members/{user_id}",
            "/v1/users/{user_id}/unread",
        ] {
            assert!(doc["paths"][path].is_object(), "{path} missing");
        }
        assert_eq!(doc, serde_json::to_value(openapi()).unwrap());
    }

    #[test]
    fn auth_config_errors_name_the_key_never_the_secret() {
        let mut config = AuthConfig {
            mode: AuthMode::Jwt,
            algorithm: "RS256".into(),
            secret: "hunter2".into(),
            key_file: "/nonexistent/key.pem".into(),
            audience: String::new(),
            issuer: String::new(),
            leeway_s: 0,
        };
        let err = Authenticator::from_config(&config).err().unwrap().to_string();
        assert!(
            err.contains("/nonexistent/key.pem") && !err.contains("hunter2"),
            "{err}"
        );
        config.algorithm = "none".into();
        assert!(Authenticator::from_config(&config).is_err());
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
