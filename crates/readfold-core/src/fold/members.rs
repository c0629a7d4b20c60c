//! Compact member storage: 40 bytes per (conversation, user) cursor.
//!
//! A partition holds millions of members, most of whom only ever have a
//! cursor, a join_seq and a time. A hash map of [`Member`] per conversation
//! cost about 175 bytes each (a 16-byte id and a 104-byte value per entry,
//! the map's spare room, and an id allocation per member). Here:
//! - each user id is kept once per partition ([`UserTable`]); members refer
//!   to it by a `u32` index;
//! - a member is one 40-byte [`Slot`]; what few members have (a private
//!   cursor, an unread mark, a leave, an epoch past 2^27, a seq past 2^32)
//!   lives in a boxed [`Extra`], absent for the rest. (40 rather than 48
//!   bytes also puts a 100-member array in the allocator's 4 KiB class
//!   rather than its 5 KiB one);
//! - a conversation's members are one vector ([`Members`]), sorted by user
//!   index but for a short unsorted tail, grown a little at a time; a big
//!   conversation also keeps its sorted users densely (4 bytes a member),
//!   so that a lookup misses the cache once rather than at every step;
//! - whether a member changed since the last flush is two bits of its slot,
//!   so that marking one costs no hashing of ids (a map of changed keys was
//!   a quarter of the fold's time).
//!
//! The fold works on unpacked [`Member`] values and packs them back, so the
//! rules in `mod.rs` never see this layout.

use super::{IdMap, Member, MembershipVersion, Outputs, UnreadMark};
use crate::domain::{Seq, UserId};

/// The user ids of one partition's state, each kept once.
#[derive(Clone, Debug, Default)]
pub(crate) struct UserTable {
    ids: Vec<UserId>,
    index: IdMap<UserId, u32>,
}

impl UserTable {
    pub(crate) fn find(&self, user: &UserId) -> Option<u32> {
        self.index.get(user).copied()
    }

    /// The user's index, added if new.
    pub(crate) fn intern(&mut self, user: &UserId) -> u32 {
        if let Some(&i) = self.index.get(user) {
            return i;
        }
        let i = u32::try_from(self.ids.len()).expect("fewer than 2^32 users in one partition");
        self.ids.push(user.clone());
        self.index.insert(user.clone(), i);
        i
    }

    pub(crate) fn id(&self, index: u32) -> &UserId {
        &self.ids[index as usize]
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.ids.shrink_to_fit();
        self.index.shrink_to_fit();
    }
}

const LISTED: u32 = 1;
const LEFT: u32 = 1 << 1;
const HAS_MEMBERSHIP: u32 = 1 << 2;
/// Changed since the last flush, for the public outputs and for the state
/// outputs (see [`Outputs`]).
const DIRTY_PUBLIC: u32 = 1 << 3;
const DIRTY_STATE: u32 = 1 << 4;
const DIRTY: u32 = DIRTY_PUBLIC | DIRTY_STATE;
const EPOCH_SHIFT: u32 = 5;
/// Epochs up to this fit in the slot; a larger one goes to [`Extra`].
const EPOCH_INLINE_MAX: u64 = (u32::MAX >> EPOCH_SHIFT) as u64;

/// One member, packed.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    updated_at: i64,
    /// The membership version's time; its seq is `join_seq - 1` (a join)
    /// unless [`Extra::membership_seq`] says otherwise (a leave).
    membership_at: i64,
    extra: Option<Box<Extra>>,
    /// The cursor and join_seq, unless [`Extra::seqs`] holds them (when
    /// either does not fit in 32 bits).
    cursor: u32,
    join_seq: u32,
    user: u32,
    /// Flags and dirty bits in the low bits, the epoch above them.
    bits: u32,
}

/// What most members do not have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Extra {
    private_cursor: Seq,
    mark: Option<UnreadMark>,
    /// The membership version's seq, when it is not `join_seq - 1`.
    membership_seq: Option<Seq>,
    /// The epoch, when it does not fit in the slot.
    epoch: Option<u64>,
    /// The cursor and join_seq, when either does not fit in the slot.
    seqs: Option<(Seq, Seq)>,
}

