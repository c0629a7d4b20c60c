//! `readfold-bench throughput --records N`: how fast readfold catches up on
//! a backlog, next to a raw read of the same topics. Produces N records (the
//! replay bench's chat workload) onto fresh input topics, then times:
//! - a raw read of both inputs with librdkafka, no decode (the ceiling):
//!   in this process, batched, no group, timed from its first read to its
//!   last;
//! - the same read as a plain group consumer in a process of its own
//!   ([`crate::raw_consumer`], as `kcat -G` would), timed as `readfold run`
//!   is: the like-for-like reference;
//! - `readfold run` as a child process, Redis and CQL off, then on, each
//!   with its own group and output topics, from the start of the process
//!   until the group's committed offsets reach the end of both inputs;
//! - the seed design's consumer ([`crate::seed_design`]): a Redis EVALSHA
//!   per report, then pipelined per poll.
//!
//! The child's CPU time and peak RSS come from /proc, and the sink calls
//! from its own /metrics. Each row also shows what Redis and a local broker
//! spent meanwhile ([`crate::server_cpu`]): they share the machine.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use readfold::config::Config;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::producer::InputProducer;
use readfold_kafka::reader::{partition_ids, watermarks_of};

use crate::child::{
    config_vars, cpu_secs_of, free_addr, peak_rss_of, scrape, spawn, spawn_own_piped, ChildGuard,
};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics};
use crate::kstreams_peer;
use crate::server_cpu::{ServerClocks, ServerCpu};
use crate::stats::median_run;

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Records (reports and conversation events) of the backlog.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,
    /// Times the raw consumer process and readfold rows run, taking turns,
    /// each on its own group, output topics and Redis keys; each row shows
    /// its median run, and the lines below every run's rate and share of
    /// the raw consumer process.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Whether the peers run too: the seed design's consumer (per report,
    /// and pipelined) and the Kafka Streams peer. Without them it shows the
    /// raw reads and readfold.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub peers: bool,
}

/// One timed pass over the backlog.
#[derive(Clone, Debug)]
pub struct ThroughputRow {
    pub what: &'static str,
    pub records: u64,
    pub secs: f64,
    pub cpu_secs: f64,
    /// Peak resident memory of the process that did the work (0: unknown).
    pub peak_rss: u64,
    pub redis_calls: f64,
    pub cql_statements: f64,
    /// Flushes committed (readfold rows; 0 for the others).
    pub flushes: f64,
    /// What the servers used while the row ran (the table shows Redis and
    /// the broker).
    pub servers: ServerCpu,
}

/// What a throughput run measured.
#[derive(Clone, Debug)]
pub struct ThroughputFigures {
    pub reports: u64,
    pub events: u64,
    /// The rows shown: for the raw consumer process and readfold, the run
    /// of median rate.
    pub rows: Vec<ThroughputRow>,
    /// Every run of the raw consumer process and readfold rows, in the
    /// order they ran: one `[process, sinks off, sinks on]` per turn.
    pub turns: Vec<Vec<ThroughputRow>>,
    /// Rows that could not run, and why.
    pub notes: Vec<String>,
}

/// The readfold rows, with Redis and CQL off and on.
const READFOLD_ROWS: [(&str, &str, bool); 2] = [
    ("readfold, Redis and CQL off", "off", false),
    ("readfold, Redis and CQL on", "on", true),
];

/// The rate (records/s over both inputs) at which `readfold run`, Redis and
/// CQL on, catches up on a backlog of `records`: the latency bench's 100%.
pub async fn readfold_max_rate(config: &Config, records: u64) -> Result<f64> {
    let config = on_fresh_topics(config, "max-rate");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let (reports, events) = crate::replay::produce(&producer, records).await?;
    drop(producer);
    let (what, tag, sinks) = READFOLD_ROWS[1];
    let run = with_own_outputs(&config, tag);
    ensure_topics(&run.kafka, &run.topics).await?;
    let row = catch_up(&run, what, sinks, reports + events).await;
    let mut topics_made: Vec<String> = config.topics.names().into_iter().cloned().collect();
    topics_made.extend(run.topics.names().into_iter().cloned());
    topics_made.sort();
    topics_made.dedup();
    delete_bench_topics(&config.kafka, &topics_made).await?;
    delete_bench_keys(&config.redis).await;
    let row = row?;
    Ok(row.records as f64 / row.secs.max(1e-9))
}

