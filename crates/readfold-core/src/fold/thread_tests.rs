//! The thread fold: examples, and properties against a reference model.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::tests::{apply, delivered, fold_all, Record};
use super::*;

fn conv(s: &str) -> ConversationId {
    s.parse().unwrap()
}
fn user(s: &str) -> UserId {
    s.parse().unwrap()
}
fn event(c: &str, seq: u64, at: i64, kind: EventKind) -> ConversationEvent {
    ConversationEvent {
        conversation_id: conv(c),
        seq: Seq(seq),
        at,
        kind,
    }
}
fn joined(c: &str, u: &str, seq: u64, at: i64) -> ConversationEvent {
    event(c, seq, at, EventKind::MemberJoined { user_id: user(u) })
}
fn left(c: &str, u: &str, seq: u64, at: i64) -> ConversationEvent {
    event(c, seq, at, EventKind::MemberLeft { user_id: user(u) })
}
fn sent(c: &str, u: &str, seq: u64, at: i64) -> ConversationEvent {
    event(
        c,
        seq,
        at,
        EventKind::MessageSent {
            sender_id: user(u),
            mentions: Mentions::default(),
        },
    )
}
/// Reply `thread_seq` to root `root`, sent by `u` when the latest seq was `seq`.
fn replied(c: &str, root: u64, thread_seq: u64, u: &str, seq: u64, at: i64) -> ConversationEvent {
    event(
        c,
        seq,
        at,
        EventKind::ReplySent {
            thread: Seq(root),
            thread_seq: Seq(thread_seq),
            sender_id: user(u),
            mentions: Vec::new(),
            starter_id: None,
        },
    )
}
fn thread_read(c: &str, root: u64, u: &str, seq: u64, private: bool) -> ThreadReadReport {
    ThreadReadReport {
        conversation_id: conv(c),
        thread: Seq(root),
        user_id: user(u),
        seq: Seq(seq),
        reported_at: seq as i64,
        private,
    }
}

fn thread(s: &PartitionState, c: &str, root: u64) -> ThreadView {
    s.conversation(&conv(c))
        .unwrap()
        .threads()
        .thread(Seq(root))
        .unwrap()
}

fn follower(view: &ThreadView, u: &str) -> Option<ThreadFollower> {
    view.followers
        .iter()
        .find(|(id, _)| id.as_str() == u)
        .map(|(_, f)| *f)
}

/// A group's thread: "N read" for replies, unread per follower, and the
/// conversation's own cursors untouched.
#[test]
fn a_thread_counts_its_replies_apart_from_the_conversation() {
    let mut s = PartitionState::new();
    for (i, m) in ["A", "B", "C", "D"].iter().enumerate() {
        s.apply_event(&joined("G", m, 0, i as i64));
    }
    s.apply_event(&sent("G", "A", 1, 10));
    s.apply_event(&sent("G", "A", 2, 11));
    // B replies twice to message 1, C once; D never touches the thread.
    s.apply_event(&replied("G", 1, 1, "B", 2, 12));
    s.apply_event(&replied("G", 1, 2, "B", 2, 13));
    s.apply_event(&replied("G", 1, 3, "C", 2, 14));
    s.apply_thread_read(&thread_read("G", 1, "A", 2, false));

    let c = s.conversation(&conv("G")).unwrap();
    assert_eq!(c.latest_seq(), Seq(2), "replies take no seq of the conversation");
    assert_eq!(
        c.member(&user("B")).unwrap().cursor,
        Seq::ZERO,
        "B's own cursor did not move"
    );
    let t = thread(&s, "G", 1).conversation_view();
    assert_eq!(t.latest_seq, Seq(3));
    // Reply 1 (by B) is read by A (cursor 2) and C (cursor 3).
    assert_eq!(t.read_count(Seq(1), &user("B")), 2);
    assert_eq!(t.read_count(Seq(3), &user("C")), 0);
    assert_eq!(
        t.readers_page(Seq(2), &user("B"), None, 10).0,
        vec![user("A"), user("C")]
    );
    let threads = c.threads();
    assert_eq!(threads.unread_sum(&user("A")), 1, "reply 3 is unread for A");
    assert_eq!(threads.unread_sum(&user("B")), 1, "B follows by replying");
    assert_eq!(threads.unread_sum(&user("D")), 0, "D does not follow");
    assert!(follower(&thread(&s, "G", 1), "D").is_none());
}

