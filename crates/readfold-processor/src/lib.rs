//! The processor: one member of the consumer group. It consumes both inputs,
//! folds them per partition, and publishes each flush to the stores and in
//! one Kafka transaction together with the input offsets it covers.
//!
//! - [`group`]: the consumer and its rebalance events.
//! - [`partitions`]: the assigned partitions' state.
//! - [`health`]: what readiness probes learn of the processor.
//! - `flush`: executing the pure flush plan of `readfold_core::flush`, one
//!   flush in flight at a time while folding goes on.
//! - [`transaction`]: the two transactional producers, taking turns, on a
//!   blocking thread.

pub mod checkpoint;
pub mod config;
pub mod error;
mod flush;
pub mod group;
pub mod health;
pub mod partitions;
mod record;
mod schemas;
pub mod telemetry;
pub mod transaction;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use rdkafka::TopicPartitionList;
use readfold_core::backoff::{self, Backoff};
use readfold_core::flush::{over_bound, SnapshotDue};
use readfold_core::fold::{InputKind, StoredFault};
use readfold_core::pacing::CatchUpPacing;
use readfold_kafka::admin::Layout;
use readfold_kafka::changelog::{RestoreStats, Restored, Restorer};
use readfold_kafka::routed_queue::RoutedReader;
use readfold_store::cql::CqlStore;
use readfold_store::redis::RedisStore;
use readfold_wire::dead_letter::{dead_letter, Source};
use readfold_wire::validate::{ingest, Placement};
use readfold_wire::OutputTopics;
use tokio::sync::watch;

pub use config::{FlushConfig, Settings, ShutdownConfig, SnapshotConfig, StateConfig};
pub use error::{Error, Result};

use checkpoint::Checkpoints;
use flush::InFlight;
use group::{GroupConsumer, GroupEvent, GroupEvents};
use health::Health;
use partitions::{Partitions, Slot};
use readfold_wire::confluent::Framing;
use readfold_wire::validate::{RejectReason, Rejection};
use record::{OwnedRecord, Record};
use schemas::{InputSchemas, SchemaCheck};
use transaction::Transactions;

/// A running member of the processor's consumer group.
pub struct Processor {
    settings: Settings,
    layout: Layout,
    out: Arc<OutputTopics>,
    /// Shared with the run loop, so that a fetched record can borrow it
    /// while the loop folds it into `self`.
    consumer: Arc<GroupConsumer>,
    records_in: telemetry::RecordsIn,
    events: GroupEvents,
    transactions: Transactions,
    restorer: Arc<Restorer>,
    redis: Option<Arc<RedisStore>>,
    cql: Option<Arc<CqlStore>>,
    in_flight: Option<InFlight>,
    snapshot_in_flight: Option<InFlight>,
    /// The start of the last snapshot pass that was written whole:
    /// everything this process published before then is in CQL (restored
    /// keys still owed aside, which are not the changelog running ahead).
    cql_covered_at: Instant,
    /// The start of the current snapshot pass (see
    /// `readfold_core::flush::begin_snapshot`).
    pass_began: Instant,
    snapshot_retry: Backoff,
    /// With CQL on and checkpoints kept: each restored partition's list of
    /// snapshot marks in CQL, as its restore found it (or wrote it, when
    /// there was none; see `readfold_store::cql::MarkList`). A stop names
    /// the store in a partition's checkpoint only if CQL still holds this
    /// list.
    cql_marks: BTreeMap<i32, String>,
    /// When the next flush starts, if none is in flight (`flush.linger_ms`
    /// after the first change that waits for it, or a catch-up's wait; in
    /// either case at least `flush.min_interval_ms` after the last began).
    flush_at: Option<Instant>,
    /// `flush_at` is a catch-up's wait (see `flush_after_commit`), which
    /// ends early once the fold catches up.
    catching_up: bool,
    /// The fold found every record of its input folded at least once since
    /// the last flush began: it is not behind (see `queue_drained`).
    caught_up: bool,
    /// Records taken off the queues since the last flush began: the fold's
    /// recent rate, for a catch-up's pacing.
    taken_since_flush: u64,
    /// When the last flush began.
    flush_started: Instant,
    /// When the last flush that had anything to write began (none yet:
    /// `None`), for `flush.min_interval_ms`: the interval's tick starts an
    /// empty one every `flush.interval_ms`, which must not hold back the
    /// next real one.
    last_flush_launched: Option<Instant>,
    /// How long a catch-up's next flush waits.
    pacing: CatchUpPacing,
    snapshot_interval: Duration,
    next_snapshot: Instant,
    partitions: Partitions,
    /// The current assignment started at stable committed offsets, so a
    /// restore need not wait for them again.
    offsets_stable: bool,
    paused: bool,
    retry: Backoff,
    /// Producer recoveries since the last committed flush.
    recoveries: u32,
    health: Arc<Health>,
    /// With a schema registry: the ids that frame the output, and the
    /// verdicts on framed input's schema ids.
    framing: Option<Arc<Framing>>,
    input_schemas: Option<InputSchemas>,
    /// Local state checkpoints (`state.dir`), if on.
    checkpoints: Option<Arc<Checkpoints>>,
}

/// Records folded per turn of the run loop at most, so that flushes,
/// ticks and shutdown are still looked at often under load.
const FOLD_BATCH: usize = 512;

/// Offsets the broker may be ahead, over all owned partitions, with the
/// fold still counted as caught up: less than one turn of the fold.
const CAUGHT_UP_LAG: i64 = FOLD_BATCH as i64;

/// What [`Processor::fold_record`] did with a record.
enum Folded {
    Done,
    /// Its partition is not ours (any more): dropped; see
    /// [`partitions::Partitions::owns`].
    NotOwned,
    /// Its partition has no state yet: restore it, then fold again.
    Unrestored,
    /// Framed with a schema id not yet checked: ask the registry, then
    /// fold again.
    UnknownSchema(InputKind, u32),
}

/// Polls `future` once, with a waker that does nothing: its output if it
/// is ready now.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

/// The longest the run loop stops polling the consumer while a flush it
/// outran is in flight (see `Processor::holding`): rebalances and
/// librdkafka's `max.poll.interval.ms` wait on that polling.
const MAX_HOLD: Duration = Duration::from_secs(5);

/// How many times in a row the processor starts over with a new
/// transactional producers before it gives up (see `recover_producer`).
const MAX_PRODUCER_RECOVERIES: u32 = 3;