/// `config` with a group, output topics and Redis keys of its own, named
/// after `tag`, so that each timed run starts from nothing on the same
/// inputs (on keys an earlier run wrote, Redis would have less to change).
fn with_own_outputs(config: &Config, tag: &str) -> Config {
    let mut run = config.clone();
    run.kafka.group_id = format!("{}-{tag}", config.kafka.group_id);
    // Under the bench's prefix, so that deleting its keys deletes these.
    run.redis.key_prefix = format!("{}:{tag}", config.redis.key_prefix);
    let t = &mut run.topics;
    for topic in [
        &mut t.read_cursors,
        &mut t.user_read_cursors,
        &mut t.member_state,
        &mut t.thread_cursors,
        &mut t.user_thread_cursors,
        &mut t.thread_state,
        &mut t.dlq,
    ] {
        topic.push_str(&format!("-{tag}"));
    }
    run
}

/// Produces `records` records, then times each way of reading them; the raw
/// consumer process and readfold `runs` times each, taking turns, so that a
/// slow spell of the box hits each alike. The peers run once, if `peers`.
pub async fn throughput(config: &Config, args: &Args) -> Result<ThroughputFigures> {
    let (records, runs, peers) = (args.records, args.runs, args.peers);
    let config = on_fresh_topics(config, "throughput");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let mut expected = kstreams_peer::Expected::new();
    let (reports, events) =
        crate::replay::produce_seeing(&producer, records, |r| kstreams_peer::expect(&mut expected, r))
            .await?;
    drop(producer);
    let total = reports + events;

    let clocks = ServerClocks::new(&config).await;
    let raw = config.clone();
    let mut rows = vec![
        timed(&clocks, async move {
            tokio::task::spawn_blocking(move || -> Result<ThroughputRow> {
                let (cpu, started) = (cpu_secs_of("self"), Instant::now());
                let read = crate::replay::raw_read(&raw)?;
                Ok(ThroughputRow {
                    what: "raw read (librdkafka, no decode)",
                    records: read,
                    secs: started.elapsed().as_secs_f64(),
                    cpu_secs: cpu_secs_of("self") - cpu,
                    peak_rss: 0,
                    redis_calls: 0.0,
                    cql_statements: 0.0,
                    flushes: 0.0,
                    servers: ServerCpu::default(),
                })
            })
            .await
            .map_err(Error::task("raw read"))?
        })
        .await?,
    ];

    let mut topics_made: Vec<String> = config.topics.names().into_iter().cloned().collect();
    let mut turns = Vec::new();
    for turn in 1..=runs.max(1) {
        let suffix = if turn == 1 {
            String::new()
        } else {
            format!("-{turn}")
        };
        // The same read as a group consumer process, timed as readfold is.
        let process = with_own_outputs(&config, &format!("raw{suffix}"));
        let mut rows = vec![timed(&clocks, raw_consumer_process(&process, total)).await?];
        for (what, tag, sinks) in READFOLD_ROWS {
            let run = with_own_outputs(&config, &format!("{tag}{suffix}"));
            ensure_topics(&run.kafka, &run.topics).await?;
            topics_made.extend(run.topics.names().into_iter().cloned());
            rows.push(timed(&clocks, catch_up(&run, what, sinks, total)).await?);
        }
        turns.push(rows);
    }
    for i in 0..turns[0].len() {
        let runs: Vec<ThroughputRow> = turns.iter().map(|turn| turn[i].clone()).collect();
        rows.extend(median_run(&runs, |run| run.secs));
    }
    let mut notes = Vec::new();
    if peers {
        let ran = peer_rows(&config, &clocks, layout.partitions, reports, expected).await?;
        rows.extend(ran.rows);
        topics_made.extend(ran.topics);
        notes.extend(ran.notes);
    } else {
        notes.push("peers skipped (--peers false)".to_owned());
    }
    topics_made.sort();
    topics_made.dedup();
    delete_bench_topics(&config.kafka, &topics_made).await?;
    delete_bench_keys(&config.redis).await;
    Ok(ThroughputFigures {
        reports,
        events,
        rows,
        turns,
        notes,
    })
}

/// What the peers ran: their rows, the topics they made and why any was
/// skipped.
#[derive(Default)]
struct PeerRows {
    rows: Vec<ThroughputRow>,
    topics: Vec<String>,
    notes: Vec<String>,
}

