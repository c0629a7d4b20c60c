//! The processor: consumes both inputs as one consumer group member, folds
//! them per partition, and publishes each flush in one Kafka transaction
//! together with the input offsets it covers.
//!
//! A flush takes the current value of every dirty key, so a failed flush is
//! simply retried later with values at least as new; nothing is dropped and
//! state never rewinds.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::config::Config;
use crate::domain::CursorKey;
use crate::error::{Error, Result};
use crate::fold::PartitionState;
use crate::kafka::admin::Layout;
use crate::kafka::base_client_config;
use crate::kafka::records::{changelog_records, dead_letter, OutRecord, Source};
use crate::kafka::restore::Restorer;
use crate::sinks::cql::CqlSink;
use crate::sinks::group_by_conversation;
use crate::sinks::redis::RedisSink;
use crate::telemetry;
use crate::validate::{ingest, Input, InputKind, Limits, Placement};

const TXN_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// What the consumer group told us, in order, from librdkafka's callbacks.
#[derive(Debug)]
enum GroupEvent {
    Revoked { lost: bool },
    Assigned(Vec<(String, i32)>),
}

struct GroupContext {
    events: Arc<Mutex<Vec<GroupEvent>>>,
    inputs: [String; 2],
}

impl ClientContext for GroupContext {
    fn stats(&self, statistics: Statistics) {
        for (name, topic) in &statistics.topics {
            if !self.inputs.contains(name) {
                continue;
            }
            for (&partition, p) in &topic.partitions {
                // librdkafka's own consumer_lag is measured from the
                // consumer's committed offset, which it never learns when
                // offsets are committed through the producer's transaction;
                // the lag here is from the next offset to process.
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

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = rebalance {
            telemetry::rebalance("revoke");
            let lost = consumer.assignment_lost();
            self.events
                .lock()
                .expect("group event lock")
                .push(GroupEvent::Revoked { lost });
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            telemetry::rebalance("assign");
            let partitions = tpl
                .elements()
                .iter()
                .map(|e| (e.topic().to_owned(), e.partition()))
                .collect();
            self.events
                .lock()
                .expect("group event lock")
                .push(GroupEvent::Assigned(partitions));
        }
    }
}

/// One input partition's state and what its next flush must publish.
struct Slot {
    state: PartitionState,
    /// Next offset to commit per input topic (last processed + 1).
    offsets: HashMap<String, i64>,
    dead_letters: Vec<OutRecord>,
    /// Keys published to the changelog but not yet snapshotted to CQL.
    unsnapshotted: HashSet<CursorKey>,
}

impl Slot {
    fn has_work(&self) -> bool {
        self.state.dirty_len() > 0 || !self.offsets.is_empty() || !self.dead_letters.is_empty()
    }
}

/// How a failed transaction may go on.
enum TxnFailure {
    /// Aborted; the same work is retried at the next flush.
    Retry(KafkaError),
    /// The producer is fenced or broken: this instance must stop.
    Fatal(KafkaError),
}

pub struct Processor {
    config: Config,
    limits: Limits,
    layout: Layout,
    consumer: StreamConsumer<GroupContext>,
    producer: FutureProducer,
    restorer: Restorer,
    redis: Option<RedisSink>,
    cql: Option<CqlSink>,
    snapshot_interval: Duration,
    next_snapshot: Instant,
    events: Arc<Mutex<Vec<GroupEvent>>>,
    slots: HashMap<i32, Slot>,
    /// Input partitions currently assigned, per topic.
    assigned: HashMap<String, Vec<i32>>,
    /// Between a revoke and the next assignment nothing is flushed.
    suspended: bool,
    paused: bool,
    failures: u32,
    next_flush_attempt: Instant,
}

impl Processor {
    /// Connects the consumer and the transactional producer. Call after
    /// [`crate::kafka::admin::ensure_topics`] produced `layout`.
    pub async fn new(config: Config, layout: Layout) -> Result<Self> {
        let events = Arc::new(Mutex::new(Vec::new()));
        let context = GroupContext {
            events: events.clone(),
            inputs: [
                config.topics.read_reports.clone(),
                config.topics.conversation_events.clone(),
            ],
        };
        let consumer: StreamConsumer<GroupContext> = base_client_config(&config)
            .set("group.id", &config.kafka.group_id)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            // Input producers may be transactional too.
            .set("isolation.level", "read_committed")
            // Range puts partition p of both inputs on one member; see topology.md.
            .set("partition.assignment.strategy", "range")
            .set("statistics.interval.ms", "5000")
            .create_with_context(context)?;
        let transactional_id = format!("{}-{}", config.kafka.group_id, config.instance_id());
        let producer: FutureProducer = base_client_config(&config)
            .set("transactional.id", &transactional_id)
            .set(
                "transaction.timeout.ms",
                config.kafka.transaction_timeout_ms.to_string(),
            )
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .set("queue.buffering.max.messages", "1000000")
            // Dead letters keep records of up to MAX_DEAD_LETTER_BYTES.
            .set("message.max.bytes", "2000000")
            .create()?;
        // Fences an earlier incarnation with the same transactional id and
        // aborts whatever it left open.
        producer.init_transactions(TXN_TIMEOUT)?;
        tracing::info!(%transactional_id, "transactional producer ready");
        let restorer = Restorer::new(&config)?;
        let redis = if config.redis.enabled {
            let sink = connect_with_retry("redis", || RedisSink::connect(&config.redis)).await?;
            tracing::info!(url = %config.redis.url, "redis sink ready");
            Some(sink)
        } else {
            None
        };
        let cql = if config.cql.enabled {
            let sink = connect_with_retry("cql", || CqlSink::connect(&config.cql)).await?;
            tracing::info!(contact_points = %config.cql.contact_points, keyspace = %config.cql.keyspace, "cql sink ready");
            Some(sink)
        } else {
            None
        };
        Ok(Processor {
            redis,
            cql,
            snapshot_interval: Duration::from_millis(config.snapshot.interval_ms),
            next_snapshot: Instant::now(),
            limits: config.limits(),
            layout,
            consumer,
            producer,
            restorer,
            events,
            slots: HashMap::new(),
            assigned: HashMap::new(),
            suspended: false,
            paused: false,
            failures: 0,
            next_flush_attempt: Instant::now(),
            config,
        })
    }

    /// Runs until `shutdown` turns true, then flushes, commits and leaves
    /// the group.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        let topics = [
            self.config.topics.read_reports.as_str(),
            self.config.topics.conversation_events.as_str(),
        ];
        self.consumer.subscribe(&topics)?;
        tracing::info!(group = %self.config.kafka.group_id, ?topics, "subscribed");
        let mut tick = tokio::time::interval(Duration::from_millis(self.config.flush.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        enum Step {
            Shutdown,
            Tick,
            Message(std::result::Result<OwnedMessage, KafkaError>),
        }
        loop {
            if *shutdown.borrow() {
                break;
            }
            let step = tokio::select! {
                _ = shutdown.changed() => Step::Shutdown,
                _ = tick.tick() => Step::Tick,
                m = self.consumer.recv() => Step::Message(m.map(|m| m.detach())),
            };
            // Rebalance callbacks ran inside recv(); apply them before
            // touching any partition's state.
            self.apply_group_events()?;
            match step {
                Step::Shutdown => break,
                Step::Tick => self.flush_when_due().await?,
                Step::Message(Ok(message)) => {
                    self.process(message)?;
                    if self.dirty_len() >= self.config.flush.max_dirty {
                        self.flush_when_due().await?;
                    }
                }
                Step::Message(Err(e)) => {
                    tracing::warn!(error = %e, "consumer error");
                    if matches!(e, KafkaError::MessageConsumptionFatal(_)) {
                        return Err(e.into());
                    }
                }
            }
        }
        tracing::info!("shutting down: final flush");
        self.apply_group_events()?;
        // Leave CQL as current as the changelog.
        self.next_snapshot = Instant::now();
        if !self.suspended {
            for attempt in 0..3 {
                match self.flush().await {
                    Ok(()) => break,
                    Err(e) if attempt < 2 => {
                        tracing::warn!(error = %e, "final flush failed, retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.consumer.unsubscribe();
        tracing::info!("left the group");
        Ok(())
    }

    fn dirty_len(&self) -> usize {
        self.slots.values().map(|s| s.state.dirty_len()).sum()
    }

    fn apply_group_events(&mut self) -> Result<()> {
        let events: Vec<GroupEvent> = std::mem::take(&mut *self.events.lock().expect("group event lock"));
        for event in events {
            match event {
                GroupEvent::Revoked { lost } => {
                    // Uncommitted input will be delivered again to whoever
                    // owns the partition next, so pending offsets and dead
                    // letters go; the folded state stays if the partition
                    // comes straight back (it holds nothing unsafe: the fold
                    // is idempotent).
                    for slot in self.slots.values_mut() {
                        slot.offsets.clear();
                        slot.dead_letters.clear();
                    }
                    if lost {
                        tracing::warn!("assignment lost: dropping all partition state");
                        self.slots.clear();
                    }
                    self.assigned.clear();
                    self.suspended = true;
                    self.paused = false;
                }
                GroupEvent::Assigned(partitions) => {
                    self.assigned.clear();
                    for (topic, p) in partitions {
                        self.assigned.entry(topic).or_default().push(p);
                    }
                    let reports = self
                        .assigned
                        .get(&self.config.topics.read_reports)
                        .cloned()
                        .unwrap_or_default();
                    let events = self
                        .assigned
                        .get(&self.config.topics.conversation_events)
                        .cloned()
                        .unwrap_or_default();
                    for p in reports
                        .iter()
                        .filter(|p| !events.contains(p))
                        .chain(events.iter().filter(|p| !reports.contains(p)))
                    {
                        tracing::error!(partition = p, "partition assigned for one input only: the inputs are not co-partitioned in this group");
                    }
                    // Another member may have owned a partition we did not
                    // get back: its state here is stale.
                    self.slots
                        .retain(|p, _| reports.contains(p) || events.contains(p));
                    tracing::info!(read_reports = ?reports, conversation_events = ?events, "partitions assigned");
                    self.suspended = false;
                    self.paused = false;
                    telemetry::paused(false);
                }
            }
        }
        Ok(())
    }

    fn process(&mut self, message: OwnedMessage) -> Result<()> {
        let topic = message.topic();
        let kind = if topic == self.config.topics.read_reports {
            InputKind::ReadReports
        } else if topic == self.config.topics.conversation_events {
            InputKind::ConversationEvents
        } else {
            tracing::warn!(topic, "message from an unexpected topic");
            return Ok(());
        };
        let partition = message.partition();
        telemetry::record_in(topic);
        if !self.slots.contains_key(&partition) {
            let slot = self.restore(partition)?;
            self.slots.insert(partition, slot);
        }
        let placement = Placement {
            key: message.key(),
            partition,
            partition_count: self.layout.partitions,
        };
        let outcome = ingest(kind, message.payload(), placement, &self.limits);
        let slot = self.slots.get_mut(&partition).expect("slot restored above");
        match outcome {
            Ok(Input::Report(report)) => {
                slot.state.apply_report(&report);
            }
            Ok(Input::Event(event)) => {
                slot.state.apply_event(&event);
            }
            Err(rejection) => {
                telemetry::dead_lettered(rejection.reason);
                tracing::debug!(topic, partition, offset = message.offset(), reason = %rejection.reason, detail = %rejection.detail, "dead-lettering");
                let source = Source {
                    topic: topic.to_owned(),
                    partition,
                    offset: message.offset(),
                };
                slot.dead_letters.push(dead_letter(
                    message.key(),
                    message.payload(),
                    &rejection,
                    &source,
                    &self.config.topics.dlq,
                    self.layout.output,
                ));
            }
        }
        slot.offsets.insert(topic.to_owned(), message.offset() + 1);
        Ok(())
    }

    fn restore(&self, partition: i32) -> Result<Slot> {
        let (state, stats) = tokio::task::block_in_place(|| self.restorer.restore(partition))?;
        telemetry::restored(stats.records, stats.elapsed);
        tracing::info!(
            partition,
            records = stats.records,
            cursors = stats.cursors,
            elapsed_ms = stats.elapsed.as_millis() as u64,
            "restored partition state from the changelog"
        );
        // A previous owner may have died between snapshots: what it
        // published but never snapshotted is only in the changelog now.
        let unsnapshotted = if self.cql.is_some() {
            state.keys().collect()
        } else {
            HashSet::new()
        };
        Ok(Slot {
            state,
            offsets: HashMap::new(),
            dead_letters: Vec::new(),
            unsnapshotted,
        })
    }

    /// Flushes unless a recent failure asks to wait; pauses the consumer
    /// when failures let the dirty set grow past its bound.
    async fn flush_when_due(&mut self) -> Result<()> {
        if self.suspended || Instant::now() < self.next_flush_attempt {
            self.apply_backpressure()?;
            return Ok(());
        }
        match self.flush().await {
            Ok(()) => {
                self.failures = 0;
                if self.paused {
                    self.set_paused(false)?;
                }
                Ok(())
            }
            Err(e @ (Error::Kafka(_) | Error::Sink(_))) if !matches!(&e, Error::Kafka(k) if is_fatal(k)) => {
                self.failures += 1;
                let delay = backoff(self.failures);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "flush failed; will retry");
                self.next_flush_attempt = Instant::now() + delay;
                self.apply_backpressure()
            }
            Err(e) => Err(e),
        }
    }

    fn apply_backpressure(&mut self) -> Result<()> {
        let over = self.dirty_len() >= self.config.flush.max_dirty.saturating_mul(4);
        if over && !self.paused && !self.suspended {
            tracing::warn!(
                dirty = self.dirty_len(),
                "dirty set over its bound: pausing the consumer until a flush succeeds"
            );
            self.set_paused(true)?;
        }
        Ok(())
    }

    fn set_paused(&mut self, on: bool) -> Result<()> {
        let assignment = self.consumer.assignment()?;
        if on {
            self.consumer.pause(&assignment)?;
        } else {
            self.consumer.resume(&assignment)?;
        }
        self.paused = on;
        telemetry::paused(on);
        Ok(())
    }

    /// Publishes every partition's pending changes, dead letters and input
    /// offsets in one transaction.
    async fn flush(&mut self) -> Result<()> {
        let snapshot_due = self.cql.is_some() && Instant::now() >= self.next_snapshot;
        let mut records = Vec::new();
        let mut all_changes = Vec::new();
        let mut snapshot_changes = Vec::new();
        let mut offsets = TopicPartitionList::new();
        let mut flushed = Vec::new();
        let mut changes = 0;
        let mut dead_letters = 0;
        for (&partition, slot) in &self.slots {
            let snapshot_work = snapshot_due && !slot.unsnapshotted.is_empty();
            if !slot.has_work() && !snapshot_work {
                continue;
            }
            for change in slot.state.pending_changes() {
                changes += 1;
                records.extend(changelog_records(
                    &change,
                    partition,
                    &self.config.topics,
                    self.layout.output,
                ));
                all_changes.push(change);
            }
            if snapshot_due {
                // Published earlier but not yet in CQL; the dirty ones are
                // in `all_changes` already.
                snapshot_changes.extend(
                    slot.unsnapshotted
                        .iter()
                        .filter(|k| !slot.state.is_dirty(k))
                        .filter_map(|k| slot.state.current(k)),
                );
            }
            dead_letters += slot.dead_letters.len();
            records.extend(slot.dead_letters.iter().cloned());
            for (topic, &offset) in &slot.offsets {
                offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
            }
            flushed.push(partition);
        }
        telemetry::dirty_keys(self.dirty_len());
        telemetry::cursors_held(self.slots.values().map(|s| s.state.cursor_count()).sum());
        if flushed.is_empty() {
            if snapshot_due {
                self.next_snapshot = Instant::now() + self.snapshot_interval;
            }
            return Ok(());
        }
        let started = Instant::now();
        // Sinks first: they are idempotent max-merges, so if the commit
        // below fails, writing them again on retry changes nothing.
        if let Some(redis) = &self.redis {
            let batches = group_by_conversation(&all_changes);
            if let Err(e) = timed_sink_write("redis", batches.len(), redis.write(&batches)).await {
                telemetry::flush_failed(started.elapsed());
                return Err(e);
            }
        }
        if let (true, Some(cql)) = (snapshot_due, &self.cql) {
            let batches = group_by_conversation(all_changes.iter().chain(&snapshot_changes));
            if let Err(e) = timed_sink_write("cql", batches.len(), cql.write(&batches)).await {
                telemetry::flush_failed(started.elapsed());
                return Err(e);
            }
        }
        // A snapshot-only flush has nothing for Kafka: no transaction.
        let outcome = if records.is_empty() && offsets.count() == 0 {
            Ok(())
        } else {
            tokio::task::block_in_place(|| self.transact(&records, &offsets))
        };
        match outcome {
            Ok(()) => {
                let track_snapshots = self.cql.is_some() && !snapshot_due;
                for partition in flushed {
                    let slot = self.slots.get_mut(&partition).expect("flushed slot exists");
                    if track_snapshots {
                        slot.unsnapshotted.extend(slot.state.dirty_keys().cloned());
                    } else {
                        slot.unsnapshotted.clear();
                    }
                    slot.state.mark_flushed();
                    slot.offsets.clear();
                    slot.dead_letters.clear();
                }
                if snapshot_due {
                    self.next_snapshot = Instant::now() + self.snapshot_interval;
                }
                telemetry::flush_committed(started.elapsed(), changes, dead_letters);
                telemetry::dirty_keys(self.dirty_len());
                tracing::debug!(
                    changes,
                    dead_letters,
                    snapshot = snapshot_due,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "flush committed"
                );
                Ok(())
            }
            Err(TxnFailure::Retry(e)) => {
                telemetry::flush_failed(started.elapsed());
                Err(Error::Kafka(e))
            }
            Err(TxnFailure::Fatal(e)) => {
                telemetry::flush_failed(started.elapsed());
                Err(Error::Other(format!("fatal transaction error, stopping: {e}")))
            }
        }
    }

    fn transact(
        &self,
        records: &[OutRecord],
        offsets: &TopicPartitionList,
    ) -> std::result::Result<(), TxnFailure> {
        let classify = |e: KafkaError| {
            if is_fatal(&e) {
                TxnFailure::Fatal(e)
            } else {
                TxnFailure::Retry(e)
            }
        };
        self.producer.begin_transaction().map_err(classify)?;
        let body = || -> std::result::Result<(), KafkaError> {
            for record in records {
                self.send(record)?;
            }
            if offsets.count() > 0 {
                let metadata = self
                    .consumer
                    .group_metadata()
                    // Not in a group generation (yet): retry after the next rebalance.
                    .ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
                self.producer
                    .send_offsets_to_transaction(offsets, &metadata, TXN_TIMEOUT)?;
            }
            let mut attempt = 0;
            loop {
                match self.producer.commit_transaction(TXN_TIMEOUT) {
                    Err(KafkaError::Transaction(e)) if e.is_retriable() && attempt < 3 => attempt += 1,
                    other => return other,
                }
            }
        };
        match body() {
            Ok(()) => Ok(()),
            Err(e) if is_fatal(&e) => Err(TxnFailure::Fatal(e)),
            Err(e) => {
                if let Err(abort) = self.producer.abort_transaction(TXN_TIMEOUT) {
                    if is_fatal(&abort) {
                        return Err(TxnFailure::Fatal(abort));
                    }
                    tracing::warn!(error = %abort, "abort_transaction failed");
                }
                Err(TxnFailure::Retry(e))
            }
        }
    }

    fn send(&self, record: &OutRecord) -> std::result::Result<(), KafkaError> {
        let mut headers = OwnedHeaders::new();
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        let mut future: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&record.topic)
            .partition(record.partition)
            .headers(headers);
        if let Some(key) = &record.key {
            future = future.key(key);
        }
        if let Some(value) = &record.value {
            future = future.payload(value);
        }
        loop {
            match self.producer.send_result(future) {
                // Delivery is checked by commit_transaction as a whole.
                Ok(_delivery) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    future = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// Connects a sink, retrying with backoff while it is unreachable: a
/// processor without its sinks cannot flush anyway, and exiting would only
/// churn restarts. Configuration errors fail at once.
async fn connect_with_retry<T, F, Fut>(sink: &'static str, connect: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut failures = 0;
    loop {
        match connect().await {
            Err(Error::Sink(e)) => {
                failures += 1;
                let delay = backoff(failures);
                tracing::warn!(sink, error = %e, retry_in_ms = delay.as_millis() as u64, "sink unreachable at start; retrying");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// Awaits one sink's write of `calls` conversation batches, with telemetry.
async fn timed_sink_write(
    sink: &'static str,
    calls: usize,
    write: impl std::future::Future<Output = Result<u64>>,
) -> Result<()> {
    let started = Instant::now();
    match write.await {
        Ok(written) => {
            telemetry::sink_written(sink, started.elapsed(), calls, written);
            Ok(())
        }
        Err(e) => {
            telemetry::sink_failed(sink);
            Err(e)
        }
    }
}

fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(inner) => inner.is_fatal(),
        _ => matches!(
            e.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Fatal | RDKafkaErrorCode::ProducerFenced)
        ),
    }
}

/// Capped exponential backoff: 100 ms, 200 ms, ... up to 10 s.
fn backoff(failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(7);
    (Duration::from_millis(100) * factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(5), Duration::from_millis(1600));
        assert_eq!(backoff(50), Duration::from_secs(10));
    }
}
