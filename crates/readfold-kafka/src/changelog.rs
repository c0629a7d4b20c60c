//! The changelog reader: the read half of the cursor changelogs. It restores
//! one partition's state before the processor touches it, so that a restart
//! or a rebalance never emits a cursor lower than one already published, and
//! it reads or follows the changelog for the demo, the benches and the tests.
//! Every record goes through the one decoder, `readfold_wire::changelog`.
//! Blocking; call from a blocking thread.

use std::collections::{BTreeMap, HashSet};
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::Offset;
use readfold_core::fold::{MemberStateUpdate, PartitionState};
use readfold_core::CursorKey;
use readfold_wire::changelog::{decode_changelog, ChangelogEntry, ChangelogKind};

use crate::config::{KafkaConfig, TopicsConfig};
use crate::error::{Error, Result};
use crate::reader::{TopicReader, Until};

/// How long a restore or a read to the end may take.
const READ_BOUND: Duration = Duration::from_secs(600);
/// The longest a restore waits for a changelog's open transaction to end.
const MAX_SETTLE_WAIT: Duration = Duration::from_secs(240);

/// What one restore did.
#[derive(Clone, Copy, Debug, Default)]
pub struct RestoreStats {
    pub records: u64,
    pub cursors: usize,
    /// Records that could not be decoded and were skipped (with a warning).
    pub skipped: u64,
    /// Cursors loaded from local checkpoints, before the changelog tails.
    pub from_checkpoint: usize,
    /// Of those, cursors a warm standby held ([`crate::standby`]).
    pub from_standby: usize,
    pub elapsed: Duration,
    /// Of `elapsed`: finding the changelogs' ends (and waiting for open
    /// transactions in them to end), then reading each changelog.
    pub settle: Duration,
    pub public_read: Duration,
    pub member_state_read: Duration,
    /// Both thread topics, read whole after the others.
    pub thread_read: Duration,
}

/// Rebuilds a partition's state: the public changelog first, then the
/// member-state topic, which adds what the public one does not carry; then
/// the thread changelog and the thread-state topic the same way, read whole
/// (local checkpoints and standbys do not hold threads).
pub struct Restorer {
    public: ChangelogReader,
    member_state: ChangelogReader,
    thread_cursors: ChangelogReader,
    thread_state: ChangelogReader,
    /// High watermarks, for [`Restorer::wait_for_settled`].
    uncommitted: TopicReader,
    /// How long a transaction may stay open in a changelog before a restore
    /// gives up (and is tried again): the broker aborts one left open by a
    /// dead producer after its transaction timeout.
    settle_within: Duration,
}

impl Restorer {
    pub fn new(kafka: &KafkaConfig, topics: &TopicsConfig, max_id_bytes: usize) -> Result<Self> {
        let group = format!("{}-restore", kafka.group_id);
        Ok(Restorer {
            public: ChangelogReader::new(
                kafka,
                &group,
                &topics.read_cursors,
                ChangelogKind::ByConversation,
                max_id_bytes,
            )?,
            member_state: ChangelogReader::new(
                kafka,
                &group,
                &topics.member_state,
                ChangelogKind::MemberState,
                max_id_bytes,
            )?,
            thread_cursors: ChangelogReader::new(
                kafka,
                &group,
                &topics.thread_cursors,
                ChangelogKind::ThreadByConversation,
                max_id_bytes,
            )?,
            thread_state: ChangelogReader::new(
                kafka,
                &group,
                &topics.thread_state,
                ChangelogKind::ThreadState,
                max_id_bytes,
            )?,
            uncommitted: TopicReader::uncommitted(kafka, &group)?,
            // Under librdkafka's max.poll.interval.ms (300 s by default):
            // the processor does not poll its group consumer meanwhile.
            settle_within: (Duration::from_millis(kafka.transaction_timeout_ms) + Duration::from_secs(30))
                .min(MAX_SETTLE_WAIT),
        })
    }