/// The seed design's consumer, per report and pipelined per poll, then
/// Kafka Streams doing the same fold, where Maven and Java are here.
async fn peer_rows(
    config: &Config,
    clocks: &ServerClocks,
    partitions: i32,
    reports: u64,
    expected: kstreams_peer::Expected,
) -> Result<PeerRows> {
    let mut peers = PeerRows::default();
    let events_topic = format!("{}.seed-events", config.topics.read_reports);
    readfold_kafka::admin::create_topic(&config.kafka, &events_topic, partitions, 1, false).await?;
    for pipelined in [false, true] {
        let run = config.clone();
        let row = timed(clocks, async move {
            tokio::task::spawn_blocking(move || crate::seed_design::seed_design(&run, pipelined, reports))
                .await
                .map_err(Error::task("seed design"))?
        });
        peers.rows.push(row.await?);
    }
    peers.topics.push(events_topic);
    match kstreams_peer::unavailable(config) {
        Some(why) => peers.notes.push(format!("Kafka Streams peer skipped: {why}")),
        None => {
            let mut run = config.clone();
            run.kafka.group_id = format!("{}-kstreams", config.kafka.group_id);
            run.topics.read_cursors.push_str("-kstreams");
            run.topics.user_read_cursors.push_str("-kstreams");
            ensure_topics(&run.kafka, &run.topics).await?;
            peers.topics.extend(run.topics.names().into_iter().cloned());
            peers.topics.extend(kstreams_peer::internal_topics(&run));
            let row = timed(clocks, async move {
                tokio::task::spawn_blocking(move || kstreams_peer::kstreams_peer(&run, expected, reports))
                    .await
                    .map_err(Error::task("kstreams peer"))?
            });
            peers.rows.push(row.await?);
        }
    }
    Ok(peers)
}

/// Runs a row, with what the servers used meanwhile.
async fn timed(
    clocks: &ServerClocks,
    row: impl std::future::Future<Output = Result<ThroughputRow>>,
) -> Result<ThroughputRow> {
    let before = clocks.read().await;
    let mut row = row.await?;
    row.servers = clocks.read().await.since(before);
    Ok(row)
}

