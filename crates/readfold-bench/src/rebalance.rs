//! `readfold-bench rebalance --seconds S`: what scaling out and back in
//! costs the partitions that move and those that stay, under each consumer
//! group protocol in turn (`classic`: the eager range assignor; `consumer`:
//! KIP-848's broker-side range assignor, incremental), side by side in one
//! run. For each, on fresh topics: `readfold run` instance a alone under
//! the latency bench's chat workload offered open-loop at `--rate`; S s later
//! instances b and c join (1 -> 3); S s later they stop cleanly (3 -> 1);
//! S s more. With `--kill`, c is SIGKILLed instead (a phase of at least
//! 20 s: its partitions wait for its session timeout), then b stops.
//! Every changelog record's arrival is noted with its partition.
//! A partition's longest gap between arrivals within a phase is how long it
//! stopped: at the offered rate each partition's changelog moves with every
//! flush, so a steady phase's longest gap is the flush cadence. Beside it,
//! the report-to-changelog latency of the records sent in each phase.
//!
//! `--standby off,on` runs each protocol without and with warm standbys
//! (`state.standby`), and prints instance a's memory and CPU while it owns
//! a third of the partitions and (with one) follows the rest: what a
//! standby costs. `--cursors N` first writes N cursors to the changelog, a
//! state every restore reads.
//!
//! Not loadgen's workload: its Zipf-skewed conversations leave some
//! partitions without a record for seconds, and a gap could not tell a
//! stop from idleness. This one spreads every second's records over all
//! partitions.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_core::partitioner::partition_for_key;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;

use crate::child::{config_vars, cpu_secs_of, free_addr, http_get, rss_of, spawn, stop, ChildGuard};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics, ChangelogFollower};
use crate::restore::write_changelog;
use crate::stats::percentile;
use crate::workload::{ChatWorkload, Generated};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Seconds per phase (one instance; 1 -> 3; 3 -> 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..))]
    pub seconds: u64,
    /// Records per second offered, open-loop.
    #[arg(long, default_value_t = 3000.0)]
    pub rate: f64,
    /// Partitions of the fresh topics.
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
    /// Scale in by SIGKILLing instance c (its partitions move once its
    /// session times out: 6 s under either protocol here), then stopping b
    /// cleanly, rather than stopping both cleanly.
    #[arg(long, default_value_t = false)]
    pub kill: bool,
    /// The group protocols measured, in order.
    #[arg(long, value_delimiter = ',', default_value = "classic,consumer")]
    pub protocols: Vec<Protocol>,
    /// Warm standbys (`state.standby`): each protocol is run with each.
    #[arg(long, value_delimiter = ',', default_value = "off")]
    pub standby: Vec<Switch>,
    /// Cursors written to the changelog before instance a starts.
    #[arg(long, default_value_t = 0)]
    pub cursors: u64,
    /// Under the consumer protocol: the group's session timeout (ms), set
    /// on the broker for the bench's group (within the broker's
    /// `group.consumer.min.session.timeout.ms`); the broker's default when
    /// not given. Its heartbeat interval is set to a third of it.
    #[arg(long)]
    pub session_timeout_ms: Option<u32>,
}

/// Off or on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    Off,
    On,
}

/// `kafka.group_protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    Classic,
    Consumer,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Classic => "classic",
            Protocol::Consumer => "consumer",
        }
    }
}

/// Unrecorded load before the first phase: instance a settles in.
const WARM_UP: Duration = Duration::from_secs(5);
/// Classic members' session timeout, as the broker's for the consumer
/// protocol (`group.consumer.session.timeout.ms` in services.sh).
const SESSION_TIMEOUT_MS: &str = "6000";
/// A partition counts as stopped in a phase when its longest gap passes this.
const STOPPED_MS: f64 = 1000.0;

/// One phase's figures.
#[derive(Clone, Debug)]
pub struct PhaseRow {
    pub phase: &'static str,
    /// Report-to-changelog (ms) of the records sent in the phase, sorted.
    pub latency_ms: Vec<f64>,
    /// Each partition's longest gap between changelog arrivals (ms), by
    /// partition.
    pub longest_gap_ms: Vec<f64>,
}

