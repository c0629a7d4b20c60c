//! The fold: pure, I/O-free state of one input partition.
//!
//! Read reports and conversation events are folded with max-merge into
//! per-conversation cursors. Changed members are collected in a dirty set so
//! that many reports for one (conversation, user) inside a flush window leave
//! as one update. Nothing here knows about Kafka, time or threads.
//!
//! The two inputs are not ordered against each other, so the fold never
//! clamps a cursor to a `latest_seq` that may lag and never drops a report
//! because the member is not yet known: readers clamp (`unread`) and apply
//! membership (`read_count`).
//!
//! Each member has two cursors. The public one is what other members see
//! (read counts, who-read). The private one moves on private receipts (as
//! Matrix's `m.read.private`) and is seen only by the member's own devices,
//! whose unread count uses the higher of the two. A member may also mark a
//! conversation unread; the mark holds until their cursor passes the point
//! where they set it, or until they clear it. A third cursor, *delivered*,
//! says which messages reached one of the member's devices (the grey
//! ticks); reading implies delivery, so it is never below the public
//! cursor. A member keeps the messages that mention them above what they
//! read (the newest [`MAX_UNREAD_MENTIONS`]), and their latest mute of the
//! conversation. Every rule is a max, a set union or a
//! last-writer-wins by a version, so the result does not depend on how the
//! two inputs interleave or on duplicates.

use crate::domain::{ConversationId, CursorKey, Seq, UserId};
use crate::read_model::{ConversationView, MemberCursor, Mute, OwnCursor, MAX_UNREAD_MENTIONS};

mod dense;
mod members;
mod stored;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod thread_tests;
mod threads;

use std::collections::HashMap;
use std::sync::Arc;

use dense::DenseMap;
use members::{Extras, Members, Slot, UserTable};
pub use stored::{StoredConversation, StoredConversations, StoredFault};
pub use threads::{
    own_unread as thread_own_unread, ThreadAt, ThreadChange, ThreadFollower, ThreadKey, ThreadMark,
    ThreadReadReport, ThreadStateChange, ThreadView, ThreadsRef,
};
use threads::{Reply, ThreadDirty, Threads, ThreadsOf};

/// A validated client read report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReport {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub seq: Seq,
    pub reported_at: i64,
    /// A private receipt: moves only the private cursor.
    pub private: bool,
}

/// A validated delivery report: a message reached one of the user's
/// devices, and every message before it did too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryReport {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub seq: Seq,
    pub reported_at: i64,
}

/// A validated mute (until a time, or until unmuted) or unmute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MuteReport {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub mute: Mute,
}

/// A validated mark-as-unread action, or the clearing of one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadMarkReport {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    /// The user's cursor as the client knew it when they acted.
    pub seq: Seq,
    pub at: i64,
    /// Marked unread (true) or cleared (false).
    pub marked: bool,
}

/// A validated conversation event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversationEvent {
    pub conversation_id: ConversationId,
    /// MessageSent: the message's seq. Member events: the latest seq when it happened.
    pub seq: Seq,
    pub at: i64,
    pub kind: EventKind,
}

/// Which input a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InputKind {
    ReadReports,
    ConversationEvents,
}

/// A validated record of either input: what the fold consumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Report(ReadReport),
    Delivery(DeliveryReport),
    Mark(UnreadMarkReport),
    Mute(MuteReport),
    /// A read (public or private) in a thread.
    ThreadRead(ThreadReadReport),
    Event(ConversationEvent),
}

impl Input {
    pub fn conversation_id(&self) -> &ConversationId {
        match self {
            Input::Report(r) => &r.conversation_id,
            Input::Delivery(d) => &d.conversation_id,
            Input::Mark(m) => &m.conversation_id,
            Input::Mute(m) => &m.conversation_id,
            Input::ThreadRead(r) => &r.conversation_id,
            Input::Event(e) => &e.conversation_id,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    MessageSent {
        sender_id: UserId,
        mentions: Mentions,
    },
    /// A reply in thread `thread` (its root message's seq): the event's
    /// `seq` is the conversation's latest seq when it was sent, which
    /// orders it against joins; replies take no seq of the conversation.
    ReplySent {
        thread: Seq,
        thread_seq: Seq,
        sender_id: UserId,
        /// Members mentioned by name follow the thread.
        mentions: Vec<UserId>,
        /// The root message's sender, who follows the thread.
        starter_id: Option<UserId>,
    },
    MemberJoined {
        user_id: UserId,
    },
    MemberLeft {
        user_id: UserId,
    },
}

/// Whom a message mentions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mentions {
    pub users: Vec<UserId>,
    /// `@all`: every member who had joined by then.
    pub all: bool,
}

impl Mentions {
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && !self.all
    }
}

/// Orders membership events of one member: the later (seq, at) wins, so a
/// duplicate or replayed older join never undoes a later leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MembershipVersion {
    pub seq: Seq,
    pub at: i64,
}

/// The latest mark-as-unread action of a member. Ordered by time, then by
/// value (cleared below marked, lower seq below higher): the greatest wins,
/// which the CQL store reproduces with write timestamps and its
/// larger-value-wins rule on ties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnreadMark {
    pub at: i64,
    /// `Some(cursor when marked)`, or `None` when the latest action cleared it.
    pub seq: Option<Seq>,
}

/// One member's read state in one conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Has read every message with seq <= cursor, as other members see it.
    pub cursor: Seq,
    /// Every message with seq <= delivered reached one of the member's
    /// devices, as other members see it; never below `cursor`.
    pub delivered: Seq,
    /// Highest private receipt; only the member's own devices see it.
    pub private_cursor: Seq,
    /// First seq the member can see: 1 unless they joined later.
    pub join_seq: Seq,
    /// Left members keep their cursor but count in no read count.
    pub left: bool,
    /// Whether other members know of the member: set by anything public (a
    /// public read, a message, a membership event). A member seen only
    /// through private receipts or marks is not listed, so nothing public
    /// reveals them.
    pub listed: bool,
    /// Version of the membership event that set `join_seq`/`left`.
    pub membership: Option<MembershipVersion>,
    /// Membership events applied so far. It only grows, and grows at every
    /// join or leave, so the stores order membership by it (see topology.md).
    pub epoch: u64,
    /// The latest mark-as-unread action.
    pub mark: Option<UnreadMark>,
    /// Seqs of the messages that mention the member above what they read
    /// (by either cursor), ascending, the newest [`MAX_UNREAD_MENTIONS`].
    pub mentions: Vec<Seq>,
    /// The latest mute or unmute.
    pub mute: Option<Mute>,
    /// Latest event time of any input that touched this member.
    pub updated_at: i64,
}

