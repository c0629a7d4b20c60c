//! Restore: rebuild one partition's state from its compacted changelog
//! partition before processing it, so that a restart or rebalance never
//! emits a cursor lower than one already published.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::codec;
use crate::config::Config;
use crate::domain::{ConversationId, CursorKey, Seq, UserId};
use crate::error::{Error, Result};
use crate::fold::{CursorUpdate, PartitionState};
use crate::kafka::base_client_config;

/// Reads changelog partitions to their end, outside the consumer group.
pub struct Restorer {
    consumer: BaseConsumer,
    topic: String,
    max_id_bytes: usize,
    timeout: Duration,
}

/// What one restore did.
#[derive(Clone, Copy, Debug, Default)]
pub struct RestoreStats {
    pub records: u64,
    pub cursors: usize,
    pub elapsed: Duration,
}

impl Restorer {
    pub fn new(config: &Config) -> Result<Self> {
        let consumer: BaseConsumer = base_client_config(config)
            .set("group.id", format!("{}-restore", config.kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            // Only what committed transactions published counts.
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("fetch.max.bytes", "52428800")
            .set("max.partition.fetch.bytes", "52428800")
            // At the end of the partition the broker would otherwise hold each
            // fetch for fetch.wait.max.ms (500 ms) before saying so.
            .set("fetch.wait.max.ms", "20")
            .create()?;
        Ok(Restorer {
            consumer,
            topic: config.topics.read_cursors.clone(),
            max_id_bytes: config.input.max_id_bytes,
            timeout: Duration::from_secs(600),
        })
    }

    /// Reads `partition` of the changelog from the beginning up to its end
    /// (the last stable offset, since this reader is read_committed).
    pub fn restore(&self, partition: i32) -> Result<(PartitionState, RestoreStats)> {
        let started = Instant::now();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, partition, Offset::Beginning)?;
        self.consumer.assign(&tpl)?;
        let mut state = PartitionState::new();
        let mut records = 0u64;
        let result = loop {
            if started.elapsed() > self.timeout {
                break Err(Error::Other(format!(
                    "restore of {}[{partition}] did not reach the end within {:?}",
                    self.topic, self.timeout
                )));
            }
            match self.consumer.poll(Duration::from_millis(500)) {
                None => continue,
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition => break Ok(()),
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) => break Err(e.into()),
                Some(Ok(message)) => {
                    records += 1;
                    self.apply(
                        &mut state,
                        message.key(),
                        message.payload(),
                        message.offset(),
                        partition,
                    );
                }
            }
        };
        self.consumer.unassign()?;
        result?;
        let stats = RestoreStats {
            records,
            cursors: state.cursor_count(),
            elapsed: started.elapsed(),
        };
        Ok((state, stats))
    }

    fn apply(
        &self,
        state: &mut PartitionState,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        offset: i64,
        partition: i32,
    ) {
        let Some(key) = key.and_then(|k| codec::decode_cursor_key(k).ok()) else {
            tracing::warn!(topic = %self.topic, partition, offset, "skipping changelog record with an unreadable key");
            return;
        };
        let ids = (
            ConversationId::parse(&key.conversation_id, self.max_id_bytes),
            UserId::parse(&key.user_id, self.max_id_bytes),
        );
        let (Ok(conversation_id), Ok(user_id)) = ids else {
            tracing::warn!(topic = %self.topic, partition, offset, "skipping changelog record with an invalid id");
            return;
        };
        match value.map(codec::decode_cursor_update) {
            None => state.restore_tombstone(&CursorKey {
                conversation_id,
                user_id,
            }),
            Some(Ok(v)) => state.restore_update(&CursorUpdate {
                conversation_id,
                user_id,
                cursor: Seq(v.cursor.max(0) as u64),
                join_seq: Seq(v.join_seq.max(1) as u64),
                latest_seq: Seq(v.latest_seq.max(0) as u64),
                updated_at: v.updated_at,
            }),
            Some(Err(e)) => {
                tracing::warn!(topic = %self.topic, partition, offset, error = %e, "skipping unreadable changelog value")
            }
        }
    }
}
