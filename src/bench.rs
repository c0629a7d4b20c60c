//! `readfold bench`: write amplification and fold speed, measured on the pure
//! fold with a synthetic workload (one hot group, many 1:1 chats). No I/O:
//! it counts what each flush would send to Redis and CQL.

use std::collections::HashSet;
use std::time::Instant;

use crate::domain::{ConversationId, Seq, UserId};
use crate::fold::{ConversationEvent, EventKind, PartitionState, ReadReport};

/// Workload shape.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub reports: u64,
    pub group_members: u64,
    pub direct_chats: u64,
    /// Reports folded between two flushes (rate x flush interval).
    pub flush_every: u64,
}

/// What the run measured.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub reports: u64,
    pub flushes: u64,
    pub cursor_updates: u64,
    pub redis_calls: u64,
    pub elapsed_secs: f64,
    pub cursors: usize,
}

/// A small deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub fn run(w: Workload) -> Figures {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut state = PartitionState::new();
    let group: ConversationId = "hot-group".parse().expect("id");
    let members: Vec<UserId> = (0..w.group_members)
        .map(|i| UserId::parse(&format!("m{i}"), 64).expect("id"))
        .collect();
    let chats: Vec<ConversationId> = (0..w.direct_chats)
        .map(|i| ConversationId::parse(&format!("dm{i}"), 64).expect("id"))
        .collect();
    let pair = [
        UserId::parse("a", 8).expect("id"),
        UserId::parse("b", 8).expect("id"),
    ];
    let mut group_latest = 0u64;
    let mut chat_latest = vec![0u64; chats.len()];
    let (mut flushes, mut cursor_updates, mut redis_calls) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for i in 0..w.reports {
        if i % 2 == 0 {
            // The hot group: a message every 10 reports, everyone reads near the end.
            if i % 20 == 0 {
                group_latest += 1;
                state.apply_event(&ConversationEvent {
                    conversation_id: group.clone(),
                    seq: Seq(group_latest),
                    at: i as i64,
                    kind: EventKind::MessageSent {
                        sender_id: members[0].clone(),
                    },
                });
            }
            let reader = &members[(rng.next() % w.group_members) as usize];
            let seq = group_latest.saturating_sub(rng.next() % 3).max(1);
            state.apply_report(&ReadReport {
                conversation_id: group.clone(),
                user_id: reader.clone(),
                seq: Seq(seq),
                reported_at: i as i64,
            });
        } else {
            let c = (rng.next() % w.direct_chats) as usize;
            if rng.next() % 2 == 0 {
                chat_latest[c] += 1;
            }
            let seq = chat_latest[c].max(1);
            state.apply_report(&ReadReport {
                conversation_id: chats[c].clone(),
                user_id: pair[(rng.next() % 2) as usize].clone(),
                seq: Seq(seq),
                reported_at: i as i64,
            });
        }
        if (i + 1) % w.flush_every == 0 || i + 1 == w.reports {
            let changes = state.drain();
            let conversations: HashSet<ConversationId> =
                changes.iter().map(|c| c.key().conversation_id).collect();
            flushes += 1;
            cursor_updates += changes.len() as u64;
            redis_calls += conversations.len() as u64;
        }
    }
    Figures {
        reports: w.reports,
        flushes,
        cursor_updates,
        redis_calls,
        elapsed_secs: started.elapsed().as_secs_f64(),
        cursors: state.cursor_count(),
    }
}

/// Resident memory per cursor of a state holding `cursors` cursors, 100 per
/// conversation, ids like those of the restore bench.
pub fn state_bytes_per_cursor(cursors: u64) -> f64 {
    let before = resident_bytes();
    let mut state = PartitionState::new();
    for i in 0..cursors {
        state.restore_update(&crate::fold::CursorUpdate {
            conversation_id: ConversationId::parse(&format!("conv-{}", i / 100), 64).expect("id"),
            user_id: UserId::parse(&format!("user-{}", i % 100), 64).expect("id"),
            cursor: Seq(i % 1000 + 1),
            join_seq: Seq(1),
            latest_seq: Seq(1000),
            updated_at: 0,
        });
    }
    let grown = resident_bytes().saturating_sub(before);
    let held = state.cursor_count().max(1);
    drop(state);
    grown as f64 / held as f64
}

/// Changelog records decoded per second (key and value), the restore's
/// inner loop.
pub fn decode_rate(records: u64) -> f64 {
    use crate::codec::{decode_cursor_key, decode_cursor_update, encode_cursor_key, encode_cursor_update};
    use crate::codec::{CursorKeyRecord, CursorUpdateRecord};
    let key = encode_cursor_key(&CursorKeyRecord {
        conversation_id: "conv-12345".into(),
        user_id: "user-42".into(),
    });
    let value = encode_cursor_update(&CursorUpdateRecord {
        conversation_id: "conv-12345".into(),
        user_id: "user-42".into(),
        cursor: 1234,
        join_seq: 1,
        latest_seq: 1300,
        updated_at: 1_700_000_000_000,
    });
    let started = Instant::now();
    let mut sum = 0i64;
    for _ in 0..records {
        let k = decode_cursor_key(&key).expect("valid key");
        let v = decode_cursor_update(&value).expect("valid value");
        sum += v.cursor + k.user_id.len() as i64;
    }
    std::hint::black_box(sum);
    records as f64 / started.elapsed().as_secs_f64()
}

