//! A headless Chromium driven through chromedriver's WebDriver API, for
//! testing pages as a person sees them. Needs Debian's `chromium` and
//! `chromium-driver` (`scripts/dev deps` installs them).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use readfold_serve::client::HttpClient;
use serde_json::{json, Value};

use super::services::free_port;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A running chromedriver; stopped when dropped.
pub struct Driver {
    child: Child,
    addr: String,
}

impl Driver {
    pub async fn start() -> Driver {
        let port = free_port();
        // A process group of its own, so that the browsers it starts go
        // with it.
        let child = Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "chromedriver not found: `scripts/dev deps` installs Debian's chromium and chromium-driver",
            );
        let addr = format!("127.0.0.1:{port}");
        let started = Instant::now();
        while HttpClient::new(addr.clone()).get("/status").await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Driver { child, addr }
    }

    /// A new headless browser window.
    pub async fn browser(&self) -> Browser {
        let mut client = HttpClient::new(self.addr.clone());
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1180,760",
        ];
        let response = client
            .post_json(
                "/session",
                &json!({ "capabilities": { "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args }
                }}}),
            )
            .await
            .unwrap();
        let body = response.json().unwrap();
        let session = body["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {body}"))
            .to_owned();
        Browser { client, session }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        super::services::send_signal_to_group(self.child.id(), "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser window.
pub struct Browser {
    client: HttpClient,
    session: String,
}

impl Browser {
    async fn call(&mut self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let response = self
            .client
            .request(method, &path, body.map(|b| b.to_string().into_bytes()))
            .await
            .unwrap();
        let value = response.json().unwrap();
        assert!(response.status == 200, "WebDriver {method} {path}: {value}");
        value["value"].clone()
    }

    pub async fn open(&mut self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url }))).await;
    }

    async fn find(&mut self, css: &str) -> Option<String> {
        let path = format!("/session/{}/element", self.session);
        let response = self
            .client
            .post_json(&path, &json!({ "using": "css selector", "value": css }))
            .await
            .unwrap();
        let value = response.json().unwrap();
        value["value"][ELEMENT].as_str().map(str::to_owned)
    }

    /// Waits for an element to exist, and clicks it. A page that redraws
    /// may replace the element between finding and clicking it (a stale
    /// element): then it is found again.
    pub async fn click(&mut self, css: &str) {
        let started = Instant::now();
        loop {
            let element = self.wait_for(css, Duration::from_secs(30)).await;
            let path = format!("/session/{}/element/{element}/click", self.session);
            let response = self.client.post_json(&path, &json!({})).await.unwrap();
            if response.status == 200 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "cannot click {css}: {:?}",
                response.json()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for an input to exist, clears it and types `text` into it.
    pub async fn type_text(&mut self, css: &str, text: &str) {
        let element = self.wait_for(css, Duration::from_secs(30)).await;
        let path = format!("/element/{element}");
        self.call("POST", &format!("{path}/clear"), Some(json!({}))).await;
        self.call("POST", &format!("{path}/value"), Some(json!({ "text": text })))
            .await;
    }

    /// Waits for an element to exist; its WebDriver id.
    pub async fn wait_for(&mut self, css: &str, timeout: Duration) -> String {
        let started = Instant::now();
        loop {
            if let Some(element) = self.find(css).await {
                return element;
            }
            assert!(started.elapsed() < timeout, "no {css} within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The visible text of an element, "" when it does not exist (or was
    /// just replaced by a redraw).
    pub async fn text(&mut self, css: &str) -> String {
        let Some(element) = self.find(css).await else {
            return String::new();
        };
        let path = format!("/session/{}/element/{element}/text", self.session);
        let response = self.client.get(&path).await.unwrap();
        let value = response.json().unwrap_or_default();
        value["value"].as_str().unwrap_or_default().to_owned()
    }

    /// Waits until an element's text is `want`.
    pub async fn wait_for_text(&mut self, css: &str, want: &str, timeout: Duration) {
        let started = Instant::now();
        loop {
            let text = self.text(css).await;
            if text == want {
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "{css} shows {text:?}, not {want:?}, after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A PNG of the window.
    pub async fn screenshot(&mut self) -> Vec<u8> {
        let encoded = self.call("GET", "/screenshot", None).await;
        decode_base64(encoded.as_str().unwrap_or_default())
    }

    pub async fn close(mut self) {
        let path = format!("/session/{}", self.session);
        let _ = self.client.request("DELETE", &path, None).await;
    }
}

/// Standard base64, as WebDriver sends screenshots.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().fold(0u32, |acc, &d| (acc << 6) | u32::from(d)) << (6 * (4 - chunk.len()));
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}
