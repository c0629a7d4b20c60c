//! Typed telemetry: every metric readfold exports is named here once.

use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter};
use readfold_core::fold::InputKind;

use readfold_wire::RejectReason;

/// Counts records read from the two input topics; the handles are looked up
/// once, not per record.
pub struct RecordsIn {
    read_reports: Counter,
    conversation_events: Counter,
}

impl RecordsIn {
    pub fn new(read_reports: &str, conversation_events: &str) -> Self {
        RecordsIn {
            read_reports: counter!("readfold_records_in_total", "topic" => read_reports.to_owned()),
            conversation_events: counter!("readfold_records_in_total", "topic" => conversation_events.to_owned()),
        }
    }

    /// A record was read from the input `kind`.
    pub fn record(&self, kind: InputKind) {
        match kind {
            InputKind::ReadReports => self.read_reports.increment(1),
            InputKind::ConversationEvents => self.conversation_events.increment(1),
        }
    }
}

/// A record went to the dead-letter topic.
pub fn dead_lettered(reason: RejectReason) {
    counter!("readfold_dlq_records_total", "reason" => reason.as_str()).increment(1);
}

/// A flush committed `changes` cursor changes and `dead_letters` DLQ records.
pub fn flush_committed(elapsed: Duration, changes: usize, dead_letters: usize) {
    counter!("readfold_flushes_total", "result" => "committed").increment(1);
    histogram!("readfold_flush_duration_seconds").record(elapsed.as_secs_f64());
    counter!("readfold_changelog_updates_total").increment(changes as u64);
    counter!("readfold_dlq_published_total").increment(dead_letters as u64);
}

/// A flush failed and will be retried.
pub fn flush_failed(elapsed: Duration) {
    counter!("readfold_flushes_total", "result" => "failed").increment(1);
    histogram!("readfold_flush_duration_seconds").record(elapsed.as_secs_f64());
}

/// A CQL snapshot of `keys` keys was written.
pub fn snapshot_written(elapsed: Duration, keys: usize) {
    counter!("readfold_snapshots_total", "result" => "written").increment(1);
    counter!("readfold_snapshot_keys_total").increment(keys as u64);
    histogram!("readfold_snapshot_duration_seconds").record(elapsed.as_secs_f64());
}

/// A CQL snapshot failed and will be retried.
pub fn snapshot_failed(elapsed: Duration) {
    counter!("readfold_snapshots_total", "result" => "failed").increment(1);
    histogram!("readfold_snapshot_duration_seconds").record(elapsed.as_secs_f64());
}

/// Keys waiting for the next flush, over all partitions.
pub fn dirty_keys(n: usize) {
    gauge!("readfold_dirty_keys").set(n as f64);
}

/// Cursors held in memory, over all partitions.
pub fn cursors_held(n: usize) {
    gauge!("readfold_cursors").set(n as f64);
}

/// Whether the consumer is paused by backpressure.
pub fn paused(on: bool) {
    gauge!("readfold_consumer_paused").set(if on { 1.0 } else { 0.0 });
}

/// Records of one input partition not yet processed (end offset minus
/// position), from librdkafka statistics every 5 s.
pub fn consumer_lag(topic: &str, partition: i32, lag: i64) {
    gauge!("readfold_consumer_lag", "topic" => topic.to_owned(), "partition" => partition.to_string())
        .set(lag as f64);
}

/// A partition was restored from the changelog.
pub fn restored(records: u64, elapsed: Duration) {
    counter!("readfold_restores_total").increment(1);
    counter!("readfold_restored_records_total").increment(records);
    histogram!("readfold_restore_duration_seconds").record(elapsed.as_secs_f64());
}

/// The consumer group assigned or revoked partitions.
pub fn rebalance(kind: &'static str) {
    counter!("readfold_rebalances_total", "kind" => kind).increment(1);
}

/// A sink accepted a flush: `calls` script calls or statements, `raised`
/// fields actually raised.
pub fn sink_written(sink: &'static str, elapsed: Duration, calls: usize, raised: u64) {
    counter!("readfold_sink_calls_total", "sink" => sink).increment(calls as u64);
    counter!("readfold_sink_raised_total", "sink" => sink).increment(raised);
    histogram!("readfold_sink_write_seconds", "sink" => sink).record(elapsed.as_secs_f64());
}

/// A sink write failed; the flush is retried.
pub fn sink_failed(sink: &'static str) {
    counter!("readfold_sink_failures_total", "sink" => sink).increment(1);
}
