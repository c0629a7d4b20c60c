//! The badge: one number per user for the app icon, and the totals behind
//! it, pure and I/O-free.
//!
//! The badge stage reads the by-user changelog, where each record is one
//! member's whole own view of one conversation (unread, mark, mentions,
//! mute), and keeps, per user, the last view of each of their
//! conversations and what each adds to the totals. A record replaces a
//! conversation's view (a tombstone removes it: the member left), so the
//! totals follow from the latest records alone: replaying the changelog
//! from its start, or any suffix of it after a state that was right, gives
//! the same totals.
//!
//! A message raises the unread of every member but its sender, and the
//! by-user changelog carries a member's view only when something of theirs
//! changed. So the state also keeps each conversation's latest seq as the
//! conversations' changelog tells it ([`Badges::advance_latest`]: it only
//! grows), and counts a view as unread up to the higher of the two.
//!
//! A muted conversation counts as [`MutedRule`] says. A mute that runs out
//! is a change with no record: [`Badges::expire`] recounts the
//! conversations whose mute ended by then, and [`Badges::next_expiry`] says
//! when to call it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::domain::{ConversationId, Seq, UserId};
use crate::read_model::Mute;

/// The id-keyed maps' hash: foldhash, several times faster than SipHash on
/// short ids.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// How a muted conversation counts in its user's badge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MutedRule {
    /// Only through its unread mentions (as most chat apps do): it adds
    /// them to `mentions` and to `messages`, and counts as an unread
    /// conversation while it has any.
    #[default]
    MentionsOnly,
    /// Not at all.
    Exclude,
    /// As if it were not muted.
    Include,
}

/// What the badge number counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BadgeCount {
    /// Unread messages (Telegram, Slack).
    #[default]
    Messages,
    /// Conversations with anything unread (WhatsApp).
    Conversations,
}

impl std::str::FromStr for MutedRule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "mentions_only" => Ok(MutedRule::MentionsOnly),
            "exclude" => Ok(MutedRule::Exclude),
            "include" => Ok(MutedRule::Include),
            other => Err(format!(
                "unknown muted rule {other:?} (expected mentions_only, exclude or include)"
            )),
        }
    }
}

impl std::str::FromStr for BadgeCount {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "messages" => Ok(BadgeCount::Messages),
            "conversations" => Ok(BadgeCount::Conversations),
            other => Err(format!(
                "unknown badge count {other:?} (expected messages or conversations)"
            )),
        }
    }
}

/// The badge's rules: `[badge]` in the configuration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BadgeRules {
    pub muted: MutedRule,
    pub count: BadgeCount,
}

impl BadgeRules {
    /// The badge of these totals.
    fn badge(&self, totals: Totals) -> Badge {
        Badge {
            badge: match self.count {
                BadgeCount::Messages => totals.messages,
                BadgeCount::Conversations => totals.conversations,
            },
            totals,
        }
    }
}

/// One conversation as its member's own devices see it: what the by-user
/// changelog's last record of it says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnConversation {
    /// The member's own unread count (at least 1 while marked unread).
    pub unread: u64,
    pub marked_unread: bool,
    pub unread_mentions: u32,
    /// Muted while the time is below this; `None`: not muted.
    pub muted_until: Option<i64>,
    /// The conversation's latest seq and how far the member read it (by
    /// either cursor): what marking everything read moves.
    pub latest_seq: Seq,
    pub read_up_to: Seq,
}

impl OwnConversation {
    fn muted_at(&self, now_ms: i64) -> bool {
        self.muted_until.is_some_and(|until| now_ms < until)
    }

    /// The view once the conversation's latest seq is `latest`, if that is
    /// newer than what the view knew.
    fn at_latest(&self, latest: Seq) -> OwnConversation {
        if latest <= self.latest_seq {
            return *self;
        }
        let unread = latest.get().saturating_sub(self.read_up_to.get());
        OwnConversation {
            latest_seq: latest,
            unread: if self.marked_unread { unread.max(1) } else { unread },
            ..*self
        }
    }
}

/// A user's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Conversations with anything unread or marked unread that count.
    pub conversations: u64,
    /// Unread messages of the conversations that count.
    pub messages: u64,
    /// Unread mentions, muted conversations' included.
    pub mentions: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.conversations += other.conversations;
        self.messages += other.messages;
        self.mentions += other.mentions;
    }

    fn sub(&mut self, other: Totals) {
        self.conversations -= other.conversations;
        self.messages -= other.messages;
        self.mentions -= other.mentions;
    }
}

/// What a conversation adds to its user's totals, muted or not.
fn contribution(c: &OwnConversation, muted: bool, rule: MutedRule) -> Totals {
    let mentions = u64::from(c.unread_mentions);
    let (messages, unread) = match (muted, rule) {
        (true, MutedRule::Exclude) => return Totals::default(),
        (true, MutedRule::MentionsOnly) => (mentions, mentions > 0),
        _ => (c.unread, c.unread > 0 || c.marked_unread),
    };
    Totals {
        conversations: u64::from(unread),
        messages,
        mentions,
    }
}

/// A user's badge as published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Badge {
    /// The number on the app icon, as [`BadgeCount`] says.
    pub badge: u64,
    pub totals: Totals,
}

/// A conversation held for a user: its view, what it added to the user's
/// totals (taken off exactly when it changes), and the user's slot.
#[derive(Clone, Copy, Debug)]
struct Held {
    view: OwnConversation,
    counted: Totals,
    counted_muted: bool,
    user: u32,
}

/// Which drain publishes a user's changed badge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Lane {
    #[default]
    Clean,
    /// Changed only by others' messages in big conversations: the full
    /// drain.
    Messages,
    /// Changed by their own record, a mute's end, or a small conversation's
    /// message: every drain.
    Own,
}

