//! The read model: what readers derive from cursors. Defined once, here; the
//! fold, the Redis, CQL and changelog readers, the demo and the tests all
//! answer through it.
//!
//! - unread(user) = max(0, latest_seq - cursor(user))
//! - message S sent by U is read by the present members m != U with
//!   join_seq(m) <= S <= cursor(m); its read count is how many there are.
//! - it is delivered to those with join_seq(m) <= S <= delivered(m), where
//!   delivered(m) >= cursor(m): reading implies delivery.
//!
//! A 1:1 chat is the same rule with two members: a count of 0 or 1 is
//! "unread" or "read".

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::domain::{Seq, UserId};

/// A present member's read state, as every store keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberCursor {
    /// Has read every message with seq <= cursor.
    pub cursor: Seq,
    /// Every message with seq <= delivered reached one of the member's
    /// devices. A store that lags may hold it below `cursor`: the rules
    /// read it through [`MemberCursor::delivered_through`].
    pub delivered: Seq,
    /// First seq the member could see: 1 unless they joined later.
    pub join_seq: Seq,
}

impl MemberCursor {
    /// The read-count rule for one member: they could see message `seq`
    /// (joined by then) and their cursor reached it.
    pub fn has_read(&self, seq: Seq) -> bool {
        self.could_read(seq) && seq <= self.cursor
    }

    /// The read-count rule for delivery: message `seq` reached one of the
    /// member's devices.
    pub fn has_received(&self, seq: Seq) -> bool {
        self.could_read(seq) && seq <= self.delivered_through()
    }

    /// How far messages reached the member: reading implies delivery.
    pub fn delivered_through(&self) -> Seq {
        self.delivered.max(self.cursor)
    }

    /// Whether the member has `reached` message `seq`.
    pub fn has(&self, reached: Reached, seq: Seq) -> bool {
        match reached {
            Reached::Read => self.has_read(seq),
            Reached::Delivered => self.has_received(seq),
        }
    }

    /// Whether the member could see message `seq`: they had joined by then.
    pub fn could_read(&self, seq: Seq) -> bool {
        self.join_seq <= seq
    }

    /// unread = max(0, latest_seq - cursor), by the public cursor.
    pub fn unread(&self, latest_seq: Seq) -> u64 {
        latest_seq.get().saturating_sub(self.cursor.get())
    }
}

/// Whether `user` is among the possible readers of message `seq` sent by
/// `sender`: anyone but the sender who had joined by then. A read count is
/// at most the number of possible readers.
pub fn possible_reader(user: &UserId, member: &MemberCursor, seq: Seq, sender: &UserId) -> bool {
    user != sender && member.could_read(seq)
}

/// A member's read state as their own devices see it: both cursors and the
/// unread mark. Other members never see more than [`MemberCursor`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnCursor {
    /// The public cursor.
    pub cursor: Seq,
    /// The highest private receipt.
    pub private_cursor: Seq,
    /// The cursor at which the member marked the conversation unread, if
    /// the mark was not cleared since.
    pub mark_seq: Option<Seq>,
    /// Messages above `read_up_to` that mention the member, at most
    /// [`MAX_UNREAD_MENTIONS`] (a client shows "99+" past 99).
    pub unread_mentions: u32,
    /// The member's latest mute or unmute.
    pub mute: Option<Mute>,
}

/// Unread mentions kept per member; more show as "99+".
pub const MAX_UNREAD_MENTIONS: usize = 100;

/// A member's latest mute or unmute of a conversation: the greatest `(at,
/// until)` wins, so order and duplicates do not matter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mute {
    /// When the member acted (ms since the epoch).
    pub at: i64,
    /// Muted while the time is below this: [`Mute::FOREVER`] until unmuted,
    /// [`Mute::OFF`] for an unmute.
    pub until: i64,
}

impl Mute {
    pub const FOREVER: i64 = i64::MAX;
    pub const OFF: i64 = i64::MIN;

    /// Whether the conversation is muted at `now_ms`.
    pub fn is_muted(&self, now_ms: i64) -> bool {
        now_ms < self.until
    }
}