impl Member {
    fn new(updated_at: i64) -> Self {
        Member {
            cursor: Seq::ZERO,
            delivered: Seq::ZERO,
            private_cursor: Seq::ZERO,
            join_seq: Seq(1),
            left: false,
            listed: false,
            membership: None,
            epoch: 0,
            mark: None,
            mentions: Vec::new(),
            mute: None,
            updated_at,
        }
    }

    /// How far the member has read, by either cursor.
    pub fn read_up_to(&self) -> Seq {
        self.cursor.max(self.private_cursor)
    }

    /// Adds a message that mentions the member, if it counts: their join
    /// is on record (a membership event, ordered with the messages, so the
    /// outcome does not depend on how the inputs interleave), they had
    /// joined by then, have not left, and have not read past it. Returns
    /// whether the unread mentions changed.
    fn mention(&mut self, seq: Seq) -> bool {
        if self.membership.is_none() || self.left || seq <= self.read_up_to() || seq < self.join_seq {
            return false;
        }
        self.add_mention(seq)
    }

    /// Adds `seq` to the unread mentions, keeping the newest
    /// [`MAX_UNREAD_MENTIONS`].
    fn add_mention(&mut self, seq: Seq) -> bool {
        self.forget_read_mentions();
        let Err(at) = self.mentions.binary_search(&seq) else {
            return false;
        };
        if at == 0 && self.mentions.len() >= MAX_UNREAD_MENTIONS {
            // Older than all the newest kept: counted already as "99+".
            return false;
        }
        self.mentions.insert(at, seq);
        if self.mentions.len() > MAX_UNREAD_MENTIONS {
            self.mentions.remove(0);
        }
        true
    }

    /// Drops the mentions the member has read past.
    fn forget_read_mentions(&mut self) {
        let read = self.read_up_to();
        let read_count = self.mentions.partition_point(|&s| s <= read);
        self.mentions.drain(..read_count);
    }

    /// The member as other members see them; `None` once they left, or if
    /// they are not listed.
    pub fn present(&self) -> Option<MemberCursor> {
        (self.listed && !self.left).then_some(MemberCursor {
            cursor: self.cursor,
            delivered: self.delivered,
            join_seq: self.join_seq,
        })
    }

    /// The member as their own devices see themselves.
    pub fn own(&self) -> OwnCursor {
        OwnCursor {
            cursor: self.cursor,
            private_cursor: self.private_cursor,
            mark_seq: self.mark.and_then(|m| m.seq),
            unread_mentions: self.mentions.iter().filter(|&&s| s > self.read_up_to()).count() as u32,
            mute: self.mute,
        }
    }

    /// Whether the member has state that only their own devices see.
    pub fn has_private_state(&self) -> bool {
        self.private_cursor > Seq::ZERO
            || self.mark.is_some()
            || !self.mentions.is_empty()
            || self.mute.is_some()
    }
}

/// Read state of one conversation, as held (see `members.rs`).
#[derive(Clone, Debug, Default)]
struct Conversation {
    /// Highest seq seen in any input; may lag behind cursors.
    latest_seq: Seq,
    members: Members,
}

/// One conversation of a [`PartitionState`], for reading.
#[derive(Clone, Copy)]
pub struct ConversationRef<'a> {
    users: &'a UserTable,
    extras: &'a Extras,
    conversation: &'a Conversation,
    threads: Option<&'a Threads>,
}

impl<'a> ConversationRef<'a> {
    /// Highest seq seen in any input; may lag behind cursors.
    pub fn latest_seq(&self) -> Seq {
        self.conversation.latest_seq
    }

    /// Members held, departed and unlisted ones included.
    pub fn len(&self) -> usize {
        self.conversation.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn member(&self, user: &UserId) -> Option<Member> {
        let index = self.users.find(user)?;
        Some(self.conversation.members.get(index)?.load(self.extras))
    }

    /// Every member held, in no particular order.
    pub fn members(&self) -> impl Iterator<Item = (&'a UserId, Member)> + 'a {
        let (users, extras) = (self.users, self.extras);
        self.conversation
            .members
            .iter()
            .map(move |slot| (users.id(slot.user()), slot.load(extras)))
    }

    /// This conversation as other members see it: unread, read counts and
    /// who-read are answered by the [read model](crate::read_model).
    pub fn view(&self) -> ConversationView {
        ConversationView {
            latest_seq: self.latest_seq(),
            members: self
                .members()
                .filter_map(|(user, m)| Some((user.clone(), m.present()?)))
                .collect(),
        }
    }

    /// The conversation's threads.
    pub fn threads(&self) -> ThreadsRef<'a> {
        ThreadsRef {
            threads: self.threads,
            members: &self.conversation.members,
            users: self.users,
            extras: self.extras,
        }
    }
}

/// Which outputs a change concerns. Every change goes to the member's own
/// devices (the by-user changelog).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outputs {
    /// What other members see changed: the public cursor, join_seq or
    /// presence (the by-conversation changelog, the Redis conversation hash,
    /// the CQL `cursors` table).
    pub public: bool,
    /// What only readfold and the member see changed: the private cursor,
    /// the unread mark or the membership version (the member-state topic,
    /// the per-user stores).
    pub state: bool,
}

impl Outputs {
    const PUBLIC: Outputs = Outputs {
        public: true,
        state: false,
    };
    const STATE: Outputs = Outputs {
        public: false,
        state: true,
    };
    const BOTH: Outputs = Outputs {
        public: true,
        state: true,
    };

    fn any(self) -> bool {
        self.public || self.state
    }

    fn union(self, other: Outputs) -> Outputs {
        Outputs {
            public: self.public || other.public,
            state: self.state || other.state,
        }
    }
}

/// What a flush publishes for one changed member: their whole current
/// state, and which outputs it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: CursorKey,
    /// Where the state that took the change holds the member.
    pub at: MemberAt,
    pub member: Member,
    /// The conversation's latest seq when the change was taken.
    pub latest_seq: Seq,
    pub outputs: Outputs,
}