    /// Connects the restore's readers to the broker that leads the
    /// changelogs and caches where their partitions are, so that the first
    /// restore's offset queries need not. Run beside a start's other
    /// connects: a restore that comes after the readers' bootstrap
    /// connections have closed waits longer for its settle.
    pub fn warm_up(&self) {
        std::thread::scope(|scope| {
            scope.spawn(|| self.public.reader.warm_up(&self.public.topic));
            scope.spawn(|| self.member_state.reader.warm_up(&self.member_state.topic));
            scope.spawn(|| self.thread_cursors.reader.warm_up(&self.thread_cursors.topic));
            scope.spawn(|| self.thread_state.reader.warm_up(&self.thread_state.topic));
            scope.spawn(|| self.uncommitted.warm_up(&self.public.topic));
            self.uncommitted.warm_up(&self.member_state.topic);
        });
    }

    /// Waits until no transaction is open in the changelogs' `partitions`
    /// below their present end: until each one's last stable offset (the
    /// end a read_committed restore stops at) reaches the high watermark it
    /// has now. Bounded by the transaction timeout plus 30 s (at most
    /// 240 s); past that the restore fails, to be tried again.
    ///
    /// The new owner of a partition restores right after the old one's
    /// last commit. That commit's offsets may already count (the processor
    /// waits for that) while the broker has yet to write its markers to the
    /// changelogs: a restore that stopped at the last stable offset then
    /// would miss the old owner's last flush and fold on from offsets past
    /// it, with cursors and membership epochs behind what the stores hold.
    ///
    /// Returns each changelog's (log start, last stable offset) of every
    /// partition once settled.
    fn wait_for_settled(&self, partitions: &[i32]) -> Result<[Ends; 4]> {
        let started = Instant::now();
        // The changelogs side by side, each asked for its high watermarks
        // and last stable offsets at once: one round of queries, not one
        // after another.
        let settled: Vec<Result<Settled>> = std::thread::scope(|scope| {
            let changelogs = [
                &self.public,
                &self.member_state,
                &self.thread_cursors,
                &self.thread_state,
            ];
            let settles: Vec<_> = changelogs
                .map(|changelog| scope.spawn(move || self.settle(changelog, partitions, started)))
                .into_iter()
                .collect();
            settles
                .into_iter()
                .map(|s| s.join().expect("a settle does not panic"))
                .collect()
        });
        let settled = settled.into_iter().collect::<Result<Vec<_>>>()?;
        if settled.iter().any(|s| s.waited) {
            tracing::info!(
                waited_ms = started.elapsed().as_millis() as u64,
                "the changelogs settled"
            );
        }
        let mut ends = settled.into_iter().map(|s| s.ends);
        Ok(std::array::from_fn(|_| ends.next().expect("four changelogs")))
    }

