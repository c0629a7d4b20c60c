//! Flush planning, pure: what one flush publishes, computed from the state of
//! the assigned partitions, and what it leaves behind once it committed.
//!
//! A flush takes the current value of every dirty key out of the state, so
//! that folding goes on while the plan is written. A failed flush gives its
//! keys back ([`failed`]), and the next one publishes their then current
//! values, at least as new; nothing is dropped and state never rewinds. The
//! processor executes the plan: the stores (idempotent max-merges) and one
//! Kafka transaction, which commits only once the stores took the plan.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::domain::{ConversationId, CursorKey, Seq, UserId};
use crate::fold::{
    Change, InputKind, MemberAt, PartitionState, ThreadAt, ThreadChange, ThreadStateChange, UnreadMark,
};
use crate::read_model::Mute;

/// One input partition's state and what its next flush must publish. `D` is
/// the producer's dead-letter record, opaque here.
#[derive(Clone, Debug)]
pub struct PartitionSlot<D> {
    pub state: PartitionState,
    /// Next offset to commit per input (last processed + 1).
    pub offsets: BTreeMap<InputKind, i64>,
    /// Rejected records waiting for the next transaction.
    pub dead_letters: Vec<D>,
    /// Members published to the changelog since the current snapshot pass
    /// began: the next pass's (see [`begin_snapshot`]).
    pub unsnapshotted: HashSet<MemberAt>,
    /// The current snapshot pass's members not yet written.
    pub snapshotting: Vec<MemberAt>,
    /// Threads published since the current pass began, and the current
    /// pass's threads not yet written: snapshots write a thread whole
    /// (memory grows with participation, so threads are few).
    pub unsnapshotted_threads: HashSet<ThreadAt>,
    pub snapshotting_threads: Vec<ThreadAt>,
    /// Restored conversations a snapshot has yet to write whole.
    pub resnapshot: Option<Resnapshot>,
    /// Which restore made this slot, unique in the process: members'
    /// numbers ([`MemberAt`], [`Resnapshot`]) given back by a failed
    /// snapshot are this state's only if the slot is the same.
    pub restore: u64,
}

/// Restores so far, for [`PartitionSlot::restore`].
static RESTORES: AtomicU64 = AtomicU64::new(0);

/// The conversations of a partition restored from the changelog that CQL
/// may lack, by number ([`PartitionState::conversation_count`]): `next..end`.
/// A range, not a set of keys: such a partition owes CQL every key it
/// holds, and a set of them all would take more memory than the state.
/// Snapshots write it a share at a time ([`begin_snapshot`]'s
/// `restored_keys`), so that no snapshot grows with the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resnapshot {
    pub next: u32,
    pub end: u32,
    /// Members of `next..end` when taken (a gauge's figure: they grow).
    pub keys_left: usize,
}

/// What CQL snapshots owe of a partition just restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotDue {
    /// Nothing: CQL is off, and nothing is tracked.
    Nothing,
    /// Every key: the previous owner may have stopped between snapshots,
    /// and nothing says which keys it left out.
    Everything,
    /// These keys only: the state came from a local checkpoint that CQL
    /// held whole, and these are the keys the changelogs changed since.
    Keys(HashSet<CursorKey>),
}

impl<D> PartitionSlot<D> {
    /// A slot for a partition just restored, with what the next snapshots
    /// owe of it.
    pub fn restored(state: PartitionState, due: SnapshotDue) -> Self {
        // Restores read the thread topics whole whatever else they start
        // from, and nothing says which threads CQL lacks: all are owed.
        let unsnapshotted_threads = match due {
            SnapshotDue::Nothing => HashSet::new(),
            _ => state.thread_ats().into_iter().collect(),
        };
        let (unsnapshotted, resnapshot) = match due {
            SnapshotDue::Nothing => (HashSet::new(), None),
            SnapshotDue::Everything => {
                let end = state.conversation_count();
                let resnapshot = (end > 0).then(|| Resnapshot {
                    next: 0,
                    end,
                    keys_left: state.cursor_count(),
                });
                (HashSet::new(), resnapshot)
            }
            SnapshotDue::Keys(keys) => (keys.iter().filter_map(|k| state.member_at(k)).collect(), None),
        };
        PartitionSlot {
            state,
            offsets: BTreeMap::new(),
            dead_letters: Vec::new(),
            unsnapshotted,
            snapshotting: Vec::new(),
            unsnapshotted_threads,
            snapshotting_threads: Vec::new(),
            resnapshot,
            restore: RESTORES.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether CQL holds every key of this partition, as far as snapshots
    /// know (none owed).
    pub fn in_cql(&self) -> bool {
        self.owes_published() == 0 && self.resnapshot.is_none()
    }

    /// Published members (and threads) the snapshots owe: the current
    /// pass's left, and the next pass's.
    pub fn owes_published(&self) -> usize {
        self.unsnapshotted.len()
            + self.snapshotting.len()
            + self.unsnapshotted_threads.len()
            + self.snapshotting_threads.len()
    }

    /// Keys the next snapshots owe (restored ones counted as restored).
    pub fn snapshot_backlog(&self) -> usize {
        self.owes_published() + self.resnapshot.map_or(0, |r| r.keys_left)
    }

    /// Whether the next flush has anything of this partition to commit.
    pub fn has_work(&self) -> bool {
        self.state.dirty_len() > 0
            || self.state.has_thread_changes()
            || !self.offsets.is_empty()
            || !self.dead_letters.is_empty()
    }

    /// The record at `offset` of input `kind` was processed.
    pub fn processed(&mut self, kind: InputKind, offset: i64) {
        self.offsets.insert(kind, offset + 1);
    }

    /// The partition was revoked: uncommitted input will be delivered again
    /// to whoever owns it next, so pending offsets and dead letters go. The
    /// folded state stays (the fold is idempotent) in case it comes back.
    pub fn forget_uncommitted(&mut self) {
        self.offsets.clear();
        self.dead_letters.clear();
    }
}

/// What one flush ([`begin`]) or one snapshot ([`begin_snapshot`])
/// publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushPlan<D> {
    /// The partitions this plan covers.
    pub partitions: Vec<i32>,
    /// A flush's partitions' slots ([`PartitionSlot::restore`]): its
    /// changes' member numbers are those slots' own.
    pub restore_of: BTreeMap<i32, u64>,
    /// A flush's current value of every dirty key, with its input
    /// partition: the changelog records and the Redis writes.
    pub changes: Vec<(i32, Change)>,
    /// A flush's current value of every dirty thread follower, and of every
    /// thread whose replies moved, with their input partition.
    pub thread_changes: Vec<(i32, ThreadChange)>,
    pub thread_states: Vec<(i32, ThreadStateChange)>,
    /// The threads of `thread_changes` and `thread_states`, in their
    /// slots' numbers: the next snapshot pass's once committed.
    pub threads_published: Vec<(i32, ThreadAt)>,
    /// A snapshot's rows for CQL: the whole current state (public, and
    /// private where there is any) of every key published since the last
    /// snapshot. Whole, because a flush may have published only part of a
    /// key's state (a private change) that CQL has not seen. `None` in a
    /// flush.
    pub snapshot: Option<Vec<Change>>,
    /// A snapshot's threads for CQL: every follower of each, whole.
    pub thread_snapshot: Vec<ThreadChange>,
    /// Rejected records, with their input partition.
    pub dead_letters: Vec<(i32, D)>,
    /// (input, partition, next offset) to commit with the transaction.
    pub offsets: Vec<(InputKind, i32, i64)>,
    /// The members a snapshot took from each partition's `snapshotting`
    /// (with the slot's `restore`), given back if it fails.
    pub snapshotted: Vec<(i32, u64, Vec<MemberAt>)>,
    /// The same for threads.
    pub snapshotted_threads: Vec<(i32, u64, Vec<ThreadAt>)>,
    /// Whether this snapshot began a pass (see [`begin_snapshot`]).
    pub opens_pass: bool,
    /// Each partition's `resnapshot` before the snapshot took its share
    /// (with the slot's `restore`), put back if the snapshot fails.
    pub resnapshot: Vec<(i32, u64, Resnapshot)>,
}

impl<D> FlushPlan<D> {
    /// A plan of nothing.
    pub fn empty() -> Self {
        FlushPlan {
            partitions: Vec::new(),
            restore_of: BTreeMap::new(),
            changes: Vec::new(),
            thread_changes: Vec::new(),
            thread_states: Vec::new(),
            threads_published: Vec::new(),
            snapshot: None,
            thread_snapshot: Vec::new(),
            dead_letters: Vec::new(),
            offsets: Vec::new(),
            snapshotted: Vec::new(),
            snapshotted_threads: Vec::new(),
            opens_pass: false,
            resnapshot: Vec::new(),
        }
    }

