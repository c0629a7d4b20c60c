//! `readfold-bench latency --seconds S`: report-to-changelog and
//! report-to-Redis latency at fixed offered rates, 10% to 90% of a maximum.
//! `readfold run` (Redis and CQL on) is a child process on fresh topics;
//! the bench produces the chat workload at each rate for S seconds, with
//! every record stamped with its send time, and:
//! - follows `read-cursors` (read_committed): a record's latency is its
//!   arrival minus its `updated_at`, the send time of the newest input that
//!   moved it;
//! - sends 50 probe reports per second to conversations of their own and
//!   polls Redis until each shows up.
//!
//! Each step also shows the cores readfold and the servers used during it,
//! and how long their threads waited for one: on a small machine they
//! share the cores, and a CQL server writing a snapshot can take most of
//! them for a while.
//!
//! An unrecorded warm-up at 50% (as long as a step, at most 5 s) comes
//! first. The maximum is `--max-rate`, or, when that is 0, the highest
//! live rate the pipeline sustains here, found by offering rates to the
//! same processor before the warm-up ([`crate::sustained`]); with
//! `--max-from catch-up`, the rate at which `readfold run` catches up on a
//! backlog of 500,000 records here instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_core::Seq;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_store::redis::RedisStore;
use readfold_wire::codec::{ReadAction, ReadReportRecord};

use crate::child::{config_vars, cpu_secs_of, free_addr, spawn};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics, ChangelogFollower};
use crate::run_queue::ThreadWaits;
use crate::server_cpu::{Priorities, ServerClocks, ServerCpu, ServerWaits};
use crate::stats::{median_run, percentile};
use crate::sustained::{self, RateSearch, SearchStep};
use crate::workload::{ChatWorkload, Generated};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Seconds per offered rate, after an unrecorded warm-up at 50%.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// The maximum rate (records/s) the rows take fractions of; 0: measure
    /// it first, as --max-from says.
    #[arg(long, default_value_t = 0.0)]
    pub max_rate: f64,
    /// Where the maximum comes from when --max-rate is 0: sustained, the
    /// highest live rate the pipeline keeps up with here, found by offering
    /// rates to the same processor before the rows; catch-up, the rate at
    /// which it catches up on a backlog of 500,000 records (no live rate).
    #[arg(long, value_enum, default_value_t = MaxRateFrom::Sustained)]
    pub max_from: MaxRateFrom,
    /// Times the bench runs, each with a processor and topics of its own,
    /// at the same rates; each row shows its median run by the
    /// report-to-changelog p99, and the lines below every run's p99.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
}

/// The offered rates, as fractions of the maximum.
const FRACTIONS: [f64; 5] = [0.1, 0.3, 0.5, 0.7, 0.9];
/// The backlog whose catch-up rate is the maximum, when none is given.
const MAX_RATE_BACKLOG: u64 = 500_000;
/// Probe reports per second, each timed to Redis.
const PROBES_PER_SEC: u64 = 50;
/// Probe conversations (spread over the partitions).
const PROBE_CONVERSATIONS: u64 = 12;

/// Where the maximum comes from when none is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MaxRateFrom {
    /// The highest live rate the pipeline sustains on this machine, found
    /// by offering rates before the rows.
    Sustained,
    /// The rate at which `readfold run` catches up on a backlog: no live
    /// rate, kept to compare with earlier figures.
    CatchUp,
}

/// Where a run's maximum came from.
#[derive(Clone, Debug)]
pub enum MaxFrom {
    Given,
    CatchUp,
    /// Found live; the rates offered, in the order they were.
    Sustained {
        steps: Vec<SearchStep>,
        step_seconds: u64,
    },
}

/// Every changelog record since the follower started: (updated_at,
/// arrival) in ms.
type Arrivals = Arc<Mutex<Vec<(i64, i64)>>>;

