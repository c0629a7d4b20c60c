//! The replay's state: the core fold's [`PartitionState`] over every input
//! partition (conversations never span partitions, so one state holds them
//! all), plus what analysts ask for that the live fold never keeps: message
//! senders for read counts and open messages for read latency. Pure: records
//! in, rows out.

use std::collections::{BTreeMap, HashMap, HashSet};

use readfold_core::fold::{thread_own_unread, EventKind, Input, PartitionState};
use readfold_core::{ConversationId, Seq, UserId};

use readfold_wire::changelog::ChangelogError;
use readfold_wire::{ChangelogEntry, Rejection};

use crate::latency::{LatencyRow, LatencyTracker};
use crate::table::{TableKind, Value};

/// One decoded record of whichever topics the replay reads.
pub enum Record {
    /// An input record, or why the processor would dead-letter it.
    Input(Result<Input, Rejection>),
    /// A changelog record, or why it cannot be read.
    Changelog(Result<ChangelogEntry, ChangelogError>),
}

/// What a replay saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records folded.
    pub folded: u64,
    /// Records the processor would have dead-lettered, by reason.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Records of conversations not asked for.
    pub other_conversations: u64,
}

/// Sender and send time of each message seq of one conversation.
type Messages = BTreeMap<u64, (UserId, i64)>;

pub struct Replayer {
    state: PartitionState,
    only: Option<HashSet<ConversationId>>,
    /// Sender and send time of every message, for the read-counts table.
    senders: Option<HashMap<ConversationId, Messages>>,
    latency: Option<LatencyTracker>,
    stats: Stats,
}

