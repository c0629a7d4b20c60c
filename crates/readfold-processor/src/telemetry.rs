//! Typed telemetry: every metric readfold exports is named here once.

use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter, Unit,
};
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

/// Describes every metric of the processor and starts each labelled
/// counter at zero, so that dashboards and alerts find every series from
/// the first scrape, not only after the first failure.
pub fn register() {
    describe_counter!(
        "readfold_records_in_total",
        "Input records read, per input topic."
    );
    describe_counter!(
        "readfold_records_unrouted_total",
        "Input records read one at a time from the consumer's own queue, not in batches from the queue assigned partitions are routed to: fetched before their partition was routed, or of a partition that could not be routed. 0 normally."
    );
    describe_counter!(
        "readfold_dlq_records_total",
        "Input records rejected to the dead-letter topic, per reason."
    );
    describe_counter!("readfold_dlq_published_total", "Dead-letter records committed.");
    describe_counter!(
        "readfold_flushes_total",
        "Flushes, per result (committed, failed)."
    );
    describe_histogram!(
        "readfold_flush_duration_seconds",
        Unit::Seconds,
        "Time from a flush's start until it committed or failed."
    );
    describe_counter!(
        "readfold_changelog_updates_total",
        "Cursor changes committed to the changelogs."
    );
    describe_counter!(
        "readfold_snapshots_total",
        "CQL snapshots, per result (written, failed)."
    );
    describe_counter!("readfold_snapshot_keys_total", "Keys written by CQL snapshots.");
    describe_counter!(
        "readfold_cql_warnings_total",
        "Warnings the CQL server returned with snapshot writes (the driver logs each). Above 0: a server with lower batch warning thresholds than Cassandra's defaults; lower cql.partitions_per_batch."
    );
    describe_histogram!(
        "readfold_snapshot_duration_seconds",
        Unit::Seconds,
        "Duration of one CQL snapshot."
    );
    describe_gauge!(
        "readfold_dirty_keys",
        "(conversation, user) keys waiting for the next flush."
    );
    describe_gauge!("readfold_cursors", "Cursors held in memory.");
    describe_gauge!(
        "readfold_standby_partitions",
        "Partitions the warm standby follows (state.standby): those this instance does not own."
    );
    describe_gauge!("readfold_standby_cursors", "Cursors the warm standby holds.");
    describe_gauge!(
        "readfold_standby_member_states",
        "Member-state records the warm standby holds, applied when it hands a partition over."
    );
    describe_gauge!(
        "readfold_snapshot_backlog_keys",
        "Key writes the next snapshots owe CQL, those of a snapshot in flight included: keys published to the changelog, or restored at a rebalance or restart, that CQL may not hold yet. A key published again while a snapshot pass or a restore's snapshots still owe it counts once for each, as each writes it. 0 with CQL off."
    );
    describe_gauge!(
        "readfold_consumer_paused",
        "1 while backpressure pauses the consumer."
    );
    describe_counter!(
        "readfold_fold_holds_total",
        "Times the fold stopped taking records until the flush in flight committed, the dirty set being over 4 x flush.max_dirty (a catch-up outrunning its flushes)."
    );
    describe_counter!(
        "readfold_flush_waits_total",
        "Flushes that, behind a backlog, waited a while after the last one began (flush.catch_up_interval_ms, growing with the backlog's age up to flush.catch_up_max_interval_ms), or for the fold to catch up, rather than starting as it committed."
    );
    describe_gauge!(
        "readfold_consumer_lag",
        "Input records not yet processed (end offset minus position), per partition."
    );
    describe_counter!(
        "readfold_restores_total",
        "Restores of partition state from the changelogs."
    );
    describe_counter!(
        "readfold_restored_records_total",
        "Changelog records read by restores."
    );
    describe_histogram!(
        "readfold_restore_duration_seconds",
        Unit::Seconds,
        "Duration of one restore, loading local checkpoints included."
    );
    describe_counter!(
        "readfold_rebalances_total",
        "Consumer group rebalances, per kind (assign, revoke)."
    );
    describe_counter!(
        "readfold_sink_calls_total",
        "Script calls (Redis) or statements (CQL) sent, per sink."
    );
    describe_counter!(
        "readfold_sink_raised_total",
        "Stored values actually raised, per sink."
    );
    describe_histogram!(
        "readfold_sink_write_seconds",
        Unit::Seconds,
        "Duration of one flush's write to a sink."
    );
    describe_counter!(
        "readfold_sink_failures_total",
        "Failed sink writes (retried by the next flush), per sink."
    );
    for reason in RejectReason::ALL {
        counter!("readfold_dlq_records_total", "reason" => reason.as_str()).absolute(0);
    }
    for result in ["committed", "failed"] {
        counter!("readfold_flushes_total", "result" => result).absolute(0);
    }
    for result in ["written", "failed"] {
        counter!("readfold_snapshots_total", "result" => result).absolute(0);
    }
    for kind in ["assign", "revoke"] {
        counter!("readfold_rebalances_total", "kind" => kind).absolute(0);
    }
    for sink in ["redis", "cql"] {
        counter!("readfold_sink_failures_total", "sink" => sink).absolute(0);
    }
    for name in [
        "readfold_dlq_published_total",
        "readfold_changelog_updates_total",
        "readfold_snapshot_keys_total",
        "readfold_cql_warnings_total",
        "readfold_restores_total",
        "readfold_restored_records_total",
        "readfold_fold_holds_total",
        "readfold_records_unrouted_total",
    ] {
        counter!(name).absolute(0);
    }
    dirty_keys(0);
    cursors_held(0);
    threads_held((0, 0));
    paused(false);
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

/// The warnings the CQL server has returned with this process's writes, in
/// all.
pub fn cql_warnings(total: u64) {
    counter!("readfold_cql_warnings_total").absolute(total);
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

/// Keys the next CQL snapshots write, over all partitions.
pub fn snapshot_backlog(n: usize) {
    gauge!("readfold_snapshot_backlog_keys").set(n as f64);
}

/// Cursors held in memory, over all partitions.
pub fn cursors_held(n: usize) {
    gauge!("readfold_cursors").set(n as f64);
}

/// Threads held, and thread cursors (follower entries) over them.
pub fn threads_held((threads, followers): (usize, usize)) {
    gauge!("readfold_threads").set(threads as f64);
    gauge!("readfold_thread_cursors").set(followers as f64);
}

/// What the warm standby holds: partitions followed, cursors, member-state
/// records not yet applied.
pub fn standby(stats: &readfold_kafka::standby::StandbyStats) {
    use std::sync::atomic::Ordering::Relaxed;
    gauge!("readfold_standby_partitions").set(stats.partitions.load(Relaxed) as f64);
    gauge!("readfold_standby_cursors").set(stats.cursors.load(Relaxed) as f64);
    gauge!("readfold_standby_member_states").set(stats.member_states.load(Relaxed) as f64);
}

/// A record came from the consumer's own queue, not the routed one.
pub fn unrouted() {
    counter!("readfold_records_unrouted_total").increment(1);
}

/// The fold stopped taking records until the flush in flight commits.
pub fn fold_held() {
    counter!("readfold_fold_holds_total").increment(1);
}

/// A flush waits for a catch-up's interval rather than starting at once.
pub fn flush_waited() {
    counter!("readfold_flush_waits_total").increment(1);
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