/// Where a [`PartitionState`] holds a member: their conversation's number
/// ([`PartitionState::conversation_count`]) and their user's. Eight bytes
/// where a [`CursorKey`] takes fifty and more, for sets of keys that may
/// grow to millions (those published but not yet in CQL). Numbers belong
/// to one state: a state restored again numbers anew, and a number it
/// does not hold answers nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberAt {
    pub conversation: u32,
    pub user: u32,
}

impl Change {
    pub fn key(&self) -> CursorKey {
        self.key.clone()
    }

    /// The changelog value (public fields); `None` when the member left (a
    /// tombstone).
    pub fn public_update(&self) -> Option<CursorUpdate> {
        (!self.member.left).then(|| CursorUpdate {
            conversation_id: self.key.conversation_id.clone(),
            user_id: self.key.user_id.clone(),
            cursor: self.member.cursor,
            delivered: self.member.delivered,
            join_seq: self.member.join_seq,
            latest_seq: self.latest_seq,
            updated_at: self.member.updated_at,
        })
    }

    /// What only readfold keeps of the member: the member-state record.
    pub fn state_update(&self) -> MemberStateUpdate {
        member_state(self.key.clone(), &self.member)
    }
}

/// The member-state record of `member`.
fn member_state(key: CursorKey, member: &Member) -> MemberStateUpdate {
    MemberStateUpdate {
        key,
        private_cursor: member.private_cursor,
        mark: member.mark,
        left: member.left,
        membership: member.membership,
        epoch: member.epoch,
        mentions: member.mentions.clone(),
        mute: member.mute,
        updated_at: member.updated_at,
    }
}

/// The public changelog value: one member's cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorUpdate {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub cursor: Seq,
    /// The delivered cursor, never below `cursor`.
    pub delivered: Seq,
    pub join_seq: Seq,
    pub latest_seq: Seq,
    pub updated_at: i64,
}

impl CursorUpdate {
    pub fn key(&self) -> CursorKey {
        CursorKey {
            conversation_id: self.conversation_id.clone(),
            user_id: self.user_id.clone(),
        }
    }
}

/// The member-state value: what the public changelog does not carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStateUpdate {
    pub key: CursorKey,
    pub private_cursor: Seq,
    pub mark: Option<UnreadMark>,
    pub left: bool,
    pub membership: Option<MembershipVersion>,
    pub epoch: u64,
    /// Unread mentions, as [`Member::mentions`].
    pub mentions: Vec<Seq>,
    pub mute: Option<Mute>,
    pub updated_at: i64,
}

/// Why what a checkpoint holds cannot be one partition's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    #[error("conversation {0:?} given twice")]
    RepeatedConversation(ConversationId),
}

/// The conversations of a partition, numbered (see `dense.rs`): a lookup
/// of a held conversation clones no id, and the dirty set lists numbers.
type Conversations = DenseMap<ConversationId, Conversation>;

/// All read state of one input partition, plus the members changed since
/// the last successful flush.
#[derive(Clone, Debug, Default)]
pub struct PartitionState {
    conversations: Conversations,
    users: UserTable,
    extras: Extras,
    dirty: DirtySet,
    /// The threads of the conversations that have any, by number: a map
    /// of its own, so that a conversation without threads (every 1:1 chat)
    /// pays nothing for them.
    threads: HashMap<u32, Threads, foldhash::fast::RandomState>,
    /// Threads with a changed follower or state since the last flush.
    thread_dirty: ThreadDirty,
    /// Conversations not yet taken in from a store (see `stored.rs`).
    stored: Option<Stored>,
}

/// A conversation's members as [`PartitionState::all_conversations`] lists them.
pub type ListedMembers<'a> = dyn Iterator<Item = (&'a UserId, Member)> + 'a;

/// A state's store and what is left in it.
#[derive(Clone, Debug)]
struct Stored {
    source: Arc<dyn StoredConversations>,
    /// Cursors of the stored conversations not taken in yet.
    cursors_left: usize,
}

/// The members changed since the last flush: their slots carry what
/// changed (see `members.rs`); this lists their conversations.
#[derive(Clone, Debug, Default)]
struct DirtySet {
    /// Conversations with a dirty member (by number), each once.
    conversations: Vec<u32>,
    /// Dirty members.
    members: usize,
    /// Off for readers that never flush (replay): nothing is marked.
    untracked: bool,
}

impl DirtySet {
    /// Adds `outputs` to what changed of the member at `position` of `conv`.
    fn mark(&mut self, number: u32, conv: &mut Conversation, position: usize, outputs: Outputs) {
        if self.untracked {
            return;
        }
        let (new_member, new_conversation) = conv.members.mark_dirty(position, outputs);
        self.members += usize::from(new_member);
        if new_conversation {
            self.conversations.push(number);
        }
    }
}

impl PartitionState {
    pub fn new() -> Self {
        Self::default()
    }

    /// A state that folds the same way but records no changes to flush, for
    /// readers that only look at the end result (replay).
    pub fn untracked() -> Self {
        PartitionState {
            dirty: DirtySet {
                untracked: true,
                ..DirtySet::default()
            },
            thread_dirty: ThreadDirty::untracked(),
            ..Self::default()
        }
    }

    /// A state whose conversations are in `source`, each taken in when a
    /// record first touches it (see `stored.rs`). Until
    /// [`PartitionState::take_all`], the views of the whole state
    /// ([`PartitionState::conversations`], [`PartitionState::keys`],
    /// [`PartitionState::conversation_count`] and the like) see only what
    /// was taken in; [`PartitionState::all_conversations`] sees all of it.
    pub fn over(source: Arc<dyn StoredConversations>) -> Self {
        let (conversations, cursors_left) = source.counts();
        let mut state = PartitionState {
            stored: Some(Stored { source, cursors_left }),
            ..Self::default()
        };
        // Room for what the store holds: taken in one by one, the table
        // would rehash everything each time it doubled. (Its pages are
        // resident only as they fill.)
        state.conversations.reserve(conversations);
        state
    }

    /// Whether every conversation is in memory (no store left).
    pub fn is_whole(&self) -> bool {
        self.stored.is_none()
    }

