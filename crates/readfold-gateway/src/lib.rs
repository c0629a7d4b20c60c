//! `readfold gateway`: the reference push gateway. Clients hold a WebSocket
//! (subprotocol `readfold.v2.json` or `readfold.v1.json`): they send read
//! receipts, delivery reports, marks and mutes, which the gateway checks
//! and produces to the read-reports topic, and receive the cursor and
//! delivered-cursor advances of the conversations they subscribe to and
//! their own state (cursors, mark, unread mentions, mute) on all their
//! devices, from the changelogs, coalesced per connection. It also serves
//! the query API (`/v1/...`), and a demo page.
//!
//! - [`protocol`]: the frames.
//! - [`hub`]: subscriptions and coalescing outboxes.
//! - [`follow`]: the changelog followers.
//! - `threads`: users' followed threads and thread subscriptions.
//! - `session`: one connection.
//! - `demo`: the demo page and its endpoints.
//!
//! With the badge stage (`readfold badges`) running, every device of a user
//! is also sent the user's app badge, and may mark everything read.

pub mod config;
mod demo;
pub mod follow;
pub mod hub;
pub mod protocol;
mod session;
pub mod telemetry;
mod threads;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Query, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::serve::ListenerExt;
use axum::Router;
use readfold_core::UserId;
use readfold_kafka::producer::InputProducer;
use readfold_serve::error::ApiError;
use readfold_serve::{AppState, ReadSource};
use readfold_trace::Tracer;

pub use config::GatewayConfig;
pub use hub::{Hub, HubConfig};
pub use protocol::{Version, PROTOCOL, PROTOCOL_V2};

/// The badge stage's topics (`[badge]` in the config): the gateway follows
/// the badges and produces the user actions.
#[derive(Debug, Default)]
pub struct Badges {
    pub user_badges: String,
    pub user_actions: String,
    /// The user actions' partition count once known (0 until then: the
    /// topic exists once `readfold badges` has run).
    action_partitions: AtomicI32,
}

impl Badges {
    pub fn new(user_badges: impl Into<String>, user_actions: impl Into<String>) -> Self {
        Badges {
            user_badges: user_badges.into(),
            user_actions: user_actions.into(),
            action_partitions: AtomicI32::new(0),
        }
    }

    /// The user actions' partition count, if the topic is known to exist.
    pub fn action_partitions(&self) -> Option<i32> {
        Some(self.action_partitions.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    pub fn set_action_partitions(&self, n: i32) {
        self.action_partitions.store(n, Ordering::Relaxed);
    }
}

/// What every connection shares.
pub struct Gateway {
    pub hub: Arc<Hub>,
    pub source: Arc<ReadSource>,
    pub producer: InputProducer,
    pub config: GatewayConfig,
    pub api: AppState,
    pub max_id_bytes: usize,
    pub max_seq: u64,
    pub badges: Arc<Badges>,
    /// Set to stop the changelog followers.
    pub stop: Arc<AtomicBool>,
    /// Off unless `tracing.otlp_endpoint` is set.
    pub tracer: Tracer,
    demo: demo::DemoState,
}

impl Gateway {
    /// `api` is the query API's state (stores, access control, limits), shared.
    pub fn new(
        config: GatewayConfig,
        api: AppState,
        producer: InputProducer,
        max_seq: u64,
        badges: Badges,
        tracer: Tracer,
    ) -> Self {
        Gateway {
            hub: Arc::new(Hub::with_config(HubConfig {
                batch_from_members: config.batch_from_members,
                read_counts_window: config.read_counts_window,
                read_counts_interval: std::time::Duration::from_millis(config.read_counts_interval_ms),
            })),
            source: api.source.clone(),
            max_id_bytes: api.limits.max_id_bytes,
            producer,
            config,
            api,
            max_seq,
            badges: Arc::new(badges),
            stop: Arc::new(AtomicBool::new(false)),
            tracer,
            demo: demo::DemoState::default(),
        }
    }

    /// The WebSocket endpoint `/ws`, the query API `/v1/...`, and with
    /// `gateway.demo` the demo page at `/demo/`.
    pub fn router(self: &Arc<Self>) -> Router {
        let mut router = Router::new()
            .route("/ws", any(upgrade))
            .with_state(self.clone())
            .merge(readfold_serve::router(self.api.clone()));
        if self.config.demo {
            router = router.merge(demo::router(self.clone()));
        }
        router
    }
}

/// Who a connection is: the `sub` of its token (`access_token` query
/// parameter, since browsers cannot set headers on a WebSocket, or an
/// `Authorization` header), or with access control off the `user` it names.
fn caller(
    gateway: &Gateway,
    params: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<UserId, ApiError> {
    if gateway.api.auth.is_on() {
        let header = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let token = params
            .get("access_token")
            .map(String::as_str)
            .or(header)
            .ok_or_else(|| {
                ApiError::unauthorized("a token is needed: ?access_token=<JWT> or Authorization: Bearer")
            })?;
        return gateway.api.auth.verify(token.trim());
    }
    let user = params.get("user").ok_or_else(|| {
        ApiError::bad_request(
            "invalid_query",
            "query parameter `user`: missing (access control is off, so the client names its user)",
        )
    })?;
    UserId::parse(user, gateway.max_id_bytes)
        .map_err(|e| ApiError::bad_request("invalid_query", format!("query parameter `user`: {e}")))
}

async fn upgrade(
    State(gateway): State<Arc<Gateway>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let user = match caller(&gateway, &params, &headers) {
        Ok(user) => user,
        Err(e) => return e.into_response(),
    };
    // v2 when the client offers it.
    let ws = ws.protocols([PROTOCOL_V2, PROTOCOL]);
    let Some(version) = ws
        .selected_protocol()
        .and_then(|p| p.to_str().ok())
        .and_then(Version::from_name)
    else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "unsupported_protocol",
            format!("ask for the WebSocket subprotocol {PROTOCOL_V2} or {PROTOCOL}"),
        )
        .into_response();
    };
    // Small buffers: client messages are tiny, frames are written one at a
    // time, and a gateway holds tens of thousands of connections (the
    // defaults are 128 KiB each way per connection).
    ws.max_message_size(64 * 1024)
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0)
        .on_upgrade(move |socket| session::run(socket, gateway, user, version))
}

/// Binds `listen` and serves until `shutdown` completes.
pub async fn serve(
    gateway: Arc<Gateway>,
    listen: &str,
    bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr: SocketAddr = tokio::net::lookup_host(listen)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{listen:?} resolves to no address")))?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    // Accepted connections inherit the listener's buffer sizes.
    if gateway.config.send_buffer_bytes > 0 {
        socket.set_send_buffer_size(gateway.config.send_buffer_bytes)?;
    }
    socket.bind(addr)?;
    let listener = socket.listen(4096)?;
    let addr = listener.local_addr()?;
    bound(addr);
    tracing::info!(%addr, protocols = %format!("{PROTOCOL_V2}, {PROTOCOL}"), "gateway listening (WebSocket at /ws)");
    axum::serve(listener.tap_io(readfold_serve::no_delay), gateway.router())
        .with_graceful_shutdown(shutdown)
        .await
}
