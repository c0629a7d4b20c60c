//! The changelogs, both ways: the records a flush produces, and the one
//! decoder every changelog reader uses (restore, the demo, the tests, and
//! every later reader), so that they all apply the same rules.
//!
//! A change goes to up to three topics: the by-conversation changelog when
//! what other members see changed, the by-user changelog always (it carries
//! the member's private cursor and unread mark for their own devices), and
//! the internal member-state topic when the private cursor, the mark or the
//! membership changed. A thread follower's change goes likewise to the
//! thread changelogs: by conversation when public, by user always, and the
//! internal thread-state topic when the private cursor changed or the
//! member left (with a record of the thread's own when its replies moved).

use readfold_core::fold::{
    Change, CursorUpdate, MemberStateUpdate, MembershipVersion, PartitionState, ThreadChange, ThreadKey,
    ThreadMark, ThreadStateChange, UnreadMark,
};
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, CursorKey, IdError, Mute, Seq, UserId};

use crate::codec::{
    self, write_cursor_update, write_key, write_member_state, write_thread_cursor, write_thread_key,
    write_thread_state, write_user_thread_key, CursorUpdateFields, DecodeError, MemberStateFields,
    ThreadCursorFields, ThreadMarkRecord, ThreadStateFields, Writer,
};
use crate::confluent::strip_changelog_frame;

/// One record to produce, partition chosen by readfold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutRecord {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(&'static str, String)>,
}

/// Partition counts of the output topics, read from the broker at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLayout {
    pub user_read_cursors_partitions: i32,
    pub user_thread_cursors_partitions: i32,
    pub dlq_partitions: i32,
}

/// Where the processor's output goes: topic names and partition counts.
/// The by-conversation changelog and the member-state topic use the input's
/// partition number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputTopics {
    pub read_cursors: String,
    pub user_read_cursors: String,
    pub member_state: String,
    pub thread_cursors: String,
    pub user_thread_cursors: String,
    pub thread_state: String,
    pub dlq: String,
    pub layout: OutputLayout,
}

impl OutputTopics {
    /// The topic of a changelog kind.
    pub fn topic_of(&self, kind: ChangelogKind) -> &str {
        match kind {
            ChangelogKind::ByConversation => &self.read_cursors,
            ChangelogKind::ByUser => &self.user_read_cursors,
            ChangelogKind::MemberState => &self.member_state,
            ChangelogKind::ThreadByConversation => &self.thread_cursors,
            ChangelogKind::ThreadByUser => &self.user_thread_cursors,
            ChangelogKind::ThreadState => &self.thread_state,
        }
    }
}

/// The by-conversation changelog value's fields: public ones only.
fn public_fields(u: &CursorUpdate) -> CursorUpdateFields<'_> {
    CursorUpdateFields {
        conversation_id: u.conversation_id.as_str(),
        user_id: u.user_id.as_str(),
        cursor: u.cursor.get() as i64,
        join_seq: u.join_seq.get() as i64,
        latest_seq: u.latest_seq.get() as i64,
        updated_at: u.updated_at,
        private_cursor: None,
        unread_mark: None,
        delivered_cursor: Some(u.delivered.get() as i64),
        unread_mentions: None,
        muted_until: None,
    }
}

/// The by-user changelog value's fields: the public ones of `public` (the
/// change's public update), and what only the member sees.
fn own_fields<'a>(public: &'a CursorUpdate, change: &Change) -> CursorUpdateFields<'a> {
    let own = change.member.own();
    CursorUpdateFields {
        private_cursor: Some(own.private_cursor.get() as i64),
        unread_mark: Some(own.marked_unread()),
        unread_mentions: Some(own.unread_mentions as i32),
        // Not muted after an unmute; a mute that ran out says until when.
        muted_until: own.mute.map(|m| m.until).filter(|&until| until != Mute::OFF),
        ..public_fields(public)
    }
}

fn member_state_fields(s: &MemberStateUpdate) -> MemberStateFields<'_> {
    MemberStateFields {
        conversation_id: s.key.conversation_id.as_str(),
        user_id: s.key.user_id.as_str(),
        private_cursor: s.private_cursor.get() as i64,
        mark_at: s.mark.map(|m| m.at),
        mark_seq: s.mark.and_then(|m| m.seq).map(|q| q.get() as i64),
        left: s.left,
        membership_seq: s.membership.map(|v| v.seq.get() as i64),
        membership_at: s.membership.map(|v| v.at),
        epoch: s.epoch as i64,
        updated_at: s.updated_at,
        mentions: s.mentions.iter().map(|q| q.get() as i64).collect(),
        mute_at: s.mute.map(|m| m.at),
        muted_until: s.mute.map(|m| m.until),
    }
}

/// The records of one change (see the module documentation): the
/// by-conversation changelog and the member-state topic on the input
/// partition, the by-user changelog on murmur2(user_id). As records of
/// their own, for readers and tests; a flush encodes into
/// [`EncodedRecords`].
pub fn changelog_records(change: &Change, input_partition: i32, out: &OutputTopics) -> Vec<OutRecord> {
    let mut encoded = EncodedRecords::with_capacity(1);
    encoded.push_change(change, input_partition, &out.layout, &ChangelogFrames::default());
    encoded.to_out_records(out)
}

