//! The fold: pure, I/O-free state of one input partition.
//!
//! Read reports and conversation events are folded with max-merge into
//! per-conversation cursors. Changed cursors are collected in a dirty set so
//! that many reports for one (conversation, user) inside a flush window leave
//! as one update. Nothing here knows about Kafka, time or threads.
//!
//! The two inputs are not ordered against each other, so the fold never
//! clamps a cursor to a `latest_seq` that may lag and never drops a report
//! because the member is not yet known: readers clamp (`unread`) and apply
//! membership (`read_count`).

use std::collections::{HashMap, HashSet};

use crate::domain::{ConversationId, CursorKey, Seq, UserId};
use crate::read_model::{ConversationView, MemberCursor};

#[cfg(test)]
mod tests;

/// A validated client read report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReport {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub seq: Seq,
    pub reported_at: i64,
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
    Event(ConversationEvent),
}

impl Input {
    pub fn conversation_id(&self) -> &ConversationId {
        match self {
            Input::Report(r) => &r.conversation_id,
            Input::Event(e) => &e.conversation_id,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    MessageSent { sender_id: UserId },
    MemberJoined { user_id: UserId },
    MemberLeft { user_id: UserId },
}

/// Orders membership events of one member: the later (seq, at) wins, so a
/// duplicate or replayed older join never undoes a later leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MembershipVersion {
    pub seq: Seq,
    pub at: i64,
}

/// One member's read state in one conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Has read every message with seq <= cursor.
    pub cursor: Seq,
    /// First seq the member can see: 1 unless they joined later.
    pub join_seq: Seq,
    /// Left members keep their cursor but count in no read count.
    pub left: bool,
    /// Version of the membership event that set `join_seq`/`left`.
    pub membership: Option<MembershipVersion>,
    /// Latest event time of any input that touched this member.
    pub updated_at: i64,
}

impl Member {
    fn new(updated_at: i64) -> Self {
        Member {
            cursor: Seq::ZERO,
            join_seq: Seq(1),
            left: false,
            membership: None,
            updated_at,
        }
    }

    /// The member as readers see them; `None` once they left.
    pub fn present(&self) -> Option<MemberCursor> {
        (!self.left).then_some(MemberCursor {
            cursor: self.cursor,
            join_seq: self.join_seq,
        })
    }
}

/// Read state of one conversation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conversation {
    /// Highest seq seen in any input; may lag behind cursors.
    pub latest_seq: Seq,
    pub members: HashMap<UserId, Member>,
}

impl Conversation {
    /// This conversation as readers see it: unread, read counts and
    /// who-read are answered by the [read model](crate::read_model).
    pub fn view(&self) -> ConversationView {
        ConversationView {
            latest_seq: self.latest_seq,
            members: self
                .members
                .iter()
                .filter_map(|(user, m)| Some((user.clone(), m.present()?)))
                .collect(),
        }
    }
}

/// What a flush publishes for one changed key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The member's current cursor.
    Upsert(CursorUpdate),
    /// The member left: a tombstone on the changelog.
    Left(CursorKey),
}

impl Change {
    pub fn key(&self) -> CursorKey {
        match self {
            Change::Upsert(u) => u.key(),
            Change::Left(k) => k.clone(),
        }
    }
}

/// The changelog value: one member's cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorUpdate {
    pub conversation_id: ConversationId,
    pub user_id: UserId,
    pub cursor: Seq,
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

/// All read state of one input partition, plus the keys changed since the
/// last successful flush.
#[derive(Clone, Debug, Default)]
pub struct PartitionState {
    conversations: HashMap<ConversationId, Conversation>,
    dirty: HashSet<CursorKey>,
}