pub fn print(w: Workload, f: Figures) {
    let per = |n: u64| n as f64 / f.reports as f64;
    println!(
        "workload: {} reports, half to one {}-member group, half to {} 1:1 chats; a flush every {} reports",
        w.reports, w.group_members, w.direct_chats, w.flush_every
    );
    println!(
        "fold (pure, one core):            {:>12.0} reports/s",
        f.reports as f64 / f.elapsed_secs
    );
    println!(
        "changelog decode (one core):      {:>12.0} records/s",
        decode_rate(200_000)
    );
    println!(
        "memory per cursor (1M in one state): {:>9.0} bytes",
        state_bytes_per_cursor(1_000_000)
    );
    println!("flushes:                          {:>12}", f.flushes);
    println!("cursors held:                     {:>12}", f.cursors);
    println!(
        "Redis script calls per report:    {:>12.4}   (seed design: 1 EVAL per report; ratio {:.1}x fewer)",
        per(f.redis_calls),
        1.0 / per(f.redis_calls).max(f64::MIN_POSITIVE)
    );
    println!("cursor updates per report:        {:>12.4}   (= CQL rows and changelog records per report; seed: 1; ratio {:.1}x fewer)",
        per(f.cursor_updates), 1.0 / per(f.cursor_updates).max(f64::MIN_POSITIVE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_never_writes_more_than_one_update_per_report() {
        let w = Workload {
            reports: 10_000,
            group_members: 50,
            direct_chats: 100,
            flush_every: 500,
        };
        let f = run(w);
        assert!(f.cursor_updates <= f.reports);
        assert!(f.redis_calls <= f.cursor_updates);
        assert_eq!(f.flushes, 20);
    }
}

/// What a restore run measured.
#[derive(Clone, Copy, Debug)]
pub struct RestoreFigures {
    pub cursors: usize,
    pub records: u64,
    pub elapsed_secs: f64,
    /// Resident memory growth from before the restore to after it (the
    /// consumer closed), per cursor: an upper bound on the state's size.
    pub bytes_per_cursor: f64,
}

fn resident_bytes() -> u64 {
    // /proc/self/statm: size resident ... in pages.
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// Writes `cursors` changelog records to a fresh one-partition compacted
/// topic on the configured broker, then times a restore of it.
pub async fn restore(config: &crate::config::Config, cursors: u64) -> crate::error::Result<RestoreFigures> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    use crate::codec::{encode_cursor_key, encode_cursor_update, CursorKeyRecord, CursorUpdateRecord};
    use crate::error::Error;

    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let topic = format!("readfold.bench-restore.{stamp}");
    let admin: AdminClient<DefaultClientContext> = crate::kafka::base_client_config(config).create()?;
    let new_topic = NewTopic::new(
        &topic,
        1,
        TopicReplication::Fixed(config.topics.replication_factor),
    )
    .set("cleanup.policy", "compact");
    for result in admin.create_topics([&new_topic], &AdminOptions::new()).await? {
        result.map_err(|(t, code)| Error::Other(format!("cannot create {t}: {code}")))?;
    }
    let producer: FutureProducer = crate::kafka::base_client_config(config)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut pending = Vec::new();
    for i in 0..cursors {
        let (conversation_id, user_id) = (format!("conv-{}", i / 100), format!("user-{}", i % 100));
        let key = encode_cursor_key(&CursorKeyRecord {
            conversation_id: conversation_id.clone(),
            user_id: user_id.clone(),
        });
        let value = encode_cursor_update(&CursorUpdateRecord {
            conversation_id,
            user_id,
            cursor: (i % 1000) as i64 + 1,
            join_seq: 1,
            latest_seq: 1000,
            updated_at: 0,
        });
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic)
            .partition(0)
            .key(key.as_slice())
            .payload(value.as_slice());
        loop {
            match producer.send_result(record) {
                Ok(delivery) => break pending.push(delivery),
                Err((_, back)) => {
                    record = back;
                    for delivery in pending.drain(..) {
                        let _ = delivery.await;
                    }
                }
            }
        }
    }
    for delivery in pending {
        delivery
            .await
            .map_err(|_| Error::Other("delivery canceled".into()))?
            .map_err(|(e, _)| Error::Kafka(e))?;
    }
    let mut restore_config = config.clone();
    restore_config.topics.read_cursors = topic.clone();
    let restorer = crate::kafka::restore::Restorer::new(&restore_config)?;
    let before = resident_bytes();
    // The restorer (and its consumer's fetch buffers) is dropped inside the
    // task, so the growth measured after it is mostly the state itself.
    let (state, stats) = tokio::task::spawn_blocking(move || restorer.restore(0))
        .await
        .map_err(|e| Error::Other(e.to_string()))??;
    let grown = resident_bytes().saturating_sub(before);
    let figures = RestoreFigures {
        cursors: state.cursor_count(),
        records: stats.records,
        elapsed_secs: stats.elapsed.as_secs_f64(),
        bytes_per_cursor: grown as f64 / state.cursor_count().max(1) as f64,
    };
    drop(state);
    let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;
    Ok(figures)
}

pub fn print_restore(f: RestoreFigures) {
    println!(
        "restore: {} cursors from {} changelog records in {:.2} s = {:.0} cursors/s ({:.1} s per million); \
         resident memory grew by ~{:.0} bytes per cursor (with the consumer's fetch buffers)",
        f.cursors,
        f.records,
        f.elapsed_secs,
        f.cursors as f64 / f.elapsed_secs,
        f.elapsed_secs * 1e6 / f.cursors.max(1) as f64,
        f.bytes_per_cursor
    );
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

/// Runs the whole pipeline in this process on the configured services, on
/// fresh topics: produces `reports` reports as fast as it can, and reads the
/// changelog (read_committed) until every cursor has arrived. Latency is
/// from a report's `reported_at` to the moment its cursor is read back.
pub async fn pipeline(config: &crate::config::Config, reports: u64) -> crate::error::Result<PipelineFigures> {
    use std::collections::HashMap;
    use std::time::Duration;

    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};

    use crate::codec::{decode_cursor_update, ReadReportRecord};
    use crate::error::Error;

    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    let stamp = now_ms();
    let mut config = config.clone();
    for (topic, role) in [
        (&mut config.topics.read_reports, "read-reports"),
        (&mut config.topics.conversation_events, "conversation-events"),
        (&mut config.topics.read_cursors, "read-cursors"),
        (&mut config.topics.user_read_cursors, "user-read-cursors"),
        (&mut config.topics.dlq, "dlq"),
    ] {
        *topic = format!("readfold.bench-{stamp}.{role}");
    }
    config.kafka.group_id = format!("readfold-bench-{stamp}");
    config.redis.key_prefix = format!("readfold-bench-{stamp}");
    config.cql.keyspace = "readfold_bench".into();
    let layout = crate::kafka::admin::ensure_topics(&config).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let processor = crate::processor::Processor::new(config.clone(), layout).await?;
    let handle = tokio::spawn(processor.run(stopped));

    // 2,000 conversations x 5 readers; each report a higher seq than the last.
    let mut expected: HashMap<(String, String), i64> = HashMap::new();
    let producer = crate::kafka::input::InputProducer::new(&config, layout.partitions)?;
    let started = std::time::Instant::now();
    let mut batch = Vec::new();
    for i in 0..reports {
        let (c, u, seq) = (i % 2000, (i / 2000) % 5, (i / 10_000 + 1) as i64);
        let r = ReadReportRecord {
            conversation_id: format!("conv-{c}"),
            user_id: format!("user-{u}"),
            seq,
            device_id: None,
            reported_at: now_ms(),
            private: false,
        };
        expected.insert((r.conversation_id.clone(), r.user_id.clone()), seq);
        batch.push(r);
        if batch.len() == 10_000 {
            producer.send_many(&batch, &[]).await?;
            batch.clear();
        }
    }
    producer.send_many(&batch, &[]).await?;

    let consumer: BaseConsumer = crate::kafka::base_client_config(&config)
        .set("group.id", format!("{}-watch", config.kafka.group_id))
        .set("isolation.level", "read_committed")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..layout.partitions {
        tpl.add_partition_offset(&config.topics.read_cursors, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut latencies_ms = Vec::new();
    let mut remaining = expected.len();
    while remaining > 0 {
        if started.elapsed() > Duration::from_secs(600) {
            return Err(Error::Other(format!(
                "{remaining} cursors still missing after 600 s"
            )));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message?;
        let Some(Ok(update)) = message.payload().map(decode_cursor_update) else {
            continue;
        };
        latencies_ms.push(now_ms() - update.updated_at);
        let key = (update.conversation_id, update.user_id);
        if expected.get(&key) == Some(&update.cursor) {
            expected.remove(&key);
            remaining -= 1;
        }
    }
    let elapsed_secs = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    handle.await.map_err(|e| Error::Other(e.to_string()))??;
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        crate::kafka::base_client_config(&config).create()?;
    let topics = crate::kafka::admin::specs(&config).map(|s| s.name);
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let _ = admin
        .delete_topics(&names, &rdkafka::admin::AdminOptions::new())
        .await;
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
