//! A WebSocket client of the gateway, as a program would be.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const PROTOCOL: &str = "readfold.v1.json";

/// One connection to the gateway.
pub struct WsClient {
    stream: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl WsClient {
    /// Connects to `ws://<addr><path>` asking for the readfold subprotocol;
    /// the handshake's HTTP status on refusal.
    pub async fn connect(addr: &str, path: &str) -> Result<WsClient, u16> {
        Self::connect_with(addr, path, None).await
    }

    /// As `connect`, on a socket with a receive buffer of `recv_buffer`
    /// bytes (a small one makes a client that does not read slow for real).
    pub async fn connect_with(addr: &str, path: &str, recv_buffer: Option<u32>) -> Result<WsClient, u16> {
        Self::open(addr, path, recv_buffer, Some(PROTOCOL)).await
    }

    /// As `connect`, asking for `readfold.v2.json` (and v1 after it).
    pub async fn connect_v2(addr: &str, path: &str) -> Result<WsClient, u16> {
        Self::open(addr, path, None, Some("readfold.v2.json, readfold.v1.json")).await
    }

    /// As `connect`, without asking for the subprotocol.
    pub async fn connect_without_protocol(addr: &str, path: &str) -> Result<WsClient, u16> {
        Self::open(addr, path, None, None).await
    }

    async fn open(
        addr: &str,
        path: &str,
        recv_buffer: Option<u32>,
        protocol: Option<&'static str>,
    ) -> Result<WsClient, u16> {
        let mut request = format!("ws://{addr}{path}").into_client_request().unwrap();
        if let Some(protocol) = protocol {
            request
                .headers_mut()
                .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(protocol));
        }
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(size) = recv_buffer {
            socket.set_recv_buffer_size(size).unwrap();
        }
        let tcp = socket.connect(addr.parse().unwrap()).await.unwrap();
        match tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(tcp)).await {
            Ok((stream, _)) => Ok(WsClient { stream }),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
            Err(e) => panic!("websocket handshake: {e}"),
        }
    }

    pub async fn send(&mut self, message: Value) {
        self.stream
            .send(Message::Text(message.to_string().into()))
            .await
            .unwrap();
    }

    /// The next frame, or None within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            match tokio::time::timeout(timeout, self.stream.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => return Some(serde_json::from_str(&text).unwrap()),
                Ok(Some(Ok(_))) => continue,
                _ => return None,
            }
        }
    }

    /// Frames until one satisfies `done` (returned last), or panics after
    /// `timeout` saying what it saw.
    pub async fn until(&mut self, timeout: Duration, mut done: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let started = Instant::now();
        let mut seen = Vec::new();
        while started.elapsed() < timeout {
            if let Some(frame) = self.next(Duration::from_millis(200)).await {
                let stop = done(&frame);
                seen.push(frame);
                if stop {
                    return seen;
                }
            }
        }
        panic!("no expected frame within {timeout:?}; saw {seen:?}");
    }

    /// Every frame that arrives until none does for `quiet`.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Value> {
        let mut seen = Vec::new();
        while let Some(frame) = self.next(quiet).await {
            seen.push(frame);
        }
        seen
    }
}