impl Processor {
    /// Checks (and creates, if allowed) the topics while the enabled
    /// stores connect (waiting for unreachable ones), then starts the
    /// transactional producers and joins the group.
    pub async fn start(settings: Settings) -> Result<Self> {
        let (kafka, topics) = (settings.kafka.clone(), settings.topics.clone());
        // A task of its own: the check makes blocking metadata calls, which
        // would hold up the store connects polled beside it.
        let checked =
            tokio::spawn(async move { readfold_kafka::admin::ensure_topics(&kafka, &topics).await });
        let layout = async move {
            let layout = checked.await??;
            tracing::info!(partitions = layout.partitions, "topic layout checked");
            Ok(layout)
        };
        Self::connect(settings, layout).await
    }

    /// As [`Processor::start`], for a caller that checked the topics
    /// itself ([`readfold_kafka::admin::ensure_topics`] produced `layout`).
    pub async fn new(settings: Settings, layout: Layout) -> Result<Self> {
        Self::connect(settings, async { Ok(layout) }).await
    }

    async fn connect(settings: Settings, layout: impl Future<Output = Result<Layout>>) -> Result<Self> {
        telemetry::register();
        // The consumer exists from the start: librdkafka looks for the
        // group's coordinator when it is created, and, finding no broker
        // connection up yet, looks again only 500 ms later; that wait now
        // runs while the topics are checked. Once they are, the consumer
        // subscribes (joining goes on in the background) and the producer
        // starts. Not before: its `init_transactions` fences any running
        // incarnation with the same transactional id, and a start bound to
        // fail its topic check must not take that one down with it. The
        // assignment, and with it the first offset fetch, waits for the run
        // loop's first poll, after the producer fenced earlier incarnations.
        let (consumer, events) = group::consumer(&settings.kafka, &settings.topics)?;
        let kafka = async {
            let layout = layout.await?;
            let topics = [
                settings.topics.read_reports.as_str(),
                settings.topics.conversation_events.as_str(),
            ];
            consumer.subscribe(&topics)?;
            tracing::info!(group = %settings.kafka.group_id, ?topics, "subscribed");
            let transactions = init_producer(&settings).await?;
            Ok::<_, Error>((layout, transactions))
        };
        let restorer = Arc::new(Restorer::new(
            &settings.kafka,
            &settings.topics,
            settings.input.max_id_bytes,
        )?);
        // A thread of its own, not the runtime's blocking pool: with the
        // broker away it waits for its timeout, which must not hold back
        // the process's exit.
        let warming = std::thread::Builder::new().name("restore-warm-up".into()).spawn({
            let restorer = Arc::clone(&restorer);
            move || restorer.warm_up()
        });
        if let Err(e) = warming {
            tracing::debug!(error = %e, "cannot start the restore readers' warm-up; the first restore connects them");
        }
        let redis = async {
            if !settings.redis.enabled {
                return Ok(None);
            }
            let store =
                readfold_store::connect_with_retry("redis", || RedisStore::connect_writer(&settings.redis))
                    .await?;
            tracing::info!(url = %settings.redis.url_for_logs(), "redis store ready");
            Ok::<_, Error>(Some(Arc::new(store)))
        };
        let cql = async {
            if !settings.cql.enabled {
                return Ok(None);
            }
            let store =
                readfold_store::connect_with_retry("cql", || CqlStore::connect_writer(&settings.cql)).await?;
            tracing::info!(contact_points = %settings.cql.contact_points, keyspace = %settings.cql.keyspace, "cql store ready");
            Ok::<_, Error>(Some(Arc::new(store)))
        };
        // Side by side: each takes from tens to hundreds of milliseconds.
        let ((layout, transactions), redis, cql) = tokio::try_join!(kafka, redis, cql)?;
        let out = Arc::new(layout.output_topics(&settings.topics));
        let (framing, input_schemas) = if settings.schema_registry.is_on() {
            let registry = readfold_registry::Registry::new(&settings.schema_registry)?;
            let framing = schemas::register_outputs(&registry, &out).await?;
            tracing::info!(url = %registry.url(), "writing the Confluent wire format; framed input is checked against the registry");
            (Some(framing), Some(InputSchemas::new(registry)))
        } else {
            (None, None)
        };
        let cql_store = cql.as_ref().and_then(|c| c.store_name()).map(str::to_owned);
        let checkpoints = Checkpoints::new(&settings, layout.partitions, cql_store).map(Arc::new);
        if let Some(c) = &checkpoints {
            tracing::info!(dir = %c.dir().display(), "local state checkpoints on");
        }
        Ok(Processor {
            out,
            framing,
            input_schemas,
            checkpoints,
            snapshot_interval: Duration::from_millis(settings.snapshot.interval_ms),
            next_snapshot: Instant::now(),
            layout,
            consumer: Arc::new(consumer),
            records_in: telemetry::RecordsIn::new(
                &settings.topics.read_reports,
                &settings.topics.conversation_events,
            ),
            events,
            transactions,
            restorer,
            redis,
            cql,
            in_flight: None,
            snapshot_in_flight: None,
            cql_covered_at: Instant::now(),
            pass_began: Instant::now(),
            snapshot_retry: Backoff::new(),
            cql_marks: BTreeMap::new(),
            flush_at: None,
            catching_up: false,
            caught_up: false,
            taken_since_flush: 0,
            flush_started: Instant::now(),
            last_flush_launched: None,
            pacing: CatchUpPacing::new(
                settings.flush.catch_up_interval(),
                settings.flush.catch_up_max_interval(),
            ),
            partitions: Partitions::default(),
            offsets_stable: false,
            paused: false,
            retry: Backoff::new(),
            recoveries: 0,
            health: Arc::new(Health::default()),
            settings,
        })
    }

    /// The processor's health, for readiness probes; it stays current
    /// while the processor runs.
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// The stores the processor writes, for probes of their reachability.
    pub fn stores(&self) -> (Option<Arc<RedisStore>>, Option<Arc<CqlStore>>) {
        (self.redis.clone(), self.cql.clone())
    }

