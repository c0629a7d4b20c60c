//! A small HTTP/1.1 client over one keep-alive connection: enough for the
//! demo, the benches and the tests to talk to `readfold serve` without a
//! heavy dependency. It speaks only what the API answers with: responses
//! with a `Content-Length`.

use std::io;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A response: status and body.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
    }
}

/// One connection to one server.
pub struct HttpClient {
    addr: String,
    stream: Option<BufReader<TcpStream>>,
    token: Option<String>,
}

impl HttpClient {
    pub fn new(addr: impl Into<String>) -> Self {
        HttpClient {
            addr: addr.into(),
            stream: None,
            token: None,
        }
    }

    /// Sends `Authorization: Bearer <token>` with every request.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub async fn get(&mut self, path: &str) -> io::Result<Response> {
        self.request("GET", path, None).await
    }

    pub async fn post_json(&mut self, path: &str, body: &serde_json::Value) -> io::Result<Response> {
        self.request("POST", path, Some(body.to_string().into_bytes()))
            .await
    }

    /// Sends one request; reconnects once if the kept-alive connection was
    /// closed.
    pub async fn request(&mut self, method: &str, path: &str, body: Option<Vec<u8>>) -> io::Result<Response> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if let Some(token) = &self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        let body = body.unwrap_or_default();
        if !body.is_empty() || method == "POST" {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        let mut message = head.into_bytes();
        message.extend_from_slice(&body);
        for attempt in 0..2 {
            match self.exchange(&message).await {
                Ok(response) => return Ok(response),
                Err(_) if attempt == 0 => self.stream = None,
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    async fn exchange(&mut self, message: &[u8]) -> io::Result<Response> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.addr).await?;
            stream.set_nodelay(true)?;
            self.stream = Some(BufReader::new(stream));
        }
        let stream = self.stream.as_mut().expect("connected above");
        stream.get_mut().write_all(message).await?;
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
        let mut length = 0usize;
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await?;
        Ok(Response { status, body })
    }
}
