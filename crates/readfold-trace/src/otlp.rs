//! OTLP/HTTP's JSON encoding of an `ExportTraceServiceRequest`
//! (<https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding>):
//! lowerCamelCase field names, trace and span ids as hex (not base64),
//! 64-bit integers as decimal strings, enums as their numbers.

use serde_json::{json, Value as Json};

use crate::span::{SpanData, Status, Value};

/// Who sends the spans: the resource every span of a request belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// `service.name`: `readfold-processor`, `readfold-gateway`, ...
    pub service: String,
    /// `service.instance.id`: the instance's id within its group.
    pub instance: String,
}

/// The instrumentation scope's name.
const SCOPE: &str = "readfold";

/// The request body for `spans`, all of one resource.
pub fn encode(resource: &Resource, spans: &[SpanData]) -> Vec<u8> {
    let mut resource_attributes = vec![attribute("service.name", &Value::from(resource.service.clone()))];
    if !resource.instance.is_empty() {
        resource_attributes.push(attribute(
            "service.instance.id",
            &Value::from(resource.instance.clone()),
        ));
    }
    let body = json!({
        "resourceSpans": [{
            "resource": { "attributes": resource_attributes },
            "scopeSpans": [{
                "scope": { "name": SCOPE, "version": env!("CARGO_PKG_VERSION") },
                "spans": spans.iter().map(span).collect::<Vec<_>>(),
            }],
        }],
    });
    serde_json::to_vec(&body).expect("JSON values always serialize")
}

fn span(span: &SpanData) -> Json {
    let mut out = json!({
        "traceId": span.context.trace_id.to_string(),
        "spanId": span.context.span_id.to_string(),
        "name": span.name,
        "kind": span.kind as i32,
        "startTimeUnixNano": span.start_unix_nanos.to_string(),
        "endTimeUnixNano": span.end_unix_nanos.to_string(),
        "attributes": span.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
    });
    if let Some(parent) = span.parent {
        out["parentSpanId"] = json!(parent.to_string());
    }
    if let Status::Error(message) = &span.status {
        out["status"] = json!({ "code": 2, "message": message });
    }
    out
}

fn attribute(key: &str, value: &Value) -> Json {
    let value = match value {
        Value::Str(s) => json!({ "stringValue": s }),
        Value::Int(n) => json!({ "intValue": n.to_string() }),
        Value::Bool(b) => json!({ "boolValue": b }),
    };
    json!({ "key": key, "value": value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{SpanContext, SpanId, TraceId};
    use crate::span::SpanKind;

    #[test]
    fn a_span_is_encoded_as_otlp_json_says() {
        let span = SpanData {
            context: SpanContext {
                trace_id: TraceId([0x4b; 16]),
                span_id: SpanId([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]),
                sampled: true,
            },
            parent: Some(SpanId([1; 8])),
            name: "process chat.read-reports".into(),
            kind: SpanKind::Consumer,
            start_unix_nanos: 1_700_000_000_000_000_001,
            end_unix_nanos: 1_700_000_000_500_000_000,
            attributes: vec![
                ("messaging.system", "kafka".into()),
                ("messaging.kafka.offset", 42i64.into()),
                ("readfold.cursor_moved", true.into()),
            ],
            status: Status::Error("flush failed".into()),
        };
        let resource = Resource {
            service: "readfold-processor".into(),
            instance: "a".into(),
        };
        let body: Json = serde_json::from_slice(&encode(&resource, &[span])).unwrap();
        let expected = json!({
            "resourceSpans": [{
                "resource": { "attributes": [
                    { "key": "service.name", "value": { "stringValue": "readfold-processor" } },
                    { "key": "service.instance.id", "value": { "stringValue": "a" } },
                ]},
                "scopeSpans": [{
                    "scope": { "name": "readfold", "version": env!("CARGO_PKG_VERSION") },
                    "spans": [{
                        "traceId": "4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b4b",
                        "spanId": "00f067aa0ba902b7",
                        "parentSpanId": "0101010101010101",
                        "name": "process chat.read-reports",
                        "kind": 5,
                        "startTimeUnixNano": "1700000000000000001",
                        "endTimeUnixNano": "1700000000500000000",
                        "attributes": [
                            { "key": "messaging.system", "value": { "stringValue": "kafka" } },
                            { "key": "messaging.kafka.offset", "value": { "intValue": "42" } },
                            { "key": "readfold.cursor_moved", "value": { "boolValue": true } },
                        ],
                        "status": { "code": 2, "message": "flush failed" },
                    }],
                }],
            }],
        });
        assert_eq!(body, expected);
    }
}