/// The Confluent schema ids (key, value) to frame each changelog's records
/// with; `None`: plain Avro.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangelogFrames {
    pub by_conversation: Option<(u32, u32)>,
    pub by_user: Option<(u32, u32)>,
    pub member_state: Option<(u32, u32)>,
    pub thread_by_conversation: Option<(u32, u32)>,
    pub thread_by_user: Option<(u32, u32)>,
    pub thread_state: Option<(u32, u32)>,
}

impl ChangelogFrames {
    fn of(&self, kind: ChangelogKind) -> Option<(u32, u32)> {
        match kind {
            ChangelogKind::ByConversation => self.by_conversation,
            ChangelogKind::ByUser => self.by_user,
            ChangelogKind::MemberState => self.member_state,
            ChangelogKind::ThreadByConversation => self.thread_by_conversation,
            ChangelogKind::ThreadByUser => self.thread_by_user,
            ChangelogKind::ThreadState => self.thread_state,
        }
    }
}

/// Changelog records encoded back to back into one buffer. A flush encodes
/// hundreds of thousands of records; as an [`OutRecord`] each, with their
/// ids copied into `String`s on the way, every change would take over a
/// dozen allocations. Here a chunk of changes takes two.
#[derive(Clone, Debug, Default)]
pub struct EncodedRecords {
    bytes: Vec<u8>,
    records: Vec<EncodedRecord>,
    /// Records (by index range, in order) that carry a W3C `traceparent`
    /// header: few, so kept apart from `records`.
    traced: Vec<(std::ops::Range<usize>, Box<str>)>,
}

/// Where one record's key and value lie in [`EncodedRecords::bytes`]: the
/// key from `key_start`, the value from `value_start` to `end`.
#[derive(Clone, Copy, Debug)]
struct EncodedRecord {
    kind: ChangelogKind,
    partition: i32,
    key_start: usize,
    value_start: usize,
    end: usize,
    tombstone: bool,
}

/// One record of [`EncodedRecords`], borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodedRef<'a> {
    pub kind: ChangelogKind,
    pub partition: i32,
    pub key: &'a [u8],
    /// `None` is a tombstone.
    pub value: Option<&'a [u8]>,
    /// The `traceparent` header it carries, if traced.
    pub traceparent: Option<&'a str>,
}

/// Bytes a record takes, about: two short ids and a few varints.
const RECORD_BYTES: usize = 48;