#[derive(Clone, Debug)]
struct UserState {
    id: UserId,
    totals: Totals,
    /// The conversations held for the user.
    conversations: Vec<ConversationId>,
    /// The threads the user follows, held.
    threads: Vec<ThreadOf>,
    lane: Lane,
}

/// (conversation, root message's seq).
type ThreadOf = (ConversationId, Seq);

/// One user's own view of a thread they follow, from the by-user thread
/// changelog: the thread's latest reply then, and how far they read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnThread {
    pub latest_seq: Seq,
    pub read_up_to: Seq,
}

/// A thread held for its followers: its latest reply (from the thread
/// changelog; it only grows) and each follower's view, with what it added
/// to their totals.
#[derive(Clone, Debug, Default)]
struct ThreadState {
    latest: Seq,
    followers: FastMap<UserId, HeldThread>,
}

#[derive(Clone, Copy, Debug)]
struct HeldThread {
    read_up_to: Seq,
    counted: Totals,
    user: u32,
}

/// What a followed thread adds to its user's totals: its unread replies as
/// messages, unless its conversation is muted and the rule leaves muted
/// conversations' messages out. A thread's replies make no conversation
/// unread and mention nobody (the reply's mentions make followers).
fn thread_contribution(latest: Seq, read_up_to: Seq, muted: bool, rule: MutedRule) -> Totals {
    if muted && rule != MutedRule::Include {
        return Totals::default();
    }
    Totals {
        messages: latest.get().saturating_sub(read_up_to.get()),
        ..Totals::default()
    }
}

/// A conversation: its latest seq (from the conversations' changelog; it
/// only grows) and the members held, with their views, side by side so
/// that a message recounts them without a lookup per member.
#[derive(Clone, Debug, Default)]
struct ConversationState {
    latest: Seq,
    members: FastMap<UserId, Held>,
}

/// The users whose badge changed since the last drain, by lane, as slots;
/// a slot whose lane moved on since it was listed is skipped.
#[derive(Clone, Debug, Default)]
struct Lanes {
    own: Vec<u32>,
    messages: Vec<u32>,
    /// Users not [`Lane::Clean`].
    dirty: usize,
}

/// Whether `user` is held muted in `conversation` (counted so).
fn muted_in(
    conversations: &FastMap<ConversationId, ConversationState>,
    user: &UserId,
    conversation: &ConversationId,
) -> bool {
    conversations
        .get(conversation)
        .and_then(|c| c.members.get(user))
        .is_some_and(|held| held.counted_muted)
}

/// Replaces what one held conversation or thread adds to the totals of the
/// user in `slot` (`held`) with `counted`, after another member's message:
/// the user goes in the lane `at_once` picks. Whether it changed.
fn recount_held(
    users: &mut [UserState],
    lanes: &mut Lanes,
    slot: u32,
    held: &mut Totals,
    counted: Totals,
    at_once: bool,
) -> bool {
    if counted == *held {
        return false;
    }
    let state = &mut users[slot as usize];
    state.totals.sub(*held);
    state.totals.add(counted);
    *held = counted;
    if at_once {
        lanes.own(state, slot);
    } else {
        lanes.by_messages(state, slot);
    }
    true
}

impl UserState {
    /// Conversations and threads held for the user.
    fn held(&self) -> usize {
        self.conversations.len() + self.threads.len()
    }
}

impl Lanes {
    fn own(&mut self, state: &mut UserState, slot: u32) {
        if state.lane != Lane::Own {
            self.dirty += usize::from(state.lane == Lane::Clean);
            state.lane = Lane::Own;
            self.own.push(slot);
        }
    }

    fn by_messages(&mut self, state: &mut UserState, slot: u32) {
        if state.lane == Lane::Clean {
            self.dirty += 1;
            state.lane = Lane::Messages;
            self.messages.push(slot);
        }
    }
}

/// The badges of the users of one input partition.
#[derive(Clone, Debug, Default)]
pub struct Badges {
    rules: BadgeRules,
    /// Members held from which a conversation's messages change badges in
    /// the slower lane; a smaller one's go at once.
    fanout_min_members: usize,
    conversations: FastMap<ConversationId, ConversationState>,
    /// Threads with a follower held, or a latest reply known.
    threads: FastMap<ThreadOf, ThreadState>,
    /// Users by slot. A user with no conversation left keeps the slot until
    /// their last change is drained; then it is reused.
    users: Vec<UserState>,
    slots: FastMap<UserId, u32>,
    free: Vec<u32>,
    /// Users with at least one conversation held.
    held_users: usize,
    /// Mutes that end after the time they were counted at: (end, user,
    /// conversation).
    expiries: BTreeSet<(i64, UserId, ConversationId)>,
    lanes: Lanes,
}

/// `user`'s slot, taken (a free one, or a new one) if they have none.
fn slot_of(
    slots: &mut FastMap<UserId, u32>,
    users: &mut Vec<UserState>,
    free: &mut Vec<u32>,
    user: &UserId,
) -> u32 {
    if let Some(&slot) = slots.get(user) {
        return slot;
    }
    let state = UserState {
        id: user.clone(),
        totals: Totals::default(),
        conversations: Vec::new(),
        threads: Vec::new(),
        lane: Lane::Clean,
    };
    let slot = match free.pop() {
        Some(slot) => {
            users[slot as usize] = state;
            slot
        }
        None => {
            users.push(state);
            u32::try_from(users.len() - 1).expect("fewer than 2^32 users per instance")
        }
    };
    slots.insert(user.clone(), slot);
    slot
}

impl Badges {
    /// With every conversation's messages in the slower lane; see
    /// [`Badges::with_fanout_min_members`].
    pub fn new(rules: BadgeRules) -> Self {
        Badges {
            rules,
            ..Badges::default()
        }
    }

