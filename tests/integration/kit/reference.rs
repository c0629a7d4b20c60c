//! The fold the test expects, computed in the test from what it produced
//! with the core's own fold, and the records tests produce.

use std::collections::{BTreeMap, HashMap};

use readfold::config::Config;
use readfold_core::fold::PartitionState;
use readfold_core::{ConversationId, Seq, UserId};
use readfold_kafka::producer::InputProducer;
use readfold_store::redis::PrivateState;
use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};
use readfold_wire::{validate, Limits};

use super::changelog::{Changelog, Cursor, Key};
use super::services::now_ms;

/// A by-user changelog value as the tests compare it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Own {
    pub cursor: i64,
    pub join_seq: i64,
    pub private_cursor: i64,
    pub unread_mark: bool,
    pub unread_mentions: u32,
    pub muted_until: Option<i64>,
}

/// The reference fold of everything a test produced.
pub struct Reference {
    pub state: PartitionState,
    limits: Limits,
}

impl Default for Reference {
    fn default() -> Self {
        Reference {
            state: PartitionState::new(),
            limits: Config::defaults().input,
        }
    }
}

impl Reference {
    pub fn report(&mut self, r: &ReadReportRecord) {
        self.state
            .apply(&validate::read_report(r.clone(), &self.limits).unwrap());
    }

    pub fn event(&mut self, e: &ConversationEventRecord) {
        self.state
            .apply_event(&validate::conversation_event(e.clone(), &self.limits).unwrap());
    }

    /// The final by-conversation changelog value per key: (cursor,
    /// join_seq), or None if left. Members seen only privately are not
    /// listed there.
    pub fn expected(&self) -> BTreeMap<Key, Cursor> {
        let mut out = BTreeMap::new();
        for (c, conv) in self.state.conversations() {
            for (u, m) in conv.members().filter(|(_, m)| m.listed) {
                let v = (!m.left).then_some((m.cursor.get() as i64, m.join_seq.get() as i64));
                out.insert((c.to_string(), u.to_string()), v);
            }
        }
        out
    }

    /// The final by-user changelog value per key, for every member (listed
    /// or not): what their own devices see, or None if they left.
    pub fn own_expected(&self) -> BTreeMap<Key, Option<Own>> {
        let mut out = BTreeMap::new();
        for (c, conv) in self.state.conversations() {
            for (u, m) in conv.members() {
                let own = m.own();
                let v = (!m.left).then_some(Own {
                    cursor: m.cursor.get() as i64,
                    join_seq: m.join_seq.get() as i64,
                    private_cursor: own.private_cursor.get() as i64,
                    unread_mark: own.marked_unread(),
                    unread_mentions: own.unread_mentions,
                    muted_until: own
                        .mute
                        .map(|m| m.until)
                        .filter(|&u| u != readfold_core::Mute::OFF),
                });
                out.insert((c.to_string(), u.to_string()), v);
            }
        }
        out
    }

    /// What the per-user stores hold: (user, conversation) -> private state,
    /// for members with any.
    pub fn private_states(&self) -> BTreeMap<(String, String), PrivateState> {
        let mut out = BTreeMap::new();
        for (c, conv) in self.state.conversations() {
            for (u, m) in conv.members().filter(|(_, m)| m.has_private_state()) {
                out.insert(
                    (u.to_string(), c.to_string()),
                    PrivateState {
                        private_cursor: m.private_cursor,
                        mark: m.mark,
                        unread_mentions: m.own().unread_mentions,
                        mute: m.mute,
                    },
                );
            }
        }
        out
    }

    /// The final delivered cursor per present, listed member.
    pub fn expected_delivered(&self) -> BTreeMap<Key, i64> {
        let mut out = BTreeMap::new();
        for (c, conv) in self.state.conversations() {
            for (u, m) in conv.members().filter(|(_, m)| m.listed && !m.left) {
                out.insert((c.to_string(), u.to_string()), m.delivered.get() as i64);
            }
        }
        out
    }

    /// Present members only: (conversation, user) -> (cursor, join_seq).
    pub fn present(&self) -> BTreeMap<Key, (i64, i64)> {
        self.expected()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }

    /// Present members' cursors by conversation.
    pub fn present_by_conversation(&self) -> BTreeMap<String, BTreeMap<String, i64>> {
        let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for ((c, u), (cursor, _)) in self.present() {
            out.entry(c).or_default().insert(u, cursor);
        }
        out
    }

    /// Read count of message `seq` sent by `sender`, by the read model over
    /// the reference fold.
    pub fn read_count(&self, conversation: &str, seq: u64, sender: &str) -> usize {
        let c: ConversationId = conversation.parse().unwrap();
        let s: UserId = sender.parse().unwrap();
        self.state
            .conversation(&c)
            .map_or(0, |c| c.view().read_count(Seq(seq), &s))
    }
}

pub fn report(conversation: &str, user: &str, seq: i64) -> ReadReportRecord {
    ReadReportRecord {
        thread: 0,
        muted_until: None,
        conversation_id: conversation.into(),
        user_id: user.into(),
        seq,
        device_id: None,
        reported_at: now_ms(),
        private: false,
        action: ReadAction::Read,
    }
}