/// One offered rate's figures.
#[derive(Clone, Debug)]
pub struct LatencyRow {
    pub fraction: f64,
    pub offered: f64,
    pub achieved: f64,
    /// Report-to-changelog, sorted, ms.
    pub changelog_ms: Vec<f64>,
    /// Report-to-Redis of the probes, sorted, ms.
    pub redis_ms: Vec<f64>,
    /// The cores readfold and the servers used during the step.
    pub cores: StepCores,
}

/// Cores (CPU seconds per second) used during one step, by readfold and by
/// each server whose CPU time is known, and how long their threads waited
/// for a core.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepCores {
    pub readfold: f64,
    /// This process: the load, the changelog follower, the Redis poller.
    pub bench: f64,
    pub servers: ServerCpu,
    pub waiting: StepWaits,
}

/// Seconds per second that each process's threads were ready to run but
/// waited for a core during one step, summed over its threads (1.00: one
/// thread kept waiting all along); None where Linux does not say.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepWaits {
    pub readfold: Option<f64>,
    pub bench: Option<f64>,
    pub servers: ServerWaits,
}

/// What a latency run measured.
#[derive(Clone, Debug)]
pub struct LatencyFigures {
    pub max_rate: f64,
    pub max_from: MaxFrom,
    /// Whether the processor wrote CQL snapshots (`cql.enabled`).
    pub cql: bool,
    pub rows: Vec<LatencyRow>,
    /// The unrecorded warm-up at 50% before the rows, in seconds.
    pub warmup_seconds: u64,
    /// A local broker's and CQL server's CPU priorities.
    pub priorities: Option<Priorities>,
}

pub async fn latency(
    config: &Config,
    seconds: u64,
    max_rate: f64,
    max_rate_from: MaxRateFrom,
) -> Result<LatencyFigures> {
    // A catch-up runs on topics of its own, before this run's processor.
    let caught_up = if max_rate <= 0.0 && max_rate_from == MaxRateFrom::CatchUp {
        Some(crate::throughput::readfold_max_rate(config, MAX_RATE_BACKLOG).await?)
    } else {
        None
    };

    let config = on_fresh_topics(config, "latency");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let metrics = free_addr()?;
    let mut vars = config_vars(&config);
    vars.push(("READFOLD__METRICS__LISTEN".into(), metrics.to_string()));
    let mut child = spawn("run", &vars)?;
    let clocks = ServerClocks::new(&config).await;

    let arrivals: Arrivals = Arc::default();
    let follower = ChangelogFollower::start(&config, {
        let arrivals = arrivals.clone();
        move |update, arrived| {
            arrivals
                .lock()
                .expect("bench lock")
                .push((update.updated_at, arrived))
        }
    })?;
    let following = follower.running();

    let producer = Arc::new(InputProducer::new(
        &config.kafka,
        &config.topics,
        layout.partitions,
    )?);
    let redis = Arc::new(RedisStore::connect(&config.redis).await?);
    let mut cursors = ProbeCursors::watch(redis, following.clone());
    let probe_seq = 1i64;
    // Start-up: the processor joins, restores, and a first probe lands.
    let warming = Instant::now();
    loop {
        if let Some(status) = child.exited() {
            return Err(Error::Exited {
                child: "readfold run",
                status,
                when: "before it answered a probe",
            });
        }
        match probe(&producer, &mut cursors, 0, probe_seq, Duration::from_secs(5)).await {
            Ok(_) => break,
            Err(e) if warming.elapsed() > Duration::from_secs(120) => return Err(e),
            Err(_) => {}
        }
    }

    let mut workload = ChatWorkload::new("");
    let mut load = Load {
        producer,
        cursors,
        workload: &mut workload,
        probe_seq,
        clocks: &clocks,
        readfold_pid: child.pid().to_string(),
    };
    let (max_rate, max_from) = match caught_up {
        _ if max_rate > 0.0 => (max_rate, MaxFrom::Given),
        Some(rate) => (rate, MaxFrom::CatchUp),
        None => find_sustained(&mut load, &arrivals, seconds).await?,
    };
    // A warm-up at the middle rate, not recorded: the first seconds of a
    // run (the broker's JIT compiling its hot paths, the processor's first
    // allocations) are no steady state at any rate.
    load.offer(max_rate * 0.5, warmup_seconds(seconds)).await?;
    let mut rows = Vec::new();
    for fraction in FRACTIONS {
        let offered = max_rate * fraction;
        let step = load.offer(offered, seconds).await?;
        let mut changelog_ms: Vec<f64> = step_latencies(&arrivals, step.from, step.to)
            .into_iter()
            .map(|(_, ms)| ms)
            .collect();
        changelog_ms.sort_by(f64::total_cmp);
        let mut redis_ms = step.redis_ms;
        redis_ms.sort_by(f64::total_cmp);
        rows.push(LatencyRow {
            fraction,
            offered,
            achieved: step.achieved,
            changelog_ms,
            redis_ms,
            cores: step.cores,
        });
    }
    follower.stop().await?;
    drop(child);
    delete_bench_topics(&config.kafka, config.topics.names()).await?;
    delete_bench_keys(&config.redis).await;
    Ok(LatencyFigures {
        max_rate,
        max_from,
        cql: config.cql.enabled,
        rows,
        warmup_seconds: warmup_seconds(seconds),
        priorities: clocks.priorities(),
    })
}

