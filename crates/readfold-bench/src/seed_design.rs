//! The seed design's consumer, as a baseline for the throughput bench:
//! for each read report, one Redis EVALSHA that max-merges the cursor into
//! the conversation's hash, then, if it moved, one event produced to a
//! topic for push. Pipelined, the EVALSHAs of one poll go in one round
//! trip. No fold, no coalescing, no transactions: what the articles in
//! `../shared/seeds/` describe, written as directly as it can be.
//!
//! It runs in this process (its CPU is this process's), reads only the
//! reports topic (it has no use for conversation events), and is timed until
//! it has handled every report and its events are acknowledged.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use readfold::config::Config;
use readfold_replay::source::{sources, KafkaInputs, Polled};
use readfold_wire::codec::{self, WireFormat};

use crate::child::cpu_secs_of;
use crate::error::{Error, Result};
use crate::throughput::ThroughputRow;

/// Max-merge of one member's cursor into the conversation's hash.
const MAX_MERGE: &str = r"
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local new = tonumber(ARGV[2])
if new > old then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
";

/// Reports taken from one poll before they are pipelined (max.poll.records
/// of a Java consumer is 500).
const POLL_BATCH: usize = 500;

pub fn seed_design(config: &Config, pipelined: bool, reports: u64) -> Result<ThroughputRow> {
    let fail = |what: &'static str| move |source| Error::SeedDesign { what, source };
    let consumer = Error::replay("seed design: consumer");
    let redis_url = config.redis.url.clone();
    let client = redis::Client::open(redis_url.as_str()).map_err(fail("redis"))?;
    let mut redis = client.get_connection().map_err(fail("redis"))?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(MAX_MERGE)
        .query(&mut redis)
        .map_err(fail("script load"))?;
    let prefix = format!("{}:seed-{}:", config.redis.key_prefix, pipelined);
    let events_topic = format!("{}.seed-events", config.topics.read_reports);

    let producer: BaseProducer = config
        .kafka
        .client_config()
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()?;
    // The reports topic only, read as the raw-read row reads it.
    let reports_only: Vec<_> = sources(&config.topics, false)
        .into_iter()
        .filter(|(_, topic)| *topic == config.topics.read_reports)
        .collect();
    let mut inputs = KafkaInputs::open(&config.kafka, &reports_only, &[]).map_err(&consumer)?;
    let partitions = inputs.partitions().len();
    let mut done = vec![false; partitions];

    let (cpu, started) = (cpu_secs_of("self"), Instant::now());
    let (mut handled, mut calls) = (0u64, 0u64);
    let mut batch: Vec<(String, String, i64)> = Vec::with_capacity(POLL_BATCH);
    while handled < reports {
        if started.elapsed() > Duration::from_secs(900) {
            return Err(Error::timeout(
                format!("the seed design's consumer handled only {handled} of {reports} reports"),
                900,
            ));
        }
        batch.clear();
        // One poll: what the partitions have ready, up to a batch (or one
        // report at a time without pipelining).
        let want = if pipelined { POLL_BATCH } else { 1 };
        for (i, finished) in done.iter_mut().enumerate() {
            while !*finished && batch.len() < want {
                let polled = inputs
                    .poll_next(i, Duration::ZERO, |_, r| {
                        r.value
                            .and_then(|v| codec::decode_read_report(v, WireFormat::Plain).ok())
                    })
                    .map_err(&consumer)?;
                match polled {
                    Polled::Record(report) => {
                        handled += 1;
                        if let Some(r) = report {
                            batch.push((r.conversation_id, r.user_id, r.seq));
                        }
                    }
                    Polled::Empty => break,
                    Polled::Done => *finished = true,
                }
            }
        }
        if batch.is_empty() {
            if done.iter().all(|d| *d) {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let evalsha = |(conversation, user, seq): &(String, String, i64)| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha)
                .arg(1)
                .arg(format!("{prefix}{conversation}"))
                .arg(user)
                .arg(seq);
            cmd
        };
        let moved: Vec<i64> = if pipelined {
            let mut pipe = redis::pipe();
            for report in &batch {
                pipe.add_command(evalsha(report));
            }
            pipe.query(&mut redis)
        } else {
            batch
                .iter()
                .map(|report| evalsha(report).query(&mut redis))
                .collect()
        }
        .map_err(fail("evalsha"))?;
        calls += batch.len() as u64;
        for ((conversation, user, seq), moved) in batch.iter().zip(moved) {
            if moved == 0 {
                continue;
            }
            let payload = format!("{user}:{seq}");
            let mut record = BaseRecord::to(&events_topic)
                .key(conversation.as_str())
                .payload(&payload);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        producer.poll(Duration::from_millis(1));
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(60))?;
    let secs = started.elapsed().as_secs_f64();
    let _: () = redis::cmd("EVAL")
        .arg("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end")
        .arg(0)
        .arg(format!("{prefix}*"))
        .query(&mut redis)
        .unwrap_or(());
    Ok(ThroughputRow {
        what: if pipelined {
            "seed design, pipelined per poll"
        } else {
            "seed design: EVALSHA per report"
        },
        records: reports,
        secs,
        cpu_secs: cpu_secs_of("self") - cpu,
        peak_rss: 0,
        redis_calls: calls as f64,
        cql_statements: 0.0,
        flushes: 0.0,
        servers: Default::default(),
    })
}