pub fn event(conversation: &str, seq: i64, event: EventRecord) -> ConversationEventRecord {
    ConversationEventRecord {
        conversation_id: conversation.into(),
        seq,
        at: now_ms(),
        event,
    }
}

pub fn sent(conversation: &str, sender: &str, seq: i64) -> ConversationEventRecord {
    event(
        conversation,
        seq,
        EventRecord::MessageSent {
            starter_id: None,
            thread: 0,
            thread_seq: 0,
            mention_all: false,
            mentions: Default::default(),
            sender_id: sender.into(),
        },
    )
}

pub fn joined(conversation: &str, user: &str, seq: i64) -> ConversationEventRecord {
    event(
        conversation,
        seq,
        EventRecord::MemberJoined { user_id: user.into() },
    )
}

/// A private receipt.
pub fn private_report(conversation: &str, user: &str, seq: i64) -> ReadReportRecord {
    ReadReportRecord {
        private: true,
        ..report(conversation, user, seq)
    }
}

/// A delivery report: messages up to `seq` reached one of the user's devices.
pub fn delivery(conversation: &str, user: &str, seq: i64) -> ReadReportRecord {
    ReadReportRecord {
        action: ReadAction::Delivered,
        ..report(conversation, user, seq)
    }
}

/// A mark-as-unread (`marked`) or its clearing, at the user's cursor `seq`.
pub fn unread_mark(conversation: &str, user: &str, seq: i64, marked: bool) -> ReadReportRecord {
    ReadReportRecord {
        action: if marked {
            ReadAction::MarkUnread
        } else {
            ReadAction::ClearUnreadMark
        },
        ..report(conversation, user, seq)
    }
}

/// A mute until `until` (ms), or until unmuted.
pub fn mute(conversation: &str, user: &str, until: Option<i64>) -> ReadReportRecord {
    ReadReportRecord {
        action: ReadAction::Mute,
        muted_until: until,
        ..report(conversation, user, 0)
    }
}

pub fn unmute(conversation: &str, user: &str) -> ReadReportRecord {
    ReadReportRecord {
        action: ReadAction::Unmute,
        ..report(conversation, user, 0)
    }
}

pub fn left(conversation: &str, user: &str, seq: i64) -> ConversationEventRecord {
    event(
        conversation,
        seq,
        EventRecord::MemberLeft { user_id: user.into() },
    )
}

/// Produces and folds into the reference in one go.
pub struct Feed<'a> {
    pub producer: InputProducer,
    pub reference: &'a mut Reference,
}

impl Feed<'_> {
    /// The seed articles' chats: the 1:1 chat of A and B in `dm`, and in
    /// `group` A, B, C with read counts 0 -> 1 -> 1, then 2 and 1, a late
    /// joiner D who reads #3, and a stale duplicate report.
    pub async fn seed_chats(&mut self, dm: &str, group: &str) {
        self.event(joined(dm, "A", 0)).await;
        self.event(joined(dm, "B", 0)).await;
        self.event(sent(dm, "A", 1)).await;
        self.report(report(dm, "B", 1)).await;
        self.event(sent(dm, "B", 2)).await;
        self.report(report(dm, "A", 2)).await;
        for m in ["A", "B", "C"] {
            self.event(joined(group, m, 0)).await;
        }
        self.event(sent(group, "A", 1)).await;
        self.report(report(group, "B", 1)).await;
        self.event(sent(group, "A", 2)).await;
        self.report(report(group, "C", 2)).await;
        self.event(joined(group, "D", 2)).await;
        self.event(sent(group, "A", 3)).await;
        self.report(report(group, "D", 3)).await;
        self.report(report(group, "C", 1)).await;
    }

    pub async fn report(&mut self, r: ReadReportRecord) {
        self.producer.report(&r).await.unwrap();
        self.reference.report(&r);
    }

    pub async fn event(&mut self, e: ConversationEventRecord) {
        self.producer.event(&e).await.unwrap();
        self.reference.event(&e);
    }
}

/// Asserts the changelog's final values equal the reference, with a diff.
pub fn assert_matches(log: &Changelog, reference: &Reference) {
    let (got, want) = (log.latest(), reference.expected());
    let diff: HashMap<_, _> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), (got.get(k).cloned(), *v)))
        .collect();
    assert!(
        diff.is_empty(),
        "changelog differs from the reference fold (got, want): {diff:?}"
    );
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        extra.is_empty(),
        "changelog has keys the reference lacks: {extra:?}"
    );
    let want = reference.expected_delivered();
    let diff: Vec<_> = want
        .iter()
        .filter(|(k, v)| log.delivered.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), log.delivered.get(k).copied(), *v))
        .collect();
    assert!(
        diff.is_empty(),
        "changelog's delivered cursors differ from the reference fold (key, got, want): {diff:?}"
    );
    let below = log.delivered_below_cursor();
    assert!(below.is_empty(), "delivered below the cursor: {below:?}");
}
