//! Compact member storage: 32 bytes per (conversation, user) cursor.
//!
//! A partition holds millions of members, most of whom only ever have a
//! cursor, a join_seq and two times. A hash map of [`Member`] per
//! conversation would cost about 175 bytes each (a 16-byte id and a 104-byte
//! value per entry, the map's spare room, and an id allocation per member).
//! Here:
//! - each user id is kept once per partition ([`UserTable`]); members refer
//!   to it by a `u32` index;
//! - a member is one 32-byte [`Slot`]: 32-bit cursors and join_seq, 48-bit
//!   times. What few members have (a private cursor, an unread mark, a
//!   leave, an epoch past 2^25, a seq past 2^32, a time past 4,000 years
//!   from 1970) lives in an [`Extra`] of the partition's [`Extras`], which
//!   the slot names by a 4-byte handle in place of its join_seq (a boxed
//!   extra would cost a slot 8 bytes of pointer whether it had one or not);
//! - a conversation of one or two members holds their slots inline
//!   ([`Members::Inline`]): most conversations are 1:1 chats, and a
//!   separate array would cost them an allocation and a pointer each;
//! - a bigger conversation's members are one vector, sorted by user index
//!   but for a short unsorted tail, grown a little at a time; a big
//!   conversation also keeps its sorted users densely (4 bytes a member),
//!   so that a lookup misses the cache once rather than at every step;
//! - whether a member changed since the last flush is two bits of its slot,
//!   so that marking one costs no hashing of ids.
//!
//! The fold works on unpacked [`Member`] values and packs them back, so the
//! rules in `mod.rs` never see this layout.

use super::dense::DenseMap;
use super::{Member, MembershipVersion, Outputs, UnreadMark};
use crate::domain::{Seq, UserId};
use crate::read_model::Mute;

/// The user ids of one partition's state, each kept once and numbered.
#[derive(Clone, Debug, Default)]
pub(crate) struct UserTable {
    ids: DenseMap<UserId, ()>,
}

impl UserTable {
    pub(crate) fn find(&self, user: &UserId) -> Option<u32> {
        self.ids.find(user)
    }

    /// The user's index, added if new.
    pub(crate) fn intern(&mut self, user: &UserId) -> u32 {
        self.ids.find_or_insert_with(user, || ()).0
    }

    pub(crate) fn id(&self, index: u32) -> &UserId {
        self.ids.key(index)
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.ids.shrink_to_fit();
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
/// The member has an [`Extra`]; the slot's `join_seq_or_extra` is its handle.
const HAS_EXTRA: u32 = 1 << 5;
/// The cursor or the times live in the [`Extra`], not in the slot.
const WIDE: u32 = 1 << 6;
const EPOCH_SHIFT: u32 = 7;
/// Epochs up to this fit in the slot; a larger one goes to [`Extra`].
const EPOCH_INLINE_MAX: u64 = (u32::MAX >> EPOCH_SHIFT) as u64;

/// Times (milliseconds) are kept in 48 bits, two's complement: about 4,000
/// years either side of 1970. The least of them stands for `i64::MIN`, the
/// time restores give to "older than anything", so that it fits too.
const TIME_MASK: u64 = (1 << 48) - 1;
const TIME_PACKED_MIN: i64 = -(1 << 47);

fn pack_time(at: i64) -> Option<u64> {
    let at = match at {
        i64::MIN => TIME_PACKED_MIN,
        at if at > TIME_PACKED_MIN && at < -TIME_PACKED_MIN => at,
        _ => return None,
    };
    Some(at as u64 & TIME_MASK)
}

fn unpack_time(packed: u64) -> i64 {
    // Sign-extend from bit 47.
    match ((packed << 16) as i64) >> 16 {
        TIME_PACKED_MIN => i64::MIN,
        at => at,
    }
}

/// One member, packed. Four-byte fields only, so that two fit a 1:1 chat's
/// entry in 64 bytes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slot {
    /// The cursor, unless [`WIDE`] and [`Extra::cursor`] holds it.
    cursor: u32,
    /// The delivered cursor, unless [`WIDE`] and [`Extra::delivered`]
    /// holds it; never below the cursor.
    delivered: u32,
    /// The join_seq; with [`HAS_EXTRA`], the handle of the member's
    /// [`Extra`], which then holds the join_seq.
    join_seq_or_extra: u32,
    user: u32,
    /// Flags and dirty bits in the low bits, the epoch above them.
    bits: u32,
    /// `updated_at` and the membership version's time: the low 32 bits of
    /// each, then the high 16 bits of each (updated_at's in the low half).
    /// The membership's seq is `join_seq - 1` (a join) unless
    /// [`Extra::membership_seq`] says otherwise (a leave).
    updated_at_low: u32,
    membership_at_low: u32,
    times_high: u32,
}

/// What most members do not have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Extra {
    /// The join_seq, whose place in the slot names this extra.
    join_seq: Seq,
    private_cursor: Seq,
    mark: Option<UnreadMark>,
    /// Unread mentions; some may be read already (a read in place does not
    /// come here), and loading leaves those out.
    mentions: Option<Box<[Seq]>>,
    mute: Option<Mute>,
    /// The membership version's seq, when it is not `join_seq - 1`.
    membership_seq: Option<Seq>,
    /// The epoch, when it does not fit in the slot.
    epoch: Option<u64>,
    /// The cursor, when it does not fit in the slot.
    cursor: Option<Seq>,
    /// The delivered cursor, when it does not fit in the slot.
    delivered: Option<Seq>,
    /// `updated_at` and the membership's time, when either does not fit.
    times: Option<(i64, i64)>,
}

