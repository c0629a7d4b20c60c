//! Threads: replies to a message, numbered on their own, with a cursor per
//! (conversation, thread, follower).
//!
//! A thread is named by its root message's seq. Its replies are numbered
//! `thread_seq` 1, 2, 3, ... upstream, so unread in a thread is
//! `latest - cursor` as in the conversation, whose seqs and cursors replies
//! never touch. A thread keeps cursors only for its *followers*: members
//! who started it, replied, were mentioned in a reply or read in it. Memory
//! grows with participation, not with threads times members.
//!
//! Join points. A reply carries the conversation's latest seq and its time,
//! `(seq, at)`, as a membership event does ([`MembershipVersion`]); a member
//! whose join is ordered after a reply is not one of its possible readers.
//! Conversation events of one conversation are in one partition, in order,
//! so the fold sees every join between two replies: a thread keeps a mark
//! only at a reply that follows a membership change, and a follower's
//! first readable reply (their `join_seq` in the thread) is the first mark
//! ordered at or after their join. Most threads keep one mark.
//!
//! Departures: a member who left is in no thread. Their follower entries
//! stay (hidden), as the conversation keeps a departed member's cursor: the
//! two inputs are not ordered against each other, so a read reported
//! before a leave may arrive after it, and the result must not depend on
//! that.

use std::collections::HashMap;

use crate::domain::{ConversationId, Seq, UserId};
use crate::read_model::{ConversationView, MemberCursor};

use super::members::{Members, UserTable};
use super::{advance, Extras, MembershipVersion, Outputs};

/// A validated read report in a thread: the user has seen every reply with
/// `thread_seq <= seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadReadReport {
    pub conversation_id: ConversationId,
    /// The root message's seq.
    pub thread: Seq,
    pub user_id: UserId,
    /// The highest reply read, by thread_seq.
    pub seq: Seq,
    pub reported_at: i64,
    /// A private receipt: moves only the private thread cursor.
    pub private: bool,
}

/// The identity of one thread cursor.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct ThreadKey {
    pub conversation_id: ConversationId,
    pub thread: Seq,
    pub user_id: UserId,
}

/// A thread held by one state, by conversation number (see
/// [`MemberAt`](super::MemberAt): numbers are the state's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadAt {
    pub conversation: u32,
    pub thread: Seq,
}

/// A reply that follows a membership change: members whose join is
/// ordered at or before `version` can read replies from `thread_seq` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ThreadMark {
    pub thread_seq: Seq,
    pub version: MembershipVersion,
}

/// What a flush publishes for one changed follower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadChange {
    pub key: ThreadKey,
    /// Has read every reply with thread_seq <= cursor, as others see it;
    /// never below `join_seq - 1` (replies before their join are not unread).
    pub cursor: Seq,
    /// Highest private receipt in the thread.
    pub private_cursor: Seq,
    /// First reply the follower could read.
    pub join_seq: Seq,
    /// The thread's latest reply when the change was taken.
    pub latest_seq: Seq,
    /// False once the member left the conversation: a tombstone publicly.
    pub present: bool,
    /// The member's membership epoch (see [`ThreadFollower::epoch`]).
    pub epoch: u64,
    pub updated_at: i64,
    pub outputs: Outputs,
}

/// unread in a thread as the follower's own devices count it.
pub fn own_unread(latest: Seq, cursor: Seq, private_cursor: Seq) -> u64 {
    latest.get().saturating_sub(cursor.max(private_cursor).get())
}

/// What only readfold keeps of a thread (the thread-state record): enough
/// to place later followers' join points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadStateChange {
    pub conversation_id: ConversationId,
    pub thread: Seq,
    pub latest_seq: Seq,
    /// The latest reply's `(seq, at)`.
    pub last_reply: Option<MembershipVersion>,
    pub marks: Vec<ThreadMark>,
}

/// One follower of one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Follower {
    user: u32,
    cursor: Seq,
    private_cursor: Seq,
    updated_at: i64,
    dirty: Outputs,
}

