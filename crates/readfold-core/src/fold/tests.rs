use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;

fn conv(s: &str) -> ConversationId {
    s.parse().unwrap()
}
fn user(s: &str) -> UserId {
    s.parse().unwrap()
}
fn report(c: &str, u: &str, seq: u64) -> ReadReport {
    ReadReport {
        conversation_id: conv(c),
        user_id: user(u),
        seq: Seq(seq),
        reported_at: seq as i64,
        private: false,
    }
}
fn private_report(c: &str, u: &str, seq: u64) -> ReadReport {
    ReadReport {
        private: true,
        ..report(c, u, seq)
    }
}
fn delivery(c: &str, u: &str, seq: u64) -> DeliveryReport {
    DeliveryReport {
        conversation_id: conv(c),
        user_id: user(u),
        seq: Seq(seq),
        reported_at: seq as i64,
    }
}
fn mark(c: &str, u: &str, seq: u64, at: i64, marked: bool) -> UnreadMarkReport {
    UnreadMarkReport {
        conversation_id: conv(c),
        user_id: user(u),
        seq: Seq(seq),
        at,
        marked,
    }
}

/// Restores as the processor does: the public changelog (what changes
/// with public outputs published), then the member-state topic.
fn restore_from(changes: &[Change]) -> PartitionState {
    let mut restored = PartitionState::new();
    for change in changes.iter().filter(|c| c.outputs.public) {
        match change.public_update() {
            Some(u) => restored.restore_update(&u),
            None => restored.restore_tombstone(&change.key),
        }
    }
    for change in changes.iter().filter(|c| c.outputs.state) {
        restored.restore_state(&change.state_update());
    }
    restored
}
fn sent(c: &str, sender: &str, seq: u64) -> ConversationEvent {
    event(
        c,
        seq,
        seq as i64,
        EventKind::MessageSent {
            sender_id: user(sender),
            mentions: Mentions::default(),
        },
    )
}
fn joined(c: &str, u: &str, seq: u64, at: i64) -> ConversationEvent {
    event(c, seq, at, EventKind::MemberJoined { user_id: user(u) })
}
fn left(c: &str, u: &str, seq: u64, at: i64) -> ConversationEvent {
    event(c, seq, at, EventKind::MemberLeft { user_id: user(u) })
}
fn event(c: &str, seq: u64, at: i64, kind: EventKind) -> ConversationEvent {
    ConversationEvent {
        conversation_id: conv(c),
        seq: Seq(seq),
        at,
        kind,
    }
}

fn cursor_of(state: &PartitionState, c: &str, u: &str) -> u64 {
    state
        .conversation(&conv(c))
        .unwrap()
        .member(&user(u))
        .unwrap()
        .cursor
        .get()
}

/// Seed 1: the 1:1 chat of A and B.
#[test]
fn one_to_one_chat() {
    let mut s = PartitionState::new();
    let p = "P";
    // A sends "hello" (seq 1): A's cursor follows, B is at 0.
    s.apply_event(&sent(p, "A", 1));
    let c = s.conversation(&conv(p)).unwrap();
    assert_eq!(c.view().read_count(Seq(1), &user("A")), 0, "B has not read 1");
    assert_eq!(c.view().unread(&user("B")), 1);
    assert_eq!(c.view().unread(&user("A")), 0);

    // B opens the chat and reports 1.
    s.apply_report(&report(p, "B", 1));
    let c = s.conversation(&conv(p)).unwrap();
    assert_eq!(c.view().read_count(Seq(1), &user("A")), 1, "message 1 is read");
    assert_eq!(c.view().unread(&user("B")), 0);

    // B replies (seq 2): B's cursor moves to 2, A is still at 1.
    s.apply_event(&sent(p, "B", 2));
    let c = s.conversation(&conv(p)).unwrap();
    assert_eq!(cursor_of(&s, p, "B"), 2);
    assert_eq!(c.view().read_count(Seq(2), &user("B")), 0);
    assert_eq!(c.view().unread(&user("A")), 1);

    // A opens the chat: message 2 becomes read.
    s.apply_report(&report(p, "A", 2));
    let c = s.conversation(&conv(p)).unwrap();
    assert_eq!(c.view().read_count(Seq(2), &user("B")), 1);
    assert_eq!(c.view().unread(&user("A")), 0);
}

/// Seed 1: group G of A, B, C. Read counts 0 -> 1 -> 1, then 2 and 1.
#[test]
fn group_chat_read_counts() {
    let mut s = PartitionState::new();
    let g = "G";
    for (i, m) in ["A", "B", "C"].iter().enumerate() {
        s.apply_event(&joined(g, m, 0, i as i64));
    }
    s.apply_event(&sent(g, "A", 1));
    let count = |s: &PartitionState, seq| {
        s.conversation(&conv(g))
            .unwrap()
            .view()
            .read_count(Seq(seq), &user("A"))
    };
    assert_eq!(count(&s, 1), 0);

    s.apply_report(&report(g, "B", 1));
    assert_eq!(count(&s, 1), 1);
    assert_eq!(s.conversation(&conv(g)).unwrap().view().unread(&user("C")), 1);

    s.apply_event(&sent(g, "A", 2));
    assert_eq!(count(&s, 1), 1, "message 1 still read by B only");
    assert_eq!(count(&s, 2), 0);
    let c = s.conversation(&conv(g)).unwrap();
    assert_eq!(c.view().unread(&user("B")), 1);
    assert_eq!(c.view().unread(&user("C")), 2);

    s.apply_report(&report(g, "C", 2));
    assert_eq!(count(&s, 1), 2);
    assert_eq!(count(&s, 2), 1);
    assert_eq!(s.conversation(&conv(g)).unwrap().view().unread(&user("B")), 1);
}