/// The changelog records sent within `[from, to)`: (send time, latency),
/// in ms.
fn step_latencies(arrivals: &Arrivals, from: i64, to: i64) -> Vec<(i64, f64)> {
    arrivals
        .lock()
        .expect("bench lock")
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|&(at, arrived)| (at, (arrived - at) as f64))
        .collect()
}

/// Finds the highest live rate the processor sustains here (see
/// [`crate::sustained`]) by offering rates to it, each for up to 5 s.
async fn find_sustained(load: &mut Load<'_>, arrivals: &Arrivals, seconds: u64) -> Result<(f64, MaxFrom)> {
    let step_seconds = seconds.clamp(2, 5);
    let mut search = RateSearch::default();
    let mut steps = Vec::new();
    while let Some(rate) = search.next() {
        let step = load.offer(rate, step_seconds).await?;
        let records = step_latencies(arrivals, step.from, step.to);
        let verdict = sustained::judge(rate, step.achieved, step.from, step.to, &records);
        let mut ms: Vec<f64> = records.iter().map(|&(_, ms)| ms).collect();
        ms.sort_by(f64::total_cmp);
        tracing::info!(offered = rate.round() as u64, %verdict, "searching the highest sustained rate");
        search.record(rate, verdict.kept_up());
        if !verdict.kept_up() {
            // The next rate starts on an empty backlog.
            drain(arrivals).await;
        }
        steps.push(SearchStep {
            offered: rate,
            p50: percentile(&ms, 0.5),
            p99: percentile(&ms, 0.99),
            verdict,
        });
    }
    let max = search.maximum().ok_or(Error::NoSustainedRate {
        floor: sustained::FLOOR_RATE,
    })?;
    Ok((max, MaxFrom::Sustained { steps, step_seconds }))
}

