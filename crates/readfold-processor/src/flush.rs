//! Flush execution: carries out the pure [`readfold_core::flush`] plan.
//! The stores (idempotent max-merges, so writing them again on retry
//! changes nothing) and one Kafka transaction, written side by side; the
//! transaction commits only once the stores took the plan. If anything
//! fails, nothing is committed and the plan's keys wait for the next flush,
//! with newer values.
//!
//! One flush is in flight at a time, on a task of its own, while the run
//! loop goes on folding: what arrives meanwhile goes into the next flush,
//! which starts as soon as this one settles, or, while the fold is behind
//! a backlog, a while after this one began: `flush.catch_up_interval_ms`,
//! growing with the backlog's age up to `flush.catch_up_max_interval_ms`
//! (see `readfold_core::schedule` and `readfold_core::pacing`), and
//! in either case no sooner than `flush.min_interval_ms` (0 by default)
//! after the last flush that wrote anything began. So flushes follow the
//! load: under a light one a change is published within
//! `flush.linger_ms` plus one flush; under a heavy one each flush carries
//! what arrived during the last.
//!
//! CQL snapshots run in a lane of their own, next to the flushes, so that a
//! snapshot of many keys never holds back the changelog and Redis. The
//! changelog may run ahead of CQL by at most twice `snapshot.interval_ms`:
//! past that (a snapshot failing or stuck), flushes wait for one to succeed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::{Offset, TopicPartitionList};
use readfold_core::flush::{
    self, group_by_conversation, group_by_user, ConversationBatch, FlushPlan, UserBatch,
};
use readfold_core::fold::InputKind;
use readfold_kafka::TopicsConfig;
use readfold_store::cql::CqlStore;
use readfold_store::redis::RedisStore;
use readfold_store::CursorStore;
use readfold_wire::changelog::EncodedRecords;
use readfold_wire::confluent::Framing;
use readfold_wire::{OutRecord, OutputTopics};
use tokio::task::JoinHandle;

use crate::error::Result;
use crate::traces::FlushTraces;
use crate::transaction::{RecordChunk, Transactions};
use crate::{telemetry, Processor};

/// A flush on its way to the stores and the broker.
pub(crate) struct InFlight {
    task: JoinHandle<Result<()>>,
    plan: Arc<FlushPlan<OutRecord>>,
    /// The assignment generation it began in.
    generation: u64,
    /// The traced reports it publishes.
    traces: FlushTraces,
    /// `Partitions::changes` when it began.
    group_changes: u64,
    started: Instant,
}

impl InFlight {
    /// Whether the group changed (any rebalance, whole or incremental)
    /// since it began.
    pub(crate) fn began_before(&self, partitions: &crate::partitions::Partitions) -> bool {
        self.group_changes != partitions.changes
    }

    /// When it began.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Waits for the flush's writes and transaction.
    pub(crate) async fn done(&mut self) -> Result<()> {
        (&mut self.task).await?
    }
}

/// What a flush task needs, cloned from the processor.
struct Writer {
    stores: Stores,
    transactions: Transactions,
    out: Arc<OutputTopics>,
    topics: TopicsConfig,
    framing: Option<Arc<Framing>>,
    /// The `traceparent` of the plan's changes that traced reports moved,
    /// by index.
    traceparents: Arc<HashMap<usize, String>>,
}

/// Keys one snapshot writes, at most, of the current pass over published
/// keys, and as many again of restored ones (of partitions restored from
/// the changelog, which CQL may lack): a few seconds of a CQL server's
/// writes. A catch-up that published millions of keys, or a restore of
/// millions, then goes out as a run of snapshots back to back, each with a
/// bounded plan in memory; and a restore's never holds flushes back
/// (`snapshot.interval_ms`).
const KEYS_PER_SNAPSHOT: usize = 100_000;

impl Processor {
    /// Whether any partition has something for the next flush.
    pub(crate) fn has_pending(&self) -> bool {
        self.partitions.slots.values().any(|s| s.has_work())
    }

    /// Starts a flush of every partition's pending changes, dead letters
    /// and input offsets. Call only with no flush in flight.
    pub(crate) fn start_flush(&mut self) {
        debug_assert!(self.in_flight.is_none(), "one flush at a time");
        // A state over a damaged checkpoint may hold wrong cursors: none
        // goes out, and the run loop starts over (`drop_damaged_state`).
        if self.partitions.any_stored_fault() {
            return;
        }
        telemetry::dirty_keys(self.partitions.dirty_len());
        telemetry::cursors_held(self.partitions.cursor_count());
        telemetry::threads_held(self.partitions.thread_counts());
        if let Some(standby) = &self.standby {
            telemetry::standby(standby.stats());
        }
        let plan = flush::begin(&mut self.partitions.slots);
        if !plan.is_empty() {
            let slots = &self.partitions.slots;
            let traces = self.traces.take_for(&plan, |p| slots.contains_key(&p));
            self.in_flight = Some(self.launch(plan, traces));
        }
    }

