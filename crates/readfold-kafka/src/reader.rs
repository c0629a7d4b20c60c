//! Committed-record readers: a topic's partitions from the beginning, with
//! `isolation.level=read_committed`, outside any consumer group's offsets
//! (nothing is committed). Blocking; call from a blocking thread.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::KafkaConfig;
use crate::context::LogContext;
use crate::error::{Error, Result};

/// How long to read for.
#[derive(Clone, Copy, Debug)]
pub enum Until {
    /// Until every assigned partition is at its end (its last stable
    /// offset); an error if that takes longer than the bound.
    End { within: Duration },
    /// Until the callback breaks.
    Forever,
}

/// What one poll of a reader brought.
enum Polled<'a> {
    Nothing,
    /// The partition's end (PartitionEOF).
    End(i32),
    Record(BorrowedMessage<'a>),
}

/// A reader of committed records.
pub struct TopicReader {
    consumer: BaseConsumer<LogContext>,
}

impl TopicReader {
    /// A reader that identifies as `group_id` to the broker but commits
    /// nothing. `bulk` takes the fetch settings for reading whole partitions
    /// fast (restore; [`KafkaConfig::backlog_client_config`]) and short
    /// end-of-partition waits.
    pub fn new(kafka: &KafkaConfig, group_id: &str, bulk: bool) -> Result<Self> {
        let mut client = if bulk {
            kafka.backlog_client_config()
        } else {
            kafka.client_config()
        };
        client
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            // Only what committed transactions published counts.
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest");
        if bulk {
            // At the end of a partition the broker would otherwise hold
            // each fetch for fetch.wait.max.ms (500 ms) before saying so.
            client.set("fetch.wait.max.ms", "20");
        }
        Ok(TopicReader {
            consumer: client.create_with_context(LogContext)?,
        })
    }

    /// A client for [`TopicReader::watermarks`] only, whose end of a
    /// partition is the high watermark (read_uncommitted), not the last
    /// stable offset: the two differ while a transaction is open there.
    pub fn uncommitted(kafka: &KafkaConfig, group_id: &str) -> Result<Self> {
        let consumer = kafka
            .client_config()
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_uncommitted")
            .create_with_context(LogContext)?;
        Ok(TopicReader { consumer })
    }

    /// The partition ids of `topic`; an error if it does not exist.
    pub fn partitions(&self, topic: &str) -> Result<Vec<i32>> {
        partition_ids(&self.consumer, topic)
    }

    /// Starts reading `partitions` of `topic` (all when `None`) from the
    /// beginning; returns the partitions assigned.
    pub fn assign_from_beginning(&self, topic: &str, partitions: Option<&[i32]>) -> Result<Vec<i32>> {
        self.assign(topic, partitions, Offset::Beginning)
    }

    /// Starts reading `partitions` of `topic` (all when `None`) at their
    /// end: only what is committed from now on.
    ///
    /// The end is looked up before this returns (under read_committed, the
    /// last stable offset), not left to the fetcher: with `Offset::End`
    /// librdkafka resolves it some time after the assignment, and whatever
    /// is committed in between is skipped. A gateway that loads a room from
    /// the stores right after starting would then miss a change that
    /// reached the changelog before the stores.
    pub fn assign_from_end(&self, topic: &str, partitions: Option<&[i32]>) -> Result<Vec<i32>> {
        let partitions = self.partitions_or_all(topic, partitions)?;
        let starts: Vec<(i32, Offset)> = partitions
            .iter()
            .zip(self.watermarks_many(topic, &partitions)?)
            .map(|(&p, (_, end))| (p, Offset::Offset(end)))
            .collect();
        self.assign_at(topic, &starts)
    }

    /// `partitions`, or every partition of `topic` when `None`.
    fn partitions_or_all(&self, topic: &str, partitions: Option<&[i32]>) -> Result<Vec<i32>> {
        match partitions {
            Some(p) => Ok(p.to_vec()),
            None => self.partitions(topic),
        }
    }

    fn assign(&self, topic: &str, partitions: Option<&[i32]>, from: Offset) -> Result<Vec<i32>> {
        let partitions = self.partitions_or_all(topic, partitions)?;
        let mut tpl = TopicPartitionList::new();
        for &p in &partitions {
            tpl.add_partition_offset(topic, p, from)?;
        }
        self.consumer.assign(&tpl)?;
        Ok(partitions)
    }

    /// Starts reading each `(partition, offset)` of `topic` there.
    pub fn assign_at(&self, topic: &str, starts: &[(i32, Offset)]) -> Result<Vec<i32>> {
        let starts: Vec<(&str, i32, Offset)> = starts.iter().map(|&(p, offset)| (topic, p, offset)).collect();
        self.assign_topics(&starts)?;
        Ok(starts.iter().map(|&(_, p, _)| p).collect())
    }

