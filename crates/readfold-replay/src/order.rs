//! The one order in which a replay folds its records.
//!
//! Kafka orders records only within a partition, and a consumer receives
//! partitions interleaved as fetches happen to return. Replay therefore
//! never folds in arrival order: it keeps the next record (the head) of
//! every input partition and always folds the head with the smallest
//! [`OrderKey`]: record timestamp, then conversation events before read
//! reports (a message exists before it is read), then partition, then
//! offset. It waits for a partition's head before choosing, so the result
//! depends only on the records in the range, never on fetch timing.
//!
//! Each partition is still taken in offset order, so a partition whose
//! timestamps go backwards is not re-sorted; the order stays a function of
//! the records alone, which is what determinism needs. The cursors do not
//! depend on order at all (the fold is a max-merge); only the latency table's
//! times do, so the cursors table from the input topics is folded without
//! this merge ([`crate::prefetch::Arrival::AsFetched`]).

use std::cmp::Reverse;
use std::collections::binary_heap::{BinaryHeap, PeekMut};

/// Where a record sorts in a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderKey {
    /// Kafka record timestamp, epoch milliseconds.
    pub timestamp: i64,
    /// Rank of the record's topic among records with the same timestamp
    /// ([`crate::source::Source::rank`]).
    pub input: u8,
    pub partition: i32,
    pub offset: i64,
}

impl OrderKey {
    pub fn new(timestamp: i64, rank: u8, partition: i32, offset: i64) -> Self {
        OrderKey {
            timestamp,
            input: rank,
            partition,
            offset,
        }
    }
}

/// A k-way merge of sources that each yield in offset order.
pub struct Merge<T> {
    heads: Vec<Option<T>>,
    /// The keys of the present heads, smallest on top.
    order: BinaryHeap<Reverse<(OrderKey, usize)>>,
    /// Sources not pulled yet (at the start).
    unpulled: Vec<usize>,
    /// The source whose head was taken last: its key is still on top, to be
    /// replaced by its next head's in one sift rather than a pop and a push.
    taken: Option<usize>,
}

impl<T> Merge<T> {
    pub fn new(sources: usize) -> Self {
        Merge {
            heads: (0..sources).map(|_| None).collect(),
            order: BinaryHeap::with_capacity(sources),
            unpulled: (0..sources).collect(),
            taken: None,
        }
    }

    /// The next record in replay order, or `None` when every source is
    /// exhausted. `pull(i)` reads source `i`'s next record, blocking until
    /// it has one or knows it has none.
    pub fn next<E>(
        &mut self,
        mut pull: impl FnMut(usize) -> Result<Option<(OrderKey, T)>, E>,
    ) -> Result<Option<(OrderKey, T)>, E> {
        while let Some(&i) = self.unpulled.last() {
            if let Some((key, item)) = pull(i)? {
                self.heads[i] = Some(item);
                self.order.push(Reverse((key, i)));
            }
            self.unpulled.pop();
        }
        if let Some(i) = self.taken {
            let next = pull(i)?;
            self.taken = None;
            let mut top = self.order.peek_mut().expect("the taken head's key is on top");
            match next {
                Some((key, item)) => {
                    self.heads[i] = Some(item);
                    *top = Reverse((key, i));
                }
                None => {
                    PeekMut::pop(top);
                }
            }
        }
        let Some(&Reverse((key, i))) = self.order.peek() else {
            return Ok(None);
        };
        self.taken = Some(i);
        Ok(self.heads[i].take().map(|item| (key, item)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Source;
    use readfold_core::fold::InputKind;
    use std::collections::VecDeque;

    fn key(ts: i64, kind: InputKind, p: i32, o: i64) -> OrderKey {
        OrderKey::new(ts, Source::Input(kind).rank(), p, o)
    }

    fn merge_all(mut sources: Vec<VecDeque<OrderKey>>) -> Vec<OrderKey> {
        let mut merge = Merge::new(sources.len());
        let mut out = vec![];
        while let Some((k, ())) = merge
            .next::<()>(|i| Ok(sources[i].pop_front().map(|k| (k, ()))))
            .unwrap()
        {
            out.push(k);
        }
        out
    }

    #[test]
    fn merges_by_time_then_events_first_then_partition_then_offset() {
        use InputKind::*;
        let reports0 = VecDeque::from([key(10, ReadReports, 0, 0), key(20, ReadReports, 0, 1)]);
        let reports1 = VecDeque::from([key(10, ReadReports, 1, 0)]);
        let events0 = VecDeque::from([
            key(10, ConversationEvents, 0, 0),
            key(30, ConversationEvents, 0, 1),
        ]);
        let out = merge_all(vec![reports0, reports1, events0]);
        assert_eq!(
            out,
            [
                key(10, ConversationEvents, 0, 0),
                key(10, ReadReports, 0, 0),
                key(10, ReadReports, 1, 0),
                key(20, ReadReports, 0, 1),
                key(30, ConversationEvents, 0, 1),
            ]
        );
    }

    #[test]
    fn the_order_does_not_depend_on_source_order() {
        use InputKind::*;
        let a = VecDeque::from([
            key(5, ReadReports, 0, 0),
            key(1, ReadReports, 0, 1),
            key(9, ReadReports, 0, 2),
        ]);
        let b = VecDeque::from([key(3, ConversationEvents, 2, 0), key(7, ConversationEvents, 2, 1)]);
        let c = VecDeque::from([key(3, ReadReports, 1, 0)]);
        let one = merge_all(vec![a.clone(), b.clone(), c.clone()]);
        let other = merge_all(vec![c, a.clone(), b]);
        assert_eq!(one, other);
        // Offset order holds within a partition even when time goes back.
        let from_a: Vec<_> = one.iter().filter(|k| k.partition == 0).copied().collect();
        assert_eq!(from_a, Vec::from(a));
    }
}