/// The [`Extra`]s of one partition's members, by handle. A handle freed is
/// reused by the next member that needs one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Extras {
    /// `None`: free, so that a handle used after its release, or released
    /// twice, panics rather than giving two members one extra.
    extras: Vec<Option<Extra>>,
    free: Vec<u32>,
}

impl Extras {
    fn put(&mut self, extra: Extra) -> u32 {
        if let Some(handle) = self.free.pop() {
            self.extras[handle as usize] = Some(extra);
            return handle;
        }
        let handle = u32::try_from(self.extras.len()).expect("fewer than 2^32 extras in one partition");
        self.extras.push(Some(extra));
        handle
    }

    fn get(&self, handle: u32) -> &Extra {
        self.extras[handle as usize].as_ref().expect("a live extra")
    }

    fn set(&mut self, handle: u32, extra: Extra) {
        let live = self.extras[handle as usize].as_mut().expect("a live extra");
        *live = extra;
    }

    fn release(&mut self, handle: u32) {
        self.extras[handle as usize]
            .take()
            .expect("an extra released once");
        self.free.push(handle);
    }

    /// Extras held (for tests: none may leak).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.extras.len() - self.free.len()
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.extras.shrink_to_fit();
        self.free.shrink_to_fit();
    }
}

impl Slot {
    pub(crate) fn new(extras: &mut Extras, user: u32, member: &Member) -> Slot {
        let mut slot = Slot {
            user,
            ..Slot::default()
        };
        slot.store(extras, member);
        slot
    }

    pub(crate) fn user(&self) -> u32 {
        self.user
    }

    /// Whether the member's public record is an upsert, not a tombstone or
    /// none: listed and present.
    fn is_published(&self) -> bool {
        self.bits & LISTED != 0 && self.bits & LEFT == 0
    }

