//! readfold's badge stage: one badge per user, from the by-user changelog.
//!
//! A consumer group of its own reads `chat.user-read-cursors` (each record
//! one member's whole own view of one conversation), `chat.user-actions`
//! (mark-all-read) and `chat.user-thread-cursors` (a follower's own view of
//! a thread), co-partitioned by user, and folds them into [`Badges`], the
//! pure state. Every instance also follows all of `chat.read-cursors` and
//! `chat.thread-cursors`, for each conversation's latest seq and each
//! thread's latest reply: a message raises the unread of members whose own
//! records do not change (Kafka Streams would call it a global table). Each flush publishes, in one Kafka
//! transaction with the input offsets, the changed users' badges on
//! compacted `chat.user-badges`, the read reports a mark-all-read sends back
//! to the first stage's input, and dead letters; then it writes the badges
//! to Redis on the runtime, while the loop goes on. The inputs are read a
//! batch at a time off a queue the assigned partitions are routed to, as
//! the first stage reads its own.
//!
//! The state is restored from the input itself: a partition of the by-user
//! changelog is compacted and keyed exactly as the state is (user,
//! conversation), so reading it from its start up to the group's committed
//! offset rebuilds what the previous owner had published (as Kafka Streams
//! restores a table from its source topic). Any rebalance drops all state
//! and restores what is assigned (the group's eager protocol revokes every
//! partition, and consumption restarts at the committed offsets). A flush
//! that fails is aborted and tried again, whole, at the next one; only a
//! fenced or fatally broken producer stops the stage.
//!
//! Blocking: run [`BadgeStage::run`] on a thread of its own.

mod config;
mod input;
mod telemetry;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use readfold_core::badge::{Badge, Badges};
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, Seq, UserId};
use readfold_kafka::batch_producer::{BatchProducer, BatchRecord};
use readfold_kafka::queue_batch::QueuedMessage;
use readfold_kafka::reader::{TopicReader, Until};
use readfold_kafka::routed_queue::{RouteSlot, RoutedReader};
use readfold_kafka::{now_ms, partitions_of, KafkaConfig, TopicsConfig};
use readfold_store::redis::RedisStore;
use readfold_wire::badge::{decode_user_badge, encode_badge};
use readfold_wire::changelog::{decode_changelog, latest_seq_of, ChangelogEntry, ChangelogKind, ThreadEntry};
use readfold_wire::{Limits, OutRecord};

pub use config::BadgeConfig;
use input::{Applied, Input};

/// Maps keyed by ids, with a hash cheaper than SipHash on short keys.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Why the stage stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Reader(#[from] readfold_kafka::Error),
    #[error("configuration: {0}")]
    Config(String),
    #[error("topics: {0}")]
    Topology(String),
    #[error("the transactional producer is fenced or broken: {0}")]
    FatalTransaction(KafkaError),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Everything the stage needs.
#[derive(Clone)]
pub struct BadgeSettings {
    pub kafka: KafkaConfig,
    pub topics: TopicsConfig,
    pub badge: BadgeConfig,
    pub input: Limits,
    /// Where badges are also written; `None` with Redis off.
    pub redis: Option<RedisStore>,
    pub runtime: tokio::runtime::Handle,
}

/// Partition counts of the topics the stage writes, read at start.
#[derive(Clone, Copy, Debug)]
struct Layout {
    read_reports: i32,
    user_actions: i32,
    user_badges: i32,
    dlq: i32,
}

/// Records taken per look at the clock and the flush timer.
const TAKE_BATCH: usize = 1000;

/// The longest wait for input, so that the group's callbacks (served by
/// the consumer's own poll) wait no longer.
const MAX_WAIT: Duration = Duration::from_millis(100);

/// The inputs, in the order offsets are kept: the by-user changelog, the
/// user actions, the by-user thread changelog.
const OWN: usize = 0;
const ACTIONS: usize = 1;
const THREADS: usize = 2;
const INPUTS: usize = 3;

/// A change of the group's assignment: (topic, partition)s added or taken
/// away. The eager protocol takes everything away, then adds the new
/// assignment; the consumer protocol (KIP-848) adds and takes away only
/// what moves.
enum Change {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
}

/// Receives the group's callbacks: routes an assignment to the batched
/// queue and records the change, which the loop acts on after the poll.
struct StageContext {
    changes: std::sync::Mutex<Vec<Change>>,
    routed: RouteSlot,
}

