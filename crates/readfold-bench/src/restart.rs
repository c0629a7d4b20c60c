//! `readfold-bench restart --cursors N`: how long `readfold run` takes from
//! its start until `/readyz` says ready, after a clean stop, at N/4, N/2 and
//! N cursors: with its state restored from the whole changelog, and from a
//! local checkpoint (`state.dir`) plus the changelog written since. Redis is
//! off, and CQL too unless asked for, so that the time is the restore's and
//! the group join's. With CQL on (`--cql true`), each restart is also
//! timed until CQL holds the restored state again: until the processor's
//! snapshot backlog (`readfold_snapshot_backlog_keys`) is back to 0, with the
//! keys its snapshots wrote by then.
//!
//! Ready is not the whole story when a state is taken in lazily (from a
//! checkpoint, conversations are read from the file as records touch
//! them): while each process is down, one more read lands in a conversation
//! of the state, and each restart is also timed until that record's offset
//! is committed, its change published.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_wire::codec::{ReadAction, ReadReportRecord};

use crate::child::{config_vars, free_addr, http_get, peak_rss_of, scrape, spawn, stop, ChildGuard};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics};
use crate::throughput::{end_offsets, metric, watch_commits};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Cursors of the largest state; the bench also restarts at a quarter
    /// and half of it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub cursors: u64,
    /// Members per conversation of the state (2: 1:1 chats); each user is
    /// in about ten conversations.
    #[arg(long, default_value_t = 100)]
    pub members: u64,
    /// Whether `readfold run` runs with CQL on, each restart also timed
    /// until CQL holds the restored state again (its snapshot backlog back
    /// to 0), with the keys that took.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub cql: bool,
}

/// One size's figures.
#[derive(Clone, Debug)]
pub struct RestartRow {
    pub cursors: u64,
    /// Start to ready, restoring the whole changelog.
    pub full_secs: f64,
    /// The restore alone, as the processor measured it.
    pub full_restore_secs: f64,
    /// Start to ready, from the checkpoint written at the last stop.
    pub checkpoint_secs: f64,
    pub checkpoint_restore_secs: f64,
    /// Start until the read that landed while it was down is committed:
    /// after the whole changelog, and after the checkpoint.
    pub full_first_secs: f64,
    pub checkpoint_first_secs: f64,
    pub checkpoint_bytes: u64,
    /// The clean stop that wrote the checkpoint: SIGTERM to exit.
    pub stop_secs: f64,
    /// With CQL on: after the whole changelog, and after the checkpoint.
    pub full_cql: Option<CqlCatchUp>,
    pub checkpoint_cql: Option<CqlCatchUp>,
}

/// How long a restart took until CQL held its state again, and the keys
/// its snapshots wrote until then.
#[derive(Clone, Copy, Debug)]
pub struct CqlCatchUp {
    /// From the start of the process.
    pub secs: f64,
    pub keys: f64,
    /// The process's peak resident memory by then.
    pub peak_rss: u64,
}

pub async fn restart(config: &Config, args: &Args) -> Result<Vec<RestartRow>> {
    let (cursors, members, cql) = (args.cursors, args.members.max(1), args.cql);
    let mut rows = Vec::new();
    for n in [cursors / 4, cursors / 2, cursors] {
        rows.push(one_size(config, n.max(1), members, cql).await?);
    }
    Ok(rows)
}

async fn one_size(config: &Config, cursors: u64, members: u64, cql: bool) -> Result<RestartRow> {
    let config = on_fresh_topics(config, "restart");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    // Conversations of `members` members, each member one read; each user
    // in about ten conversations.
    let now = now_ms();
    let users = (cursors / 10).max(members);
    let stride = users / members;
    let reports: Vec<ReadReportRecord> = (0..cursors)
        .map(|i| ReadReportRecord {
            thread: 0,
            muted_until: None,
            conversation_id: format!("conv-{}", i / members),
            user_id: format!("user-{}", (i / members + i % members * stride) % users),
            seq: (i % 1000) as i64 + 1,
            device_id: None,
            reported_at: now,
            private: false,
            action: ReadAction::Read,
        })
        .collect();
    for chunk in reports.chunks(100_000) {
        producer.send_many(chunk, &[]).await?;
    }
    // A read of a conversation in the middle of the state, by its first
    // member, past every seq: sent while the process is down.
    let probe = |n: i64| ReadReportRecord {
        conversation_id: format!("conv-{}", cursors / members / 2),
        user_id: format!("user-{}", (cursors / members / 2) % users),
        seq: 1000 + n,
        ..reports[0].clone()
    };
    let base = std::env::temp_dir().join(format!("readfold-bench-restart-{}", now_ms()));
    let (warm, cold) = (base.join("warm"), base.join("cold"));

    // Fold the backlog, then stop: the stop writes the checkpoints.
    let watch = config.clone();
    let ends = tokio::task::spawn_blocking(move || end_offsets(&watch))
        .await
        .map_err(Error::task("end offsets"))??;
    let (child, _) = start(&config, &warm, cql)?;
    watch_commits(&config, ends, Instant::now(), child.pid()).await?;
    let stop_secs = stop(child)?.as_secs_f64();
    let checkpoint_bytes = dir_bytes(&warm);

    producer.send_many(&[probe(1)], &[]).await?;
    let (full_secs, full_restore_secs, full_first_secs, full_cql) =
        time_to_ready(&config, &cold, cql).await?;
    producer.send_many(&[probe(2)], &[]).await?;
    let (checkpoint_secs, checkpoint_restore_secs, checkpoint_first_secs, checkpoint_cql) =
        time_to_ready(&config, &warm, cql).await?;
    drop(producer);
    let _ = std::fs::remove_dir_all(&base);
    delete_bench_topics(&config.kafka, config.topics.names()).await?;
    delete_bench_keys(&config.redis).await;
    Ok(RestartRow {
        cursors,
        full_secs,
        full_restore_secs,
        checkpoint_secs,
        checkpoint_restore_secs,
        full_first_secs,
        checkpoint_first_secs,
        checkpoint_bytes,
        stop_secs,
        full_cql,
        checkpoint_cql,
    })
}