    /// The fault the store found in itself, if any: the state may then
    /// answer wrongly for a conversation it could not take in, and must be
    /// dropped before anything of it is published.
    pub fn stored_fault(&self) -> Option<StoredFault> {
        self.stored.as_ref().and_then(|s| s.source.fault())
    }

    /// Takes in every conversation still in the store, and forgets the
    /// store: for work over the whole state (a snapshot of every key).
    pub fn take_all(&mut self) -> Result<(), StoredFault> {
        let Some(stored) = &self.stored else {
            return Ok(());
        };
        let source = Arc::clone(&stored.source);
        let (conversations, _) = source.counts();
        self.conversations
            .reserve(conversations.saturating_sub(self.conversations.len()));
        source.for_each(&mut |c| {
            if self.conversations.find(&c.id).is_none() {
                self.take_stored(c);
            }
        })?;
        if let Some(fault) = source.fault() {
            return Err(fault);
        }
        self.stored = None;
        Ok(())
    }

    /// Every conversation, in memory or still in the store, to `each`: its
    /// id, latest seq and members (what a checkpoint writes), without
    /// taking the stored ones in.
    pub fn all_conversations(
        &self,
        each: &mut dyn FnMut(&ConversationId, Seq, &mut ListedMembers<'_>),
    ) -> Result<(), StoredFault> {
        for (id, conversation) in self.conversations() {
            each(id, conversation.latest_seq(), &mut conversation.members());
        }
        let Some(stored) = &self.stored else {
            return Ok(());
        };
        stored.source.for_each(&mut |c| {
            // Taken in: written above, as it is now.
            if self.conversations.find(&c.id).is_none() {
                each(
                    &c.id,
                    c.latest_seq,
                    &mut c.members.iter().map(|(u, m)| (u, m.clone())),
                );
            }
        })?;
        stored.source.fault().map_or(Ok(()), Err)
    }

    /// After a checkpoint's public changelog tail was applied to a state
    /// over it: applies the stored member-state of every conversation taken
    /// in meanwhile again, as a restore applies member-state records after
    /// the public ones (a public record carries membership only roughly).
    /// Conversations the tail did not touch are as stored already.
    pub fn restate_from_store(&mut self) {
        let Some(stored) = &self.stored else {
            return;
        };
        let source = Arc::clone(&stored.source);
        let ids: Vec<ConversationId> = self.conversations.iter().map(|(id, _)| id.clone()).collect();
        for id in ids {
            // A fault is the store's to report (`stored_fault`).
            let Ok(Some(conversation)) = source.find(&id) else {
                continue;
            };
            for (user_id, member) in conversation.members {
                let key = CursorKey {
                    conversation_id: id.clone(),
                    user_id,
                };
                self.restore_state(&member_state(key, &member));
            }
        }
    }

    pub fn conversation(&self, id: &ConversationId) -> Option<ConversationRef<'_>> {
        Some(self.conversation_at(self.conversations.find(id)?))
    }

    pub fn conversations(&self) -> impl Iterator<Item = (&ConversationId, ConversationRef<'_>)> {
        (0..self.conversation_count())
            .map(|number| (self.conversations.key(number), self.conversation_at(number)))
    }

    /// Gives back the room that growth left unused, for a state that is
    /// done growing for now (after a restore).
    pub fn shrink_to_fit(&mut self) {
        // Over a store, the room reserved for what it holds stays: the
        // conversations are still to come.
        if self.stored.is_none() {
            self.conversations.shrink_to_fit();
        }
        for conversation in self.conversations.values_mut() {
            conversation.members.shrink_to_fit();
        }
        self.users.shrink_to_fit();
        self.extras.shrink_to_fit();
    }

    /// Folds one validated record of either input. Returns whether anything
    /// changed.
    pub fn apply(&mut self, input: &Input) -> bool {
        match input {
            Input::Report(r) => self.apply_report(r),
            Input::Delivery(d) => self.apply_delivery(d),
            Input::Mark(m) => self.apply_mark(m),
            Input::Mute(m) => self.apply_mute(m),
            Input::ThreadRead(r) => self.apply_thread_read(r),
            Input::Event(e) => self.apply_event(e),
        }
    }

    /// Number of (conversation, user) cursors held, in memory or in the
    /// store.
    pub fn cursor_count(&self) -> usize {
        let in_store = self.stored.as_ref().map_or(0, |s| s.cursors_left);
        let in_memory: usize = self.conversations.iter().map(|(_, c)| c.members.len()).sum();
        in_store.saturating_add(in_memory)
    }

    /// Number of members changed since the last [`PartitionState::mark_flushed`].
    pub fn dirty_len(&self) -> usize {
        self.dirty.members
    }

    /// Folds one read report: a public one moves the cursor others see, a
    /// private one only the member's own. Returns whether a cursor moved.
    pub fn apply_report(&mut self, report: &ReadReport) -> bool {
        let number = self.conversation_number(&report.conversation_id);
        let conv = self.conversations.value_mut(number);
        let user = self.users.intern(&report.user_id);
        if !report.private {
            let in_place = conv.members.position(user).and_then(|position| {
                let moved = conv
                    .members
                    .slot_mut(position)
                    .advance_in_place(report.seq, report.reported_at)?;
                Some((moved, position))
            });
            if let Some((moved, position)) = in_place {
                if moved {
                    self.dirty.mark(number, conv, position, Outputs::PUBLIC);
                }
                return moved;
            }
        }
        let (moved, created, position) =
            with_member_at(&mut self.extras, conv, user, report.reported_at, |member| {
                if report.private {
                    advance(&mut member.private_cursor, report.seq)
                } else {
                    let listed = list(member);
                    advance(&mut member.cursor, report.seq) || listed
                }
            });
        let outputs = if report.private {
            Outputs::STATE
        } else {
            Outputs::PUBLIC
        };
        if moved || created {
            self.dirty.mark(number, conv, position, outputs);
        }
        moved
    }

    /// Folds one delivery report: public, as the sender's ticks show it.
    /// Returns whether the delivered cursor moved.
    pub fn apply_delivery(&mut self, report: &DeliveryReport) -> bool {
        let number = self.conversation_number(&report.conversation_id);
        let conv = self.conversations.value_mut(number);
        let (moved, created, position) = with_member(
            &mut self.users,
            &mut self.extras,
            conv,
            &report.user_id,
            report.reported_at,
            |member| {
                let listed = list(member);
                advance(&mut member.delivered, report.seq) || listed
            },
        );
        if moved || created {
            self.dirty.mark(number, conv, position, Outputs::PUBLIC);
        }
        moved
    }

