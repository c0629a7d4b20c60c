//! Read counts of a conversation's most recent messages, kept as cursors
//! move, for big groups whose clients show "N read" under the messages on
//! their screen rather than every member's cursor.
//!
//! Each slot counts the members m with join_seq(m) <= seq <= cursor(m),
//! the sender included; the sender is taken off when a count is read
//! ([`RecentReadCounts::read_count`]), which gives the read model's rule
//! ([`crate::ConversationView::read_count`]) without knowing, when a cursor
//! moves, who sent each message. A cursor moving from a to b touches only
//! the slots in (a, b]; a new message costs one pass over the members.

use std::collections::VecDeque;

use crate::read_model::MemberCursor;

#[derive(Clone, Debug)]
struct Slot<U> {
    /// Members with join_seq <= seq <= cursor, the sender included.
    readers: u32,
    /// Unknown for messages sent before the counts started.
    sender: Option<U>,
}

/// The newest `capacity` seqs' read counts of one conversation.
#[derive(Clone, Debug)]
pub struct RecentReadCounts<U> {
    capacity: usize,
    /// The seq of `slots[0]`.
    first: u64,
    slots: VecDeque<Slot<U>>,
}

impl<U: Eq + Clone> RecentReadCounts<U> {
    /// Counts that start after `latest_seq` (the messages before it have no
    /// known sender) and keep the newest `capacity` seqs.
    pub fn new(capacity: usize, latest_seq: u64) -> Self {
        RecentReadCounts {
            capacity: capacity.max(1),
            first: latest_seq + 1,
            slots: VecDeque::new(),
        }
    }

    /// The highest seq counted (`first - 1` while none is).
    pub fn top(&self) -> u64 {
        self.first + self.slots.len() as u64 - 1
    }

    /// The lowest seq counted.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Counts every seq up to `latest`, from the members' present cursors,
    /// and forgets the oldest beyond the capacity.
    pub fn extend_to(&mut self, latest: u64, members: impl IntoIterator<Item = MemberCursor>) {
        let top = self.top();
        if latest <= top {
            return;
        }
        let start = (top + 1).max(latest.saturating_sub(self.capacity as u64 - 1));
        if start > top + 1 {
            // The gap is wider than the window: start afresh.
            self.slots.clear();
            self.first = start;
        }
        let n = (latest - start + 1) as usize;
        let mut diff = vec![0i64; n + 1];
        for m in members {
            let lo = m.join_seq.get().max(start);
            let hi = m.cursor.get().min(latest);
            if lo <= hi {
                diff[(lo - start) as usize] += 1;
                diff[(hi - start) as usize + 1] -= 1;
            }
        }
        let mut running = 0i64;
        for d in &diff[..n] {
            running += d;
            self.slots.push_back(Slot {
                readers: running as u32,
                sender: None,
            });
        }
        while self.slots.len() > self.capacity {
            self.slots.pop_front();
            self.first += 1;
        }
    }

    /// A member's state changed (`None`: not a present member); both are
    /// counted over the seqs they cover here.
    pub fn moved(&mut self, before: Option<MemberCursor>, after: Option<MemberCursor>) {
        if before == after {
            return;
        }
        if let Some(m) = before {
            self.add(m, -1);
        }
        if let Some(m) = after {
            self.add(m, 1);
        }
    }

    fn add(&mut self, m: MemberCursor, by: i32) {
        let lo = m.join_seq.get().max(self.first);
        let hi = m.cursor.get().min(self.top());
        if lo > hi {
            return;
        }
        for slot in self
            .slots
            .range_mut((lo - self.first) as usize..=(hi - self.first) as usize)
        {
            slot.readers = slot.readers.saturating_add_signed(by);
        }
    }

    /// Message `seq` was sent by `sender`; counted once the counts reach it
    /// ([`RecentReadCounts::extend_to`] first).
    pub fn sent(&mut self, seq: u64, sender: U) {
        if let Some(slot) = seq
            .checked_sub(self.first)
            .and_then(|i| self.slots.get_mut(i as usize))
        {
            slot.sender = Some(sender);
        }
    }

    /// How many members other than the sender read `seq`, given how to find
    /// a present member's state; `None` when it is not counted here or its
    /// sender is unknown.
    pub fn read_count(&self, seq: u64, member: impl Fn(&U) -> Option<MemberCursor>) -> Option<u32> {
        let slot = self.slots.get(seq.checked_sub(self.first)? as usize)?;
        let sender = slot.sender.as_ref()?;
        let own = member(sender).is_some_and(|m| m.has_read(crate::Seq(seq)));
        Some(slot.readers - u32::from(own))
    }

    /// Every counted seq's read count, from [`RecentReadCounts::first`].
    pub fn read_counts(&self, member: impl Fn(&U) -> Option<MemberCursor>) -> Vec<Option<u32>> {
        (self.first..=self.top())
            .map(|seq| self.read_count(seq, &member))
            .collect()
    }
}