impl Slot {
    pub(crate) fn new(user: u32, member: &Member) -> Slot {
        let mut slot = Slot {
            cursor: 0,
            join_seq: 0,
            updated_at: 0,
            membership_at: 0,
            extra: None,
            user,
            bits: 0,
        };
        slot.store(member);
        slot
    }

    pub(crate) fn user(&self) -> u32 {
        self.user
    }

    pub(crate) fn load(&self) -> Member {
        let extra = self.extra.as_deref();
        let (cursor, join_seq) = extra
            .and_then(|e| e.seqs)
            .unwrap_or((Seq(self.cursor.into()), Seq(self.join_seq.into())));
        let membership = (self.bits & HAS_MEMBERSHIP != 0).then(|| MembershipVersion {
            seq: extra
                .and_then(|e| e.membership_seq)
                .unwrap_or(Seq(join_seq.get().wrapping_sub(1))),
            at: self.membership_at,
        });
        Member {
            cursor,
            private_cursor: extra.map_or(Seq::ZERO, |e| e.private_cursor),
            join_seq,
            left: self.bits & LEFT != 0,
            listed: self.bits & LISTED != 0,
            membership,
            epoch: extra
                .and_then(|e| e.epoch)
                .unwrap_or((self.bits >> EPOCH_SHIFT) as u64),
            mark: extra.and_then(|e| e.mark),
            updated_at: self.updated_at,
        }
    }

    /// A public read by a listed member, in place, when the cursor lives in
    /// the slot and `seq` fits there: most reports, and unpacking the whole
    /// member for them cost a tenth of the fold. Returns whether the cursor
    /// moved, or `None` when the caller must go through [`Slot::load`].
    pub(crate) fn advance_in_place(&mut self, seq: Seq, at: i64) -> Option<bool> {
        if self.bits & LISTED == 0 || self.extra.as_ref().is_some_and(|e| e.seqs.is_some()) {
            return None;
        }
        let seq = u32::try_from(seq.get()).ok()?;
        self.updated_at = self.updated_at.max(at);
        let moved = seq > self.cursor;
        if moved {
            self.cursor = seq;
        }
        Some(moved)
    }

    /// What changed since the last flush.
    pub(crate) fn dirty(&self) -> Outputs {
        Outputs {
            public: self.bits & DIRTY_PUBLIC != 0,
            state: self.bits & DIRTY_STATE != 0,
        }
    }

    /// Adds `outputs` to what changed; returns whether the slot was clean
    /// and now is not.
    fn mark_dirty(&mut self, outputs: Outputs) -> bool {
        let was_clean = self.bits & DIRTY == 0;
        if outputs.public {
            self.bits |= DIRTY_PUBLIC;
        }
        if outputs.state {
            self.bits |= DIRTY_STATE;
        }
        was_clean && self.bits & DIRTY != 0
    }

    /// Replaces the slot's member, keeping its box when it still needs one,
    /// and what changed since the last flush.
    pub(crate) fn store(&mut self, m: &Member) {
        let wide_epoch = m.epoch > EPOCH_INLINE_MAX;
        let membership_seq = m
            .membership
            .map(|v| v.seq)
            .filter(|&seq| seq.get().checked_add(1) != Some(m.join_seq.get()));
        let narrow = u32::try_from(m.cursor.get())
            .ok()
            .zip(u32::try_from(m.join_seq.get()).ok());
        // Most members need no box: say so without building one.
        let plain = m.private_cursor == Seq::ZERO
            && m.mark.is_none()
            && membership_seq.is_none()
            && !wide_epoch
            && narrow.is_some();
        if plain {
            self.extra = None;
        } else {
            let extra = Extra {
                private_cursor: m.private_cursor,
                mark: m.mark,
                membership_seq,
                epoch: wide_epoch.then_some(m.epoch),
                seqs: narrow.is_none().then_some((m.cursor, m.join_seq)),
            };
            match self.extra.as_deref_mut() {
                Some(boxed) => *boxed = extra,
                None => self.extra = Some(Box::new(extra)),
            }
        }
        (self.cursor, self.join_seq) = narrow.unwrap_or_default();
        self.updated_at = m.updated_at;
        self.membership_at = m.membership.map_or(0, |v| v.at);
        let epoch = if wide_epoch { 0 } else { m.epoch as u32 };
        self.bits = (epoch << EPOCH_SHIFT)
            | (self.bits & DIRTY)
            | if m.listed { LISTED } else { 0 }
            | if m.left { LEFT } else { 0 }
            | if m.membership.is_some() { HAS_MEMBERSHIP } else { 0 };
    }
}