impl EncodedRecords {
    /// Room for the records of about `changes` changes.
    pub fn with_capacity(changes: usize) -> Self {
        EncodedRecords {
            bytes: Vec::with_capacity(changes * 2 * RECORD_BYTES),
            records: Vec::with_capacity(changes * 2),
            traced: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Appends the records of one change (see [`changelog_records`]),
    /// framed as `frames` says.
    pub fn push_change(
        &mut self,
        change: &Change,
        input_partition: i32,
        layout: &OutputLayout,
        frames: &ChangelogFrames,
    ) {
        let (conversation_id, user_id) = (change.key.conversation_id.as_str(), change.key.user_id.as_str());
        let public = change.public_update();
        if change.outputs.public {
            let value = public.as_ref().map(public_fields);
            self.push(
                ChangelogKind::ByConversation,
                input_partition,
                frames,
                |w| write_key(w, conversation_id, user_id),
                value.map(|v| move |w: &mut Writer| write_cursor_update(w, &v)),
            );
        }
        let own = public.as_ref().map(|p| own_fields(p, change));
        self.push(
            ChangelogKind::ByUser,
            partition_for_key(user_id.as_bytes(), layout.user_read_cursors_partitions),
            frames,
            |w| write_key(w, user_id, conversation_id),
            own.map(|v| move |w: &mut Writer| write_cursor_update(w, &v)),
        );
        if change.outputs.state {
            let state = change.state_update();
            let value = member_state_fields(&state);
            self.push(
                ChangelogKind::MemberState,
                input_partition,
                frames,
                |w| write_key(w, conversation_id, user_id),
                Some(move |w: &mut Writer| write_member_state(w, &value)),
            );
        }
    }

    /// Appends the records of one thread follower's change (see the module
    /// documentation).
    pub fn push_thread_change(
        &mut self,
        change: &ThreadChange,
        input_partition: i32,
        layout: &OutputLayout,
        frames: &ChangelogFrames,
    ) {
        let key = &change.key;
        let (conversation_id, user_id) = (key.conversation_id.as_str(), key.user_id.as_str());
        let thread = key.thread.get() as i64;
        let fields = |private_cursor| ThreadCursorFields {
            conversation_id,
            thread,
            user_id,
            cursor: change.cursor.get() as i64,
            join_seq: change.join_seq.get() as i64,
            latest_seq: change.latest_seq.get() as i64,
            updated_at: change.updated_at,
            private_cursor,
        };
        if change.outputs.public {
            let value = change.present.then(|| fields(None));
            self.push(
                ChangelogKind::ThreadByConversation,
                input_partition,
                frames,
                |w| write_thread_key(w, conversation_id, thread, user_id),
                value.map(|v| move |w: &mut Writer| write_thread_cursor(w, &v)),
            );
        }
        let own = change
            .present
            .then(|| fields(Some(change.private_cursor.get() as i64)));
        self.push(
            ChangelogKind::ThreadByUser,
            partition_for_key(user_id.as_bytes(), layout.user_thread_cursors_partitions),
            frames,
            |w| write_user_thread_key(w, user_id, conversation_id, thread),
            own.map(|v| move |w: &mut Writer| write_thread_cursor(w, &v)),
        );
        if change.outputs.state {
            self.push_thread_state_fields(
                input_partition,
                frames,
                &ThreadStateFields {
                    conversation_id,
                    thread,
                    user_id,
                    cursor: change.cursor.get() as i64,
                    private_cursor: change.private_cursor.get() as i64,
                    updated_at: change.updated_at,
                    latest_seq: change.latest_seq.get() as i64,
                    last_reply_seq: None,
                    last_reply_at: None,
                    marks: &[],
                },
            );
        }
    }

    /// Appends the thread-state record of a thread's own state.
    pub fn push_thread_state(
        &mut self,
        state: &ThreadStateChange,
        input_partition: i32,
        frames: &ChangelogFrames,
    ) {
        let marks: Vec<ThreadMarkRecord> = state
            .marks
            .iter()
            .map(|m| ThreadMarkRecord {
                thread_seq: m.thread_seq.get() as i64,
                seq: m.version.seq.get() as i64,
                at: m.version.at,
            })
            .collect();
        self.push_thread_state_fields(
            input_partition,
            frames,
            &ThreadStateFields {
                conversation_id: state.conversation_id.as_str(),
                thread: state.thread.get() as i64,
                user_id: "",
                cursor: 0,
                private_cursor: 0,
                updated_at: state.last_reply.map_or(0, |v| v.at),
                latest_seq: state.latest_seq.get() as i64,
                last_reply_seq: state.last_reply.map(|v| v.seq.get() as i64),
                last_reply_at: state.last_reply.map(|v| v.at),
                marks: &marks,
            },
        );
    }

    fn push_thread_state_fields(
        &mut self,
        partition: i32,
        frames: &ChangelogFrames,
        value: &ThreadStateFields<'_>,
    ) {
        self.push(
            ChangelogKind::ThreadState,
            partition,
            frames,
            |w| write_thread_key(w, value.conversation_id, value.thread, value.user_id),
            Some(|w: &mut Writer| write_thread_state(w, value)),
        );
    }

    /// [`EncodedRecords::push_change`], each record carrying `traceparent`.
    pub fn push_traced_change(
        &mut self,
        change: &Change,
        input_partition: i32,
        layout: &OutputLayout,
        frames: &ChangelogFrames,
        traceparent: &str,
    ) {
        let first = self.records.len();
        self.push_change(change, input_partition, layout, frames);
        self.traced.push((first..self.records.len(), traceparent.into()));
    }

    /// The `traceparent` of record `index`, if it has one.
    fn traceparent_of(&self, index: usize) -> Option<&str> {
        if self.traced.is_empty() {
            return None;
        }
        let after = self.traced.partition_point(|(range, _)| range.start <= index);
        let (range, traceparent) = self.traced.get(after.checked_sub(1)?)?;
        range.contains(&index).then_some(&**traceparent)
    }

    fn push(
        &mut self,
        kind: ChangelogKind,
        partition: i32,
        frames: &ChangelogFrames,
        key: impl FnOnce(&mut Writer),
        value: Option<impl FnOnce(&mut Writer)>,
    ) {
        let frame = frames.of(kind);
        let mut w = Writer::appending(std::mem::take(&mut self.bytes));
        let key_start = w.len();
        if let Some((key_id, _)) = frame {
            w.confluent_frame(key_id);
        }
        key(&mut w);
        let value_start = w.len();
        let tombstone = value.is_none();
        if let Some(value) = value {
            if let Some((_, value_id)) = frame {
                w.confluent_frame(value_id);
            }
            value(&mut w);
        }
        let end = w.len();
        self.bytes = w.into_bytes();
        self.records.push(EncodedRecord {
            kind,
            partition,
            key_start,
            value_start,
            end,
            tombstone,
        });
    }

    /// The records, in the order they were pushed.
    pub fn iter(&self) -> impl Iterator<Item = EncodedRef<'_>> {
        self.records.iter().enumerate().map(|(i, r)| EncodedRef {
            kind: r.kind,
            partition: r.partition,
            key: &self.bytes[r.key_start..r.value_start],
            value: (!r.tombstone).then(|| &self.bytes[r.value_start..r.end]),
            traceparent: self.traceparent_of(i),
        })
    }

    /// The records as [`OutRecord`]s, to `out`'s topics.
    pub fn to_out_records(&self, out: &OutputTopics) -> Vec<OutRecord> {
        self.iter()
            .map(|r| OutRecord {
                topic: out.topic_of(r.kind).to_owned(),
                partition: r.partition,
                key: Some(r.key.to_vec()),
                value: r.value.map(<[u8]>::to_vec),
                headers: r
                    .traceparent
                    .map(|t| (crate::TRACEPARENT_HEADER, t.to_owned()))
                    .into_iter()
                    .collect(),
            })
            .collect()
    }
}

/// A by-user changelog value: the public fields, and what only the member's
/// own devices see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnUpdate {
    pub update: CursorUpdate,
    pub private_cursor: Seq,
    /// Whether the member has the conversation marked unread.
    pub unread_mark: bool,
    /// Unread mentions, at most 100.
    pub unread_mentions: u32,
    /// Muted while the time is below this; `None`: not muted.
    pub muted_until: Option<i64>,
}

