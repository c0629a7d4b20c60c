//! A finished span, as the exporter sends it.

use std::borrow::Cow;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::context::{SpanContext, SpanId};

/// OTLP's span kinds, numbered as its protobuf enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

/// A span's outcome; unset unless something failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Unset,
    Error(String),
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(Cow::Owned(s))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// A span that ended.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanData {
    pub context: SpanContext,
    pub parent: Option<SpanId>,
    pub name: Cow<'static, str>,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(&'static str, Value)>,
    pub status: Status,
}

/// A span under way: its context (to hand to children and headers now)
/// and its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenSpan {
    pub context: SpanContext,
    pub parent: Option<SpanId>,
    pub start_unix_nanos: u64,
}

impl OpenSpan {
    /// A span starting now: a child of `parent`, or a new trace's root.
    pub fn start(parent: Option<&SpanContext>, sampled: bool) -> OpenSpan {
        let context = match parent {
            Some(parent) => parent.child(),
            None => SpanContext::root(sampled),
        };
        OpenSpan {
            context,
            parent: parent.map(|p| p.span_id),
            start_unix_nanos: now_unix_nanos(),
        }
    }

    /// The span, ended now.
    pub fn end(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<(&'static str, Value)>,
        status: Status,
    ) -> SpanData {
        SpanData {
            context: self.context,
            parent: self.parent,
            name: name.into(),
            kind,
            start_unix_nanos: self.start_unix_nanos,
            end_unix_nanos: now_unix_nanos().max(self.start_unix_nanos),
            attributes,
            status,
        }
    }
}

/// OpenTelemetry's messaging attributes of a Kafka hop: `operation`
/// (`publish`, `process`) on `topic`, and the record's partition and
/// offset when known.
pub fn kafka_attributes(
    operation: &'static str,
    topic: &str,
    record: Option<(i32, i64)>,
) -> Vec<(&'static str, Value)> {
    let mut attributes = vec![
        ("messaging.system", Value::from("kafka")),
        ("messaging.operation", operation.into()),
        ("messaging.destination.name", topic.to_owned().into()),
    ];
    if let Some((partition, offset)) = record {
        attributes.push(("messaging.destination.partition.id", partition.to_string().into()));
        attributes.push(("messaging.kafka.offset", offset.into()));
    }
    attributes
}

/// Wall-clock time as OTLP counts it. Spans of different processes are
/// compared on it, so it is the wall clock, not a monotonic one.
fn now_unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