    /// Nothing to publish and nothing to snapshot.
    pub fn is_empty(&self) -> bool {
        self.partitions.is_empty()
    }

    /// Whether the flush has anything for Kafka; a snapshot-only flush has not.
    pub fn needs_transaction(&self) -> bool {
        !self.changes.is_empty()
            || !self.thread_changes.is_empty()
            || !self.dead_letters.is_empty()
            || !self.offsets.is_empty()
    }

    /// The rows a snapshot writes.
    pub fn snapshot_changes(&self) -> impl Iterator<Item = &Change> {
        self.snapshot.iter().flatten()
    }
}

/// Begins a flush of every partition with work: takes the pending changes,
/// dead letters and offsets out of the slots into the plan, so that what is
/// folded while the plan is written waits for the next flush. Settle the
/// plan with [`committed`] or [`failed`].
pub fn begin<D>(slots: &mut BTreeMap<i32, PartitionSlot<D>>) -> FlushPlan<D> {
    let mut plan = FlushPlan::empty();
    // A catch-up flush takes hundreds of thousands of changes: growing the
    // plan by doubling copied them over and over.
    plan.changes.reserve_exact(dirty_len(slots));
    for (&partition, slot) in slots.iter_mut() {
        if !slot.has_work() {
            continue;
        }
        plan.partitions.push(partition);
        plan.restore_of.insert(partition, slot.restore);
        // Taken before the drain, which clears them too.
        plan.threads_published
            .extend(slot.state.dirty_threads().map(|at| (partition, at)));
        let (threads, thread_states) = slot.state.pending_thread_changes();
        plan.thread_changes
            .extend(threads.into_iter().map(|change| (partition, change)));
        plan.thread_states
            .extend(thread_states.into_iter().map(|state| (partition, state)));
        plan.changes
            .extend(slot.state.drain().into_iter().map(|change| (partition, change)));
        plan.dead_letters
            .extend(slot.dead_letters.drain(..).map(|d| (partition, d)));
        plan.offsets.extend(
            std::mem::take(&mut slot.offsets)
                .into_iter()
                .map(|(kind, offset)| (kind, partition, offset)),
        );
    }
    plan
}

/// Begins a snapshot on its own (CQL only, no changes, offsets or dead
/// letters), a share of a pass. A pass writes the whole current state of
/// every member published before it began: when no pass is under way (no
/// slot has `snapshotting` left), one begins (`opens_pass`), taking every
/// slot's `unsnapshotted`; what is published from then on waits for the
/// next pass. CQL holds everything published before a pass began once its
/// last share is written ([`pass_done`]). A snapshot takes up to
/// `published_keys` members of the pass, and whole restored conversations
/// still owed (`resnapshot`) up to about `restored_keys` members, so that
/// neither a catch-up nor a restore makes one snapshot, or its plan in
/// memory, grow without bound. Settle it with [`committed`] or [`failed`]
/// like any plan.
pub fn begin_snapshot<D>(
    slots: &mut BTreeMap<i32, PartitionSlot<D>>,
    published_keys: usize,
    restored_keys: usize,
) -> FlushPlan<D> {
    let mut snapshot = Vec::new();
    let mut plan = FlushPlan::empty();
    if pass_done(slots) {
        plan.opens_pass = true;
        for slot in slots.values_mut() {
            // Taken, not drained: a catch-up's set gives its memory back.
            slot.snapshotting.extend(std::mem::take(&mut slot.unsnapshotted));
            slot.snapshotting_threads
                .extend(std::mem::take(&mut slot.unsnapshotted_threads));
            slot.snapshotting_threads.sort_unstable();
            // By conversation, so that a share holds whole conversations,
            // which CQL takes as one batch each: in the set's order a
            // 100-member group's keys spread over dozens of shares and
            // batches.
            slot.snapshotting.sort_unstable();
        }
    }
    let (mut published, mut restored) = (published_keys, restored_keys);
    for (&partition, slot) in slots.iter_mut() {
        // Whole threads, while the share's budget lasts.
        if published > 0 && !slot.snapshotting_threads.is_empty() {
            let mut taken = Vec::new();
            while let Some(at) = slot.snapshotting_threads.pop() {
                let followers = slot.state.thread_snapshot(at, &mut plan.thread_snapshot);
                taken.push(at);
                published = published.saturating_sub(followers.max(1));
                if published == 0 {
                    break;
                }
            }
            plan.snapshotted_threads.push((partition, slot.restore, taken));
            if !plan.partitions.contains(&partition) {
                plan.partitions.push(partition);
            }
        }
        let share = slot.snapshotting.len().min(published);
        let owed = slot.resnapshot.filter(|_| restored > 0);
        if share == 0 && owed.is_none() {
            continue;
        }
        if !plan.partitions.contains(&partition) {
            plan.partitions.push(partition);
        }
        if share > 0 {
            let taken = slot.snapshotting.split_off(slot.snapshotting.len() - share);
            if slot.snapshotting.is_empty() {
                slot.snapshotting = Vec::new();
            }
            snapshot.extend(taken.iter().filter_map(|&at| slot.state.current_at(at)));
            plan.snapshotted.push((partition, slot.restore, taken));
            published -= share;
        }
        if let Some(owed) = owed {
            let before = snapshot.len();
            let next = slot
                .state
                .conversation_changes(owed.next, owed.end, restored, &mut snapshot);
            let taken = snapshot.len() - before;
            restored = restored.saturating_sub(taken);
            plan.resnapshot.push((partition, slot.restore, owed));
            slot.resnapshot = (next < owed.end).then(|| Resnapshot {
                next,
                end: owed.end,
                keys_left: owed.keys_left.saturating_sub(taken),
            });
        }
    }
    plan.snapshot = Some(snapshot);
    plan
}

/// Whether no snapshot pass is under way: every share of the last one was
/// written.
pub fn pass_done<D>(slots: &BTreeMap<i32, PartitionSlot<D>>) -> bool {
    slots
        .values()
        .all(|s| s.snapshotting.is_empty() && s.snapshotting_threads.is_empty())
}

/// After every store and the transaction acknowledged the plan. With
/// `track_snapshots` (CQL on) and no snapshot in this flush, the published
/// keys are remembered for the next snapshot.
pub fn committed<D>(slots: &mut BTreeMap<i32, PartitionSlot<D>>, plan: &FlushPlan<D>, track_snapshots: bool) {
    if !track_snapshots || plan.snapshot.is_some() {
        return;
    }
    // A partition restored again while the flush was in flight owes what
    // its restore says (which waited for this transaction), in its own
    // numbers.
    for (partition, change) in &plan.changes {
        if let Some(slot) = slots
            .get_mut(partition)
            .filter(|s| plan.restore_of.get(partition) == Some(&s.restore))
        {
            slot.unsnapshotted.insert(change.at);
        }
    }
    for (partition, at) in &plan.threads_published {
        if let Some(slot) = slots
            .get_mut(partition)
            .filter(|s| plan.restore_of.get(partition) == Some(&s.restore))
        {
            slot.unsnapshotted_threads.insert(*at);
        }
    }
}

/// The plan was not (wholly) acknowledged: its keys are dirty again and its
/// snapshot backlog is given back. With `same_assignment` (no rebalance
/// since [`begin`]), so are its dead letters (ahead of newer ones) and its
/// offsets, unless newer input has moved them on; after a revoke the input
/// will be delivered again, as [`PartitionSlot::forget_uncommitted`] says,
/// and so it is for a partition restored anew since.
pub fn failed<D: Clone>(
    slots: &mut BTreeMap<i32, PartitionSlot<D>>,
    plan: &FlushPlan<D>,
    same_assignment: bool,
) {
    for (partition, change) in &plan.changes {
        if let Some(slot) = slots.get_mut(partition) {
            slot.state.redirty(&change.key, change.outputs);
        }
    }
    for (partition, change) in &plan.thread_changes {
        if let Some(slot) = slots.get_mut(partition) {
            slot.state.redirty_thread(&change.key, change.outputs);
        }
    }
    for (partition, state) in &plan.thread_states {
        if let Some(slot) = slots.get_mut(partition) {
            slot.state
                .redirty_thread_state(&state.conversation_id, state.thread);
        }
    }
    // Back into the pass, which goes on, and owed again: unless the
    // partition was restored again since, which numbers its members anew
    // and owes what its own restore says.
    for (partition, restore, taken) in &plan.snapshotted {
        if let Some(slot) = slots.get_mut(partition).filter(|s| s.restore == *restore) {
            slot.snapshotting.extend_from_slice(taken);
        }
    }
    for (partition, restore, taken) in &plan.snapshotted_threads {
        if let Some(slot) = slots.get_mut(partition).filter(|s| s.restore == *restore) {
            slot.snapshotting_threads.extend_from_slice(taken);
        }
    }
    for &(partition, restore, owed) in &plan.resnapshot {
        if let Some(slot) = slots.get_mut(&partition).filter(|s| s.restore == restore) {
            slot.resnapshot = Some(owed);
        }
    }

    if !same_assignment {
        return;
    }
    // A partition released and taken again since (the consumer protocol's
    // incremental rebalances) has another restore: its input is read again
    // from the committed offsets.
    let same_restore =
        |partition: &i32, slot: &PartitionSlot<D>| plan.restore_of.get(partition) == Some(&slot.restore);
    for &(kind, partition, offset) in &plan.offsets {
        if let Some(slot) = slots.get_mut(&partition).filter(|s| same_restore(&partition, s)) {
            slot.offsets.entry(kind).or_insert(offset);
        }
    }
    for (partition, slot) in slots.iter_mut().filter(|(p, s)| same_restore(p, s)) {
        let older: Vec<D> = plan
            .dead_letters
            .iter()
            .filter(|(p, _)| p == partition)
            .map(|(_, d)| d.clone())
            .collect();
        if !older.is_empty() {
            let newer = std::mem::replace(&mut slot.dead_letters, older);
            slot.dead_letters.extend(newer);
        }
    }
}

/// Dirty keys over all partitions.
pub fn dirty_len<D>(slots: &BTreeMap<i32, PartitionSlot<D>>) -> usize {
    slots.values().map(|s| s.state.dirty_len()).sum()
}

/// Past four times `max_dirty` dirty keys, the processor stops taking
/// records until the flush in flight commits, or, with none in flight
/// (flushes failing), pauses the consumer until one succeeds.
pub fn over_bound(dirty: usize, max_dirty: usize) -> bool {
    dirty >= max_dirty.saturating_mul(4)
}

/// One member's new public state, as the conversation stores keep it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberWrite {
    pub user_id: UserId,
    pub cursor: Seq,
    /// The delivered cursor, never below `cursor`.
    pub delivered: Seq,
    pub join_seq: Seq,
    /// The member left: stores forget them.
    pub left: bool,
    /// Orders membership: a write of a lower epoch never undoes a later
    /// join or leave, and a departure never hides a later rejoin.
    pub epoch: u64,
}