    /// Runs until `shutdown` turns true, then flushes, commits and leaves
    /// the group.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<()> {
        self.health.set_running(true);
        let mut tick = tokio::time::interval(self.settings.flush.interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let linger = self.settings.flush.linger();
        let consumer = Arc::clone(&self.consumer);
        // Assigned partitions' records come from here, a batch at a time;
        // the consumer's own queue keeps the group's events.
        let mut routed = group::routed_reader(&consumer);
        let group_events = self.events.clone();
        // One timer for the linger, moved rather than made anew per loop.
        let linger_sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(linger_sleep);
        let mut linger_armed: Option<Instant> = None;
        let mut held = false;
        /// What woke the loop; a fetched record still borrows the consumer.
        enum Woke<'a> {
            Shutdown,
            Rebalanced,
            Tick,
            Linger,
            Flushed(Result<()>),
            Snapshotted(Result<()>),
            Fetched(std::result::Result<BorrowedMessage<'a>, KafkaError>),
            Routed,
        }
        /// What to do about it, with no borrow of the consumer left.
        enum Step {
            Shutdown,
            /// Only the group changed: applied below, as after every wake.
            Rebalanced,
            Tick,
            Linger,
            Flushed(Result<()>),
            Snapshotted(Result<()>),
            /// Folded (or dropped, its partition no longer ours), or deferred
            /// (copied) until a rebalance is applied or its partition is
            /// restored.
            Fetched(Option<OwnedRecord>),
            FetchFailed(KafkaError),
            /// Records wait on the routed queue.
            Routed,
        }
        loop {
            if *shutdown.borrow() {
                break;
            }
            if self.partitions.any_stored_fault() {
                self.drop_damaged_state().await?;
            }
            if self.flush_at != linger_armed {
                if let Some(at) = self.flush_at {
                    linger_sleep.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                linger_armed = self.flush_at;
            }
            let lingering = self.flush_at.is_some();
            let taking = !self.holding();
            if !taking && !held {
                telemetry::fold_held();
            }
            held = !taking;
            let (in_flight, snapshot_in_flight) = (&mut self.in_flight, &mut self.snapshot_in_flight);
            let woke = tokio::select! {
                _ = shutdown.changed() => Woke::Shutdown,
                outcome = async { in_flight.as_mut().expect("guarded").done().await }, if in_flight.is_some() => Woke::Flushed(outcome),
                outcome = async { snapshot_in_flight.as_mut().expect("guarded").done().await }, if snapshot_in_flight.is_some() => Woke::Snapshotted(outcome),
                _ = group_events.arrived() => Woke::Rebalanced,
                _ = tick.tick() => Woke::Tick,
                _ = &mut linger_sleep, if lingering && in_flight.is_none() => Woke::Linger,
                _ = routed.ready(), if taking => Woke::Routed,
                m = consumer.recv(), if taking => Woke::Fetched(m),
            };
            let step = match woke {
                Woke::Shutdown => Step::Shutdown,
                Woke::Rebalanced => Step::Rebalanced,
                Woke::Tick => Step::Tick,
                Woke::Linger => Step::Linger,
                Woke::Flushed(outcome) => Step::Flushed(outcome),
                Woke::Snapshotted(outcome) => Step::Snapshotted(outcome),
                Woke::Fetched(Ok(message)) => Step::Fetched(self.fold_or_defer(message)),
                Woke::Fetched(Err(e)) => Step::FetchFailed(e),
                Woke::Routed => Step::Routed,
            };
            // Rebalance callbacks ran inside recv(); apply them before
            // touching any partition's state.
            if self.apply_group_events() {
                routed.discard();
            }
            self.restore_assigned().await?;
            match step {
                Step::Shutdown => break,
                Step::Rebalanced => {}
                Step::Flushed(outcome) => {
                    let flight = self.in_flight.take().expect("a flush was in flight");
                    let outcome = self.settle(flight, outcome);
                    self.flush_settled(outcome).await?;
                    // Whatever arrived during that flush goes out now,
                    // or, behind a backlog, a little later.
                    if self.has_pending() {
                        self.flush_after_commit(&routed);
                    }
                    self.apply_backpressure()?;
                }
                Step::Snapshotted(outcome) => {
                    let flight = self.snapshot_in_flight.take().expect("a snapshot was in flight");
                    let outcome = self.settle(flight, outcome);
                    self.snapshot_settled(outcome)?;
                    // Flushes may have waited for CQL (a catch-up's wait
                    // is not for CQL, and goes on).
                    if self.has_pending() && !self.catching_up {
                        self.flush_when_due();
                    }
                    self.apply_backpressure()?;
                    // Restored keys still owed go out at once.
                    self.snapshot_when_due();
                }
                Step::Linger => self.flush_when_due(),
                // A lingering flush starts on its own; the tick retries a
                // failed one, and takes snapshots.
                Step::Tick => {
                    if self.flush_at.is_none() {
                        self.flush_when_due();
                    }
                    self.snapshot_when_due();
                }
                Step::Fetched(deferred) => {
                    if let Some(record) = deferred {
                        self.process(record).await?;
                    }
                    self.fold_unrouted(&consumer, &mut routed).await?;
                    self.folded(linger)?;
                }
                Step::Routed => {
                    self.fold_routed(&mut routed).await?;
                    self.folded(linger)?;
                }
                Step::FetchFailed(e) => self.consumer_error(e)?,
            }
        }
        tracing::info!("shutting down: final flush");
        if let Err(e) = self.finish_flush().await {
            tracing::warn!(error = %e, "the flush in flight failed; its changes go into the final flush");
        }
        if let Err(e) = self.finish_snapshot().await {
            tracing::warn!(error = %e, "the snapshot in flight failed; its keys go into the final one");
        }
        self.apply_group_events();
        // A partition whose checkpoint turned out damaged is left out of
        // the final flush and of the checkpoints written now: its file is
        // set aside, and whoever owns it next restores it from the
        // changelog and folds its uncommitted input again.
        for (partition, fault) in self.partitions.stored_faults() {
            self.set_aside_damaged(partition, &fault);
            self.partitions.slots.remove(&partition);
        }
        // flush_now leaves CQL holding every key this process published
        // (restored ones still owed stay owed: the checkpoint says so).
        if !self.partitions.suspended {
            // Three tries in a row; an attempt that wrote some of the
            // snapshot shares owed (after a catch-up, dozens) starts the
            // count again.
            let mut failures = 0;
            loop {
                let owed = self.published_owed();
                match self.flush_now().await {
                    Ok(()) => break,
                    Err(e) if e.is_retriable() && (failures < 2 || self.published_owed() < owed) => {
                        let progressed = self.published_owed() < owed;
                        failures = if progressed { 0 } else { failures + 1 };
                        tracing::warn!(error = %e, "final flush failed, retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.write_checkpoints().await;
        self.consumer.unsubscribe();
        self.health.set_running(false);
        tracing::info!("left the group");
        Ok(())
    }

    /// At a clean stop, with everything flushed: a checkpoint of every
    /// owned partition. A failure only costs the next start a full restore.
    async fn write_checkpoints(&self) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        if self.partitions.suspended || self.has_pending() {
            tracing::warn!("not everything is flushed: no checkpoint written");
            return;
        }
        let marks = self.mark_snapshots().await;
        let states = self
            .partitions
            .slots
            .iter()
            .map(|(&partition, slot)| checkpoint::Saved {
                partition,
                state: &slot.state,
                cql_mark: marks.get(&partition),
            });
        checkpoints.save(states, &self.restorer);
    }

    /// For the checkpoints of a stop: a fresh snapshot mark at the head of
    /// the list in CQL of each partition that CQL holds whole (no snapshot
    /// owes any of its keys), written only if CQL still holds the list its
    /// restore found (a conditional write, all partitions side by side, so
    /// a slow CQL costs the stop one request's timeout). One whose list CQL
    /// lost or replaced was truncated or restored from a backup while this
    /// instance ran: its checkpoint names no CQL store, so the next start
    /// snapshots every key again.
    async fn mark_snapshots(&self) -> BTreeMap<i32, String> {
        let mut marked = BTreeMap::new();
        let Some(cql) = &self.cql else {
            return marked;
        };
        let swaps: Vec<(i32, &String, String, String)> = self
            .partitions
            .slots
            .iter()
            .filter(|(_, slot)| slot.in_cql())
            .filter_map(|(p, _)| {
                let seen = self.cql_marks.get(p)?;
                let mark = readfold_store::cql::new_mark();
                let list = readfold_store::cql::MarkList::parse(seen).with_newest(&mark);
                Some((*p, seen, list.as_str().to_owned(), mark))
            })
            .collect();
        if swaps.is_empty() {
            return marked;
        }
        let asked: Vec<(i32, Option<&str>, &str)> = swaps
            .iter()
            .map(|(p, seen, list, _)| (*p, Some(seen.as_str()), list.as_str()))
            .collect();
        let group = &self.settings.kafka.group_id;
        for ((partition, outcome), (_, _, _, mark)) in cql
            .swap_snapshot_marks(group, &asked)
            .await
            .into_iter()
            .zip(swaps)
        {
            match outcome {
                Ok(true) => {
                    marked.insert(partition, mark);
                }
                Ok(false) => tracing::warn!(
                    partition,
                    "the CQL store's snapshot marks of this partition changed since its restore (its tables truncated or \
                     restored from a backup?): the checkpoint names no CQL store, and the next start snapshots every key"
                ),
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot write a snapshot mark: the checkpoint names no CQL store")
                }
            }
        }
        marked
    }

    /// Before a restore of `partitions`: the CQL store's snapshot marks,
    /// which a checkpoint that names the store must match. Empty with CQL
    /// off or without checkpoints; `None` when CQL does not answer (the
    /// restored partitions then snapshot every key, and their checkpoints
    /// at the next stop name no store).
    async fn read_snapshot_marks(&self) -> Option<BTreeMap<i32, String>> {
        let (Some(cql), Some(_)) = (&self.cql, &self.checkpoints) else {
            return Some(BTreeMap::new());
        };
        match cql.snapshot_marks(&self.settings.kafka.group_id).await {
            Ok(marks) => Some(marks),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the CQL store's snapshot marks: restored partitions snapshot every key");
                None
            }
        }
    }

    /// After a restore: the list of snapshot marks each partition's stop
    /// checks later, as the restore found it. A partition with none gets a
    /// list of one fresh mark now (unless one appeared meanwhile), so that
    /// CQL losing its tables while this instance runs shows at the stop, as
    /// the list gone.
    async fn renew_snapshot_marks(&mut self, restored: &[i32], found: Option<&BTreeMap<i32, String>>) {
        let (Some(cql), Some(_)) = (&self.cql, &self.checkpoints) else {
            return;
        };
        // Unknown: writing a list now could replace one CQL holds.
        let Some(found) = found else {
            for partition in restored {
                self.cql_marks.remove(partition);
            }
            return;
        };
        let mut fresh = Vec::new();
        for &partition in restored {
            match found.get(&partition) {
                Some(list) if !list.is_empty() => {
                    self.cql_marks.insert(partition, list.clone());
                }
                _ => {
                    self.cql_marks.remove(&partition);
                    fresh.push((partition, readfold_store::cql::new_mark()));
                }
            }
        }
        if fresh.is_empty() {
            return;
        }
        let asked: Vec<(i32, Option<&str>, &str)> =
            fresh.iter().map(|(p, mark)| (*p, None, mark.as_str())).collect();
        let outcomes = cql
            .swap_snapshot_marks(&self.settings.kafka.group_id, &asked)
            .await;
        for ((partition, outcome), (_, mark)) in outcomes.into_iter().zip(fresh) {
            match outcome {
                Ok(true) => {
                    self.cql_marks.insert(partition, mark);
                }
                Ok(false) => tracing::info!(
                    partition,
                    "another instance wrote this partition's first snapshot mark meanwhile: its next checkpoint names no CQL store"
                ),
                Err(e) => {
                    tracing::warn!(partition, error = %e, "cannot write a snapshot mark: this partition's next checkpoint names no CQL store")
                }
            }
        }
    }

    /// Applies the group events queued since the last call; true if there
    /// were any.
    fn apply_group_events(&mut self) -> bool {
        let inputs = [
            self.settings.topics.read_reports.as_str(),
            self.settings.topics.conversation_events.as_str(),
        ];
        let events = self.events.take();
        let any = !events.is_empty();
        for event in events {
            // Paused partitions are resumed by the next assignment anyway.
            self.paused = false;
            self.offsets_stable = matches!(
                event,
                GroupEvent::Assigned {
                    offsets_stable: true,
                    ..
                }
            );
            let Some(assignment) = self.partitions.apply(event, inputs) else {
                self.report_partitions();
                continue;
            };
            for p in &assignment.one_sided {
                tracing::error!(
                    partition = p,
                    "partition assigned for one input only: the inputs are not co-partitioned in this group"
                );
            }
            tracing::info!(read_reports = ?assignment.read_reports, conversation_events = ?assignment.conversation_events, "partitions assigned");
            self.health.joined();
            telemetry::paused(false);
            self.report_partitions();
        }
        any
    }

    /// Tells readiness probes how many partitions are owned and how many
    /// are still to be restored.
    fn report_partitions(&self) {
        self.health
            .set_partitions(self.partitions.slots.len(), self.partitions.unrestored().len());
    }

    /// Restores the owned partitions that have no state yet, all in one
    /// read of the changelogs, before any of their records is folded.
    async fn restore_assigned(&mut self) -> Result<()> {
        let partitions = self.partitions.unrestored();
        if partitions.is_empty() {
            return Ok(());
        }
        if !self.offsets_stable {
            self.wait_for_stable_offsets(&partitions);
        }
        for (partition, slot) in self.restore(&partitions).await? {
            self.partitions.slots.insert(partition, slot);
        }
        // Before readiness: whoever sees ready sees the restored backlog.
        self.report_snapshot_backlog();
        self.report_partitions();
        Ok(())
    }

    /// Waits until no transaction holds offsets of `partitions` pending
    /// (when the assignment could not, [`group`]'s `start_at_committed`): the
    /// previous owner may still be committing its last flush, and a restore
    /// must see it (read_committed reads stop at an open transaction).
    /// librdkafka asks for stable offsets under read_committed (KIP-447), so
    /// fetching the committed offsets waits for exactly that. It blocks the
    /// calling worker, but only at a rebalance, and briefly. The changelogs
    /// may settle later than the offsets: the restore waits for them too
    /// (`Restorer::wait_for_settled`).
    fn wait_for_stable_offsets(&self, partitions: &[i32]) {
        let mut tpl = TopicPartitionList::new();
        for topic in [
            &self.settings.topics.read_reports,
            &self.settings.topics.conversation_events,
        ] {
            for &p in partitions {
                tpl.add_partition(topic, p);
            }
        }
        let started = Instant::now();
        let wait = group::stable_offsets_wait(&self.settings.kafka);
        if let Err(e) = self.consumer.committed_offsets(tpl, wait) {
            tracing::warn!(error = %e, "could not fetch the committed offsets before restoring; restoring anyway");
        }
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "committed offsets stable"
        );
    }

    /// After a turn that folded records: a catch-up that caught up flushes
    /// now, a first change starts the linger, and the dirty set's bound is
    /// looked at.
    fn folded(&mut self, linger: Duration) -> Result<()> {
        if self.catching_up && self.caught_up {
            self.pacing.caught_up();
            self.flush_when_due();
        }
        if self.in_flight.is_none() && self.flush_at.is_none() {
            self.flush_at = Some(Instant::now() + linger);
        }
        self.apply_backpressure()
    }

    /// Folds the records waiting on the routed queue, up to [`FOLD_BATCH`],
    /// without waiting for more: one turn of the run loop per batch rather
    /// than per record. Group events are applied before every turn, and
    /// none arrive during one (they come with polls of the consumer's own
    /// queue), so no rebalance waits for these records.
    async fn fold_routed(&mut self, routed: &mut RoutedReader) -> Result<()> {
        for taken in 0..FOLD_BATCH {
            let deferred = match routed.next_message() {
                None => {
                    self.taken_since_flush += taken as u64;
                    self.queue_drained(routed);
                    return Ok(());
                }
                Some(Err(e)) => {
                    self.consumer_error(e)?;
                    continue;
                }
                Some(Ok(message)) => {
                    let record = Record::from(message);
                    match self.fold_record(&record) {
                        Folded::Done | Folded::NotOwned => None,
                        Folded::Unrestored | Folded::UnknownSchema(..) => Some(record.to_owned()),
                    }
                }
            };
            if let Some(record) = deferred {
                self.process(record).await?;
            }
        }
        self.taken_since_flush += FOLD_BATCH as u64;
        // A batch that ended the queue: whether that is the input's end
        // too is asked now, not at the next record, which may be long.
        if !routed.has_more() {
            self.queue_drained(routed);
        }
        Ok(())
    }

    /// Folds the records left on the consumer's own queue (fetched before
    /// their partition was routed, or not routed), up to [`FOLD_BATCH`],
    /// without waiting for more.
    async fn fold_unrouted(&mut self, consumer: &GroupConsumer, routed: &mut RoutedReader) -> Result<()> {
        for _ in 1..FOLD_BATCH {
            let deferred = match poll_once(consumer.recv()) {
                None => {
                    if !routed.has_more() {
                        self.queue_drained(routed);
                    }
                    return Ok(());
                }
                Some(Err(e)) => return self.consumer_error(e),
                Some(Ok(message)) => {
                    self.taken_since_flush += 1;
                    self.fold_or_defer(message)
                }
            };
            if let Some(record) = deferred {
                if self.apply_group_events() {
                    routed.discard();
                }
                self.restore_assigned().await?;
                self.process(record).await?;
            }
        }
        Ok(())
    }

    /// The fold found no record waiting. It has caught up with its input
    /// only if the broker held no more either: during a catch-up the fold
    /// often empties librdkafka's queue before the next fetch response
    /// lands, and taking that for caught up flushed a backlog in many
    /// small flushes, each writing most keys again (see
    /// `flush_after_commit`). So it compares its position with the inputs'
    /// last stable offsets from the consumer's statistics (every 100 ms;
    /// one that is late only makes the fold look caught up sooner, as
    /// before), or until the first statistics, the high watermarks of the
    /// last fetch responses (past a read-committed input's open
    /// transaction, the one case that makes a flush wait for nothing, at
    /// most `flush.catch_up_max_interval_ms`, once).
    /// Returns the lag it found, if it looked (not yet caught up).
    fn queue_drained(&mut self, routed: &RoutedReader) -> Option<i64> {
        if self.caught_up {
            return None;
        }
        let lag = self.input_lag(routed);
        self.caught_up = lag <= CAUGHT_UP_LAG;
        Some(lag)
    }

    /// How long the fold needs to take `lag` more offsets, at the rate it
    /// took records since the last flush began; `None` if it took none.
    fn catch_up_eta(&self, lag: i64, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.flush_started).as_secs_f64();
        if self.taken_since_flush == 0 || elapsed <= 0.0 {
            return None;
        }
        let rate = self.taken_since_flush as f64 / elapsed;
        Some(Duration::from_secs_f64(lag as f64 / rate))
    }

    /// Offsets the fold has still to take before it reaches its input
    /// partitions' stable ends, as the consumer's last statistics gave them
    /// (before the first, their last fetch responses' high watermarks).
    fn input_lag(&self, routed: &RoutedReader) -> i64 {
        let owned = self.partitions.owned_by_input();
        routed.fetch_lag(&self.consumer.context().stable_ends(owned))
    }

    /// Folds a fetched record at once, in place, unless a rebalance waits
    /// to be applied or its partition has no state yet: then it returns a
    /// copy for [`Processor::process`], after the rebalance. A record of a
    /// partition no longer assigned is dropped.
    fn fold_or_defer(&mut self, message: BorrowedMessage<'_>) -> Option<OwnedRecord> {
        telemetry::unrouted();
        let record = Record::of(&message);
        if self.events.pending() {
            return Some(record.to_owned());
        }
        match self.fold_record(&record) {
            Folded::Done | Folded::NotOwned => None,
            Folded::Unrestored | Folded::UnknownSchema(..) => Some(record.to_owned()),
        }
    }

    /// Folds a record, first restoring its partition's state or asking the
    /// registry about its schema id if needed; drops it if its partition is
    /// no longer assigned.
    async fn process(&mut self, owned: OwnedRecord) -> Result<()> {
        loop {
            match self.fold_record(&owned.as_record()) {
                Folded::Done | Folded::NotOwned => return Ok(()),
                Folded::Unrestored => {
                    for (partition, slot) in self.restore(&[owned.partition()]).await? {
                        self.partitions.slots.insert(partition, slot);
                    }
                    self.report_partitions();
                }
                Folded::UnknownSchema(kind, id) => {
                    let schemas = self.input_schemas.as_mut().expect("only checked with a registry");
                    schemas.learn(kind, id).await?;
                }
            }
        }
    }

    fn consumer_error(&self, e: KafkaError) -> Result<()> {
        tracing::warn!(error = %e, "consumer error");
        if matches!(e, KafkaError::MessageConsumptionFatal(_)) {
            return Err(Error::Consumer(e));
        }
        Ok(())
    }

    /// Folds one input record into its partition's state (or its dead
    /// letters).
    fn fold_record(&mut self, message: &Record<'_>) -> Folded {
        let topic = message.topic;
        let kind = if topic == self.settings.topics.read_reports {
            InputKind::ReadReports
        } else if topic == self.settings.topics.conversation_events {
            InputKind::ConversationEvents
        } else {
            tracing::warn!(topic, "message from an unexpected topic");
            return Folded::Done;
        };
        let partition = message.partition;
        if !self.partitions.owns(partition) {
            tracing::debug!(
                topic,
                partition,
                offset = message.offset,
                "dropping a record of a partition no longer assigned"
            );
            return Folded::NotOwned;
        }
        let Some(slot) = self.partitions.slots.get_mut(&partition) else {
            return Folded::Unrestored;
        };
        let schema = match &self.input_schemas {
            None => SchemaCheck::Accepted,
            Some(schemas) => schemas.check(kind, message.payload, self.settings.input.format),
        };
        if let SchemaCheck::Unknown(id) = schema {
            return Folded::UnknownSchema(kind, id);
        }
        self.records_in.record(kind);
        let placement = Placement {
            key: message.key,
            partition,
            partition_count: self.layout.partitions,
        };
        let ingested = match schema {
            SchemaCheck::Refused(detail) => Err(Rejection {
                reason: RejectReason::UnknownSchema,
                detail,
            }),
            _ => ingest(kind, message.payload, placement, &self.settings.input),
        };
        match ingested {
            Ok(input) => {
                slot.state.apply(&input);
            }
            Err(rejection) => {
                telemetry::dead_lettered(rejection.reason);
                tracing::debug!(topic, partition, offset = message.offset, reason = %rejection.reason, detail = %rejection.detail, "dead-lettering");
                let source = Source {
                    topic: topic.to_owned(),
                    partition,
                    offset: message.offset,
                };
                slot.dead_letters.push(dead_letter(
                    message.key,
                    message.payload,
                    &rejection,
                    &source,
                    &self.out,
                ));
            }
        }
        slot.processed(kind, message.offset);
        Folded::Done
    }

    /// Rebuilds `partitions`' state from the changelogs, on a blocking
    /// thread; a restore that fails for a reason that may pass (a broker
    /// away) is tried again with backoff.
    async fn restore(&mut self, partitions: &[i32]) -> Result<Vec<(i32, Slot)>> {
        let snapshots = self.cql.is_some();
        let found = self.read_snapshot_marks().await.map(Arc::new);
        let marks = found.clone().unwrap_or_default();
        let attempt = || {
            let restorer = Arc::clone(&self.restorer);
            let checkpoints = self.checkpoints.clone();
            let wanted = partitions.to_vec();
            let marks = Arc::clone(&marks);
            let restore =
                move || restore_blocking(&restorer, checkpoints.as_deref(), &wanted, snapshots, &marks);
            async move { Ok::<_, Error>(tokio::task::spawn_blocking(restore).await??) }
        };
        let (states, stats, load) = retrying(attempt, |e, delay| {
            tracing::warn!(?partitions, error = %e, retry_in_ms = delay.as_millis() as u64, "restore failed; retrying");
        })
        .await?;
        // Opening the checkpoints (their headers and pages' checksums) is part
        // of the restore: what a restart waits for.
        let elapsed = load + stats.elapsed;
        telemetry::restored(stats.records, elapsed);
        tracing::info!(
            ?partitions,
            records = stats.records,
            cursors = stats.cursors,
            from_checkpoint = stats.from_checkpoint,
            skipped = stats.skipped,
            checkpoint_load_ms = load.as_millis() as u64,
            settle_ms = stats.settle.as_millis() as u64,
            public_read_ms = stats.public_read.as_millis() as u64,
            member_state_read_ms = stats.member_state_read.as_millis() as u64,
            elapsed_ms = elapsed.as_millis() as u64,
            "restored partition state from the changelog"
        );
        let restored: Vec<i32> = states.keys().copied().collect();
        self.renew_snapshot_marks(&restored, found.as_deref()).await;
        Ok(states
            .into_iter()
            .map(|(p, restored)| {
                let due = match (snapshots, restored.cql_may_lack) {
                    (false, _) => SnapshotDue::Nothing,
                    (true, Some(keys)) => SnapshotDue::Keys(keys),
                    (true, None) => SnapshotDue::Everything,
                };
                (p, Slot::restored(restored.state, due))
            })
            .collect())
    }

    /// Starts a flush unless one is in flight or a recent failure asks to
    /// wait.
    fn flush_when_due(&mut self) {
        self.flush_when_ready(true);
    }

    /// [`Self::flush_when_due`], with `spaced` false for a dirty set over
    /// its bound, which must not wait for the interval: the fold holds for
    /// a flush in flight, and with none the consumer would pause.
    ///
    /// Spaced, a flush starts no sooner than `flush.min_interval_ms` after
    /// the last one that wrote anything began; until then it waits as a
    /// linger does. Every flush is a transaction: half a dozen requests to
    /// the broker, one more per partition it writes, and a marker on each.
    fn flush_when_ready(&mut self, spaced: bool) {
        self.flush_at = None;
        self.catching_up = false;
        let now = Instant::now();
        if self.in_flight.is_none()
            && !self.partitions.suspended
            && self.retry.ready(now)
            && self.cql_keeps_up()
        {
            let earliest = self
                .last_flush_launched
                .map(|began| began + self.settings.flush.min_interval());
            match earliest {
                Some(at) if spaced && at > now => self.flush_at = Some(at),
                _ => self.start_flush(),
            }
        }
    }

    /// After a flush committed, with changes waiting: the next flush starts
    /// at once, unless the fold is behind its input (since that flush began
    /// it has not once folded everything up to its partitions' ends: see
    /// `queue_drained`). Then it waits as [`CatchUpPacing`] says (from
    /// `flush.catch_up_interval_ms` after that flush began, growing with
    /// the backlog's age up to `flush.catch_up_max_interval_ms`, or that
    /// maximum at once if the fold, at its rate since that flush began,
    /// will have caught up by then), or less, once the fold catches up or
    /// the dirty set reaches its bound. Each flush is a transaction and
    /// Redis calls for every changed conversation: a catch-up flushing as soon
    /// as it could paid those every few milliseconds, and published a key
    /// it changed throughout once per flush, with nobody waiting for any
    /// but the last. Once caught up, a change waits only for
    /// `flush.linger_ms` again.
    fn flush_after_commit(&mut self, routed: &RoutedReader) {
        // The lag is read once: to see whether an empty queue is the
        // input's end, and if not, how long the fold needs to get there.
        let lag = if routed.has_more() {
            (!self.caught_up).then(|| self.input_lag(routed))
        } else {
            self.queue_drained(routed)
        };
        let (caught_up, now) = (self.caught_up, Instant::now());
        let catch_up_in = lag
            .filter(|_| !caught_up)
            .and_then(|lag| self.catch_up_eta(lag, now));
        match self
            .pacing
            .after_commit(self.flush_started, now, caught_up, catch_up_in)
        {
            None => self.flush_when_due(),
            Some(at) => {
                self.flush_at = Some(at);
                self.catching_up = true;
                telemetry::flush_waited();
            }
        }
    }

    /// Starts a snapshot when one is due, none is in flight and no recent
    /// failure asks to wait.
    fn snapshot_when_due(&mut self) {
        let now = Instant::now();
        if self.cql.is_some()
            && self.snapshot_in_flight.is_none()
            && !self.partitions.suspended
            && now >= self.next_snapshot
            && self.snapshot_retry.ready(now)
        {
            self.start_snapshot();
        }
    }

    /// After a snapshot settled: a failure is retried with backoff, and
    /// meanwhile flushes wait once the changelog is too far ahead of CQL.
    fn snapshot_settled(&mut self, outcome: Result<()>) -> Result<()> {
        match outcome {
            Ok(()) => {
                self.snapshot_retry.succeeded();
                Ok(())
            }
            Err(e) if e.is_retriable() => {
                let delay = self.snapshot_retry.failed(Instant::now());
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "snapshot failed; will retry");
                self.apply_backpressure()
            }
            Err(e) => Err(e),
        }
    }

