//! `readfold-bench restore --cursors N [--thread-cursors M]`: writes N
//! changelog records to a fresh one-partition compacted topic on the
//! configured broker (and M thread-cursor records to another), then times a
//! restore of it (and of the threads after it, as a restore reads them).
//! Talks to Kafka.

use rdkafka::producer::{FutureProducer, FutureRecord};
use readfold::config::Config;
use readfold_core::partitioner::partition_for_key;
use readfold_kafka::admin::{create_topic, delete_topics};
use readfold_kafka::changelog::{ChangelogReader, RestoreStats};
use readfold_kafka::now_ms;
use readfold_wire::changelog::ChangelogKind;
use readfold_wire::codec::{
    encode_cursor_key, encode_cursor_update, encode_thread_cursor, encode_thread_key, CursorKeyRecord,
    CursorUpdateRecord, ThreadCursorRecord, ThreadKeyRecord,
};

use crate::error::{Error, Result};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Cursors written to the changelog topic and restored.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub cursors: u64,
    /// Thread cursors written to a thread changelog and restored after the
    /// cursors: 20 followers per thread, 5 threads per conversation.
    #[arg(long, default_value_t = 0)]
    pub thread_cursors: u64,
}

/// What a restore run measured.
#[derive(Clone, Copy, Debug)]
pub struct RestoreFigures {
    pub cursors: usize,
    pub records: u64,
    pub elapsed_secs: f64,
    /// Thread cursors (follower entries) restored, from how many records,
    /// in how long.
    pub thread_cursors: usize,
    pub thread_records: u64,
    pub thread_secs: f64,
}

pub async fn restore(config: &Config, cursors: u64, thread_cursors: u64) -> Result<RestoreFigures> {
    let stamp = now_ms();
    let topic = format!("readfold.bench-restore.{stamp}");
    let thread_topic = format!("readfold.bench-restore-threads.{stamp}");
    create_topic(&config.kafka, &topic, 1, config.topics.replication_factor, true).await?;
    create_topic(
        &config.kafka,
        &thread_topic,
        1,
        config.topics.replication_factor,
        true,
    )
    .await?;
    write_changelog(config, &topic, cursors, 1).await?;
    write_thread_changelog(config, &thread_topic, thread_cursors).await?;
    let reader = |topic: &str, kind| {
        ChangelogReader::new(
            &config.kafka,
            &format!("{}-bench-restore", config.kafka.group_id),
            topic,
            kind,
            config.input.max_id_bytes,
        )
    };
    let cursors_reader = reader(&topic, ChangelogKind::ByConversation)?;
    let threads_reader = reader(&thread_topic, ChangelogKind::ThreadByConversation)?;
    let (state, stats, thread_stats) = tokio::task::spawn_blocking(move || {
        let mut states = std::collections::BTreeMap::from([(0, readfold_core::fold::PartitionState::new())]);
        let whole = [(0, rdkafka::Offset::Beginning)];
        let mut stats = RestoreStats::default();
        let started = std::time::Instant::now();
        cursors_reader.restore_into(&whole, &mut states, &mut stats)?;
        stats.elapsed = started.elapsed();
        let mut thread_stats = RestoreStats::default();
        let started = std::time::Instant::now();
        threads_reader.restore_into(&whole, &mut states, &mut thread_stats)?;
        thread_stats.elapsed = started.elapsed();
        Ok::<_, readfold_kafka::Error>((states.remove(&0).unwrap_or_default(), stats, thread_stats))
    })
    .await
    .map_err(Error::task("restore"))??;
    let figures = RestoreFigures {
        cursors: state.cursor_count(),
        records: stats.records,
        elapsed_secs: stats.elapsed.as_secs_f64(),
        thread_cursors: state.thread_counts().1,
        thread_records: thread_stats.records,
        thread_secs: thread_stats.elapsed.as_secs_f64(),
    };
    drop(state);
    delete_topics(&config.kafka, &[&topic, &thread_topic]).await?;
    Ok(figures)
}

/// Writes `cursors` thread-cursor records to `topic` (one partition): 20
/// followers per thread, 5 threads per conversation of the cursors' own
/// (`conv-0`, ...), as a processor would have published them.
async fn write_thread_changelog(config: &Config, topic: &str, cursors: u64) -> Result<()> {
    write_records(config, topic, cursors, |i| {
        let (conversation_id, thread, user_id) = (
            format!("conv-{}", i / 100),
            (i / 20 % 5) as i64 + 1,
            format!("user-{}", i % 20),
        );
        let key = encode_thread_key(&ThreadKeyRecord {
            conversation_id: conversation_id.clone(),
            thread,
            user_id: user_id.clone(),
        });
        let value = encode_thread_cursor(&ThreadCursorRecord {
            conversation_id,
            thread,
            user_id,
            cursor: (i % 30) as i64 + 1,
            join_seq: 1,
            latest_seq: 30,
            updated_at: 0,
            private_cursor: None,
        });
        (0, key, value)
    })
    .await
}

/// Writes `cursors` by-conversation changelog records to `topic`, 100 per
/// conversation, each on its conversation's partition of `partitions`: a
/// state as a processor would have published it.
pub async fn write_changelog(config: &Config, topic: &str, cursors: u64, partitions: i32) -> Result<()> {
    write_records(config, topic, cursors, |i| {
        let (conversation_id, user_id) = (format!("conv-{}", i / 100), format!("user-{}", i % 100));
        let partition = partition_for_key(conversation_id.as_bytes(), partitions);
        let key = encode_cursor_key(&CursorKeyRecord {
            conversation_id: conversation_id.clone(),
            user_id: user_id.clone(),
        });
        let value = encode_cursor_update(&CursorUpdateRecord {
            muted_until: None,
            unread_mentions: None,
            conversation_id,
            user_id,
            cursor: (i % 1000) as i64 + 1,
            join_seq: 1,
            latest_seq: 1000,
            updated_at: 0,
            private_cursor: None,
            unread_mark: None,
            delivered_cursor: None,
        });
        (partition, key, value)
    })
    .await
}

/// Produces `count` records to `topic`, record `i` being `make(i)`:
/// (partition, key, value).
async fn write_records(
    config: &Config,
    topic: &str,
    count: u64,
    make: impl Fn(u64) -> (i32, Vec<u8>, Vec<u8>),
) -> Result<()> {
    let producer: FutureProducer = config
        .kafka
        .client_config()
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut pending = Vec::new();
    for i in 0..count {
        let (partition, key, value) = make(i);
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .partition(partition)
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
            .map_err(|_| Error::Kafka(readfold_kafka::Error::DeliveryCanceled))?
            .map_err(|(e, _)| Error::from(e))?;
    }
    Ok(())
}

pub fn print_restore(f: RestoreFigures) {
    println!(
        // Memory per restored cursor is the memory bench's "restored" rows,
        // each in a process of its own: here the allocator reuses the pages
        // the producer freed, and the growth says nothing.
        "restore: {} cursors from {} changelog records in {:.2} s = {:.0} cursors/s ({:.1} s per million)",
        f.cursors,
        f.records,
        f.elapsed_secs,
        f.cursors as f64 / f.elapsed_secs,
        f.elapsed_secs * 1e6 / f.cursors.max(1) as f64,
    );
    if f.thread_records > 0 {
        println!(
            "then threads: {} thread cursors from {} thread changelog records in {:.2} s = {:.0} thread cursors/s",
            f.thread_cursors,
            f.thread_records,
            f.thread_secs,
            f.thread_cursors as f64 / f.thread_secs.max(1e-9),
        );
    }
}