    /// Conversations with fewer members held than `members` publish their
    /// messages' changes at once, as own changes are.
    pub fn with_fanout_min_members(self, members: usize) -> Self {
        Badges {
            fanout_min_members: members,
            ..self
        }
    }

    /// Applies one by-user changelog record at `now_ms`: the member's view
    /// of the conversation, or `None` when they left it. Returns whether
    /// the user's badge changed.
    pub fn apply(
        &mut self,
        user: &UserId,
        conversation: &ConversationId,
        view: Option<OwnConversation>,
        now_ms: i64,
    ) -> bool {
        let rule = self.rules.muted;
        if view.is_some() && !self.conversations.contains_key(conversation) {
            self.conversations
                .insert(conversation.clone(), ConversationState::default());
        }
        let Some(conv) = self.conversations.get_mut(conversation) else {
            return false;
        };
        let old = conv.members.get(user).copied();
        let slot = match (old, view) {
            (Some(old), _) => old.user,
            (None, Some(_)) => slot_of(&mut self.slots, &mut self.users, &mut self.free, user),
            (None, None) => return false,
        };
        let state = &mut self.users[slot as usize];
        let before = state.totals;
        let old_expiry = old.and_then(|o| o.view.muted_until.filter(|_| o.counted_muted));
        if let Some(old) = old {
            state.totals.sub(old.counted);
        }
        let mut new_expiry = None;
        match view {
            Some(view) => {
                let muted = view.muted_at(now_ms);
                let counted = contribution(&view.at_latest(conv.latest), muted, rule);
                state.totals.add(counted);
                new_expiry = view.muted_until.filter(|_| muted);
                let held = Held {
                    view,
                    counted,
                    counted_muted: muted,
                    user: slot,
                };
                match conv.members.get_mut(user) {
                    Some(h) => *h = held,
                    None => {
                        conv.members.insert(user.clone(), held);
                        state.conversations.push(conversation.clone());
                        self.held_users += usize::from(state.held() == 1);
                    }
                }
            }
            None => {
                conv.members.remove(user);
                if let Some(i) = state.conversations.iter().position(|c| c == conversation) {
                    state.conversations.swap_remove(i);
                }
                self.held_users -= usize::from(state.held() == 0);
            }
        }
        if old_expiry != new_expiry {
            if let Some(until) = old_expiry {
                self.expiries.remove(&(until, user.clone(), conversation.clone()));
            }
            if let Some(until) = new_expiry {
                self.expiries.insert((until, user.clone(), conversation.clone()));
            }
        }
        // A mute (or its end, or a departure) counts the user's threads of
        // the conversation anew.
        let was_muted = old.is_some_and(|o| o.counted_muted);
        let muted = view.is_some_and(|v| v.muted_at(now_ms));
        if was_muted != muted {
            self.recount_threads(slot, conversation, muted);
        }
        let state = &mut self.users[slot as usize];
        let changed = state.totals != before;
        if changed {
            self.lanes.own(state, slot);
        }
        self.release_if_done(slot);
        changed
    }

    /// Counts again the threads of `conversation` the user in `slot`
    /// follows, muted there or not.
    fn recount_threads(&mut self, slot: u32, conversation: &ConversationId, muted: bool) {
        let rule = self.rules.muted;
        let state = &mut self.users[slot as usize];
        for of in state.threads.iter().filter(|(c, _)| c == conversation) {
            let Some(thread) = self.threads.get_mut(of) else {
                continue;
            };
            let Some(held) = thread.followers.get_mut(&state.id) else {
                continue;
            };
            let counted = thread_contribution(thread.latest, held.read_up_to, muted, rule);
            state.totals.sub(held.counted);
            state.totals.add(counted);
            held.counted = counted;
        }
    }

    /// Applies one by-user thread changelog record: the follower's view of
    /// thread `thread` of `conversation`, or `None` when they left the
    /// conversation. Returns whether the user's badge changed.
    pub fn apply_thread(
        &mut self,
        user: &UserId,
        conversation: &ConversationId,
        thread: Seq,
        view: Option<OwnThread>,
    ) -> bool {
        let rule = self.rules.muted;
        let muted = muted_in(&self.conversations, user, conversation);
        let of = (conversation.clone(), thread);
        if let Some(view) = view {
            // A newer latest reply counts for every follower.
            self.advance_thread_latest(conversation, thread, view.latest_seq);
        }
        let Some(state) = self.threads.get_mut(&of) else {
            return false;
        };
        let old = state.followers.get(user).copied();
        let slot = match (old, view) {
            (Some(old), _) => old.user,
            (None, Some(_)) => slot_of(&mut self.slots, &mut self.users, &mut self.free, user),
            (None, None) => return false,
        };
        let user_state = &mut self.users[slot as usize];
        let before = user_state.totals;
        if let Some(old) = old {
            user_state.totals.sub(old.counted);
        }
        match view {
            Some(view) => {
                let read_up_to = old.map_or(view.read_up_to, |o| o.read_up_to.max(view.read_up_to));
                let counted = thread_contribution(state.latest, read_up_to, muted, rule);
                user_state.totals.add(counted);
                let held = HeldThread {
                    read_up_to,
                    counted,
                    user: slot,
                };
                if state.followers.insert(user.clone(), held).is_none() {
                    user_state.threads.push(of);
                    self.held_users += usize::from(user_state.held() == 1);
                }
            }
            None => {
                state.followers.remove(user);
                if let Some(i) = user_state.threads.iter().position(|t| *t == of) {
                    user_state.threads.swap_remove(i);
                }
                self.held_users -= usize::from(user_state.held() == 0);
            }
        }
        let changed = user_state.totals != before;
        if changed {
            self.lanes.own(user_state, slot);
        }
        self.release_if_done(slot);
        changed
    }