/// One protocol's run.
#[derive(Clone, Debug)]
pub struct ProtocolRun {
    pub protocol: Protocol,
    pub standby: bool,
    pub achieved: f64,
    pub phases: Vec<PhaseRow>,
    /// Instance a's resident memory (bytes) at the end of the 1 -> 3 phase.
    pub a_rss: u64,
    /// Instance a's CPU over the 1 -> 3 phase (cores).
    pub a_cpu: f64,
}

impl ProtocolRun {
    fn label(&self) -> String {
        match self.standby {
            false => self.protocol.name().to_owned(),
            true => format!("{}+sb", self.protocol.name()),
        }
    }
}

/// A changelog record: its partition, send time and arrival (ms).
type Arrival = (i32, i64, i64);

pub async fn rebalance(config: &Config, args: &Args) -> Result<Vec<ProtocolRun>> {
    let mut runs = Vec::new();
    for &protocol in &args.protocols {
        for &standby in &args.standby {
            runs.push(run(config, args, protocol, standby == Switch::On).await?);
        }
    }
    Ok(runs)
}

async fn run(config: &Config, args: &Args, protocol: Protocol, standby: bool) -> Result<ProtocolRun> {
    let mut config = on_fresh_topics(config, &format!("rebalance-{}", protocol.name()));
    config.topics.partitions = args.partitions;
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let partitions = layout.partitions;
    if let (Protocol::Consumer, Some(ms)) = (protocol, args.session_timeout_ms) {
        set_group_timeouts(&config, ms).await?;
    }
    if args.cursors > 0 {
        let started = Instant::now();
        write_changelog(&config, &config.topics.read_cursors, args.cursors, partitions).await?;
        eprintln!(
            "rebalance: {} cursors written to the changelog in {:.1} s",
            args.cursors,
            started.elapsed().as_secs_f64()
        );
    }
    let instance = |name: &str| -> Result<(ChildGuard, String)> {
        let metrics = free_addr()?.to_string();
        let mut vars = config_vars(&config);
        vars.retain(|(k, _)| k != "READFOLD__KAFKA__INSTANCE_ID");
        vars.extend([
            ("READFOLD__KAFKA__INSTANCE_ID".to_owned(), name.to_owned()),
            (
                "READFOLD__KAFKA__GROUP_PROTOCOL".to_owned(),
                protocol.name().to_owned(),
            ),
            ("READFOLD__METRICS__LISTEN".to_owned(), metrics.clone()),
            ("READFOLD__STATE__STANDBY".to_owned(), standby.to_string()),
        ]);
        if protocol == Protocol::Classic {
            // The consumer protocol's is the broker's: 6 s in services.sh.
            vars.push((
                "READFOLD__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS".to_owned(),
                SESSION_TIMEOUT_MS.to_owned(),
            ));
        }
        Ok((spawn("run", &vars)?, metrics))
    };
    let (mut a, a_metrics) = instance("a")?;
    let a_pid = a.pid();
    wait_ready(&mut a, &a_metrics).await?;

    let arrivals: Arc<Mutex<Vec<Arrival>>> = Arc::default();
    let follower = ChangelogFollower::start(&config, {
        let arrivals = arrivals.clone();
        move |update, arrived| {
            let partition = partition_for_key(update.conversation_id.as_str().as_bytes(), partitions);
            arrivals
                .lock()
                .expect("bench lock")
                .push((partition, update.updated_at, arrived));
        }
    })?;

    let producer = Arc::new(InputProducer::new(&config.kafka, &config.topics, partitions)?);
    let phase = Duration::from_secs(args.seconds);
    // A SIGKILLed member's partitions wait for its session timeout.
    let kill_phase = phase.max(Duration::from_secs(20));
    let load_for = WARM_UP + phase * 3 + if args.kill { kill_phase } else { Duration::ZERO };
    let membership = async {
        let mut marks = Vec::new();
        tokio::time::sleep(WARM_UP).await;
        marks.push(now_ms());
        tokio::time::sleep(phase).await;
        marks.push(now_ms());
        let (b, c) = (instance("b")?, instance("c")?);
        let cpu_from = cpu_secs_of(&a_pid.to_string());
        tokio::time::sleep(phase).await;
        let a_cpu = (cpu_secs_of(&a_pid.to_string()) - cpu_from) / phase.as_secs_f64();
        let a_rss = rss_of(a_pid);
        let left = now_ms();
        marks.push(left);
        let leaving = if args.kill {
            drop(c);
            tokio::time::sleep(kill_phase).await;
            marks.push(now_ms());
            vec![b.0]
        } else {
            vec![b.0, c.0]
        };
        // Cleanly, leaving the group as a scale-in does.
        let stops: Vec<_> = leaving
            .into_iter()
            .map(|child| tokio::task::spawn_blocking(move || stop(child).map(drop)))
            .collect();
        let stopping = now_ms();
        for s in stops {
            s.await.map_err(Error::task("stopping an instance"))??;
        }
        tokio::time::sleep(phase.saturating_sub(Duration::from_millis((now_ms() - stopping).max(0) as u64)))
            .await;
        marks.push(now_ms());
        Ok::<_, Error>((marks, a_rss, a_cpu))
    };
    let (achieved, marks) = tokio::join!(offer(&producer, args.rate, load_for), membership);
    let (achieved, (marks, a_rss, a_cpu)) = (achieved?, marks?);
    // The last flushes land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    follower.stop().await?;
    drop(a);

    let arrivals = arrivals.lock().expect("bench lock").clone();
    let names: &[&'static str] = if args.kill {
        &["1 instance", "1 -> 3", "kill c", "2 -> 1"]
    } else {
        &["1 instance", "1 -> 3", "3 -> 1"]
    };
    let phases = names
        .iter()
        .copied()
        .zip(marks.windows(2))
        .map(|(name, w)| phase_row(name, &arrivals, partitions, w[0], w[1]))
        .collect();
    delete_bench_topics(&config.kafka, config.topics.names()).await?;
    delete_bench_keys(&config.redis).await;
    Ok(ProtocolRun {
        protocol,
        standby,
        achieved,
        phases,
        a_rss,
        a_cpu,
    })
}