/// Runs `readfold run` on `config` until its group committed every input
/// record.
async fn catch_up(config: &Config, what: &'static str, sinks: bool, records: u64) -> Result<ThroughputRow> {
    let metrics = free_addr()?.to_string();
    let mut vars = config_vars(config);
    vars.extend(
        [
            ("READFOLD__REDIS__ENABLED", sinks.to_string()),
            ("READFOLD__CQL__ENABLED", sinks.to_string()),
            ("READFOLD__METRICS__LISTEN", metrics.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let (child, secs) = until_committed(config, || spawn("run", &vars)).await?;
    let pid = child.pid();
    let cpu_secs = cpu_secs_of(&pid.to_string());
    let peak_rss = peak_rss_of(pid);
    let scraped = scrape(&metrics).unwrap_or_default();
    drop(child);
    Ok(ThroughputRow {
        what,
        records,
        secs,
        cpu_secs,
        peak_rss,
        redis_calls: metric(&scraped, "readfold_sink_calls_total{sink=\"redis\"}"),
        cql_statements: metric(&scraped, "readfold_sink_calls_total{sink=\"cql\"}"),
        flushes: metric(&scraped, "readfold_flushes_total{result=\"committed\"}"),
        servers: ServerCpu::default(),
    })
}

/// Runs `readfold-bench raw-consume` ([`crate::raw_consumer`]) on `config`, timed
/// as [`catch_up`] times `readfold run`.
async fn raw_consumer_process(config: &Config, records: u64) -> Result<ThroughputRow> {
    let vars = config_vars(config);
    let (mut child, secs) = until_committed(config, || spawn_own_piped("raw-consume", &[], &vars)).await?;
    // It exits right after its commit; it prints its own usage first.
    let usage = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut line = String::new();
        if let Some(mut out) = child.0.stdout.take() {
            let _ = out.read_to_string(&mut line);
        }
        let _ = child.0.wait();
        crate::raw_consumer::parse_usage(&line).ok_or(Error::NoUsage { output: line })
    })
    .await
    .map_err(Error::task("raw consumer"))??;
    let (cpu_secs, peak_rss) = usage;
    Ok(ThroughputRow {
        what: "raw consumer process (librdkafka)",
        records,
        secs,
        cpu_secs,
        peak_rss,
        redis_calls: 0.0,
        cql_statements: 0.0,
        flushes: 0.0,
        servers: ServerCpu::default(),
    })
}

/// Starts a child and waits until `config`'s group committed the end of
/// both inputs: the child, and the seconds from its start.
async fn until_committed(
    config: &Config,
    start: impl FnOnce() -> Result<ChildGuard>,
) -> Result<(ChildGuard, f64)> {
    let watch = config.clone();
    let ends = tokio::task::spawn_blocking(move || end_offsets(&watch))
        .await
        .map_err(Error::task("end offsets"))??;
    let started = Instant::now();
    let child = start()?;
    tracing::debug!(pid = child.pid(), group = %config.kafka.group_id, "child started");
    let secs = watch_commits(config, ends, started, child.pid())
        .await?
        .as_secs_f64();
    tracing::debug!(
        pid = child.pid(),
        secs,
        "child's group committed the end of both inputs"
    );
    Ok((child, secs))
}

/// The settings of a consumer in `config`'s group that only asks for
/// offsets, never commits.
fn watcher_config(config: &Config) -> ClientConfig {
    let mut watch = config.kafka.client_config();
    watch
        .set("group.id", &config.kafka.group_id)
        .set("enable.auto.commit", "false");
    watch
}

/// The settings of the consumer that watches a group's commits. Asked with
/// librdkafka's default read_committed, the broker answers a group whose
/// transaction has offsets pending with UNSTABLE_OFFSET_COMMIT (KIP-447's
/// require_stable), and librdkafka asks again after a backoff that doubles
/// up to retry.backoff.max.ms (1 s). A processor that commits transaction
/// after transaction nearly always has one pending, so its last commit
/// would be seen a backoff later than it landed, which would count against
/// it and not against the raw consumer, whose commits are plain. Asked with
/// read_uncommitted, the broker answers at once with the offsets committed
/// so far: a pending transaction's offsets are not among them until it
/// commits.
fn commit_watcher_config(config: &Config) -> ClientConfig {
    let mut watch = watcher_config(config);
    watch.set("isolation.level", "read_uncommitted");
    watch
}

/// The next offset past the last record of every input partition.
pub fn end_offsets(config: &Config) -> Result<TopicPartitionList> {
    end_offsets_of(
        config,
        &[&config.topics.read_reports, &config.topics.conversation_events],
    )
}

/// The next offset past the last record of every partition of `topics`.
pub fn end_offsets_of(config: &Config, topics: &[&String]) -> Result<TopicPartitionList> {
    let consumer: BaseConsumer = watcher_config(config).create()?;
    let mut ends = TopicPartitionList::new();
    for topic in topics {
        let partitions = partition_ids(&consumer, topic)?;
        let watermarks = watermarks_of(&consumer, topic, &partitions, Duration::from_secs(10))?;
        for (p, (_, high)) in partitions.into_iter().zip(watermarks) {
            ends.add_partition_offset(topic, p, Offset::Offset(high))?;
        }
    }
    Ok(ends)
}

/// How long the commit watch goes on asking for a group's offsets after its
/// child exited, while the reads fail.
const EXITED_READ_GRACE: Duration = Duration::from_secs(10);

/// [`wait_for_commits`] on a blocking thread: its polls would hold up the
/// runtime.
pub async fn watch_commits(
    config: &Config,
    ends: TopicPartitionList,
    started: Instant,
    pid: u32,
) -> Result<Duration> {
    let watch = config.clone();
    tokio::task::spawn_blocking(move || wait_for_commits(&watch, &ends, started, pid))
        .await
        .map_err(Error::task("commit watch"))?
}

/// Polls the group's committed offsets until every one reached `ends`, and
/// gives the time from `started` until it saw them there, or fails once the
/// child process `pid`, which should commit them, has exited without doing
/// so (a bad setting or a crash would otherwise leave the bench waiting
/// 900 s). The time is taken before the watching consumer is dropped: its
/// close waits for the client's threads to wind down, which would count
/// against every process timed.
fn wait_for_commits(
    config: &Config,
    ends: &TopicPartitionList,
    started: Instant,
    pid: u32,
) -> Result<Duration> {
    let consumer: BaseConsumer = commit_watcher_config(config).create()?;
    let mut wanted = TopicPartitionList::new();
    for e in ends.elements() {
        wanted.add_partition(e.topic(), e.partition());
    }
    let mut exited_at: Option<Instant> = None;
    loop {
        // Read before the offsets: a child that commits, then exits (the raw
        // consumer does), is seen to have committed.
        let exited = has_exited(pid);
        if started.elapsed() > Duration::from_secs(900) {
            return Err(Error::timeout(
                format!("group {} did not commit the whole backlog", config.kafka.group_id),
                900,
            ));
        }
        let read = consumer.committed_offsets(wanted.clone(), Duration::from_secs(5));
        if let Ok(committed) = &read {
            let caught_up = ends.elements().iter().all(|end| {
                committed
                    .find_partition(end.topic(), end.partition())
                    .is_some_and(|c| match (c.offset(), end.offset()) {
                        (Offset::Offset(c), Offset::Offset(e)) => c >= e,
                        (_, Offset::Offset(0)) => true,
                        _ => false,
                    })
            });
            if caught_up {
                return Ok(started.elapsed());
            }
        }
        if exited {
            // A failed read says nothing about the commits: the group's
            // coordinator can be busy just as the child exits. Ask again
            // for a while before calling the child's run failed.
            let since = *exited_at.get_or_insert_with(Instant::now);
            if read.is_ok() || since.elapsed() > EXITED_READ_GRACE {
                return Err(Error::ExitedUncommitted {
                    group: config.kafka.group_id.clone(),
                    pid,
                    unread: read.err(),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid`, a child of this one, has exited: gone, or a
/// zombie its parent has not reaped yet.
fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => crate::child::stat_field(&stat, 0).is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}

/// The value of the Prometheus sample named `series` (0 when absent).
pub fn metric(scraped: &str, series: &str) -> f64 {
    scraped
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

pub fn print_throughput(f: &ThroughputFigures) {
    let raw_secs = f.rows.first().map_or(1.0, |r| r.secs);
    // The consumer process, when it ran (its row follows the raw read).
    let process_secs = f
        .rows
        .iter()
        .find(|r| r.what.starts_with("raw consumer process"))
        .map(|r| r.secs);
    println!(
        "catching up on a backlog of {} reports and {} conversation events (share: of the raw read; of proc.: of the raw consumer process; readfold and that process timed from process start until their group's committed offsets reach the end; the seed design reads the reports only, in this process, until its events are acknowledged; the Kafka Streams peer folds the reports only, in its own JVM, timed from its start until its output holds every cursor):",
        f.reports, f.events
    );
    println!(
        "  {:<36} {:>10} {:>8} {:>10} {:>15} {:>9} {:>13} {:>13} {:>13} {:>13}",
        "",
        "reports/s",
        "share",
        "of proc.",
        "CPU-s per 1M r",
        "peak RSS",
        "Redis calls/r",
        "CQL stmts/r",
        "Redis CPU/1M",
        "broker CPU/1M"
    );
    let per = |n: f64| n / f.reports.max(1) as f64;
    let per_million = |secs: Option<f64>| secs.map_or("-".to_owned(), |s| format!("{:.2}", per(s * 1e6)));
    for r in &f.rows {
        let rss = if r.peak_rss == 0 {
            "-".to_owned()
        } else {
            format!("{} MB", r.peak_rss / 1_000_000)
        };
        let of_process = process_secs.map_or("-".to_owned(), |p| format!("{:.2}", p / r.secs.max(1e-9)));
        println!(
            "  {:<36} {:>10.0} {:>8.2} {:>10} {:>15.2} {:>9} {:>13.4} {:>13.4} {:>13} {:>13}",
            r.what,
            f.reports as f64 / r.secs.max(1e-9),
            raw_secs / r.secs.max(1e-9),
            of_process,
            per(r.cpu_secs * 1e6),
            rss,
            per(r.redis_calls),
            per(r.cql_statements),
            per_million(r.servers.redis),
            per_million(r.servers.broker),
        );
    }
    println!("  (Redis CPU/1M, broker CPU/1M: CPU-s those servers used while the row ran, per 1M reports; the broker's only when it runs on this machine)");
    if f.rows
        .iter()
        .any(|r| r.what.starts_with("readfold") && r.cql_statements == 0.0 && r.redis_calls > 0.0)
    {
        println!(
            "  (no CQL statements in the readfold runs: most likely each took less than snapshot.interval_ms, so no snapshot fell within it)"
        );
    }
    if f.turns.len() > 1 {
        println!(
            "  (the raw consumer process and readfold rows: the median of {} runs taking turns; each run's reports/s and share of the raw consumer process of its turn, in the order they ran:)",
            f.turns.len()
        );
        for i in 0..f.turns[0].len() {
            let runs: Vec<String> = f
                .turns
                .iter()
                .map(|turn| {
                    let (process, row) = (&turn[0], &turn[i]);
                    let rate = f.reports as f64 / row.secs.max(1e-9);
                    if i == 0 {
                        format!("{rate:.0}")
                    } else {
                        format!("{rate:.0} ({:.2})", process.secs / row.secs.max(1e-9))
                    }
                })
                .collect();
            println!("  {:<36} {}", f.turns[0][i].what, runs.join(", "));
        }
    }
    if let Some(flushes) = flush_counts(f) {
        println!("  ({flushes})");
    }
    for note in &f.notes {
        println!("  ({note})");
    }
}

/// How many flushes each readfold run committed, in the order they ran: a
/// catch-up's pacing at work (fewer, larger flushes write each key fewer
/// times).
fn flush_counts(f: &ThroughputFigures) -> Option<String> {
    let rows: Vec<String> = READFOLD_ROWS
        .iter()
        .filter_map(|(what, tag, _)| {
            let runs: Vec<String> = f
                .turns
                .iter()
                .flatten()
                .filter(|r| r.what == *what)
                .map(|r| format!("{:.0}", r.flushes))
                .collect();
            (!runs.is_empty()).then(|| format!("sinks {tag} {}", runs.join(", ")))
        })
        .collect();
    (!rows.is_empty()).then(|| format!("flushes committed by each readfold run: {}", rows.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(secs: f64) -> ThroughputRow {
        ThroughputRow {
            what: "readfold",
            records: 1,
            secs,
            cpu_secs: secs,
            peak_rss: 0,
            redis_calls: 0.0,
            cql_statements: 0.0,
            flushes: 0.0,
            servers: ServerCpu::default(),
        }
    }

    #[test]
    fn the_commit_watch_reads_committed_offsets_without_waiting_for_stable_ones() {
        // A user's isolation level (here from the environment) must not
        // bring back the waits for pending transactional offsets.
        let env = [
            ("READFOLD__KAFKA__GROUP_ID".to_owned(), "g".to_owned()),
            (
                "READFOLD__KAFKA__PROPERTIES__ISOLATION_LEVEL".to_owned(),
                "read_committed".to_owned(),
            ),
        ];
        let config = Config::from_sources(None, env).unwrap();
        let watch = commit_watcher_config(&config);
        assert_eq!(watch.get("isolation.level"), Some("read_uncommitted"));
        assert_eq!(watch.get("group.id"), Some("g"));
        assert_eq!(watch.get("enable.auto.commit"), Some("false"));
    }

    #[test]
    fn the_median_run_is_the_middle_one_or_the_slower_middle_one() {
        let median = |secs: &[f64]| {
            let runs: Vec<ThroughputRow> = secs.iter().map(|&s| row(s)).collect();
            median_run(&runs, |run| run.secs).unwrap().secs
        };
        assert_eq!(median(&[2.0]), 2.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn flush_counts_list_each_readfold_run_in_order() {
        let run = |what: &'static str, flushes: f64| ThroughputRow {
            what,
            flushes,
            ..row(1.0)
        };
        let (off, on) = (READFOLD_ROWS[0].0, READFOLD_ROWS[1].0);
        let turn = |a: f64, b: f64| {
            vec![
                run("raw consumer process (librdkafka)", 0.0),
                run(off, a),
                run(on, b),
            ]
        };
        let mut figures = ThroughputFigures {
            reports: 1,
            events: 0,
            rows: Vec::new(),
            turns: vec![turn(7.0, 2.0), turn(8.0, 3.0)],
            notes: Vec::new(),
        };
        assert_eq!(
            flush_counts(&figures).unwrap(),
            "flushes committed by each readfold run: sinks off 7, 8; sinks on 2, 3"
        );
        figures.turns.clear();
        assert_eq!(flush_counts(&figures), None);
    }

    #[test]
    fn a_child_that_exited_is_seen_to_have_exited_before_it_is_reaped() {
        let mut running = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!has_exited(running.id()));
        running.kill().unwrap();
        // Killed, not yet reaped: a zombie.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !has_exited(running.id()) {
            assert!(Instant::now() < deadline, "a killed child never showed as exited");
            std::thread::sleep(Duration::from_millis(10));
        }
        running.wait().unwrap();
        // Reaped: gone from /proc.
        assert!(has_exited(running.id()));
    }

    #[test]
    fn metric_reads_one_labelled_sample() {
        let scraped = "# TYPE readfold_sink_calls_total counter\n\
                       readfold_sink_calls_total{sink=\"redis\"} 42\n\
                       readfold_sink_calls_total{sink=\"cql\"} 7\n";
        assert_eq!(metric(scraped, "readfold_sink_calls_total{sink=\"cql\"}"), 7.0);
        assert_eq!(metric(scraped, "readfold_missing"), 0.0);
    }
}