impl PartitionState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn conversation(&self, id: &ConversationId) -> Option<&Conversation> {
        self.conversations.get(id)
    }

    pub fn conversations(&self) -> impl Iterator<Item = (&ConversationId, &Conversation)> {
        self.conversations.iter()
    }

    /// Folds one validated record of either input. Returns whether anything
    /// changed.
    pub fn apply(&mut self, input: &Input) -> bool {
        match input {
            Input::Report(r) => self.apply_report(r),
            Input::Event(e) => self.apply_event(e),
        }
    }

    /// Number of (conversation, user) cursors held.
    pub fn cursor_count(&self) -> usize {
        self.conversations.values().map(|c| c.members.len()).sum()
    }

    /// Number of keys changed since the last [`PartitionState::mark_flushed`].
    pub fn dirty_len(&self) -> usize {
        self.dirty.len()
    }

    /// Folds one read report. Returns whether any cursor moved.
    pub fn apply_report(&mut self, report: &ReadReport) -> bool {
        let conv = self
            .conversations
            .entry(report.conversation_id.clone())
            .or_default();
        let (member, created) = member_entry(conv, &report.user_id, report.reported_at);
        let moved = advance(member, report.seq);
        if moved || created {
            self.mark_dirty(&report.conversation_id, &report.user_id);
        }
        moved
    }

    /// Folds one conversation event. Returns whether any member changed.
    pub fn apply_event(&mut self, event: &ConversationEvent) -> bool {
        let conv = self
            .conversations
            .entry(event.conversation_id.clone())
            .or_default();
        conv.latest_seq = conv.latest_seq.max(event.seq);
        let version = MembershipVersion {
            seq: event.seq,
            at: event.at,
        };
        let (user, changed) = match &event.kind {
            EventKind::MessageSent { sender_id } => {
                // The sender has read what they wrote.
                let (member, created) = member_entry(conv, sender_id, event.at);
                (sender_id, advance(member, event.seq) || created)
            }
            EventKind::MemberJoined { user_id } => {
                let (member, created) = member_entry(conv, user_id, event.at);
                let mut changed = created;
                if member.membership.is_none_or(|v| version > v) {
                    // Unread 0 for history, but no credit as a reader of it.
                    let join_seq = Seq(event.seq.get() + 1);
                    changed |= member.left || member.join_seq != join_seq;
                    member.membership = Some(version);
                    member.left = false;
                    member.join_seq = join_seq;
                }
                changed |= advance(member, event.seq);
                (user_id, changed)
            }
            EventKind::MemberLeft { user_id } => {
                let (member, created) = member_entry(conv, user_id, event.at);
                let mut changed = created;
                if member.membership.is_none_or(|v| version > v) {
                    changed |= !member.left;
                    member.membership = Some(version);
                    member.left = true;
                }
                (user_id, changed)
            }
        };
        if changed {
            let user = user.clone();
            self.mark_dirty(&event.conversation_id, &user);
        }
        changed
    }

    /// Rebuilds state from a changelog record (restore). Marks nothing dirty:
    /// the changelog already holds it.
    pub fn restore_update(&mut self, update: &CursorUpdate) {
        let conv = self
            .conversations
            .entry(update.conversation_id.clone())
            .or_default();
        conv.latest_seq = conv.latest_seq.max(update.latest_seq).max(update.cursor);
        let (member, _) = member_entry(conv, &update.user_id, update.updated_at);
        member.cursor = member.cursor.max(update.cursor);
        member.join_seq = update.join_seq;
        member.left = false;
        // A replayed join older than this record must not change anything.
        member.membership = (update.join_seq > Seq(1)).then_some(MembershipVersion {
            seq: Seq(update.join_seq.get() - 1),
            at: i64::MIN,
        });
        member.updated_at = member.updated_at.max(update.updated_at);
    }

    /// Applies a changelog tombstone (restore): the member has left.
    pub fn restore_tombstone(&mut self, key: &CursorKey) {
        let conv = self.conversations.entry(key.conversation_id.clone()).or_default();
        let (member, _) = member_entry(conv, &key.user_id, i64::MIN);
        member.left = true;
        member.membership = member.membership.or(Some(MembershipVersion {
            seq: Seq::ZERO,
            at: i64::MIN,
        }));
    }

    /// The current value of every dirty key, without clearing the dirty set,
    /// so that a failed flush can be retried with values at least as new.
    pub fn pending_changes(&self) -> Vec<Change> {
        self.dirty.iter().map(|key| self.change_for(key)).collect()
    }

    /// Forgets the dirty set after every sink has acknowledged.
    pub fn mark_flushed(&mut self) {
        self.dirty.clear();
    }

    /// `pending_changes` followed by `mark_flushed`.
    pub fn drain(&mut self) -> Vec<Change> {
        let changes = self.pending_changes();
        self.mark_flushed();
        changes
    }

    /// Whether a key changed since the last flush.
    pub fn is_dirty(&self, key: &CursorKey) -> bool {
        self.dirty.contains(key)
    }

    /// The keys changed since the last flush.
    pub fn dirty_keys(&self) -> impl Iterator<Item = &CursorKey> {
        self.dirty.iter()
    }

    /// Every (conversation, user) held.
    pub fn keys(&self) -> impl Iterator<Item = CursorKey> + '_ {
        self.conversations.iter().flat_map(|(c, conv)| {
            conv.members.keys().map(move |u| CursorKey {
                conversation_id: c.clone(),
                user_id: u.clone(),
            })
        })
    }

    /// The current value of a key, as a flush would publish it.
    pub fn current(&self, key: &CursorKey) -> Option<Change> {
        let conv = self.conversations.get(&key.conversation_id)?;
        conv.members
            .contains_key(&key.user_id)
            .then(|| self.change_for(key))
    }

    fn change_for(&self, key: &CursorKey) -> Change {
        let conv = &self.conversations[&key.conversation_id];
        let member = &conv.members[&key.user_id];
        if member.left {
            return Change::Left(key.clone());
        }
        Change::Upsert(CursorUpdate {
            conversation_id: key.conversation_id.clone(),
            user_id: key.user_id.clone(),
            cursor: member.cursor,
            join_seq: member.join_seq,
            latest_seq: conv.latest_seq,
            updated_at: member.updated_at,
        })
    }

    fn mark_dirty(&mut self, conversation_id: &ConversationId, user_id: &UserId) {
        self.dirty.insert(CursorKey {
            conversation_id: conversation_id.clone(),
            user_id: user_id.clone(),
        });
    }
}

/// The member's entry, created with defaults when unknown; the flag says
/// whether it was created. Touching a member raises its `updated_at`.
fn member_entry<'a>(conv: &'a mut Conversation, user: &UserId, at: i64) -> (&'a mut Member, bool) {
    let mut created = false;
    let member = conv.members.entry(user.clone()).or_insert_with(|| {
        created = true;
        Member::new(at)
    });
    member.updated_at = member.updated_at.max(at);
    (member, created)
}

/// Max-merge: returns whether the cursor moved forward.
fn advance(member: &mut Member, seq: Seq) -> bool {
    if seq > member.cursor {
        member.cursor = seq;
        true
    } else {
        false
    }
}