/// One thread of a conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Thread {
    /// Highest reply seen.
    latest: Seq,
    last_reply: Option<MembershipVersion>,
    marks: Vec<ThreadMark>,
    /// By user number, ascending.
    followers: Vec<Follower>,
    /// The latest reply a present follower's public record carried last:
    /// see [`Threads::carry_latest`].
    carried: Seq,
    /// Whether latest, last_reply or marks changed since the last flush.
    state_dirty: bool,
    /// Whether the thread is on the dirty list.
    listed_dirty: bool,
}

impl Thread {
    /// The first reply a member whose membership is `version` can read.
    fn join_seq(&self, version: Option<MembershipVersion>) -> Seq {
        let Some(joined) = version else {
            return Seq(1);
        };
        let at = self.marks.partition_point(|m| m.version < joined);
        match self.marks.get(at) {
            _ if at == 0 => Seq(1),
            Some(mark) => mark.thread_seq,
            None => Seq(self.latest.get() + 1),
        }
    }

    fn follower_position(&self, user: u32) -> Result<usize, usize> {
        self.followers.binary_search_by_key(&user, |f| f.user)
    }

    /// The position of follower `user`, created (at cursor 0) if new, and
    /// whether new. Touching a follower raises its `updated_at`.
    fn follower(&mut self, user: u32, at: i64) -> (usize, bool) {
        let (position, created) = match self.follower_position(user) {
            Ok(p) => (p, false),
            Err(p) => {
                self.followers.insert(
                    p,
                    Follower {
                        user,
                        cursor: Seq::ZERO,
                        private_cursor: Seq::ZERO,
                        updated_at: at,
                        dirty: Outputs::default(),
                    },
                );
                (p, true)
            }
        };
        let follower = &mut self.followers[position];
        follower.updated_at = follower.updated_at.max(at);
        (position, created)
    }
}

/// The threads of one conversation that has any.
#[derive(Clone, Debug, Default)]
pub(super) struct Threads {
    by_root: HashMap<Seq, Thread, foldhash::fast::RandomState>,
    /// The highest membership version applied in the conversation, once
    /// known: a reply after a higher one than the thread's last reply
    /// gets a mark. Unknown after a restore until the next reply asks.
    membership_high: Option<Option<MembershipVersion>>,
}

/// A member's membership, as the conversation holds it.
#[derive(Clone, Copy, Default)]
struct Membership {
    version: Option<MembershipVersion>,
    left: bool,
    /// Membership events applied (see `Member::epoch`).
    epoch: u64,
}

/// `user`'s membership; the default for a member not held.
fn membership(members: &Members, extras: &Extras, user: u32) -> Membership {
    members
        .get(user)
        .map(|slot| {
            let member = slot.load(extras);
            Membership {
                version: member.membership,
                left: member.left,
                epoch: member.epoch,
            }
        })
        .unwrap_or_default()
}

/// The list of threads with a dirty follower or state, each once.
#[derive(Clone, Debug, Default)]
pub(super) struct ThreadDirty {
    threads: Vec<(u32, Seq)>,
    untracked: bool,
}

impl ThreadDirty {
    pub(super) fn untracked() -> Self {
        ThreadDirty {
            untracked: true,
            ..Self::default()
        }
    }

    fn mark_follower(
        &mut self,
        number: u32,
        root: Seq,
        thread: &mut Thread,
        position: usize,
        outputs: Outputs,
    ) {
        if self.untracked || !outputs.any() {
            return;
        }
        let follower = &mut thread.followers[position];
        follower.dirty = follower.dirty.union(outputs);
        self.list(number, root, thread);
    }

    fn mark_state(&mut self, number: u32, root: Seq, thread: &mut Thread) {
        if self.untracked {
            return;
        }
        thread.state_dirty = true;
        self.list(number, root, thread);
    }

    fn list(&mut self, number: u32, root: Seq, thread: &mut Thread) {
        if !std::mem::replace(&mut thread.listed_dirty, true) {
            self.threads.push((number, root));
        }
    }
}

/// A reply, as the fold takes it from a `ConversationEvent`.
pub(super) struct Reply<'a> {
    pub thread: Seq,
    pub thread_seq: Seq,
    pub version: MembershipVersion,
    pub sender: &'a UserId,
    pub starter: Option<&'a UserId>,
    pub mentions: &'a [UserId],
}