/// One decoded changelog record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangelogEntry {
    /// A member's public cursor (by-conversation changelog).
    Upsert(CursorUpdate),
    /// A member's own view (by-user changelog).
    Own(OwnUpdate),
    /// A tombstone: the member left.
    Left(CursorKey),
    /// A member-state record.
    State(MemberStateUpdate),
    /// A record of one of the thread changelogs.
    Thread(ThreadEntry),
}

/// One decoded record of the thread changelogs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThreadEntry {
    /// A follower's cursor (by conversation; by user with the private one).
    Cursor(ThreadCursorUpdate),
    /// A tombstone: the follower left the conversation.
    Left(ThreadKey),
    /// A follower's thread-state record.
    Follower {
        key: ThreadKey,
        cursor: Seq,
        private_cursor: Seq,
        updated_at: i64,
    },
    /// A thread's own thread-state record.
    State(ThreadStateChange),
}

/// A thread changelog value: one follower's cursor in one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadCursorUpdate {
    pub key: ThreadKey,
    pub cursor: Seq,
    pub join_seq: Seq,
    pub latest_seq: Seq,
    pub updated_at: i64,
    /// On the by-user thread changelog only.
    pub private_cursor: Option<Seq>,
}

impl ThreadEntry {
    fn restore_into(&self, state: &mut PartitionState) {
        match self {
            ThreadEntry::Cursor(c) => {
                state.restore_thread_cursor(&c.key, c.cursor, c.latest_seq, c.updated_at)
            }
            // The follower's thread-state record carries their cursors.
            ThreadEntry::Left(_) => {}
            ThreadEntry::Follower {
                key,
                cursor,
                private_cursor,
                updated_at,
            } => state.restore_thread_follower(key, *cursor, *private_cursor, *updated_at),
            ThreadEntry::State(s) => state.restore_thread_state(s),
        }
    }

    pub fn conversation_id(&self) -> &ConversationId {
        match self {
            ThreadEntry::Cursor(c) => &c.key.conversation_id,
            ThreadEntry::Left(key) | ThreadEntry::Follower { key, .. } => &key.conversation_id,
            ThreadEntry::State(s) => &s.conversation_id,
        }
    }
}

impl ChangelogEntry {
    /// Applies the entry to a partition's state, as a restore does.
    pub fn restore_into(&self, state: &mut PartitionState) {
        match self {
            ChangelogEntry::Upsert(u) => state.restore_update(u),
            ChangelogEntry::Own(own) => state.restore_update(&own.update),
            ChangelogEntry::Left(key) => state.restore_tombstone(key),
            ChangelogEntry::State(s) => state.restore_state(s),
            ChangelogEntry::Thread(t) => t.restore_into(state),
        }
    }

    /// The member the entry is of; `None` for a thread changelog's.
    pub fn key(&self) -> Option<CursorKey> {
        match self {
            ChangelogEntry::Upsert(u) => Some(u.key()),
            ChangelogEntry::Own(own) => Some(own.update.key()),
            ChangelogEntry::Left(k) => Some(k.clone()),
            ChangelogEntry::State(s) => Some(s.key.clone()),
            ChangelogEntry::Thread(_) => None,
        }
    }

    pub fn conversation_id(&self) -> &ConversationId {
        match self {
            ChangelogEntry::Upsert(u) => &u.conversation_id,
            ChangelogEntry::Own(own) => &own.update.conversation_id,
            ChangelogEntry::Left(k) => &k.conversation_id,
            ChangelogEntry::State(s) => &s.key.conversation_id,
            ChangelogEntry::Thread(t) => t.conversation_id(),
        }
    }
}

