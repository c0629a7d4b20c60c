//! Tracing across readfold's hops: a read receipt at the gateway, its
//! record on the read-reports topic, the processor's fold and the flush
//! that commits it, and the changelog record the gateway pushes from.
//!
//! Each hop hands its span's [`SpanContext`] to the next in a W3C
//! `traceparent` record header; each process exports the spans it ended
//! over OTLP/HTTP (JSON) to `tracing.otlp_endpoint`. With no endpoint the
//! [`Tracer`] is off: no header is read or written, no span is made.

pub mod context;
mod export;
pub mod otlp;
pub mod span;

use serde::Deserialize;

pub use context::SpanContext;
pub use export::Tracer;
pub use otlp::Resource;
pub use span::{kafka_attributes, OpenSpan, SpanData, SpanKind, Status, Value};

/// The `[tracing]` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// The OTLP/HTTP endpoint's base URL (`http://collector:4318`); spans
    /// go to its `/v1/traces`. Empty: tracing off.
    pub otlp_endpoint: String,
    /// The share of read receipts the gateway starts a recorded trace
    /// for; every later hop follows the gateway's decision.
    pub sample_ratio: f64,
}

impl TraceConfig {
    pub fn is_on(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }

    /// Refuses what cannot work, naming the key.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return Err(format!(
                "tracing.sample_ratio must be within 0..=1, not {}",
                self.sample_ratio
            ));
        }
        if self.is_on() {
            export::Endpoint::parse(&self.otlp_endpoint)?;
        }
        Ok(())
    }
}