    /// Starts a snapshot: the next share of the current pass over the keys
    /// published (a new pass over those published since the last when none
    /// is under way), and a share of the restored keys still owed. Call
    /// only with CQL on and no snapshot in flight.
    pub(crate) fn start_snapshot(&mut self) {
        debug_assert!(self.snapshot_in_flight.is_none(), "one snapshot at a time");
        if self.partitions.any_stored_fault() {
            return;
        }
        let plan = flush::begin_snapshot(&mut self.partitions.slots, KEYS_PER_SNAPSHOT, KEYS_PER_SNAPSHOT);
        self.schedule.snapshot_began(Instant::now(), plan.opens_pass);
        if plan.is_empty() {
            self.snapshot_done();
        } else {
            self.snapshot_in_flight = Some(self.launch(plan, FlushTraces::default()));
        }
    }

    /// A snapshot was written: the schedule learns whether its pass is
    /// done and restored keys are still owed.
    fn snapshot_done(&mut self) {
        let pass_done = flush::pass_done(&self.partitions.slots);
        let owed = self.partitions.slots.values().any(|s| s.resnapshot.is_some());
        self.schedule.snapshot_written(Instant::now(), pass_done, owed);
    }

    fn launch(&self, plan: FlushPlan<OutRecord>, mut traces: FlushTraces) -> InFlight {
        let writer = Writer {
            stores: Stores {
                redis: self.redis.clone(),
                cql: self.cql.clone(),
            },
            transactions: self.transactions.clone(),
            out: Arc::clone(&self.out),
            topics: self.settings.topics.clone(),
            framing: self.framing.clone(),
            traceparents: Arc::new(std::mem::take(&mut traces.headers)),
        };
        let group = rdkafka::consumer::Consumer::group_metadata(&*self.consumer);
        let plan = Arc::new(plan);
        InFlight {
            task: tokio::spawn(writer.write(Arc::clone(&plan), group)),
            plan,
            generation: self.partitions.generation,
            traces,
            group_changes: self.partitions.changes,
            started: Instant::now(),
        }
    }

    /// Settles the flush that was in flight with its outcome: on success
    /// its keys are done (and remembered for the next snapshot); on failure
    /// they are dirty again.
    pub(crate) fn settle(&mut self, mut flight: InFlight, outcome: Result<()>) -> Result<()> {
        let traces = std::mem::take(&mut flight.traces);
        let elapsed = flight.started.elapsed();
        let plan = &flight.plan;
        if let (Some(_), Some(cql)) = (&plan.snapshot, &self.cql) {
            telemetry::cql_warnings(cql.server_warnings());
        }
        let settled = match outcome {
            Ok(()) if plan.snapshot.is_some() => {
                let keys = plan.snapshot_changes().count() + plan.thread_snapshot.len();
                telemetry::snapshot_written(elapsed, keys);
                tracing::debug!(keys, elapsed_ms = elapsed.as_millis() as u64, "snapshot written");
                self.snapshot_done();
                Ok(())
            }
            Ok(()) => {
                self.health.flush_outcome(true);
                flush::committed(&mut self.partitions.slots, plan, self.cql.is_some());
                traces.committed(
                    &self.tracer,
                    &self.settings.topics.read_reports,
                    plan.changes.len(),
                );
                telemetry::flush_committed(elapsed, plan.changes.len(), plan.dead_letters.len());
                telemetry::dirty_keys(self.partitions.dirty_len());
                tracing::debug!(
                    changes = plan.changes.len(),
                    dead_letters = plan.dead_letters.len(),
                    elapsed_ms = elapsed.as_millis() as u64,
                    "flush committed"
                );
                Ok(())
            }
            Err(e) => {
                if plan.snapshot.is_some() {
                    telemetry::snapshot_failed(elapsed);
                } else {
                    self.health.flush_outcome(false);
                    telemetry::flush_failed(elapsed);
                }
                let same_assignment = flight.generation == self.partitions.generation;
                flush::failed(&mut self.partitions.slots, plan, same_assignment);
                let slots = &self.partitions.slots;
                self.traces.failed(traces, |p| slots.contains_key(&p));
                Err(e)
            }
        };
        self.report_snapshot_backlog();
        settled
    }

    /// Published keys the snapshots still owe, over all partitions.
    pub(crate) fn published_owed(&self) -> usize {
        self.partitions.slots.values().map(|s| s.owes_published()).sum()
    }