impl Replayer {
    /// A replayer for `table`, over `conversations` only when any are given.
    pub fn new(table: TableKind, conversations: &[ConversationId], latency_max_open: usize) -> Self {
        Replayer {
            state: PartitionState::untracked(),
            only: (!conversations.is_empty()).then(|| conversations.iter().cloned().collect()),
            senders: (table == TableKind::ReadCounts).then(HashMap::new),
            latency: (table == TableKind::Latency).then(|| LatencyTracker::new(latency_max_open)),
            stats: Stats::default(),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Folds one record of either kind.
    pub fn fold(&mut self, record: Record) {
        match record {
            Record::Input(Ok(input)) => self.apply(&input),
            Record::Input(Err(rejection)) => self.reject(rejection.reason.as_str()),
            Record::Changelog(Ok(entry)) => self.restore(&entry),
            Record::Changelog(Err(_)) => self.reject("changelog_unreadable"),
        }
    }

    /// Applies a changelog record as a restore does.
    pub fn restore(&mut self, entry: &ChangelogEntry) {
        if self.wanted(entry.conversation_id()) {
            entry.restore_into(&mut self.state);
        }
    }

    /// Whether a record of conversation `id` is folded (all are, unless
    /// conversations were named); counts it either way.
    fn wanted(&mut self, id: &ConversationId) -> bool {
        let wanted = self.only.as_ref().is_none_or(|only| only.contains(id));
        if wanted {
            self.stats.folded += 1;
        } else {
            self.stats.other_conversations += 1;
        }
        wanted
    }

    /// Counts a record the processor's validation rejects.
    pub fn reject(&mut self, reason: &'static str) {
        *self.stats.rejected.entry(reason).or_default() += 1;
    }

    /// Folds one validated record.
    pub fn apply(&mut self, input: &Input) {
        let id = input.conversation_id();
        if !self.wanted(id) {
            return;
        }
        // Whose public cursor this record may move, and when.
        let mover = match input {
            Input::Report(r) if !r.private => Some((&r.user_id, r.reported_at)),
            Input::Event(e) => match &e.kind {
                EventKind::MessageSent { sender_id, .. } => Some((sender_id, e.at)),
                _ => None,
            },
            _ => None,
        };
        let before = match (&self.latency, mover) {
            (Some(_), Some((user, _))) => self.cursor(id, user),
            _ => Seq::ZERO,
        };
        self.state.apply(input);
        if let (Some(tracker), Some((user, at))) = (&mut self.latency, mover) {
            let conversation = self.state.conversation(id).expect("just folded");
            let after = conversation.member(user).map_or(Seq::ZERO, |m| m.cursor);
            if after > before {
                tracker.advanced(id, conversation, user, before, after, at);
            }
        }
        if let Input::Event(e) = input {
            if let EventKind::MessageSent { sender_id, .. } = &e.kind {
                if let Some(tracker) = &mut self.latency {
                    let conversation = self.state.conversation(id).expect("just folded");
                    tracker.sent(id, conversation, e.seq, sender_id, e.at);
                }
                if let Some(senders) = &mut self.senders {
                    // The first MessageSent of a seq wins; a duplicate changes nothing.
                    senders
                        .entry(id.clone())
                        .or_default()
                        .entry(e.seq.get())
                        .or_insert_with(|| (sender_id.clone(), e.at));
                }
            }
        }
    }

    fn cursor(&self, id: &ConversationId, user: &UserId) -> Seq {
        self.state
            .conversation(id)
            .and_then(|c| c.member(user))
            .map_or(Seq::ZERO, |m| m.cursor)
    }

    /// Latency rows completed since the last call, to write as they come.
    pub fn take_latency_rows(&mut self) -> Vec<LatencyRow> {
        self.latency
            .as_mut()
            .map(LatencyTracker::take_done)
            .unwrap_or_default()
    }

    /// Latency rows of the messages still open at the end point.
    pub fn finish_latency(&mut self) -> Vec<LatencyRow> {
        self.latency
            .take()
            .map(LatencyTracker::finish)
            .unwrap_or_default()
    }

    /// Messages the latency table is tracking.
    pub fn open_messages(&self) -> usize {
        self.latency.as_ref().map_or(0, LatencyTracker::open_count)
    }

    /// One row per member, in (conversation, user) order. Members seen only
    /// through private receipts or marks appear only with `include_private`.
    /// Made as they are written: a state of millions of cursors is not
    /// held twice, once as rows.
    pub fn cursor_rows(&self, include_private: bool) -> impl Iterator<Item = Vec<Value>> + '_ {
        let mut conversations: Vec<_> = self.state.conversations().collect();
        conversations.sort_unstable_by(|a, b| a.0.cmp(b.0));
        conversations.into_iter().flat_map(move |(id, conversation)| {
            let latest_seq = conversation.latest_seq();
            let mut members: Vec<_> = conversation
                .members()
                .filter(|(_, m)| m.listed || include_private)
                .collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            members.into_iter().map(move |(user, member)| {
                let present = member.present();
                let mut row = vec![
                    Value::Str(id.to_string()),
                    Value::Str(user.to_string()),
                    Value::Int(member.cursor.get() as i64),
                    Value::Int(member.join_seq.get() as i64),
                    Value::Bool(present.is_some()),
                    Value::Int(latest_seq.get() as i64),
                    // A departed member has nothing unread.
                    Value::Int(present.map_or(0, |m| m.unread(latest_seq)) as i64),
                ];
                if include_private {
                    let own = member.own();
                    row.extend([
                        Value::Int(member.private_cursor.get() as i64),
                        Value::Bool(own.marked_unread()),
                        Value::Int(if member.left {
                            0
                        } else {
                            own.unread(latest_seq) as i64
                        }),
                    ]);
                }
                row
            })
        })
    }

    /// One row per thread follower, in (conversation, thread, user) order;
    /// departed followers too (`present` false, nothing unread).
    pub fn thread_rows(&self, include_private: bool) -> impl Iterator<Item = Vec<Value>> + '_ {
        let mut conversations: Vec<_> = self.state.conversations().collect();
        conversations.sort_unstable_by(|a, b| a.0.cmp(b.0));
        conversations.into_iter().flat_map(move |(id, conversation)| {
            let threads = conversation.threads();
            let views: Vec<_> = threads
                .roots()
                .into_iter()
                .filter_map(|root| Some((root, threads.thread(root)?)))
                .collect();
            views.into_iter().flat_map(move |(root, view)| {
                let latest = view.latest_seq;
                view.followers.into_iter().map(move |(user, f)| {
                    let present = |n: u64| if f.present { n as i64 } else { 0 };
                    let mut row = vec![
                        Value::Str(id.to_string()),
                        Value::Int(root.get() as i64),
                        Value::Str(user.to_string()),
                        Value::Int(f.cursor.get() as i64),
                        Value::Int(f.join_seq.get() as i64),
                        Value::Bool(f.present),
                        Value::Int(latest.get() as i64),
                        Value::Int(present(latest.get().saturating_sub(f.cursor.get()))),
                    ];
                    if include_private {
                        row.extend([
                            Value::Int(f.private_cursor.get() as i64),
                            Value::Int(present(thread_own_unread(latest, f.cursor, f.private_cursor))),
                        ]);
                    }
                    row
                })
            })
        })
    }

