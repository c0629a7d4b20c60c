//! `readfold-bench badge-stage --seconds S`: whether the badge stage keeps
//! up with the first stage, and what each costs per record. `readfold run`
//! (Redis on, CQL off) and `readfold badges` are child processes on fresh
//! topics; `readfold loadgen`'s chat workload is offered open-loop at each
//! rate in turn, on conversations of the step's own. Each step shows the
//! rate offered beside the one achieved, each stage's input records and CPU
//! per record (until it committed the step's input), each stage's lag (its
//! own `readfold_consumer_lag`) sampled every second of the load, and how
//! long past the load's end each took to commit all of its input.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_kafka::admin::{create_topic, ensure_topics};
use readfold_kafka::producer::InputProducer;
use readfold_loadgen::{LoadgenOptions, WorkloadSpec};
use readfold_progress::ProgressMode;

use crate::child::{config_vars, cpu_secs_of, free_addr, scrape, spawn, ChildGuard};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics};
use crate::throughput::{end_offsets_of, metric, watch_commits};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Seconds of load per rate.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// Records per second offered, one step per rate, in order.
    #[arg(long, value_delimiter = ',', default_value = "20000,40000,80000")]
    pub rates: Vec<u64>,
    /// Share of reads that are delivery reports.
    #[arg(long, default_value_t = 0.2)]
    pub delivered_share: f64,
}

/// One stage's figures over a step.
#[derive(Clone, Debug, Default)]
pub struct StageStep {
    /// Input records taken.
    pub records: f64,
    /// CPU seconds from the load's start until the step's input was committed.
    pub cpu_secs: f64,
    /// Records not yet taken, summed over partitions: the most seen during
    /// the load, and at its end.
    pub max_lag: f64,
    pub lag_at_end: f64,
    /// From the load's end until its input was committed.
    pub drained_secs: f64,
}

impl StageStep {
    fn micros_per_record(&self) -> f64 {
        self.cpu_secs * 1e6 / self.records.max(1.0)
    }
}

#[derive(Clone, Debug, Default)]
pub struct BadgeStageStep {
    pub offered: u64,
    pub achieved: f64,
    pub seconds: f64,
    pub first: StageStep,
    pub badge: StageStep,
    /// By-user changelog records the first stage published.
    pub by_user_published: f64,
    pub badges_published: f64,
    pub badge_flushes: f64,
    pub badge_flushes_failed: f64,
}

/// A child's metrics listener and pid.
struct Stage {
    child: ChildGuard,
    metrics: String,
}

