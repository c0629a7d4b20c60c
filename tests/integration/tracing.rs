//! Tracing across the hops of a read receipt, exported over OTLP/HTTP to a
//! collector that listens here: the gateway's receipt and its produce, the
//! processor's fold up to the flush that commits it, and the gateway's
//! push of the changelog record are spans of one trace, each the child of
//! the one before, though they come from two processes and cross Kafka
//! twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use crate::gateway::{answer, chat, connect, spawn_gateway, stop, subscribe};
use crate::kit::*;

/// What a collector is sent, as OTLP's JSON encoding spells it; a field
/// not in the spec, or of the wrong type, fails the decoding.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExportRequest {
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResourceSpans {
    resource: Resource,
    scope_spans: Vec<ScopeSpans>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resource {
    attributes: Vec<KeyValue>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScopeSpans {
    scope: Scope,
    spans: Vec<Span>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scope {
    name: String,
    #[allow(dead_code)]
    version: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Span {
    trace_id: String,
    span_id: String,
    #[serde(default)]
    parent_span_id: Option<String>,
    name: String,
    kind: u8,
    start_time_unix_nano: String,
    end_time_unix_nano: String,
    attributes: Vec<KeyValue>,
    #[serde(default)]
    status: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyValue {
    key: String,
    value: AnyValue,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
enum AnyValue {
    #[serde(rename = "stringValue")]
    Str(String),
    /// A decimal string, as 64-bit integers are in OTLP JSON.
    #[serde(rename = "intValue")]
    Int(String),
    #[serde(rename = "boolValue")]
    Bool(bool),
}

/// A span as it arrived, with the service that sent it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&AnyValue> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| &kv.value)
    }

    fn nanos(text: &str) -> u64 {
        text.parse().expect("64-bit integers are decimal strings")
    }
}

/// An OTLP/HTTP receiver on a free local port: every span POSTed to
/// /v1/traces, decoded.
async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let store = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                assert_eq!(headers["content-type"], "application/json");
                let request: ExportRequest = serde_json::from_slice(&body)
                    .unwrap_or_else(|e| panic!("not OTLP JSON: {e}: {}", String::from_utf8_lossy(&body)));
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .attributes
                        .iter()
                        .find(|kv| kv.key == "service.name")
                        .map(|kv| match &kv.value {
                            AnyValue::Str(s) => s.clone(),
                            other => panic!("service.name {other:?}"),
                        })
                        .expect("every resource names its service");
                    for scope in resource.scope_spans {
                        assert_eq!(scope.scope.name, "readfold");
                        for span in scope.spans {
                            store.lock().unwrap().push(Received {
                                service: service.clone(),
                                span,
                            });
                        }
                    }
                }
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_the_receipt_the_fold_and_the_push() {
    let env = TestEnv::new("trace", 2).await;
    let (endpoint, received) = collector().await;
    let tracing = [
        ("READFOLD__TRACING__OTLP_ENDPOINT", endpoint.as_str()),
        ("READFOLD__TRACING__SAMPLE_RATIO", "1"),
    ];
    let mut reference = Reference::default();
    let processor = env.spawn_with("a", &tracing);
    chat(&env, &mut reference, "G", &["A", "B"], 3).await;
    let (gateway, addr) = spawn_gateway(&env, &tracing).await;

    let mut a = connect(&addr, "A").await;
    assert_eq!(subscribe(&mut a, "G").await["type"], "snapshot");
    let mut b = connect(&addr, "B").await;
    b.send(json!({ "type": "read", "conversation": "G", "seq": 2, "id": "r1" }))
        .await;
    let ack = answer(&mut b).await;
    assert_eq!(ack["type"], "ack", "{ack}");
    // A sees B's read: the push the trace ends with.
    let seen = a
        .until(Duration::from_secs(30), |f| {
            f["type"] == "cursor" && f["user"] == "B" && f["cursor"] == 2
        })
        .await;
    assert!(!seen.is_empty());

    let topics = &env.config.topics;
    let names = [
        "receive read receipt".to_owned(),
        format!("send {}", topics.read_reports),
        format!("process {}", topics.read_reports),
        format!("push {}", topics.read_cursors),
    ];
    // Spans go out within a second of ending; the processor's when its
    // flush commits.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let trace = loop {
        let spans = received.lock().unwrap().clone();
        let roots = spans.iter().filter(|r| r.span.name == names[0]);
        let complete = roots
            .map(|root| {
                let trace: Vec<_> = spans
                    .iter()
                    .filter(|r| r.span.trace_id == root.span.trace_id)
                    .cloned()
                    .collect();
                trace
            })
            .find(|trace| names.iter().all(|n| trace.iter().any(|r| &r.span.name == n)));
        if let Some(trace) = complete {
            break trace;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no trace with all four hops; spans received: {:#?}\ngateway:\n{}\nprocessor:\n{}",
            spans
                .iter()
                .map(|r| (&r.service, &r.span.name, &r.span.trace_id))
                .collect::<Vec<_>>(),
            gateway.log_text(),
            processor.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let by_name: HashMap<&str, &Received> = trace.iter().map(|r| (r.span.name.as_str(), r)).collect();
    let [receive, send, process, push] = names.each_ref().map(|n| by_name[n.as_str()]);

    // Each hop is the child of the one before, across processes and Kafka.
    assert_eq!(
        receive.span.parent_span_id, None,
        "the trace starts at the receipt"
    );
    assert_eq!(send.span.parent_span_id.as_ref(), Some(&receive.span.span_id));
    assert_eq!(process.span.parent_span_id.as_ref(), Some(&send.span.span_id));
    assert_eq!(push.span.parent_span_id.as_ref(), Some(&process.span.span_id));
    assert_eq!(
        [&receive.service, &send.service, &process.service, &push.service],
        [
            "readfold-gateway",
            "readfold-gateway",
            "readfold-processor",
            "readfold-gateway"
        ]
    );
    // Kinds: server, producer, consumer, consumer.
    assert_eq!(
        [
            receive.span.kind,
            send.span.kind,
            process.span.kind,
            push.span.kind
        ],
        [2, 4, 5, 5]
    );
    for r in &trace {
        assert_eq!(r.span.trace_id.len(), 32, "hex, not base64");
        assert_eq!(r.span.span_id.len(), 16);
        assert!(r.span.status.is_none(), "no hop failed: {r:?}");
        assert!(Received::nanos(&r.span.start_time_unix_nano) <= Received::nanos(&r.span.end_time_unix_nano));
    }
    // In time order: the fold begins after the produce began, the push
    // after the fold's flush committed.
    let start = |r: &Received| Received::nanos(&r.span.start_time_unix_nano);
    let end = |r: &Received| Received::nanos(&r.span.end_time_unix_nano);
    assert!(start(send) >= start(receive) && start(process) >= start(send));
    assert!(
        start(push) + 50_000_000 >= end(process),
        "the push follows the commit (50 ms of clock slack)"
    );
    // The processor's span says what it folded.
    assert!(matches!(process.attribute("readfold.conversation_id"), Some(AnyValue::Str(c)) if c == "G"));
    assert!(matches!(process.attribute("readfold.user_id"), Some(AnyValue::Str(u)) if u == "B"));
    assert!(matches!(
        process.attribute("readfold.published"),
        Some(AnyValue::Bool(true))
    ));
    assert!(
        matches!(process.attribute("messaging.kafka.offset"), Some(AnyValue::Int(o)) if o.parse::<i64>().is_ok())
    );

    // A client that traces sends its context with the receipt: the
    // receipt's spans, and all the hops after, join the client's trace.
    let client = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    b.send(json!({ "type": "read", "conversation": "G", "seq": 3, "id": "r2", "traceparent": client }))
        .await;
    assert_eq!(answer(&mut b).await["type"], "ack");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let joined = loop {
        let spans = received.lock().unwrap().clone();
        let joined: Vec<Received> = spans
            .into_iter()
            .filter(|r| r.span.trace_id == "0af7651916cd43dd8448eb211c80319c")
            .collect();
        if names.iter().all(|n| joined.iter().any(|r| &r.span.name == n)) {
            break joined;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the client's trace: {joined:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let receive = joined.iter().find(|r| r.span.name == names[0]).unwrap();
    assert_eq!(
        receive.span.parent_span_id.as_deref(),
        Some("b7ad6b7169203331"),
        "the receipt's span is the child of the client's"
    );
    stop(gateway, processor);
}