/// Waits until no changelog record arrived for a second (at most 2
/// minutes): the processor has caught up on what a step left.
async fn drain(arrivals: &Arrivals) {
    let started = Instant::now();
    let count = || arrivals.lock().expect("bench lock").len();
    let (mut seen, mut quiet_since) = (count(), Instant::now());
    while quiet_since.elapsed() < Duration::from_secs(1) {
        if started.elapsed() > Duration::from_secs(120) {
            tracing::warn!(
                "changelog records still arriving 120 s after the step; the next rate starts on a backlog"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = count();
        if now != seen {
            (seen, quiet_since) = (now, Instant::now());
        }
    }
}

/// [`latency`] `runs` times, each with a processor and topics of its own, at
/// the same rates: the maximum, when not given, is measured once, in the
/// first. One run's tail on a shared box says little; several say how
/// often a rate meets a bound.
pub async fn latency_runs(config: &Config, args: &Args) -> Result<Vec<LatencyFigures>> {
    let mut all: Vec<LatencyFigures> = Vec::new();
    for _ in 0..args.runs.max(1) {
        let given = all.first().map_or(args.max_rate, |first| first.max_rate);
        let mut figures = latency(config, args.seconds, given, args.max_from).await?;
        if let Some(first) = all.first() {
            figures.max_from = first.max_from.clone();
        }
        all.push(figures);
    }
    Ok(all)
}

/// The rows of several runs as one table: for each rate, the run whose
/// report-to-changelog p99 is the median of that rate's.
fn median_rows(runs: &[LatencyFigures]) -> Option<LatencyFigures> {
    let first = runs.first()?;
    let rows = (0..first.rows.len())
        .filter_map(|i| {
            let row_of_each: Vec<LatencyRow> =
                runs.iter().filter_map(|run| run.rows.get(i).cloned()).collect();
            median_run(&row_of_each, |row| percentile(&row.changelog_ms, 0.99))
        })
        .collect();
    Some(LatencyFigures {
        rows,
        ..first.clone()
    })
}

/// Prints one run's table, or for several, the median rows (see
/// [`median_rows`]) and then every run's p99 of each rate.
pub fn print_latency_runs(runs: &[LatencyFigures]) {
    let Some(median) = median_rows(runs) else {
        return;
    };
    print_latency(&median);
    if runs.len() < 2 {
        return;
    }
    println!(
        "  (each row: the median of {} runs by its report->changelog p99; every run's report->changelog p99, ms, in the order they ran:)",
        runs.len()
    );
    for (i, row) in median.rows.iter().enumerate() {
        let each: Vec<String> = runs
            .iter()
            .filter_map(|run| run.rows.get(i))
            .map(|r| format!("{:.0}", percentile(&r.changelog_ms, 0.99)))
            .collect();
        println!("  {:>4.0}%  {}", row.fraction * 100.0, each.join(", "));
    }
}

/// The unrecorded warm-up before the rows: as long as a row, at most 5 s.
fn warmup_seconds(seconds: u64) -> u64 {
    seconds.min(5)
}

/// The workload and the probes, offered to the processor step by step.
struct Load<'a> {
    producer: Arc<InputProducer>,
    cursors: ProbeCursors,
    workload: &'a mut ChatWorkload,
    probe_seq: i64,
    clocks: &'a ServerClocks,
    readfold_pid: String,
}

/// What one step at one offered rate did.
struct Step {
    achieved: f64,
    /// The send times (ms) the step's records carry: [from, to).
    from: i64,
    to: i64,
    /// Report-to-Redis of its probes, ms, unsorted.
    redis_ms: Vec<f64>,
    cores: StepCores,
}

impl Load<'_> {
    /// Offers `offered` records/s for `seconds`, with probes, then waits
    /// until every send and probe is done and the step's last flushes had
    /// time to arrive.
    async fn offer(&mut self, offered: f64, seconds: u64) -> Result<Step> {
        let bench_pid = std::process::id().to_string();
        let (servers_before, readfold_before, bench_before) = (
            self.clocks.read().await,
            cpu_secs_of(&self.readfold_pid),
            cpu_secs_of(&bench_pid),
        );
        let waited = |pid: &str| pid.parse().ok().and_then(ThreadWaits::of);
        let (servers_waited, readfold_waited, bench_waited) = (
            self.clocks.waits(),
            waited(&self.readfold_pid),
            waited(&bench_pid),
        );
        let started = Instant::now();
        let from = now_ms();
        let (mut sent, mut next_probe) = (0u64, 0u64);
        let mut probes = tokio::task::JoinSet::new();
        let mut sends = tokio::task::JoinSet::new();
        while started.elapsed() < Duration::from_secs(seconds) {
            let elapsed = started.elapsed().as_secs_f64();
            let due = (offered * elapsed) as u64;
            let (mut reports, mut events) = (Vec::new(), Vec::new());
            let at = now_ms();
            while sent < due {
                match self.workload.next(at) {
                    Generated::Report(r) => reports.push(r),
                    Generated::Event(e) => events.push(e),
                }
                sent += 1;
            }
            if !reports.is_empty() || !events.is_empty() {
                let producer = self.producer.clone();
                sends.spawn(async move { producer.send_many(&reports, &events).await });
            }
            if (elapsed * PROBES_PER_SEC as f64) as u64 >= next_probe {
                next_probe += 1;
                self.probe_seq += 1;
                let (producer, mut cursors, seq) =
                    (self.producer.clone(), self.cursors.clone(), self.probe_seq);
                probes.spawn(async move {
                    let k = seq as u64 % PROBE_CONVERSATIONS;
                    probe(&producer, &mut cursors, k, seq, Duration::from_secs(60)).await
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let achieved = sent as f64 / started.elapsed().as_secs_f64();
        let to = now_ms();
        while let Some(done) = sends.join_next().await {
            done.map_err(Error::task("send"))??;
        }
        let mut redis_ms = Vec::new();
        while let Some(done) = probes.join_next().await {
            redis_ms.push(done.map_err(Error::task("probe"))??);
        }
        // Let the step's last flushes arrive before the next step starts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let secs = started.elapsed().as_secs_f64();
        let rate = |now: Option<ThreadWaits>, then: Option<ThreadWaits>| Some(now?.since(&then?) / secs);
        let cores = StepCores {
            readfold: (cpu_secs_of(&self.readfold_pid) - readfold_before).max(0.0) / secs,
            bench: (cpu_secs_of(&bench_pid) - bench_before).max(0.0) / secs,
            servers: self.clocks.read().await.since(servers_before).per_second(secs),
            waiting: StepWaits {
                readfold: rate(waited(&self.readfold_pid), readfold_waited),
                bench: rate(waited(&bench_pid), bench_waited),
                servers: self.clocks.waits().since(&servers_waited).per_second(secs),
            },
        };
        Ok(Step {
            achieved,
            from,
            to,
            redis_ms,
            cores,
        })
    }
}

/// The prober's cursor in each probe conversation, as Redis holds it,
/// read with one pipelined round trip per millisecond however many probes
/// wait: a poll per probe would load Redis (and the bench) with its own
/// reads as latencies grow, and measure that.
#[derive(Clone)]
struct ProbeCursors(tokio::sync::watch::Receiver<Vec<Option<Seq>>>);

impl ProbeCursors {
    /// Starts the poller; it stops when `running` turns false.
    fn watch(redis: Arc<RedisStore>, running: Arc<AtomicBool>) -> Self {
        let conversations: Vec<String> = (0..PROBE_CONVERSATIONS).map(probe_conversation).collect();
        let (tx, rx) = tokio::sync::watch::channel(vec![None; conversations.len()]);
        tokio::spawn(async move {
            let ids: Vec<&str> = conversations.iter().map(String::as_str).collect();
            while running.load(Ordering::Relaxed) {
                // A read that fails on a saturated machine is tried again:
                // a probe's latency then includes the wait, as a client's
                // would.
                if let Ok(cursors) = redis.user_cursors(&ids, PROBER).await {
                    tx.send_if_modified(|held| {
                        let changed = *held != cursors;
                        *held = cursors;
                        changed
                    });
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        ProbeCursors(rx)
    }

    /// Waits until the prober's cursor in probe conversation `k` reaches
    /// `seq`, at most `within`.
    async fn reached(&mut self, k: u64, seq: i64, within: Duration) -> Result<()> {
        let reached = self
            .0
            .wait_for(|cursors| cursors[k as usize].is_some_and(|c| c.get() as i64 >= seq));
        match tokio::time::timeout(within, reached).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(Error::ProbePollerStopped),
            Err(_) => Err(Error::timeout(
                format!("probe {} seq {seq} did not reach Redis", probe_conversation(k)),
                within.as_secs(),
            )),
        }
    }
}

/// The user whose reports are the probes.
const PROBER: &str = "prober";

fn probe_conversation(k: u64) -> String {
    format!("probe-{k}")
}

/// Sends probe report `seq` for probe conversation `k` and waits until
/// Redis shows it; returns the latency in ms.
async fn probe(
    producer: &InputProducer,
    cursors: &mut ProbeCursors,
    k: u64,
    seq: i64,
    within: Duration,
) -> Result<f64> {
    let report = ReadReportRecord {
        thread: 0,
        muted_until: None,
        conversation_id: probe_conversation(k),
        user_id: PROBER.into(),
        seq,
        device_id: None,
        reported_at: now_ms(),
        private: false,
        action: ReadAction::Read,
    };
    let sent = Instant::now();
    producer.report(&report).await?;
    cursors.reached(k, seq, within).await?;
    Ok(sent.elapsed().as_secs_f64() * 1000.0)
}

pub fn print_latency(f: &LatencyFigures) {
    println!(
        "latency at fixed offered rates (records/s over both inputs; maximum {:.0}/s{}), Redis on, CQL {}, after an unrecorded warm-up of {} s at 50%:",
        f.max_rate,
        match f.max_from {
            MaxFrom::Given => ", given",
            MaxFrom::CatchUp => ", from a catch-up of 500,000 records with Redis and CQL on",
            MaxFrom::Sustained { .. } => ", the highest live rate sustained here",
        },
        if f.cql { "on" } else { "off (cql.enabled = false)" },
        f.warmup_seconds
    );
    if let MaxFrom::Sustained { steps, step_seconds } = &f.max_from {
        println!(
            "  the maximum, found by offering each rate for {step_seconds} s (kept up: the median did not grow by 100 ms over the step and p99 stayed under 1 s):"
        );
        for step in steps {
            println!(
                "  {:>9.0}/s  p50/p99 {:>5.0} / {:>5.0} ms  {}",
                step.offered, step.p50, step.p99, step.verdict
            );
        }
    }
    println!(
        "  {:>5} {:>9} {:>9} | {:>29} {:>8} | {:>29} {:>6} | cores: readfold / bench / broker / Redis / CQL server | waiting for a core: the same",
        "load",
        "offered",
        "achieved",
        "report->changelog p50/p99/p99.9 ms",
        "records",
        "report->Redis p50/p99/p99.9 ms",
        "probes",
    );
    for r in &f.rows {
        let p = |v: &[f64]| {
            format!(
                "{:.0} / {:.0} / {:.0}",
                percentile(v, 0.5),
                percentile(v, 0.99),
                percentile(v, 0.999)
            )
        };
        println!(
            "  {:>4.0}% {:>9.0} {:>9.0} | {:>35} {:>8} | {:>30} {:>6} | {} | {}",
            r.fraction * 100.0,
            r.offered,
            r.achieved,
            p(&r.changelog_ms),
            r.changelog_ms.len(),
            p(&r.redis_ms),
            r.redis_ms.len(),
            cores_text(&r.cores),
            waits_text(&r.cores.waiting)
        );
    }
    println!(
        "  (cores: CPU seconds per second each used during the step, its 2 s tail included; the broker's and the CQL server's only when they run on this machine)"
    );
    println!(
        "  (waiting for a core: seconds per second each one's threads were ready to run but waited for a core, summed over its threads (/proc/PID/task/*/schedstat): 1.00 is one thread kept waiting all step; on a box that keeps Redis waiting, every flush waits with it)"
    );
    if let Some(priorities) = f.priorities {
        println!("  ({})", priority_note(priorities));
    }
}

/// What the table's reader should know about a CQL server sharing the
/// broker's machine: at the same priority, its snapshot bursts take the
/// cores the flushes' transactions need.
fn priority_note(p: Priorities) -> String {
    if p.cql > p.broker {
        return format!(
            "the local CQL server ran at a lower CPU priority than the broker, nice {} against {}: it yields the cores, as CQL servers on machines of their own would",
            p.cql, p.broker
        );
    }
    format!(
        "the local CQL server ran at the broker's CPU priority or above (nice {} against {}): its snapshot bursts take the cores the flushes need; CASSANDRA_NICE=10 for scripts/services.sh measures without that (see docs/performance.md, \"Latency\")",
        p.cql, p.broker
    )
}

/// "0.52 / 0.20 / 0.31 / 0.04 / 0.90", "-" for a server whose CPU is
/// unknown.
fn cores_text(c: &StepCores) -> String {
    figures_text([
        Some(c.readfold),
        Some(c.bench),
        c.servers.broker,
        c.servers.redis,
        c.servers.cql,
    ])
}

/// The waits in the order of [`cores_text`], "-" where unknown.
fn waits_text(w: &StepWaits) -> String {
    figures_text([
        w.readfold,
        w.bench,
        w.servers.broker,
        w.servers.redis,
        w.servers.cql,
    ])
}

/// Readfold's, the bench's, the broker's, Redis's and the CQL server's
/// figure, "-" where unknown.
fn figures_text(figures: [Option<f64>; 5]) -> String {
    figures
        .map(|v| v.map_or("-".to_owned(), |v| format!("{v:.2}")))
        .join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_show_unknown_servers_as_a_dash() {
        let cores = StepCores {
            readfold: 0.523,
            bench: 0.2,
            servers: ServerCpu {
                redis: Some(0.04),
                broker: None,
                cql: Some(1.2),
            },
            waiting: StepWaits {
                readfold: Some(0.31),
                bench: None,
                servers: ServerWaits {
                    redis: Some(0.456),
                    broker: Some(1.0),
                    cql: None,
                },
            },
        };
        assert_eq!(cores_text(&cores), "0.52 / 0.20 / - / 0.04 / 1.20");
        assert_eq!(waits_text(&cores.waiting), "0.31 / - / 1.00 / 0.46 / -");
    }

    /// A run whose rows at 10% and 50% took `p99s` ms (every record alike).
    fn run(p99s: [f64; 2]) -> LatencyFigures {
        let rows = [0.1, 0.5]
            .into_iter()
            .zip(p99s)
            .map(|(fraction, ms)| LatencyRow {
                fraction,
                offered: 100.0 * fraction,
                achieved: 100.0 * fraction,
                changelog_ms: vec![ms; 10],
                redis_ms: vec![ms; 2],
                cores: StepCores::default(),
            })
            .collect();
        LatencyFigures {
            max_rate: 100.0,
            max_from: MaxFrom::Given,
            cql: true,
            rows,
            warmup_seconds: 5,
            priorities: None,
        }
    }

    #[test]
    fn each_rate_shows_its_own_median_run() {
        let runs = [run([30.0, 229.0]), run([50.0, 69.0]), run([40.0, 92.0])];
        let median = median_rows(&runs).expect("rows");
        let p99 = |row: &LatencyRow| percentile(&row.changelog_ms, 0.99);
        assert_eq!(median.rows.iter().map(p99).collect::<Vec<_>>(), [40.0, 92.0]);
        // Each rate picks on its own: 10% from the third run, 50% from the
        // first.
        let runs = [run([30.0, 229.0]), run([50.0, 69.0]), run([45.0, 300.0])];
        let median = median_rows(&runs).expect("rows");
        assert_eq!(median.rows.iter().map(p99).collect::<Vec<_>>(), [45.0, 229.0]);
        let one = median_rows(&runs[..1]).expect("rows");
        assert_eq!(one.rows.iter().map(p99).collect::<Vec<_>>(), [30.0, 229.0]);
        assert!(median_rows(&[]).is_none());
    }
}