    /// Folds a mark-as-unread action or its clearing; the latest action, by
    /// [`UnreadMark`] order, wins. Returns whether the mark changed.
    pub fn apply_mark(&mut self, mark: &UnreadMarkReport) -> bool {
        let number = self.conversation_number(&mark.conversation_id);
        let conv = self.conversations.value_mut(number);
        let version = UnreadMark {
            at: mark.at,
            seq: mark.marked.then_some(mark.seq),
        };
        let (changed, created, position) = with_member(
            &mut self.users,
            &mut self.extras,
            conv,
            &mark.user_id,
            mark.at,
            |member| {
                let changed = member.mark.is_none_or(|m| version > m);
                if changed {
                    member.mark = Some(version);
                }
                changed
            },
        );
        if changed || created {
            self.dirty.mark(number, conv, position, Outputs::STATE);
        }
        changed
    }

    /// Folds a mute or unmute; the greatest [`Mute`] wins. Returns whether
    /// the member's mute changed.
    pub fn apply_mute(&mut self, report: &MuteReport) -> bool {
        let number = self.conversation_number(&report.conversation_id);
        let conv = self.conversations.value_mut(number);
        let (changed, created, position) = with_member(
            &mut self.users,
            &mut self.extras,
            conv,
            &report.user_id,
            report.mute.at,
            |member| {
                let changed = member.mute.is_none_or(|m| report.mute > m);
                if changed {
                    member.mute = Some(report.mute);
                }
                changed
            },
        );
        if changed || created {
            self.dirty.mark(number, conv, position, Outputs::STATE);
        }
        changed
    }

    /// Folds one conversation event. Returns whether any member changed.
    pub fn apply_event(&mut self, event: &ConversationEvent) -> bool {
        let number = self.conversation_number(&event.conversation_id);
        if let EventKind::ReplySent {
            thread,
            thread_seq,
            sender_id,
            mentions,
            starter_id,
        } = &event.kind
        {
            let reply = Reply {
                thread: *thread,
                thread_seq: *thread_seq,
                version: MembershipVersion {
                    seq: event.seq,
                    at: event.at,
                },
                sender: sender_id,
                starter: starter_id.as_ref(),
                mentions,
            };
            return self.threads_of(number).reply(&reply);
        }
        let conv = self.conversations.value_mut(number);
        // Stores learn the latest seq only through member updates, so a
        // message that raises it must publish one, even if its sender had
        // already read past it.
        let raised = event.seq > conv.latest_seq;
        conv.latest_seq = conv.latest_seq.max(event.seq);
        let version = MembershipVersion {
            seq: event.seq,
            at: event.at,
        };
        let (users, extras) = (&mut self.users, &mut self.extras);
        let (position, outputs) = match &event.kind {
            EventKind::MessageSent { sender_id, mentions } => {
                // The sender has read what they wrote.
                let (moved, created, position) =
                    with_member(users, extras, conv, sender_id, event.at, |member| {
                        let listed = list(member);
                        advance(&mut member.cursor, event.seq) || listed
                    });
                if !mentions.is_empty() {
                    mention(
                        users,
                        extras,
                        &mut self.dirty,
                        number,
                        conv,
                        event,
                        sender_id,
                        mentions,
                    );
                }
                (
                    position,
                    if moved || created || raised {
                        Outputs::PUBLIC
                    } else {
                        Outputs::default()
                    },
                )
            }
            EventKind::MemberJoined { user_id } | EventKind::MemberLeft { user_id } => {
                let joined = matches!(event.kind, EventKind::MemberJoined { .. });
                let (mut outputs, created, position) =
                    with_member(users, extras, conv, user_id, event.at, |member| {
                        membership_event(member, version, joined)
                    });
                if created {
                    outputs = outputs.union(Outputs::PUBLIC);
                }
                // Applied (not an older or replayed event): the member's
                // join point moved in every thread, or they left them all.
                if outputs.state && self.threads.contains_key(&number) {
                    ThreadsOf {
                        number,
                        threads: &mut self.threads,
                        members: &conv.members,
                        users,
                        extras,
                        dirty: &mut self.thread_dirty,
                    }
                    .membership_changed(user_id, version, !joined);
                }
                (position, outputs)
            }
            EventKind::ReplySent { .. } => unreachable!("replies are folded above"),
        };
        if outputs.any() {
            self.dirty.mark(number, conv, position, outputs);
        }
        // A sender who left (a tombstone) or is not listed publishes no
        // latest seq: another member's record carries it, or readers that
        // follow latest seqs (the badge stage) never learn of the message.
        let mut marked = outputs.any();
        if raised
            && matches!(event.kind, EventKind::MessageSent { .. })
            && !conv.members.published_at(position)
        {
            // The lowest user id: the same member however the state is held.
            let users = &self.users;
            let other = conv
                .members
                .published()
                .min_by(|a, b| users.id(a.1).cmp(users.id(b.1)))
                .map(|(position, _)| position);
            if let Some(other) = other {
                self.dirty.mark(number, conv, other, Outputs::PUBLIC);
                marked = true;
            }
        }
        marked
    }

    /// Rebuilds state from a public changelog record (restore). Marks
    /// nothing dirty: the changelog already holds it.
    pub fn restore_update(&mut self, update: &CursorUpdate) {
        let number = self.conversation_number(&update.conversation_id);
        let conv = self.conversations.value_mut(number);
        conv.latest_seq = conv.latest_seq.max(update.latest_seq).max(update.cursor);
        with_member(
            &mut self.users,
            &mut self.extras,
            conv,
            &update.user_id,
            update.updated_at,
            |member| {
                member.cursor = member.cursor.max(update.cursor);
                member.delivered = member.delivered.max(update.delivered);
                member.join_seq = update.join_seq;
                member.left = false;
                member.listed = true;
                // A replayed join older than this record must not change anything.
                // (The member-state record, restored after, gives the exact version.)
                member.membership = (update.join_seq > Seq(1)).then_some(MembershipVersion {
                    seq: Seq(update.join_seq.get() - 1),
                    at: i64::MIN,
                });
            },
        );
    }