impl OwnCursor {
    /// Whether the conversation is muted at `now_ms`.
    pub fn muted(&self, now_ms: i64) -> bool {
        self.mute.is_some_and(|m| m.is_muted(now_ms))
    }

    /// How far the member has read, by either cursor.
    pub fn read_up_to(&self) -> Seq {
        self.cursor.max(self.private_cursor)
    }

    /// The mark holds until the member reads past where they set it.
    pub fn marked_unread(&self) -> bool {
        self.mark_seq.is_some_and(|s| self.read_up_to() <= s)
    }

    /// The member's own unread count: max(0, latest_seq - max(public,
    /// private)), and at least 1 while the conversation is marked unread.
    pub fn unread(&self, latest_seq: Seq) -> u64 {
        let unread = latest_seq.get().saturating_sub(self.read_up_to().get());
        if self.marked_unread() {
            unread.max(1)
        } else {
            unread
        }
    }
}

/// How far a message got with a member: to one of their devices, or read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reached {
    Delivered,
    Read,
}

/// What a sender's client draws under a message: how many of its possible
/// readers it reached and read, and whether all of them did (the grey and
/// the blue ticks). A message with no possible reader is neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticks {
    pub possible_readers: usize,
    pub delivered_count: usize,
    pub read_count: usize,
}

impl Ticks {
    pub fn delivered_to_all(&self) -> bool {
        self.possible_readers > 0 && self.delivered_count == self.possible_readers
    }

    pub fn read_by_all(&self) -> bool {
        self.possible_readers > 0 && self.read_count == self.possible_readers
    }
}

/// A message whose readers are asked for: its seq and its sender, who never
/// counts as a reader of their own message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MessageRef {
    pub seq: Seq,
    pub sender: UserId,
}

/// The read state of one conversation as readers see it: the latest seq and
/// the present members (departed members are absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConversationView {
    /// Highest seq known; may lag behind cursors, so readers clamp.
    pub latest_seq: Seq,
    /// Present members by user id; ordered, so that who-read pages are stable.
    pub members: BTreeMap<UserId, MemberCursor>,
}

impl ConversationView {
    /// The user's cursor, 0 when they are not a present member.
    pub fn cursor(&self, user: &UserId) -> Seq {
        self.members.get(user).map_or(Seq::ZERO, |m| m.cursor)
    }

    /// unread(user) = max(0, latest_seq - cursor(user)), by the public
    /// cursor. A member's own count also takes their private cursor and
    /// unread mark: [`OwnCursor::unread`].
    pub fn unread(&self, user: &UserId) -> u64 {
        self.members
            .get(user)
            .map_or(self.latest_seq.get(), |m| m.unread(self.latest_seq))
    }