/// Seed 1, section 5: a member who joins late has unread 0 for history but
/// never counts as a reader of older messages.
#[test]
fn late_joiner_is_not_a_reader_of_history() {
    let mut s = PartitionState::new();
    let g = "G";
    s.apply_event(&joined(g, "A", 0, 0));
    s.apply_event(&joined(g, "B", 0, 1));
    for seq in 1..=5 {
        s.apply_event(&sent(g, "A", seq));
    }
    s.apply_report(&report(g, "B", 5));
    s.apply_event(&joined(g, "D", 5, 10));
    let c = s.conversation(&conv(g)).unwrap();
    assert_eq!(c.view().unread(&user("D")), 0, "history is not unread");
    assert_eq!(c.member(&user("D")).unwrap().cursor, Seq(5));
    assert_eq!(c.member(&user("D")).unwrap().join_seq, Seq(6));
    assert_eq!(
        c.view().read_count(Seq(3), &user("A")),
        1,
        "only B read message 3"
    );

    s.apply_event(&sent(g, "A", 6));
    s.apply_report(&report(g, "D", 6));
    let c = s.conversation(&conv(g)).unwrap();
    assert_eq!(c.view().read_count(Seq(6), &user("A")), 1, "D read message 6");
    assert_eq!(
        c.view().read_count(Seq(5), &user("A")),
        1,
        "D still not a reader of 5"
    );
}

#[test]
fn a_member_who_left_keeps_the_cursor_but_stops_counting() {
    let mut s = PartitionState::new();
    s.apply_event(&joined("G", "B", 0, 0));
    s.apply_event(&sent("G", "A", 1));
    s.apply_report(&report("G", "B", 1));
    s.drain();
    s.apply_event(&left("G", "B", 1, 5));
    let c = s.conversation(&conv("G")).unwrap();
    assert_eq!(c.view().read_count(Seq(1), &user("A")), 0);
    assert_eq!(c.member(&user("B")).unwrap().cursor, Seq(1));
    let key = CursorKey {
        conversation_id: conv("G"),
        user_id: user("B"),
    };
    let changes = s.drain();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].key, key);
    assert!(
        changes[0].member.left && changes[0].public_update().is_none(),
        "a tombstone"
    );
}

#[test]
fn stale_and_duplicate_reports_never_move_back_or_dirty() {
    let mut s = PartitionState::new();
    assert!(s.apply_report(&report("C", "u", 7)));
    s.drain();
    assert!(!s.apply_report(&report("C", "u", 3)));
    assert!(!s.apply_report(&report("C", "u", 7)));
    assert_eq!(cursor_of(&s, "C", "u"), 7);
    assert_eq!(s.dirty_len(), 0);
}

/// Reads are folded in the slot when they can be; across 2^32 they go
/// through the whole member, and either way the same rules hold.
#[test]
fn reads_past_32_bits_move_the_cursor_as_any_other() {
    let wide = u64::from(u32::MAX) + 5;
    let mut s = PartitionState::new();
    assert!(s.apply_report(&report("C", "u", 3)));
    s.drain();
    assert!(s.apply_report(&report("C", "u", u64::from(u32::MAX))));
    assert!(s.apply_report(&report("C", "u", wide)));
    assert_eq!(cursor_of(&s, "C", "u"), wide);
    assert!(!s.apply_report(&report("C", "u", 9)), "stale under a wide cursor");
    assert!(!s.apply_report(&report("C", "u", wide)), "a duplicate");
    assert!(s.apply_report(&report("C", "u", wide + 1)));
    let changes = s.drain();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].public_update().unwrap().cursor, Seq(wide + 1));
    // A read's time is kept even when it moves nothing.
    let mut late = report("C", "u", 2);
    late.reported_at = i64::MAX;
    assert!(!s.apply_report(&late));
    let member = s.conversation(&conv("C")).unwrap().member(&user("u")).unwrap();
    assert_eq!(member.updated_at, i64::MAX);
}

#[test]
fn a_message_publishes_the_new_latest_seq_even_if_its_sender_read_ahead() {
    let mut s = PartitionState::new();
    s.apply_report(&report("C", "u", 9));
    s.apply_event(&sent("C", "u", 1));
    s.drain();
    // u's cursor (9) is already past message 2: only the latest seq moves.
    s.apply_event(&sent("C", "u", 2));
    let changes = s.drain();
    assert_eq!(changes.len(), 1, "the sender's update carries latest_seq");
    assert_eq!(changes[0].public_update().unwrap().latest_seq, Seq(2));
    // A duplicate of the message raises nothing, so publishes nothing.
    s.apply_event(&sent("C", "u", 2));
    assert_eq!(s.dirty_len(), 0);
}

#[test]
fn coalesces_many_reports_into_one_change() {
    let mut s = PartitionState::new();
    for seq in 1..=100 {
        s.apply_report(&report("C", "u", seq));
    }
    let changes = s.drain();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].public_update().unwrap().cursor, Seq(100));
    assert!(s.drain().is_empty());
}

#[test]
fn report_before_message_sent_is_kept_unclamped() {
    let mut s = PartitionState::new();
    s.apply_report(&report("C", "B", 5));
    let c = s.conversation(&conv("C")).unwrap();
    assert_eq!(c.member(&user("B")).unwrap().cursor, Seq(5));
    assert_eq!(c.view().unread(&user("B")), 0, "readers clamp at 0");
}