    /// Puts back a conversation whole, as a local checkpoint kept it
    /// (replacing any state of it). Marks nothing dirty. A user listed
    /// twice keeps the last entry.
    pub fn restore_conversation(
        &mut self,
        id: ConversationId,
        latest_seq: Seq,
        members: impl IntoIterator<Item = (UserId, Member)>,
    ) {
        let (users, extras) = (&mut self.users, &mut self.extras);
        let slots = members
            .into_iter()
            .map(|(user, member)| Slot::new(extras, users.intern(&user), &member))
            .collect();
        self.place_conversation(id, latest_seq, slots);
    }

    /// Puts a restored conversation's slots in place, replacing any state
    /// of it.
    fn place_conversation(&mut self, id: ConversationId, latest_seq: Seq, slots: Vec<Slot>) {
        let members = Members::from_slots(slots, &mut self.extras);
        let (number, new) = self.conversations.find_or_insert_with(&id, Conversation::default);
        let replaced = self.conversations.value_mut(number);
        if !new {
            // Its changes go with it (a restore runs before any fold: this
            // scan of the dirty list is for correctness, not speed).
            if replaced.members.is_dirty() {
                self.dirty.members -= replaced.members.clear_dirty();
                self.dirty.conversations.retain(|&c| c != number);
            }
            replaced.members.release(&mut self.extras);
        }
        *replaced = Conversation { latest_seq, members };
    }

    /// Applies a public changelog tombstone (restore): the member has left.
    pub fn restore_tombstone(&mut self, key: &CursorKey) {
        let number = self.conversation_number(&key.conversation_id);
        let conv = self.conversations.value_mut(number);
        with_member(
            &mut self.users,
            &mut self.extras,
            conv,
            &key.user_id,
            i64::MIN,
            |member| {
                member.left = true;
                member.listed = true;
                member.membership = member.membership.or(Some(MembershipVersion {
                    seq: Seq::ZERO,
                    at: i64::MIN,
                }));
            },
        );
    }

    /// Applies a member-state record (restore, after the public changelog):
    /// the private cursor, the mark and the exact membership.
    pub fn restore_state(&mut self, state: &MemberStateUpdate) {
        let number = self.conversation_number(&state.key.conversation_id);
        let conv = self.conversations.value_mut(number);
        with_member(
            &mut self.users,
            &mut self.extras,
            conv,
            &state.key.user_id,
            state.updated_at,
            |member| {
                member.private_cursor = member.private_cursor.max(state.private_cursor);
                member.mark = member.mark.max(state.mark);
                member.mute = member.mute.max(state.mute);
                for &seq in &state.mentions {
                    member.add_mention(seq);
                }
                if state.epoch >= member.epoch {
                    member.epoch = state.epoch;
                    member.left = state.left;
                    member.membership = state.membership.or(member.membership);
                }
            },
        );
    }

    /// The current value of every dirty member, without clearing the dirty
    /// set, so that a failed flush can be retried with values at least as new.
    pub fn pending_changes(&self) -> Vec<Change> {
        let mut changes = Vec::with_capacity(self.dirty.members);
        for &number in &self.dirty.conversations {
            let conv = self.conversations.value(number);
            changes.extend(conv.members.dirty_slots().map(|slot| {
                let at = MemberAt {
                    conversation: number,
                    user: slot.user(),
                };
                Change {
                    key: self.key_at(at),
                    at,
                    member: slot.load(&self.extras),
                    latest_seq: conv.latest_seq,
                    outputs: slot.dirty(),
                }
            }));
        }
        changes
    }

    /// Forgets the dirty set after every sink has acknowledged.
    pub fn mark_flushed(&mut self) {
        for number in self.dirty.conversations.drain(..) {
            self.conversations.value_mut(number).members.clear_dirty();
        }
        self.dirty.members = 0;
        for (number, root) in self.thread_dirty.take() {
            if let Some(threads) = self.threads.get_mut(&number) {
                threads.clear_dirty(root);
            }
        }
    }

    /// The current value of every dirty thread follower and thread state,
    /// without clearing them (as [`PartitionState::pending_changes`]). A
    /// thread whose replies moved gets a present follower's public record
    /// to carry its latest reply ([`Threads::carry_latest`]).
    pub fn pending_thread_changes(&mut self) -> (Vec<ThreadChange>, Vec<ThreadStateChange>) {
        let dirty = self.thread_dirty.threads().to_vec();
        for &(number, root) in &dirty {
            if let Some(threads) = self.threads.get_mut(&number) {
                let members = &self.conversations.value(number).members;
                let held = (members, &self.extras, &self.users);
                threads.carry_latest(&mut self.thread_dirty, number, root, held);
            }
        }
        let (mut followers, mut states) = (Vec::new(), Vec::new());
        for (number, root) in dirty {
            let id = self.conversations.key(number);
            let from = followers.len();
            self.conversation_at(number)
                .threads()
                .pending(id, root, &mut followers, &mut states);
            if let Some(threads) = self.threads.get_mut(&number) {
                threads.taken(root, &followers[from..]);
            }
        }
        (followers, states)
    }