    /// Members other than the sender who read message `seq`, in user id order.
    pub fn readers<'a>(&'a self, seq: Seq, sender: &'a UserId) -> impl Iterator<Item = &'a UserId> + 'a {
        reached_in(self.members.iter(), Reached::Read, seq, sender)
    }

    /// How many members other than the sender message `seq` reached.
    pub fn delivered_count(&self, seq: Seq, sender: &UserId) -> usize {
        reached_in(self.members.iter(), Reached::Delivered, seq, sender).count()
    }

    /// The ticks of message `seq` sent by `sender`, in one pass.
    pub fn ticks(&self, seq: Seq, sender: &UserId) -> Ticks {
        let mut ticks = Ticks::default();
        for (user, m) in &self.members {
            if possible_reader(user, m, seq, sender) {
                ticks.possible_readers += 1;
                ticks.delivered_count += usize::from(seq <= m.delivered_through());
                ticks.read_count += usize::from(seq <= m.cursor);
            }
        }
        ticks
    }

    /// How many members other than the sender read message `seq`.
    pub fn read_count(&self, seq: Seq, sender: &UserId) -> usize {
        self.readers(seq, sender).count()
    }

    /// How many present members other than the sender could read message
    /// `seq`: the read count's ceiling.
    pub fn possible_readers(&self, seq: Seq, sender: &UserId) -> usize {
        self.members
            .iter()
            .filter(|(user, m)| possible_reader(user, m, seq, sender))
            .count()
    }

    /// Read counts of many messages at once, in the order given.
    pub fn read_counts(&self, messages: &[MessageRef]) -> Vec<usize> {
        messages
            .iter()
            .map(|m| self.read_count(m.seq, &m.sender))
            .collect()
    }

    /// One page of who-read: at most `limit` readers of message `seq` whose
    /// id sorts after `after` (exclusive), and the cursor of the next page
    /// when there is one.
    pub fn readers_page(
        &self,
        seq: Seq,
        sender: &UserId,
        after: Option<&UserId>,
        limit: usize,
    ) -> (Vec<UserId>, Option<UserId>) {
        self.reached_page(Reached::Read, seq, sender, after, limit)
    }

    /// [`ConversationView::readers_page`] for those message `seq` reached
    /// (`Reached::Delivered`: who-received) or who read it.
    pub fn reached_page(
        &self,
        reached: Reached,
        seq: Seq,
        sender: &UserId,
        after: Option<&UserId>,
        limit: usize,
    ) -> (Vec<UserId>, Option<UserId>) {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let members = self.members.range((start, Bound::Unbounded));
        let mut page: Vec<UserId> = reached_in(members, reached, seq, sender)
            .take(limit.saturating_add(1))
            .cloned()
            .collect();
        let next = (page.len() > limit).then(|| {
            page.truncate(limit);
            page.last().cloned()
        });
        (page, next.flatten())
    }
}