/// A member who joined after a reply is not among its possible readers,
/// even when no message of the conversation came between (the join and
/// the replies share a latest seq and are ordered by time).
#[test]
fn a_member_who_joined_after_a_reply_is_not_its_reader() {
    let mut s = PartitionState::new();
    s.apply_event(&joined("G", "A", 0, 1));
    s.apply_event(&joined("G", "B", 0, 2));
    s.apply_event(&sent("G", "A", 1, 3));
    s.apply_event(&replied("G", 1, 1, "A", 1, 4));
    s.apply_event(&replied("G", 1, 2, "A", 1, 5));
    s.apply_event(&joined("G", "E", 1, 6));
    s.apply_event(&replied("G", 1, 3, "A", 1, 7));
    s.apply_thread_read(&thread_read("G", 1, "E", 3, false));
    s.apply_thread_read(&thread_read("G", 1, "B", 3, false));

    let view = thread(&s, "G", 1);
    assert_eq!(follower(&view, "E").unwrap().join_seq, Seq(3));
    assert_eq!(follower(&view, "B").unwrap().join_seq, Seq(1));
    assert_eq!(view.marks.len(), 2, "one mark at the start, one after the join");
    let t = view.conversation_view();
    assert_eq!(
        t.read_count(Seq(2), &user("A")),
        1,
        "only B: E joined after reply 2"
    );
    assert_eq!(t.read_count(Seq(3), &user("A")), 2);
}

/// A mention makes a member who had joined a follower; the starter
/// follows from the first reply; a departure hides a follower, and a
/// rejoin's join point is after the replies they missed.
#[test]
fn mentions_and_the_starter_follow_and_a_departure_hides() {
    let mut s = PartitionState::new();
    for (i, m) in ["A", "B", "C"].iter().enumerate() {
        s.apply_event(&joined("G", m, 0, i as i64));
    }
    s.apply_event(&sent("G", "A", 1, 10));
    s.apply_event(&event(
        "G",
        1,
        11,
        EventKind::ReplySent {
            thread: Seq(1),
            thread_seq: Seq(1),
            sender_id: user("B"),
            mentions: vec![user("C"), user("Z")],
            starter_id: Some(user("A")),
        },
    ));
    let view = thread(&s, "G", 1);
    let names: Vec<&str> = view.followers.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(names, ["A", "B", "C"], "Z is no member");
    let c = s.conversation(&conv("G")).unwrap();
    assert_eq!(c.threads().unread_sum(&user("C")), 1);

    s.apply_event(&left("G", "C", 1, 12));
    assert!(!follower(&thread(&s, "G", 1), "C").unwrap().present);
    assert_eq!(
        s.conversation(&conv("G"))
            .unwrap()
            .threads()
            .unread_sum(&user("C")),
        0
    );
    s.apply_event(&replied("G", 1, 2, "B", 1, 13));
    s.apply_event(&joined("G", "C", 1, 14));
    s.apply_event(&replied("G", 1, 3, "B", 1, 15));
    let c_again = follower(&thread(&s, "G", 1), "C").unwrap();
    assert!(c_again.present);
    assert_eq!(c_again.join_seq, Seq(3), "replies 1 and 2 came before the rejoin");
    assert_eq!(
        s.conversation(&conv("G"))
            .unwrap()
            .threads()
            .unread_sum(&user("C")),
        1
    );
}

