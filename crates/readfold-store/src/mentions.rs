//! A member's unread mentions of one conversation as the per-user stores
//! keep them: the highest read point written and the mentioned seqs above
//! it. Two of them join order-independently (the greater read point, the
//! union of seqs above it, the newest [`MAX_UNREAD_MENTIONS`]), so a stale
//! or racing write never brings back a read mention nor loses an unread one.

use readfold_core::read_model::MAX_UNREAD_MENTIONS;
use readfold_core::Seq;

/// Unread mentions with the read point they were written at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mentions {
    /// The highest read point (by either cursor) any write carried.
    pub read: Seq,
    /// Mentioned seqs above `read`, ascending, the newest kept.
    pub seqs: Vec<Seq>,
}

impl Mentions {
    /// `seqs` above `read`, ascending, the newest kept.
    pub fn new(read: Seq, seqs: impl IntoIterator<Item = Seq>) -> Self {
        let mut seqs: Vec<Seq> = seqs.into_iter().filter(|&s| s > read).collect();
        seqs.sort_unstable();
        seqs.dedup();
        let over = seqs.len().saturating_sub(MAX_UNREAD_MENTIONS);
        seqs.drain(..over);
        Mentions { read, seqs }
    }

    /// The join of two: what merging them in either order stores.
    pub fn join(&self, other: &Mentions) -> Mentions {
        Mentions::new(
            self.read.max(other.read),
            self.seqs.iter().chain(&other.seqs).copied(),
        )
    }

    /// Mentions still unread once the member read up to `read_up_to` (as
    /// far as the reader knows their cursors).
    pub fn unread(&self, read_up_to: Seq) -> u32 {
        let read = self.read.max(read_up_to);
        self.seqs.iter().filter(|&&s| s > read).count() as u32
    }

    /// `<read>:<s1>,<s2>,...` (nothing after the colon when none is unread),
    /// as Redis stores it.
    pub fn encode(&self) -> String {
        let seqs: Vec<String> = self.seqs.iter().map(|s| s.get().to_string()).collect();
        format!("{}:{}", self.read.get(), seqs.join(","))
    }

    /// The inverse of [`encode`](Self::encode); `None` for anything else.
    pub fn decode(text: &str) -> Option<Mentions> {
        let (read, seqs) = text.split_once(':')?;
        let read = Seq(read.parse().ok()?);
        let seqs = if seqs.is_empty() {
            Vec::new()
        } else {
            seqs.split(',')
                .map(|s| s.parse().ok().map(Seq))
                .collect::<Option<Vec<Seq>>>()?
        };
        Some(Mentions::new(read, seqs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(read: u64, seqs: &[u64]) -> Mentions {
        Mentions::new(Seq(read), seqs.iter().map(|&s| Seq(s)))
    }

    #[test]
    fn encodes_and_decodes_the_stored_form() {
        assert_eq!(m(3, &[9, 5, 2]).encode(), "3:5,9");
        assert_eq!(m(7, &[]).encode(), "7:");
        assert_eq!(Mentions::decode("3:5,9"), Some(m(3, &[5, 9])));
        assert_eq!(Mentions::decode("7:"), Some(m(7, &[])));
        // Seqs at or below the read point say nothing.
        assert_eq!(Mentions::decode("7:3,8"), Some(m(7, &[8])));
        for bad in ["", "7", "x:1", "7:1,,2", "7:a"] {
            assert_eq!(Mentions::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_join_is_order_independent_and_never_brings_back_a_read_mention() {
        let older = m(2, &[4, 6]);
        let newer = m(5, &[6, 8]);
        let racing = m(5, &[7]);
        let joined = older.join(&newer).join(&racing);
        assert_eq!(joined, m(5, &[6, 7, 8]));
        assert_eq!(racing.join(&newer).join(&older), joined);
        assert_eq!(joined.join(&older), joined, "idempotent");
        assert_eq!(joined.unread(Seq(6)), 2, "a cursor the reader knows counts too");
    }

    #[test]
    fn the_join_keeps_the_newest() {
        let low = m(0, &(1..=MAX_UNREAD_MENTIONS as u64).collect::<Vec<_>>());
        let high = m(0, &[500, 501]);
        let joined = low.join(&high);
        assert_eq!(joined.seqs.len(), MAX_UNREAD_MENTIONS);
        assert_eq!(joined.seqs[0], Seq(3));
        assert_eq!(joined.seqs.last(), Some(&Seq(501)));
    }
}