    /// Publishes how many keys the next snapshots write (those of the one
    /// in flight included).
    pub(crate) fn report_snapshot_backlog(&self) {
        if self.cql.is_none() {
            return;
        }
        let waiting: usize = self.partitions.slots.values().map(|s| s.snapshot_backlog()).sum();
        let writing = self.snapshot_in_flight.as_ref().map_or(0, |flight| {
            flight.plan.snapshot_changes().count() + flight.plan.thread_snapshot.len()
        });
        telemetry::snapshot_backlog(waiting + writing);
    }

    /// Waits for the flush in flight, if any, and settles it.
    pub(crate) async fn finish_flush(&mut self) -> Result<()> {
        let Some(mut flight) = self.in_flight.take() else {
            return Ok(());
        };
        let outcome = flight.done().await;
        self.settle(flight, outcome)
    }

    /// Waits for the snapshot in flight, if any, and settles it.
    pub(crate) async fn finish_snapshot(&mut self) -> Result<()> {
        let Some(mut flight) = self.snapshot_in_flight.take() else {
            return Ok(());
        };
        let outcome = flight.done().await;
        self.settle(flight, outcome)
    }

    /// Flushes everything pending, then snapshots everything published not
    /// yet in CQL, and waits for both: for shutdown.
    pub(crate) async fn flush_now(&mut self) -> Result<()> {
        self.finish_flush().await?;
        self.start_flush();
        self.finish_flush().await?;
        if self.cql.is_some() {
            self.finish_snapshot().await?;
            // Share after share, until every published key is in CQL (a
            // share of restored keys rides along with each; what is left of
            // those stays owed, and the checkpoint says so).
            loop {
                self.start_snapshot();
                // None launched: nothing left, or a damaged state that
                // must not be written (the stop drops it first).
                if self.snapshot_in_flight.is_none() {
                    break;
                }
                self.finish_snapshot().await?;
                if self.published_owed() == 0 {
                    break;
                }
            }
        }
        Ok(())
    }
}

impl Writer {
    /// Writes the stores and, next to them, the transaction, which commits
    /// only once the stores took the plan.
    async fn write(
        self,
        plan: Arc<FlushPlan<OutRecord>>,
        group: Option<ConsumerGroupMetadata>,
    ) -> Result<()> {
        // A snapshot-only flush has nothing for Kafka: no transaction.
        if !plan.needs_transaction() {
            return self.stores.write(&plan).await;
        }
        let started = Instant::now();
        let offsets = self.transaction_offsets(&plan)?;
        // The stores go first, on a task of their own: a catch-up's last
        // flush waits for Redis's merges, not for its transaction, and
        // polled beside the encoding in this task they would start only
        // once the first chunks were encoded, and then build their batches
        // while the encoding waits.
        let stores = tokio::spawn({
            let (stores, plan) = (self.stores.clone(), Arc::clone(&plan));
            async move { (stores.write(&plan).await, started.elapsed()) }
        });
        let (chunks, records) = tokio::sync::mpsc::channel(ENCODED_CHUNKS_AHEAD);
        let (written, gate) = std::sync::mpsc::sync_channel(1);
        let committed = self.transactions.commit(records, offsets, group, gate);
        // The gate opens here, once the encoding ran to its end and the
        // stores took the plan: the transaction reads the records' channel
        // closing as "all sent", so an encoding cut short (a panic) must
        // leave it closed, dropping `written`, and the transaction aborts.
        let finished = async {
            let encode = async {
                self.encode_records(&plan, chunks).await;
                started.elapsed()
            };
            let (encoded, stores) = tokio::join!(encode, stores);
            let (stores, stores_done) = stores?;
            // The buffer of one never blocks; a transaction that already
            // gave up has dropped the receiver, which is fine too.
            let _ = written.send(stores.is_ok());
            Ok::<_, crate::Error>((encoded, stores, stores_done))
        };
        let (committed, finished) = tokio::join!(committed, finished);
        let (encoded, stores, stores_done) = finished?;
        tracing::debug!(
            encoded_ms = encoded.as_millis() as u64,
            stores_ms = stores_done.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "flush phases (encoding, stores and transaction overlap; ms since the flush began)"
        );
        // The stores' own error says more than the aborted transaction's.
        stores?;
        committed
    }

