//! The processor: one member of the consumer group. It consumes both inputs,
//! folds them per partition, and publishes each flush to the stores and in
//! one Kafka transaction together with the input offsets it covers.
//!
//! This file holds the run loop: it waits on the consumer, the flush and
//! snapshot in flight, the timers and shutdown, and hands every event to
//! the pure [`readfold_core::schedule::FlushSchedule`], whose actions it
//! carries out. The rest, by concern:
//!
//! - [`group`]: the consumer and its rebalance events.
//! - [`partitions`]: the assigned partitions' state.
//! - `fold`: taking records and folding them into their partition's state.
//! - `restore`: partition state from checkpoints and the changelogs, and
//!   the checkpoints written at a clean stop.
//! - `flush`: executing the pure flush plan of `readfold_core::flush`, one
//!   flush in flight at a time while folding goes on.
//! - [`transaction`]: the two transactional producers, taking turns, on a
//!   blocking thread.
//! - `recovery`: starting over after a broken producer or a damaged
//!   checkpoint.
//! - [`health`]: what readiness probes learn of the processor.

pub mod checkpoint;
pub mod config;
pub mod error;
mod flush;
mod fold;
pub mod group;
pub mod health;
pub mod partitions;
mod record;
mod recovery;
mod restore;
mod schemas;
pub mod telemetry;
mod traces;
pub mod transaction;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use readfold_core::schedule::{Action, FlushSchedule, ScheduleConfig, Status};
use readfold_kafka::admin::Layout;
use readfold_kafka::changelog::Restorer;
use readfold_kafka::routed_queue::RoutedReader;
use readfold_kafka::standby::Standby;
use readfold_store::cql::CqlStore;
use readfold_store::redis::RedisStore;
use readfold_wire::OutputTopics;
use tokio::sync::watch;

pub use config::{FlushConfig, Settings, ShutdownConfig, SnapshotConfig, StateConfig};
pub use error::{Error, Result};
pub use recovery::retrying;