/// Private thread receipts count for the member's own unread only.
#[test]
fn a_private_thread_read_clears_own_unread_only() {
    let mut s = PartitionState::new();
    s.apply_event(&sent("G", "A", 1, 1));
    s.apply_event(&replied("G", 1, 1, "A", 1, 2));
    s.apply_thread_read(&thread_read("G", 1, "B", 1, true));
    let c = s.conversation(&conv("G")).unwrap();
    assert_eq!(c.threads().unread_sum(&user("B")), 0);
    assert_eq!(
        thread(&s, "G", 1)
            .conversation_view()
            .read_count(Seq(1), &user("A")),
        0
    );
    let (followers, states) = s.pending_thread_changes();
    assert_eq!(states.len(), 1);
    let b = followers.iter().find(|f| f.key.user_id == user("B")).unwrap();
    assert_eq!((b.outputs.public, b.outputs.state), (false, true));
    s.mark_flushed();
    assert_eq!(s.pending_thread_changes(), (Vec::new(), Vec::new()));
    assert!(!s.has_thread_changes());
}

// ---- properties -------------------------------------------------------

const CONVS: [&str; 2] = ["c1", "c2"];
const USERS: [&str; 4] = ["a", "b", "c", "d"];
const ROOTS: u64 = 3;

fn arb_report() -> impl Strategy<Value = Input> {
    (0..CONVS.len(), 0..USERS.len(), 1u64..12, 1..=ROOTS, 0u8..6).prop_map(|(c, u, seq, root, kind)| {
        let (c, u) = (CONVS[c], USERS[u]);
        match kind {
            0 => Input::ThreadRead(thread_read(c, root, u, seq, true)),
            1 | 2 => Input::ThreadRead(thread_read(c, root, u, seq, false)),
            _ => Input::Report(ReadReport {
                conversation_id: conv(c),
                user_id: user(u),
                seq: Seq(seq),
                reported_at: seq as i64,
                private: kind == 3,
            }),
        }
    })
}

/// Per conversation: messages take seqs, replies take thread seqs of a
/// root already sent, and every event carries the latest seq and a
/// strictly growing time.
fn arb_event_log() -> impl Strategy<Value = Vec<ConversationEvent>> {
    let step = (0..CONVS.len(), 0..5u8, 0..USERS.len(), 0..USERS.len(), 1..=ROOTS);
    prop::collection::vec(step, 0..50).prop_map(|steps| {
        let mut latest: HashMap<usize, u64> = HashMap::new();
        let mut thread_latest: HashMap<(usize, u64), u64> = HashMap::new();
        let mut log = Vec::new();
        for (i, (c, kind, u, other, root)) in steps.into_iter().enumerate() {
            let seq = latest.entry(c).or_insert(0);
            let at = 1000 + i as i64;
            let kind = match kind {
                0 => {
                    *seq += 1;
                    EventKind::MessageSent {
                        sender_id: user(USERS[u]),
                        mentions: Mentions::default(),
                    }
                }
                1 => EventKind::MemberJoined {
                    user_id: user(USERS[u]),
                },
                2 => EventKind::MemberLeft {
                    user_id: user(USERS[u]),
                },
                _ if *seq < root => continue,
                _ => {
                    let thread_seq = thread_latest.entry((c, root)).or_insert(0);
                    *thread_seq += 1;
                    EventKind::ReplySent {
                        thread: Seq(root),
                        thread_seq: Seq(*thread_seq),
                        sender_id: user(USERS[u]),
                        mentions: if kind == 4 {
                            vec![user(USERS[other])]
                        } else {
                            Vec::new()
                        },
                        starter_id: (kind == 4).then(|| user(USERS[(u + 1) % USERS.len()])),
                    }
                }
            };
            log.push(ConversationEvent {
                conversation_id: conv(CONVS[c]),
                seq: Seq(*seq),
                at,
                kind,
            });
        }
        log
    })
}

/// The thread inputs, interleaved and re-delivered as the conversation
/// tests deliver theirs.
fn arb_delivery() -> impl Strategy<Value = (Vec<Record>, Vec<Record>)> {
    delivered(prop::collection::vec(arb_report(), 0..60), arb_event_log())
}

type ThreadSnapshot = BTreeMap<(ConversationId, Seq), ThreadView>;

fn threads_snapshot(s: &PartitionState) -> ThreadSnapshot {
    let mut out = BTreeMap::new();
    for (id, c) in s.conversations() {
        let threads = c.threads();
        for root in threads.roots() {
            out.insert((id.clone(), root), threads.thread(root).unwrap());
        }
    }
    out
}

