//! Restores and checkpoints: an owned partition's state rebuilt from its
//! checkpoint and the changelogs before any of its records is folded, the
//! checkpoints written at a clean stop, and the CQL snapshot marks that
//! tell a checkpoint whether CQL still holds what it names.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::TopicPartitionList;
use readfold_core::flush::SnapshotDue;
use readfold_kafka::changelog::{RestoreStats, Restored, Restorer};
use readfold_kafka::standby::Standby;

use crate::checkpoint::{self, Checkpoints};
use crate::partitions::Slot;
use crate::record::OwnedRecord;
use crate::recovery::retrying;
use crate::{group, telemetry, Error, Processor, Result};

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
    standby: Option<&Standby>,
    wanted: &[i32],
    snapshots: bool,
    cql_marks: &BTreeMap<i32, String>,
) -> readfold_kafka::Result<(BTreeMap<i32, Restored>, RestoreStats, Duration)> {
    let loading = Instant::now();
    // A standby's state is live, a checkpoint's as of the last stop: the
    // standby's wins where both exist.
    let followed = standby.map(|s| s.take(wanted)).unwrap_or_default();
    let from_standby: usize = followed.values().map(|c| c.state.cursor_count()).sum();
    let unfollowed: Vec<i32> = wanted
        .iter()
        .copied()
        .filter(|p| !followed.contains_key(p))
        .collect();
    let mut loaded: BTreeMap<_, _> = checkpoints
        .iter()
        .flat_map(|c| c.load(&unfollowed, restorer, cql_marks))
        .collect();
    loaded.extend(followed);
    let load = loading.elapsed();
    let (mut states, mut stats) = restorer.restore_many_from(wanted, loaded)?;
    stats.from_standby = from_standby;
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

impl Processor {
    /// At a clean stop, with everything flushed: a checkpoint of every
    /// owned partition. A failure only costs the next start a full restore.
    pub(crate) async fn write_checkpoints(&self) {
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

    /// Restores the owned partitions that have no state yet, all in one
    /// read of the changelogs, before any of their records is folded. With
    /// no partition holding state (a start, or a whole assignment after a
    /// revoke) it waits here: nothing else could be folded meanwhile.
    /// Beside partitions that hold state (the consumer protocol adding
    /// some) the read runs as a task of its own and the others go on
    /// folding; the partitions restored are paused until their state is in
    /// ([`Processor::restored_beside`]). A previous owner that died with a
    /// transaction open holds the read until the broker aborts it.
    pub(crate) async fn restore_assigned(&mut self) -> Result<()> {
        if self.restoring.is_some() {
            return Ok(());
        }
        let partitions = self.partitions.unrestored();
        if partitions.is_empty() {
            return Ok(());
        }
        if !self.partitions.slots.is_empty() {
            self.pause_partitions(&partitions, true);
            let read = self.restore_read(partitions.clone(), !self.offsets_stable);
            self.restoring = Some(Restoring {
                task: tokio::spawn(read),
                partitions,
                released: BTreeSet::new(),
                stash: Vec::new(),
            });
            return Ok(());
        }
        let read = self.restore_read(partitions, !self.offsets_stable).await?;
        for (partition, slot) in self.restore_settle(read).await {
            self.partitions.slots.insert(partition, slot);
        }
        // Before readiness: whoever sees ready sees the restored backlog.
        self.report_snapshot_backlog();
        self.report_partitions();
        Ok(())
    }

    /// The restore beside the loop ended: the partitions still owned (and
    /// not released meanwhile) take their state and resume, and the records
    /// of them fetched before the pause are folded.
    pub(crate) async fn restored_beside(&mut self, outcome: Result<RestoreRead>) -> Result<()> {
        let restoring = self.restoring.take().expect("a restore was beside the loop");
        let slots = self.restore_settle(outcome?).await;
        let mut resumed = Vec::new();
        for (partition, slot) in slots {
            let held = self.partitions.owns(partition) && !restoring.released.contains(&partition);
            if held && !self.partitions.slots.contains_key(&partition) {
                self.partitions.slots.insert(partition, slot);
                resumed.push(partition);
            }
        }
        if !self.schedule.is_paused() {
            self.pause_partitions(&resumed, false);
        }
        self.report_snapshot_backlog();
        self.report_partitions();
        for record in restoring.stash {
            self.process(record).await?;
        }
        Ok(())
    }

    /// The group released `partitions` (or everything) while a restore ran
    /// beside the loop: what it read of them is stale, and their stashed
    /// records go (their next owner reads them again).
    pub(crate) fn released_while_restoring(&mut self, partitions: Option<&[i32]>) {
        let Some(restoring) = &mut self.restoring else {
            return;
        };
        let gone: Vec<i32> = partitions.map_or_else(|| restoring.partitions.clone(), <[i32]>::to_vec);
        restoring.stash.retain(|r| !gone.contains(&r.partition()));
        restoring.released.extend(gone);
    }

    /// Pauses (or resumes) `partitions` on the inputs that hold them.
    fn pause_partitions(&self, partitions: &[i32], pause: bool) {
        if partitions.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        let topics = [
            &self.settings.topics.read_reports,
            &self.settings.topics.conversation_events,
        ];
        for (topic, held) in topics.into_iter().zip(self.partitions.owned_by_input()) {
            for p in partitions.iter().filter(|p| held.contains(p)) {
                tpl.add_partition(topic, *p);
            }
        }
        let done = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = done {
            tracing::warn!(?partitions, pause, error = %e, "could not pause or resume partitions being restored");
        }
    }

    /// A wait until no transaction holds offsets of `partitions` pending
    /// (when the assignment could not, [`group`]'s `start_at_committed`), as
    /// a call for a blocking thread: the previous owner may still be
    /// committing its last flush, and a restore must see it (read_committed
    /// reads stop at an open transaction). librdkafka asks for stable
    /// offsets under read_committed (KIP-447), so fetching the committed
    /// offsets waits for exactly that. The changelogs may settle later than
    /// the offsets: the restore waits for them too
    /// (`Restorer::wait_for_settled`).
    fn stable_offsets_request(&self, partitions: &[i32]) -> impl FnOnce() + Send + 'static {
        let mut tpl = TopicPartitionList::new();
        for topic in [
            &self.settings.topics.read_reports,
            &self.settings.topics.conversation_events,
        ] {
            for &p in partitions {
                tpl.add_partition(topic, p);
            }
        }
        let consumer = Arc::clone(&self.consumer);
        let wait = group::stable_offsets_wait(&self.settings.kafka);
        move || {
            let started = Instant::now();
            if let Err(e) = consumer.committed_offsets(tpl, wait) {
                tracing::warn!(error = %e, "could not fetch the committed offsets before restoring; restoring anyway");
            }
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "committed offsets stable"
            );
        }
    }

    /// Rebuilds `partitions`' state from the changelogs, on a blocking
    /// thread; a restore that fails for a reason that may pass (a broker
    /// away) is tried again with backoff.
    pub(crate) async fn restore(&mut self, partitions: &[i32]) -> Result<Vec<(i32, Slot)>> {
        let read = self.restore_read(partitions.to_vec(), false).await?;
        Ok(self.restore_settle(read).await)
    }

    /// The part of a restore of `partitions` that needs nothing of the run
    /// loop, as a future of its own: with `stable_offsets`, first the wait
    /// for stable committed offsets ([`Processor::stable_offsets_request`]),
    /// then the snapshot marks and the changelogs read.
    pub(crate) fn restore_read(
        &self,
        partitions: Vec<i32>,
        stable_offsets: bool,
    ) -> impl std::future::Future<Output = Result<RestoreRead>> + Send + 'static {
        let snapshots = self.cql.is_some();
        let (restorer, checkpoints) = (Arc::clone(&self.restorer), self.checkpoints.clone());
        let standby = self.standby.clone();
        let marks_from = self.cql.clone().filter(|_| checkpoints.is_some());
        let group = self.settings.kafka.group_id.clone();
        let stable = stable_offsets.then(|| self.stable_offsets_request(&partitions));
        async move {
            if let Some(wait) = stable {
                tokio::task::spawn_blocking(wait).await?;
            }
            let found = match marks_from {
                None => Some(BTreeMap::new()),
                Some(cql) => match cql.snapshot_marks(&group).await {
                    Ok(marks) => Some(marks),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the CQL store's snapshot marks: restored partitions snapshot every key");
                        None
                    }
                },
            };
            let marks = Arc::new(found.clone().unwrap_or_default());
            let attempt = || {
                let (restorer, checkpoints) = (Arc::clone(&restorer), checkpoints.clone());
                let (wanted, marks, standby) = (partitions.clone(), Arc::clone(&marks), standby.clone());
                let restore = move || {
                    let standby = standby.as_deref();
                    restore_blocking(
                        &restorer,
                        checkpoints.as_deref(),
                        standby,
                        &wanted,
                        snapshots,
                        &marks,
                    )
                };
                async move { Ok::<_, Error>(tokio::task::spawn_blocking(restore).await??) }
            };
            let (states, stats, load) = retrying(attempt, |e, delay| {
                tracing::warn!(?partitions, error = %e, retry_in_ms = delay.as_millis() as u64, "restore failed; retrying");
            })
            .await?;
            Ok(RestoreRead {
                partitions,
                states,
                stats,
                load,
                found,
            })
        }
    }

    /// The rest of a restore, on the run loop: its figures, the snapshot
    /// marks renewed, and the partitions' slots.
    pub(crate) async fn restore_settle(&mut self, read: RestoreRead) -> Vec<(i32, Slot)> {
        let snapshots = self.cql.is_some();
        let RestoreRead {
            partitions,
            states,
            stats,
            load,
            found,
        } = read;
        // Opening the checkpoints (their headers and pages' checksums) is part
        // of the restore: what a restart waits for.
        let elapsed = load + stats.elapsed;
        telemetry::restored(stats.records, elapsed);
        tracing::info!(
            ?partitions,
            records = stats.records,
            cursors = stats.cursors,
            from_checkpoint = stats.from_checkpoint,
            from_standby = stats.from_standby,
            skipped = stats.skipped,
            checkpoint_load_ms = load.as_millis() as u64,
            settle_ms = stats.settle.as_millis() as u64,
            public_read_ms = stats.public_read.as_millis() as u64,
            member_state_read_ms = stats.member_state_read.as_millis() as u64,
            thread_read_ms = stats.thread_read.as_millis() as u64,
            elapsed_ms = elapsed.as_millis() as u64,
            "restored partition state from the changelog"
        );
        let restored: Vec<i32> = states.keys().copied().collect();
        self.renew_snapshot_marks(&restored, found.as_ref()).await;
        states
            .into_iter()
            .map(|(p, restored)| {
                let due = match (snapshots, restored.cql_may_lack) {
                    (false, _) => SnapshotDue::Nothing,
                    (true, Some(keys)) => SnapshotDue::Keys(keys),
                    (true, None) => SnapshotDue::Everything,
                };
                (p, Slot::restored(restored.state, due))
            })
            .collect()
    }
}

/// A restore running beside the loop ([`Processor::restore_assigned`]).
pub(crate) struct Restoring {
    pub(crate) task: tokio::task::JoinHandle<Result<RestoreRead>>,
    partitions: Vec<i32>,
    /// Partitions the group released since it began.
    released: BTreeSet<i32>,
    /// Records of any partition without state, fetched meanwhile, in the
    /// order they came: folded once the restore is in.
    pub(crate) stash: Vec<OwnedRecord>,
}

/// What [`Processor::restore_read`] read, for [`Processor::restore_settle`].
pub(crate) struct RestoreRead {
    pub(crate) partitions: Vec<i32>,
    states: BTreeMap<i32, Restored>,
    stats: RestoreStats,
    load: Duration,
    /// The CQL store's snapshot marks as the restore found them, which a
    /// checkpoint that names the store must match: empty with CQL off or
    /// without checkpoints; `None` when CQL did not answer (the restored
    /// partitions then snapshot every key, and their checkpoints at the
    /// next stop name no store).
    found: Option<BTreeMap<i32, String>>,
}
