//! Read latency per message: how long after `MessageSent.at` the first
//! possible reader, half of them and the last of them had read it.
//!
//! The live fold keeps one cursor per member and nothing per message; this
//! keeps a little per *open* message (one not yet read by all its possible
//! readers): its sender, send time, the number of possible readers, how many
//! have read it and the first and median times. No per-member list is kept:
//! when a member's cursor moves from `a` to `b`, every open message in
//! `(a, b]` they could read gains a reader. A message leaves memory when its
//! last possible reader reads it. At most `max_open` messages are open; past
//! that the oldest is written out as it stands, with `tracked_to_end =
//! false`, so memory is bounded by `max_open` (about 100 bytes each) whatever
//! the range.
//!
//! Definitions, in replay order:
//! - possible readers: the present members other than the sender who had
//!   joined by the message, counted when it is sent (the read model's rule);
//! - a member reads message S at the event time (`reported_at`, or `at` of a
//!   message they send) of the record that first moves their public cursor
//!   to S or past it; a member already past S when the message is sent (the
//!   report came first) read it at the send time;
//! - latencies are milliseconds after `MessageSent.at`, never negative;
//! - median: when ceil(n/2) of the n possible readers had read it;
//!   last: when all n had.
//!
//! Private receipts do not count: the table is as other members see it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use readfold_core::fold::ConversationRef;
use readfold_core::read_model::possible_reader;
use readfold_core::{ConversationId, Seq, UserId};

/// One message's read latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyRow {
    pub conversation: ConversationId,
    pub seq: u64,
    pub sender: UserId,
    pub sent_at: i64,
    pub possible_readers: u32,
    pub readers: u32,
    pub first_read_ms: Option<i64>,
    pub median_read_ms: Option<i64>,
    pub last_read_ms: Option<i64>,
    /// False when the memory bound stopped tracking the message early.
    pub tracked_to_end: bool,
}

#[derive(Clone, Debug)]
struct Open {
    sender: UserId,
    sent_at: i64,
    possible: u32,
    readers: u32,
    first: Option<i64>,
    median: Option<i64>,
}

impl Open {
    fn read_at(&mut self, at: i64) {
        self.readers += 1;
        let after = (at - self.sent_at).max(0);
        if self.readers == 1 {
            self.first = Some(after);
        }
        if self.readers == self.possible.div_ceil(2) {
            self.median = Some(after);
        }
    }

    fn complete(&self) -> bool {
        self.readers >= self.possible
    }

    fn row(
        self,
        conversation: ConversationId,
        seq: u64,
        last: Option<i64>,
        tracked_to_end: bool,
    ) -> LatencyRow {
        LatencyRow {
            conversation,
            seq,
            sender: self.sender,
            sent_at: self.sent_at,
            possible_readers: self.possible,
            readers: self.readers,
            first_read_ms: self.first,
            median_read_ms: self.median,
            last_read_ms: last,
            tracked_to_end,
        }
    }
}

/// Open messages, and the rows of those that completed.
pub struct LatencyTracker {
    open: HashMap<ConversationId, BTreeMap<u64, Open>>,
    /// Open messages in send order, for eviction; entries of messages that
    /// completed since are skipped when reached.
    sent_order: VecDeque<(ConversationId, u64)>,
    open_count: usize,
    max_open: usize,
    done: Vec<LatencyRow>,
    /// Highest seq sent per conversation: a message event at or below it is
    /// a duplicate (or out of order) and starts nothing.
    highest_sent: HashMap<ConversationId, u64>,
}

impl LatencyTracker {
    pub fn new(max_open: usize) -> Self {
        LatencyTracker {
            open: HashMap::new(),
            sent_order: VecDeque::new(),
            open_count: 0,
            max_open: max_open.max(1),
            done: Vec::new(),
            highest_sent: HashMap::new(),
        }
    }

    /// Messages being tracked.
    pub fn open_count(&self) -> usize {
        self.open_count
    }

    /// Message `seq` was sent by `sender` at `at`; `conversation` is the
    /// folded state after the message.
    pub fn sent(
        &mut self,
        id: &ConversationId,
        conversation: ConversationRef<'_>,
        seq: Seq,
        sender: &UserId,
        at: i64,
    ) {
        let highest = self.highest_sent.entry(id.clone()).or_default();
        if seq.get() <= *highest {
            return;
        }
        *highest = seq.get();
        let mut open = Open {
            sender: sender.clone(),
            sent_at: at,
            possible: 0,
            readers: 0,
            first: None,
            median: None,
        };
        let mut early = 0;
        for (user, member) in conversation.members() {
            let Some(present) = member.present() else { continue };
            if possible_reader(user, &present, seq, sender) {
                open.possible += 1;
                if present.has_read(seq) {
                    early += 1;
                }
            }
        }
        for _ in 0..early {
            open.read_at(at);
        }
        if open.complete() {
            let last = open.first.or(Some(0)).filter(|_| open.possible > 0);
            self.done.push(open.row(id.clone(), seq.get(), last, true));
            return;
        }
        let messages = self.open.entry(id.clone()).or_default();
        if messages.insert(seq.get(), open).is_none() {
            self.open_count += 1;
            self.sent_order.push_back((id.clone(), seq.get()));
        }
        while self.open_count > self.max_open {
            self.evict_oldest();
        }
    }