/// `readfold run` with checkpoints in `state_dir`; returns it and its ops
/// address.
fn start(config: &Config, state_dir: &Path, cql: bool) -> Result<(ChildGuard, String)> {
    let ops = free_addr()?.to_string();
    let mut vars = config_vars(config);
    for (k, v) in [
        ("READFOLD__REDIS__ENABLED", "false".to_owned()),
        ("READFOLD__CQL__ENABLED", cql.to_string()),
        ("READFOLD__METRICS__LISTEN", ops.clone()),
        ("READFOLD__STATE__DIR", state_dir.display().to_string()),
    ] {
        vars.push((k.to_owned(), v));
    }
    Ok((spawn("run", &vars)?, ops))
}

/// Starts `readfold run`, waits until `/readyz` answers 200, then until
/// its input offsets reach the inputs' current ends (and with `cql` until
/// its snapshot backlog is 0), and stops it cleanly; returns the seconds to
/// ready, the restore's own seconds and the seconds to that commit.
async fn time_to_ready(
    config: &Config,
    state_dir: &Path,
    cql: bool,
) -> Result<(f64, f64, f64, Option<CqlCatchUp>)> {
    let watch = config.clone();
    let ends = tokio::task::spawn_blocking(move || end_offsets(&watch))
        .await
        .map_err(Error::task("end offsets"))??;
    let started = Instant::now();
    let (child, ops) = start(config, state_dir, cql)?;
    loop {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(Error::timeout("readfold run was not ready", 600));
        }
        if ready(&ops) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let restore = metric(
        &scrape(&ops).unwrap_or_default(),
        "readfold_restore_duration_seconds_sum",
    );
    let first = watch_commits(config, ends, started, child.pid())
        .await?
        .as_secs_f64();
    let caught_up = if cql {
        Some(cql_caught_up(&ops, started, child.pid()).await?)
    } else {
        None
    };
    stop(child)?;
    Ok((secs, restore, first, caught_up))
}

/// Waits until the child's snapshot backlog is 0 (set before it is ready).
async fn cql_caught_up(ops: &str, started: Instant, pid: u32) -> Result<CqlCatchUp> {
    loop {
        let scraped = scrape(ops).unwrap_or_default();
        if scraped.contains("readfold_snapshot_backlog_keys")
            && metric(&scraped, "readfold_snapshot_backlog_keys") == 0.0
        {
            return Ok(CqlCatchUp {
                secs: started.elapsed().as_secs_f64(),
                keys: metric(&scraped, "readfold_snapshot_keys_total"),
                peak_rss: peak_rss_of(pid),
            });
        }
        if started.elapsed() > Duration::from_secs(1800) {
            return Err(Error::timeout(
                "CQL did not catch up with the restored state",
                1800,
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether the child's `/readyz` answers 200.
fn ready(addr: &str) -> bool {
    http_get(addr, "/readyz").is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                total += entry.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

pub fn print_restart(rows: &[RestartRow], args: &Args) {
    let (members, cql) = (args.members.max(1), args.cql);
    println!();
    let sinks = if cql {
        "Redis off, CQL on"
    } else {
        "Redis and CQL off"
    };
    println!(
        "restart after a clean stop, {members} members per conversation: start to /readyz, {sinks} (restore: the processor's own timing, loading the checkpoint files included)"
    );
    println!(
        "{:>10} | {:>26} | {:>26} | {:>12} | {:>21}",
        "cursors",
        "whole changelog (restore)",
        "checkpoint + tail (restore)",
        "checkpoint",
        "clean stop writing it"
    );
    for r in rows {
        println!(
            "{:>10} | {:>15.2} s ({:>5.2} s) | {:>15.2} s ({:>5.2} s) | {:>9.1} MB | {:>19.2} s",
            r.cursors,
            r.full_secs,
            r.full_restore_secs,
            r.checkpoint_secs,
            r.checkpoint_restore_secs,
            r.checkpoint_bytes as f64 / 1e6,
            r.stop_secs
        );
    }
    println!("start until the read sent while it was down is committed (its change published):");
    println!(
        "{:>10} | {:>26} | {:>26}",
        "cursors", "whole changelog", "checkpoint + tail"
    );
    for r in rows {
        println!(
            "{:>10} | {:>24.2} s | {:>24.2} s",
            r.cursors, r.full_first_secs, r.checkpoint_first_secs
        );
    }
    if cql {
        println!("until CQL holds the restored state again (snapshot backlog 0): seconds from the start, keys written by the snapshots, peak RSS by then");
        println!(
            "{:>10} | {:>36} | {:>36}",
            "cursors", "whole changelog", "checkpoint + tail"
        );
        let cell = |c: Option<CqlCatchUp>| {
            c.map_or("-".to_owned(), |c| {
                format!(
                    "{:.2} s, {:.0} keys, {:.0} MB",
                    c.secs,
                    c.keys,
                    c.peak_rss as f64 / 1e6
                )
            })
        };
        for r in rows {
            println!(
                "{:>10} | {:>36} | {:>36}",
                r.cursors,
                cell(r.full_cql),
                cell(r.checkpoint_cql)
            );
        }
    }
}