#[test]
fn restore_rebuilds_state_without_dirtying() {
    let mut a = PartitionState::new();
    a.apply_event(&joined("G", "D", 4, 1));
    a.apply_report(&report("G", "B", 9));
    a.apply_event(&joined("G", "E", 0, 2));
    a.apply_event(&left("G", "E", 3, 3));
    let changes = a.drain();

    let mut b = restore_from(&changes);
    assert_eq!(b.dirty_len(), 0);
    let (ca, cb) = (
        a.conversation(&conv("G")).unwrap(),
        b.conversation(&conv("G")).unwrap(),
    );
    for u in ["B", "D"] {
        assert_eq!(
            ca.member(&user(u)).unwrap().cursor,
            cb.member(&user(u)).unwrap().cursor
        );
        assert_eq!(
            ca.member(&user(u)).unwrap().join_seq,
            cb.member(&user(u)).unwrap().join_seq
        );
    }
    assert!(cb.member(&user("E")).unwrap().left);
    // A replay of D's join after restore changes nothing.
    assert!(!b.apply_event(&joined("G", "D", 4, 1)));
    // A stale report after restore emits nothing lower.
    assert!(!b.apply_report(&report("G", "B", 2)));
}

/// A private receipt moves the member's own view, never what others see.
#[test]
fn a_private_receipt_moves_only_the_own_cursor() {
    let mut s = PartitionState::new();
    for u in ["A", "B", "C"] {
        s.apply_event(&joined("G", u, 0, 0));
    }
    s.apply_event(&sent("G", "A", 1));
    s.apply_event(&sent("G", "A", 2));
    s.drain();
    assert!(s.apply_report(&private_report("G", "B", 2)));
    let c = s.conversation(&conv("G")).unwrap();
    assert_eq!(c.view().read_count(Seq(2), &user("A")), 0, "others see nothing");
    assert_eq!(c.view().members[&user("B")].cursor, Seq::ZERO);
    let own = c.member(&user("B")).unwrap().own();
    assert_eq!(own.unread(c.latest_seq()), 0, "B's own unread drops");
    let changes = s.drain();
    assert_eq!(changes.len(), 1);
    assert_eq!(
        changes[0].outputs,
        Outputs {
            public: false,
            state: true
        },
        "nothing public is published"
    );
    // A later public report at or below the private cursor catches up.
    assert!(s.apply_report(&report("G", "B", 1)));
    let changes = s.drain();
    assert!(changes[0].outputs.public && !changes[0].outputs.state);
    assert_eq!(changes[0].public_update().unwrap().cursor, Seq(1));
    assert_eq!(cursor_of(&s, "G", "B"), 1);
}

#[test]
fn a_member_seen_only_privately_stays_unlisted_until_something_public() {
    let mut s = PartitionState::new();
    s.apply_event(&sent("G", "A", 3));
    s.drain();
    s.apply_report(&private_report("G", "X", 3));
    s.apply_mark(&mark("G", "Y", 0, 1, true));
    let changes = s.drain();
    assert!(changes.iter().all(|c| !c.outputs.public));
    let view = s.conversation(&conv("G")).unwrap().view();
    assert_eq!(view.members.len(), 1, "only A is listed");
    let key = |u| CursorKey {
        conversation_id: conv("G"),
        user_id: user(u),
    };
    assert!(
        !s.current(&key("X")).unwrap().outputs.public,
        "a snapshot leaves X out too"
    );
    // A public report lists X.
    s.apply_report(&report("G", "X", 1));
    assert!(s.drain()[0].outputs.public);
    assert!(s
        .conversation(&conv("G"))
        .unwrap()
        .view()
        .members
        .contains_key(&user("X")));
}

#[test]
fn an_unread_mark_holds_until_the_cursor_passes_it_or_it_is_cleared() {
    let mut s = PartitionState::new();
    s.apply_event(&joined("G", "B", 0, 0));
    s.apply_event(&sent("G", "A", 1));
    s.apply_event(&sent("G", "A", 2));
    s.apply_report(&report("G", "B", 2));
    let own = |s: &PartitionState| {
        let c = s.conversation(&conv("G")).unwrap();
        (c.member(&user("B")).unwrap().own(), c.latest_seq())
    };
    assert!(s.apply_mark(&mark("G", "B", 2, 100, true)));
    let (o, latest) = own(&s);
    assert!(o.marked_unread());
    assert_eq!(o.unread(latest), 1, "marked: at least 1 unread");
    // A stale or duplicate report does not clear it.
    s.apply_report(&report("G", "B", 2));
    assert!(own(&s).0.marked_unread());
    // An older clear does not undo a newer mark.
    assert!(!s.apply_mark(&mark("G", "B", 2, 50, false)));
    assert!(own(&s).0.marked_unread());
    // Reading on clears it.
    s.apply_event(&sent("G", "A", 3));
    s.apply_report(&report("G", "B", 3));
    let (o, latest) = own(&s);
    assert!(!o.marked_unread());
    assert_eq!(o.unread(latest), 0);
    // Marked again, then cleared explicitly.
    s.apply_mark(&mark("G", "B", 3, 200, true));
    assert!(own(&s).0.marked_unread());
    assert!(s.apply_mark(&mark("G", "B", 3, 300, false)));
    assert!(!own(&s).0.marked_unread());
    let changes = s.drain();
    let b = changes.iter().find(|c| c.key.user_id == user("B")).unwrap();
    assert!(b.outputs.state, "marks go to the member-state topic");
}