    /// Raises a thread's latest reply (from the thread changelog) to `seq`
    /// if it is higher, and recounts its followers held. Returns how many
    /// users' badges changed.
    pub fn advance_thread_latest(&mut self, conversation: &ConversationId, thread: Seq, seq: Seq) -> usize {
        let rule = self.rules.muted;
        let of = (conversation.clone(), thread);
        let state = self.threads.entry(of).or_default();
        if seq <= state.latest {
            return 0;
        }
        state.latest = seq;
        let at_once = state.followers.len() < self.fanout_min_members;
        let mut changed = 0;
        for (user, held) in state.followers.iter_mut() {
            let muted = muted_in(&self.conversations, user, conversation);
            let counted = thread_contribution(seq, held.read_up_to, muted, rule);
            changed += usize::from(recount_held(
                &mut self.users,
                &mut self.lanes,
                held.user,
                &mut held.counted,
                counted,
                at_once,
            ));
        }
        changed
    }

    /// Frees the slot of a user with no conversation held and nothing left
    /// to publish.
    fn release_if_done(&mut self, slot: u32) {
        let state = &self.users[slot as usize];
        if state.held() == 0 && state.lane == Lane::Clean && self.slots.get(&state.id) == Some(&slot) {
            self.slots.remove(&state.id);
            self.free.push(slot);
        }
    }

    /// Forgets every user (a restore follows), keeping the conversations'
    /// latest seqs, which come from elsewhere.
    pub fn forget_users(&mut self) {
        for conv in self.conversations.values_mut() {
            conv.members = FastMap::default();
        }
        for thread in self.threads.values_mut() {
            thread.followers = FastMap::default();
        }
        self.users.clear();
        self.slots.clear();
        self.free.clear();
        self.held_users = 0;
        self.expiries.clear();
        self.lanes = Lanes::default();
    }

    /// Forgets the users `gone` picks (their partition moved to another
    /// instance), as if never held: nothing of theirs is published.
    pub fn forget_users_where(&mut self, gone: impl Fn(&UserId) -> bool) {
        for conv in self.conversations.values_mut() {
            conv.members.retain(|user, _| !gone(user));
        }
        for thread in self.threads.values_mut() {
            thread.followers.retain(|user, _| !gone(user));
        }
        self.expiries.retain(|(_, user, _)| !gone(user));
        for (slot, state) in self.users.iter_mut().enumerate() {
            let slot = slot as u32;
            if self.slots.get(&state.id) != Some(&slot) || !gone(&state.id) {
                continue;
            }
            self.slots.remove(&state.id);
            self.held_users -= usize::from(state.held() > 0);
            self.lanes.dirty -= usize::from(state.lane != Lane::Clean);
            state.conversations = Vec::new();
            state.threads = Vec::new();
            state.totals = Totals::default();
            state.lane = Lane::Clean;
            self.free.push(slot);
        }
    }

    /// Raises a conversation's latest seq (from the conversations'
    /// changelog) to `seq` if it is higher, and recounts its members held.
    /// Returns how many users' badges changed.
    pub fn advance_latest(&mut self, conversation: &ConversationId, seq: Seq, now_ms: i64) -> usize {
        let rule = self.rules.muted;
        if !self.conversations.contains_key(conversation) {
            self.conversations
                .insert(conversation.clone(), ConversationState::default());
        }
        let conv = self.conversations.get_mut(conversation).expect("just inserted");
        if seq <= conv.latest {
            return 0;
        }
        conv.latest = seq;
        let at_once = conv.members.len() < self.fanout_min_members;
        let (mut changed, mut mute_ended) = (0, Vec::new());
        for (user, held) in conv.members.iter_mut() {
            let muted = held.view.muted_at(now_ms);
            if muted != held.counted_muted {
                // Its expiry is due too: applied whole, below.
                mute_ended.push((user.clone(), held.view));
                continue;
            }
            let counted = contribution(&held.view.at_latest(seq), muted, rule);
            changed += usize::from(recount_held(
                &mut self.users,
                &mut self.lanes,
                held.user,
                &mut held.counted,
                counted,
                at_once,
            ));
        }
        for (user, view) in mute_ended {
            changed += usize::from(self.apply(&user, conversation, Some(view), now_ms));
        }
        changed
    }

    /// Conversations whose latest seq or members are known.
    pub fn conversation_count(&self) -> usize {
        self.conversations.len()
    }

    /// When the next mute runs out, if any: call [`Badges::expire`] then.
    pub fn next_expiry(&self) -> Option<i64> {
        self.expiries.first().map(|(until, ..)| *until)
    }