/// The parts of a partition's state the thread fold works on, for one
/// conversation.
pub(super) struct ThreadsOf<'a> {
    pub number: u32,
    /// Every conversation's threads, by number.
    pub threads: &'a mut HashMap<u32, Threads, foldhash::fast::RandomState>,
    pub members: &'a Members,
    pub users: &'a mut UserTable,
    pub extras: &'a Extras,
    pub dirty: &'a mut ThreadDirty,
}

impl ThreadsOf<'_> {
    /// Folds a thread read. Returns whether a cursor moved or the reader
    /// became a follower.
    pub(super) fn read(&mut self, report: &ThreadReadReport) -> bool {
        let user = self.users.intern(&report.user_id);
        let threads = self.threads.entry(self.number).or_default();
        let thread = threads.by_root.entry(report.thread).or_default();
        let (position, created) = thread.follower(user, report.reported_at);
        let follower = &mut thread.followers[position];
        let (moved, outputs) = if report.private {
            (advance(&mut follower.private_cursor, report.seq), Outputs::STATE)
        } else {
            (advance(&mut follower.cursor, report.seq), Outputs::PUBLIC)
        };
        if moved || created {
            self.dirty
                .mark_follower(self.number, report.thread, thread, position, outputs);
        }
        moved || created
    }

    /// Folds a reply: the thread's latest, a mark if a membership change
    /// came since its last reply, and its followers (the sender, whose
    /// cursor follows their reply; the starter; those mentioned who had
    /// joined by then and are present).
    pub(super) fn reply(&mut self, reply: &Reply<'_>) -> bool {
        let (members, extras) = (self.members, self.extras);
        let sender = self.users.intern(reply.sender);
        let starter = reply.starter.map(|s| self.users.intern(s));
        let mentioned: Vec<u32> = reply
            .mentions
            .iter()
            .filter_map(|u| self.users.find(u))
            .filter(|&u| {
                let m = membership(members, extras, u);
                !m.left && m.version.is_some_and(|v| v <= reply.version)
            })
            .collect();
        let (number, dirty) = (self.number, &mut *self.dirty);
        let threads = self.threads.entry(number).or_default();
        let high = *threads
            .membership_high
            .get_or_insert_with(|| members.iter().filter_map(|s| s.load(extras).membership).max());
        let thread = threads.by_root.entry(reply.thread).or_default();
        let mut changed = false;
        if reply.thread_seq > thread.latest {
            let after_change = thread.last_reply.is_none_or(|last| high > Some(last));
            if thread.marks.is_empty() || after_change {
                thread.marks.push(ThreadMark {
                    thread_seq: reply.thread_seq,
                    version: reply.version,
                });
            }
            thread.latest = reply.thread_seq;
            thread.last_reply = Some(reply.version);
            dirty.mark_state(number, reply.thread, thread);
            changed = true;
        }
        let at = reply.version.at;
        // The sender's record carries the new latest to the stores.
        let (position, created) = thread.follower(sender, at);
        let moved = advance(&mut thread.followers[position].cursor, reply.thread_seq);
        if moved || created || changed {
            dirty.mark_follower(number, reply.thread, thread, position, Outputs::PUBLIC);
        }
        for user in starter.into_iter().chain(mentioned) {
            let (position, created) = thread.follower(user, at);
            if created {
                dirty.mark_follower(number, reply.thread, thread, position, Outputs::PUBLIC);
            }
        }
        changed || moved || created
    }

    /// After a membership event was applied to `user`: their join point in
    /// every thread may have moved, and a departure hides them (their
    /// cursors then live only in the thread-state records).
    pub(super) fn membership_changed(&mut self, user: &UserId, version: MembershipVersion, left: bool) {
        let Some(threads) = self.threads.get_mut(&self.number) else {
            return;
        };
        if let Some(high) = &mut threads.membership_high {
            *high = (*high).max(Some(version));
        }
        let Some(user) = self.users.find(user) else {
            return;
        };
        let outputs = if left { Outputs::BOTH } else { Outputs::PUBLIC };
        for (&root, thread) in &mut threads.by_root {
            if let Ok(position) = thread.follower_position(user) {
                self.dirty
                    .mark_follower(self.number, root, thread, position, outputs);
            }
        }
    }
}