    /// Starts reading each `(topic, partition, offset)` there, and nothing
    /// else: one reader of several topics.
    pub fn assign_topics(&self, starts: &[(&str, i32, Offset)]) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for &(topic, p, offset) in starts {
            tpl.add_partition_offset(topic, p, offset)?;
        }
        self.consumer.assign(&tpl)?;
        Ok(())
    }

    /// The (log start, end) offsets of a partition. The end is the last
    /// stable offset for a read_committed reader, the high watermark for an
    /// [`TopicReader::uncommitted`] one.
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        Ok(self
            .consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))?)
    }

    /// Fetches `topic`'s metadata, which connects to the broker that
    /// leads its partitions and caches where they are.
    pub fn warm_up(&self, topic: &str) {
        if let Err(e) = self.consumer.fetch_metadata(Some(topic), Duration::from_secs(10)) {
            tracing::debug!(topic, error = %e, "warming up a reader");
        }
    }

    /// [`TopicReader::watermarks`] of several partitions, queried
    /// concurrently ([`watermarks_of`]).
    pub fn watermarks_many(&self, topic: &str, partitions: &[i32]) -> Result<Vec<(i64, i64)>> {
        watermarks_of(&self.consumer, topic, partitions, Duration::from_secs(10))
    }

    pub fn unassign(&self) -> Result<()> {
        Ok(self.consumer.unassign()?)
    }

    /// Reads the assigned partitions, calling `each` for every record, until
    /// `until` says stop or `each` breaks. Returns the records seen.
    pub fn read(
        &self,
        topic: &str,
        assigned: &[i32],
        until: Until,
        mut each: impl FnMut(&BorrowedMessage<'_>) -> ControlFlow<()>,
    ) -> Result<u64> {
        let started = Instant::now();
        let mut at_end = HashSet::new();
        let mut count = 0u64;
        loop {
            if let Until::End { within } = until {
                if assigned.iter().all(|p| at_end.contains(p)) {
                    return Ok(count);
                }
                if started.elapsed() > within {
                    return Err(Error::Timeout {
                        topic: topic.to_owned(),
                        within,
                    });
                }
            }
            match self.poll_once(topic, Duration::from_millis(500))? {
                Polled::Nothing => {}
                Polled::End(p) => {
                    at_end.insert(p);
                }
                Polled::Record(message) => {
                    count += 1;
                    at_end.remove(&message.partition());
                    if each(&message).is_break() {
                        return Ok(count);
                    }
                }
            }
        }
    }

    /// Reads the assigned partitions up to the ends given (their last
    /// stable offsets, as a read_committed query found them), calling
    /// `each` for every record, until each is reached or `each` breaks.
    /// Returns the records seen; an error after `within`.
    ///
    /// Most changelog partitions end in a transaction's commit marker,
    /// which a read never returns, so the last record is short of the end,
    /// and librdkafka reports the end (PartitionEOF) only from a further
    /// fetch that the broker holds for fetch.wait.max.ms: 20 ms of every
    /// restore's read. The consumer's position passes the markers as soon
    /// as they are polled, so the reader checks it whenever the queue is
    /// empty instead, for each partition that returned a record in this
    /// read: until then its position may still be one left from an earlier
    /// assignment (librdkafka resets it once the old fetch has stopped).
    /// A partition whose records are all markers waits for its EOF.
    pub fn read_to(
        &self,
        topic: &str,
        ends: &[(i32, i64)],
        within: Duration,
        mut each: impl FnMut(&BorrowedMessage<'_>) -> ControlFlow<()>,
    ) -> Result<u64> {
        let started = Instant::now();
        let mut left: HashMap<i32, i64> = ends.iter().copied().collect();
        let mut returned = HashSet::new();
        let mut count = 0u64;
        while !left.is_empty() {
            if started.elapsed() > within {
                return Err(Error::Timeout {
                    topic: topic.to_owned(),
                    within,
                });
            }
            match self.poll_once(topic, Duration::from_millis(2))? {
                Polled::Nothing => self.drop_reached(topic, &returned, &mut left)?,
                Polled::End(p) => {
                    left.remove(&p);
                }
                Polled::Record(message) => {
                    count += 1;
                    let p = message.partition();
                    returned.insert(p);
                    if left.get(&p).is_some_and(|&end| message.offset() + 1 >= end) {
                        left.remove(&p);
                    }
                    if each(&message).is_break() {
                        return Ok(count);
                    }
                }
            }
        }
        Ok(count)
    }

    /// One poll of the consumer, waiting up to `wait`: a record, a
    /// partition's end, or nothing (also after a transient error:
    /// librdkafka reconnects by itself, and the callers' time bounds limit
    /// how long a broker may stay away). A fatal error ends the read.
    fn poll_once(&self, topic: &str, wait: Duration) -> Result<Polled<'_>> {
        match self.consumer.poll(wait) {
            None => Ok(Polled::Nothing),
            Some(Err(KafkaError::PartitionEOF(p))) => Ok(Polled::End(p)),
            Some(Err(e)) if !is_fatal_read(&e) => {
                tracing::debug!(topic, error = %e, "transient consumer error while reading");
                Ok(Polled::Nothing)
            }
            Some(Err(e)) => Err(e.into()),
            Some(Ok(message)) => Ok(Polled::Record(message)),
        }
    }

    /// Removes from `left` the partitions of `returned` whose position
    /// reached their end.
    fn drop_reached(&self, topic: &str, returned: &HashSet<i32>, left: &mut HashMap<i32, i64>) -> Result<()> {
        if !left.keys().any(|p| returned.contains(p)) {
            return Ok(());
        }
        for element in self.consumer.position()?.elements_for_topic(topic) {
            let p = element.partition();
            if let Offset::Offset(position) = element.offset() {
                if returned.contains(&p) && left.get(&p).is_some_and(|&end| position >= end) {
                    left.remove(&p);
                }
            }
        }
        Ok(())
    }

    /// Like [`TopicReader::poll_available`], but returns after `budget` even
    /// while records keep arriving: for a follower that has more to do.
    pub fn poll_within(
        &self,
        wait: Duration,
        budget: Duration,
        mut each: impl FnMut(&BorrowedMessage<'_>),
    ) -> Result<u64> {
        let (started, mut count) = (std::time::Instant::now(), 0);
        while started.elapsed() < budget {
            match self.consumer.poll(wait) {
                None => break,
                // One partition's end: the others' records may be queued
                // behind it (a caller that looks once per flush would fall
                // behind).
                Some(Err(KafkaError::PartitionEOF(_))) => continue,
                Some(Err(e)) if !is_fatal_read(&e) => break,
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(message)) => {
                    count += 1;
                    each(&message);
                }
            }
        }
        Ok(count)
    }

    /// Calls `each` for every record that arrives within `wait` of the
    /// previous one; returns when none does. For following a topic.
    pub fn poll_available(&self, wait: Duration, each: impl FnMut(&BorrowedMessage<'_>)) -> Result<u64> {
        self.poll_within(wait, Duration::MAX, each)
    }
}

/// The partition ids of `topic`, as `consumer` sees them; an error if it
/// does not exist.
pub fn partition_ids<C: rdkafka::consumer::ConsumerContext>(
    consumer: &impl Consumer<C>,
    topic: &str,
) -> Result<Vec<i32>> {
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .first()
        .filter(|t| t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(Error::NoSuchTopic(topic.to_owned()));
    }
    Ok(partitions)
}

/// Queries at most this many partitions' watermarks at once.
const WATERMARK_QUERIES_IN_FLIGHT: usize = 16;

/// The (log start, end) offsets of each of `partitions` of `topic`, in
/// their order; the end as [`TopicReader::watermarks`] says. Each partition
/// is a request of its own in librdkafka, so they are sent concurrently
/// rather than one round trip after another.
pub fn watermarks_of<C: rdkafka::consumer::ConsumerContext>(
    consumer: &(impl Consumer<C> + Sync),
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> Result<Vec<(i64, i64)>> {
    let mut found = Vec::with_capacity(partitions.len());
    for chunk in partitions.chunks(WATERMARK_QUERIES_IN_FLIGHT) {
        let answers: Vec<_> = std::thread::scope(|scope| {
            let queries: Vec<_> = chunk
                .iter()
                .map(|&p| scope.spawn(move || consumer.fetch_watermarks(topic, p, timeout)))
                .collect();
            queries
                .into_iter()
                .map(|q| q.join().expect("a watermark query does not panic"))
                .collect()
        });
        for answer in answers {
            found.push(answer?);
        }
    }
    Ok(found)
}

/// Whether a consumer error ends a read: fatal ones do; transport errors,
/// brokers down and the like are reported while librdkafka reconnects.
fn is_fatal_read(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MessageConsumptionFatal(_)) || crate::error::is_fatal(e)
}

/// A record's headers as (name, value) strings; values that are not UTF-8
/// are shown lossily.
pub fn headers_of(message: &BorrowedMessage<'_>) -> Vec<(String, String)> {
    message
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    (
                        h.key.to_owned(),
                        h.value
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