    /// Counts again, unmuted, the conversations whose mute ended at or
    /// before `now_ms`. Returns how many users' badges changed.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let mut changed = 0;
        while let Some((until, ..)) = self.expiries.first() {
            if *until > now_ms {
                break;
            }
            let (_, user, conversation) = self.expiries.pop_first().expect("just looked");
            let Some(held) = self
                .conversations
                .get(&conversation)
                .and_then(|c| c.members.get(&user))
                .copied()
            else {
                continue;
            };
            // Applied again at `now_ms`: counted unmuted from now on.
            changed += usize::from(self.apply(&user, &conversation, Some(held.view), now_ms));
        }
        changed
    }

    /// A user's badge now.
    pub fn badge(&self, user: &UserId) -> Badge {
        let totals = self
            .slots
            .get(user)
            .map_or_else(Totals::default, |&slot| self.users[slot as usize].totals);
        self.rules.badge(totals)
    }

    /// The users whose badge changed since the last drain through their
    /// own records, mute expiries, departures or a small conversation's
    /// messages, with their badge now, in user order. Those changed only by
    /// others' messages in big conversations wait for
    /// [`Badges::drain_all`].
    pub fn drain(&mut self) -> Vec<(UserId, Badge)> {
        self.drain_lanes(false)
    }

    /// [`Badges::drain`], and the users changed only by others' messages.
    pub fn drain_all(&mut self) -> Vec<(UserId, Badge)> {
        self.drain_lanes(true)
    }

    fn drain_lanes(&mut self, all: bool) -> Vec<(UserId, Badge)> {
        let mut slots = std::mem::take(&mut self.lanes.own);
        if all {
            slots.append(&mut self.lanes.messages);
        }
        let mut drained = Vec::with_capacity(slots.len());
        for slot in slots {
            let state = &mut self.users[slot as usize];
            let due = match state.lane {
                Lane::Own => true,
                Lane::Messages => all,
                Lane::Clean => false,
            };
            if !due {
                continue;
            }
            state.lane = Lane::Clean;
            self.lanes.dirty -= 1;
            drained.push((state.id.clone(), self.rules.badge(state.totals)));
            self.release_if_done(slot);
        }
        drained.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        drained
    }

    /// Users whose badge changed since the last drain, both kinds.
    pub fn dirty_len(&self) -> usize {
        self.lanes.dirty
    }

    /// Users held.
    pub fn user_count(&self) -> usize {
        self.held_users
    }

    /// What marking everything read takes for `user`: each of their
    /// conversations with something unread, its latest seq (a read report
    /// up to it), and whether it is marked unread (a clear of the mark,
    /// which reading up to where it was set does not lift). In id order.
    pub fn mark_all_read(&self, user: &UserId) -> Vec<MarkRead> {
        let Some(&slot) = self.slots.get(user) else {
            return Vec::new();
        };
        let mut out: Vec<MarkRead> = self.users[slot as usize]
            .conversations
            .iter()
            .filter_map(|c| {
                let conv = self.conversations.get(c)?;
                let held = conv.members.get(user)?;
                Some((c, held.view.at_latest(conv.latest)))
            })
            .filter(|(_, v)| v.read_up_to < v.latest_seq || v.marked_unread)
            .map(|(c, v)| MarkRead {
                conversation_id: c.clone(),
                thread: None,
                seq: (v.read_up_to < v.latest_seq).then_some(v.latest_seq),
                clear_mark: v.marked_unread,
            })
            .collect();
        // Every followed thread with an unread reply: a read in the thread.
        out.extend(self.users[slot as usize].threads.iter().filter_map(|of| {
            let thread = self.threads.get(of)?;
            let held = thread.followers.get(user)?;
            (held.read_up_to < thread.latest).then(|| MarkRead {
                conversation_id: of.0.clone(),
                thread: Some(of.1),
                seq: Some(thread.latest),
                clear_mark: false,
            })
        }));
        out.sort_by(|a, b| (&a.conversation_id, a.thread).cmp(&(&b.conversation_id, b.thread)));
        out
    }
}

/// Every user's badge counted from scratch over the members' own views in
/// `state` at `now_ms` (departed members' conversations left out): what
/// the badge stage must publish once it has read everything `state` folded.
pub fn recount(
    state: &crate::fold::PartitionState,
    rules: BadgeRules,
    now_ms: i64,
) -> BTreeMap<UserId, Badge> {
    let mut badges = Badges::new(rules);
    let mut users = BTreeSet::new();
    for (c, conv) in state.conversations() {
        for (u, m) in conv.members().filter(|(_, m)| !m.left) {
            let own = m.own();
            let view = OwnConversation {
                unread: own.unread(conv.latest_seq()),
                marked_unread: own.marked_unread(),
                unread_mentions: own.unread_mentions,
                muted_until: own.mute.map(|m| m.until).filter(|&until| until != Mute::OFF),
                latest_seq: conv.latest_seq(),
                read_up_to: own.read_up_to(),
            };
            badges.apply(u, c, Some(view), now_ms);
            users.insert(u.clone());
        }
        let threads = conv.threads();
        for root in threads.roots() {
            let thread = threads.thread(root).expect("a root's thread");
            for (u, f) in thread.followers.iter().filter(|(_, f)| f.present) {
                let view = OwnThread {
                    latest_seq: thread.latest_seq,
                    read_up_to: f.cursor.max(f.private_cursor),
                };
                badges.apply_thread(u, c, root, Some(view));
                users.insert(u.clone());
            }
        }
    }
    users
        .into_iter()
        .map(|u| {
            let badge = badges.badge(&u);
            (u, badge)
        })
        .collect()
}