impl Threads {
    /// Number of threads and of follower entries held.
    pub(super) fn counts(&self) -> (usize, usize) {
        let followers = self.by_root.values().map(|t| t.followers.len()).sum();
        (self.by_root.len(), followers)
    }

    /// The roots of the threads held, in no order.
    pub(super) fn roots(&self) -> impl Iterator<Item = Seq> + '_ {
        self.by_root.keys().copied()
    }

    /// Marks follower `user` of thread `root` dirty again, if held.
    pub(super) fn redirty_follower(
        &mut self,
        dirty: &mut ThreadDirty,
        number: u32,
        root: Seq,
        user: u32,
        outputs: Outputs,
    ) {
        let Some(thread) = self.by_root.get_mut(&root) else {
            return;
        };
        if outputs.public {
            // What the failed flush carried was never published: the next
            // one carries the latest reply again, on whoever is present.
            thread.carried = Seq::ZERO;
        }
        if let Ok(position) = thread.follower_position(user) {
            dirty.mark_follower(number, root, thread, position, outputs);
        }
    }

    /// Before a flush: a thread's latest reply must reach the public thread
    /// topic on a present follower's record, for readers that follow latest
    /// replies there (the badge stage). The sender's record carries it,
    /// unless the sender left before the flush (a tombstone), or no
    /// follower was present then: the lowest user id's among the present
    /// followers does, the same however the state is held.
    pub(super) fn carry_latest(
        &mut self,
        dirty: &mut ThreadDirty,
        number: u32,
        root: Seq,
        (members, extras, users): (&Members, &Extras, &UserTable),
    ) {
        let Some(thread) = self.by_root.get_mut(&root) else {
            return;
        };
        if thread.latest <= thread.carried {
            return;
        }
        let present = |f: &Follower| !membership(members, extras, f.user).left;
        if thread.followers.iter().any(|f| f.dirty.public && present(f)) {
            return;
        }
        let carrier = thread
            .followers
            .iter()
            .enumerate()
            .filter(|(_, f)| present(f))
            .min_by(|(_, a), (_, b)| users.id(a.user).cmp(users.id(b.user)))
            .map(|(position, _)| position);
        if let Some(position) = carrier {
            dirty.mark_follower(number, root, thread, position, Outputs::PUBLIC);
        }
    }

    /// Marks thread `root`'s own state dirty again, if held.
    pub(super) fn redirty_state(&mut self, dirty: &mut ThreadDirty, number: u32, root: Seq) {
        if let Some(thread) = self.by_root.get_mut(&root) {
            dirty.mark_state(number, root, thread);
        }
    }

    /// Clears the dirty flags of thread `root` after a flush took its
    /// changes (and [`Threads::taken`] kept what they carried).
    pub(super) fn clear_dirty(&mut self, root: Seq) {
        let Some(thread) = self.by_root.get_mut(&root) else {
            return;
        };
        thread.state_dirty = false;
        thread.listed_dirty = false;
        for f in &mut thread.followers {
            f.dirty = Outputs::default();
        }
    }

    /// After [`ThreadsRef::pending`] took thread `root`'s dirty followers'
    /// changes (`taken`, in follower order): a present follower keeps the
    /// floor their record carries (`join_seq - 1`) as their own cursor, so
    /// that a restore that replays those records holds it too, even after
    /// they leave; and the thread remembers the latest reply carried on a
    /// public record (see [`Threads::carry_latest`]).
    pub(super) fn taken(&mut self, root: Seq, taken: &[ThreadChange]) {
        let Some(thread) = self.by_root.get_mut(&root) else {
            return;
        };
        let mut taken = taken.iter();
        for f in thread.followers.iter_mut().filter(|f| f.dirty.any()) {
            let Some(change) = taken.next() else {
                break;
            };
            if change.present {
                advance(&mut f.cursor, change.cursor);
                if change.outputs.public {
                    thread.carried = thread.latest;
                }
            }
        }
    }

    /// Applies a public thread-cursor record (restore): the follower's
    /// cursor and the thread's latest reply, max-merged.
    pub(super) fn restore_cursor(&mut self, root: Seq, user: u32, cursor: Seq, latest: Seq, at: i64) {
        self.membership_high = None;
        let thread = self.by_root.entry(root).or_default();
        thread.latest = thread.latest.max(latest);
        thread.carried = thread.carried.max(latest);
        let (position, _) = thread.follower(user, at);
        advance(&mut thread.followers[position].cursor, cursor);
    }

    /// Applies a follower's thread-state record (restore, after the public
    /// ones): both cursors, max-merged.
    pub(super) fn restore_follower(
        &mut self,
        root: Seq,
        user: u32,
        cursor: Seq,
        private_cursor: Seq,
        at: i64,
    ) {
        self.membership_high = None;
        let thread = self.by_root.entry(root).or_default();
        let (position, _) = thread.follower(user, at);
        let follower = &mut thread.followers[position];
        advance(&mut follower.cursor, cursor);
        advance(&mut follower.private_cursor, private_cursor);
    }

    /// Applies a thread's state record (restore): the latest record of a
    /// thread holds its marks whole.
    pub(super) fn restore_state(&mut self, state: &ThreadStateChange) {
        self.membership_high = None;
        let thread = self.by_root.entry(state.thread).or_default();
        thread.latest = thread.latest.max(state.latest_seq);
        if state.last_reply >= thread.last_reply {
            thread.last_reply = state.last_reply;
            thread.marks = state.marks.clone();
        }
    }
}