use checkpoint::Checkpoints;
use flush::InFlight;
use fold::{input_lag, CAUGHT_UP_LAG};
use group::{GroupConsumer, GroupEvent, GroupEvents};
use health::Health;
use partitions::{of_input, Partitions};
use readfold_wire::confluent::Framing;
use record::OwnedRecord;
use recovery::init_producer;
use schemas::InputSchemas;
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
    /// When to flush, snapshot, pause and resume.
    schedule: FlushSchedule,
    /// With CQL on and checkpoints kept: each restored partition's list of
    /// snapshot marks in CQL, as its restore found it (or wrote it, when
    /// there was none; see `readfold_store::cql::MarkList`). A stop names
    /// the store in a partition's checkpoint only if CQL still holds this
    /// list.
    cql_marks: BTreeMap<i32, String>,
    partitions: Partitions,
    /// A restore of added partitions running beside the loop.
    restoring: Option<restore::Restoring>,
    /// The current assignment started at stable committed offsets, so a
    /// restore need not wait for them again.
    offsets_stable: bool,
    health: Arc<Health>,
    /// With a schema registry: the ids that frame the output, and the
    /// verdicts on framed input's schema ids.
    framing: Option<Arc<Framing>>,
    input_schemas: Option<InputSchemas>,
    /// Local state checkpoints (`state.dir`), if on.
    checkpoints: Option<Arc<Checkpoints>>,
    /// Off unless `tracing.otlp_endpoint` is set.
    tracer: readfold_trace::Tracer,
    /// With `state.standby`: the changelogs of the partitions not owned.
    standby: Option<Arc<Standby>>,
    /// Traced reports waiting for their flush.
    traces: traces::PendingTraces,
}

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
        // connection up yet, looks again only 500 ms later; that wait runs
        // while the topics are checked. Once they are, the consumer
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
        let tracer = readfold_trace::Tracer::start(
            &settings.tracing,
            readfold_trace::Resource {
                service: "readfold-processor".into(),
                instance: settings.kafka.instance_id(),
            },
        )
        .map_err(Error::Tracing)?;
        let standby = match settings.state.standby {
            false => None,
            true => Some(Arc::new(Standby::start(
                &settings.kafka,
                &settings.topics,
                settings.input.max_id_bytes,
            )?)),
        };
        Ok(Processor {
            standby,
            tracer,
            traces: traces::PendingTraces::default(),
            out,
            framing,
            input_schemas,
            checkpoints,
            schedule: FlushSchedule::new(schedule_config(&settings, cql.is_some()), Instant::now()),
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
            cql_marks: BTreeMap::new(),
            partitions: Partitions::default(),
            restoring: None,
            offsets_stable: false,
            health: Arc::new(Health::default()),
            settings,
        })
    }

    /// The processor's health, for readiness probes; it stays current
    /// while the processor runs.
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// The processor's tracer: flush it before the process exits.
    pub fn tracer(&self) -> readfold_trace::Tracer {
        self.tracer.clone()
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
            Restored(Result<restore::RestoreRead>),
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
            Restored(Result<restore::RestoreRead>),
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
            let flush_at = self.schedule.flush_at();
            if flush_at != linger_armed {
                if let Some(at) = flush_at {
                    linger_sleep.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                linger_armed = flush_at;
            }
            let lingering = flush_at.is_some();
            let taking = !self.schedule.holding(&self.status());
            if !taking && !held {
                telemetry::fold_held();
            }
            held = !taking;
            let (in_flight, snapshot_in_flight, restoring) = (
                &mut self.in_flight,
                &mut self.snapshot_in_flight,
                &mut self.restoring,
            );
            let woke = tokio::select! {
                _ = shutdown.changed() => Woke::Shutdown,
                outcome = async { in_flight.as_mut().expect("guarded").done().await }, if in_flight.is_some() => Woke::Flushed(outcome),
                outcome = async { snapshot_in_flight.as_mut().expect("guarded").done().await }, if snapshot_in_flight.is_some() => Woke::Snapshotted(outcome),
                outcome = async { (&mut restoring.as_mut().expect("guarded").task).await }, if restoring.is_some() => {
                    Woke::Restored(outcome.map_err(Error::from).and_then(|read| read))
                }
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
                Woke::Restored(outcome) => Step::Restored(outcome),
                Woke::Fetched(Ok(message)) => Step::Fetched(self.fold_or_defer(message)),
                Woke::Fetched(Err(e)) => Step::FetchFailed(e),
                Woke::Routed => Step::Routed,
            };
            // Rebalance callbacks ran inside recv(); apply them before
            // touching any partition's state.
            self.apply_group_events(&mut routed);
            self.restore_assigned().await?;
            match step {
                Step::Shutdown => break,
                Step::Rebalanced => {}
                Step::Flushed(outcome) => {
                    let flight = self.in_flight.take().expect("a flush was in flight");
                    let rebalanced = flight.began_before(&self.partitions);
                    let outcome = self.settle(flight, outcome);
                    self.flush_settled(outcome, rebalanced, &routed).await?;
                }
                Step::Restored(outcome) => self.restored_beside(outcome).await?,
                Step::Snapshotted(outcome) => {
                    let flight = self.snapshot_in_flight.take().expect("a snapshot was in flight");
                    let outcome = self.settle(flight, outcome);
                    self.snapshot_settled(outcome)?;
                }
                Step::Linger => {
                    let actions = self.schedule.flush_time(self.status());
                    self.act(actions)?;
                }
                Step::Tick => {
                    telemetry::dirty_keys(self.partitions.dirty_len());
                    telemetry::cursors_held(self.partitions.cursor_count());
                    let actions = self.schedule.tick(self.status());
                    self.act(actions)?;
                }
                Step::Fetched(deferred) => {
                    if let Some(record) = deferred {
                        self.process(record).await?;
                    }
                    self.fold_unrouted(&consumer, &mut routed).await?;
                    let actions = self.schedule.folded(self.status());
                    self.act(actions)?;
                }
                Step::Routed => {
                    self.fold_routed(&mut routed).await?;
                    let actions = self.schedule.folded(self.status());
                    self.act(actions)?;
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
        self.apply_group_events(&mut routed);
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

    /// Applies the group events queued since the last call, and drops
    /// what `routed` took off its queue that they made stale.
    fn apply_group_events(&mut self, routed: &mut RoutedReader) {
        let events = self.events.take();
        if events.is_empty() {
            return;
        }
        let topics = self.settings.topics.clone();
        let inputs = [topics.read_reports.as_str(), topics.conversation_events.as_str()];
        let revoked = matches!(events.last(), Some(GroupEvent::Revoked { .. }));
        for event in events {
            match &event {
                GroupEvent::Revoked { .. } | GroupEvent::Assigned { .. } => {
                    // Paused partitions are resumed by the next assignment
                    // anyway, and every partition is fetched again from
                    // its committed offset.
                    self.schedule.group_changed();
                    routed.discard();
                    self.released_while_restoring(None);
                }
                GroupEvent::Released { partitions, lost } => {
                    routed.discard_released(partitions);
                    let numbers: Vec<i32> = partitions.iter().map(|(_, p)| *p).collect();
                    self.released_while_restoring(Some(&numbers));
                    let [reports, events] = inputs.map(|topic| of_input(partitions, topic));
                    tracing::info!(read_reports = ?reports, conversation_events = ?events, lost, "partitions released");
                }
                GroupEvent::Added { .. } => {}
            }
            match &event {
                GroupEvent::Assigned { offsets_stable, .. } => self.offsets_stable = *offsets_stable,
                // Partitions added earlier may wait for their restore yet.
                GroupEvent::Added { offsets_stable, .. } => {
                    self.offsets_stable = *offsets_stable && self.partitions.unrestored().is_empty();
                }
                GroupEvent::Revoked { .. } => self.offsets_stable = false,
                GroupEvent::Released { .. } => {}
            }
            let added = matches!(event, GroupEvent::Added { .. });
            // The consumer protocol's assign after a revoke may add nothing.
            if matches!(&event, GroupEvent::Added { partitions, .. } if partitions.is_empty()) {
                continue;
            }
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
            if added && self.schedule.is_paused() {
                // Added partitions fetch at once; the dirty bound holds
                // them back too.
                if let Err(e) = self.set_paused(true) {
                    tracing::warn!(error = %e, "could not pause the added partitions");
                }
            } else if !added {
                telemetry::paused(false);
            }
            self.report_partitions();
        }
        if !revoked {
            self.follow_unowned();
        }
    }

    /// Has the standby follow every partition this instance does not own,
    /// and forget those it owns and holds the state of; those owned but not
    /// restored yet it follows until their restore takes them. Only once
    /// the group gave this instance an assignment: not before its first,
    /// nor between a classic revoke and the assignment after it.
    fn follow_unowned(&self) {
        let Some(standby) = &self.standby else { return };
        if !self.health.has_joined() {
            return;
        }
        let owns = |p: &i32| self.partitions.owns(*p);
        let restored = self.partitions.slots.keys().copied().filter(owns).collect();
        standby.forget(restored);
        standby.follow((0..self.layout.partitions).filter(|p| !owns(p)).collect());
    }

    /// Tells readiness probes how many partitions are owned and how many
    /// are still to be restored.
    fn report_partitions(&self) {
        self.health
            .set_partitions(self.partitions.slots.len(), self.partitions.unrestored().len());
    }

    /// What the schedule sees of the processor now.
    fn status(&self) -> Status {
        Status {
            now: Instant::now(),
            dirty: self.partitions.dirty_len(),
            // A state over a damaged checkpoint may hold wrong cursors:
            // none goes out, and the run loop starts over.
            pending: self.has_pending() && !self.partitions.any_stored_fault(),
            suspended: self.partitions.suspended,
            flushing_since: self.in_flight.as_ref().map(InFlight::started),
            snapshotting: self.snapshot_in_flight.is_some(),
        }
    }

    /// Carries out the schedule's actions, in order.
    fn act(&mut self, actions: Vec<Action>) -> Result<()> {
        for action in actions {
            match action {
                Action::StartFlush => self.start_flush(),
                Action::StartSnapshot => self.start_snapshot(),
                Action::Pause => {
                    let dirty = self.partitions.dirty_len();
                    tracing::warn!(
                        dirty,
                        "dirty set over its bound: pausing the consumer until a flush succeeds"
                    );
                    self.set_paused(true)?;
                }
                Action::Resume => self.set_paused(false)?,
                Action::PaceCatchUp(_) => telemetry::flush_waited(),
            }
        }
        Ok(())
    }

    /// After a snapshot settled: a failure is retried with backoff, and
    /// meanwhile flushes wait once the changelog is too far ahead of CQL.
    fn snapshot_settled(&mut self, outcome: Result<()>) -> Result<()> {
        let actions = match outcome {
            Ok(()) => self.schedule.snapshot_succeeded(self.status()),
            Err(e) if e.is_retriable() => {
                let (delay, actions) = self.schedule.snapshot_failed(self.status());
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "snapshot failed; will retry");
                actions
            }
            Err(e) => return Err(e),
        };
        self.act(actions)
    }

    /// After a flush settled: what arrived meanwhile goes out now (behind
    /// a backlog, a little later), a failure is retried with backoff (at
    /// once if the group changed since the flush began), and a broken
    /// producer is replaced.
    async fn flush_settled(
        &mut self,
        outcome: Result<()>,
        rebalanced: bool,
        routed: &RoutedReader,
    ) -> Result<()> {
        let status = self.status();
        let queued = routed.has_more();
        let (partitions, consumer) = (&self.partitions, &self.consumer);
        let lag = || input_lag(partitions, consumer, routed);
        let actions = match outcome {
            Ok(()) => self.schedule.flush_committed(status, queued, lag),
            Err(e @ (Error::FatalTransaction(_) | Error::UnsettledTransaction(_))) => {
                return self.recover_producer(e).await
            }
            Err(e) if e.is_retriable() && (rebalanced || e.is_stale_group_member()) => {
                tracing::info!(error = %e, "flush failed after a rebalance; retrying at once");
                self.schedule.flush_failed_over_rebalance(status, queued, lag)
            }
            Err(e) if e.is_retriable() => {
                let (delay, actions) = self.schedule.flush_failed(status, queued, lag);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "flush failed; will retry");
                actions
            }
            Err(e) => return Err(e),
        };
        self.act(actions)
    }

    fn set_paused(&mut self, on: bool) -> Result<()> {
        let assignment = self.consumer.assignment()?;
        if on {
            self.consumer.pause(&assignment)?;
        } else {
            self.consumer.resume(&assignment)?;
        }
        telemetry::paused(on);
        Ok(())
    }
}

/// The flush schedule's settings; snapshots only with CQL on.
fn schedule_config(settings: &Settings, cql: bool) -> ScheduleConfig {
    let flush = &settings.flush;
    ScheduleConfig {
        linger: flush.linger(),
        min_interval: flush.min_interval(),
        catch_up_interval: flush.catch_up_interval(),
        catch_up_max_interval: flush.catch_up_max_interval(),
        max_dirty: flush.max_dirty,
        snapshot_interval: cql.then(|| Duration::from_millis(settings.snapshot.interval_ms)),
        caught_up_lag: CAUGHT_UP_LAG,
    }
}