    fn extra<'a>(&self, extras: &'a Extras) -> Option<&'a Extra> {
        (self.bits & HAS_EXTRA != 0).then(|| extras.get(self.join_seq_or_extra))
    }

    fn updated_at(&self) -> i64 {
        unpack_time(u64::from(self.updated_at_low) | u64::from(self.times_high & 0xffff) << 32)
    }

    fn membership_at(&self) -> i64 {
        unpack_time(u64::from(self.membership_at_low) | u64::from(self.times_high >> 16) << 32)
    }

    fn set_updated_at(&mut self, packed: u64) {
        self.updated_at_low = packed as u32;
        self.times_high = (self.times_high & 0xffff_0000) | (packed >> 32) as u32;
    }

    fn set_membership_at(&mut self, packed: u64) {
        self.membership_at_low = packed as u32;
        self.times_high = (self.times_high & 0xffff) | ((packed >> 32) as u32) << 16;
    }

    pub(crate) fn load(&self, extras: &Extras) -> Member {
        let extra = self.extra(extras);
        let cursor = extra.and_then(|e| e.cursor).unwrap_or(Seq(self.cursor.into()));
        let delivered = extra
            .and_then(|e| e.delivered)
            .unwrap_or(Seq(self.delivered.into()));
        let join_seq = extra.map_or(Seq(self.join_seq_or_extra.into()), |e| e.join_seq);
        let (updated_at, membership_at) = extra
            .and_then(|e| e.times)
            .unwrap_or_else(|| (self.updated_at(), self.membership_at()));
        let membership = (self.bits & HAS_MEMBERSHIP != 0).then(|| MembershipVersion {
            seq: extra
                .and_then(|e| e.membership_seq)
                .unwrap_or(Seq(join_seq.get().wrapping_sub(1))),
            at: membership_at,
        });
        let private_cursor = extra.map_or(Seq::ZERO, |e| e.private_cursor);
        let read = cursor.max(private_cursor);
        Member {
            cursor,
            delivered,
            private_cursor,
            mentions: extra
                .and_then(|e| e.mentions.as_deref())
                .map_or_else(Vec::new, |m| m.iter().copied().filter(|&s| s > read).collect()),
            mute: extra.and_then(|e| e.mute),
            join_seq,
            left: self.bits & LEFT != 0,
            listed: self.bits & LISTED != 0,
            membership,
            epoch: extra
                .and_then(|e| e.epoch)
                .unwrap_or((self.bits >> EPOCH_SHIFT) as u64),
            mark: extra.and_then(|e| e.mark),
            updated_at,
        }
    }

    /// A public read by a listed member, in place, when the cursor and the
    /// times live in the slot and `seq` and `at` fit there: most reports,
    /// which then need not unpack the whole member.
    /// Returns whether the cursor moved, or `None` when the caller must go
    /// through [`Slot::load`].
    pub(crate) fn advance_in_place(&mut self, seq: Seq, at: i64) -> Option<bool> {
        if self.bits & LISTED == 0 || self.bits & WIDE != 0 {
            return None;
        }
        let seq = u32::try_from(seq.get()).ok()?;
        if at > self.updated_at() {
            self.set_updated_at(pack_time(at)?);
        }
        let moved = seq > self.cursor;
        if moved {
            self.cursor = seq;
            self.delivered = self.delivered.max(seq);
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

    /// Replaces the slot's member, keeping its extra's handle when it still
    /// needs one, and what changed since the last flush.
    pub(crate) fn store(&mut self, extras: &mut Extras, m: &Member) {
        let wide_epoch = m.epoch > EPOCH_INLINE_MAX;
        let membership_seq = m
            .membership
            .map(|v| v.seq)
            .filter(|&seq| seq.get().checked_add(1) != Some(m.join_seq.get()));
        let cursor = u32::try_from(m.cursor.get()).ok();
        // Reading implies delivery.
        let delivered_seq = m.delivered.max(m.cursor);
        let delivered = u32::try_from(delivered_seq.get()).ok();
        let join_seq = u32::try_from(m.join_seq.get()).ok();
        let membership_at = m.membership.map_or(0, |v| v.at);
        let times = pack_time(m.updated_at).zip(pack_time(membership_at));
        let read = m.cursor.max(m.private_cursor);
        let unread_mentions = m.mentions.iter().any(|&s| s > read);
        // Most members need no extra: say so without building one.
        let plain = m.private_cursor == Seq::ZERO
            && m.mark.is_none()
            && !unread_mentions
            && m.mute.is_none()
            && membership_seq.is_none()
            && !wide_epoch
            && cursor.is_some()
            && delivered.is_some()
            && join_seq.is_some()
            && times.is_some();
        let had_extra = self.bits & HAS_EXTRA != 0;
        if plain {
            if had_extra {
                extras.release(self.join_seq_or_extra);
            }
            self.join_seq_or_extra = join_seq.unwrap_or_default();
        } else {
            let extra = Extra {
                join_seq: m.join_seq,
                private_cursor: m.private_cursor,
                mark: m.mark,
                mentions: unread_mentions.then(|| m.mentions.iter().copied().filter(|&s| s > read).collect()),
                mute: m.mute,
                membership_seq,
                epoch: wide_epoch.then_some(m.epoch),
                cursor: cursor.is_none().then_some(m.cursor),
                delivered: delivered.is_none().then_some(delivered_seq),
                times: times.is_none().then_some((m.updated_at, membership_at)),
            };
            if had_extra {
                extras.set(self.join_seq_or_extra, extra);
            } else {
                self.join_seq_or_extra = extras.put(extra);
            }
        }
        self.cursor = cursor.unwrap_or_default();
        self.delivered = delivered.unwrap_or_default();
        let (updated_at, membership_at) = times.unwrap_or_default();
        self.set_updated_at(updated_at);
        self.set_membership_at(membership_at);
        let epoch = if wide_epoch { 0 } else { m.epoch as u32 };
        let flag = |on: bool, bit: u32| if on { bit } else { 0 };
        self.bits = (epoch << EPOCH_SHIFT)
            | (self.bits & DIRTY)
            | flag(m.listed, LISTED)
            | flag(m.left, LEFT)
            | flag(m.membership.is_some(), HAS_MEMBERSHIP)
            | flag(!plain, HAS_EXTRA)
            | flag(cursor.is_none() || delivered.is_none() || times.is_none(), WIDE);
    }

    /// Gives back the slot's extra, if any, for a slot dropped.
    pub(crate) fn release(&self, extras: &mut Extras) {
        if self.bits & HAS_EXTRA != 0 {
            extras.release(self.join_seq_or_extra);
        }
    }
}

/// Members a conversation holds in place, without an array of its own.
const INLINE: usize = 2;

/// Unsorted slots at the end of [`Heap::slots`] before they are merged in: a
/// lookup scans at most this many.
const UNSORTED_TAIL: usize = 16;

/// One conversation's members.
#[derive(Clone, Debug)]
pub(crate) enum Members {
    /// Up to [`INLINE`] members, in `slots[..len]`, in any order.
    Inline {
        len: u8,
        /// Whether any slot is dirty.
        dirty: bool,
        slots: [Slot; INLINE],
    },
    /// More, in an array of their own.
    Heap(Box<Heap>),
}

/// The members of a conversation of more than [`INLINE`]: sorted by user
/// index, but for an unsorted tail of at most [`UNSORTED_TAIL`], so that
/// members arriving in any order (a restore) cost no quadratic shifting.
#[derive(Clone, Debug, Default)]
pub(crate) struct Heap {
    slots: Vec<Slot>,
    /// In a big conversation, the users of the sorted run, densely: a
    /// lookup binary-searches these 16 to a cache line, then touches one
    /// slot. Searching the slots themselves would miss the cache at each
    /// of the last steps.
    index: Option<Vec<u32>>,
    /// Length of the sorted run.
    sorted: u32,
    /// Whether any slot is dirty.
    dirty: bool,
}

/// Sorted slots from which a conversation keeps [`Heap::index`] (4 bytes
/// more per member).
const INDEXED_FROM: usize = 64;

impl Default for Members {
    fn default() -> Self {
        Members::Inline {
            len: 0,
            dirty: false,
            slots: [Slot::default(); INLINE],
        }
    }
}

impl Members {
    /// From slots in any order; of a user's several slots, the last wins
    /// (as repeated inserts into a map would), and the others' extras are
    /// given back.
    pub(crate) fn from_slots(mut slots: Vec<Slot>, extras: &mut Extras) -> Members {
        slots.reverse();
        // Stable: a user's last slot is now first among theirs, and kept.
        slots.sort_by_key(Slot::user);
        slots.dedup_by(|later, kept| {
            let repeated = later.user == kept.user;
            if repeated {
                later.release(extras);
            }
            repeated
        });
        if slots.len() <= INLINE {
            let mut members = Members::default();
            for slot in slots {
                members.insert(slot);
            }
            return members;
        }
        slots.shrink_to_fit();
        let mut heap = Heap {
            sorted: sorted_len(&slots),
            slots,
            index: None,
            dirty: false,
        };
        heap.build_index();
        Members::Heap(Box::new(heap))
    }

    fn slots(&self) -> &[Slot] {
        match self {
            Members::Inline { len, slots, .. } => &slots[..*len as usize],
            Members::Heap(heap) => &heap.slots,
        }
    }

    fn slots_mut(&mut self) -> &mut [Slot] {
        match self {
            Members::Inline { len, slots, .. } => &mut slots[..*len as usize],
            Members::Heap(heap) => &mut heap.slots,
        }
    }

    fn dirty_flag(&mut self) -> &mut bool {
        match self {
            Members::Inline { dirty, .. } => dirty,
            Members::Heap(heap) => &mut heap.dirty,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots().len()
    }

    pub(crate) fn position(&self, user: u32) -> Option<usize> {
        match self {
            Members::Inline { len, slots, .. } => slots[..*len as usize].iter().position(|s| s.user == user),
            Members::Heap(heap) => heap.position(user),
        }
    }

    pub(crate) fn get(&self, user: u32) -> Option<&Slot> {
        self.position(user).map(|i| &self.slots()[i])
    }

    pub(crate) fn slot_mut(&mut self, index: usize) -> &mut Slot {
        &mut self.slots_mut()[index]
    }

    /// Adds a slot for a user not held yet; returns its position.
    pub(crate) fn insert(&mut self, slot: Slot) -> usize {
        match self {
            Members::Inline { len, dirty, slots } => {
                let n = *len as usize;
                if n < INLINE {
                    slots[n] = slot;
                    *len += 1;
                    return n;
                }
                // A third member: the conversation gets an array, with room
                // for one more (see `Heap::insert` on growth).
                let mut array = Vec::with_capacity(INLINE + 2);
                array.extend_from_slice(slots);
                array.push(slot);
                *self = Members::Heap(Box::new(Heap {
                    slots: array,
                    index: None,
                    sorted: 0,
                    dirty: *dirty,
                }));
                INLINE
            }
            Members::Heap(heap) => heap.insert(slot),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots().iter()
    }

    /// The positions and users of the members with a public record that
    /// is not a tombstone: listed and present.
    pub(crate) fn published(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.slots()
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.is_published())
            .map(|(position, slot)| (position, slot.user()))
    }

    /// Whether the member at `position` has a public record that is not a
    /// tombstone.
    pub(crate) fn published_at(&self, position: usize) -> bool {
        self.slots()[position].is_published()
    }

    /// Adds `outputs` to what changed of the slot at `position`. Returns
    /// whether the slot was clean (one more dirty member) and whether the
    /// conversation was (one more dirty conversation).
    pub(crate) fn mark_dirty(&mut self, position: usize, outputs: Outputs) -> (bool, bool) {
        let slot_was_clean = self.slots_mut()[position].mark_dirty(outputs);
        let was_clean = slot_was_clean && !std::mem::replace(self.dirty_flag(), true);
        (slot_was_clean, was_clean)
    }

    pub(crate) fn is_dirty(&self) -> bool {
        match self {
            Members::Inline { dirty, .. } => *dirty,
            Members::Heap(heap) => heap.dirty,
        }
    }

    /// The slots changed since the last flush.
    pub(crate) fn dirty_slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots().iter().filter(|slot| slot.bits & DIRTY != 0)
    }

    /// Forgets what changed, after a flush; returns how many slots were dirty.
    pub(crate) fn clear_dirty(&mut self) -> usize {
        if !std::mem::replace(self.dirty_flag(), false) {
            return 0;
        }
        let mut cleared = 0;
        for slot in self.slots_mut() {
            if slot.bits & DIRTY != 0 {
                slot.bits &= !DIRTY;
                cleared += 1;
            }
        }
        cleared
    }

    /// Gives back every member's extra, for a conversation being replaced.
    pub(crate) fn release(&self, extras: &mut Extras) {
        for slot in self.slots() {
            slot.release(extras);
        }
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        if let Members::Heap(heap) = self {
            heap.slots.shrink_to_fit();
            if let Some(index) = heap.index.as_mut() {
                index.shrink_to_fit();
            }
        }
    }
}

impl Heap {
    /// Rebuilds [`Heap::index`] after the sorted run changed.
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

    fn position(&self, user: u32) -> Option<usize> {
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

    fn insert(&mut self, slot: Slot) -> usize {
        let user = slot.user;
        if self.slots.len() == self.slots.capacity() {
            // A little at a time: doubling would leave a third of a big
            // group's room unused.
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
    /// moved at most once, and nothing is allocated (a stable sort takes a
    /// scratch buffer of half the slots, fresh memory for a big group). The
    /// index, if any, takes the same moves rather than being rebuilt from
    /// every slot.
    fn merge_tail(&mut self) {
        let mut run_end = self.sorted as usize;
        self.slots[run_end..].sort_unstable_by_key(Slot::user);
        let mut index = self.index.take();
        if let Some(index) = index.as_mut() {
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
            if let Some(index) = index.as_mut() {
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
        m.delivered = Seq(cursor);
        m
    }

    #[test]
    fn a_slot_is_32_bytes_and_a_1_1_chat_72() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
        assert_eq!(std::mem::size_of::<Members>(), 72);
    }

    #[test]
    fn times_pack_in_48_bits_or_not_at_all() {
        let fits = [
            0,
            1,
            -1,
            1_700_000_000_000,
            i64::MIN,
            -(1 << 47) + 1,
            (1 << 47) - 1,
        ];
        for at in fits {
            let packed = pack_time(at).unwrap();
            assert_eq!(packed & !TIME_MASK, 0);
            assert_eq!(unpack_time(packed), at, "{at}");
        }
        for at in [-(1 << 47), 1 << 47, i64::MAX, i64::MIN + 1] {
            assert_eq!(pack_time(at), None, "{at}");
        }
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
            Some(MembershipVersion {
                seq: Seq(6),
                at: i64::MAX,
            }),
        ];
        // Seqs in the slot, and past 32 bits (in the extra).
        let wide = u64::from(u32::MAX);
        let seqs = [
            (10, 7),
            (wide, 1),
            (wide + 1, 7),
            (10, wide + 1),
            (u64::MAX, u64::MAX),
        ];
        let mut extras = Extras::default();
        let mut slot = Slot::new(&mut extras, 7, &member(0));
        for mark in marks {
            for membership in memberships {
                for epoch in [0, 1, EPOCH_INLINE_MAX, EPOCH_INLINE_MAX + 1, u64::MAX] {
                    for (left, listed) in [(false, false), (true, true), (false, true)] {
                        for updated_at in [-3, i64::MIN, i64::MAX, 1 << 47] {
                            for (private_cursor, (cursor, join_seq)) in [Seq::ZERO, Seq(11)]
                                .into_iter()
                                .flat_map(|p| seqs.map(|s| (p, s)))
                            {
                                let deliveries = [cursor, cursor.saturating_add(3), (wide + 2).max(cursor)];
                                for (k, delivered) in deliveries.into_iter().enumerate() {
                                    // Mentions are kept above what was read.
                                    let read = cursor.max(private_cursor.get());
                                    let mentions = match read.checked_add(2) {
                                        Some(_) if k > 0 => vec![Seq(read + 1), Seq(read + 2)],
                                        _ => Vec::new(),
                                    };
                                    let mutes = [
                                        None,
                                        Some(Mute {
                                            at: 3,
                                            until: Mute::FOREVER,
                                        }),
                                        Some(Mute {
                                            at: -1,
                                            until: Mute::OFF,
                                        }),
                                    ];
                                    let m = Member {
                                        cursor: Seq(cursor),
                                        delivered: Seq(delivered),
                                        mentions,
                                        mute: mutes[k],
                                        private_cursor,
                                        join_seq: Seq(join_seq),
                                        left,
                                        listed,
                                        membership,
                                        epoch,
                                        mark,
                                        updated_at,
                                    };
                                    // Stored over whatever the slot held before.
                                    slot.store(&mut extras, &m);
                                    assert_eq!(slot.load(&extras), m);
                                    let fresh = Slot::new(&mut extras, 7, &m);
                                    assert_eq!(fresh.load(&extras), m);
                                    fresh.release(&mut extras);
                                }
                            }
                        }
                    }
                }
            }
        }
        // Only the reused slot's extra, if it still needs one, is held.
        assert!(extras.len() <= 1);
        slot.store(&mut extras, &member(1));
        assert_eq!(extras.len(), 0, "a plain member gives its extra back");
    }

    #[test]
    fn a_plain_member_needs_no_extra() {
        let mut extras = Extras::default();
        let mut m = member(3);
        m.listed = true;
        m.join_seq = Seq(5);
        m.epoch = 1;
        m.membership = Some(MembershipVersion { seq: Seq(4), at: 8 });
        Slot::new(&mut extras, 0, &m);
        assert_eq!(extras.len(), 0, "a join's version is join_seq - 1");
        m.membership = Some(MembershipVersion {
            seq: Seq(4),
            at: i64::MIN,
        });
        Slot::new(&mut extras, 0, &m);
        assert_eq!(extras.len(), 0, "a restore's oldest time fits the slot");
        m.left = true;
        m.membership = Some(MembershipVersion { seq: Seq(9), at: 8 });
        Slot::new(&mut extras, 0, &m);
        assert_eq!(extras.len(), 1, "a leave's version is kept");
    }

    #[test]
    fn a_read_in_place_falls_back_when_it_does_not_fit() {
        let mut extras = Extras::default();
        let mut m = member(3);
        m.listed = true;
        let mut slot = Slot::new(&mut extras, 0, &m);
        assert_eq!(slot.advance_in_place(Seq(4), 10), Some(true));
        assert_eq!(slot.advance_in_place(Seq(2), 5), Some(false));
        let loaded = slot.load(&extras);
        assert_eq!((loaded.cursor, loaded.updated_at), (Seq(4), 10));
        assert_eq!(slot.advance_in_place(Seq(1 << 32), 11), None);
        assert_eq!(slot.advance_in_place(Seq(5), i64::MAX), None);
        m.updated_at = i64::MAX;
        slot.store(&mut extras, &m);
        assert_eq!(slot.advance_in_place(Seq(5), 1), None, "times in the extra");
        m.listed = false;
        m.updated_at = 0;
        slot.store(&mut extras, &m);
        assert_eq!(slot.advance_in_place(Seq(5), 1), None, "not listed");
    }

    fn heap(members: &Members) -> &Heap {
        match members {
            Members::Heap(heap) => heap,
            Members::Inline { .. } => panic!("inline"),
        }
    }

    #[test]
    fn members_are_found_in_any_insertion_order() {
        let mut extras = Extras::default();
        let mut members = Members::default();
        // Descending, so that every merge of the tail moves everything.
        let users: Vec<u32> = (0..200).rev().collect();
        for (n, &u) in users.iter().enumerate() {
            assert!(members.get(u).is_none());
            let at = members.insert(Slot::new(&mut extras, u, &member(u as u64)));
            assert_eq!(members.slots()[at].user, u);
            assert_eq!(members.len(), n + 1);
            assert_eq!(matches!(members, Members::Inline { .. }), n < INLINE);
            for &seen in &users[..=n] {
                assert_eq!(members.get(seen).unwrap().load(&extras).cursor, Seq(seen as u64));
            }
        }
        let rebuilt = Members::from_slots(members.iter().cloned().collect(), &mut extras);
        for &u in &users {
            assert_eq!(rebuilt.get(u).unwrap().load(&extras).cursor, Seq(u as u64));
        }
        assert!(rebuilt.get(200).is_none());
        let repeated = Members::from_slots(
            vec![
                Slot::new(&mut extras, 1, &member(1)),
                Slot::new(&mut extras, 1, &member(2)),
            ],
            &mut extras,
        );
        assert_eq!(repeated.len(), 1);
        assert!(matches!(repeated, Members::Inline { .. }));
        assert_eq!(
            repeated.get(1).unwrap().load(&extras).cursor,
            Seq(2),
            "the last slot wins"
        );
    }

    #[test]
    fn a_repeated_member_gives_its_extra_back() {
        let mut extras = Extras::default();
        let mut private = member(1);
        private.private_cursor = Seq(3);
        let slots = vec![
            Slot::new(&mut extras, 1, &private),
            Slot::new(&mut extras, 2, &private),
            Slot::new(&mut extras, 1, &member(2)),
        ];
        assert_eq!(extras.len(), 2);
        let members = Members::from_slots(slots, &mut extras);
        assert_eq!(extras.len(), 1, "user 1's first slot was dropped");
        assert_eq!(members.get(2).unwrap().load(&extras), private);
        members.release(&mut extras);
        assert_eq!(extras.len(), 0);
    }

    #[test]
    fn dirty_marks_survive_the_move_out_of_line() {
        let mut extras = Extras::default();
        let mut members = Members::default();
        for u in 0..2 {
            members.insert(Slot::new(&mut extras, u, &member(0)));
        }
        assert_eq!(members.mark_dirty(1, Outputs::PUBLIC), (true, true));
        assert_eq!(members.mark_dirty(0, Outputs::STATE), (true, false));
        members.insert(Slot::new(&mut extras, 2, &member(0)));
        assert!(members.is_dirty());
        let dirty: Vec<u32> = members.dirty_slots().map(Slot::user).collect();
        assert_eq!(dirty, [0, 1]);
        assert_eq!(members.clear_dirty(), 2);
        assert!(!members.is_dirty());
    }

    #[test]
    fn a_big_conversation_is_searched_through_its_index() {
        // Even users only, in a scattered order, so that lookups fall
        // between, before and after indexed users and into the unsorted tail.
        let mut extras = Extras::default();
        let users: Vec<u32> = (0..1000u32).map(|i| (i * 7919 % 1000) * 2).collect();
        let mut members = Members::default();
        for &u in &users {
            members.insert(Slot::new(&mut extras, u, &member(u.into())));
        }
        let h = heap(&members);
        assert!(h.index.is_some());
        assert!(h.slots.len() > h.sorted as usize, "some are in the tail");
        let run = &h.slots[..h.sorted as usize];
        assert!(run.windows(2).all(|w| w[0].user < w[1].user), "the run is sorted");
        let users: Vec<u32> = run.iter().map(Slot::user).collect();
        assert_eq!(h.index.as_ref(), Some(&users), "the index is the run's users");
        for probe in 0..2100u32 {
            let found = members.get(probe).map(|slot| slot.user());
            let expected = (probe % 2 == 0 && probe < 2000).then_some(probe);
            assert_eq!(found, expected, "user {probe}");
        }
        let small = Members::from_slots(
            (0..INDEXED_FROM as u32 - 1)
                .map(|u| Slot::new(&mut extras, u, &member(0)))
                .collect(),
            &mut extras,
        );
        assert!(heap(&small).index.is_none());
        let rebuilt = Members::from_slots(members.iter().cloned().collect(), &mut extras);
        assert_eq!(heap(&rebuilt).index.as_ref().map(|i| i.len()), Some(1000));
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
