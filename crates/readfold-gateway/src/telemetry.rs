//! The gateway's metrics, named here once.

use metrics::{counter, gauge, histogram};

/// Connections opened (+1) or closed (-1).
pub fn connections(delta: i64) {
    gauge!("readfold_gateway_connections").increment(delta as f64);
}

/// A frame was written to a client.
pub fn frame_sent() {
    counter!("readfold_gateway_frames_sent_total").increment(1);
}

/// An unsent update was replaced by a newer one for the same key.
pub fn coalesced() {
    counter!("readfold_gateway_frames_coalesced_total").increment(1);
}

/// A read receipt or mark was produced; `result` is ok or error.
pub fn produced(result: &'static str, seconds: f64) {
    counter!("readfold_gateway_receipts_total", "result" => result).increment(1);
    histogram!("readfold_gateway_produce_seconds").record(seconds);
}

/// A changelog record was routed.
pub fn routed(topic: &'static str) {
    counter!("readfold_gateway_changelog_records_total", "changelog" => topic).increment(1);
}
