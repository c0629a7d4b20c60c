//! The query API's metrics, named here once.

use std::time::Duration;

use metrics::{counter, histogram};

/// A request was answered.
pub fn request(endpoint: &'static str, status: u16, elapsed: Duration) {
    counter!("readfold_serve_requests_total", "endpoint" => endpoint, "status" => status.to_string())
        .increment(1);
    histogram!("readfold_serve_request_seconds", "endpoint" => endpoint).record(elapsed.as_secs_f64());
}

/// A conversation's state came from `source` (redis, cql or none).
pub fn answered_from(source: &'static str) {
    counter!("readfold_serve_reads_total", "source" => source).increment(1);
}

/// A store read failed.
pub fn store_failed(store: &'static str) {
    counter!("readfold_serve_store_failures_total", "store" => store).increment(1);
}

/// A conversation view came from the cache (hit) or the stores (miss).
pub fn cache(hit: bool) {
    counter!("readfold_serve_cache_total", "result" => if hit { "hit" } else { "miss" }).increment(1);
}