fn reached_in<'a>(
    members: impl Iterator<Item = (&'a UserId, &'a MemberCursor)> + 'a,
    reached: Reached,
    seq: Seq,
    sender: &'a UserId,
) -> impl Iterator<Item = &'a UserId> + 'a {
    members
        .filter(move |(user, m)| user != &sender && m.has(reached, seq))
        .map(|(user, _)| user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> UserId {
        s.parse().unwrap()
    }

    /// Seed 1, the group: A sends 1..3; B read 1; C read 2; D joined after 2
    /// and read 3.
    fn group() -> ConversationView {
        let m = |cursor, join_seq| MemberCursor {
            cursor: Seq(cursor),
            delivered: Seq(cursor),
            join_seq: Seq(join_seq),
        };
        ConversationView {
            latest_seq: Seq(3),
            members: [("A", m(3, 1)), ("B", m(1, 1)), ("C", m(2, 1)), ("D", m(3, 3))]
                .into_iter()
                .map(|(u, c)| (user(u), c))
                .collect(),
        }
    }

    #[test]
    fn read_counts_follow_the_seed_rules() {
        let g = group();
        let a = user("A");
        assert_eq!(g.read_count(Seq(1), &a), 2, "B and C");
        assert_eq!(g.read_count(Seq(2), &a), 1, "only C");
        assert_eq!(g.read_count(Seq(3), &a), 1, "D joined late but read 3");
        let msgs: Vec<MessageRef> = (1..=3)
            .map(|s| MessageRef {
                seq: Seq(s),
                sender: a.clone(),
            })
            .collect();
        assert_eq!(g.read_counts(&msgs), [2, 1, 1]);
        let who: Vec<&str> = g.readers(Seq(1), &a).map(UserId::as_str).collect();
        assert_eq!(who, ["B", "C"]);
    }

    #[test]
    fn ticks_count_delivery_and_reading_by_the_join_seq_rule() {
        let mut g = group();
        let (a, b, c) = (user("A"), user("B"), user("C"));
        // B's devices got up to 3; C's only what C read; D joined at 3.
        g.members.get_mut(&b).unwrap().delivered = Seq(3);
        // A store that lags may hold delivered below the cursor.
        g.members.get_mut(&c).unwrap().delivered = Seq(0);
        let ticks = g.ticks(Seq(2), &a);
        assert_eq!(
            (ticks.possible_readers, ticks.delivered_count, ticks.read_count),
            (2, 2, 1)
        );
        assert!(ticks.delivered_to_all() && !ticks.read_by_all(), "grey, not blue");
        let ticks = g.ticks(Seq(3), &a);
        assert_eq!(
            (ticks.possible_readers, ticks.delivered_count, ticks.read_count),
            (3, 2, 1)
        );
        assert!(!ticks.delivered_to_all());
        assert_eq!(g.delivered_count(Seq(3), &a), 2, "B and D");
        let (page, next) = g.reached_page(Reached::Delivered, Seq(3), &a, None, 10);
        assert_eq!(page, [b, user("D")]);
        assert_eq!(next, None);
        let ticks = g.ticks(Seq(1), &a);
        assert!(ticks.delivered_to_all() && ticks.read_by_all());
        let alone = ConversationView {
            latest_seq: Seq(1),
            members: [(a.clone(), g.members[&a])].into_iter().collect(),
        };
        let ticks = alone.ticks(Seq(1), &a);
        assert!(
            !ticks.delivered_to_all() && !ticks.read_by_all(),
            "no reader: no ticks"
        );
    }

    #[test]
    fn possible_readers_exclude_the_sender_and_late_joiners() {
        let g = group();
        let a = user("A");
        assert_eq!(g.possible_readers(Seq(2), &a), 2, "B and C; D joined at 3");
        assert_eq!(g.possible_readers(Seq(3), &a), 3, "B, C and D");
        assert_eq!(g.possible_readers(Seq(3), &user("D")), 3, "A, B and C");
    }

    #[test]
    fn the_sender_is_never_a_reader_of_their_own_message() {
        let g = group();
        assert_eq!(g.read_count(Seq(1), &user("B")), 2, "A and C, not B");
    }

    #[test]
    fn unread_clamps_and_counts_non_members_from_zero() {
        let mut g = group();
        assert_eq!(g.unread(&user("B")), 2);
        assert_eq!(g.unread(&user("D")), 0);
        assert_eq!(g.unread(&user("stranger")), 3);
        g.latest_seq = Seq(1); // lagging latest_seq
        assert_eq!(g.unread(&user("C")), 0);
    }

    #[test]
    fn own_unread_takes_the_private_cursor_and_the_mark() {
        let own = |cursor, private_cursor, mark_seq: Option<u64>| OwnCursor {
            cursor: Seq(cursor),
            private_cursor: Seq(private_cursor),
            mark_seq: mark_seq.map(Seq),
            ..OwnCursor::default()
        };
        assert_eq!(own(2, 0, None).unread(Seq(5)), 3);
        assert_eq!(
            own(2, 5, None).unread(Seq(5)),
            0,
            "a private read counts for oneself"
        );
        assert_eq!(own(5, 0, Some(5)).unread(Seq(5)), 1, "marked: at least 1");
        assert_eq!(
            own(2, 0, Some(2)).unread(Seq(5)),
            3,
            "marked, and more unread than 1"
        );
        assert!(
            !own(6, 0, Some(5)).marked_unread(),
            "reading past the mark clears it"
        );
        assert!(!own(0, 6, Some(5)).marked_unread(), "privately too");
        assert_eq!(own(6, 0, Some(5)).unread(Seq(6)), 0);
    }

    #[test]
    fn who_read_pages_cover_every_reader_once() {
        let m = MemberCursor {
            cursor: Seq(10),
            delivered: Seq(10),
            join_seq: Seq(1),
        };
        let view = ConversationView {
            latest_seq: Seq(10),
            members: (0..25).map(|i| (user(&format!("u{i:02}")), m)).collect(),
        };
        let sender = user("u00");
        let mut after = None;
        let mut all = Vec::new();
        loop {
            let (page, next) = view.readers_page(Seq(5), &sender, after.as_ref(), 10);
            assert!(page.len() <= 10);
            all.extend(page);
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(all.len(), 24);
        assert_eq!(all.first().unwrap().as_str(), "u01");
        let (last, next) = view.readers_page(Seq(5), &sender, Some(&user("u20")), 10);
        assert_eq!(last.len(), 4);
        assert_eq!(next, None);
    }
}
