//! The badge stage's metrics.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_histogram, histogram};

pub(crate) fn describe() {
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
