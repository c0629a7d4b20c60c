//! The [`Tracer`]: hands ended spans to a task that sends them in batches
//! to the OTLP endpoint, one HTTP/1.1 request per batch at most every
//! [`EXPORT_INTERVAL`]. Spans wait in a bounded queue; when it is full or
//! the collector does not answer they are dropped and counted, never
//! waited for: tracing must not slow the pipeline down.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use metrics::counter;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::otlp::{self, Resource};
use crate::span::SpanData;
use crate::TraceConfig;

/// Spans waiting for the exporter, at most.
const QUEUE: usize = 8192;
/// Spans per request, at most.
const MAX_BATCH: usize = 512;
/// How often what waits is sent.
const EXPORT_INTERVAL: Duration = Duration::from_secs(1);
/// How long one request may take (OTLP exporters' default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where spans go: `http://host:port[/base]`, to `/base/v1/traces`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    host: String,
    port: u16,
    path: String,
}

impl Endpoint {
    pub(crate) fn parse(url: &str) -> Result<Endpoint, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("tracing.otlp_endpoint {url:?}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            // A collector agent beside the process is the usual set-up;
            // it speaks TLS onwards if it needs to.
            return Err(format!(
                "tracing.otlp_endpoint {url:?}: only http:// is supported (send to a local collector agent)"
            ));
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("tracing.otlp_endpoint {url:?} has no host"))?
            .trim_matches(['[', ']'])
            .to_owned();
        Ok(Endpoint {
            host,
            port: uri.port_u16().unwrap_or(80),
            path: format!("{}/v1/traces", uri.path().trim_end_matches('/')),
        })
    }
}

enum Message {
    Span(SpanData),
    /// Send what waits now; answer once sent (or dropped).
    Flush(oneshot::Sender<()>),
}

/// Records spans, or nothing when tracing is off. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("on", &self.is_on()).finish()
    }
}

/// The exporter task ends once every clone is gone (its queue closes).
struct Inner {
    queue: mpsc::Sender<Message>,
    /// A new trace is recorded when a random u64 falls below this.
    sample_below: u64,
}

impl Tracer {
    /// A tracer that records nothing.
    pub fn off() -> Tracer {
        Tracer::default()
    }

    /// Starts the exporter (on the current Tokio runtime) when
    /// `config.otlp_endpoint` is set; off otherwise.
    pub fn start(config: &TraceConfig, resource: Resource) -> Result<Tracer, String> {
        config.check()?;
        if !config.is_on() {
            return Ok(Tracer::off());
        }
        let endpoint = Endpoint::parse(&config.otlp_endpoint)?;
        let (queue, spans) = mpsc::channel(QUEUE);
        tracing::info!(endpoint = %config.otlp_endpoint, sample_ratio = config.sample_ratio, service = %resource.service, "exporting spans over OTLP/HTTP");
        tokio::spawn(export_loop(endpoint, resource, spans));
        Ok(Tracer {
            inner: Some(Arc::new(Inner {
                queue,
                sample_below: (config.sample_ratio * u64::MAX as f64) as u64,
            })),
        })
    }

    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Whether a trace starting here is recorded: `sample_ratio` of them.
    pub fn sample(&self) -> bool {
        self.inner.as_ref().is_some_and(|inner| {
            inner.sample_below == u64::MAX || crate::context::random_u64() < inner.sample_below
        })
    }

    /// Hands an ended span to the exporter; drops it if its queue is full.
    /// Unsampled spans are not recorded.
    pub fn record(&self, span: SpanData) {
        let Some(inner) = &self.inner else { return };
        if !span.context.sampled {
            return;
        }
        if inner.queue.try_send(Message::Span(span)).is_err() {
            spans("dropped_queue_full", 1);
        }
    }

    /// Sends every span recorded so far, waiting at most `timeout`: for a
    /// process that is about to exit.
    pub async fn flush(&self, timeout: Duration) {
        let Some(inner) = &self.inner else { return };
        let (done, sent) = oneshot::channel();
        if inner.queue.send(Message::Flush(done)).await.is_ok() {
            let _ = tokio::time::timeout(timeout, sent).await;
        }
    }
}

fn spans(outcome: &'static str, n: usize) {
    counter!("readfold_trace_spans_total", "outcome" => outcome).increment(n as u64);
}