    /// `user`'s public cursor in `conversation` moved from `from` to `to` at
    /// event time `at`.
    pub fn advanced(
        &mut self,
        id: &ConversationId,
        conversation: ConversationRef<'_>,
        user: &UserId,
        from: Seq,
        to: Seq,
        at: i64,
    ) {
        if to <= from {
            return;
        }
        let Some(messages) = self.open.get_mut(id) else {
            return;
        };
        let Some(present) = conversation.member(user).and_then(|m| m.present()) else {
            return;
        };
        let mut completed = vec![];
        for (&seq, open) in messages.range_mut(from.get() + 1..=to.get()) {
            if possible_reader(user, &present, Seq(seq), &open.sender) {
                open.read_at(at);
                if open.complete() {
                    completed.push(seq);
                }
            }
        }
        for seq in completed {
            if let Some(open) = messages.remove(&seq) {
                self.open_count -= 1;
                let last = Some((at - open.sent_at).max(0));
                self.done.push(open.row(id.clone(), seq, last, true));
            }
        }
        if messages.is_empty() {
            self.open.remove(id);
        }
    }

    /// Rows of messages that completed (or were evicted) since the last call.
    pub fn take_done(&mut self) -> Vec<LatencyRow> {
        std::mem::take(&mut self.done)
    }

    /// Every message still open, in (conversation, seq) order, as it stands
    /// at the end point.
    pub fn finish(mut self) -> Vec<LatencyRow> {
        let mut rows = std::mem::take(&mut self.done);
        let mut open: Vec<_> = self.open.into_iter().collect();
        open.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, messages) in open {
            for (seq, message) in messages {
                rows.push(message.row(id.clone(), seq, None, true));
            }
        }
        rows
    }

    fn evict_oldest(&mut self) {
        while let Some((id, seq)) = self.sent_order.pop_front() {
            let Some(messages) = self.open.get_mut(&id) else {
                continue;
            };
            let Some(open) = messages.remove(&seq) else {
                continue;
            };
            if messages.is_empty() {
                self.open.remove(&id);
            }
            self.open_count -= 1;
            self.done.push(open.row(id, seq, None, false));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::replayer::Replayer;
    use crate::table::TableKind;
    use crate::test_inputs::{joined, read, sent};

    /// The tracker as replay drives it.
    fn replayer(max_open: usize) -> Replayer {
        Replayer::new(TableKind::Latency, &[], max_open)
    }

    #[test]
    fn first_median_and_last_reader_of_a_group_message() {
        let mut r = replayer(100);
        for m in ["a", "b", "c", "d"] {
            r.apply(&joined("g", m, 0));
        }
        r.apply(&sent("g", "a", 1, 1_000));
        r.apply(&read("g", "b", 1, 1_200));
        assert!(r.take_latency_rows().is_empty());
        r.apply(&read("g", "b", 1, 1_300)); // a duplicate counts once
        r.apply(&sent("g", "a", 1, 1_400)); // so does a duplicate message event
        r.apply(&read("g", "c", 1, 1_500));
        assert!(r.take_latency_rows().is_empty());
        r.apply(&read("g", "d", 1, 4_000));
        let rows = r.take_latency_rows();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!((row.possible_readers, row.readers), (3, 3));
        assert_eq!(
            (row.first_read_ms, row.median_read_ms, row.last_read_ms),
            (Some(200), Some(500), Some(3_000))
        );
        assert!(row.tracked_to_end);
        assert_eq!(r.open_messages(), 0, "a read message leaves memory");
    }

    #[test]
    fn one_cursor_move_reads_every_message_below_it_and_sending_reads_too() {
        let mut r = replayer(100);
        r.apply(&joined("d", "a", 0));
        r.apply(&joined("d", "b", 0));
        r.apply(&sent("d", "a", 1, 100));
        r.apply(&sent("d", "a", 2, 200));
        // b's reply at seq 3 moves b's cursor to 3: b read 1 and 2 then.
        r.apply(&sent("d", "b", 3, 1_000));
        let got: Vec<_> = r
            .take_latency_rows()
            .iter()
            .map(|row| (row.seq, row.last_read_ms))
            .collect();
        assert_eq!(got, [(1, Some(900)), (2, Some(800))]);
        let rest = r.finish_latency();
        assert_eq!(rest.len(), 1);
        assert_eq!((rest[0].seq, rest[0].readers, rest[0].last_read_ms), (3, 0, None));
    }

    #[test]
    fn late_joiners_are_not_possible_readers_and_early_reports_read_at_send() {
        let mut r = replayer(100);
        r.apply(&joined("g", "a", 0));
        r.apply(&joined("g", "b", 0));
        // b's report arrives before the message event (clocks, partitions).
        r.apply(&read("g", "b", 1, 900));
        r.apply(&sent("g", "a", 1, 1_000));
        r.apply(&joined("g", "late", 1));
        let rows = r.take_latency_rows();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].possible_readers, rows[0].first_read_ms), (1, Some(0)));
    }

    #[test]
    fn memory_is_bounded_by_evicting_the_oldest_open_message() {
        let mut r = replayer(2);
        r.apply(&joined("g", "a", 0));
        r.apply(&joined("g", "b", 0));
        for seq in 1..=5 {
            r.apply(&sent("g", "a", seq, seq as i64 * 10));
        }
        assert_eq!(r.open_messages(), 2);
        let evicted: Vec<_> = r
            .take_latency_rows()
            .iter()
            .map(|row| (row.seq, row.tracked_to_end))
            .collect();
        assert_eq!(evicted, [(1, false), (2, false), (3, false)]);
        r.apply(&read("g", "b", 5, 100));
        let done: Vec<_> = r.take_latency_rows().iter().map(|row| row.seq).collect();
        assert_eq!(done, [4, 5]);
    }
}