/// Reading a conversation's threads.
pub struct ThreadsRef<'a> {
    pub(super) threads: Option<&'a Threads>,
    pub(super) members: &'a Members,
    pub(super) users: &'a UserTable,
    pub(super) extras: &'a Extras,
}

/// One thread, as its followers' devices and the read model see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadView {
    pub latest_seq: Seq,
    pub marks: Vec<ThreadMark>,
    /// Every follower entry, present or not, ordered by user id.
    pub followers: Vec<(UserId, ThreadFollower)>,
}

/// One follower entry of a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadFollower {
    /// The public cursor, as published (never below `join_seq - 1`).
    pub cursor: Seq,
    pub private_cursor: Seq,
    pub join_seq: Seq,
    /// Whether the member is in the conversation.
    pub present: bool,
    /// The member's membership epoch, which orders departures and rejoins
    /// in the stores (as a conversation's cursors are ordered).
    pub epoch: u64,
}

impl ThreadView {
    /// The thread as the read model reads a conversation: its latest reply
    /// and its present followers, so that "N read" and who-read of reply S
    /// sent by U are the conversation's rules over thread seqs.
    pub fn conversation_view(&self) -> ConversationView {
        ConversationView {
            latest_seq: self.latest_seq,
            members: self
                .followers
                .iter()
                .filter(|(_, f)| f.present)
                .map(|(u, f)| {
                    (
                        u.clone(),
                        MemberCursor {
                            cursor: f.cursor,
                            delivered: f.cursor,
                            join_seq: f.join_seq,
                        },
                    )
                })
                .collect(),
        }
    }
}

impl<'a> ThreadsRef<'a> {
    /// The roots of the conversation's threads, ascending.
    pub fn roots(&self) -> Vec<Seq> {
        let mut roots: Vec<Seq> = self
            .threads
            .map_or_else(Vec::new, |t| t.by_root.keys().copied().collect());
        roots.sort();
        roots
    }

    pub fn thread(&self, root: Seq) -> Option<ThreadView> {
        let thread = self.threads?.by_root.get(&root)?;
        let mut followers: Vec<(UserId, ThreadFollower)> = thread
            .followers
            .iter()
            .map(|f| (self.users.id(f.user).clone(), self.follower(thread, f)))
            .collect();
        followers.sort_by(|a, b| a.0.cmp(&b.0));
        Some(ThreadView {
            latest_seq: thread.latest,
            marks: thread.marks.clone(),
            followers,
        })
    }

