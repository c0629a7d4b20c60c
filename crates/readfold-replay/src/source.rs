//! The Kafka side of a replay: every partition of the topics it reads (both
//! inputs, or the changelogs), each on a queue of its own so that the merge
//! can ask one partition for its next record, read from the beginning to an
//! end fixed when the replay starts. The consumers are assigned partitions
//! directly: they join no group and commit nothing, so production is not
//! touched.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use readfold_core::fold::InputKind;
use readfold_kafka::partition_queue::{BatchedPartitionQueue, QueuedMessage};
use readfold_kafka::reader::{partition_ids, watermarks_of};
use readfold_kafka::{KafkaConfig, TopicsConfig};
use readfold_wire::ChangelogKind;

use crate::error::{Error, Result};
use crate::range::OffsetBound;

const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// What a topic holds, and so how its records are decoded and folded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Input(InputKind),
    Changelog(ChangelogKind),
}

impl Source {
    /// Where the topic's records sort among records with the same
    /// timestamp: conversation events before read reports (a message exists
    /// before it is read); public cursors before member state (as a restore
    /// applies them).
    pub fn rank(self) -> u8 {
        match self {
            Source::Input(InputKind::ConversationEvents)
            | Source::Changelog(ChangelogKind::ByConversation) => 0,
            Source::Input(InputKind::ReadReports) | Source::Changelog(_) => 1,
        }
    }
}

/// The topics a replay reads: both inputs, or the changelogs a restore
/// reads.
pub fn sources(topics: &TopicsConfig, from_changelog: bool) -> Vec<(Source, String)> {
    if from_changelog {
        vec![
            (
                Source::Changelog(ChangelogKind::ByConversation),
                topics.read_cursors.clone(),
            ),
            (
                Source::Changelog(ChangelogKind::MemberState),
                topics.member_state.clone(),
            ),
        ]
    } else {
        vec![
            (
                Source::Input(InputKind::ConversationEvents),
                topics.conversation_events.clone(),
            ),
            (Source::Input(InputKind::ReadReports), topics.read_reports.clone()),
        ]
    }
}

/// One partition and the offsets a replay reads of it.
#[derive(Clone, Debug)]
pub struct InputPartition {
    pub source: Source,
    pub topic: String,
    pub partition: i32,
    /// Partitions of the topic, for the processor's placement check.
    pub partition_count: i32,
    /// First offset still in the log.
    pub start: i64,
    /// Replay stops before this offset.
    pub end: i64,
}

/// A record as the replay needs it.
pub struct RawRecord<'a> {
    pub timestamp: i64,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// A record fetched before its partition had a queue of its own.
struct Early {
    timestamp: i64,
    offset: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
}

pub struct KafkaInputs {
    /// One consumer per input topic, so that an end-of-partition event,
    /// which names only a partition id, is never ambiguous.
    consumers: Vec<Arc<BaseConsumer>>,
    partitions: Vec<InputPartition>,
    /// Which consumer reads each partition.
    owner: Vec<usize>,
    queues: Vec<Option<BatchedPartitionQueue<DefaultConsumerContext>>>,
    /// Per partition: records that reached the shared queue before the
    /// split, in offset order, and whether its end was seen there.
    early: Vec<(VecDeque<Early>, bool)>,
    polls: u64,
}