    /// The threads with a change the next flush publishes.
    pub fn dirty_threads(&self) -> impl Iterator<Item = ThreadAt> + '_ {
        self.thread_dirty
            .threads()
            .iter()
            .map(|&(conversation, thread)| ThreadAt { conversation, thread })
    }

    /// Every thread held.
    pub fn thread_ats(&self) -> Vec<ThreadAt> {
        let mut all: Vec<ThreadAt> = self
            .threads
            .iter()
            .flat_map(|(&conversation, threads)| {
                threads
                    .roots()
                    .map(move |thread| ThreadAt { conversation, thread })
            })
            .collect();
        all.sort_unstable();
        all
    }

    /// Every follower of the thread held at `at`, whole (public and private
    /// state, departed ones as departures), appended to `into`: what a CQL
    /// snapshot writes of it. Returns how many.
    pub fn thread_snapshot(&self, at: ThreadAt, into: &mut Vec<ThreadChange>) -> usize {
        if at.conversation >= self.conversation_count() {
            return 0;
        }
        let id = self.conversations.key(at.conversation);
        self.conversation_at(at.conversation)
            .threads()
            .snapshot(id, at.thread, into)
    }

    /// Whether a thread follower or a thread's replies changed since the
    /// last flush.
    pub fn has_thread_changes(&self) -> bool {
        !self.thread_dirty.threads().is_empty()
    }

    /// Marks thread follower `key` changed again with `outputs`, for a
    /// flush that took its change and failed (as [`PartitionState::redirty`]).
    pub fn redirty_thread(&mut self, key: &ThreadKey, outputs: Outputs) {
        let (Some(number), Some(user)) = (
            self.conversations.find(&key.conversation_id),
            self.users.find(&key.user_id),
        ) else {
            return;
        };
        if let Some(threads) = self.threads.get_mut(&number) {
            threads.redirty_follower(&mut self.thread_dirty, number, key.thread, user, outputs);
        }
    }

    /// Marks thread `root`'s own state changed again, for a flush that took
    /// it and failed.
    pub fn redirty_thread_state(&mut self, conversation: &ConversationId, root: Seq) {
        let Some(number) = self.conversations.find(conversation) else {
            return;
        };
        if let Some(threads) = self.threads.get_mut(&number) {
            threads.redirty_state(&mut self.thread_dirty, number, root);
        }
    }

    /// Threads held, and follower entries over all of them.
    pub fn thread_counts(&self) -> (usize, usize) {
        self.threads
            .values()
            .map(Threads::counts)
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// Folds a read in a thread. Returns whether a cursor moved or the
    /// reader became a follower.
    pub fn apply_thread_read(&mut self, report: &ThreadReadReport) -> bool {
        let number = self.conversation_number(&report.conversation_id);
        self.threads_of(number).read(report)
    }

    /// Applies a public thread-cursor record (restore).
    pub fn restore_thread_cursor(&mut self, key: &ThreadKey, cursor: Seq, latest: Seq, at: i64) {
        let (threads, user) = self.restored_threads(key);
        threads.restore_cursor(key.thread, user, cursor, latest, at);
    }

    /// Applies a follower's thread-state record (restore, after the public
    /// thread cursors).
    pub fn restore_thread_follower(&mut self, key: &ThreadKey, cursor: Seq, private_cursor: Seq, at: i64) {
        let (threads, user) = self.restored_threads(key);
        threads.restore_follower(key.thread, user, cursor, private_cursor, at);
    }

    /// Applies a thread's state record (restore).
    pub fn restore_thread_state(&mut self, state: &ThreadStateChange) {
        let number = self.conversation_number(&state.conversation_id);
        self.threads.entry(number).or_default().restore_state(state);
    }

    /// The threads of `key`'s conversation, created if none, and the
    /// number of its user.
    fn restored_threads(&mut self, key: &ThreadKey) -> (&mut Threads, u32) {
        let number = self.conversation_number(&key.conversation_id);
        let user = self.users.intern(&key.user_id);
        (self.threads.entry(number).or_default(), user)
    }

    /// The thread fold's view of conversation `number`.
    fn threads_of(&mut self, number: u32) -> ThreadsOf<'_> {
        ThreadsOf {
            number,
            threads: &mut self.threads,
            members: &self.conversations.value(number).members,
            users: &mut self.users,
            extras: &self.extras,
            dirty: &mut self.thread_dirty,
        }
    }

    /// Conversation `number`, for reading.
    fn conversation_at(&self, number: u32) -> ConversationRef<'_> {
        ConversationRef {
            users: &self.users,
            extras: &self.extras,
            conversation: self.conversations.value(number),
            threads: self.threads.get(&number),
        }
    }

    /// Marks `key` changed again with `outputs`, for a flush that took its
    /// change and failed: the next flush publishes its then current value.
    /// A member no longer held is skipped.
    pub fn redirty(&mut self, key: &CursorKey, outputs: Outputs) {
        let Some(number) = self.conversations.find(&key.conversation_id) else {
            return;
        };
        let conv = self.conversations.value_mut(number);
        let position = self
            .users
            .find(&key.user_id)
            .and_then(|user| conv.members.position(user));
        if let Some(position) = position {
            self.dirty.mark(number, conv, position, outputs);
        }
    }

    /// `pending_changes` followed by `mark_flushed`.
    pub fn drain(&mut self) -> Vec<Change> {
        let changes = self.pending_changes();
        self.mark_flushed();
        changes
    }

    /// The conversation's number, held from now on if new; taken in from
    /// the store if it is there.
    fn conversation_number(&mut self, id: &ConversationId) -> u32 {
        if self.stored.is_some() {
            if let Some(number) = self.conversations.find(id) {
                return number;
            }
            self.take_in(id);
        }
        self.conversations
            .find_or_insert_with(id, Conversation::default)
            .0
    }

    /// Takes the conversation `id` in from the store, if stored. On a
    /// fault it stays out (the store keeps the fault: see `stored_fault`).
    fn take_in(&mut self, id: &ConversationId) {
        if let Some(Ok(Some(conversation))) = self.stored.as_ref().map(|s| s.source.find(id)) {
            self.take_stored(conversation);
        }
    }

    /// Puts a conversation read from the store in place, no longer counted
    /// as left in it.
    fn take_stored(&mut self, conversation: StoredConversation) {
        if let Some(stored) = &mut self.stored {
            stored.cursors_left = stored.cursors_left.saturating_sub(conversation.members.len());
        }
        self.restore_conversation(conversation.id, conversation.latest_seq, conversation.members);
    }

    /// Every (conversation, user) held.
    pub fn keys(&self) -> impl Iterator<Item = CursorKey> + '_ {
        let users = &self.users;
        self.conversations.iter().flat_map(move |(c, conv)| {
            conv.members.iter().map(move |slot| CursorKey {
                conversation_id: c.clone(),
                user_id: users.id(slot.user()).clone(),
            })
        })
    }

    /// A member's whole current state, as a snapshot writes it: public, and
    /// state when they have any private state.
    pub fn current(&self, key: &CursorKey) -> Option<Change> {
        self.current_at(self.member_at(key)?)
    }

    /// Where this state holds the member `key`, if it does.
    pub fn member_at(&self, key: &CursorKey) -> Option<MemberAt> {
        let conversation = self.conversations.find(&key.conversation_id)?;
        let user = self.users.find(&key.user_id)?;
        self.conversations.value(conversation).members.get(user)?;
        Some(MemberAt { conversation, user })
    }

    /// [`PartitionState::current`] of the member held at `at`.
    pub fn current_at(&self, at: MemberAt) -> Option<Change> {
        if at.conversation >= self.conversation_count() {
            return None;
        }
        let conversation = self.conversations.value(at.conversation);
        let slot = conversation.members.get(at.user)?;
        Some(whole(
            self.key_at(at),
            at,
            slot.load(&self.extras),
            conversation.latest_seq,
        ))
    }

    /// The key of a member this state holds at `at`.
    fn key_at(&self, at: MemberAt) -> CursorKey {
        CursorKey {
            conversation_id: self.conversations.key(at.conversation).clone(),
            user_id: self.users.id(at.user).clone(),
        }
    }

    /// Conversations held. Each has a number, `0..conversation_count()`,
    /// in the order it was first held; numbers never change.
    pub fn conversation_count(&self) -> u32 {
        self.conversations.len() as u32
    }

    /// The whole current state ([`PartitionState::current`]) of every
    /// member of the conversations numbered `from..end`, in order, appended
    /// to `into` until at least `max_keys` are: a snapshot of a restored
    /// partition taken a share at a time, with no set of its keys. Returns
    /// the number of the first conversation not taken (`end` when all were).
    pub fn conversation_changes(&self, from: u32, end: u32, max_keys: usize, into: &mut Vec<Change>) -> u32 {
        let end = end.min(self.conversation_count());
        let (mut next, mut taken) = (from, 0);
        while next < end && taken < max_keys {
            let conversation = self.conversations.value(next);
            for slot in conversation.members.iter() {
                let at = MemberAt {
                    conversation: next,
                    user: slot.user(),
                };
                into.push(whole(
                    self.key_at(at),
                    at,
                    slot.load(&self.extras),
                    conversation.latest_seq,
                ));
            }
            taken += conversation.members.len();
            next += 1;
        }
        next
    }
}

