//! Flush execution: carries out the pure [`readfold_core::flush`] plan.
//! The stores first (idempotent max-merges, so writing them again on retry
//! changes nothing), then one Kafka transaction; if anything fails, nothing
//! is committed and the same plan, with newer values, runs again later.

use std::time::Instant;

use rdkafka::{Offset, TopicPartitionList};
use readfold_core::flush::{
    self, group_by_conversation, group_by_user, ConversationBatch, FlushPlan, UserBatch,
};
use readfold_core::fold::InputKind;
use readfold_store::CursorStore;
use readfold_wire::changelog::changelog_records;
use readfold_wire::OutRecord;

use crate::error::Result;
use crate::{telemetry, Processor};

impl Processor {
    /// Publishes every partition's pending changes, dead letters and input
    /// offsets; on snapshot ticks, also to CQL.
    pub(crate) async fn flush(&mut self) -> Result<()> {
        let snapshot_due = self.cql.is_some() && Instant::now() >= self.next_snapshot;
        let plan = flush::plan(&self.partitions.slots, snapshot_due);
        telemetry::dirty_keys(self.partitions.dirty_len());
        telemetry::cursors_held(self.partitions.cursor_count());
        if plan.is_empty() {
            if snapshot_due {
                self.next_snapshot = Instant::now() + self.snapshot_interval;
            }
            return Ok(());
        }
        let started = Instant::now();
        if let Err(e) = self.execute(&plan).await {
            telemetry::flush_failed(started.elapsed());
            return Err(e);
        }
        flush::committed(&mut self.partitions.slots, &plan, self.cql.is_some());
        if snapshot_due {
            self.next_snapshot = Instant::now() + self.snapshot_interval;
        }
        telemetry::flush_committed(started.elapsed(), plan.changes.len(), plan.dead_letters.len());
        telemetry::dirty_keys(self.partitions.dirty_len());
        tracing::debug!(
            changes = plan.changes.len(),
            dead_letters = plan.dead_letters.len(),
            snapshot = snapshot_due,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "flush committed"
        );
        Ok(())
    }

    async fn execute(&self, plan: &FlushPlan<OutRecord>) -> Result<()> {
        if let Some(redis) = &self.redis {
            let changes = || plan.changes.iter().map(|(_, c)| c);
            timed_write(
                redis,
                &group_by_conversation(changes()),
                &group_by_user(changes()),
            )
            .await?;
        }
        if let (Some(_), Some(cql)) = (&plan.snapshot, &self.cql) {
            let changes = || plan.snapshot_changes();
            timed_write(cql, &group_by_conversation(changes()), &group_by_user(changes())).await?;
        }
        // A snapshot-only flush has nothing for Kafka: no transaction.
        if !plan.needs_transaction() {
            return Ok(());
        }
        let mut records = Vec::with_capacity(plan.changes.len() * 2 + plan.dead_letters.len());
        for (partition, change) in &plan.changes {
            records.extend(changelog_records(change, *partition, &self.out));
        }
        records.extend(plan.dead_letters.iter().cloned());
        let mut offsets = TopicPartitionList::new();
        for &(kind, partition, offset) in &plan.offsets {
            let topic = match kind {
                InputKind::ReadReports => &self.settings.topics.read_reports,
                InputKind::ConversationEvents => &self.settings.topics.conversation_events,
            };
            offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        }
        let group = rdkafka::consumer::Consumer::group_metadata(&self.consumer);
        self.transactions.commit(records, offsets, group).await
    }
}

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
            telemetry::sink_written(S::NAME, started.elapsed(), batches.len() + private.len(), written);
            Ok(())
        }
        Err(e) => {
            telemetry::sink_failed(S::NAME);
            Err(e.into())
        }
    }
}