impl StageContext {
    fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut *self.changes.lock().expect("changes lock"))
    }
}

impl ClientContext for StageContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        readfold_kafka::context::log_line(level, fac, log_message);
    }

    fn stats(&self, statistics: rdkafka::statistics::Statistics) {
        for (name, topic) in &statistics.topics {
            for (&partition, p) in &topic.partitions {
                // Offsets are committed through the producer's transaction,
                // so the lag is taken from the next offset to take.
                let end = if p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                if partition >= 0 && p.app_offset >= 0 && end >= 0 {
                    telemetry::consumer_lag(name, partition, (end - p.app_offset).max(0));
                }
            }
        }
    }
}

impl ConsumerContext for StageContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.routed.route(tpl);
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let change = match rebalance {
            Rebalance::Assign(tpl) => Change::Assigned(partitions_of(tpl)),
            Rebalance::Revoke(tpl) => Change::Revoked(partitions_of(tpl)),
            Rebalance::Error(_) => return,
        };
        self.changes.lock().expect("changes lock").push(change);
    }
}

/// The badge stage.
pub struct BadgeStage {
    settings: BadgeSettings,
    consumer: Arc<BaseConsumer<StageContext>>,
    producer: BatchProducer<readfold_kafka::context::LogContext>,
    layout: Layout,
    /// The state of the users of the assigned partitions.
    badges: Badges,
    /// Partitions assigned, by input ([`OWN`], [`ACTIONS`], [`THREADS`]).
    held: [BTreeSet<i32>; INPUTS],
    /// Partitions held on every input and restored: the ones folded.
    active: BTreeSet<i32>,
    /// Next offset to take of each active partition, by input: where it
    /// resumes after a change of the assignment.
    next: [BTreeMap<i32, i64>; INPUTS],
    /// Follows every partition of the conversations' changelog.
    latest: TopicReader,
    /// Follows every partition of the thread changelog, for each thread's
    /// latest reply.
    thread_latest: TopicReader,
    /// Next offset to commit, by input and partition.
    offsets: [BTreeMap<i32, i64>; INPUTS],
    /// Offsets this incarnation committed last, likewise.
    committed: [BTreeMap<i32, i64>; INPUTS],
    /// Records for the next transaction besides the badges.
    outbox: Vec<(i32, OutRecord)>,
    /// Badges drained from the state and not yet committed.
    pending: BTreeMap<UserId, Badge>,
    /// Badges committed to Kafka but not yet written to Redis.
    unstored: BTreeMap<UserId, (Badge, i64)>,
    /// The Redis write under way, and what it writes.
    storing: Option<Storing>,
    last_flush: Instant,
    /// When badges changed by others' messages were last published.
    last_fanout: Instant,
    /// Input records taken, by input.
    records_in: [metrics::Counter; INPUTS],
}

