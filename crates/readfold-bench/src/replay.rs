//! `readfold-bench replay --records N`: replay throughput from the
//! configured broker. Produces N records (a chat workload: a few large
//! groups and many 1:1 chats, one message event per six reports) onto fresh
//! topics, then times a raw read of them (replay's own consumer and
//! partition queues, no decode: the broker's and librdkafka's share) and
//! `readfold replay` of the cursors and latency tables, each from the
//! beginning.

use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_replay::source::{sources, KafkaInputs, Polled};
use readfold_replay::{Format, ProgressMode, ReplayOptions, TableKind};
use readfold_wire::codec::ReadReportRecord;

use crate::child::cpu_secs_of;
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics};
use crate::stats::median_run;
use crate::workload::{ChatWorkload, Generated};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Records produced to fresh topics and read back.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub records: u64,
    /// Times each way of reading the records, taking turns; the median run
    /// is shown, with the slowest and fastest.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// The timed reads of the bench topics of one kind.
#[derive(Clone, Debug)]
pub struct ReplayRow {
    pub what: &'static str,
    pub records: u64,
    /// Each run's (wall, CPU) seconds, in the order they ran.
    pub runs: Vec<(f64, f64)>,
}

impl ReplayRow {
    /// The run with the median rate (see [`median_run`]).
    pub fn median(&self) -> (f64, f64) {
        median_run(&self.runs, |run| run.0).unwrap_or((0.0, 0.0))
    }

    fn rate(&self, secs: f64) -> f64 {
        self.records as f64 / secs.max(1e-9)
    }
}

/// Produces `records` records, then reads them `runs` times in each way,
/// the ways taking turns so that a slow spell of the box hits each alike.
pub async fn replay(config: &Config, args: &Args) -> Result<Vec<ReplayRow>> {
    let (records, runs) = (args.records, args.runs);
    let config = on_fresh_topics(config, "replay");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    produce(&producer, records).await?;
    drop(producer);

    let run = config.clone();
    let rows = tokio::task::spawn_blocking(move || -> Result<Vec<ReplayRow>> {
        let ways: [(&'static str, Option<TableKind>); 3] = [
            ("raw read, no decode", None),
            ("replay, cursors table", Some(TableKind::Cursors)),
            ("replay, latency table", Some(TableKind::Latency)),
        ];
        let mut rows: Vec<ReplayRow> = ways
            .iter()
            .map(|&(what, _)| ReplayRow {
                what,
                records: 0,
                runs: vec![],
            })
            .collect();
        for _ in 0..runs.max(1) {
            for (row, (_, table)) in rows.iter_mut().zip(ways) {
                let (cpu, started) = (cpu_secs_of("self"), Instant::now());
                row.records = match table {
                    None => raw_read(&run)?,
                    Some(table) => replay_once(&run, table)?,
                };
                row.runs
                    .push((started.elapsed().as_secs_f64(), cpu_secs_of("self") - cpu));
            }
        }
        Ok(rows)
    })
    .await
    .map_err(Error::task("replay bench"))??;
    delete_bench_topics(&config.kafka, config.topics.names()).await?;
    delete_bench_keys(&config.redis).await;
    Ok(rows)
}

/// Every record of both topics through replay's own consumer and partition
/// queues, without decoding: what the broker and librdkafka allow here.
pub fn raw_read(config: &Config) -> Result<u64> {
    let fail = Error::replay("raw read");
    let mut inputs = KafkaInputs::open(&config.kafka, &sources(&config.topics, false), &[]).map_err(&fail)?;
    let n = inputs.partitions().len();
    let mut done = vec![false; n];
    let (mut records, mut bytes) = (0u64, 0usize);
    while done.iter().any(|d| !d) {
        let before = records;
        for (i, finished) in done.iter_mut().enumerate() {
            while !*finished {
                match inputs
                    .poll_next(i, Duration::ZERO, |_, r| r.value.map_or(0, <[u8]>::len))
                    .map_err(&fail)?
                {
                    Polled::Record(len) => {
                        records += 1;
                        bytes += len;
                    }
                    Polled::Empty => break,
                    Polled::Done => *finished = true,
                }
            }
        }
        if records == before {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    std::hint::black_box(bytes);
    Ok(records)
}

fn replay_once(config: &Config, table: TableKind) -> Result<u64> {
    let output = std::env::temp_dir().join(format!("{}.jsonl", config.kafka.group_id));
    let options = ReplayOptions {
        table,
        format: Format::Jsonl,
        output: Some(output.clone()),
        until: None,
        until_offsets: vec![],
        from_changelog: false,
        conversations: vec![],
        include_private: false,
        latency_max_open: 1_000_000,
        progress: ProgressMode::Off,
    };
    let summary = readfold_replay::replay(&config.kafka, &config.topics, &config.input, &options)
        .map_err(Error::replay("replay"))?;
    let _ = std::fs::remove_file(output);
    Ok(summary.records)
}

/// `records` records of the [`ChatWorkload`], stamped 100 apart per ms.
/// Returns how many reports and events it produced.
pub async fn produce(producer: &InputProducer, records: u64) -> Result<(u64, u64)> {
    produce_seeing(producer, records, |_| {}).await
}

/// [`produce`], showing each report to `seen` as it goes.
pub async fn produce_seeing(
    producer: &InputProducer,
    records: u64,
    mut seen: impl FnMut(&ReadReportRecord),
) -> Result<(u64, u64)> {
    let mut workload = ChatWorkload::new("");
    let now = now_ms();
    let (mut reports, mut events) = (Vec::new(), Vec::new());
    let (mut report_count, mut event_count) = (0, 0);
    for i in 0..records {
        match workload.next(now + i as i64 / 100) {
            Generated::Report(r) => {
                seen(&r);
                reports.push(r);
            }
            Generated::Event(e) => events.push(e),
        }
        if reports.len() + events.len() >= 20_000 {
            report_count += reports.len() as u64;
            event_count += events.len() as u64;
            producer.send_many(&reports, &events).await?;
            reports.clear();
            events.clear();
        }
    }
    producer.send_many(&reports, &events).await?;
    Ok((
        report_count + reports.len() as u64,
        event_count + events.len() as u64,
    ))
}

pub fn print_replay(rows: &[ReplayRow]) {
    let raw = rows.first().map_or(1.0, |r| r.rate(r.median().0));
    let runs = rows.first().map_or(0, |r| r.runs.len());
    println!(
        "replay from the local broker, the median of {runs} runs (records/s, its CPU-s per 1M records, share of a raw read; the slowest and fastest run):"
    );
    for r in rows {
        let (secs, cpu) = r.median();
        let rate = r.rate(secs);
        let slowest = r.runs.iter().map(|run| run.0).fold(0.0, f64::max);
        let fastest = r.runs.iter().map(|run| run.0).fold(f64::INFINITY, f64::min);
        println!(
            "  {:<24} {:>9} records in {:>6.2} s = {:>10.0} records/s   {:>5.2} CPU-s/1M   {:>4.2}   ({:.0}-{:.0})",
            r.what,
            r.records,
            secs,
            rate,
            cpu * 1e6 / r.records.max(1) as f64,
            rate / raw,
            r.rate(slowest),
            r.rate(fastest),
        );
    }
}