#[test]
fn the_membership_epoch_grows_with_every_join_and_leave_and_only_then() {
    let mut s = PartitionState::new();
    let epoch = |s: &PartitionState| {
        s.conversation(&conv("G"))
            .unwrap()
            .member(&user("B"))
            .unwrap()
            .epoch
    };
    s.apply_event(&joined("G", "B", 0, 1));
    assert_eq!(epoch(&s), 1);
    s.apply_event(&joined("G", "B", 0, 1));
    assert_eq!(epoch(&s), 1, "a duplicate join changes nothing");
    s.apply_report(&report("G", "B", 4));
    assert_eq!(epoch(&s), 1);
    s.apply_event(&left("G", "B", 4, 2));
    s.apply_event(&joined("G", "B", 4, 3));
    assert_eq!(epoch(&s), 3, "leave, then rejoin at the same seq");
    s.apply_event(&left("G", "B", 4, 2));
    assert_eq!(epoch(&s), 3, "a replayed older leave changes nothing");
    assert!(
        !s.conversation(&conv("G"))
            .unwrap()
            .member(&user("B"))
            .unwrap()
            .left
    );
}

#[test]
fn restore_brings_back_private_cursors_marks_and_membership() {
    let mut a = PartitionState::new();
    a.apply_event(&joined("G", "B", 0, 1));
    a.apply_report(&private_report("G", "B", 7));
    a.apply_mark(&mark("G", "B", 7, 10, true));
    a.apply_event(&left("G", "B", 2, 2));
    a.apply_event(&joined("G", "B", 2, 3));
    let b = restore_from(&a.drain());
    let (ma, mb) = (
        &a.conversation(&conv("G")).unwrap().member(&user("B")).unwrap(),
        &b.conversation(&conv("G")).unwrap().member(&user("B")).unwrap(),
    );
    assert_eq!(mb.private_cursor, Seq(7));
    assert_eq!(mb.mark, ma.mark);
    assert_eq!(mb.epoch, 3);
    assert_eq!(mb.membership, ma.membership);
}

// ---- properties -------------------------------------------------------

#[derive(Clone, Debug)]
pub(super) enum Record {
    /// A record of the read-reports topic: a read (public or private) or a mark.
    Report(Input),
    Event(ConversationEvent),
}

const CONVS: [&str; 2] = ["c1", "c2"];
const USERS: [&str; 4] = ["a", "b", "c", "d"];

fn arb_report() -> impl Strategy<Value = Input> {
    (0..CONVS.len(), 0..USERS.len(), 1u64..30, 0i64..1000, 0u8..13).prop_map(|(c, u, seq, at, kind)| {
        let (c, u) = (CONVS[c], USERS[u]);
        match kind {
            0 => Input::Mark(mark(c, u, seq, at, true)),
            1 => Input::Mark(mark(c, u, seq, at, false)),
            11 | 12 => Input::Mute(MuteReport {
                conversation_id: conv(c),
                user_id: user(u),
                mute: Mute {
                    at,
                    until: match kind {
                        11 if seq % 2 == 0 => Mute::FOREVER,
                        11 => at + seq as i64,
                        _ => Mute::OFF,
                    },
                },
            }),
            2 => Input::Delivery(DeliveryReport {
                reported_at: at,
                ..delivery(c, u, seq)
            }),
            3 => Input::Report(ReadReport {
                reported_at: at,
                ..private_report(c, u, seq)
            }),
            _ => Input::Report(ReadReport {
                reported_at: at,
                ..report(c, u, seq)
            }),
        }
    })
}