impl BadgeStage {
    /// Checks the topics (creating the stage's own if allowed), creates the
    /// transactional producer (fencing an earlier incarnation) and joins
    /// the group.
    pub fn new(settings: BadgeSettings) -> Result<Self> {
        settings.badge.check().map_err(Error::Config)?;
        let layout = settings.runtime.block_on(config::ensure_topics(&settings))?;
        let transactional_id = format!("{}-{}", settings.badge.group_id, settings.kafka.instance_id());
        let producer: ThreadedProducer<_> = settings
            .kafka
            .client_config()
            .set("transactional.id", &transactional_id)
            .set(
                "transaction.timeout.ms",
                settings.kafka.transaction_timeout_ms.to_string(),
            )
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.max.bytes", "2000000")
            .create_with_context(readfold_kafka::context::LogContext)?;
        producer.init_transactions(Duration::from_secs(30))?;
        tracing::info!(%transactional_id, "badge stage: transactional producer ready");
        let rules = settings.badge.rules().map_err(Error::Config)?;
        let latest = TopicReader::new(
            &settings.kafka,
            &format!("{}-latest", settings.badge.group_id),
            true,
        )?;
        let mut badges = Badges::new(rules).with_fanout_min_members(settings.badge.fanout_min_members);
        // Every latest seq so far before any view is counted against them.
        let started = Instant::now();
        let topic = &settings.topics.read_cursors;
        let partitions = latest.assign_from_beginning(topic, None)?;
        let max_id_bytes = settings.input.max_id_bytes;
        let read = latest.read(
            topic,
            &partitions,
            Until::End {
                within: Duration::from_secs(600),
            },
            |m| {
                // Nobody is held yet: each record only sets a seq.
                if let Some((conversation, seq)) = latest_of(m, max_id_bytes) {
                    badges.advance_latest(&conversation, seq, now_ms());
                }
                ControlFlow::Continue(())
            },
        )?;
        tracing::info!(
            records = read,
            conversations = badges.conversation_count(),
            ms = started.elapsed().as_millis() as u64,
            "badge stage: latest seqs read"
        );
        // And every thread's latest reply.
        let thread_latest = TopicReader::new(
            &settings.kafka,
            &format!("{}-thread-latest", settings.badge.group_id),
            true,
        )?;
        let topic = &settings.topics.thread_cursors;
        let partitions = thread_latest.assign_from_beginning(topic, None)?;
        thread_latest.read(
            topic,
            &partitions,
            Until::End {
                within: Duration::from_secs(600),
            },
            |m| {
                if let Some((conversation, thread, seq)) = thread_latest_of(m, max_id_bytes) {
                    badges.advance_thread_latest(&conversation, thread, seq);
                }
                ControlFlow::Continue(())
            },
        )?;
        let mut config = settings.kafka.client_config();
        config
            .set("group.id", &settings.badge.group_id)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("statistics.interval.ms", "1000");
        // Partition p of both inputs (co-partitioned by user) on one
        // member; see `reassign`.
        settings.kafka.set_range_assignor(&mut config);
        let consumer: BaseConsumer<StageContext> = config.create_with_context(StageContext {
            changes: Default::default(),
            routed: RouteSlot::default(),
        })?;
        consumer.subscribe(&[
            &settings.topics.user_read_cursors,
            &settings.badge.user_actions,
            &settings.topics.user_thread_cursors,
        ])?;
        telemetry::describe();
        let records_in = [
            telemetry::records_in(&settings.topics.user_read_cursors),
            telemetry::records_in(&settings.badge.user_actions),
            telemetry::records_in(&settings.topics.user_thread_cursors),
        ];
        Ok(BadgeStage {
            settings,
            consumer: Arc::new(consumer),
            producer: BatchProducer::new(Arc::new(producer)),
            layout,
            badges,
            held: Default::default(),
            active: Default::default(),
            next: Default::default(),
            latest,
            thread_latest,
            offsets: Default::default(),
            committed: Default::default(),
            outbox: Vec::new(),
            pending: BTreeMap::new(),
            unstored: BTreeMap::new(),
            storing: None,
            last_flush: Instant::now(),
            last_fanout: Instant::now(),
            records_in,
        })
    }

    /// Folds and publishes until `stop` is set; flushes what it holds first.
    pub fn run(mut self, stop: Arc<AtomicBool>) -> Result<()> {
        let interval = Duration::from_millis(self.settings.badge.flush_interval_ms);
        // A record borrows the consumer while the stage folds it.
        let consumer = self.consumer.clone();
        // Made before the first poll, which applies the first assignment.
        let mut routed = RoutedReader::of(&consumer);
        consumer.context().routed.set(&routed);
        while !stop.load(Ordering::Acquire) {
            // The consumer's own queue holds the group's callbacks, errors,
            // and the records of a partition that could not be routed.
            let polled = consumer.poll(Duration::ZERO);
            let changes = consumer.context().take_changes();
            if !changes.is_empty() {
                self.reassign(changes, &mut routed)?;
            }
            // One clock read per batch.
            let now = now_ms();
            match polled {
                None => {}
                Some(Err(e)) if readfold_kafka::error::is_fatal(&e) => return Err(e.into()),
                Some(Err(e)) => tracing::warn!(error = %e, "badge stage: consumer error"),
                Some(Ok(message)) => self.take(&QueuedMessage::of(&message), now),
            }
            let mut taken = 0;
            while taken < TAKE_BATCH {
                match routed.next_message() {
                    None => break,
                    Some(Err(e)) if readfold_kafka::error::is_fatal(&e) => return Err(e.into()),
                    Some(Err(e)) => tracing::warn!(error = %e, "badge stage: consumer error"),
                    Some(Ok(message)) => self.take(&message, now),
                }
                taken += 1;
            }
            if self.last_flush.elapsed() >= interval {
                self.flush()?;
            } else if taken < TAKE_BATCH {
                let wait = interval
                    .saturating_sub(self.last_flush.elapsed())
                    .clamp(Duration::from_millis(1), MAX_WAIT);
                self.settings.runtime.block_on(async {
                    let _ = tokio::time::timeout(wait, routed.ready()).await;
                });
            }
        }
        self.flush()?;
        self.store_rest();
        tracing::info!("badge stage stopped");
        Ok(())
    }