/// Unsorted slots at the end of [`Members`] before they are merged in: a
/// lookup scans at most this many.
const UNSORTED_TAIL: usize = 16;

/// One conversation's members: sorted by user index, but for an unsorted
/// tail of at most [`UNSORTED_TAIL`], so that members arriving in any order
/// (a restore) cost no quadratic shifting.
#[derive(Clone, Debug, Default)]
pub(crate) struct Members {
    slots: Vec<Slot>,
    /// In a big conversation, the users of the sorted run, densely: a
    /// lookup binary-searches these 16 to a cache line, then touches one
    /// slot. Searching the 40-byte slots themselves missed the cache at
    /// each of the last steps, and that was a quarter of a replay's fold.
    /// Boxed, so that the many small conversations pay one pointer for it
    /// (a `Vec` is three, a boxed slice two).
    #[allow(clippy::box_collection)]
    index: Option<Box<Vec<u32>>>,
    /// Length of the sorted run (a `u32` so that `dirty` fits beside it).
    sorted: u32,
    /// Whether any slot is dirty.
    dirty: bool,
}

/// Sorted slots from which a conversation keeps [`Members::index`] (4
/// bytes more per member).
const INDEXED_FROM: usize = 64;

impl Members {
    /// From slots in any order; of a user's several slots, the last wins
    /// (as repeated inserts into a map would).
    pub(crate) fn from_slots(mut slots: Vec<Slot>) -> Members {
        slots.reverse();
        // Stable: a user's last slot is now first among theirs, and kept.
        slots.sort_by_key(Slot::user);
        slots.dedup_by_key(|s| s.user());
        slots.shrink_to_fit();
        let mut members = Members {
            sorted: sorted_len(&slots),
            slots,
            index: None,
            dirty: false,
        };
        members.build_index();
        members
    }