/// A plausible event log: per conversation, seqs grow by one per message and
/// member events carry the latest seq and a strictly growing time.
fn arb_event_log() -> impl Strategy<Value = Vec<ConversationEvent>> {
    let step = (0..CONVS.len(), 0..3u8, 0..USERS.len(), 0..USERS.len(), 0u8..8);
    prop::collection::vec(step, 0..40).prop_map(|steps| {
        let mut latest: HashMap<usize, u64> = HashMap::new();
        let mut log = Vec::new();
        for (i, (c, kind, u, mentioned, mention)) in steps.into_iter().enumerate() {
            let seq = latest.entry(c).or_insert(0);
            let at = 1000 + i as i64;
            let kind = match kind {
                0 => {
                    *seq += 1;
                    // Some messages mention one member, some @all, some both.
                    EventKind::MessageSent {
                        sender_id: user(USERS[u]),
                        mentions: Mentions {
                            users: if mention % 2 == 1 {
                                vec![user(USERS[mentioned])]
                            } else {
                                Vec::new()
                            },
                            all: mention >= 6,
                        },
                    }
                }
                1 => EventKind::MemberJoined {
                    user_id: user(USERS[u]),
                },
                _ => EventKind::MemberLeft {
                    user_id: user(USERS[u]),
                },
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

/// Interleaves the two inputs (each keeps its own order, as a Kafka partition
/// does) and re-delivers some records later, as an at-least-once replay would.
fn arb_delivery() -> impl Strategy<Value = (Vec<Record>, Vec<Record>)> {
    delivered(prop::collection::vec(arb_report(), 0..60), arb_event_log())
}

/// The reference order of `reports` and `events` (every event, then every
/// report), and a delivery of them: interleaved, each input in its own
/// order, some records delivered again later.
pub(super) fn delivered(
    reports: impl Strategy<Value = Vec<Input>>,
    events: impl Strategy<Value = Vec<ConversationEvent>>,
) -> impl Strategy<Value = (Vec<Record>, Vec<Record>)> {
    (reports, events).prop_flat_map(|(reports, events)| {
        let reference: Vec<Record> = events
            .iter()
            .cloned()
            .map(Record::Event)
            .chain(reports.iter().cloned().map(Record::Report))
            .collect();
        let n = reports.len() + events.len();
        (
            Just(reports),
            Just(events),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(
                (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
                0..10,
            ),
            Just(reference),
        )
            .prop_map(|(reports, events, picks, dups, reference)| {
                let (mut r, mut e) = (reports.into_iter(), events.into_iter());
                let mut merged: Vec<Record> = Vec::new();
                for take_report in picks {
                    let next = if take_report {
                        r.next().map(Record::Report)
                    } else {
                        None
                    };
                    let next = next
                        .or_else(|| e.next().map(Record::Event))
                        .or_else(|| r.next().map(Record::Report));
                    merged.extend(next);
                }
                for (from, to) in dups {
                    if merged.is_empty() {
                        break;
                    }
                    let i = from.index(merged.len());
                    let j = i + 1 + to.index(merged.len() - i);
                    let dup = merged[i].clone();
                    merged.insert(j.min(merged.len()), dup);
                }
                (reference, merged)
            })
    })
}

pub(super) fn apply(state: &mut PartitionState, record: &Record) {
    match record {
        Record::Report(r) => state.apply(r),
        Record::Event(e) => state.apply_event(e),
    };
}

pub(super) fn fold_all(records: &[Record]) -> PartitionState {
    let mut s = PartitionState::new();
    records.iter().for_each(|r| apply(&mut s, r));
    s
}

/// Every conversation's latest seq and members, as comparable values.
type Snapshot = BTreeMap<ConversationId, (Seq, BTreeMap<UserId, Member>)>;

fn snapshot(s: &PartitionState) -> Snapshot {
    s.conversations()
        .map(|(k, v)| {
            let members = v.members().map(|(u, m)| (u.clone(), m)).collect();
            (k.clone(), (v.latest_seq(), members))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn final_state_ignores_interleaving_and_duplicates((reference, delivered) in arb_delivery()) {
        prop_assert_eq!(snapshot(&fold_all(&reference)), snapshot(&fold_all(&delivered)));
    }

    #[test]
    fn an_untracked_state_folds_the_same_and_keeps_no_dirty_set((_, delivered) in arb_delivery()) {
        let mut untracked = PartitionState::untracked();
        delivered.iter().for_each(|r| apply(&mut untracked, r));
        prop_assert_eq!(untracked.dirty_len(), 0);
        prop_assert_eq!(snapshot(&untracked), snapshot(&fold_all(&delivered)));
    }

    #[test]
    fn no_cursor_ever_decreases_and_drains_emit_each_key_once(
        (_, delivered) in arb_delivery(),
        flush_every in 1usize..8,
    ) {
        let mut s = PartitionState::new();
        let mut seen: HashMap<CursorKey, Seq> = HashMap::new();
        let mut seen_private: HashMap<CursorKey, Seq> = HashMap::new();
        let mut seen_delivered: HashMap<CursorKey, Seq> = HashMap::new();
        let mut seen_epoch: HashMap<CursorKey, u64> = HashMap::new();
        let mut emitted: HashMap<CursorKey, Seq> = HashMap::new();
        let mut emitted_delivered: HashMap<CursorKey, Seq> = HashMap::new();
        for (i, record) in delivered.iter().enumerate() {
            apply(&mut s, record);
            for (c, conv) in s.conversations() {
                for (u, m) in conv.members() {
                    let key = CursorKey { conversation_id: c.clone(), user_id: u.clone() };
                    let before = seen.insert(key.clone(), m.cursor).unwrap_or(Seq::ZERO);
                    prop_assert!(m.cursor >= before, "cursor moved back");
                    prop_assert!(m.delivered >= m.cursor, "delivered below the cursor");
                    let before = seen_delivered.insert(key.clone(), m.delivered).unwrap_or(Seq::ZERO);
                    prop_assert!(m.delivered >= before, "delivered cursor moved back");
                    let before = seen_private.insert(key.clone(), m.private_cursor).unwrap_or(Seq::ZERO);
                    prop_assert!(m.private_cursor >= before, "private cursor moved back");
                    let before = seen_epoch.insert(key, m.epoch).unwrap_or(0);
                    prop_assert!(m.epoch >= before, "membership epoch moved back");
                }
            }
            if i % flush_every == 0 {
                let changes = s.drain();
                let mut keys: Vec<CursorKey> = changes.iter().map(Change::key).collect();
                let n = keys.len();
                keys.sort();
                keys.dedup();
                prop_assert_eq!(n, keys.len(), "a key emitted twice in one drain");
                for change in changes {
                    if let Some(u) = change.public_update() {
                        let before = emitted.insert(u.key(), u.cursor).unwrap_or(Seq::ZERO);
                        prop_assert!(u.cursor >= before, "emitted a lower cursor");
                        let before = emitted_delivered.insert(u.key(), u.delivered).unwrap_or(Seq::ZERO);
                        prop_assert!(u.delivered >= before.max(u.cursor), "emitted a lower delivered cursor");
                    }
                }
            }
        }
    }

    #[test]
    fn restoring_from_drained_changes_reproduces_cursors((_, delivered) in arb_delivery()) {
        let mut live = PartitionState::new();
        let mut changelog = Vec::new();
        for record in &delivered {
            apply(&mut live, record);
            changelog.extend(live.drain());
        }
        let restored = restore_from(&changelog);
        for (c, conv) in live.conversations() {
            let other = restored.conversation(c).unwrap();
            for (u, m) in conv.members() {
                let r = other.member(u).unwrap();
                prop_assert_eq!(m.left, r.left);
                prop_assert_eq!(m.listed, r.listed);
                prop_assert_eq!(m.private_cursor, r.private_cursor);
                prop_assert_eq!(m.mark, r.mark);
                prop_assert_eq!(m.mute, r.mute);
                prop_assert_eq!(m.epoch, r.epoch);
                prop_assert_eq!(m.membership, r.membership);
                // A departed member's cursor is not restored, so neither
                // is what it hides of their mentions.
                if !m.left {
                    prop_assert_eq!(&m.mentions, &r.mentions);
                    prop_assert_eq!(m.own(), r.own());
                    prop_assert_eq!(m.cursor, r.cursor);
                    prop_assert_eq!(m.delivered, r.delivered);
                    prop_assert_eq!(m.join_seq, r.join_seq);
                }
            }
        }
    }

    #[test]
    fn every_change_between_two_drains_is_in_the_second(
        (_, delivered) in arb_delivery(),
        flush_every in 1usize..8,
    ) {
        // What a drain must publish: each member whose state (but for the
        // time it was last touched) moved.
        fn comparable(s: &PartitionState) -> BTreeMap<CursorKey, Member> {
            s.conversations()
                .flat_map(|(c, conv)| {
                    conv.members().map(move |(u, mut m)| {
                        m.updated_at = 0;
                        (CursorKey { conversation_id: c.clone(), user_id: u.clone() }, m)
                    })
                })
                .collect()
        }
        let mut s = PartitionState::new();
        let mut flushed = comparable(&s);
        for (i, record) in delivered.iter().enumerate() {
            apply(&mut s, record);
            prop_assert_eq!(s.dirty_len(), s.pending_changes().len());
            if i % flush_every == 0 || i + 1 == delivered.len() {
                let now = comparable(&s);
                let drained: BTreeMap<CursorKey, Change> =
                    s.drain().into_iter().map(|c| (c.key.clone(), c)).collect();
                for (key, member) in &now {
                    let Some(change) = drained.get(key) else {
                        prop_assert_eq!(
                            flushed.get(key),
                            Some(member),
                            "a member changed but was not drained"
                        );
                        continue;
                    };
                    prop_assert_eq!(&s.current(key).unwrap().member, &change.member);
                }
                prop_assert_eq!(s.dirty_len(), 0);
                prop_assert!(s.pending_changes().is_empty());
                flushed = now;
            }
        }
    }
}

#[test]
fn a_conversation_put_back_whole_takes_its_changes_with_it() {
    let mut s = PartitionState::new();
    s.apply_report(&report("C", "a", 3));
    s.apply_report(&report("D", "a", 1));
    assert_eq!(s.dirty_len(), 2);
    let mut restored = Member::new(0);
    restored.cursor = Seq(5);
    restored.listed = true;
    s.restore_conversation(conv("C"), Seq(5), [(user("a"), restored)]);
    assert_eq!(s.dirty_len(), 1, "C's change went with the old C");
    s.apply_report(&report("C", "a", 7));
    let mut keys: Vec<String> = s
        .drain()
        .iter()
        .map(|c| c.key.conversation_id.to_string())
        .collect();
    keys.sort();
    assert_eq!(keys, ["C", "D"], "each change once");
}

#[test]
fn a_conversation_put_back_whole_gives_its_members_extras_back() {
    let mut s = PartitionState::new();
    let mut private = Member::new(0);
    private.private_cursor = Seq(4);
    private.listed = true;
    let members = |n: usize| -> Vec<(UserId, Member)> {
        (0..n)
            .map(|i| (user(&format!("u{i}")), private.clone()))
            .collect()
    };
    // One and two members held inline, then an array; each replaced by
    // another of each size.
    for (before, after) in [(1, 3), (3, 2), (2, 1), (5, 5)] {
        s.restore_conversation(conv("C"), Seq(5), members(before));
        assert_eq!(s.extras.len(), before);
        s.restore_conversation(conv("C"), Seq(5), members(after));
        assert_eq!(s.extras.len(), after, "{before} members replaced by {after}");
        let held = s.conversation(&conv("C")).unwrap();
        assert_eq!(held.len(), after);
        assert!(held.members().all(|(_, m)| m == private));
    }
    // A private read updates the member's extra in place.
    s.restore_conversation(conv("C"), Seq(5), members(1));
    s.apply_report(&ReadReport {
        private: true,
        ..report("C", "u0", 9)
    });
    assert_eq!(s.extras.len(), 1);
}

/// A store of conversations in memory, for states over a store: the
/// conversations of `state`, and one id whose reading fails.
#[derive(Debug, Default)]
struct MapStore {
    conversations: Vec<StoredConversation>,
    damaged: Option<ConversationId>,
    fault: std::sync::Mutex<Option<StoredFault>>,
}

impl MapStore {
    fn of(state: &PartitionState) -> Self {
        let conversations = state
            .conversations()
            .map(|(id, c)| StoredConversation {
                id: id.clone(),
                latest_seq: c.latest_seq(),
                members: c.members().map(|(u, m)| (u.clone(), m)).collect(),
            })
            .collect();
        MapStore {
            conversations,
            ..MapStore::default()
        }
    }

    fn failed(&self, id: &ConversationId) -> StoredFault {
        let fault = StoredFault(format!("{id} is damaged"));
        self.fault.lock().unwrap().get_or_insert(fault.clone());
        fault
    }
}

impl StoredConversations for MapStore {
    fn find(&self, id: &ConversationId) -> Result<Option<StoredConversation>, StoredFault> {
        if self.damaged.as_ref() == Some(id) {
            return Err(self.failed(id));
        }
        Ok(self.conversations.iter().find(|c| &c.id == id).cloned())
    }

    fn for_each(&self, each: &mut dyn FnMut(StoredConversation)) -> Result<(), StoredFault> {
        for c in &self.conversations {
            if self.damaged.as_ref() == Some(&c.id) {
                return Err(self.failed(&c.id));
            }
            each(c.clone());
        }
        Ok(())
    }

    fn counts(&self) -> (usize, usize) {
        let cursors = self.conversations.iter().map(|c| c.members.len()).sum();
        (self.conversations.len(), cursors)
    }

    fn fault(&self) -> Option<StoredFault> {
        self.fault.lock().unwrap().clone()
    }
}

/// What `all_conversations` lists, as comparable values.
fn whole_snapshot(s: &PartitionState) -> Snapshot {
    let mut all = Snapshot::new();
    s.all_conversations(&mut |id, latest_seq, members| {
        let members = members.map(|(u, m)| (u.clone(), m)).collect();
        assert!(
            all.insert(id.clone(), (latest_seq, members)).is_none(),
            "{id} listed twice"
        );
    })
    .unwrap();
    all
}

/// Changes as comparable values.
fn by_key(changes: Vec<Change>) -> BTreeMap<CursorKey, (Member, Seq, Outputs)> {
    changes
        .into_iter()
        .map(|c| (c.key, (c.member, c.latest_seq, c.outputs)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A state over a store of what was folded before folds the rest as
    /// the state that held it all in memory: the same changes to publish,
    /// the same state in the end, listed whole before or after taking
    /// everything in.
    #[test]
    fn a_state_over_a_store_folds_as_the_state_held_whole(
        (_, delivered) in arb_delivery(),
        split in any::<prop::sample::Index>(),
    ) {
        let split = split.index(delivered.len() + 1);
        let (before, after) = delivered.split_at(split);
        let mut whole = fold_all(before);
        whole.mark_flushed();
        let store = Arc::new(MapStore::of(&whole));
        let mut over = PartitionState::over(store);
        prop_assert!(!over.is_whole());
        prop_assert_eq!(over.cursor_count(), whole.cursor_count());
        prop_assert_eq!(whole_snapshot(&over), snapshot(&whole));
        for (i, record) in after.iter().enumerate() {
            apply(&mut whole, record);
            apply(&mut over, record);
            if i % 3 == 0 {
                prop_assert_eq!(by_key(over.drain()), by_key(whole.drain()));
            }
        }
        prop_assert_eq!(by_key(over.drain()), by_key(whole.drain()));
        prop_assert_eq!(over.cursor_count(), whole.cursor_count());
        prop_assert_eq!(whole_snapshot(&over), snapshot(&whole));
        prop_assert_eq!(over.stored_fault(), None);
        over.take_all().unwrap();
        prop_assert!(over.is_whole());
        prop_assert_eq!(snapshot(&over), snapshot(&whole));
        prop_assert_eq!(over.cursor_count(), whole.cursor_count());
    }
}

#[test]
fn a_damaged_stored_conversation_is_a_fault_of_the_state() {
    let mut whole = PartitionState::new();
    whole.apply_report(&report("c1", "a", 4));
    whole.apply_report(&report("c2", "b", 7));
    let store = MapStore {
        damaged: Some(conv("c2")),
        ..MapStore::of(&whole)
    };
    let mut over = PartitionState::over(Arc::new(store));
    // What it can read, it reads.
    over.apply_report(&report("c1", "a", 5));
    assert_eq!(cursor_of(&over, "c1", "a"), 5);
    assert_eq!(over.stored_fault(), None);
    // What it cannot, it must not be trusted with.
    over.apply_report(&report("c2", "b", 3));
    assert_eq!(over.stored_fault(), Some(StoredFault("c2 is damaged".into())));
    assert!(over.take_all().is_err());
    assert!(over.all_conversations(&mut |_, _, _| {}).is_err());
}

#[test]
fn the_stored_member_states_come_back_after_a_public_tail() {
    // A member who left, with a private cursor: a public changelog record
    // rejoins them roughly, and their member-state puts the exact
    // membership back, as a restore applies member-state records after the
    // public ones. Over a store, as a state held whole.
    let mut whole = PartitionState::new();
    whole.apply_event(&joined("c1", "a", 1, 10));
    whole.apply_report(&private_report("c1", "a", 3));
    whole.apply_event(&left("c1", "a", 2, 20));
    whole.apply_report(&report("c2", "b", 4));
    whole.mark_flushed();
    let mut over = PartitionState::over(Arc::new(MapStore::of(&whole)));
    let states: Vec<MemberStateUpdate> = whole
        .keys()
        .filter_map(|key| whole.current(&key))
        .map(|change| change.state_update())
        .collect();
    let tail = CursorUpdate {
        conversation_id: conv("c1"),
        user_id: user("a"),
        cursor: Seq(0),
        delivered: Seq(0),
        join_seq: Seq(1),
        latest_seq: Seq(2),
        updated_at: 5,
    };
    whole.restore_update(&tail);
    states.iter().for_each(|s| whole.restore_state(s));
    over.restore_update(&tail);
    over.restate_from_store();
    assert!(whole.current(&tail.key()).unwrap().member.left);
    over.take_all().unwrap();
    assert_eq!(snapshot(&over), snapshot(&whole));
}

/// Grey and blue ticks: delivery is public, max-merged, and never below
/// the read cursor.
#[test]
fn delivery_moves_the_delivered_cursor_and_reading_implies_it() {
    let mut s = PartitionState::new();
    let g = "G";
    s.apply_event(&sent(g, "A", 1));
    s.apply_event(&sent(g, "A", 2));
    s.apply_event(&joined(g, "B", 0, 1));
    s.drain();
    assert!(s.apply_delivery(&delivery(g, "B", 2)));
    assert!(!s.apply_delivery(&delivery(g, "B", 1)), "stale: no move");
    let changes = s.drain();
    assert_eq!(changes.len(), 1);
    assert!(changes[0].outputs.public && !changes[0].outputs.state);
    let update = changes[0].public_update().unwrap();
    assert_eq!((update.cursor, update.delivered), (Seq(0), Seq(2)));
    let ticks = s.conversation(&conv(g)).unwrap().view().ticks(Seq(2), &user("A"));
    assert!(ticks.delivered_to_all() && !ticks.read_by_all());

    // Reading past delivery moves both; a private read moves neither.
    s.apply_report(&private_report(g, "B", 4));
    assert_eq!(
        s.conversation(&conv(g))
            .unwrap()
            .member(&user("B"))
            .unwrap()
            .delivered,
        Seq(2)
    );
    s.apply_report(&report(g, "B", 3));
    let b = s.conversation(&conv(g)).unwrap().member(&user("B")).unwrap();
    assert_eq!((b.cursor, b.delivered), (Seq(3), Seq(3)));

    // A member seen only through delivery is listed: it is public.
    s.apply_delivery(&delivery(g, "C", 1));
    let c = s.conversation(&conv(g)).unwrap().member(&user("C")).unwrap();
    assert!(c.listed && c.present().is_some());
}

fn sent_mentioning(c: &str, sender: &str, seq: u64, users: &[&str], all: bool) -> ConversationEvent {
    event(
        c,
        seq,
        seq as i64,
        EventKind::MessageSent {
            sender_id: user(sender),
            mentions: Mentions {
                users: users.iter().map(|u| user(u)).collect(),
                all,
            },
        },
    )
}

fn unread_mentions(s: &PartitionState, c: &str, u: &str) -> u32 {
    s.conversation(&conv(c))
        .and_then(|conv| conv.member(&user(u)))
        .map_or(0, |m| m.own().unread_mentions)
}

/// Mentions count above what the member read (by either cursor), for
/// members who had joined by then, never for the sender.
#[test]
fn mentions_count_until_read_and_all_only_since_joining() {
    let mut s = PartitionState::new();
    let g = "G";
    for u in ["A", "B", "C"] {
        s.apply_event(&joined(g, u, 0, 1));
    }
    s.apply_event(&sent_mentioning(g, "A", 1, &["B", "A"], false));
    s.apply_event(&sent_mentioning(g, "A", 2, &[], true));
    s.apply_event(&joined(g, "D", 2, 3));
    s.apply_event(&sent_mentioning(g, "A", 3, &["B"], true));
    assert_eq!(
        unread_mentions(&s, g, "A"),
        0,
        "a sender mentions nobody to themselves"
    );
    assert_eq!(unread_mentions(&s, g, "B"), 3, "1, 2 and 3, each once");
    assert_eq!(unread_mentions(&s, g, "C"), 2, "@all at 2 and 3");
    assert_eq!(unread_mentions(&s, g, "D"), 1, "joined after 2: only 3");
    let changes = s.drain();
    assert!(
        changes
            .iter()
            .any(|c| c.key.user_id.as_str() == "D" && c.outputs.state),
        "a mention is the member's own state"
    );
    s.apply_report(&report(g, "C", 2));
    assert_eq!(unread_mentions(&s, g, "C"), 1);
    // A sender has read up to what they send.
    s.apply_event(&sent_mentioning(g, "B", 4, &[], false));
    assert_eq!(unread_mentions(&s, g, "B"), 0);
    s.apply_report(&private_report(g, "C", 3));
    assert_eq!(
        unread_mentions(&s, g, "C"),
        0,
        "a private read counts for oneself"
    );
    // A departed member has none counted from then on.
    s.apply_event(&left(g, "D", 4, 5));
    s.apply_event(&sent_mentioning(g, "A", 5, &["D"], false));
    assert_eq!(unread_mentions(&s, g, "D"), 1, "the one before leaving");
    // Restored from the changelog, the counts are the same.
    let mut live = s.clone();
    let changelog: Vec<Change> = live.keys().filter_map(|k| live.current(&k)).collect();
    live.drain();
    let restored = restore_from(&changelog);
    for u in ["A", "B", "C"] {
        assert_eq!(unread_mentions(&restored, g, u), unread_mentions(&s, g, u), "{u}");
    }
}

#[test]
fn unread_mentions_stop_at_the_cap() {
    let mut s = PartitionState::new();
    s.apply_event(&joined("G", "B", 0, 1));
    let n = MAX_UNREAD_MENTIONS as u64 + 30;
    for seq in 1..=n {
        s.apply_event(&sent_mentioning("G", "A", seq, &["B"], false));
    }
    assert_eq!(unread_mentions(&s, "G", "B") as usize, MAX_UNREAD_MENTIONS, "99+");
    s.apply_report(&report("G", "B", n - 10));
    assert_eq!(unread_mentions(&s, "G", "B"), 10, "the newest are exact");
}

#[test]
fn the_latest_mute_wins_in_any_order() {
    let mute = |at, until| {
        Input::Mute(MuteReport {
            conversation_id: conv("G"),
            user_id: user("B"),
            mute: Mute { at, until },
        })
    };
    let actions = [mute(5, Mute::FOREVER), mute(9, Mute::OFF), mute(7, 100)];
    let mut forward = PartitionState::new();
    let mut backward = PartitionState::new();
    for a in &actions {
        forward.apply(a);
    }
    for a in actions.iter().rev() {
        backward.apply(a);
    }
    let of = |s: &PartitionState| s.conversation(&conv("G")).unwrap().member(&user("B")).unwrap();
    assert_eq!(
        of(&forward).mute,
        Some(Mute {
            at: 9,
            until: Mute::OFF
        })
    );
    assert_eq!(of(&forward), of(&backward));
    assert!(!of(&forward).own().muted(50));
    let changes = forward.drain();
    assert!(
        changes[0].outputs.state && !changes[0].outputs.public,
        "mute is private"
    );
}