/// Every conversation's latest seq and members (one that holds only
/// threads holds nothing of its own).
fn main_snapshot(s: &PartitionState) -> BTreeMap<ConversationId, (Seq, BTreeMap<UserId, Member>)> {
    s.conversations()
        .filter(|(_, c)| !c.is_empty() || c.latest_seq() > Seq::ZERO)
        .map(|(k, v)| {
            (
                k.clone(),
                (v.latest_seq(), v.members().map(|(u, m)| (u.clone(), m)).collect()),
            )
        })
        .collect()
}

fn is_thread_record(record: &Record) -> bool {
    matches!(
        record,
        Record::Report(Input::ThreadRead(_))
            | Record::Event(ConversationEvent {
                kind: EventKind::ReplySent { .. },
                ..
            })
    )
}

/// The join rule without marks: the first reply ordered at or after the
/// member's membership (1 when it is the thread's first reply, or they have
/// none), past the latest when none is.
fn reference_join(
    log: &[ConversationEvent],
    c: &ConversationId,
    root: Seq,
    joined: Option<MembershipVersion>,
) -> Seq {
    let Some(joined) = joined else {
        return Seq(1);
    };
    let mut replies: Vec<(Seq, MembershipVersion)> = Vec::new();
    for e in log.iter().filter(|e| &e.conversation_id == c) {
        if let EventKind::ReplySent {
            thread, thread_seq, ..
        } = &e.kind
        {
            if *thread == root && replies.last().is_none_or(|(s, _)| thread_seq > s) {
                replies.push((*thread_seq, MembershipVersion { seq: e.seq, at: e.at }));
            }
        }
    }
    match replies.iter().position(|(_, v)| *v >= joined) {
        Some(0) => Seq(1),
        Some(i) => replies[i].0,
        None => Seq(replies.last().map_or(0, |(s, _)| s.get()) + 1),
    }
}

/// The changelog topics as logs, record by record in order. Compaction
/// may leave any of a key's records before its latest, so a restore is
/// checked both from the whole logs and from their latest records.
#[derive(Default)]
struct Topics {
    public: Vec<Change>,
    member_states: Vec<Change>,
    thread_cursors: Vec<ThreadChange>,
    thread_followers: Vec<ThreadChange>,
    thread_states: Vec<ThreadStateChange>,
}

/// `log` with only each key's latest record, in the order of those.
fn compacted<T: Clone, K: Ord>(log: &[T], key: impl Fn(&T) -> K) -> Vec<T> {
    let latest: BTreeMap<K, usize> = log.iter().enumerate().map(|(i, r)| (key(r), i)).collect();
    let mut kept: Vec<usize> = latest.into_values().collect();
    kept.sort();
    kept.into_iter().map(|i| log[i].clone()).collect()
}

impl Topics {
    fn take(&mut self, s: &mut PartitionState) {
        let (followers, states) = s.pending_thread_changes();
        for change in s.drain() {
            if change.outputs.public {
                self.public.push(change.clone());
            }
            if change.outputs.state {
                self.member_states.push(change);
            }
        }
        for change in followers {
            if change.outputs.public {
                self.thread_cursors.push(change.clone());
            }
            if change.outputs.state {
                self.thread_followers.push(change);
            }
        }
        self.thread_states.extend(states);
    }

    /// The topics compacted down to each key's latest record.
    fn compacted(&self) -> Topics {
        Topics {
            public: compacted(&self.public, Change::key),
            member_states: compacted(&self.member_states, Change::key),
            thread_cursors: compacted(&self.thread_cursors, |c| c.key.clone()),
            thread_followers: compacted(&self.thread_followers, |c| c.key.clone()),
            thread_states: compacted(&self.thread_states, |s| (s.conversation_id.clone(), s.thread)),
        }
    }