/// Why a changelog record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangelogError {
    #[error("changelog record without a key")]
    MissingKey,
    #[error("unreadable changelog key: {0}")]
    Key(#[source] DecodeError),
    #[error("unreadable changelog value: {0}")]
    Value(#[source] DecodeError),
    #[error("invalid id in changelog key: {0}")]
    Id(#[from] IdError),
    #[error("a member-state record without a value (readfold never writes one)")]
    StateTombstone,
    #[error("a thread changelog key names thread {0}: threads are numbered from 1")]
    Thread(i64),
}

/// Which topic a record is from: the key and value schemas differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangelogKind {
    /// `chat.read-cursors`, keyed by `CursorKey`.
    ByConversation,
    /// `chat.user-read-cursors`, keyed by `UserCursorKey`.
    ByUser,
    /// The internal member-state topic, keyed by `CursorKey`.
    MemberState,
    /// `chat.thread-cursors`, keyed by `ThreadCursorKey`.
    ThreadByConversation,
    /// `chat.user-thread-cursors`, keyed by `UserThreadCursorKey`.
    ThreadByUser,
    /// The internal thread-state topic, keyed by `ThreadCursorKey`.
    ThreadState,
}

impl ChangelogKind {
    /// Every kind, in the order a flush's records go out.
    pub const ALL: [ChangelogKind; 6] = [
        ChangelogKind::ByConversation,
        ChangelogKind::ByUser,
        ChangelogKind::MemberState,
        ChangelogKind::ThreadByConversation,
        ChangelogKind::ThreadByUser,
        ChangelogKind::ThreadState,
    ];
}

/// The conversation and latest seq a by-conversation changelog value
/// carries, read without building the record (a reader that follows every
/// conversation's latest seq sees a record per cursor change); `None` for a
/// tombstone or what does not decode. The value names its conversation, so
/// the key is not read.
pub fn latest_seq_of(value: Option<&[u8]>, max_id_bytes: usize) -> Option<(ConversationId, Seq)> {
    let (conversation, latest) = codec::cursor_update_latest(strip_changelog_frame(value?))?;
    let conversation = ConversationId::parse(conversation, max_id_bytes).ok()?;
    Some((conversation, Seq(latest.max(0) as u64)))
}

/// Decodes one changelog record. The key names the member; the value (none
/// for a tombstone) carries the state. Values are clamped into the ranges
/// the fold produces (cursors >= 0, join_seq >= 1, latest_seq >= 0), so a
/// reader never holds a value the fold could not have.
pub fn decode_changelog(
    kind: ChangelogKind,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    max_id_bytes: usize,
) -> Result<ChangelogEntry, ChangelogError> {
    // Written with or without a schema registry: both read the same.
    let key = strip_changelog_frame(key.ok_or(ChangelogError::MissingKey)?);
    let value = value.map(strip_changelog_frame);
    let (conversation_id, user_id) = match kind {
        ChangelogKind::ByConversation | ChangelogKind::MemberState => {
            let k = codec::decode_cursor_key(key).map_err(ChangelogError::Key)?;
            (k.conversation_id, k.user_id)
        }
        ChangelogKind::ByUser => {
            let k = codec::decode_user_cursor_key(key).map_err(ChangelogError::Key)?;
            (k.conversation_id, k.user_id)
        }
        ChangelogKind::ThreadByConversation | ChangelogKind::ThreadByUser | ChangelogKind::ThreadState => {
            return decode_thread_changelog(kind, key, value, max_id_bytes).map(ChangelogEntry::Thread);
        }
    };
    let key = CursorKey {
        conversation_id: ConversationId::parse(&conversation_id, max_id_bytes)?,
        user_id: UserId::parse(&user_id, max_id_bytes)?,
    };
    let seq = |n: i64| Seq(n.max(0) as u64);
    if kind == ChangelogKind::MemberState {
        let value = value.ok_or(ChangelogError::StateTombstone)?;
        let v = codec::decode_member_state(value).map_err(ChangelogError::Value)?;
        return Ok(ChangelogEntry::State(MemberStateUpdate {
            key,
            private_cursor: seq(v.private_cursor),
            mark: v.mark_at.map(|at| UnreadMark {
                at,
                seq: v.mark_seq.map(seq),
            }),
            left: v.left,
            membership: v
                .membership_seq
                .zip(v.membership_at)
                .map(|(s, at)| MembershipVersion { seq: seq(s), at }),
            epoch: v.epoch.max(0) as u64,
            mentions: v.mentions.iter().map(|&s| seq(s)).collect(),
            mute: v.mute_at.zip(v.muted_until).map(|(at, until)| Mute { at, until }),
            updated_at: v.updated_at,
        }));
    }
    let Some(value) = value else {
        return Ok(ChangelogEntry::Left(key));
    };
    let v = codec::decode_cursor_update(value).map_err(ChangelogError::Value)?;
    let update = CursorUpdate {
        conversation_id: key.conversation_id,
        user_id: key.user_id,
        cursor: seq(v.cursor),
        // Earlier writers knew no delivery: reading implies it.
        delivered: seq(v.delivered_cursor.unwrap_or(v.cursor).max(v.cursor)),
        join_seq: Seq(v.join_seq.max(1) as u64),
        latest_seq: seq(v.latest_seq),
        updated_at: v.updated_at,
    };
    Ok(match kind {
        ChangelogKind::ByUser => ChangelogEntry::Own(OwnUpdate {
            update,
            // v1.0 records carry neither: nothing private then.
            private_cursor: seq(v.private_cursor.unwrap_or(0)),
            unread_mark: v.unread_mark.unwrap_or(false),
            unread_mentions: v.unread_mentions.unwrap_or(0).max(0) as u32,
            muted_until: v.muted_until,
        }),
        _ => ChangelogEntry::Upsert(update),
    })
}

/// [`decode_changelog`] of a thread changelog's record, its frame stripped.
fn decode_thread_changelog(
    kind: ChangelogKind,
    key: &[u8],
    value: Option<&[u8]>,
    max_id_bytes: usize,
) -> Result<ThreadEntry, ChangelogError> {
    let shape = |name| ChangelogError::Key(DecodeError::Shape(name));
    let k = match kind {
        ChangelogKind::ThreadByUser => {
            codec::decode_user_thread_key(key).ok_or(shape("UserThreadCursorKey"))?
        }
        _ => codec::decode_thread_key(key).ok_or(shape("ThreadCursorKey"))?,
    };
    if k.thread < 1 {
        return Err(ChangelogError::Thread(k.thread));
    }
    let (conversation_id, thread) = (
        ConversationId::parse(&k.conversation_id, max_id_bytes)?,
        Seq(k.thread as u64),
    );
    let seq = |n: i64| Seq(n.max(0) as u64);
    let value_shape = |name| ChangelogError::Value(DecodeError::Shape(name));
    if kind == ChangelogKind::ThreadState {
        let value = value.ok_or(ChangelogError::StateTombstone)?;
        let v = codec::decode_thread_state(value).ok_or(value_shape("ThreadState"))?;
        if k.user_id.is_empty() {
            return Ok(ThreadEntry::State(ThreadStateChange {
                conversation_id,
                thread,
                latest_seq: seq(v.latest_seq),
                last_reply: v
                    .last_reply_seq
                    .zip(v.last_reply_at)
                    .map(|(s, at)| MembershipVersion { seq: seq(s), at }),
                marks: v
                    .marks
                    .iter()
                    .map(|m| ThreadMark {
                        thread_seq: seq(m.thread_seq),
                        version: MembershipVersion {
                            seq: seq(m.seq),
                            at: m.at,
                        },
                    })
                    .collect(),
            }));
        }
        return Ok(ThreadEntry::Follower {
            key: ThreadKey {
                conversation_id,
                thread,
                user_id: UserId::parse(&k.user_id, max_id_bytes)?,
            },
            cursor: seq(v.cursor),
            private_cursor: seq(v.private_cursor),
            updated_at: v.updated_at,
        });
    }
    let key = ThreadKey {
        conversation_id,
        thread,
        user_id: UserId::parse(&k.user_id, max_id_bytes)?,
    };
    let Some(value) = value else {
        return Ok(ThreadEntry::Left(key));
    };
    let v = codec::decode_thread_cursor(value).ok_or(value_shape("ThreadCursorUpdate"))?;
    Ok(ThreadEntry::Cursor(ThreadCursorUpdate {
        key,
        cursor: seq(v.cursor),
        join_seq: Seq(v.join_seq.max(1) as u64),
        latest_seq: seq(v.latest_seq),
        updated_at: v.updated_at,
        private_cursor: v.private_cursor.map(seq),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CursorKeyRecord, CursorUpdateRecord};
    use readfold_core::fold::{ConversationEvent, EventKind, PartitionState, ReadReport, UnreadMarkReport};

    /// The default topic names, 5 by-user and 2 dead-letter partitions.
    pub(crate) fn out() -> OutputTopics {
        OutputTopics {
            thread_cursors: "chat.thread-cursors".into(),
            thread_state: "chat.read-thread-state".into(),
            user_thread_cursors: "chat.user-thread-cursors".into(),
            read_cursors: "chat.read-cursors".into(),
            user_read_cursors: "chat.user-read-cursors".into(),
            member_state: "chat.member-state".into(),
            dlq: "chat.read-reports.dlq".into(),
            layout: OutputLayout {
                user_thread_cursors_partitions: 4,
                user_read_cursors_partitions: 5,
                dlq_partitions: 2,
            },
        }
    }

    fn report(user: &str, seq: u64, private: bool) -> ReadReport {
        ReadReport {
            conversation_id: "G".parse().unwrap(),
            user_id: user.parse().unwrap(),
            seq: Seq(seq),
            reported_at: 9,
            private,
        }
    }

    fn event(seq: u64, kind: EventKind) -> ConversationEvent {
        ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: Seq(seq),
            at: 5,
            kind,
        }
    }

    /// The one change of `user` after folding `steps`.
    fn change_of(user: &str, steps: impl FnOnce(&mut PartitionState)) -> Change {
        let mut s = PartitionState::new();
        steps(&mut s);
        s.drain()
            .into_iter()
            .find(|c| c.key.user_id.as_str() == user)
            .unwrap()
    }

    fn topics(records: &[OutRecord]) -> Vec<&str> {
        records.iter().map(|r| r.topic.as_str()).collect()
    }

    #[test]
    fn an_upsert_goes_to_both_changelogs() {
        let change = change_of("alice", |s| {
            s.apply_event(&event(
                6,
                EventKind::MessageSent {
                    mentions: Default::default(),
                    sender_id: "bob".parse().unwrap(),
                },
            ));
            s.apply_report(&report("alice", 4, false));
        });
        let records = changelog_records(&change, 3, &out());
        assert_eq!(topics(&records), ["chat.read-cursors", "chat.user-read-cursors"]);
        let (by_conv, by_user) = (&records[0], &records[1]);
        assert_eq!(by_conv.partition, 3);
        assert_eq!(by_user.partition, partition_for_key(b"alice", 5));
        let value = codec::decode_cursor_update(by_conv.value.as_deref().unwrap()).unwrap();
        assert_eq!((value.cursor, value.latest_seq), (4, 6));
        assert_eq!(
            (value.private_cursor, value.unread_mark),
            (None, None),
            "nothing private"
        );
        let own = codec::decode_cursor_update(by_user.value.as_deref().unwrap()).unwrap();
        assert_eq!((own.cursor, own.latest_seq), (4, 6));
        assert_eq!((own.private_cursor, own.unread_mark), (Some(0), Some(false)));
        let key = codec::decode_user_cursor_key(by_user.key.as_deref().unwrap()).unwrap();
        assert_eq!(
            (key.user_id.as_str(), key.conversation_id.as_str()),
            ("alice", "G")
        );
    }

    #[test]
    fn a_traced_changes_records_carry_its_traceparent_and_no_others_do() {
        let [plain, traced, after] = ["alice", "bob", "carol"].map(|user| {
            change_of(user, |s| {
                s.apply_event(&event(
                    6,
                    EventKind::MessageSent {
                        mentions: Default::default(),
                        sender_id: "dave".parse().unwrap(),
                    },
                ));
                s.apply_report(&report(user, 4, false));
            })
        });
        let (out, frames) = (out(), ChangelogFrames::default());
        let mut encoded = EncodedRecords::with_capacity(3);
        encoded.push_change(&plain, 1, &out.layout, &frames);
        encoded.push_traced_change(&traced, 1, &out.layout, &frames, "00-ab-cd-01");
        encoded.push_change(&after, 1, &out.layout, &frames);
        let headers: Vec<_> = encoded.iter().map(|r| r.traceparent).collect();
        let t = Some("00-ab-cd-01");
        assert_eq!(headers, [None, None, t, t, None, None]);
        let records = encoded.to_out_records(&out);
        assert_eq!(records[2].headers, [("traceparent", "00-ab-cd-01".to_owned())]);
        assert!(records[4].headers.is_empty());
    }

    #[test]
    fn a_leave_is_a_tombstone_on_both_changelogs_and_kept_in_the_member_state() {
        let change = change_of("bob", |s| {
            s.apply_event(&event(
                0,
                EventKind::MemberJoined {
                    user_id: "bob".parse().unwrap(),
                },
            ));
            s.drain();
            s.apply_event(&event(
                1,
                EventKind::MemberLeft {
                    user_id: "bob".parse().unwrap(),
                },
            ));
        });
        let records = changelog_records(&change, 0, &out());
        assert_eq!(
            topics(&records),
            ["chat.read-cursors", "chat.user-read-cursors", "chat.member-state"]
        );
        assert!(records[0].value.is_none() && records[1].value.is_none());
        assert!(records.iter().all(|r| r.key.is_some()));
        let state = codec::decode_member_state(records[2].value.as_deref().unwrap()).unwrap();
        assert!(state.left);
        assert_eq!(state.epoch, 2);
    }

    #[test]
    fn a_private_receipt_or_a_mark_stays_off_the_by_conversation_changelog() {
        let change = change_of("alice", |s| {
            s.apply_event(&event(
                0,
                EventKind::MemberJoined {
                    user_id: "alice".parse().unwrap(),
                },
            ));
            s.drain();
            s.apply_report(&report("alice", 7, true));
            s.apply_mark(&UnreadMarkReport {
                conversation_id: "G".parse().unwrap(),
                user_id: "alice".parse().unwrap(),
                seq: Seq(7),
                at: 10,
                marked: true,
            });
        });
        let records = changelog_records(&change, 0, &out());
        assert_eq!(topics(&records), ["chat.user-read-cursors", "chat.member-state"]);
        let own = codec::decode_cursor_update(records[0].value.as_deref().unwrap()).unwrap();
        assert_eq!(
            (own.cursor, own.private_cursor, own.unread_mark),
            (0, Some(7), Some(true))
        );
    }

    #[test]
    fn the_decoder_reads_back_what_a_flush_writes() {
        let change = change_of("alice", |s| {
            s.apply_event(&event(
                1,
                EventKind::MemberJoined {
                    user_id: "alice".parse().unwrap(),
                },
            ));
            s.apply_report(&report("alice", 4, false));
            s.apply_report(&report("alice", 5, true));
        });
        let records = changelog_records(&change, 0, &out());
        let kinds = [
            ChangelogKind::ByConversation,
            ChangelogKind::ByUser,
            ChangelogKind::MemberState,
        ];
        let public = change.public_update().unwrap();
        let own = ChangelogEntry::Own(OwnUpdate {
            muted_until: None,
            unread_mentions: 0,
            update: public.clone(),
            private_cursor: Seq(5),
            unread_mark: false,
        });
        let expected = [
            ChangelogEntry::Upsert(public),
            own,
            ChangelogEntry::State(change.state_update()),
        ];
        for ((kind, record), want) in kinds.into_iter().zip(&records).zip(expected) {
            let entry = decode_changelog(kind, record.key.as_deref(), record.value.as_deref(), 256).unwrap();
            assert_eq!(entry, want, "{kind:?}");
        }
        let tomb = decode_changelog(
            ChangelogKind::ByConversation,
            records[0].key.as_deref(),
            None,
            256,
        )
        .unwrap();
        assert_eq!(tomb, ChangelogEntry::Left(change.key()));
        assert_eq!(
            decode_changelog(ChangelogKind::MemberState, records[2].key.as_deref(), None, 256),
            Err(ChangelogError::StateTombstone)
        );
    }

    #[test]
    fn the_decoder_clamps_values_into_the_folds_ranges_and_names_bad_records() {
        let key = codec::encode_cursor_key(&CursorKeyRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
        });
        let value = codec::encode_cursor_update(&CursorUpdateRecord {
            muted_until: None,
            unread_mentions: None,
            conversation_id: "G".into(),
            user_id: "u".into(),
            cursor: -5,
            join_seq: 0,
            latest_seq: -1,
            updated_at: 0,
            private_cursor: None,
            unread_mark: None,
            delivered_cursor: None,
        });
        let ChangelogEntry::Upsert(u) =
            decode_changelog(ChangelogKind::ByConversation, Some(&key), Some(&value), 256).unwrap()
        else {
            panic!("an upsert");
        };
        assert_eq!((u.cursor, u.join_seq, u.latest_seq), (Seq(0), Seq(1), Seq(0)));
        let bad =
            |k: Option<&[u8]>, v: Option<&[u8]>| decode_changelog(ChangelogKind::ByConversation, k, v, 256);
        assert_eq!(bad(None, None), Err(ChangelogError::MissingKey));
        assert!(matches!(bad(Some(b"\xff"), None), Err(ChangelogError::Key(_))));
        assert!(matches!(
            bad(Some(&key), Some(b"\xff")),
            Err(ChangelogError::Value(_))
        ));
        assert!(matches!(
            decode_changelog(ChangelogKind::ByConversation, Some(&key), None, 0),
            Err(ChangelogError::Id(_))
        ));
    }
}

#[cfg(test)]
mod thread_tests {
    use readfold_core::fold::{ConversationEvent, EventKind, ThreadReadReport};

    use super::tests::out;
    use super::*;

    fn event(seq: u64, at: i64, kind: EventKind) -> ConversationEvent {
        ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: Seq(seq),
            at,
            kind,
        }
    }

    fn joined(user: &str, seq: u64, at: i64) -> ConversationEvent {
        event(
            seq,
            at,
            EventKind::MemberJoined {
                user_id: user.parse().unwrap(),
            },
        )
    }

    fn reply(thread_seq: u64, sender: &str, at: i64) -> ConversationEvent {
        event(
            1,
            at,
            EventKind::ReplySent {
                thread: Seq(1),
                thread_seq: Seq(thread_seq),
                sender_id: sender.parse().unwrap(),
                mentions: vec!["carol".parse().unwrap()],
                starter_id: Some("alice".parse().unwrap()),
            },
        )
    }

    /// Every record a flush writes for a state's changes, members and
    /// threads, decoded by the one decoder and restored as a restore does
    /// (public changelog, member state, thread changelog, thread state),
    /// gives the live threads back.
    #[test]
    fn thread_records_decode_and_restore_to_the_live_threads() {
        let mut live = PartitionState::new();
        for (i, user) in ["alice", "bob", "carol"].into_iter().enumerate() {
            live.apply_event(&joined(user, 0, i as i64));
        }
        live.apply_event(&event(
            1,
            10,
            EventKind::MessageSent {
                sender_id: "alice".parse().unwrap(),
                mentions: Default::default(),
            },
        ));
        live.apply_event(&reply(1, "bob", 11));
        live.apply_event(&joined("dave", 1, 12));
        live.apply_event(&reply(2, "bob", 13));
        live.apply_thread_read(&ThreadReadReport {
            conversation_id: "G".parse().unwrap(),
            thread: Seq(1),
            user_id: "dave".parse().unwrap(),
            seq: Seq(2),
            reported_at: 14,
            private: true,
        });
        live.apply_event(&event(
            1,
            15,
            EventKind::MemberLeft {
                user_id: "carol".parse().unwrap(),
            },
        ));

        let (threads, states) = live.pending_thread_changes();
        let mut records = EncodedRecords::default();
        for change in live.drain() {
            records.push_change(&change, 0, &out().layout, &ChangelogFrames::default());
        }
        for change in &threads {
            records.push_thread_change(change, 0, &out().layout, &ChangelogFrames::default());
        }
        for state in &states {
            records.push_thread_state(state, 0, &ChangelogFrames::default());
        }
        let out = out();
        let kinds = [
            (ChangelogKind::ByConversation, &out.read_cursors),
            (ChangelogKind::MemberState, &out.member_state),
            (ChangelogKind::ThreadByConversation, &out.thread_cursors),
            (ChangelogKind::ThreadState, &out.thread_state),
        ];
        let mut restored = PartitionState::new();
        for (kind, topic) in kinds {
            for r in records.to_out_records(&out).iter().filter(|r| &r.topic == topic) {
                decode_changelog(kind, r.key.as_deref(), r.value.as_deref(), 64)
                    .unwrap()
                    .restore_into(&mut restored);
            }
        }
        let view = |s: &PartitionState| {
            s.conversation(&"G".parse().unwrap())
                .unwrap()
                .threads()
                .thread(Seq(1))
        };
        assert_eq!(view(&restored), view(&live));
        let live_view = view(&live).unwrap();
        assert_eq!(live_view.marks.len(), 2, "dave joined between the replies");

        // The by-user records carry the private cursor; a departed
        // follower's are tombstones.
        let own: Vec<ChangelogEntry> = records
            .to_out_records(&out)
            .iter()
            .filter(|r| r.topic == out.user_thread_cursors)
            .map(|r| {
                decode_changelog(
                    ChangelogKind::ThreadByUser,
                    r.key.as_deref(),
                    r.value.as_deref(),
                    64,
                )
                .unwrap()
            })
            .collect();
        let dave = own.iter().find_map(|e| match e {
            ChangelogEntry::Thread(ThreadEntry::Cursor(c)) if c.key.user_id.as_str() == "dave" => Some(c),
            _ => None,
        });
        assert_eq!(dave.unwrap().private_cursor, Some(Seq(2)));
        assert_eq!(dave.unwrap().join_seq, Seq(2));
        assert!(own.iter().any(
            |e| matches!(e, ChangelogEntry::Thread(ThreadEntry::Left(k)) if k.user_id.as_str() == "carol")
        ));
    }
}