    /// One row per message seen sent in the chosen conversations, in
    /// (conversation, seq) order: its read count and possible readers at the
    /// end point, by the read model.
    pub fn read_count_rows(&self) -> Vec<Vec<Value>> {
        let Some(senders) = &self.senders else {
            return vec![];
        };
        let mut conversations: Vec<_> = senders.iter().collect();
        conversations.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut rows = vec![];
        for (id, messages) in conversations {
            let view = self.state.conversation(id).map(|c| c.view()).unwrap_or_default();
            for (&seq, (sender, at)) in messages {
                rows.push(vec![
                    Value::Str(id.to_string()),
                    Value::Int(seq as i64),
                    Value::Str(sender.to_string()),
                    Value::Int(*at),
                    Value::Int(view.read_count(Seq(seq), sender) as i64),
                    Value::Int(view.possible_readers(Seq(seq), sender) as i64),
                ]);
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_inputs::{c, joined, private_read, read, sent};

    /// Seed 1's group: A sends 1..3; B read 1; C read 2; D joined after 2
    /// and read 3.
    fn seed(table: TableKind) -> Replayer {
        let mut r = Replayer::new(table, &[c("g")], 10);
        for input in [
            joined("g", "A", 0),
            joined("g", "B", 0),
            joined("g", "C", 0),
            sent("g", "A", 1, 10),
            sent("g", "A", 2, 20),
            joined("g", "D", 2),
            sent("g", "A", 3, 30),
            read("g", "B", 1, 0),
            read("g", "C", 2, 0),
            read("g", "D", 3, 0),
            private_read("g", "B", 3),
            read("other", "B", 3, 0),
        ] {
            r.apply(&input);
        }
        r
    }

    #[test]
    fn read_counts_use_the_read_model() {
        let r = seed(TableKind::ReadCounts);
        let counts: Vec<_> = r
            .read_count_rows()
            .into_iter()
            .map(|row| (row[1].clone(), row[4].clone(), row[5].clone()))
            .collect();
        assert_eq!(
            counts,
            [
                (Value::Int(1), Value::Int(2), Value::Int(2)),
                (Value::Int(2), Value::Int(1), Value::Int(2)),
                (Value::Int(3), Value::Int(1), Value::Int(3)),
            ]
        );
        assert_eq!(r.stats().other_conversations, 1);
    }

    /// The thread of message 1: B replies twice, D (who joined after
    /// message 2, so after reply 1 too) reads both, C reads privately.
    #[test]
    fn thread_rows_list_each_follower_with_their_join_point() {
        use crate::test_inputs::{replied, thread_read};
        let mut r = seed(TableKind::ThreadCursors);
        for input in [
            replied("g", 1, 1, "B", 1, 15),
            replied("g", 1, 2, "B", 3, 31),
            thread_read("g", 1, "D", 2, false),
            thread_read("g", 1, "C", 2, true),
        ] {
            r.apply(&input);
        }
        let rows: Vec<_> = r.thread_rows(true).collect();
        let row = |user: &str, cursor, join, unread, private, own| {
            vec![
                Value::Str("g".into()),
                Value::Int(1),
                Value::Str(user.into()),
                Value::Int(cursor),
                Value::Int(join),
                Value::Bool(true),
                Value::Int(2),
                Value::Int(unread),
                Value::Int(private),
                Value::Int(own),
            ]
        };
        assert_eq!(
            rows,
            [
                row("B", 2, 1, 0, 0, 0),
                row("C", 0, 1, 2, 2, 0),
                row("D", 2, 2, 0, 0, 0)
            ]
        );
        assert_eq!(r.thread_rows(false).next().unwrap().len(), 8);
    }

    #[test]
    fn the_private_cursor_shows_only_when_asked() {
        let r = seed(TableKind::Cursors);
        let public: Vec<_> = r.cursor_rows(false).collect();
        let b = public
            .iter()
            .find(|row| row[1] == Value::Str("B".into()))
            .unwrap();
        assert_eq!(b.len(), 7);
        assert_eq!(
            (&b[2], &b[6]),
            (&Value::Int(1), &Value::Int(2)),
            "cursor 1, unread 2"
        );
        let private: Vec<_> = r.cursor_rows(true).collect();
        let b = private
            .iter()
            .find(|row| row[1] == Value::Str("B".into()))
            .unwrap();
        assert_eq!(
            (&b[7], &b[9]),
            (&Value::Int(3), &Value::Int(0)),
            "private 3, own unread 0"
        );
    }

    #[test]
    fn rows_come_sorted_whatever_the_fold_order() {
        let forward: Vec<_> = seed(TableKind::Cursors).cursor_rows(true).collect();
        let users: Vec<_> = forward.iter().map(|r| r[1].clone()).collect();
        assert_eq!(users, ["A", "B", "C", "D"].map(|s| Value::Str(s.into())));
    }
}