impl Stage {
    fn start(command: &str, config: &Config) -> Result<Stage> {
        let metrics = free_addr()?.to_string();
        let mut vars = config_vars(config);
        vars.extend(
            [
                ("READFOLD__CQL__ENABLED", "false".to_owned()),
                ("READFOLD__METRICS__LISTEN", metrics.clone()),
                (
                    "READFOLD__BADGE__FLUSH_INTERVAL_MS",
                    config.badge.flush_interval_ms.to_string(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
        );
        Ok(Stage {
            child: spawn(command, &vars)?,
            metrics,
        })
    }

    fn scrape(&self) -> String {
        scrape(&self.metrics).unwrap_or_default()
    }

    fn cpu(&self) -> f64 {
        cpu_secs_of(&self.child.pid().to_string())
    }

    /// Waits until its metrics show `series`.
    async fn until_shows(&mut self, series: &str, what: &str) -> Result<()> {
        let started = Instant::now();
        while !self.scrape().contains(series) {
            if self.child.exited().is_some() {
                return Err(Error::timeout(format!("{what} exited before it was ready"), 0));
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err(Error::timeout(format!("{what} was not ready"), 120));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

/// The sum of a gauge's samples over its labels.
fn sum_of(scraped: &str, name: &str) -> f64 {
    scraped
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub async fn badge_stage(config: &Config, args: &Args) -> Result<Vec<BadgeStageStep>> {
    let mut config = on_fresh_topics(config, "badges");
    config.cql.enabled = false;
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    for (topic, compacted) in [
        (&config.badge.user_badges, true),
        (&config.badge.user_actions, false),
    ] {
        create_topic(&config.kafka, topic, layout.partitions, 1, compacted).await?;
    }
    let mut first = Stage::start("run", &config)?;
    let mut badge = Stage::start("badges", &config)?;
    first
        .until_shows("readfold_flushes_total{result=\"committed\"}", "readfold run")
        .await?;
    badge
        .until_shows(
            "readfold_badge_flushes_total{result=\"committed\"}",
            "readfold badges",
        )
        .await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let mut badge_config = config.clone();
    badge_config.kafka.group_id = config.badge.group_id.clone();
    let t = &config.topics;
    let inputs_in = |s: &str| {
        metric(
            s,
            &format!("readfold_records_in_total{{topic=\"{}\"}}", t.read_reports),
        ) + metric(
            s,
            &format!("readfold_records_in_total{{topic=\"{}\"}}", t.conversation_events),
        )
    };
    let by_user_in = |s: &str| {
        metric(
            s,
            &format!(
                "readfold_badge_records_in_total{{topic=\"{}\"}}",
                t.user_read_cursors
            ),
        )
    };
    let mut steps = Vec::new();
    for &rate in &args.rates {
        let (f0, b0) = (first.scrape(), badge.scrape());
        let (fc0, bc0) = (first.cpu(), badge.cpu());
        let options = LoadgenOptions {
            spec: WorkloadSpec {
                prefix: format!("r{rate}-"),
                delivered_share: args.delivered_share,
                ..WorkloadSpec::default()
            },
            rate: rate as f64,
            records: None,
            duration: Some(Duration::from_secs(args.seconds)),
            progress: ProgressMode::Off,
        };
        // Each stage's own lag gauge, every second of the load.
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (sampling, f, b) = (sampling.clone(), first.metrics.clone(), badge.metrics.clone());
            tokio::task::spawn_blocking(move || {
                let (mut max, mut last) = ([0.0f64; 2], [0.0f64; 2]);
                while sampling.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_secs(1));
                    for (i, addr) in [&f, &b].into_iter().enumerate() {
                        last[i] = sum_of(&scrape(addr).unwrap_or_default(), "readfold_consumer_lag");
                        max[i] = max[i].max(last[i]);
                    }
                }
                (max, last)
            })
        };
        let summary = readfold_loadgen::run(&options, &producer).await?;
        sampling.store(false, Ordering::Relaxed);
        let load_end = Instant::now();
        let ends = end_offsets_of(&config, &[&t.read_reports, &t.conversation_events])?;
        let first_drained = watch_commits(&config, ends, load_end, first.child.pid()).await?;
        let fc1 = first.cpu();
        let ends = end_offsets_of(&badge_config, &[&t.user_read_cursors, &config.badge.user_actions])?;
        let badge_drained = watch_commits(&badge_config, ends, load_end, badge.child.pid()).await?;
        let bc1 = badge.cpu();
        let (max, last) = sampler.await.map_err(Error::task("lag sampler"))?;
        let (f1, b1) = (first.scrape(), badge.scrape());
        let delta = |a: &str, b: &str, series: &str| metric(b, series) - metric(a, series);
        steps.push(BadgeStageStep {
            offered: rate,
            achieved: summary.achieved_rate(),
            seconds: summary.elapsed.as_secs_f64(),
            first: StageStep {
                records: inputs_in(&f1) - inputs_in(&f0),
                cpu_secs: fc1 - fc0,
                max_lag: max[0],
                lag_at_end: last[0],
                drained_secs: first_drained.as_secs_f64(),
            },
            badge: StageStep {
                records: by_user_in(&b1) - by_user_in(&b0),
                cpu_secs: bc1 - bc0,
                max_lag: max[1],
                lag_at_end: last[1],
                drained_secs: badge_drained.as_secs_f64(),
            },
            by_user_published: delta(&f0, &f1, "readfold_changelog_updates_total"),
            badges_published: delta(&b0, &b1, "readfold_badge_updates_total"),
            badge_flushes: delta(&b0, &b1, "readfold_badge_flushes_total{result=\"committed\"}"),
            badge_flushes_failed: delta(&b0, &b1, "readfold_badge_flushes_total{result=\"failed\"}"),
        });
    }
    drop((first, badge));
    let mut topics: Vec<&String> = config.topics.names().into_iter().collect();
    topics.extend([&config.badge.user_badges, &config.badge.user_actions]);
    delete_bench_topics(&config.kafka, topics).await?;
    delete_bench_keys(&config.redis).await;
    Ok(steps)
}

pub fn print_badge_stage(steps: &[BadgeStageStep]) {
    println!(
        "badge stage: `readfold run` and `readfold badges` as child processes (Redis on, CQL off), loadgen's chat workload offered open-loop; CPU counted until each committed the step's input"
    );
    for s in steps {
        println!(
            "  offered {}/s: achieved {:.0}/s over {:.1} s",
            s.offered, s.achieved, s.seconds
        );
        for (name, stage, what) in [
            ("first stage", &s.first, "input records"),
            ("badge stage", &s.badge, "by-user records"),
        ] {
            println!(
                "    {name}: {:.0} {what}, {:.2} CPU-s = {:.1} us per record; lag max {:.0}, {:.0} at the load's end; committed all {:.2} s after it",
                stage.records,
                stage.cpu_secs,
                stage.micros_per_record(),
                stage.max_lag,
                stage.lag_at_end,
                stage.drained_secs
            );
        }
        println!(
            "    cursor changes published by the first stage {:.0}; badges published {:.0} in {:.0} flushes ({:.0} failed); badge stage CPU per record {:.2}x the first stage's",
            s.by_user_published,
            s.badges_published,
            s.badge_flushes,
            s.badge_flushes_failed,
            s.badge.micros_per_record() / s.first.micros_per_record().max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_of_adds_a_gauges_labelled_samples_only() {
        let scraped = "# TYPE readfold_consumer_lag gauge\n\
            readfold_consumer_lag{topic=\"a\",partition=\"0\"} 3\n\
            readfold_consumer_lag{topic=\"a\",partition=\"1\"} 4\n\
            readfold_consumer_lag_other 9\n";
        assert_eq!(sum_of(scraped, "readfold_consumer_lag"), 7.0);
    }
}