    /// After a flush settled: resets the backoff and resumes the consumer,
    /// or schedules a retry and pauses the consumer when failures let the
    /// dirty set grow past its bound.
    async fn flush_settled(&mut self, outcome: Result<()>) -> Result<()> {
        match outcome {
            Ok(()) => {
                self.retry.succeeded();
                self.recoveries = 0;
                if self.paused {
                    self.set_paused(false)?;
                }
                Ok(())
            }
            Err(e @ (Error::FatalTransaction(_) | Error::UnsettledTransaction(_))) => {
                self.recover_producer(e).await
            }
            Err(e) if e.is_retriable() => {
                let delay = self.retry.failed(Instant::now());
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "flush failed; will retry");
                self.apply_backpressure()
            }
            Err(e) => Err(e),
        }
    }

    /// A transactional producer was fenced or broke, or a commit or abort
    /// did not settle. Either a transaction outlived
    /// `kafka.transaction_timeout_ms` (a broker restart can do that; the
    /// broker then aborts it and bumps the producer's epoch), or another
    /// process runs with this `instance_id`, or the broker stayed away
    /// through a commit's retries. Like Kafka Streams after a fenced commit,
    /// start over: drop what was folded but not committed, rejoin the group
    /// and restore from the changelogs, with new producers (whose
    /// `init_transactions` settles what the old ones left). Whatever reached Redis or CQL was max-merged, so
    /// folding the same input again changes nothing there. After
    /// [`MAX_PRODUCER_RECOVERIES`] in a row without a commit, give up: a
    /// second instance with the same `instance_id` is a configuration error.
    async fn recover_producer(&mut self, cause: Error) -> Result<()> {
        self.recoveries += 1;
        if self.recoveries > MAX_PRODUCER_RECOVERIES {
            return Err(cause);
        }
        tracing::warn!(
            error = %cause,
            attempt = self.recoveries,
            "a transactional producer was fenced or its transaction did not settle; dropping uncommitted state and starting over from the committed offsets"
        );
        self.leave_inputs();
        self.transactions = init_producer(&self.settings).await?;
        self.subscribe_inputs()
    }

    /// The checkpoints some partitions were restored from turned out
    /// damaged (a page's checksum failed when a record touched it, or when
    /// the checkpoint was checked whole beside the fold): their states may
    /// hold wrong cursors for what they could not read. Nothing of them
    /// was published (`start_flush` refuses them). Set the files aside,
    /// let what is in flight settle (it was taken before), and start over
    /// as after a fenced producer: drop every state and what was folded
    /// but not committed, rejoin the group and restore, those partitions
    /// from their changelogs.
    async fn drop_damaged_state(&mut self) -> Result<()> {
        let damaged = self.partitions.stored_faults();
        for (partition, fault) in &damaged {
            self.set_aside_damaged(*partition, fault);
        }
        let partitions: Vec<i32> = damaged.iter().map(|(p, _)| *p).collect();
        tracing::warn!(
            ?partitions,
            "dropping uncommitted state and starting over from the committed offsets"
        );
        let mut producer_broke = false;
        for (what, settled) in [
            ("flush", self.finish_flush().await),
            ("snapshot", self.finish_snapshot().await),
        ] {
            if let Err(e) = settled {
                producer_broke |= matches!(e, Error::FatalTransaction(_) | Error::UnsettledTransaction(_));
                tracing::warn!(error = %e, what, "what was in flight failed; it is folded again");
            }
        }
        self.leave_inputs();
        if producer_broke {
            self.transactions = init_producer(&self.settings).await?;
        }
        self.subscribe_inputs()
    }

    /// Sets aside the checkpoint `partition`'s state was restored from,
    /// found damaged.
    fn set_aside_damaged(&self, partition: i32, fault: &StoredFault) {
        // A state over a checkpoint came from one of these.
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.set_aside_corrupt(partition, fault);
        }
    }

    /// Leaves the group and forgets every partition's state and what was
    /// folded but not committed: the start of starting over.
    fn leave_inputs(&mut self) {
        self.consumer.unsubscribe();
        self.partitions.start_over();
        self.flush_at = None;
        self.paused = false;
        self.retry.succeeded();
    }

    /// Joins the group again, for both inputs.
    fn subscribe_inputs(&mut self) -> Result<()> {
        let topics = [
            self.settings.topics.read_reports.as_str(),
            self.settings.topics.conversation_events.as_str(),
        ];
        self.consumer.subscribe(&topics)?;
        Ok(())
    }

    /// Whether the run loop stops taking records for now: the dirty set
    /// is over its bound while a young flush is in flight, so the fold
    /// waits for that flush (whose commit starts the next, with the dirty
    /// set) rather than outrun it. librdkafka keeps what it prefetched
    /// meanwhile, and stops fetching once its queue is full; pausing instead
    /// would drop that prefetch and fetch it again after the resume. While
    /// it holds, the consumer is not polled, so a rebalance waits for the
    /// flush; past [`MAX_HOLD`] the consumer is paused and polled instead.
    fn holding(&self) -> bool {
        self.flight_is_young() && over_bound(self.partitions.dirty_len(), self.settings.flush.max_dirty)
    }

    fn flight_is_young(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|f| f.age() < MAX_HOLD)
    }

    /// Pauses the consumer when the dirty set is over its bound and no
    /// young flush is in flight to bring it down: flushes are failing,
    /// wait for CQL, or take long. The consumer keeps being polled while
    /// paused, so the instance stays in its group however long that lasts.
    fn apply_backpressure(&mut self) -> Result<()> {
        let dirty = self.partitions.dirty_len();
        if !over_bound(dirty, self.settings.flush.max_dirty) || self.paused || self.partitions.suspended {
            return Ok(());
        }
        // A flush that may start now (no failure to back off from, CQL not
        // too far behind) brings the set down without a pause.
        if self.in_flight.is_none() {
            self.flush_when_ready(false);
        }
        if !self.flight_is_young() {
            tracing::warn!(
                dirty,
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
}

/// The blocking part of a restore of `wanted`: their trusted checkpoints
/// opened, the changelogs read from there (or whole), and with `snapshots`
/// (CQL on) a state that owes CQL every key taken in whole, unless its
/// checkpoint names the CQL store with a mark that `cql_marks` lists for
/// the partition (then it owes only what the tails changed). A partition
/// whose checkpoint turns out damaged already is set aside and restored
/// again from its changelog. Returns the states, the restore's figures and
/// how long opening the checkpoints took.
fn restore_blocking(
    restorer: &Restorer,
    checkpoints: Option<&Checkpoints>,
    wanted: &[i32],
    snapshots: bool,
    cql_marks: &BTreeMap<i32, String>,
) -> readfold_kafka::Result<(BTreeMap<i32, Restored>, RestoreStats, Duration)> {
    let loading = Instant::now();
    let loaded = checkpoints
        .iter()
        .flat_map(|c| c.load(wanted, restorer, cql_marks))
        .collect();
    let load = loading.elapsed();
    let (mut states, mut stats) = restorer.restore_many_from(wanted, loaded)?;
    // A snapshot of every key needs every conversation in memory; one from
    // a checkpoint CQL held whole snapshots only what the tails changed,
    // which the tails took in.
    let mut damaged = Vec::new();
    for (&p, restored) in states.iter_mut() {
        let whole = if snapshots && restored.cql_may_lack.is_none() {
            restored.state.take_all()
        } else {
            Ok(())
        };
        if let Some(fault) = restored.state.stored_fault().or(whole.err()) {
            damaged.push((p, fault));
        }
    }
    if damaged.is_empty() {
        return Ok((states, stats, load));
    }
    for (p, fault) in &damaged {
        if let Some(checkpoints) = checkpoints {
            checkpoints.set_aside_corrupt(*p, fault);
        }
    }
    let again: Vec<i32> = damaged.iter().map(|(p, _)| *p).collect();
    let (restored, more) = restorer.restore_many_from(&again, BTreeMap::new())?;
    states.extend(restored);
    stats.records += more.records;
    stats.skipped += more.skipped;
    stats.elapsed += more.elapsed;
    stats.cursors = states.values().map(|r| r.state.cursor_count()).sum();
    stats.from_checkpoint = states
        .iter()
        .filter(|(p, _)| !again.contains(p))
        .map(|(_, r)| r.state.cursor_count())
        .sum();
    Ok((states, stats, load))
}

/// Creates the transactional producers on a blocking thread, retrying while
/// the brokers are away.
async fn init_producer(settings: &Settings) -> Result<Transactions> {
    let attempt = || {
        let kafka = settings.kafka.clone();
        async move {
            match tokio::task::spawn_blocking(move || Transactions::init(&kafka)).await {
                Ok(result) => result,
                Err(e) => Err(Error::Task(e)),
            }
        }
    };
    retrying(attempt, |e, delay| {
        tracing::warn!(sink = "kafka", error = %e, retry_in_ms = delay.as_millis() as u64, "sink unreachable at start; retrying");
    })
    .await
}

/// Runs `attempt` until it succeeds or fails for a reason retrying will not
/// cure, sleeping with backoff between tries. `failed` is told each
/// retriable failure and the wait before the next try, to log it.
pub async fn retrying<T, E, F, Fut>(mut attempt: F, failed: impl Fn(&Error, Duration)) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
    E: Into<Error>,
{
    let mut failures = 0;
    loop {
        match attempt().await.map_err(Into::into) {
            Err(e) if e.is_retriable() => {
                failures += 1;
                let delay = backoff::delay(failures);
                failed(&e, delay);
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}