/// A member's whole state as a change: public, and state when they have
/// any private state.
fn whole(key: CursorKey, at: MemberAt, member: Member, latest_seq: Seq) -> Change {
    let outputs = Outputs {
        public: member.listed,
        state: member.has_private_state(),
    };
    Change {
        key,
        at,
        member,
        latest_seq,
        outputs,
    }
}

/// Runs `change` on the member (created with defaults when unknown) and
/// stores the result; returns what `change` returned, whether the member
/// was created, and its position among the members. Touching a member
/// raises its `updated_at`.
fn with_member<R>(
    users: &mut UserTable,
    extras: &mut Extras,
    conv: &mut Conversation,
    user: &UserId,
    at: i64,
    change: impl FnOnce(&mut Member) -> R,
) -> (R, bool, usize) {
    with_member_at(extras, conv, users.intern(user), at, change)
}

/// [`with_member`] for an interned user.
fn with_member_at<R>(
    extras: &mut Extras,
    conv: &mut Conversation,
    index: u32,
    at: i64,
    change: impl FnOnce(&mut Member) -> R,
) -> (R, bool, usize) {
    let (position, created) = match conv.members.position(index) {
        Some(p) => (p, false),
        None => (
            conv.members.insert(Slot::new(extras, index, &Member::new(at))),
            true,
        ),
    };
    let slot = conv.members.slot_mut(position);
    let mut member = slot.load(extras);
    member.updated_at = member.updated_at.max(at);
    let result = change(&mut member);
    slot.store(extras, &member);
    (result, created, position)
}

/// Adds message `event.seq` to the unread mentions of the members it
/// mentions (by name, or all who had joined by then), but its sender's.
#[allow(clippy::too_many_arguments)]
fn mention(
    users: &mut UserTable,
    extras: &mut Extras,
    dirty: &mut DirtySet,
    number: u32,
    conv: &mut Conversation,
    event: &ConversationEvent,
    sender: &UserId,
    mentions: &Mentions,
) {
    // Only members already held can have a join on record.
    let sender = users.find(sender);
    let mut mention_at = |extras: &mut Extras, conv: &mut Conversation, position: usize| {
        let slot = conv.members.slot_mut(position);
        if Some(slot.user()) == sender {
            return;
        }
        let mut member = slot.load(extras);
        // Not a touch of the member: `updated_at` stays theirs.
        if member.mention(event.seq) {
            slot.store(extras, &member);
            dirty.mark(number, conv, position, Outputs::STATE);
        }
    };
    if mentions.all {
        for position in 0..conv.members.len() {
            mention_at(extras, conv, position);
        }
    } else {
        for user in &mentions.users {
            if let Some(position) = users.find(user).and_then(|u| conv.members.position(u)) {
                mention_at(extras, conv, position);
            }
        }
    }
}

/// Applies a join (or a leave) at `version` to the member; a replayed or
/// older event than the last one applied changes nothing but listing.
/// Returns the outputs it concerns.
fn membership_event(member: &mut Member, version: MembershipVersion, joined: bool) -> Outputs {
    let mut outputs = if list(member) {
        Outputs::PUBLIC
    } else {
        Outputs::default()
    };
    if member.membership.is_none_or(|v| version > v) {
        if joined {
            // Unread 0 for history, but no credit as a reader of it.
            let join_seq = Seq(version.seq.get() + 1);
            if member.left || member.join_seq != join_seq {
                outputs = Outputs::BOTH;
            }
            member.join_seq = join_seq;
        } else if !member.left {
            outputs = Outputs::BOTH;
        }
        outputs = outputs.union(Outputs::STATE);
        member.membership = Some(version);
        member.epoch += 1;
        member.left = !joined;
    }
    if joined && advance(&mut member.cursor, version.seq) {
        outputs = outputs.union(Outputs::PUBLIC);
    }
    outputs
}

/// Lists the member (see [`Member::listed`]); returns whether they were not
/// listed before.
fn list(member: &mut Member) -> bool {
    !std::mem::replace(&mut member.listed, true)
}

/// Max-merge: returns whether the cursor moved forward.
fn advance(cursor: &mut Seq, seq: Seq) -> bool {
    if seq > *cursor {
        *cursor = seq;
        true
    } else {
        false
    }
}