    /// Folds one input record into its partition's state.
    fn take(&mut self, message: &QueuedMessage<'_>, now: i64) {
        let QueuedMessage {
            topic,
            partition,
            offset,
            ..
        } = *message;
        tracing::trace!(topic, partition, offset, "badge stage: record");
        if !self.active.contains(&partition) {
            // Not held on both inputs, or not restored yet: read again from
            // where it resumes once it is (see `reassign`), so its offset is
            // not committed.
            return;
        }
        let input = self.input_of(topic).unwrap_or(OWN);
        self.offsets[input].insert(partition, offset + 1);
        self.next[input].insert(partition, offset + 1);
        self.records_in[input].increment(1);
        let input = Input::read(&self.settings, message, self.layout.user_actions);
        match input.apply(&mut self.badges, now) {
            Applied::Nothing => {}
            Applied::MarkAllRead(reports) => {
                telemetry::marked_all_read(reports.len());
                let partitions = self.layout.read_reports;
                for report in reports {
                    self.outbox.push((
                        partition,
                        report.into_record(&self.settings.topics.read_reports, partitions),
                    ));
                }
            }
            Applied::Rejected(rejection) => {
                telemetry::dead_letter(rejection.reason.as_str());
                let source = readfold_wire::dead_letter::Source {
                    topic: topic.to_owned(),
                    partition,
                    offset,
                };
                let out = self.output_topics();
                self.outbox.push((
                    partition,
                    readfold_wire::dead_letter::dead_letter(
                        message.key,
                        message.payload,
                        &rejection,
                        &source,
                        &out,
                    ),
                ));
            }
        }
    }

    fn output_topics(&self) -> readfold_wire::OutputTopics {
        readfold_wire::OutputTopics {
            read_cursors: String::new(),
            user_read_cursors: self.settings.topics.user_read_cursors.clone(),
            member_state: String::new(),
            thread_cursors: String::new(),
            user_thread_cursors: String::new(),
            thread_state: String::new(),
            dlq: self.settings.topics.dlq.clone(),
            layout: readfold_wire::OutputLayout {
                user_read_cursors_partitions: 1,
                user_thread_cursors_partitions: 1,
                dlq_partitions: self.layout.dlq,
            },
        }
    }

    /// Publishes what changed since the last flush, with the offsets, in one
    /// transaction (and, once per `badge.fanout_interval_ms`, big
    /// conversations' fan-out in a second); then writes the badges to Redis.
    fn flush(&mut self) -> Result<()> {
        self.last_flush = Instant::now();
        let now = now_ms();
        self.follow_latest()?;
        self.take_positions();
        self.badges.expire(now);
        self.pending.extend(self.badges.drain());
        let committed = self.publish(now)?;
        // Big conversations' fan-out goes in a transaction of its own,
        // after the users' own changes, which so wait behind thousands of
        // badges neither in this commit nor in the gateway's consumer.
        let fanout = Duration::from_millis(self.settings.badge.fanout_interval_ms);
        if committed && self.last_fanout.elapsed() >= fanout {
            self.last_fanout = Instant::now();
            self.pending.extend(self.badges.drain_all());
            self.publish(now)?;
        }
        self.store();
        Ok(())
    }

    /// Commits the pending badges, the outbox and the offsets in one
    /// transaction; false if it failed and was aborted (all of it is tried
    /// again at the next flush).
    fn publish(&mut self, now: i64) -> Result<bool> {
        if self.pending.is_empty() && self.outbox.is_empty() && self.offsets.iter().all(BTreeMap::is_empty) {
            return Ok(true);
        }
        let started = Instant::now();
        let changed: Vec<(UserId, Badge)> = self.pending.iter().map(|(u, b)| (u.clone(), *b)).collect();
        match self.commit(&changed, now) {
            Ok(()) => {}
            Err(Error::FatalTransaction(e)) => return Err(Error::FatalTransaction(e)),
            Err(e) => {
                // Aborted: nothing of it is visible. The same (and what
                // comes meanwhile) goes in the next flush.
                tracing::warn!(error = %e, "badge stage: flush failed; retrying at the next one");
                telemetry::flush_failed();
                return Ok(false);
            }
        }
        telemetry::flushed(changed.len(), started.elapsed());
        tracing::debug!(badges = changed.len(), "badge stage: flush committed");
        self.outbox.clear();
        for (committed, offsets) in self.committed.iter_mut().zip(&mut self.offsets) {
            committed.extend(std::mem::take(offsets));
        }
        self.pending.clear();
        for (user, badge) in changed {
            self.unstored.insert(user, (badge, now));
        }
        Ok(true)
    }