async fn export_loop(endpoint: Endpoint, resource: Resource, mut queue: mpsc::Receiver<Message>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut tick = tokio::time::interval(EXPORT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        let flushed = tokio::select! {
            message = queue.recv() => match message {
                None => return,
                Some(Message::Span(span)) => {
                    batch.push(span);
                    if batch.len() < MAX_BATCH {
                        continue;
                    }
                    None
                }
                Some(Message::Flush(done)) => Some(done),
            },
            _ = tick.tick() => None,
        };
        if !batch.is_empty() {
            let body = otlp::encode(&resource, &batch);
            match tokio::time::timeout(EXPORT_TIMEOUT, post(&endpoint, body)).await {
                Ok(Ok(())) => {
                    spans("exported", batch.len());
                    if std::mem::take(&mut failing) {
                        tracing::info!(host = %endpoint.host, port = endpoint.port, "the OTLP endpoint takes spans again");
                    }
                }
                outcome => {
                    spans("dropped_export_failed", batch.len());
                    let error = match outcome {
                        Ok(Err(e)) => e,
                        _ => format!("no answer within {EXPORT_TIMEOUT:?}"),
                    };
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(host = %endpoint.host, port = endpoint.port, %error, "OTLP export failed; dropping spans until it works");
                    }
                }
            }
            batch.clear();
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}

/// One POST on a new connection: a batch a second at most is not worth a
/// pooled connection's state.
async fn post(endpoint: &Endpoint, body: Vec<u8>) -> Result<(), String> {
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = Request::builder()
        .method(Method::POST)
        .uri(&endpoint.path)
        .header(
            hyper::header::HOST,
            format!("{}:{}", endpoint.host, endpoint.port),
        )
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&answer)
                .chars()
                .take(300)
                .collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::SpanContext;
    use crate::span::{OpenSpan, SpanKind, Status};

    #[test]
    fn endpoints_are_checked_and_split() {
        assert_eq!(
            Endpoint::parse("http://collector:4318").unwrap(),
            Endpoint {
                host: "collector".into(),
                port: 4318,
                path: "/v1/traces".into()
            }
        );
        assert_eq!(
            Endpoint::parse("http://[::1]:4318/otlp/").unwrap().path,
            "/otlp/v1/traces"
        );
        assert!(Endpoint::parse("https://collector:4318")
            .unwrap_err()
            .contains("only http://"));
        assert!(Endpoint::parse("collector:4318").is_err());
    }

    #[test]
    fn sampling_follows_the_ratio() {
        assert!(!Tracer::off().sample());
        let tracer = |ratio: f64| Tracer {
            inner: Some(Arc::new(Inner {
                queue: mpsc::channel(1).0,
                sample_below: (ratio * u64::MAX as f64) as u64,
            })),
        };
        let (all, none, some) = (tracer(1.0), tracer(0.0), tracer(0.25));
        let sampled = (0..10_000).filter(|_| some.sample()).count();
        assert!((2_000..3_000).contains(&sampled), "{sampled} of 10000 at 0.25");
        assert!((0..1000).all(|_| all.sample()));
        assert!((0..1000).all(|_| !none.sample()));
    }

    /// A local HTTP server in the collector's place gets the spans as OTLP
    /// JSON at /v1/traces.
    #[tokio::test]
    async fn spans_reach_the_endpoint_in_a_batch() {
        let (got, mut received) = mpsc::unbounded_channel::<serde_json::Value>();
        let app = axum::Router::new().route(
            "/base/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let got = got.clone();
                async move {
                    let _ = got.send(serde_json::from_slice(&body).unwrap());
                    "{}"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = TraceConfig {
            otlp_endpoint: format!("http://{addr}/base"),
            sample_ratio: 1.0,
        };
        let resource = Resource {
            service: "test".into(),
            instance: String::new(),
        };
        let tracer = Tracer::start(&config, resource).unwrap();
        let root = OpenSpan::start(None, tracer.sample());
        let child = OpenSpan::start(Some(&root.context), true);
        tracer.record(child.end("child", SpanKind::Producer, vec![], Status::Unset));
        tracer.record(root.end("root", SpanKind::Server, vec![], Status::Unset));
        // Not sampled: never sent.
        let unsampled = OpenSpan::start(Some(&SpanContext::root(false)), false);
        tracer.record(unsampled.end("unsampled", SpanKind::Internal, vec![], Status::Unset));
        tracer.flush(Duration::from_secs(10)).await;
        let body = received.recv().await.unwrap();
        let spans = &body["resourceSpans"][0]["scopeSpans"][0]["spans"];
        let names: Vec<_> = spans
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].clone())
            .collect();
        assert_eq!(names, ["child", "root"]);
        assert_eq!(spans[0]["parentSpanId"], root.context.span_id.to_string());
        assert_eq!(spans[0]["traceId"], spans[1]["traceId"]);
    }
}