    /// Encodes the changelog records and dead letters of a flush, a chunk
    /// at a time, for the transaction; stops early if it gave up.
    async fn encode_records(
        &self,
        plan: &FlushPlan<OutRecord>,
        chunks: tokio::sync::mpsc::Sender<RecordChunk>,
    ) {
        let frames = self
            .framing
            .as_ref()
            .map(|f| f.changelog_frames(&self.out))
            .unwrap_or_default();
        for (chunk, part) in plan.changes.chunks(ENCODE_CHUNK).enumerate() {
            let mut records = EncodedRecords::with_capacity(part.len());
            for (i, (partition, change)) in part.iter().enumerate() {
                let traced = match self.traceparents.is_empty() {
                    true => None,
                    false => self.traceparents.get(&(chunk * ENCODE_CHUNK + i)),
                };
                match traced {
                    None => records.push_change(change, *partition, &self.out.layout, &frames),
                    Some(traceparent) => {
                        records.push_traced_change(change, *partition, &self.out.layout, &frames, traceparent)
                    }
                }
            }
            if chunks
                .send(RecordChunk::Changelog(records, Arc::clone(&self.out)))
                .await
                .is_err()
            {
                return;
            }
        }
        for part in plan.thread_changes.chunks(ENCODE_CHUNK) {
            let mut records = EncodedRecords::with_capacity(part.len());
            for (partition, change) in part {
                records.push_thread_change(change, *partition, &self.out.layout, &frames);
            }
            if chunks
                .send(RecordChunk::Changelog(records, Arc::clone(&self.out)))
                .await
                .is_err()
            {
                return;
            }
        }
        if !plan.thread_states.is_empty() {
            let mut records = EncodedRecords::with_capacity(plan.thread_states.len());
            for (partition, state) in &plan.thread_states {
                records.push_thread_state(state, *partition, &frames);
            }
            if chunks
                .send(RecordChunk::Changelog(records, Arc::clone(&self.out)))
                .await
                .is_err()
            {
                return;
            }
        }
        let mut dead_letters: Vec<OutRecord> = plan.dead_letters.iter().map(|(_, d)| d.clone()).collect();
        if let Some(framing) = &self.framing {
            dead_letters = dead_letters.into_iter().map(|r| framing.frame(r)).collect();
        }
        let _ = chunks.send(RecordChunk::Last(dead_letters)).await;
    }

    /// The input offsets a flush commits.
    fn transaction_offsets(&self, plan: &FlushPlan<OutRecord>) -> Result<TopicPartitionList> {
        let mut offsets = TopicPartitionList::new();
        for &(kind, partition, offset) in &plan.offsets {
            let topic = match kind {
                InputKind::ReadReports => &self.topics.read_reports,
                InputKind::ConversationEvents => &self.topics.conversation_events,
            };
            offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        }
        Ok(offsets)
    }
}

/// The stores a flush writes.
#[derive(Clone)]
struct Stores {
    redis: Option<Arc<RedisStore>>,
    cql: Option<Arc<CqlStore>>,
}

impl Stores {
    /// Redis for a flush's changes, CQL for a snapshot's rows.
    async fn write(&self, plan: &FlushPlan<OutRecord>) -> Result<()> {
        if let (false, Some(redis)) = (plan.changes.is_empty(), &self.redis) {
            let changes = || plan.changes.iter().map(|(_, c)| c);
            timed_write(
                redis.as_ref(),
                &group_by_conversation(changes()),
                &group_by_user(changes()),
            )
            .await?;
        }
        if let (false, Some(redis)) = (plan.thread_changes.is_empty(), &self.redis) {
            redis
                .merge_threads(plan.thread_changes.iter().map(|(_, c)| c))
                .await?;
        }
        if let (Some(_), Some(cql)) = (&plan.snapshot, &self.cql) {
            let changes = || plan.snapshot_changes();
            timed_write(
                cql.as_ref(),
                &group_by_conversation(changes()),
                &group_by_user(changes()),
            )
            .await?;
            if !plan.thread_snapshot.is_empty() {
                cql.merge_threads(&plan.thread_snapshot).await.inspect_err(|_| {
                    telemetry::sink_failed("cql");
                })?;
            }
        }
        Ok(())
    }
}

/// Changes encoded per chunk, and chunks encoded ahead of the producer.
const ENCODE_CHUNK: usize = 2048;
const ENCODED_CHUNKS_AHEAD: usize = 4;

/// One store's write of a flush's batches, public then private, with
/// telemetry.
async fn timed_write<S: CursorStore>(
    store: &S,
    batches: &[ConversationBatch],
    private: &[UserBatch],
) -> Result<()> {
    let started = Instant::now();
    let written = async {
        let public = store.write(batches).await?;
        Ok::<_, readfold_store::Error>(public + store.write_private(private).await?)
    };
    match written.await {
        Ok(written) => {
            telemetry::sink_written(S::NAME, started.elapsed(), store.calls(batches, private), written);
            Ok(())
        }
        Err(e) => {
            telemetry::sink_failed(S::NAME);
            Err(e.into())
        }
    }
}
