//! `readfold-bench raw-consume` (hidden): the throughput bench's like-for-like
//! ceiling. A plain librdkafka group consumer in a process of its own, as
//! `kcat -G` is: it joins the group, takes both inputs one message at a time
//! (`rd_kafka_consumer_poll`), decodes nothing, commits once it has read to
//! the end, and exits. The bench times it exactly as it times `readfold
//! run`: from process start until the group's committed offsets reach the
//! end of both inputs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use readfold::config::Config;
use readfold_kafka::reader::{partition_ids, watermarks_of};

use crate::child::{cpu_secs_of, peak_rss_of};
use crate::error::{Error, Result};

/// Gives up when the inputs are not read to their end in this long.
const DEADLINE: Duration = Duration::from_secs(600);

/// Reads both inputs to the ends they had at the start, commits, and
/// returns how many records it read.
pub fn raw_consume(config: &Config) -> Result<u64> {
    // readfold's own fetch tuning: with librdkafka's defaults a consumer
    // that falls behind its fetches idles for fetch.queue.backoff.ms (1 s)
    // at a time, as kcat -G does on this backlog.
    let consumer: BaseConsumer = config
        .kafka
        .backlog_client_config()
        .set("group.id", &config.kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let topics = [
        config.topics.read_reports.as_str(),
        config.topics.conversation_events.as_str(),
    ];
    // The end of each partition still to be read to it, by topic index
    // and partition; no allocation per message.
    let mut left: HashMap<(usize, i32), i64> = HashMap::new();
    for (t, topic) in topics.iter().enumerate() {
        let partitions = partition_ids(&consumer, topic)?;
        let ends = watermarks_of(&consumer, topic, &partitions, Duration::from_secs(10))?;
        for (p, (_, high)) in partitions.into_iter().zip(ends) {
            if high > 0 {
                left.insert((t, p), high);
            }
        }
    }
    consumer.subscribe(&topics)?;
    let mut read = 0u64;
    let mut next: HashMap<(usize, i32), i64> = HashMap::new();
    let started = Instant::now();
    while !left.is_empty() {
        if started.elapsed() > DEADLINE {
            return Err(Error::timeout(
                format!(
                    "the raw consumer did not read {} partitions to their end",
                    left.len()
                ),
                DEADLINE.as_secs(),
            ));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = polled?;
        read += 1;
        let position = message.offset() + 1;
        let key = (usize::from(message.topic() != topics[0]), message.partition());
        if left.get(&key).is_some_and(|&end| position >= end) {
            left.remove(&key);
        }
        next.insert(key, position);
    }
    let mut offsets = TopicPartitionList::new();
    for (&(t, partition), &position) in &next {
        offsets.add_partition_offset(topics[t], partition, Offset::Offset(position))?;
    }
    consumer.commit(&offsets, CommitMode::Sync)?;
    Ok(read)
}

/// This process's CPU seconds and peak RSS (bytes), as one line for the
/// bench: "CPU_SECS PEAK_RSS".
pub fn own_usage() -> String {
    let pid = std::process::id();
    format!("{} {}", cpu_secs_of(&pid.to_string()), peak_rss_of(pid))
}

/// Reads [`own_usage`]'s line back: (CPU seconds, peak RSS).
pub fn parse_usage(line: &str) -> Option<(f64, u64)> {
    let (cpu, rss) = line.trim().split_once(' ')?;
    Some((cpu.parse().ok()?, rss.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_usage_reads_back() {
        let (cpu, rss) = parse_usage(&own_usage()).expect("a usage line");
        assert!(cpu >= 0.0);
        assert!(rss > 0, "this process has resident memory");
        assert_eq!(parse_usage("1.5 2000\n"), Some((1.5, 2000)));
        assert_eq!(parse_usage("nonsense"), None);
    }
}