/// The highest seq up to `latest_seq` that every present member who could
/// see it has read, and so every message at or below it: read by all is a
/// prefix, since a member who has not read a message has read none after
/// it (unless they sent it, and a sender's cursor follows their message).
pub fn read_by_all_through(latest_seq: u64, members: impl IntoIterator<Item = MemberCursor>) -> u64 {
    members
        .into_iter()
        .map(|m| m.cursor.get().max(m.join_seq.get().saturating_sub(1)))
        .fold(latest_seq, u64::min)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::{ConversationView, Seq, UserId};

    fn user(i: u8) -> UserId {
        UserId::parse(&format!("u{i}"), 64).unwrap()
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A member's cursor reaches this seq (max-merged).
        Read(u8, u64),
        /// A member sends the next message; their cursor follows it only
        /// when `followed` (the changelog may bring it later).
        Send(u8, bool),
        Join(u8),
        Leave(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..12u8, 0..60u64).prop_map(|(u, s)| Op::Read(u, s)),
            3 => (0..12u8, any::<bool>()).prop_map(|(u, f)| Op::Send(u, f)),
            1 => (0..12u8).prop_map(Op::Join),
            1 => (0..12u8).prop_map(Op::Leave),
        ]
    }

    /// Applies `ops` to a view and to counts kept alongside, as a gateway's
    /// room does, checking the counts against the read model after each.
    fn check(capacity: usize, start_members: u8, ops: Vec<Op>) {
        let mut view = ConversationView::default();
        for i in 0..start_members {
            view.members.insert(
                user(i),
                MemberCursor {
                    cursor: Seq(0),
                    delivered: Seq(0),
                    join_seq: Seq(1),
                },
            );
        }
        let mut counts = RecentReadCounts::new(capacity, 0);
        let mut senders = BTreeMap::new();
        for op in ops {
            let (before, after) = match op {
                Op::Read(i, seq) => {
                    let before = view.members.get(&user(i)).copied();
                    let Some(m) = view.members.get_mut(&user(i)) else {
                        continue;
                    };
                    m.cursor = m.cursor.max(Seq(seq));
                    (before, Some(*m))
                }
                Op::Send(i, followed) => {
                    let seq = view.latest_seq.get() + 1;
                    view.latest_seq = Seq(seq);
                    counts.extend_to(seq, view.members.values().copied());
                    counts.sent(seq, user(i));
                    senders.insert(seq, user(i));
                    let before = view.members.get(&user(i)).copied();
                    match view.members.get_mut(&user(i)) {
                        Some(m) if followed => {
                            m.cursor = m.cursor.max(Seq(seq));
                            (before, Some(*m))
                        }
                        _ => continue,
                    }
                }
                Op::Join(i) => {
                    if view.members.contains_key(&user(i)) {
                        continue;
                    }
                    let m = MemberCursor {
                        cursor: view.latest_seq,
                        delivered: view.latest_seq,
                        join_seq: Seq(view.latest_seq.get() + 1),
                    };
                    view.members.insert(user(i), m);
                    (None, Some(m))
                }
                Op::Leave(i) => match view.members.remove(&user(i)) {
                    Some(m) => (Some(m), None),
                    None => continue,
                },
            };
            counts.moved(before, after);
            let latest = view.latest_seq.get();
            assert!(counts.top() == latest || latest == 0);
            assert!(counts.top() + 1 - counts.first() <= capacity as u64);
            for seq in counts.first()..=counts.top() {
                let sender = &senders[&seq];
                let got = counts.read_count(seq, |u| view.members.get(u).copied());
                assert_eq!(got, Some(view.read_count(Seq(seq), sender) as u32), "seq {seq}");
            }
            // Read by all, where every present sender's cursor followed.
            let through = read_by_all_through(latest, view.members.values().copied());
            for seq in 1..=latest {
                let sender = &senders[&seq];
                if view.members.get(sender).is_some_and(|m| m.cursor.get() < seq) {
                    continue;
                }
                let all = view.read_count(Seq(seq), sender) == view.possible_readers(Seq(seq), sender);
                assert_eq!(all, seq <= through, "seq {seq}, through {through}");
            }
        }
    }

    proptest! {
        #[test]
        fn counts_equal_the_read_model_after_any_interleaving(
            capacity in 1..20usize,
            start_members in 0..8u8,
            ops in prop::collection::vec(op(), 0..120),
        ) {
            check(capacity, start_members, ops);
        }
    }

    #[test]
    fn a_cursor_move_touches_only_the_seqs_it_passes() {
        let member = |cursor, join_seq| MemberCursor {
            cursor: Seq(cursor),
            delivered: Seq(cursor),
            join_seq: Seq(join_seq),
        };
        let mut counts = RecentReadCounts::new(4, 10);
        counts.extend_to(15, [member(12, 1), member(20, 14)]);
        // Only seqs 12..=15 are kept; 12 by the first, 14 and 15 by the second.
        assert_eq!(counts.first(), 12);
        for seq in 12..=15 {
            counts.sent(seq, "s");
        }
        let none = |_: &&str| None;
        assert_eq!(counts.read_counts(none), [Some(1), Some(0), Some(1), Some(1)]);
        counts.moved(Some(member(12, 1)), Some(member(14, 1)));
        assert_eq!(counts.read_counts(none), [Some(1), Some(1), Some(2), Some(1)]);
        // A sender is not a reader of their own message.
        let sender = |u: &&str| (*u == "s").then(|| member(15, 1));
        assert_eq!(counts.read_count(15, sender), Some(0));
        assert_eq!(counts.read_count(16, sender), None);
        assert_eq!(read_by_all_through(15, [member(14, 1), member(20, 14)]), 14);
        assert_eq!(read_by_all_through(15, [member(3, 9)]), 8);
        assert_eq!(read_by_all_through(15, []), 15);
    }
}