/// The public changes of one conversation in one flush: one store call each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversationBatch {
    pub conversation_id: ConversationId,
    /// Highest `latest_seq` among the changes.
    pub latest_seq: Seq,
    pub members: Vec<MemberWrite>,
}

/// Groups a flush's public changes by conversation, in the order each
/// conversation first appears; changes with no public output are left out.
/// A flush lists a conversation's changes together, so most changes
/// extend the batch before them and cost no lookup, where a sorted map
/// compared ids at every change. The stores need no order: every merge is
/// a max over keys no other batch touches.
pub fn group_by_conversation<'a>(changes: impl IntoIterator<Item = &'a Change>) -> Vec<ConversationBatch> {
    let mut batches: Vec<ConversationBatch> = Vec::new();
    let mut index: HashMap<&'a ConversationId, usize> = HashMap::new();
    for change in changes.into_iter().filter(|c| c.outputs.public) {
        let id = &change.key.conversation_id;
        let at = match batches.last() {
            Some(last) if last.conversation_id == *id => batches.len() - 1,
            _ => *index.entry(id).or_insert_with(|| {
                batches.push(ConversationBatch {
                    conversation_id: id.clone(),
                    latest_seq: Seq::ZERO,
                    members: Vec::new(),
                });
                batches.len() - 1
            }),
        };
        let batch = &mut batches[at];
        let m = &change.member;
        // A departure carries the conversation's latest seq too: a message
        // from a member who has left raises it with no other change.
        batch.latest_seq = batch.latest_seq.max(change.latest_seq);
        batch.members.push(MemberWrite {
            user_id: change.key.user_id.clone(),
            cursor: if m.left { Seq::ZERO } else { m.cursor },
            delivered: if m.left { Seq::ZERO } else { m.delivered },
            join_seq: if m.left { Seq::ZERO } else { m.join_seq },
            left: m.left,
            epoch: m.epoch,
        });
    }
    batches
}