    /// Moves each restored partition's offset to the consumer's position,
    /// which steps over the commit markers of the first stage's
    /// transactions: committing past the last record taken would leave the
    /// lag at 1 for good (Kafka Streams commits the position likewise).
    /// Every record before the position was taken: the loop takes each one
    /// polled from a restored partition.
    fn take_positions(&mut self) {
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        for e in positions.elements() {
            let Offset::Offset(position) = e.offset() else {
                continue;
            };
            let Some(input) = self.input_of(e.topic()) else {
                continue;
            };
            let partition = e.partition();
            if !self.active.contains(&partition) {
                continue;
            }
            if self.committed[input]
                .get(&partition)
                .is_some_and(|&c| c >= position)
            {
                continue;
            }
            let next = self.offsets[input].entry(partition).or_insert(position);
            *next = (*next).max(position);
        }
    }

    fn commit(&self, changed: &[(UserId, Badge)], now: i64) -> Result<()> {
        let producer = self.producer.producer();
        producer.begin_transaction().map_err(Error::FatalTransaction)?;
        let body = || -> std::result::Result<(), KafkaError> {
            let values: Vec<Vec<u8>> = changed
                .iter()
                .map(|(user, badge)| encode_badge(user.as_str(), badge, now))
                .collect();
            let records: Vec<BatchRecord<'_>> = changed
                .iter()
                .zip(&values)
                .map(|((user, _), value)| {
                    let key = user.as_str().as_bytes();
                    BatchRecord {
                        partition: partition_for_key(key, self.layout.user_badges),
                        key: Some(key),
                        value: Some(value),
                    }
                })
                .collect();
            self.producer
                .send_batch(&self.settings.badge.user_badges, &records)?;
            for (_, record) in &self.outbox {
                let mut headers = OwnedHeaders::new();
                for (name, value) in &record.headers {
                    headers = headers.insert(Header {
                        key: name,
                        value: Some(value.as_bytes()),
                    });
                }
                let mut out = BaseRecord::<[u8], [u8]>::to(&record.topic)
                    .partition(record.partition)
                    .headers(headers);
                if let Some(key) = &record.key {
                    out = out.key(key);
                }
                if let Some(value) = &record.value {
                    out = out.payload(value);
                }
                send(producer, out)?;
            }
            let mut offsets = TopicPartitionList::new();
            for (topic, by_partition) in self.inputs().into_iter().zip(&self.offsets) {
                for (&partition, &offset) in by_partition {
                    offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
                }
            }
            if offsets.count() > 0 {
                let group = self
                    .consumer
                    .group_metadata()
                    .ok_or(KafkaError::Global(rdkafka::types::RDKafkaErrorCode::State))?;
                producer.send_offsets_to_transaction(&offsets, &group, Duration::from_secs(30))?;
            }
            readfold_kafka::batch_producer::flush_now(producer, Duration::from_secs(30))?;
            producer.commit_transaction(Duration::from_secs(30))
        };
        match body() {
            Ok(()) => Ok(()),
            Err(e) if readfold_kafka::is_fatal(&e) => Err(Error::FatalTransaction(e)),
            Err(e) => {
                producer
                    .abort_transaction(Duration::from_secs(30))
                    .map_err(Error::FatalTransaction)?;
                Err(Error::Kafka(e))
            }
        }
    }