    /// Restores as the processor does: public changelog, member state,
    /// then thread cursors, follower state and thread state.
    fn restore(&self) -> PartitionState {
        let mut s = PartitionState::new();
        for change in &self.public {
            match change.public_update() {
                Some(u) => s.restore_update(&u),
                None => s.restore_tombstone(&change.key),
            }
        }
        for change in &self.member_states {
            s.restore_state(&change.state_update());
        }
        for c in self.thread_cursors.iter().filter(|c| c.present) {
            s.restore_thread_cursor(&c.key, c.cursor, c.latest_seq, c.updated_at);
        }
        for c in &self.thread_followers {
            s.restore_thread_follower(&c.key, c.cursor, c.private_cursor, c.updated_at);
        }
        for state in &self.thread_states {
            s.restore_thread_state(state);
        }
        s
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn threads_ignore_interleaving_and_duplicates((reference, delivered) in arb_delivery()) {
        prop_assert_eq!(threads_snapshot(&fold_all(&reference)), threads_snapshot(&fold_all(&delivered)));
    }

    #[test]
    fn the_conversation_is_the_same_with_or_without_its_threads((_, delivered) in arb_delivery()) {
        let without: Vec<Record> = delivered.iter().filter(|r| !is_thread_record(r)).cloned().collect();
        prop_assert_eq!(main_snapshot(&fold_all(&delivered)), main_snapshot(&fold_all(&without)));
    }

    #[test]
    fn join_points_follow_the_order_of_joins_and_replies((reference, _) in arb_delivery()) {
        let log: Vec<ConversationEvent> = reference
            .iter()
            .filter_map(|r| match r { Record::Event(e) => Some(e.clone()), _ => None })
            .collect();
        let s = fold_all(&reference);
        for ((c, root), view) in threads_snapshot(&s) {
            let conversation = s.conversation(&c).unwrap();
            for (u, f) in &view.followers {
                let member = conversation.member(u);
                let membership = member.as_ref().and_then(|m| m.membership);
                let present = member.is_none_or(|m| !m.left);
                prop_assert_eq!(f.present, present);
                if present {
                    prop_assert_eq!(f.join_seq, reference_join(&log, &c, root, membership), "{:?} {:?} {:?}", c, root, u);
                    prop_assert!(f.cursor.get() + 1 >= f.join_seq.get(), "history before the join is unread");
                }
            }
        }
    }

    #[test]
    fn a_restore_from_the_changelogs_equals_the_live_threads(
        (_, delivered) in arb_delivery(),
        flush_every in 1usize..8,
    ) {
        let mut live = PartitionState::new();
        let mut topics = Topics::default();
        let mut published: HashMap<ThreadKey, Seq> = HashMap::new();
        for (i, record) in delivered.iter().enumerate() {
            apply(&mut live, record);
            if i % flush_every == 0 {
                let (followers, _) = live.pending_thread_changes();
                for f in followers.iter().filter(|f| f.present && f.outputs.public) {
                    let before = published.insert(f.key.clone(), f.cursor).unwrap_or(Seq::ZERO);
                    prop_assert!(f.cursor >= before, "a published thread cursor moved back");
                }
                topics.take(&mut live);
            }
        }
        topics.take(&mut live);
        prop_assert_eq!(threads_snapshot(&topics.compacted().restore()), threads_snapshot(&live));
        prop_assert_eq!(threads_snapshot(&topics.restore()), threads_snapshot(&live), "from the whole logs");
        // A reader of the public thread topic alone (the badge stage) learns
        // every thread's latest reply while it has a present follower, even
        // when the last replies came from departed members.
        let mut latest: HashMap<(ConversationId, Seq), Seq> = HashMap::new();
        for c in topics.thread_cursors.iter().filter(|c| c.present) {
            let seen = latest.entry((c.key.conversation_id.clone(), c.key.thread)).or_default();
            *seen = (*seen).max(c.latest_seq);
        }
        for ((c, root), view) in threads_snapshot(&live) {
            if view.followers.iter().any(|(_, f)| f.present) {
                // No record: no reply known (a private read before any).
                let known = latest.get(&(c.clone(), root)).copied().unwrap_or_default();
                prop_assert_eq!(known, view.latest_seq, "{:?} {:?}", c, root);
            }
        }
    }
}