    /// Rebuilds [`Members::index`] after the sorted run changed.
    fn build_index(&mut self) {
        let sorted = &self.slots[..self.sorted as usize];
        if sorted.len() < INDEXED_FROM {
            self.index = None;
            return;
        }
        let index = self.index.get_or_insert_default();
        index.clear();
        index.extend(sorted.iter().map(Slot::user));
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn position(&self, user: u32) -> Option<usize> {
        let sorted_len = self.sorted as usize;
        let (sorted, tail) = self.slots.split_at(sorted_len);
        let found = match self.index.as_deref() {
            Some(index) => index.binary_search(&user),
            None => sorted.binary_search_by_key(&user, Slot::user),
        };
        match found {
            Ok(i) => Some(i),
            Err(_) => tail.iter().position(|s| s.user == user).map(|i| sorted_len + i),
        }
    }

    pub(crate) fn get(&self, user: u32) -> Option<&Slot> {
        self.position(user).map(|i| &self.slots[i])
    }

    pub(crate) fn slot_mut(&mut self, index: usize) -> &mut Slot {
        &mut self.slots[index]
    }

    /// Adds a slot for a user not held yet; returns its position.
    pub(crate) fn insert(&mut self, slot: Slot) -> usize {
        let user = slot.user;
        if self.slots.len() == self.slots.capacity() {
            // A little at a time: most conversations stop at 2 members, and
            // doubling would leave a third of a big group's room unused.
            self.slots.reserve_exact((self.slots.len() / 8).max(1));
        }
        self.slots.push(slot);
        if self.slots.len() - self.sorted as usize <= UNSORTED_TAIL {
            return self.slots.len() - 1;
        }
        self.merge_tail();
        self.position(user).expect("just inserted")
    }

    /// Merges the unsorted tail into the sorted run in place: each slot is
    /// moved at most once, and nothing is allocated (a stable sort took a
    /// scratch buffer of half the slots, fresh memory for a big group). The
    /// index, if any, takes the same moves rather than being rebuilt from
    /// every slot.
    fn merge_tail(&mut self) {
        let mut run_end = self.sorted as usize;
        self.slots[run_end..].sort_unstable_by_key(Slot::user);
        let mut index = self.index.take();
        if let Some(index) = index.as_deref_mut() {
            index.extend(self.slots[run_end..].iter().map(Slot::user));
        }
        // From the tail's greatest user down: rotate it, and the smaller
        // tail slots before it, in front of the run's slots greater than
        // it, which are then in their final place. A user is held once, so
        // no tail user equals a run user.
        for k in (0..self.slots.len() - run_end).rev() {
            let user = self.slots[run_end + k].user;
            let at = match index.as_deref() {
                Some(index) => index[..run_end].partition_point(|&u| u < user),
                None => self.slots[..run_end].partition_point(|s| s.user < user),
            };
            self.slots[at..=run_end + k].rotate_right(k + 1);
            if let Some(index) = index.as_deref_mut() {
                index[at..=run_end + k].rotate_right(k + 1);
            }
            run_end = at;
        }
        self.sorted = sorted_len(&self.slots);
        self.index = index;
        if self.index.is_none() {
            self.build_index();
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter()
    }

    /// Adds `outputs` to what changed of the slot at `position`. Returns
    /// whether the slot was clean (one more dirty member) and whether the
    /// conversation was (one more dirty conversation).
    pub(crate) fn mark_dirty(&mut self, position: usize, outputs: Outputs) -> (bool, bool) {
        let slot_was_clean = self.slots[position].mark_dirty(outputs);
        let was_clean = slot_was_clean && !std::mem::replace(&mut self.dirty, true);
        (slot_was_clean, was_clean)
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The slots changed since the last flush.
    pub(crate) fn dirty_slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|slot| slot.bits & DIRTY != 0)
    }

    /// Forgets what changed, after a flush; returns how many slots were dirty.
    pub(crate) fn clear_dirty(&mut self) -> usize {
        if !std::mem::replace(&mut self.dirty, false) {
            return 0;
        }
        let mut cleared = 0;
        for slot in &mut self.slots {
            if slot.bits & DIRTY != 0 {
                slot.bits &= !DIRTY;
                cleared += 1;
            }
        }
        cleared
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.slots.shrink_to_fit();
        if let Some(index) = self.index.as_deref_mut() {
            index.shrink_to_fit();
        }
    }
}

fn sorted_len(slots: &[Slot]) -> u32 {
    u32::try_from(slots.len()).expect("fewer than 2^32 members in one conversation")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(cursor: u64) -> Member {
        let mut m = Member::new(5);
        m.cursor = Seq(cursor);
        m
    }

    #[test]
    fn a_slot_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 40);
    }

    #[test]
    fn every_member_comes_back_as_it_was_stored() {
        let marks = [
            None,
            Some(UnreadMark { at: 9, seq: None }),
            Some(UnreadMark {
                at: 3,
                seq: Some(Seq(4)),
            }),
        ];
        let memberships = [
            None,
            Some(MembershipVersion { seq: Seq(6), at: 1 }),
            Some(MembershipVersion { seq: Seq(2), at: -4 }),
            Some(MembershipVersion {
                seq: Seq(u64::MAX),
                at: i64::MIN,
            }),
        ];
        // Seqs in the slot, and past 32 bits (in the box).
        let wide = u64::from(u32::MAX);
        let seqs = [
            (10, 7),
            (wide, 1),
            (wide + 1, 7),
            (10, wide + 1),
            (u64::MAX, u64::MAX),
        ];
        let mut slot = Slot::new(7, &member(0));
        for mark in marks {
            for membership in memberships {
                for epoch in [0, 1, EPOCH_INLINE_MAX, EPOCH_INLINE_MAX + 1, u64::MAX] {
                    for (left, listed) in [(false, false), (true, true), (false, true)] {
                        for (private_cursor, (cursor, join_seq)) in [Seq::ZERO, Seq(11)]
                            .into_iter()
                            .flat_map(|p| seqs.map(|s| (p, s)))
                        {
                            let m = Member {
                                cursor: Seq(cursor),
                                private_cursor,
                                join_seq: Seq(join_seq),
                                left,
                                listed,
                                membership,
                                epoch,
                                mark,
                                updated_at: -3,
                            };
                            // Stored over whatever the slot held before.
                            slot.store(&m);
                            assert_eq!(slot.load(), m);
                            assert_eq!(Slot::new(7, &m).load(), m);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_plain_member_needs_no_box() {
        let mut m = member(3);
        m.listed = true;
        m.join_seq = Seq(5);
        m.epoch = 1;
        m.membership = Some(MembershipVersion { seq: Seq(4), at: 8 });
        assert!(
            Slot::new(0, &m).extra.is_none(),
            "a join's version is join_seq - 1"
        );
        m.left = true;
        m.membership = Some(MembershipVersion { seq: Seq(9), at: 8 });
        assert!(Slot::new(0, &m).extra.is_some(), "a leave's version is kept");
    }

    #[test]
    fn members_are_found_in_any_insertion_order() {
        let mut members = Members::default();
        // Descending, so that every merge of the tail moves everything.
        let users: Vec<u32> = (0..200).rev().collect();
        for (n, &u) in users.iter().enumerate() {
            assert!(members.get(u).is_none());
            let at = members.insert(Slot::new(u, &member(u as u64)));
            assert_eq!(members.slots[at].user, u);
            assert_eq!(members.len(), n + 1);
            for &seen in &users[..=n] {
                assert_eq!(members.get(seen).unwrap().load().cursor, Seq(seen as u64));
            }
        }
        let rebuilt = Members::from_slots(members.iter().cloned().collect());
        for &u in &users {
            assert_eq!(rebuilt.get(u).unwrap().load().cursor, Seq(u as u64));
        }
        assert!(rebuilt.get(200).is_none());
        let repeated = Members::from_slots(vec![Slot::new(1, &member(1)), Slot::new(1, &member(2))]);
        assert_eq!(repeated.len(), 1);
        assert_eq!(
            repeated.get(1).unwrap().load().cursor,
            Seq(2),
            "the last slot wins"
        );
    }

    #[test]
    fn a_big_conversation_is_searched_through_its_index() {
        // Even users only, in a scattered order, so that lookups fall
        // between, before and after indexed users and into the unsorted tail.
        let users: Vec<u32> = (0..1000u32).map(|i| (i * 7919 % 1000) * 2).collect();
        let mut members = Members::default();
        for &u in &users {
            members.insert(Slot::new(u, &member(u.into())));
        }
        assert!(members.index.is_some());
        assert!(members.len() > members.sorted as usize, "some are in the tail");
        let run = &members.slots[..members.sorted as usize];
        assert!(run.windows(2).all(|w| w[0].user < w[1].user), "the run is sorted");
        let users: Vec<u32> = run.iter().map(Slot::user).collect();
        assert_eq!(
            members.index.as_deref(),
            Some(&users),
            "the index is the run's users"
        );
        for probe in 0..2100u32 {
            let found = members.get(probe).map(|slot| slot.user());
            let expected = (probe % 2 == 0 && probe < 2000).then_some(probe);
            assert_eq!(found, expected, "user {probe}");
        }
        let small = Members::from_slots(
            (0..INDEXED_FROM as u32 - 1)
                .map(|u| Slot::new(u, &member(0)))
                .collect(),
        );
        assert!(small.index.is_none());
        let rebuilt = Members::from_slots(members.iter().cloned().collect());
        assert_eq!(rebuilt.index.as_ref().map(|i| i.len()), Some(1000));
        assert!((0..2000).all(|u| rebuilt.get(u).is_some() == (u % 2 == 0)));
    }

    #[test]
    fn users_are_interned_once() {
        let mut users = UserTable::default();
        let a: UserId = "a".parse().unwrap();
        let b: UserId = "b".parse().unwrap();
        assert_eq!(users.find(&a), None);
        assert_eq!(users.intern(&a), 0);
        assert_eq!(users.intern(&b), 1);
        assert_eq!(users.intern(&a), 0);
        assert_eq!(users.find(&b), Some(1));
        assert_eq!(users.id(1), &b);
    }
}