    /// Writes the committed badges to Redis on the runtime, so that the
    /// stage folds and commits meanwhile; one write at a time, and what
    /// fails is tried again with the next one.
    fn store(&mut self) {
        let Some(redis) = &self.settings.redis else {
            self.unstored.clear();
            return;
        };
        if let Some(storing) = &self.storing {
            if !storing.task.is_finished() {
                return;
            }
            let Storing { task, batch } = self.storing.take().expect("a write under way");
            let failed = match self.settings.runtime.block_on(task) {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(error) = failed {
                telemetry::redis_failed();
                tracing::warn!(%error, users = batch.len(), "badge stage: Redis write failed; retrying with the next one");
                // A badge committed since is newer and stays.
                for (user, badge, at) in batch.iter() {
                    self.unstored.entry(user.clone()).or_insert((*badge, *at));
                }
            }
        }
        if self.unstored.is_empty() {
            return;
        }
        let batch: Arc<Vec<(UserId, Badge, i64)>> = Arc::new(
            std::mem::take(&mut self.unstored)
                .into_iter()
                .map(|(u, (b, at))| (u, b, at))
                .collect(),
        );
        let (redis, writing) = (redis.clone(), batch.clone());
        let task = self
            .settings
            .runtime
            .spawn(async move { redis.write_badges(&writing).await });
        self.storing = Some(Storing { task, batch });
    }

    /// As the stage stops: waits for the write under way, then writes
    /// what is left (a write that fails is tried again, up to three in all).
    fn store_rest(&mut self) {
        for _ in 0..3 {
            if let Some(storing) = &mut self.storing {
                let _ = self.settings.runtime.block_on(&mut storing.task);
            }
            self.store();
            if self.storing.is_none() {
                return;
            }
        }
    }

    /// Applies changes of the assignment. A partition is folded while it
    /// is held on both inputs (co-partitioned by user): one that stops
    /// being so is forgotten (its next owner reads it from the committed
    /// offsets), one that starts is restored. The batch taken off the
    /// queue is dropped and every partition still folded resumes at its
    /// next offset not yet taken, so nothing read before the change is
    /// skipped or taken twice.
    fn reassign(&mut self, changes: Vec<Change>, routed: &mut RoutedReader) -> Result<()> {
        for change in changes {
            let (partitions, assigned) = match change {
                Change::Assigned(p) => (p, true),
                Change::Revoked(p) => (p, false),
            };
            for (topic, partition) in partitions {
                let Some(input) = self.input_of(&topic) else {
                    continue;
                };
                if assigned {
                    self.held[input].insert(partition);
                } else {
                    self.held[input].remove(&partition);
                }
            }
        }
        let now_active: BTreeSet<i32> = self.held[OWN]
            .iter()
            .copied()
            .filter(|p| self.held[ACTIONS].contains(p) && self.held[THREADS].contains(p))
            .collect();
        let gone: Vec<i32> = self.active.difference(&now_active).copied().collect();
        let came: Vec<i32> = now_active.difference(&self.active).copied().collect();
        routed.discard();
        if !gone.is_empty() {
            self.forget(&gone);
        }
        if !came.is_empty() {
            self.restore(&came)?;
        }
        let mut resume = TopicPartitionList::new();
        for (input, topic) in self.inputs().into_iter().enumerate() {
            for (&partition, &next) in &self.next[input] {
                resume.add_partition_offset(topic, partition, Offset::Offset(next))?;
            }
        }
        if resume.count() > 0 {
            self.consumer.seek_partitions(resume, Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// Drops what the stage holds of `partitions`: their users, offsets,
    /// and what their records asked to send. Nothing of it is committed.
    fn forget(&mut self, partitions: &[i32]) {
        let by_user = self.layout.user_actions;
        let gone = |user: &UserId| partitions.contains(&partition_for_key(user.as_str().as_bytes(), by_user));
        if partitions.len() == self.active.len() {
            self.badges.forget_users();
        } else {
            self.badges.forget_users_where(gone);
        }
        self.pending.retain(|user, _| !gone(user));
        self.outbox.retain(|(p, _)| !partitions.contains(p));
        for input in [OWN, ACTIONS, THREADS] {
            for p in partitions {
                self.offsets[input].remove(p);
                self.committed[input].remove(p);
                self.next[input].remove(p);
            }
        }
        for p in partitions {
            self.active.remove(p);
        }
        tracing::info!(?partitions, "badge stage: partitions forgotten");
    }

    /// Restores `partitions` from the input up to the group's committed
    /// offsets, beside the partitions folded already, and resumes them
    /// there.
    fn restore(&mut self, partitions: &[i32]) -> Result<()> {
        let started = Instant::now();
        let assigned = partitions.to_vec();
        let topic = self.settings.topics.user_read_cursors.clone();
        let committed = self.consumer.committed(Duration::from_secs(30))?;
        let committed_at = |topic: &str, p: i32| {
            committed
                .find_partition(topic, p)
                .and_then(|e| match e.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(0)
        };
        let ends: Vec<(i32, i64)> = assigned.iter().map(|&p| (p, committed_at(&topic, p))).collect();
        let inputs = self.inputs().map(str::to_owned);
        for (input, name) in inputs.iter().enumerate() {
            let starts: Vec<(i32, i64)> = assigned.iter().map(|&p| (p, committed_at(name, p))).collect();
            self.next[input].extend(starts);
        }
        // The folded partitions' changes so far are kept apart from what
        // the restore changes.
        self.badges.expire(now_ms());
        let live = self.badges.drain_all();
        self.pending.extend(live);
        // The latest seqs first, so that restored views count against them.
        self.follow_latest()?;
        self.active.extend(assigned.iter().copied());
        // The conversations first: a thread counts as its conversation's
        // mute says.
        let mut records = 0u64;
        let thread_topic = self.settings.topics.user_thread_cursors.clone();
        let thread_ends: Vec<(i32, i64)> = assigned
            .iter()
            .map(|&p| (p, committed_at(&thread_topic, p)))
            .collect();
        for (topic, ends, read) in [
            (&topic, &ends, Input::read_own as ReadInput),
            (&thread_topic, &thread_ends, Input::read_own_thread as ReadInput),
        ] {
            records += self.restore_input(topic, ends, read)?;
        }
        // What the badges topic holds already is not published again; a
        // badge changed by a message the last owner never published (or
        // that came while no instance ran), or by a mute that ran out
        // since, differs from it and goes at the next flush.
        self.badges.expire(now_ms());
        let restored = self.badges.drain_all();
        let published = self.published_badges(&assigned)?;
        let users: BTreeSet<UserId> = restored
            .into_iter()
            .map(|(user, _)| user)
            .chain(published.keys().cloned())
            .collect();
        let mut republished = 0;
        for user in users {
            let badge = self.badges.badge(&user);
            if published.get(&user).copied().unwrap_or_default() != badge {
                self.pending.insert(user, badge);
                republished += 1;
            }
        }
        telemetry::restored(records, started.elapsed());
        tracing::info!(partitions = ?assigned, records, badges = published.len(), republished, ms = started.elapsed().as_millis() as u64, "badge stage: partitions restored");
        Ok(())
    }

    /// Folds `topic`'s partitions from their start up to `ends` (the
    /// group's committed offsets), each record read by `read`; how many.
    fn restore_input(&mut self, topic: &str, ends: &[(i32, i64)], read: ReadInput) -> Result<u64> {
        let to_read: Vec<(i32, i64)> = ends.iter().copied().filter(|&(_, end)| end > 0).collect();
        if to_read.is_empty() {
            return Ok(0);
        }
        let reader = TopicReader::new(
            &self.settings.kafka,
            &format!("{}-restore", self.settings.badge.group_id),
            true,
        )?;
        let partitions: Vec<i32> = to_read.iter().map(|&(p, _)| p).collect();
        reader.assign_from_beginning(topic, Some(&partitions))?;
        let settings = self.settings.clone();
        let state = &mut self.badges;
        let records = reader.read_to(topic, &to_read, Duration::from_secs(600), |message| {
            let end = to_read
                .iter()
                .find(|&&(p, _)| p == message.partition())
                .map_or(0, |&(_, e)| e);
            if message.offset() < end {
                // At the time it was published: the state it made then.
                let at = message.timestamp().to_millis().unwrap_or_else(now_ms);
                read(&settings, message.key(), message.payload()).restore(state, at);
            }
            ControlFlow::Continue(())
        })?;
        Ok(records)
    }

    /// The badges last published for the users of `partitions` of the
    /// by-user changelog, read from the compacted badges topic.
    fn published_badges(&self, partitions: &[i32]) -> Result<FastMap<UserId, Badge>> {
        let topic = &self.settings.badge.user_badges;
        let by_user = self.layout.user_actions;
        // The stage creates the badges topic co-partitioned with its input;
        // one made otherwise is read whole, each user kept or not.
        let only = (self.layout.user_badges == by_user).then_some(partitions);
        let reader = TopicReader::new(
            &self.settings.kafka,
            &format!("{}-published", self.settings.badge.group_id),
            true,
        )?;
        let read = reader.assign_from_beginning(topic, only)?;
        let max_id_bytes = self.settings.input.max_id_bytes;
        let mut published = FastMap::default();
        reader.read(
            topic,
            &read,
            Until::End {
                within: Duration::from_secs(600),
            },
            |m| {
                let record = m.payload().and_then(|value| decode_user_badge(value).ok());
                if let Some(r) = record {
                    if let Ok(user) = UserId::parse(&r.user_id, max_id_bytes) {
                        if partitions.contains(&partition_for_key(user.as_str().as_bytes(), by_user)) {
                            published.insert(user, r.badge);
                        }
                    }
                }
                ControlFlow::Continue(())
            },
        )?;
        Ok(published)
    }
}

impl BadgeStage {
    /// The input topics, as [`OWN`], [`ACTIONS`] and [`THREADS`] index
    /// them.
    fn inputs(&self) -> [&str; INPUTS] {
        [
            &self.settings.topics.user_read_cursors,
            &self.settings.badge.user_actions,
            &self.settings.topics.user_thread_cursors,
        ]
    }

    fn input_of(&self, topic: &str) -> Option<usize> {
        self.inputs().iter().position(|&input| input == topic)
    }

    /// Takes in what the conversations' changelog says of latest seqs
    /// since the last look.
    fn follow_latest(&mut self) -> Result<()> {
        let max_id_bytes = self.settings.input.max_id_bytes;
        // A busy conversation's members are recounted once per look, not
        // once per message.
        let mut latest: FastMap<ConversationId, Seq> = FastMap::default();
        self.latest.poll_available(Duration::ZERO, |m| {
            if let Some((conversation, seq)) = latest_of(m, max_id_bytes) {
                let highest = latest.entry(conversation).or_default();
                *highest = (*highest).max(seq);
            }
        })?;
        let now = now_ms();
        for (conversation, seq) in latest {
            self.badges.advance_latest(&conversation, seq, now);
        }
        let mut thread_latest: FastMap<(ConversationId, Seq), Seq> = FastMap::default();
        self.thread_latest.poll_available(Duration::ZERO, |m| {
            if let Some((conversation, thread, seq)) = thread_latest_of(m, max_id_bytes) {
                let highest = thread_latest.entry((conversation, thread)).or_default();
                *highest = (*highest).max(seq);
            }
        })?;
        for ((conversation, thread), seq) in thread_latest {
            self.badges.advance_thread_latest(&conversation, thread, seq);
        }
        Ok(())
    }
}

/// How a restore reads one input's records.
type ReadInput = fn(&BadgeSettings, Option<&[u8]>, Option<&[u8]>) -> Input;

/// The thread and its latest reply of a thread changelog record (a
/// follower's public cursor carries the thread's latest).
fn thread_latest_of(m: &BorrowedMessage<'_>, max_id_bytes: usize) -> Option<(ConversationId, Seq, Seq)> {
    let entry = decode_changelog(
        ChangelogKind::ThreadByConversation,
        m.key(),
        m.payload(),
        max_id_bytes,
    )
    .ok()?;
    match entry {
        ChangelogEntry::Thread(ThreadEntry::Cursor(c)) => {
            Some((c.key.conversation_id, c.key.thread, c.latest_seq))
        }
        _ => None,
    }
}

/// The conversation and latest seq of a conversations' changelog record;
/// what does not decode is the first stage's to have dead-lettered, not
/// this one's.
fn latest_of(m: &BorrowedMessage<'_>, max_id_bytes: usize) -> Option<(ConversationId, Seq)> {
    latest_seq_of(m.payload(), max_id_bytes)
}

/// A Redis write under way.
struct Storing {
    task: tokio::task::JoinHandle<readfold_store::Result<()>>,
    batch: Arc<Vec<(UserId, Badge, i64)>>,
}

/// Queues a record, waiting while librdkafka's queue is full.
fn send(
    producer: &ThreadedProducer<readfold_kafka::context::LogContext>,
    record: BaseRecord<'_, [u8], [u8]>,
) -> std::result::Result<(), KafkaError> {
    let mut record = record;
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), back)) => {
                std::thread::sleep(Duration::from_millis(5));
                record = back;
            }
            Err((e, _)) => return Err(e),
        }
    }
}