/// One conversation of a mark-all-read: what to send back to the first
/// stage's input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkRead {
    pub conversation_id: ConversationId,
    /// A read in this thread (its root's seq) rather than the conversation.
    pub thread: Option<Seq>,
    /// A read report up to this seq, when something is unread.
    pub seq: Option<Seq>,
    /// A clear of the unread mark.
    pub clear_mark: bool,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn user(s: &str) -> UserId {
        s.parse().unwrap()
    }
    fn conv(s: &str) -> ConversationId {
        s.parse().unwrap()
    }
    fn view(unread: u64, mentions: u32, muted_until: Option<i64>) -> OwnConversation {
        OwnConversation {
            unread,
            marked_unread: false,
            unread_mentions: mentions,
            muted_until,
            latest_seq: Seq(10),
            read_up_to: Seq(10 - unread.min(10)),
        }
    }

    #[test]
    fn totals_follow_the_latest_view_of_each_conversation() {
        let mut b = Badges::new(BadgeRules::default());
        let u = user("u");
        assert!(b.apply(&u, &conv("a"), Some(view(3, 0, None)), 0));
        assert!(b.apply(&u, &conv("b"), Some(view(2, 1, None)), 0));
        let badge = b.badge(&u);
        assert_eq!(
            badge.totals,
            Totals {
                conversations: 2,
                messages: 5,
                mentions: 1
            }
        );
        assert_eq!(badge.badge, 5);
        // Reading a: replaced, not added.
        assert!(b.apply(&u, &conv("a"), Some(view(0, 0, None)), 0));
        assert_eq!(
            b.badge(&u).totals,
            Totals {
                conversations: 1,
                messages: 2,
                mentions: 1
            }
        );
        // Leaving b takes it off; the same record again changes nothing.
        assert!(b.apply(&u, &conv("b"), None, 0));
        assert!(!b.apply(&u, &conv("b"), None, 0));
        assert_eq!(b.badge(&u).totals, Totals::default());
        assert_eq!(b.drain(), vec![(u, Badge::default())]);
        assert_eq!(b.user_count(), 1, "a is still held, read");
    }

    #[test]
    fn a_muted_conversation_counts_only_through_mentions_until_the_mute_ends() {
        let mut b = Badges::new(BadgeRules::default());
        let u = user("u");
        b.apply(&u, &conv("loud"), Some(view(4, 0, None)), 0);
        b.apply(&u, &conv("muted"), Some(view(7, 2, Some(100))), 0);
        assert_eq!(
            b.badge(&u).totals,
            Totals {
                conversations: 2,
                messages: 6,
                mentions: 2
            }
        );
        assert_eq!(b.next_expiry(), Some(100));
        assert_eq!(b.expire(99), 0);
        b.drain();
        assert_eq!(b.expire(100), 1, "the mute ran out: counted in full");
        assert_eq!(
            b.badge(&u).totals,
            Totals {
                conversations: 2,
                messages: 11,
                mentions: 2
            }
        );
        assert_eq!(b.next_expiry(), None);
        assert_eq!(b.drain().len(), 1);
        // A mute that already ran out counts as none.
        b.apply(&u, &conv("old"), Some(view(1, 0, Some(50))), 100);
        assert_eq!(b.badge(&u).totals.messages, 12);
        // Muted without mentions: not an unread conversation at all.
        b.apply(&u, &conv("loud"), Some(view(4, 0, Some(i64::MAX))), 100);
        assert_eq!(
            b.badge(&u).totals,
            Totals {
                conversations: 2,
                messages: 8,
                mentions: 2
            }
        );
    }

    #[test]
    fn a_message_raises_the_unread_of_members_whose_view_is_older() {
        let mut b = Badges::new(BadgeRules::default());
        let (u, c) = (user("u"), conv("c"));
        b.apply(&u, &c, Some(view(0, 0, None)), 0);
        assert_eq!(b.badge(&u).badge, 0);
        assert_eq!(b.advance_latest(&c, Seq(13), 0), 1, "read to 10, latest 13");
        assert_eq!(
            b.badge(&u).totals,
            Totals {
                conversations: 1,
                messages: 3,
                mentions: 0
            }
        );
        assert_eq!(b.advance_latest(&c, Seq(12), 0), 0, "latest only grows");
        assert_eq!(b.mark_all_read(&u)[0].seq, Some(Seq(13)));
        // Their next record, read to 13, brings it back to nothing.
        let read = OwnConversation {
            latest_seq: Seq(13),
            read_up_to: Seq(13),
            ..view(0, 0, None)
        };
        b.apply(&u, &c, Some(read), 0);
        assert_eq!(b.badge(&u).badge, 0);
        // A conversation nobody here is in costs only its latest seq.
        assert_eq!(b.advance_latest(&conv("other"), Seq(5), 0), 0);
        assert_eq!(b.conversation_count(), 2);
    }

    #[test]
    fn changes_by_others_messages_wait_for_the_full_drain() {
        let mut b = Badges::new(BadgeRules::default());
        let (u, w, c) = (user("u"), user("w"), conv("c"));
        b.apply(&u, &c, Some(view(1, 0, None)), 0);
        b.apply(&w, &c, Some(view(1, 0, None)), 0);
        assert_eq!(b.drain().len(), 2, "their own records: at once");
        assert_eq!(b.advance_latest(&c, Seq(11), 0), 2);
        assert_eq!(b.dirty_len(), 2);
        assert!(b.drain().is_empty(), "a message alone waits");
        // w's own record goes now, with what the message did to it.
        b.apply(&w, &c, Some(view(3, 0, None)), 0);
        assert_eq!(b.drain(), vec![(w.clone(), b.badge(&w))]);
        assert_eq!(b.badge(&w).totals.messages, 4, "read to 7, latest 11");
        assert_eq!(b.drain_all(), vec![(u.clone(), b.badge(&u))]);
        assert_eq!(b.badge(&u).totals.messages, 2);
        assert_eq!(b.dirty_len(), 0);
        // Below the members held that make a big conversation: at once.
        let mut b = Badges::new(BadgeRules::default()).with_fanout_min_members(3);
        b.apply(&u, &c, Some(view(1, 0, None)), 0);
        b.apply(&w, &c, Some(view(1, 0, None)), 0);
        b.drain();
        assert_eq!(b.advance_latest(&c, Seq(11), 0), 2);
        assert_eq!(b.drain().len(), 2, "a small conversation's message goes at once");
        b.apply(&user("x"), &c, Some(view(1, 0, None)), 0);
        b.drain();
        assert_eq!(b.advance_latest(&c, Seq(12), 0), 3);
        assert!(b.drain().is_empty(), "3 held: the slower lane");
        assert_eq!(b.drain_all().len(), 3);
    }

    #[test]
    fn forgotten_users_leave_nothing_behind() {
        let mut b = Badges::new(BadgeRules::default());
        let (u, w, c) = (user("u"), user("w"), conv("c"));
        b.apply(&u, &c, Some(view(1, 0, Some(50))), 0);
        b.apply(&w, &c, Some(view(2, 0, None)), 0);
        b.forget_users_where(|x| *x == u);
        assert_eq!((b.user_count(), b.dirty_len()), (1, 1));
        assert_eq!(b.next_expiry(), None, "u's mute is gone with u");
        assert_eq!(b.drain(), vec![(w.clone(), b.badge(&w))]);
        assert_eq!(b.advance_latest(&c, Seq(11), 0), 1, "only w is recounted");
        // u comes back, held afresh.
        b.apply(&u, &c, Some(view(1, 0, None)), 0);
        assert_eq!(b.badge(&u).totals.messages, 2);
        assert_eq!(b.user_count(), 2);
    }

    #[test]
    fn the_rules_change_what_counts() {
        let u = user("u");
        let counted = |muted, count| {
            let mut b = Badges::new(BadgeRules { muted, count });
            b.apply(&u, &conv("m"), Some(view(5, 1, Some(i64::MAX))), 0);
            b.apply(&u, &conv("n"), Some(view(2, 0, None)), 0);
            b.badge(&u).badge
        };
        assert_eq!(counted(MutedRule::MentionsOnly, BadgeCount::Messages), 3);
        assert_eq!(counted(MutedRule::Exclude, BadgeCount::Messages), 2);
        assert_eq!(counted(MutedRule::Include, BadgeCount::Messages), 7);
        assert_eq!(counted(MutedRule::MentionsOnly, BadgeCount::Conversations), 2);
        assert_eq!(counted(MutedRule::Exclude, BadgeCount::Conversations), 1);
    }

    #[test]
    fn a_marked_conversation_counts_and_mark_all_read_lists_what_to_send() {
        let mut b = Badges::new(BadgeRules::default());
        let u = user("u");
        let marked = OwnConversation {
            unread: 1,
            marked_unread: true,
            latest_seq: Seq(4),
            read_up_to: Seq(4),
            ..OwnConversation::default()
        };
        b.apply(&u, &conv("b"), Some(marked), 0);
        b.apply(&u, &conv("a"), Some(view(3, 0, None)), 0);
        b.apply(&u, &conv("c"), Some(view(0, 0, None)), 0);
        assert_eq!(b.badge(&u).totals.conversations, 2);
        assert_eq!(
            b.mark_all_read(&u),
            vec![
                MarkRead {
                    thread: None,
                    conversation_id: conv("a"),
                    seq: Some(Seq(10)),
                    clear_mark: false
                },
                MarkRead {
                    thread: None,
                    conversation_id: conv("b"),
                    seq: None,
                    clear_mark: true
                },
            ]
        );
        assert!(b.mark_all_read(&user("nobody")).is_empty());
    }

    #[test]
    fn followed_threads_count_their_unread_replies_unless_muted() {
        let mut b = Badges::new(BadgeRules::default());
        let (u, c) = (user("u"), conv("c"));
        let own = |latest, read| {
            Some(OwnThread {
                latest_seq: Seq(latest),
                read_up_to: Seq(read),
            })
        };
        b.apply(&u, &c, Some(view(1, 0, None)), 0);
        assert!(b.apply_thread(&u, &c, Seq(1), own(3, 1)));
        assert_eq!(b.badge(&u).totals.messages, 3, "1 message and 2 replies");
        assert_eq!(
            b.badge(&u).totals.conversations,
            1,
            "threads make no conversation unread"
        );
        // Another follower's reply raises it; an older record lowers nothing.
        assert_eq!(b.advance_thread_latest(&c, Seq(1), Seq(5)), 1);
        assert!(!b.apply_thread(&u, &c, Seq(1), own(2, 0)));
        assert_eq!(b.badge(&u).totals.messages, 5);
        // Muted: the thread counts as its conversation's messages do.
        b.apply(&u, &c, Some(view(1, 0, Some(100))), 0);
        assert_eq!(b.badge(&u).totals.messages, 0);
        b.expire(100);
        assert_eq!(b.badge(&u).totals.messages, 5);
        // Mark all read reads the thread too.
        let marks = b.mark_all_read(&u);
        assert_eq!(
            marks.iter().map(|m| (m.thread, m.seq)).collect::<Vec<_>>(),
            [(None, Some(Seq(10))), (Some(Seq(1)), Some(Seq(5)))]
        );
        // Read on a device, then departed: nothing left.
        b.apply_thread(&u, &c, Seq(1), own(5, 5));
        assert_eq!(b.badge(&u).totals.messages, 1);
        b.apply_thread(&u, &c, Seq(1), None);
        b.apply(&u, &c, None, 0);
        assert_eq!(b.badge(&u), Badge::default());
        b.drain_all();
        assert_eq!(b.user_count(), 0);
    }

    fn arb_view() -> impl Strategy<Value = Option<OwnConversation>> {
        prop::option::weighted(
            0.8,
            (0u64..5, any::<bool>(), 0u32..3, prop::option::of(0i64..40)).prop_map(
                |(unread, marked, mentions, until)| OwnConversation {
                    unread: if marked { unread.max(1) } else { unread },
                    marked_unread: marked,
                    unread_mentions: mentions,
                    muted_until: until,
                    latest_seq: Seq(9),
                    read_up_to: Seq(9 - unread),
                },
            ),
        )
    }

    proptest! {
        /// However records and mute expiries interleave, the totals equal a
        /// count from scratch over the latest view of each conversation.
        #[test]
        fn totals_equal_a_recount_of_the_latest_views(
            records in prop::collection::vec((0u8..3, 0u8..4, arb_view(), 0i64..5, prop::option::of(9u64..15), any::<bool>()), 0..60),
            muted in prop_oneof![Just(MutedRule::MentionsOnly), Just(MutedRule::Exclude), Just(MutedRule::Include)],
            fanout_min_members in 0usize..4,
        ) {
            let rules = BadgeRules { muted, count: BadgeCount::Messages };
            let mut b = Badges::new(rules).with_fanout_min_members(fanout_min_members);
            let mut latest: HashMap<(UserId, ConversationId), OwnConversation> = HashMap::new();
            let mut messages: HashMap<ConversationId, Seq> = HashMap::new();
            let mut published: HashMap<UserId, Badge> = HashMap::new();
            let mut now = 0;
            for (i, (u, c, v, step, message, expire_first)) in records.into_iter().enumerate() {
                now += step;
                if expire_first {
                    b.expire(now);
                }
                let (u, c) = (user(&format!("u{u}")), conv(&format!("c{c}")));
                if let Some(seq) = message {
                    // A message in c: every member's unread follows, a mute
                    // that ran out meanwhile included.
                    b.advance_latest(&c, Seq(seq), now);
                    let known = messages.entry(c.clone()).or_default();
                    *known = (*known).max(Seq(seq));
                }
                b.expire(now);
                b.apply(&u, &c, v, now);
                match v {
                    Some(v) => latest.insert((u, c), v),
                    None => latest.remove(&(u, c)),
                };
                for u in (0..3).map(|u| user(&format!("u{u}"))) {
                    let mut want = Totals::default();
                    for ((owner, c), v) in &latest {
                        if *owner == u {
                            let seen = v.at_latest(messages.get(c).copied().unwrap_or_default());
                            want.add(contribution(&seen, v.muted_at(now), muted));
                        }
                    }
                    prop_assert_eq!(b.badge(&u).totals, want);
                }
                let drained = if i % 3 == 0 { b.drain_all() } else { b.drain() };
                published.extend(drained);
            }
            // Every change reaches a drain, and the last one drained is the
            // badge now.
            published.extend(b.drain_all());
            prop_assert_eq!(b.dirty_len(), 0);
            for u in (0..3).map(|u| user(&format!("u{u}"))) {
                prop_assert_eq!(published.get(&u).copied().unwrap_or_default(), b.badge(&u));
            }
            let holding: BTreeSet<&UserId> = latest.keys().map(|(u, _)| u).collect();
            prop_assert_eq!(b.user_count(), holding.len());
        }

        /// With threads: a followed thread adds its unread replies, as its
        /// conversation's mute says, however thread records, replies,
        /// conversation records and mute expiries interleave.
        #[test]
        fn thread_totals_equal_a_recount(
            records in prop::collection::vec(
                (0u8..2, 0u8..2, 0u8..2, arb_view(), prop::option::weighted(0.8, (0u64..6, 0u64..6)), 0i64..5, prop::option::of(1u64..8), any::<bool>()),
                0..60,
            ),
            muted in prop_oneof![Just(MutedRule::MentionsOnly), Just(MutedRule::Exclude), Just(MutedRule::Include)],
        ) {
            let rules = BadgeRules { muted, count: BadgeCount::Messages };
            let mut b = Badges::new(rules);
            let mut views: HashMap<(UserId, ConversationId), OwnConversation> = HashMap::new();
            let mut follows: HashMap<(UserId, ConversationId, Seq), Seq> = HashMap::new();
            let mut thread_latest: HashMap<(ConversationId, Seq), Seq> = HashMap::new();
            let mut now = 0;
            for (u, c, t, v, thread_view, step, reply, conversation_first) in records {
                now += step;
                let (u, c, t) = (user(&format!("u{u}")), conv(&format!("c{c}")), Seq(u64::from(t) + 1));
                b.expire(now);
                if conversation_first {
                    b.apply(&u, &c, v, now);
                    match v {
                        Some(v) => views.insert((u.clone(), c.clone()), v),
                        None => views.remove(&(u.clone(), c.clone())),
                    };
                }
                if let Some(seq) = reply {
                    b.advance_thread_latest(&c, t, Seq(seq));
                    let l = thread_latest.entry((c.clone(), t)).or_default();
                    *l = (*l).max(Seq(seq));
                }
                let own = thread_view.map(|(latest, read)| OwnThread { latest_seq: Seq(latest), read_up_to: Seq(read) });
                b.apply_thread(&u, &c, t, own);
                match own {
                    Some(own) => {
                        let l = thread_latest.entry((c.clone(), t)).or_default();
                        *l = (*l).max(own.latest_seq);
                        let read = follows.entry((u.clone(), c.clone(), t)).or_default();
                        *read = (*read).max(own.read_up_to);
                    }
                    None => {
                        follows.remove(&(u.clone(), c.clone(), t));
                    }
                }
                if !conversation_first {
                    b.apply(&u, &c, v, now);
                    match v {
                        Some(v) => views.insert((u.clone(), c.clone()), v),
                        None => views.remove(&(u.clone(), c.clone())),
                    };
                }
                for u in (0..2).map(|u| user(&format!("u{u}"))) {
                    let mut want = Totals::default();
                    for ((owner, _), v) in &views {
                        if *owner == u {
                            want.add(contribution(&v.at_latest(Seq::ZERO), v.muted_at(now), muted));
                        }
                    }
                    for ((owner, c, t), read) in &follows {
                        if *owner == u {
                            let is_muted = views.get(&(u.clone(), c.clone())).is_some_and(|v| v.muted_at(now));
                            let latest = thread_latest[&(c.clone(), *t)];
                            want.add(thread_contribution(latest, *read, is_muted, muted));
                        }
                    }
                    prop_assert_eq!(b.badge(&u).totals, want);
                }
                b.drain_all();
            }
        }
    }
}
