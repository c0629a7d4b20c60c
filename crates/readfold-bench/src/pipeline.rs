//! `readfold-bench pipeline --reports N`: the whole pipeline in this process
//! on the configured Kafka, Redis and CQL, on fresh topics. Talks to all
//! three.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_processor::Processor;
use readfold_wire::changelog::ChangelogEntry;
use readfold_wire::codec::{ReadAction, ReadReportRecord};

use crate::error::{Error, Result};
use crate::fresh::{changelog_watcher, delete_bench_keys, delete_bench_topics, on_fresh_topics};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Reports produced to fresh topics and folded.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub reports: u64,
}

/// What a pipeline run measured.
#[derive(Clone, Debug)]
pub struct PipelineFigures {
    pub reports: u64,
    pub elapsed_secs: f64,
    pub latencies_ms: Vec<i64>,
}

impl PipelineFigures {
    fn percentile(&self, p: f64) -> i64 {
        let mut sorted = self.latencies_ms.clone();
        sorted.sort_unstable();
        sorted
            .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0)
    }
}

/// Produces `reports` reports as fast as it can, and reads the changelog
/// (read_committed) until every cursor has arrived. Latency is from a
/// report's `reported_at` to the moment its cursor is read back.
pub async fn pipeline(config: &Config, reports: u64) -> Result<PipelineFigures> {
    let config = on_fresh_topics(config, "pipeline");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let processor = Processor::new(config.processor_settings(), layout).await?;
    let handle = tokio::spawn(processor.run(stopped));

    // 2,000 conversations x 5 readers; each report a higher seq than the last.
    let mut expected: HashMap<(String, String), i64> = HashMap::new();
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let started = Instant::now();
    let mut batch = Vec::new();
    for i in 0..reports {
        let (c, u, seq) = (i % 2000, (i / 2000) % 5, (i / 10_000 + 1) as i64);
        let r = ReadReportRecord {
            thread: 0,
            muted_until: None,
            conversation_id: format!("conv-{c}"),
            user_id: format!("user-{u}"),
            seq,
            device_id: None,
            reported_at: now_ms(),
            private: false,
            action: ReadAction::Read,
        };
        expected.insert((r.conversation_id.clone(), r.user_id.clone()), seq);
        batch.push(r);
        if batch.len() == 10_000 {
            producer.send_many(&batch, &[]).await?;
            batch.clear();
        }
    }
    producer.send_many(&batch, &[]).await?;

    let reader = changelog_watcher(&config)?;
    let (latencies_ms, elapsed_secs) = tokio::task::spawn_blocking(move || -> Result<(Vec<i64>, f64)> {
        reader.follow(None)?;
        let mut latencies_ms = Vec::new();
        let mut remaining = expected.len();
        while remaining > 0 {
            if started.elapsed() > Duration::from_secs(600) {
                return Err(Error::timeout(
                    format!("{remaining} cursors did not reach the changelog"),
                    600,
                ));
            }
            reader.for_each_available(Duration::from_millis(200), |entry| {
                let ChangelogEntry::Upsert(update) = entry else {
                    return;
                };
                latencies_ms.push(now_ms() - update.updated_at);
                let key = (update.conversation_id.to_string(), update.user_id.to_string());
                if expected.get(&key) == Some(&(update.cursor.get() as i64)) {
                    expected.remove(&key);
                    remaining -= 1;
                }
            })?;
        }
        Ok((latencies_ms, started.elapsed().as_secs_f64()))
    })
    .await
    .map_err(Error::task("changelog reader"))??;
    let _ = stop.send(true);
    handle.await.map_err(Error::task("processor"))??;
    delete_bench_topics(&config.kafka, config.topics.names()).await?;
    delete_bench_keys(&config.redis).await;
    Ok(PipelineFigures {
        reports,
        elapsed_secs,
        latencies_ms,
    })
}

pub fn print_pipeline(f: &PipelineFigures) {
    println!(
        "pipeline: {} reports through Kafka, Redis and CQL in {:.2} s = {:.0} reports/s (producer, processor and reader share this machine); \
         report-to-changelog latency p50 {} ms, p99 {} ms over {} changelog records",
        f.reports,
        f.elapsed_secs,
        f.reports as f64 / f.elapsed_secs,
        f.percentile(0.5),
        f.percentile(0.99),
        f.latencies_ms.len()
    );
}