impl KafkaInputs {
    /// Looks up the topics, fixes every partition's end (its high watermark
    /// now, or an `--until-offset` below it) and starts fetching.
    pub fn open(kafka: &KafkaConfig, inputs: &[(Source, String)], bounds: &[OffsetBound]) -> Result<Self> {
        let mut bounds_by_place: HashMap<(&str, i32), i64> = HashMap::new();
        for b in bounds {
            if !inputs.iter().any(|(_, t)| *t == b.topic) {
                let names: Vec<&str> = inputs.iter().map(|(_, t)| t.as_str()).collect();
                return Err(Error::Usage(format!(
                    "--until-offset names {:?}, which this replay does not read ({})",
                    b.topic,
                    names.join(", ")
                )));
            }
            bounds_by_place.insert((b.topic.as_str(), b.partition), b.offset);
        }
        // Fetch sizes and pacing: see backlog_client_config.
        let mut client = kafka.backlog_client_config();
        client
            .set("group.id", format!("readfold-replay-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            // What a live processor would have folded: committed records only.
            .set("isolation.level", "read_committed")
            // At a partition's end the broker holds a fetch this long.
            .set("fetch.wait.max.ms", "50");
        let mut inputs_read = KafkaInputs {
            consumers: vec![],
            partitions: vec![],
            owner: vec![],
            queues: vec![],
            early: vec![],
            polls: 0,
        };
        for (source, topic) in inputs {
            let consumer: Arc<BaseConsumer> = Arc::new(client.create()?);
            let mut ids = partition_ids(consumer.as_ref(), topic)?;
            ids.sort_unstable();
            let count = ids.len() as i32;
            if let Some(b) = bounds
                .iter()
                .find(|b| b.topic == *topic && !ids.contains(&b.partition))
            {
                return Err(Error::Usage(format!(
                    "--until-offset names partition {} of {topic}, which has {count} partitions",
                    b.partition
                )));
            }
            let mut assignment = TopicPartitionList::new();
            let first = inputs_read.partitions.len();
            let watermarks = watermarks_of(consumer.as_ref(), topic, &ids, METADATA_TIMEOUT)?;
            for (partition, (low, high)) in ids.into_iter().zip(watermarks) {
                let end = bounds_by_place
                    .get(&(topic.as_str(), partition))
                    .map_or(high, |&b| b.min(high));
                if end > low {
                    assignment.add_partition_offset(topic, partition, Offset::Offset(low))?;
                }
                inputs_read.partitions.push(InputPartition {
                    source: *source,
                    topic: topic.clone(),
                    partition,
                    partition_count: count,
                    start: low,
                    end,
                });
                inputs_read.owner.push(inputs_read.consumers.len());
                inputs_read.early.push((VecDeque::new(), false));
            }
            consumer.assign(&assignment)?;
            // Split right after assigning; what was fetched in between is
            // taken aside below.
            for p in &inputs_read.partitions[first..] {
                let queue = (p.end > p.start)
                    .then(|| BatchedPartitionQueue::split(&consumer, &p.topic, p.partition))
                    .flatten();
                inputs_read.queues.push(queue);
            }
            inputs_read.consumers.push(consumer);
            inputs_read.take_early(inputs_read.consumers.len() - 1, first)?;
        }
        Ok(inputs_read)
    }

    /// Fetching starts at `assign`, before the partitions are split off: a
    /// fetch that completed in between sits on the consumer's shared queue.
    /// Moves it aside, ahead of everything the partition queue will hold.
    /// `first` is the index of the consumer's first partition.
    fn take_early(&mut self, consumer: usize, first: usize) -> Result<()> {
        let index: HashMap<i32, usize> = (first..self.partitions.len())
            .map(|i| (self.partitions[i].partition, i))
            .collect();
        loop {
            match self.consumers[consumer].poll(Duration::ZERO) {
                None => return Ok(()),
                Some(Ok(m)) => {
                    if let Some(&i) = index.get(&m.partition()) {
                        self.early[i].0.push_back(Early {
                            timestamp: m.timestamp().to_millis().unwrap_or(0),
                            offset: m.offset(),
                            key: m.key().map(<[u8]>::to_vec),
                            value: m.payload().map(<[u8]>::to_vec),
                        });
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    if let Some(&i) = index.get(&p) {
                        self.early[i].1 = true;
                    }
                }
                Some(Err(e)) if readfold_kafka::is_fatal(&e) => return Err(e.into()),
                Some(Err(e)) => tracing::debug!(error = %e, "transient consumer error"),
            }
        }
    }

    pub fn partitions(&self) -> &[InputPartition] {
        &self.partitions
    }

    /// Records in the range, at most (transaction markers take offsets too).
    pub fn total(&self) -> u64 {
        self.partitions
            .iter()
            .map(|p| (p.end - p.start).max(0) as u64)
            .sum()
    }

    /// Polls partition `i` for its next record before its end, waiting at
    /// most `wait`, and hands it to `each`.
    pub fn poll_next<T>(
        &mut self,
        i: usize,
        wait: Duration,
        each: impl FnOnce(&InputPartition, RawRecord<'_>) -> T,
    ) -> Result<Polled<T>> {
        let partition = &self.partitions[i];
        let (out, done) = if let Some(early) = self.early[i].0.pop_front() {
            deliver(partition, early.raw(), each)
        } else if self.early[i].1 {
            // The end was reached before the split.
            (Polled::Done, true)
        } else if let Some(queue) = &mut self.queues[i] {
            let consumer = &self.consumers[self.owner[i]];
            self.polls += 1;
            if self.polls.is_multiple_of(4096) {
                // Serves the client's callbacks and surfaces its errors.
                serve(consumer)?;
            }
            match queue.next(wait) {
                Some(Ok(message)) => deliver(partition, raw(message), each),
                Some(Err(KafkaError::PartitionEOF(_))) => (Polled::Done, true),
                Some(Err(e)) if readfold_kafka::is_fatal(&e) => return Err(e.into()),
                Some(Err(e)) => {
                    tracing::debug!(topic = %partition.topic, partition = partition.partition, error = %e, "transient consumer error");
                    (Polled::Empty, false)
                }
                None => {
                    serve(consumer)?;
                    (Polled::Empty, false)
                }
            }
        } else {
            (Polled::Done, true)
        };
        if done {
            self.queues[i] = None;
            self.early[i] = (VecDeque::new(), true);
        }
        Ok(out)
    }
}

/// Hands a record before the partition's end to `each`; says whether the
/// partition is done after it.
fn deliver<T>(
    partition: &InputPartition,
    record: RawRecord<'_>,
    each: impl FnOnce(&InputPartition, RawRecord<'_>) -> T,
) -> (Polled<T>, bool) {
    let offset = record.offset;
    if offset >= partition.end {
        return (Polled::Done, true);
    }
    (
        Polled::Record(each(partition, record)),
        offset + 1 >= partition.end,
    )
}

impl Early {
    fn raw(&self) -> RawRecord<'_> {
        RawRecord {
            timestamp: self.timestamp,
            offset: self.offset,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
        }
    }
}

/// What a poll of one partition gave.
pub enum Polled<T> {
    Record(T),
    /// Nothing yet.
    Empty,
    /// The partition reached its end.
    Done,
}

fn raw(message: QueuedMessage<'_>) -> RawRecord<'_> {
    RawRecord {
        timestamp: message.timestamp.unwrap_or(0),
        offset: message.offset,
        key: message.key,
        value: message.payload,
    }
}

/// Polls the shared queue without waiting: callbacks, and errors that are
/// not about one partition.
fn serve(consumer: &BaseConsumer) -> Result<()> {
    match consumer.poll(Duration::ZERO) {
        Some(Err(e)) if readfold_kafka::is_fatal(&e) => Err(e.into()),
        Some(Err(e)) => {
            tracing::debug!(error = %e, "transient consumer error");
            Ok(())
        }
        // Never expected once the partitions are split; folding around a
        // record would make the output wrong, so stop instead.
        Some(Ok(m)) => Err(Error::Consumer(format!(
            "record {}/{} at offset {} arrived outside its partition queue; replay stopped rather than skip it",
            m.topic(),
            m.partition(),
            m.offset()
        ))),
        None => Ok(()),
    }
}