    /// [`Restorer::wait_for_settled`] for one changelog.
    fn settle(&self, changelog: &ChangelogReader, partitions: &[i32], started: Instant) -> Result<Settled> {
        let topic = changelog.topic();
        let mut ends = Ends::new();
        let mut waited = false;
        // The high watermarks once, with the first last stable offsets:
        // whichever answers first, a transaction is settled once its
        // partition's last stable offset reaches a high watermark read after
        // the fencing that began this restore.
        let (highs, mut stable) = std::thread::scope(|scope| {
            let highs = scope.spawn(|| self.uncommitted.watermarks_many(topic, partitions));
            let stable = changelog.reader.watermarks_many(topic, partitions);
            (highs.join().expect("a watermark query does not panic"), stable)
        });
        let mut open: Vec<(i32, i64)> = partitions
            .iter()
            .zip(highs?)
            .map(|(&p, (_, high))| (p, high))
            .collect();
        // Markers land within milliseconds; a dead producer's transaction
        // lasts until its timeout: back off to 500 ms.
        let mut pause = Duration::from_millis(5);
        loop {
            open = open
                .into_iter()
                .zip(stable?)
                .filter(|&((p, high), (low, stable))| {
                    let open = stable < high;
                    if !open {
                        ends.insert(p, (low, stable));
                    }
                    open
                })
                .map(|(open, _)| open)
                .collect();
            let Some(&(p, _)) = open.first() else {
                return Ok(Settled { ends, waited });
            };
            if started.elapsed() > self.settle_within {
                return Err(Error::OpenTransaction {
                    topic: topic.to_owned(),
                    partition: p,
                    within: self.settle_within,
                });
            }
            if !waited {
                tracing::info!(
                    topic,
                    partition = p,
                    "waiting for a transaction open in the changelog to end before restoring"
                );
                waited = true;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
            let asked: Vec<i32> = open.iter().map(|&(p, _)| p).collect();
            stable = changelog.reader.watermarks_many(topic, &asked);
        }
    }

    /// The states of `partitions` as the committed changelogs hold them, in
    /// one read of each changelog with all of them assigned at once: a
    /// rebalance that hands over several partitions pays each topic's round
    /// trips once, not per partition.
    pub fn restore_many(&self, partitions: &[i32]) -> Result<(BTreeMap<i32, PartitionState>, RestoreStats)> {
        let (restored, stats) = self.restore_many_from(partitions, BTreeMap::new())?;
        Ok((restored.into_iter().map(|(p, r)| (p, r.state)).collect(), stats))
    }

    /// Like [`Restorer::restore_many`], but a partition with a local
    /// checkpoint starts from it and reads only the changelogs' tails from
    /// the checkpoint's offsets (see `readfold_wire::checkpoint`).
    pub fn restore_many_from(
        &self,
        partitions: &[i32],
        mut checkpoints: BTreeMap<i32, LocalCheckpoint>,
    ) -> Result<(BTreeMap<i32, Restored>, RestoreStats)> {
        let started = Instant::now();
        let mut stats = RestoreStats::default();
        let mut states = BTreeMap::new();
        // The keys the tails change, of each checkpoint CQL held whole.
        let mut tails: BTreeMap<i32, HashSet<CursorKey>> = BTreeMap::new();
        let (mut public_from, mut state_from, mut checkpointed) = (Vec::new(), Vec::new(), Vec::new());
        let mut unapplied = BTreeMap::new();
        for &p in partitions {
            match checkpoints.remove(&p) {
                Some(checkpoint) => {
                    if !checkpoint.member_states.is_empty() {
                        unapplied.insert(p, checkpoint.member_states);
                    }
                    stats.from_checkpoint += checkpoint.state.cursor_count();
                    checkpointed.push(p);
                    if checkpoint.in_cql {
                        tails.insert(p, HashSet::new());
                    }
                    states.insert(p, checkpoint.state);
                    public_from.push((p, Offset::Offset(checkpoint.public_offset)));
                    state_from.push((p, Offset::Offset(checkpoint.state_offset)));
                }
                None => {
                    states.insert(p, PartitionState::new());
                    public_from.push((p, Offset::Beginning));
                    state_from.push((p, Offset::Beginning));
                }
            }
        }
        if partitions.is_empty() {
            return Ok((BTreeMap::new(), stats));
        }
        let [public_ends, state_ends, thread_ends, thread_state_ends] = self.wait_for_settled(partitions)?;
        stats.settle = started.elapsed();
        // An empty changelog partition (a first start) or one with no tail
        // past its checkpoint has nothing to read: its read would cost an
        // offset query and a fetch that only reports the end.
        let (public_from, state_from) = (
            with_records(public_from, &public_ends),
            with_records(state_from, &state_ends),
        );
        self.public.restore_tracking(
            &public_from,
            Some(&public_ends),
            &mut states,
            &mut stats,
            &mut tails,
        )?;
        stats.public_read = started.elapsed() - stats.settle;
        // A restore applies member-state records after the public ones,
        // checkpointed ones included: the public tail took the conversations
        // it touched in from the checkpoint, and their stored member-states
        // go on again. What it did not touch is as the checkpoint has it.
        for p in checkpointed {
            let state = states.get_mut(&p).expect("restored partition");
            if public_from.iter().any(|(tail, _)| *tail == p) {
                state.restate_from_store();
            }
            for member_state in unapplied.remove(&p).unwrap_or_default() {
                state.restore_state(&member_state);
            }
        }
        self.member_state.restore_tracking(
            &state_from,
            Some(&state_ends),
            &mut states,
            &mut stats,
            &mut tails,
        )?;
        stats.member_state_read = started.elapsed() - stats.settle - stats.public_read;
        // Threads after the members, whose membership places join points.
        let whole: Vec<(i32, Offset)> = partitions.iter().map(|&p| (p, Offset::Beginning)).collect();
        let no_tails = &mut BTreeMap::new();
        self.thread_cursors.restore_tracking(
            &with_records(whole.clone(), &thread_ends),
            Some(&thread_ends),
            &mut states,
            &mut stats,
            no_tails,
        )?;
        self.thread_state.restore_tracking(
            &with_records(whole, &thread_state_ends),
            Some(&thread_state_ends),
            &mut states,
            &mut stats,
            no_tails,
        )?;
        stats.thread_read = started.elapsed() - stats.settle - stats.public_read - stats.member_state_read;
        stats.cursors = states.values().map(PartitionState::cursor_count).sum();
        // Restored members arrive one by one; give back what growth left unused.
        states.values_mut().for_each(PartitionState::shrink_to_fit);
        stats.elapsed = started.elapsed();
        let restored = states
            .into_iter()
            .map(|(p, state)| {
                let cql_may_lack = tails.remove(&p);
                (p, Restored { state, cql_may_lack })
            })
            .collect();
        Ok((restored, stats))
    }

    /// The (log start, end) offsets of `partitions` of the public
    /// changelog and of the member-state topic, for checking checkpoints
    /// against or writing them: all queried at once, not one partition
    /// after another (four offset queries each).
    pub fn watermarks(&self, partitions: &[i32]) -> Result<BTreeMap<i32, ChangelogEnds>> {
        let (public, state) = std::thread::scope(|scope| {
            let state = scope.spawn(|| {
                self.member_state
                    .reader
                    .watermarks_many(&self.member_state.topic, partitions)
            });
            let public = self.public.reader.watermarks_many(&self.public.topic, partitions);
            (public, state.join().expect("a watermark query does not panic"))
        });
        Ok(partitions
            .iter()
            .copied()
            .zip(public?.into_iter().zip(state?))
            .collect())
    }
}

/// A partition's (log start, end) in the public changelog, then in the
/// member-state topic.
pub type ChangelogEnds = ((i64, i64), (i64, i64));

/// The (log start, last stable offset) of a changelog's partitions.
type Ends = BTreeMap<i32, (i64, i64)>;

/// A changelog's [`Ends`] once settled, and whether that took a wait.
struct Settled {
    ends: Ends,
    waited: bool,
}

/// `starts` without the partitions that hold no record from their start
/// to their settled end.
fn with_records(starts: Vec<(i32, Offset)>, ends: &Ends) -> Vec<(i32, Offset)> {
    starts
        .into_iter()
        .filter(|(p, start)| match (start, ends.get(p)) {
            (Offset::Beginning, Some(&(low, end))) => low < end,
            (Offset::Offset(from), Some(&(_, end))) => *from != end,
            _ => true,
        })
        .collect()
}

/// Each of `starts` with the end its read stops at; a start at the
/// beginning becomes the log start the settle found, which spares the read
/// an offset query (were the log start to move on meanwhile, the fetch
/// falls back to the earliest offset: `auto.offset.reset`).
fn with_ends(starts: &[(i32, Offset)], ends: &Ends) -> Option<Vec<(i32, Offset, i64)>> {
    starts
        .iter()
        .map(|&(p, start)| {
            let &(low, end) = ends.get(&p)?;
            let start = match start {
                Offset::Beginning => Offset::Offset(low),
                other => other,
            };
            Some((p, start, end))
        })
        .collect()
}

/// A partition's state loaded from a local checkpoint, and the changelog
/// offsets from which it is to be brought up to date.
pub struct LocalCheckpoint {
    pub state: PartitionState,
    pub public_offset: i64,
    pub state_offset: i64,
    /// Whether the CQL store this processor writes held every key of the
    /// state when the checkpoint was written.
    pub in_cql: bool,
    /// Member-state records read (before `state_offset`) but not applied
    /// to `state`: a standby's ([`crate::standby`]), whose `state` holds
    /// the public changelog only. They go on after the public tail, as a
    /// restore applies the member-state topic after the public one.
    pub member_states: Vec<MemberStateUpdate>,
}

/// A partition's state, restored.
pub struct Restored {
    pub state: PartitionState,
    /// From a checkpoint that CQL held whole: the keys that the changelogs'
    /// tails changed since, which CQL may lack (their writer may have
    /// stopped between two snapshots). `None`: CQL may lack any key.
    pub cql_may_lack: Option<HashSet<CursorKey>>,
}

/// Reads one changelog topic.
pub struct ChangelogReader {
    reader: TopicReader,
    topic: String,
    kind: ChangelogKind,
    max_id_bytes: usize,
}

impl ChangelogReader {
    /// A reader of `topic` (a changelog of `kind`), identifying as
    /// `group_id` but committing nothing. Ids longer than `max_id_bytes`
    /// are skipped, as the processor would have refused them.
    pub fn new(
        kafka: &KafkaConfig,
        group_id: &str,
        topic: &str,
        kind: ChangelogKind,
        max_id_bytes: usize,
    ) -> Result<Self> {
        Ok(ChangelogReader {
            reader: TopicReader::new(kafka, group_id, true)?,
            topic: topic.to_owned(),
            kind,
            max_id_bytes,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Applies the given partitions of this changelog, each from its start
    /// offset up to its end (the last stable offset, since this reader is
    /// read_committed), each to its own state in `states`.
    pub fn restore_into(
        &self,
        starts: &[(i32, Offset)],
        states: &mut BTreeMap<i32, PartitionState>,
        stats: &mut RestoreStats,
    ) -> Result<()> {
        self.restore_tracking(starts, None, states, stats, &mut BTreeMap::new())
    }

    /// [`ChangelogReader::restore_into`], adding the key of each entry of a
    /// partition in `touched` to its set.
    /// `ends`: where the reads stop, when a settle found them.
    fn restore_tracking(
        &self,
        starts: &[(i32, Offset)],
        ends: Option<&Ends>,
        states: &mut BTreeMap<i32, PartitionState>,
        stats: &mut RestoreStats,
        touched: &mut BTreeMap<i32, HashSet<CursorKey>>,
    ) -> Result<()> {
        if starts.is_empty() {
            return Ok(());
        }
        stats.records += self.read_from(starts, ends, |partition, entry| {
            match (entry, states.get_mut(&partition)) {
                (Some(entry), Some(state)) => {
                    entry.restore_into(state);
                    if let (Some(keys), Some(key)) = (touched.get_mut(&partition), entry.key()) {
                        keys.insert(key);
                    }
                }
                _ => stats.skipped += 1,
            }
            ControlFlow::Continue(())
        })?;
        Ok(())
    }

    /// Every committed entry of the given partitions (all when `None`), in
    /// partition order, each with its partition.
    pub fn entries(&self, partitions: Option<&[i32]>) -> Result<Vec<(i32, ChangelogEntry)>> {
        let mut out = Vec::new();
        self.read_partitions(partitions, |partition, entry| {
            out.extend(entry.map(|e| (partition, e)));
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Starts following the given partitions (all when `None`) from the
    /// beginning; then call [`ChangelogReader::poll_entries`].
    pub fn follow(&self, partitions: Option<&[i32]>) -> Result<()> {
        self.reader.assign_from_beginning(&self.topic, partitions)?;
        Ok(())
    }

    /// Starts following the given partitions (all when `None`) from their
    /// end: only what is committed from now on.
    pub fn follow_from_end(&self, partitions: Option<&[i32]>) -> Result<()> {
        self.reader.assign_from_end(&self.topic, partitions)?;
        Ok(())
    }

    /// The entries that arrived since the last call, waiting up to `wait`
    /// for each next one.
    pub fn poll_entries(&self, wait: Duration) -> Result<Vec<ChangelogEntry>> {
        let mut out = Vec::new();
        self.for_each_available(wait, |entry| out.push(entry))?;
        Ok(out)
    }

    /// Like [`ChangelogReader::poll_entries`], but hands each entry over as
    /// it arrives, for callers that time arrivals.
    pub fn for_each_available(&self, wait: Duration, mut each: impl FnMut(ChangelogEntry)) -> Result<u64> {
        self.for_each_available_with(wait, |entry, _| each(entry))
    }

    /// Like [`ChangelogReader::for_each_available`], with each entry's
    /// record, for callers that read its headers.
    pub fn for_each_available_with(
        &self,
        wait: Duration,
        mut each: impl FnMut(ChangelogEntry, &BorrowedMessage<'_>),
    ) -> Result<u64> {
        self.reader.poll_available(wait, |message| {
            if let Some(entry) = self.decode(message) {
                each(entry, message);
            }
        })
    }

    fn read_partitions(
        &self,
        partitions: Option<&[i32]>,
        each: impl FnMut(i32, Option<ChangelogEntry>) -> ControlFlow<()>,
    ) -> Result<u64> {
        let partitions = match partitions {
            Some(p) => p.to_vec(),
            None => self.reader.partitions(&self.topic)?,
        };
        let starts: Vec<_> = partitions.into_iter().map(|p| (p, Offset::Beginning)).collect();
        self.read_from(&starts, None, each)
    }

    /// Reads each partition from its start offset to its end: the one in
    /// `ends` when given ([`TopicReader::read_to`]), else where librdkafka
    /// reports it.
    fn read_from(
        &self,
        starts: &[(i32, Offset)],
        ends: Option<&Ends>,
        mut each: impl FnMut(i32, Option<ChangelogEntry>) -> ControlFlow<()>,
    ) -> Result<u64> {
        // Know the leaders before assigning: a consumer that learns them
        // only after the assignment waits out an offset-query timer (about
        // 500 ms) before its first fetch.
        self.reader.partitions(&self.topic)?;
        let mut each_message =
            |message: &BorrowedMessage<'_>| each(message.partition(), self.decode(message));
        let result = match ends.and_then(|ends| with_ends(starts, ends)) {
            Some(bounded) => {
                let starts: Vec<_> = bounded.iter().map(|&(p, start, _)| (p, start)).collect();
                self.reader.assign_at(&self.topic, &starts)?;
                let ends: Vec<_> = bounded.iter().map(|&(p, _, end)| (p, end)).collect();
                self.reader
                    .read_to(&self.topic, &ends, READ_BOUND, &mut each_message)
            }
            None => {
                let assigned = self.reader.assign_at(&self.topic, starts)?;
                self.reader.read(
                    &self.topic,
                    &assigned,
                    Until::End { within: READ_BOUND },
                    &mut each_message,
                )
            }
        };
        self.reader.unassign()?;
        result
    }

    /// Decodes one record; an unreadable one is logged and skipped.
    fn decode(&self, message: &BorrowedMessage<'_>) -> Option<ChangelogEntry> {
        match decode_changelog(self.kind, message.key(), message.payload(), self.max_id_bytes) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!(
                    topic = %self.topic,
                    partition = message.partition(),
                    offset = message.offset(),
                    error = %e,
                    "skipping unreadable changelog record"
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_partitions_with_records_past_their_start_are_read() {
        let ends: Ends = [(0, (0, 0)), (1, (0, 5)), (2, (3, 3)), (3, (0, 9))].into();
        let starts = vec![
            (0, Offset::Beginning), // empty: a first start
            (1, Offset::Beginning), // five records
            (2, Offset::Beginning), // compacted down to nothing
            (3, Offset::Offset(9)), // a checkpoint with no tail
            (4, Offset::Beginning), // end unknown: read
            (5, Offset::Offset(2)), // end unknown: read
        ];
        let kept: Vec<i32> = with_records(starts, &ends).into_iter().map(|(p, _)| p).collect();
        assert_eq!(kept, [1, 4, 5]);
        let tail = with_records(vec![(3, Offset::Offset(4))], &ends);
        assert_eq!(tail.len(), 1, "a checkpoint behind the end reads its tail");
    }
}