    fn follower(&self, thread: &Thread, f: &Follower) -> ThreadFollower {
        let Membership { version, left, epoch } = membership(self.members, self.extras, f.user);
        let join_seq = thread.join_seq(version);
        // A departed member's entry keeps its own cursor (the thread-state
        // record carries it): their join point is then a rejoin's to set.
        let floor = if left { Seq::ZERO } else { Seq(join_seq.get() - 1) };
        ThreadFollower {
            cursor: f.cursor.max(floor),
            private_cursor: f.private_cursor,
            join_seq,
            present: !left,
            epoch,
        }
    }

    /// The sum of `user`'s own unread over the threads they follow (and
    /// are present in): what the conversation's thread badge shows.
    pub fn unread_sum(&self, user: &UserId) -> u64 {
        let (Some(threads), Some(index)) = (self.threads, self.users.find(user)) else {
            return 0;
        };
        threads
            .by_root
            .values()
            .filter_map(|t| {
                let f = &t.followers[t.follower_position(index).ok()?];
                let f = self.follower(t, f);
                f.present
                    .then(|| own_unread(t.latest, f.cursor, f.private_cursor))
            })
            .sum()
    }

    /// The current change of one follower (as a snapshot publishes it).
    fn change(
        &self,
        conversation_id: &ConversationId,
        root: Seq,
        thread: &Thread,
        f: &Follower,
    ) -> ThreadChange {
        let view = self.follower(thread, f);
        ThreadChange {
            key: ThreadKey {
                conversation_id: conversation_id.clone(),
                thread: root,
                user_id: self.users.id(f.user).clone(),
            },
            cursor: view.cursor,
            private_cursor: f.private_cursor,
            join_seq: view.join_seq,
            latest_seq: thread.latest,
            present: view.present,
            epoch: view.epoch,
            updated_at: f.updated_at,
            // A hidden follower's cursor lives only in the thread-state
            // record: the public one is a tombstone.
            outputs: if view.present { f.dirty } else { Outputs::BOTH },
        }
    }

    /// Every follower of thread `root` as a whole change (as a snapshot
    /// writes it), appended; how many.
    pub(super) fn snapshot(
        &self,
        conversation_id: &ConversationId,
        root: Seq,
        into: &mut Vec<ThreadChange>,
    ) -> usize {
        let Some(thread) = self.threads.and_then(|t| t.by_root.get(&root)) else {
            return 0;
        };
        into.extend(thread.followers.iter().map(|f| ThreadChange {
            outputs: Outputs::BOTH,
            ..self.change(conversation_id, root, thread, f)
        }));
        thread.followers.len()
    }

    /// The dirty followers and state of thread `root`, appended.
    pub(super) fn pending(
        &self,
        conversation_id: &ConversationId,
        root: Seq,
        followers: &mut Vec<ThreadChange>,
        states: &mut Vec<ThreadStateChange>,
    ) {
        let Some(thread) = self.threads.and_then(|t| t.by_root.get(&root)) else {
            return;
        };
        if thread.state_dirty {
            states.push(state_change(conversation_id, root, thread));
        }
        followers.extend(
            thread
                .followers
                .iter()
                .filter(|f| f.dirty.any())
                .map(|f| self.change(conversation_id, root, thread, f)),
        );
    }
}

fn state_change(conversation_id: &ConversationId, root: Seq, thread: &Thread) -> ThreadStateChange {
    ThreadStateChange {
        conversation_id: conversation_id.clone(),
        thread: root,
        latest_seq: thread.latest,
        last_reply: thread.last_reply,
        marks: thread.marks.clone(),
    }
}

impl ThreadDirty {
    /// Takes the dirty list; the caller clears each thread's flags
    /// ([`Threads::clear_dirty`]).
    pub(super) fn take(&mut self) -> Vec<(u32, Seq)> {
        std::mem::take(&mut self.threads)
    }

    /// The dirty threads, by conversation number and root.
    pub(super) fn threads(&self) -> &[(u32, Seq)] {
        &self.threads
    }
}