/// One conversation's private state of one member, as the per-user stores
/// keep it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrivateWrite {
    pub conversation_id: ConversationId,
    pub private_cursor: Seq,
    pub mark: Option<UnreadMark>,
    /// How far the member has read, by either cursor: the stores drop the
    /// mentions at or below the highest they were given.
    pub read_up_to: Seq,
    /// The unread mentions above `read_up_to`, ascending, the newest kept.
    pub mentions: Vec<Seq>,
    /// The latest mute or unmute.
    pub mute: Option<Mute>,
}

/// The private changes of one user in one flush: one store call each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserBatch {
    pub user_id: UserId,
    pub conversations: Vec<PrivateWrite>,
}

/// Groups a flush's private changes by user, in user order; members with no
/// private state (only a membership change) are left out.
pub fn group_by_user<'a>(changes: impl IntoIterator<Item = &'a Change>) -> Vec<UserBatch> {
    let mut by_user: BTreeMap<UserId, UserBatch> = BTreeMap::new();
    for change in changes
        .into_iter()
        .filter(|c| c.outputs.state && c.member.has_private_state())
    {
        by_user
            .entry(change.key.user_id.clone())
            .or_insert_with(|| UserBatch {
                user_id: change.key.user_id.clone(),
                conversations: Vec::new(),
            })
            .conversations
            .push(PrivateWrite {
                conversation_id: change.key.conversation_id.clone(),
                private_cursor: change.member.private_cursor,
                mark: change.member.mark,
                read_up_to: change.member.read_up_to(),
                mentions: change
                    .member
                    .mentions
                    .iter()
                    .copied()
                    .filter(|&s| s > change.member.read_up_to())
                    .collect(),
                mute: change.member.mute,
            });
    }
    by_user.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::{Member, Outputs, ReadReport};

    fn change(c: &str, u: &str, member: Member, latest: u64, outputs: Outputs) -> Change {
        Change {
            key: CursorKey {
                conversation_id: c.parse().unwrap(),
                user_id: u.parse().unwrap(),
            },
            at: MemberAt {
                conversation: 0,
                user: 0,
            },
            member,
            latest_seq: Seq(latest),
            outputs,
        }
    }

    fn member(cursor: u64) -> Member {
        let mut s = PartitionState::new();
        s.apply_report(&report("x", "y", cursor));
        s.drain().remove(0).member
    }

    const PUBLIC: Outputs = Outputs {
        public: true,
        state: false,
    };

    fn up(c: &str, u: &str, cursor: u64, latest: u64) -> Change {
        let mut m = member(cursor);
        m.updated_at = 0;
        change(c, u, m, latest, PUBLIC)
    }

    fn report(c: &str, u: &str, seq: u64) -> ReadReport {
        ReadReport {
            conversation_id: c.parse().unwrap(),
            user_id: u.parse().unwrap(),
            seq: Seq(seq),
            reported_at: 0,
            private: false,
        }
    }

    type Slots = BTreeMap<i32, PartitionSlot<&'static str>>;

    fn slots_with(reports: &[(i32, ReadReport)]) -> Slots {
        let mut slots = Slots::new();
        for (p, r) in reports {
            let slot = slots
                .entry(*p)
                .or_insert_with(|| PartitionSlot::restored(PartitionState::new(), SnapshotDue::Everything));
            slot.state.apply_report(r);
            slot.processed(InputKind::ReadReports, 10);
        }
        slots
    }

    #[test]
    fn groups_changes_by_conversation() {
        let mut gone = member(0);
        gone.left = true;
        let left = change("A", "z", gone.clone(), 0, PUBLIC);
        let batches =
            group_by_conversation(&[up("B", "x", 1, 4), up("A", "y", 2, 3), left, up("B", "w", 3, 5)]);
        // In the order each conversation first appears, a repeat joining
        // its batch.
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[1].conversation_id.as_str(), "A");
        assert_eq!(batches[1].latest_seq, Seq(3));
        assert_eq!(batches[1].members.len(), 2);
        assert!(batches[1].members[1].left);
        assert_eq!(batches[0].conversation_id.as_str(), "B");
        assert_eq!(batches[0].latest_seq, Seq(5));
        let users = |b: &ConversationBatch| {
            b.members
                .iter()
                .map(|m| m.user_id.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(users(&batches[0]), ["x", "w"]);
        // A departed member's message raises the latest seq, and only that.
        let raised = change("D", "gone", gone, 9, PUBLIC);
        assert_eq!(group_by_conversation(&[raised])[0].latest_seq, Seq(9));
        assert_eq!(batches[0].members.len(), 2);
        // Private-only changes stay out of the conversation batches.
        let private = change(
            "C",
            "p",
            member(3),
            3,
            Outputs {
                public: false,
                state: true,
            },
        );
        assert!(group_by_conversation(&[private]).is_empty());
    }

    #[test]
    fn groups_private_state_by_user_and_skips_members_without_any() {
        let mut private = member(0);
        private.private_cursor = Seq(4);
        let state = Outputs {
            public: false,
            state: true,
        };
        let batches = group_by_user(&[
            change("C", "u", private.clone(), 4, state),
            change("D", "u", private, 4, state),
            change("C", "v", member(2), 2, state),
        ]);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].user_id.as_str(), "u");
        assert_eq!(batches[0].conversations.len(), 2);
    }

    /// Unread mentions and mutes are private state of their own: a change
    /// of only those is written, with the mentions above the read point.
    #[test]
    fn mentions_and_mutes_alone_make_a_private_write() {
        let state = Outputs {
            public: false,
            state: true,
        };
        let mut mentioned = member(3);
        mentioned.mentions = vec![Seq(2), Seq(5), Seq(9)];
        let mut muted = member(0);
        muted.mute = Some(Mute {
            at: 7,
            until: Mute::FOREVER,
        });
        let batches = group_by_user(&[
            change("C", "u", mentioned, 9, state),
            change("D", "u", muted, 1, state),
        ]);
        assert_eq!(batches.len(), 1);
        let [c, d] = &batches[0].conversations[..] else {
            panic!("{batches:?}");
        };
        assert_eq!((c.read_up_to, c.private_cursor), (Seq(3), Seq::ZERO));
        assert_eq!(c.mentions, [Seq(5), Seq(9)], "only those above the read point");
        assert_eq!(c.mute, None);
        assert!(d.mentions.is_empty());
        assert_eq!(d.mute.map(|m| m.until), Some(Mute::FOREVER));
    }

    /// A restored partition owes the next snapshot every key, only the
    /// keys given (a checkpoint CQL held whole, plus its tails), or nothing
    /// with CQL off.
    #[test]
    fn a_restored_partition_owes_the_snapshot_what_cql_may_lack() {
        let mut state = PartitionState::new();
        for (c, u) in [("C", "u"), ("C", "v"), ("D", "u")] {
            state.apply_report(&report(c, u, 2));
        }
        state.mark_flushed();
        let key = |c: &str, u: &str| CursorKey {
            conversation_id: c.parse().unwrap(),
            user_id: u.parse().unwrap(),
        };
        let tail: HashSet<CursorKey> = [key("C", "v")].into();
        for (due, owed) in [
            (SnapshotDue::Everything, 3),
            (SnapshotDue::Keys(tail), 1),
            (SnapshotDue::Nothing, 0),
        ] {
            let mut slots = Slots::new();
            slots.insert(0, PartitionSlot::restored(state.clone(), due.clone()));
            let plan = begin_snapshot(&mut slots, usize::MAX, usize::MAX);
            let written: Vec<_> = plan.snapshot_changes().map(|c| c.key()).collect();
            assert_eq!(written.len(), owed, "{due:?}");
            if owed == 1 {
                assert_eq!(written, [key("C", "v")]);
            }
        }
    }

    /// A partition restored from the changelog owes every key, and
    /// snapshots write it a share at a time: each about `restored_keys`
    /// (whole conversations), published keys always in full, every restored
    /// key once over the shares, and a failed share owed again.
    #[test]
    fn a_restored_partition_is_snapshotted_a_share_at_a_time() {
        let mut slots = Slots::new();
        for p in 0..2 {
            let mut state = PartitionState::new();
            for c in 0..25 {
                for u in 0..3 {
                    state.apply_report(&report(&format!("c{p}-{c}"), &format!("u{u}"), 2));
                }
            }
            state.mark_flushed();
            slots.insert(p, PartitionSlot::restored(state, SnapshotDue::Everything));
        }
        assert!(slots.values().all(|s| !s.in_cql() && s.snapshot_backlog() == 75));

        // A key published meanwhile is written whatever the share.
        slots
            .get_mut(&1)
            .unwrap()
            .state
            .apply_report(&report("new", "u", 1));
        let plan = begin(&mut slots);
        committed(&mut slots, &plan, true);

        let mut written: Vec<CursorKey> = Vec::new();
        let mut rounds = 0;
        let mut failed_once = false;
        while slots.values().any(|s| !s.in_cql()) {
            rounds += 1;
            let snap = begin_snapshot(&mut slots, usize::MAX, 20);
            let keys: Vec<CursorKey> = snap.snapshot_changes().map(|c| c.key()).collect();
            let restored = keys
                .iter()
                .filter(|k| k.conversation_id.as_str() != "new")
                .count();
            assert!(
                (20..23).contains(&restored) || slots.values().all(|s| s.resnapshot.is_none()),
                "{restored}"
            );
            if rounds == 2 && !failed_once {
                failed_once = true;
                failed(&mut slots, &snap, true);
                continue;
            }
            committed(&mut slots, &snap, true);
            written.extend(keys);
        }
        let new_key = written
            .iter()
            .filter(|k| k.conversation_id.as_str() == "new")
            .count();
        assert_eq!(new_key, 1, "the published key, in the first snapshot");
        written.retain(|k| k.conversation_id.as_str() != "new");
        let distinct: HashSet<_> = written.iter().cloned().collect();
        assert_eq!(written.len(), 150, "every restored key once");
        assert_eq!(distinct.len(), 150);
        assert_eq!(rounds, 9, "8 shares of 21 (7 conversations), one failed");
        assert!(slots.values().all(|s| s.snapshot_backlog() == 0));
    }

    /// Published keys go to CQL in passes: a pass takes what was published
    /// before it began, a share per snapshot, and what is published
    /// meanwhile waits for the next pass.
    #[test]
    fn published_keys_go_in_passes_of_shares() {
        let reports: Vec<(i32, ReadReport)> =
            (0..10).map(|u| (0, report("C", &format!("u{u}"), 3))).collect();
        let mut slots = slots_with(&reports);
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        assert_eq!(slots[&0].unsnapshotted.len(), 10);

        let first = begin_snapshot(&mut slots, 4, 0);
        assert!(first.opens_pass);
        assert_eq!(first.snapshot_changes().count(), 4);
        committed(&mut slots, &first, true);
        assert!(!pass_done(&slots));
        // Published during the pass: the next pass's.
        slots
            .get_mut(&0)
            .unwrap()
            .state
            .apply_report(&report("C", "late", 1));
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        let mut written: HashSet<CursorKey> = first.snapshot_changes().map(|c| c.key()).collect();
        for share in [4, 2] {
            let snap = begin_snapshot(&mut slots, 4, 0);
            assert!(!snap.opens_pass);
            assert_eq!(snap.snapshot_changes().count(), share);
            written.extend(snap.snapshot_changes().map(|c| c.key()));
            committed(&mut slots, &snap, true);
        }
        assert!(pass_done(&slots));
        assert_eq!(written.len(), 10);
        assert!(written.iter().all(|k| k.user_id.as_str() != "late"));
        let next = begin_snapshot(&mut slots, 4, 0);
        assert!(next.opens_pass);
        let keys: Vec<CursorKey> = next.snapshot_changes().map(|c| c.key()).collect();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].user_id.as_str(), "late");
    }

    /// A failed snapshot's share goes back only to the slot it was taken
    /// from: a partition restored again meanwhile numbers its members
    /// anew, and owes what its own restore says.
    #[test]
    fn a_failed_share_is_not_given_back_to_a_partition_restored_again() {
        let mut state = PartitionState::new();
        for c in 0..10 {
            state.apply_report(&report(&format!("c{c}"), "u", 2));
        }
        state.mark_flushed();
        let mut slots = Slots::new();
        slots.insert(0, PartitionSlot::restored(state.clone(), SnapshotDue::Everything));
        let p = {
            let slot = slots.get_mut(&0).unwrap();
            slot.state.apply_report(&report("c0", "v", 1));
            begin(&mut slots)
        };
        committed(&mut slots, &p, true);
        let snap = begin_snapshot(&mut slots, usize::MAX, 3);
        assert_eq!(snap.snapshot_changes().count(), 4);
        slots.insert(
            0,
            PartitionSlot::restored(state, SnapshotDue::Keys(HashSet::new())),
        );
        failed(&mut slots, &snap, false);
        assert!(slots[&0].in_cql(), "{:?}", slots[&0].resnapshot);
        // The same slot takes them back.
        let mut slots = Slots::new();
        let mut state = PartitionState::new();
        state.apply_report(&report("c", "u", 2));
        slots.insert(0, PartitionSlot::restored(state, SnapshotDue::Everything));
        let snap = begin_snapshot(&mut slots, usize::MAX, 3);
        assert!(slots[&0].in_cql());
        failed(&mut slots, &snap, true);
        assert_eq!(slots[&0].snapshot_backlog(), 1);
    }

    #[test]
    fn a_plan_covers_every_dirty_key_offset_and_dead_letter_once() {
        let mut slots = slots_with(&[
            (0, report("C", "u", 3)),
            (0, report("C", "v", 2)),
            (1, report("D", "u", 1)),
        ]);
        slots.get_mut(&1).unwrap().dead_letters.push("bad");
        slots.insert(
            2,
            PartitionSlot::restored(PartitionState::new(), SnapshotDue::Everything),
        );
        let plan = begin(&mut slots);
        assert_eq!(plan.partitions, [0, 1], "partition 2 has nothing to do");
        assert_eq!(plan.changes.len(), 3);
        assert_eq!(plan.dead_letters, [(1, "bad")]);
        assert_eq!(
            plan.offsets,
            [(InputKind::ReadReports, 0, 11), (InputKind::ReadReports, 1, 11)]
        );
        assert!(plan.snapshot.is_none());
        assert!(plan.needs_transaction());
        assert!(
            slots.values().all(|s| !s.has_work()),
            "the plan took the work out of the slots"
        );
        assert!(begin(&mut slots).is_empty());
    }

    #[test]
    fn a_failed_flush_gives_its_work_back_and_is_planned_again_with_newer_values() {
        let mut slots = slots_with(&[(0, report("C", "u", 3)), (0, report("C", "v", 1))]);
        slots.get_mut(&0).unwrap().dead_letters.push("first");
        let first = begin(&mut slots);
        // In flight; more input arrives, for one of the keys.
        let slot = slots.get_mut(&0).unwrap();
        slot.state.apply_report(&report("C", "u", 7));
        slot.processed(InputKind::ReadReports, 20);
        slot.dead_letters.push("second");
        failed(&mut slots, &first, true);
        let slot = &slots[&0];
        assert_eq!(slot.state.dirty_len(), 2, "both keys are dirty again");
        assert_eq!(slot.dead_letters, ["first", "second"], "in input order");
        assert_eq!(
            slot.offsets[&InputKind::ReadReports],
            21,
            "newer input moved the offset on"
        );
        let second = begin(&mut slots);
        let mut changes = second.changes.clone();
        changes.sort_by(|a, b| a.1.key.user_id.cmp(&b.1.key.user_id));
        // Where the state holds them is not the point here.
        for (_, change) in &mut changes {
            change.at = up("C", "u", 7, 0).at;
        }
        assert_eq!(changes, [(0, up("C", "u", 7, 0)), (0, up("C", "v", 1, 0))]);
    }

    #[test]
    fn a_flush_takes_thread_changes_and_a_failed_one_gives_them_back() {
        use crate::fold::{ConversationEvent, EventKind, ThreadReadReport};
        let mut slots = slots_with(&[]);
        let slot = slots
            .entry(0)
            .or_insert_with(|| PartitionSlot::restored(PartitionState::new(), SnapshotDue::Everything));
        slot.state.apply_event(&ConversationEvent {
            conversation_id: "C".parse().unwrap(),
            seq: Seq(1),
            at: 1,
            kind: EventKind::ReplySent {
                thread: Seq(1),
                thread_seq: Seq(1),
                sender_id: "u".parse().unwrap(),
                mentions: Vec::new(),
                starter_id: None,
            },
        });
        slot.state.apply_thread_read(&ThreadReadReport {
            conversation_id: "C".parse().unwrap(),
            thread: Seq(1),
            user_id: "v".parse().unwrap(),
            seq: Seq(1),
            reported_at: 2,
            private: true,
        });
        assert!(slot.has_work(), "thread changes alone are work");
        let first = begin(&mut slots);
        assert_eq!((first.thread_changes.len(), first.thread_states.len()), (2, 1));
        assert!(first.needs_transaction());
        assert!(!slots[&0].has_work());
        failed(&mut slots, &first, true);
        let again = begin(&mut slots);
        let outputs = |plan: &FlushPlan<&str>| {
            let mut o: Vec<_> = plan
                .thread_changes
                .iter()
                .map(|(_, c)| (c.key.user_id.to_string(), c.outputs))
                .collect();
            o.sort_by(|a, b| a.0.cmp(&b.0));
            o
        };
        assert_eq!(outputs(&again), outputs(&first));
        assert_eq!(again.thread_states, first.thread_states);
    }

    #[test]
    fn published_threads_are_snapshotted_whole_and_a_failed_share_is_given_back() {
        use crate::fold::{ConversationEvent, EventKind, ThreadReadReport};
        let mut slots: Slots = BTreeMap::new();
        let slot = slots
            .entry(0)
            .or_insert_with(|| PartitionSlot::restored(PartitionState::new(), SnapshotDue::Everything));
        for (thread, sender) in [(1, "u"), (2, "w")] {
            slot.state.apply_event(&ConversationEvent {
                conversation_id: "C".parse().unwrap(),
                seq: Seq(2),
                at: thread,
                kind: EventKind::ReplySent {
                    thread: Seq(thread as u64),
                    thread_seq: Seq(1),
                    sender_id: sender.parse().unwrap(),
                    mentions: Vec::new(),
                    starter_id: None,
                },
            });
        }
        let flush = begin(&mut slots);
        committed(&mut slots, &flush, true);
        assert_eq!(slots[&0].unsnapshotted_threads.len(), 2);
        assert!(!slots[&0].in_cql(), "CQL owes the threads");
        // Thread 1 moves again: only its reader's change is published, but
        // the snapshot writes every follower of it.
        slots
            .get_mut(&0)
            .unwrap()
            .state
            .apply_thread_read(&ThreadReadReport {
                conversation_id: "C".parse().unwrap(),
                thread: Seq(1),
                user_id: "v".parse().unwrap(),
                seq: Seq(1),
                reported_at: 3,
                private: false,
            });
        let flush = begin(&mut slots);
        assert_eq!(flush.thread_changes.len(), 1);
        committed(&mut slots, &flush, true);
        // A budget of one follower takes one thread a share.
        let first = begin_snapshot(&mut slots, 1, 0);
        assert_eq!(first.thread_snapshot.len(), 1, "thread 2's one follower");
        assert!(first
            .thread_snapshot
            .iter()
            .all(|c| c.outputs.public && c.outputs.state));
        assert!(first.opens_pass && !pass_done(&slots));
        failed(&mut slots, &first, true);
        let again = begin_snapshot(&mut slots, usize::MAX, 0);
        let mut keys: Vec<_> = again
            .thread_snapshot
            .iter()
            .map(|c| (c.key.thread.get(), c.key.user_id.to_string()))
            .collect();
        keys.sort();
        assert_eq!(keys, [(1, "u".into()), (1, "v".into()), (2, "w".into())]);
        committed(&mut slots, &again, true);
        assert!(pass_done(&slots) && slots[&0].in_cql());
        assert!(begin_snapshot(&mut slots, usize::MAX, usize::MAX).is_empty());
    }

    #[test]
    fn a_failed_flush_keeps_its_offset_when_nothing_newer_arrived() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        let first = begin(&mut slots);
        failed(&mut slots, &first, true);
        assert_eq!(slots[&0].offsets[&InputKind::ReadReports], 11);
    }

    #[test]
    fn after_a_rebalance_a_failed_flush_gives_back_state_but_not_input_progress() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        slots.get_mut(&0).unwrap().dead_letters.push("bad");
        let first = begin(&mut slots);
        slots.get_mut(&0).unwrap().forget_uncommitted();
        failed(&mut slots, &first, false);
        let slot = &slots[&0];
        assert_eq!(slot.state.dirty_len(), 1, "the fold is idempotent: state stays");
        assert!(slot.offsets.is_empty() && slot.dead_letters.is_empty());
    }

    #[test]
    fn a_failed_flush_skips_partitions_no_longer_held() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        let first = begin(&mut slots);
        slots.clear();
        failed(&mut slots, &first, true);
        assert!(slots.is_empty());
    }

    /// The consumer protocol released partition 0 and gave it back while
    /// the flush was in flight: the new slot reads its input again from the
    /// committed offsets, so nothing of the old one's progress comes back;
    /// partition 1, held throughout, gets its offset and dead letter back.
    #[test]
    fn a_failed_flush_gives_no_progress_back_to_a_partition_restored_anew() {
        let mut slots = slots_with(&[(0, report("C", "u", 3)), (1, report("D", "u", 2))]);
        for slot in slots.values_mut() {
            slot.dead_letters.push("bad");
        }
        let first = begin(&mut slots);
        slots.insert(
            0,
            PartitionSlot::restored(PartitionState::new(), SnapshotDue::Nothing),
        );
        failed(&mut slots, &first, true);
        assert!(slots[&0].offsets.is_empty() && slots[&0].dead_letters.is_empty());
        assert_eq!(slots[&1].offsets[&InputKind::ReadReports], 11);
        assert_eq!(slots[&1].dead_letters, ["bad"]);
    }

    /// A flush that commits after its partition was restored again adds
    /// nothing to the new slot: its member numbers were the old state's.
    #[test]
    fn a_flush_committed_after_a_restore_adds_no_old_numbers() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        let p = begin(&mut slots);
        slots.insert(
            0,
            PartitionSlot::restored(PartitionState::new(), SnapshotDue::Keys(HashSet::new())),
        );
        committed(&mut slots, &p, true);
        assert!(slots[&0].in_cql());
    }

    #[test]
    fn commit_clears_work_and_tracks_keys_until_the_next_snapshot() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        slots.get_mut(&0).unwrap().unsnapshotted.clear();
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        let slot = &slots[&0];
        assert!(!slot.has_work());
        assert_eq!(slot.unsnapshotted.len(), 1, "published, not yet in CQL");

        // The snapshot tick writes the backlog although nothing is dirty.
        let snap = begin_snapshot(&mut slots, usize::MAX, usize::MAX);
        assert_eq!(snap.partitions, [0]);
        assert!(snap.changes.is_empty());
        assert_eq!(snap.snapshot.as_ref().unwrap().len(), 1);
        assert!(
            !snap.needs_transaction(),
            "a snapshot-only flush has nothing for Kafka"
        );
        assert_eq!(snap.snapshot_changes().count(), 1);
        committed(&mut slots, &snap, true);
        assert!(slots[&0].unsnapshotted.is_empty());
        assert!(begin_snapshot(&mut slots, usize::MAX, usize::MAX).is_empty());
    }

    #[test]
    fn a_failed_snapshot_gives_its_backlog_back() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        slots.get_mut(&0).unwrap().unsnapshotted.clear();
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        let snap = begin_snapshot(&mut slots, usize::MAX, usize::MAX);
        assert!(snap.opens_pass);
        assert_eq!(slots[&0].owes_published(), 0, "taken by the snapshot");
        failed(&mut slots, &snap, true);
        assert_eq!(slots[&0].snapshotting.len(), 1, "back in the pass");
        assert!(!pass_done(&slots));
        assert_eq!(
            begin_snapshot(&mut slots, usize::MAX, usize::MAX)
                .snapshot_changes()
                .count(),
            1
        );
    }

    #[test]
    fn a_snapshot_on_its_own_takes_the_published_keys_only() {
        let mut slots = slots_with(&[(0, report("C", "u", 3)), (1, report("D", "u", 1))]);
        for slot in slots.values_mut() {
            slot.unsnapshotted.clear();
        }
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        slots
            .get_mut(&0)
            .unwrap()
            .state
            .apply_report(&report("C", "v", 2));
        let snap = begin_snapshot(&mut slots, usize::MAX, usize::MAX);
        assert_eq!(snap.partitions, [0, 1]);
        assert!(snap.changes.is_empty() && !snap.needs_transaction());
        let keys: Vec<&str> = snap.snapshot_changes().map(|c| c.key.user_id.as_str()).collect();
        assert_eq!(keys, ["u", "u"], "v is not published yet: its flush adds it");
        assert!(slots[&0].has_work(), "the changelog's work stays");
        failed(&mut slots, &snap, true);
        assert_eq!(slots[&0].owes_published(), 1, "given back");
        let snap = begin_snapshot(&mut slots, usize::MAX, usize::MAX);
        assert!(!snap.opens_pass, "the pass goes on");
        committed(&mut slots, &snap, true);
        assert!(slots.values().all(|s| s.owes_published() == 0));
        assert!(pass_done(&slots));
        assert!(begin_snapshot(&mut slots, usize::MAX, usize::MAX).is_empty());
    }

    #[test]
    fn a_snapshot_writes_the_whole_state_of_a_key_only_partly_published() {
        // A private receipt published by one flush, then a public one by
        // the next: the snapshot gives CQL both.
        let mut slots = slots_with(&[(0, report("C", "u", 1))]);
        slots.get_mut(&0).unwrap().unsnapshotted.clear();
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        let private = ReadReport {
            private: true,
            ..report("C", "u", 5)
        };
        slots.get_mut(&0).unwrap().state.apply_report(&private);
        let p = begin(&mut slots);
        committed(&mut slots, &p, true);
        slots
            .get_mut(&0)
            .unwrap()
            .state
            .apply_report(&report("C", "u", 2));
        let p = begin(&mut slots);
        assert!(
            !p.changes[0].1.outputs.state,
            "the dirty change itself is public only"
        );
        committed(&mut slots, &p, true);
        let snap = begin_snapshot(&mut slots, usize::MAX, usize::MAX);
        let cql: Vec<&Change> = snap.snapshot_changes().collect();
        assert_eq!(cql.len(), 1);
        assert!(
            cql[0].outputs.public && cql[0].outputs.state,
            "the snapshot carries both"
        );
        assert_eq!(cql[0].member.private_cursor, Seq(5));
    }

    #[test]
    fn without_snapshots_nothing_is_tracked() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        slots.get_mut(&0).unwrap().unsnapshotted.clear();
        let p = begin(&mut slots);
        committed(&mut slots, &p, false);
        assert!(slots[&0].unsnapshotted.is_empty());
    }

    #[test]
    fn a_revoked_slot_forgets_offsets_and_dead_letters_but_keeps_state() {
        let mut slots = slots_with(&[(0, report("C", "u", 3))]);
        let slot = slots.get_mut(&0).unwrap();
        slot.dead_letters.push("bad");
        slot.forget_uncommitted();
        assert!(slot.offsets.is_empty() && slot.dead_letters.is_empty());
        assert_eq!(slot.state.dirty_len(), 1);
    }

    #[test]
    fn backpressure_starts_at_four_times_the_bound() {
        assert!(!over_bound(199, 50));
        assert!(over_bound(200, 50));
        assert!(!over_bound(usize::MAX - 1, usize::MAX));
    }
}