/// Sets the consumer-protocol group's session timeout and heartbeat
/// interval on the broker (KIP-848 group configs).
async fn set_group_timeouts(config: &Config, session_ms: u32) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = config.kafka.client_config().create()?;
    let (session, heartbeat) = (session_ms.to_string(), (session_ms / 3).max(500).to_string());
    let group = AlterConfig::new(ResourceSpecifier::Group(&config.kafka.group_id))
        .set("consumer.session.timeout.ms", &session)
        .set("consumer.heartbeat.interval.ms", &heartbeat);
    for result in admin.alter_configs([&group], &AdminOptions::new()).await? {
        if let Err((_, code)) = result {
            return Err(rdkafka::error::KafkaError::AdminOp(code).into());
        }
    }
    Ok(())
}

/// Offers the chat workload at `rate` records/s for `duration`, open-loop:
/// each tick sends what is due by the clock, whatever the broker took.
/// Returns the rate achieved.
async fn offer(producer: &Arc<InputProducer>, rate: f64, duration: Duration) -> Result<f64> {
    let mut workload = ChatWorkload::new("");
    let started = Instant::now();
    let mut sent = 0u64;
    let mut sends = tokio::task::JoinSet::new();
    while started.elapsed() < duration {
        let due = (rate * started.elapsed().as_secs_f64()) as u64;
        let (mut reports, mut events) = (Vec::new(), Vec::new());
        let at = now_ms();
        while sent < due {
            match workload.next(at) {
                Generated::Report(r) => reports.push(r),
                Generated::Event(e) => events.push(e),
            }
            sent += 1;
        }
        if !reports.is_empty() || !events.is_empty() {
            let producer = producer.clone();
            sends.spawn(async move { producer.send_many(&reports, &events).await });
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let achieved = sent as f64 / started.elapsed().as_secs_f64();
    while let Some(done) = sends.join_next().await {
        done.map_err(Error::task("send"))??;
    }
    Ok(achieved)
}

/// The figures of the phase `[from, to)` (epoch ms).
fn phase_row(phase: &'static str, arrivals: &[Arrival], partitions: i32, from: i64, to: i64) -> PhaseRow {
    let mut latency_ms: Vec<f64> = arrivals
        .iter()
        .filter(|(_, sent, _)| (from..to).contains(sent))
        .map(|&(_, sent, arrived)| (arrived - sent) as f64)
        .collect();
    latency_ms.sort_by(f64::total_cmp);
    let longest_gap_ms = (0..partitions)
        .map(|p| {
            let mut at: Vec<i64> = arrivals
                .iter()
                .filter(|(q, _, arrived)| *q == p && (from..to).contains(arrived))
                .map(|&(_, _, arrived)| arrived)
                .collect();
            at.sort_unstable();
            let mut last = from;
            let mut longest = 0;
            for t in at.into_iter().chain([to]) {
                longest = longest.max(t - last);
                last = t;
            }
            longest as f64
        })
        .collect();
    PhaseRow {
        phase,
        latency_ms,
        longest_gap_ms,
    }
}

/// Waits until the child's `/readyz` answers 200 (two minutes at most).
async fn wait_ready(child: &mut ChildGuard, metrics: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.exited() {
            return Err(Error::Exited {
                child: "readfold run",
                status,
                when: "before it was ready",
            });
        }
        let ready = http_get(metrics, "/readyz").is_ok_and(|r| r.contains(" 200 "));
        if ready || started.elapsed() > Duration::from_secs(120) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn print_rebalance(args: &Args, runs: &[ProtocolRun]) {
    println!(
        "rebalance: the chat workload offered at {:.0} records/s, {} partitions, {} s per phase, {} cursors preloaded",
        args.rate, args.partitions, args.seconds, args.cursors
    );
    println!();
    println!(
        "{:<12} {:>9} {:<11} {:>26} {:>17} {:>14}",
        "protocol", "achieved", "phase", "report-to-changelog ms", "longest stop ms", "stopped > 1 s"
    );
    println!(
        "{:<12} {:>9} {:<11} {:>26} {:>17} {:>14}",
        "", "/s", "", "p50 / p99 / max", "median / max", "partitions"
    );
    for run in runs {
        for row in &run.phases {
            let l = &row.latency_ms;
            let mut gaps = row.longest_gap_ms.clone();
            gaps.sort_by(f64::total_cmp);
            let stopped = gaps.iter().filter(|g| **g > STOPPED_MS).count();
            println!(
                "{:<12} {:>9.0} {:<11} {:>26} {:>17} {:>14}",
                run.label(),
                run.achieved,
                row.phase,
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    percentile(l, 0.5),
                    percentile(l, 0.99),
                    l.last().copied().unwrap_or(0.0)
                ),
                format!(
                    "{:.0} / {:.0}",
                    percentile(&gaps, 0.5),
                    gaps.last().copied().unwrap_or(0.0)
                ),
                format!("{stopped} of {}", gaps.len()),
            );
        }
    }
    println!();
    println!("longest gap between changelog arrivals per partition (ms, partition 0 first):");
    for run in runs {
        for row in &run.phases {
            let gaps: Vec<String> = row.longest_gap_ms.iter().map(|g| format!("{g:.0}")).collect();
            println!("  {:<12} {:<11} {}", run.label(), row.phase, gaps.join(" "));
        }
    }
    println!();
    println!("instance a while it owns a third of the partitions (1 -> 3 phase): resident memory, CPU");
    for run in runs {
        println!(
            "  {:<12} {:>8.0} MiB {:>6.2} cores",
            run.label(),
            run.a_rss as f64 / (1 << 20) as f64,
            run.a_cpu
        );
    }
}
