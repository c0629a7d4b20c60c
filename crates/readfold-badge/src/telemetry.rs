//! The badge stage's metrics.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter};

pub(crate) fn describe() {
    describe_counter!(
        "readfold_badge_records_in_total",
        "badge stage input records taken, by topic"
    );
    describe_gauge!(
        "readfold_consumer_lag",
        "Input records not yet processed (end offset minus position), per partition."
    );
    describe_counter!("readfold_badge_flushes_total", "badge stage flushes, by result");
    describe_counter!(
        "readfold_badge_updates_total",
        "badges published on the badges topic"
    );
    describe_histogram!("readfold_badge_flush_seconds", "one badge flush's transaction");
    describe_counter!(
        "readfold_badge_mark_all_read_reports_total",
        "read reports sent by mark-all-read"
    );
    describe_counter!(
        "readfold_badge_dlq_records_total",
        "badge stage input rejected, by reason"
    );
    describe_counter!(
        "readfold_badge_redis_failures_total",
        "failed Redis writes of badges (retried)"
    );
    describe_counter!(
        "readfold_badge_restored_records_total",
        "by-user changelog records read by restores"
    );
    describe_histogram!(
        "readfold_badge_restore_seconds",
        "one restore of the assigned partitions"
    );
    counter!("readfold_badge_flushes_total", "result" => "committed").absolute(0);
    counter!("readfold_badge_flushes_total", "result" => "failed").absolute(0);
}

pub(crate) fn flushed(badges: usize, took: Duration) {
    counter!("readfold_badge_flushes_total", "result" => "committed").increment(1);
    counter!("readfold_badge_updates_total").increment(badges as u64);
    histogram!("readfold_badge_flush_seconds").record(took.as_secs_f64());
}

pub(crate) fn flush_failed() {
    counter!("readfold_badge_flushes_total", "result" => "failed").increment(1);
}

pub(crate) fn marked_all_read(reports: usize) {
    counter!("readfold_badge_mark_all_read_reports_total").increment(reports as u64);
}

pub(crate) fn dead_letter(reason: &'static str) {
    counter!("readfold_badge_dlq_records_total", "reason" => reason).increment(1);
}

pub(crate) fn redis_failed() {
    counter!("readfold_badge_redis_failures_total").increment(1);
}

pub(crate) fn restored(records: u64, took: Duration) {
    counter!("readfold_badge_restored_records_total").increment(records);
    histogram!("readfold_badge_restore_seconds").record(took.as_secs_f64());
}

/// The input counter of `topic`, held so that a record costs no lookup.
pub(crate) fn records_in(topic: &str) -> Counter {
    counter!("readfold_badge_records_in_total", "topic" => topic.to_owned())
}

/// Records of one input partition not yet taken (end offset minus
/// position), from librdkafka statistics; the processor's gauge, so that one
/// alert covers both stages.
pub(crate) fn consumer_lag(topic: &str, partition: i32, lag: i64) {
    gauge!("readfold_consumer_lag", "topic" => topic.to_owned(), "partition" => partition.to_string())
        .set(lag as f64);
}
