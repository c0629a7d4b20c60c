//! Who is subscribed to what, each watched conversation's live state, and
//! each connection's outbox.
//!
//! A conversation with subscribers here has a [`Room`]: its present members
//! and their public cursors, read once from the stores when the first
//! subscriber comes, then kept current from the changelog by max-merge.
//! Every later subscriber's snapshot comes from the room, taken under the
//! same lock that registers the subscription, so that no change falls
//! between the two; and a room never lowers a cursor.
//!
//! A conversation smaller than `batch_from_members` pushes each advance at
//! once. A bigger one (a big group, for as long as its room lives) sends no
//! frame per advance: a v1 connection gets one `cursors` frame of the
//! changed members per batch interval ([`Hub::send_batches`]); a v2 one gets
//! the read counts of the recent messages, kept as cursors move
//! ([`RecentReadCounts`]), at most once per read-counts interval
//! ([`Hub::send_read_counts`]), the same frame for all, serialized once.
//!
//! The outbox coalesces: cursors only grow, so only the latest value per
//! (conversation, member) matters. Updates for a key replace each other
//! while a connection's writer is busy, so a slow client gets fewer, newer
//! frames rather than a growing queue, and never holds up the others.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use readfold_core::read_model::Reached;
use readfold_core::recent_reads::{read_by_all_through, RecentReadCounts};
use readfold_core::{MemberCursor, Seq};
use tokio::sync::Notify;

use crate::protocol::{MemberState, OwnState, ReadCounts, ServerFrame, Shared, SharedFrame, Version};
use crate::telemetry;
pub use crate::threads::ThreadOwn;
use crate::threads::Threads;

/// What an update is about: a member of a conversation as others see them,
/// the connected user's own view of a conversation, a big group's batch, or
/// a big group's read counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Member {
        conversation: String,
        user: String,
    },
    Own {
        conversation: String,
    },
    Batch {
        conversation: String,
    },
    ReadCounts {
        conversation: String,
    },
    /// The user's app badge.
    Badge,
    /// A follower of a subscribed thread, as others see them.
    ThreadMember {
        conversation: String,
        thread: u64,
        user: String,
    },
    /// The connected user's own view of a thread they follow.
    OwnThread {
        conversation: String,
        thread: u64,
    },
}

impl Key {
    /// The key a frame replaces, if it is a coalescable update.
    pub fn of(frame: &ServerFrame) -> Option<Key> {
        match frame {
            ServerFrame::Cursor {
                conversation, user, ..
            }
            | ServerFrame::Left { conversation, user } => Some(Key::Member {
                conversation: conversation.clone(),
                user: user.clone(),
            }),
            ServerFrame::Own { conversation, .. } => Some(Key::Own {
                conversation: conversation.clone(),
            }),
            ServerFrame::Cursors { conversation, .. } => Some(Key::Batch {
                conversation: conversation.clone(),
            }),
            ServerFrame::ReadCounts { shared, .. } => Some(Key::ReadCounts {
                conversation: shared.value.conversation.clone(),
            }),
            ServerFrame::Badge { .. } => Some(Key::Badge),
            ServerFrame::ThreadCursor {
                conversation,
                thread,
                user,
                ..
            }
            | ServerFrame::ThreadLeft {
                conversation,
                thread,
                user,
            } => Some(Key::ThreadMember {
                conversation: conversation.clone(),
                thread: *thread,
                user: user.clone(),
            }),
            ServerFrame::OwnThread {
                conversation, thread, ..
            } => Some(Key::OwnThread {
                conversation: conversation.clone(),
                thread: *thread,
            }),
            _ => None,
        }
    }

    /// Whether the key's frames go to the user's devices whatever they
    /// subscribe to (own state), or follow a thread subscription.
    fn outlives_conversation(&self) -> bool {
        matches!(
            self,
            Key::Own { .. } | Key::OwnThread { .. } | Key::ThreadMember { .. }
        )
    }

    /// The conversation the key is about; `None` for the user's badge.
    fn conversation(&self) -> Option<&str> {
        match self {
            Key::Member { conversation, .. }
            | Key::Own { conversation }
            | Key::Batch { conversation }
            | Key::ReadCounts { conversation }
            | Key::ThreadMember { conversation, .. }
            | Key::OwnThread { conversation, .. } => Some(conversation),
            Key::Badge => None,
        }
    }
}

#[derive(Default)]
struct Pending {
    /// In order: welcome, snapshots, acks, errors, pongs.
    control: VecDeque<ServerFrame>,
    /// The latest update per key.
    updates: BTreeMap<Key, ServerFrame>,
    /// Conversations the session wants; a subscription that completes after
    /// the client unsubscribed is not registered.
    wanted: HashSet<String>,
    /// v2 big groups: own updates there ride on the next read counts.
    own_on_read_counts: HashSet<String>,
    /// Threads the session subscribes to.
    wanted_threads: HashSet<(String, u64)>,
    closed: bool,
}

impl Pending {
    /// An own update that waits for its conversation's read counts.
    fn waits(&self, key: &Key) -> bool {
        matches!(key, Key::Own { conversation } if self.own_on_read_counts.contains(conversation))
    }

    /// Whether anything can be written now.
    fn ready(&self) -> bool {
        !self.control.is_empty() || self.updates.keys().any(|k| !self.waits(k))
    }

    /// The frames to write: control frames first, then updates; an own
    /// update that waits goes into its read counts, or stays.
    fn take(&mut self) -> Vec<ServerFrame> {
        let mut frames: Vec<ServerFrame> = self.control.drain(..).collect();
        let updates = std::mem::take(&mut self.updates);
        let mut held = BTreeMap::new();
        for (key, frame) in updates {
            if self.waits(&key) {
                held.insert(key, frame);
            } else {
                frames.push(frame);
            }
        }
        for frame in &mut frames {
            if let ServerFrame::ReadCounts { shared, own } = frame {
                let key = Key::Own {
                    conversation: shared.value.conversation.clone(),
                };
                if let Some(ServerFrame::Own { own: held_own, .. }) = held.remove(&key) {
                    *own = Some(held_own);
                }
            }
        }
        self.updates = held;
        frames
    }
}

/// One connection's frames waiting to be written.
#[derive(Default)]
pub struct Outbox {
    version: Version,
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Outbox {
    pub fn new(version: Version) -> Self {
        Outbox {
            version,
            ..Outbox::default()
        }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().expect("outbox lock")
    }

    /// Queues a frame that is sent in order, before any update.
    pub fn push_control(&self, frame: ServerFrame) {
        self.lock().control.push_back(frame);
        self.notify.notify_one();
    }

    /// Queues an update, replacing an unsent one for the same key. A
    /// member's update goes into an unsent batch of its conversation, if
    /// there is one, so that the two never show values out of order.
    pub fn push_update(&self, key: Key, frame: ServerFrame) {
        let mut p = self.lock();
        if let Key::Member { conversation, .. } = &key {
            let batch = Key::Batch {
                conversation: conversation.clone(),
            };
            if let Some(ServerFrame::Cursors { members, left, .. }) = p.updates.get_mut(&batch) {
                match frame {
                    ServerFrame::Cursor {
                        user,
                        cursor,
                        delivered,
                        join_seq,
                        ..
                    } => merge_member(
                        members,
                        left,
                        MemberState {
                            user,
                            cursor,
                            delivered,
                            join_seq,
                        },
                    ),
                    ServerFrame::Left { user, .. } => merge_left(members, left, user),
                    _ => {}
                }
                drop(p);
                telemetry::coalesced();
                self.notify.notify_one();
                return;
            }
        }
        // The store's read of a badge and the topic's records race: an
        // unsent newer badge stays.
        if let (
            ServerFrame::Badge { updated_at, .. },
            Some(ServerFrame::Badge {
                updated_at: unsent, ..
            }),
        ) = (&frame, p.updates.get(&key))
        {
            if unsent > updated_at {
                return;
            }
        }
        // A conversation's thread unread is the hub's count when pushed:
        // unsent frames that carry it show the newest.
        if let Some((conversation, unread)) = thread_unread_of(&frame) {
            let conversation = conversation.to_owned();
            for unsent in p.updates.values_mut() {
                match unsent {
                    ServerFrame::Own {
                        conversation: c, own, ..
                    } if *c == conversation => own.thread_unread = unread,
                    ServerFrame::OwnThread {
                        conversation: c,
                        thread_unread,
                        ..
                    } if *c == conversation => *thread_unread = unread,
                    _ => {}
                }
            }
        }
        let replaced = p.updates.insert(key, frame).is_some();
        drop(p);
        if replaced {
            telemetry::coalesced();
        }
        self.notify.notify_one();
    }

    /// Queues a big group's batch, merged into an unsent one; it replaces
    /// the unsent single updates of the members it names (it is newer).
    pub fn push_batch(&self, frame: ServerFrame) {
        let ServerFrame::Cursors {
            conversation,
            latest_seq,
            members,
            left,
        } = frame
        else {
            return;
        };
        let mut p = self.lock();
        for user in members.iter().map(|m| &m.user).chain(&left) {
            p.updates.remove(&Key::Member {
                conversation: conversation.clone(),
                user: user.clone(),
            });
        }
        let key = Key::Batch {
            conversation: conversation.clone(),
        };
        match p.updates.get_mut(&key) {
            Some(ServerFrame::Cursors {
                latest_seq: unsent_latest,
                members: unsent_members,
                left: unsent_left,
                ..
            }) => {
                *unsent_latest = (*unsent_latest).max(latest_seq);
                for m in members {
                    merge_member(unsent_members, unsent_left, m);
                }
                for user in left {
                    merge_left(unsent_members, unsent_left, user);
                }
                drop(p);
                telemetry::coalesced();
            }
            _ => {
                p.updates.insert(
                    key,
                    ServerFrame::Cursors {
                        conversation,
                        latest_seq,
                        members,
                        left,
                    },
                );
                drop(p);
            }
        }
        self.notify.notify_one();
    }

    /// The session wants (or no longer wants) a conversation. Once it does
    /// not, its unsent updates are dropped: a later subscription starts
    /// from a new snapshot.
    pub fn want(&self, conversation: &str, wanted: bool) {
        let mut p = self.lock();
        if wanted {
            p.wanted.insert(conversation.to_owned());
        } else {
            p.wanted.remove(conversation);
            p.own_on_read_counts.remove(conversation);
            p.updates
                .retain(|key, _| key.outlives_conversation() || key.conversation() != Some(conversation));
        }
        drop(p);
        // A held own update may be free to go now.
        self.notify.notify_one();
    }

    /// The session wants (or no longer wants) a thread's cursors; once it
    /// does not, their unsent updates are dropped.
    pub fn want_thread(&self, conversation: &str, thread: u64, wanted: bool) {
        let mut p = self.lock();
        let id = (conversation.to_owned(), thread);
        if wanted {
            p.wanted_threads.insert(id);
        } else {
            p.wanted_threads.remove(&id);
            p.updates.retain(|key, _| {
                !matches!(key, Key::ThreadMember { conversation: c, thread: t, .. } if *c == id.0 && *t == id.1)
            });
        }
    }

    pub fn wants_thread(&self, conversation: &str, thread: u64) -> bool {
        let p = self.lock();
        !p.closed && p.wanted_threads.contains(&(conversation.to_owned(), thread))
    }

    /// The threads the session subscribes to, for its disconnect.
    pub fn wanted_threads(&self) -> Vec<(String, u64)> {
        self.lock().wanted_threads.iter().cloned().collect()
    }

    /// Own updates in `conversation` (a v2 big group) wait for its next
    /// read counts and go out in them.
    fn own_on_read_counts(&self, conversation: &str) {
        self.lock().own_on_read_counts.insert(conversation.to_owned());
    }

    fn wants(&self, conversation: &str) -> bool {
        let p = self.lock();
        !p.closed && p.wanted.contains(conversation)
    }

    /// The conversations the session wants, for its disconnect.
    pub fn wanted(&self) -> Vec<String> {
        self.lock().wanted.iter().cloned().collect()
    }

    /// Ends the writer's wait for good.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    /// Waits for frames and takes all of them: control frames first, then
    /// updates. `None` once closed.
    pub async fn take(&self) -> Option<Vec<ServerFrame>> {
        loop {
            {
                let mut p = self.lock();
                if p.closed {
                    return None;
                }
                if p.ready() {
                    return Some(p.take());
                }
            }
            self.notify.notified().await;
        }
    }

    /// Updates waiting, for tests and telemetry.
    pub fn pending_updates(&self) -> usize {
        self.lock().updates.len()
    }
}

/// The conversation and thread unread a frame carries, if it does.
fn thread_unread_of(frame: &ServerFrame) -> Option<(&str, u64)> {
    match frame {
        ServerFrame::Own {
            conversation, own, ..
        } => Some((conversation, own.thread_unread)),
        ServerFrame::OwnThread {
            conversation,
            thread_unread,
            ..
        } => Some((conversation, *thread_unread)),
        _ => None,
    }
}

/// Puts a member's newer state into a batch's lists.
fn merge_member(members: &mut Vec<MemberState>, left: &mut Vec<String>, member: MemberState) {
    left.retain(|u| *u != member.user);
    match members.iter_mut().find(|m| m.user == member.user) {
        Some(m) => *m = member,
        None => members.push(member),
    }
}

/// Puts a departure into a batch's lists.
fn merge_left(members: &mut Vec<MemberState>, left: &mut Vec<String>, user: String) {
    members.retain(|m| m.user != user);
    if !left.contains(&user) {
        left.push(user);
    }
}

/// A connection's id within one gateway.
pub type ConnId = u64;

/// A member's public cursor, how far messages reached their devices, and
/// the seq they joined at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub cursor: u64,
    /// A room keeps it at or above `cursor`: reading implies delivery.
    pub delivered: u64,
    pub join_seq: u64,
}

impl Member {
    /// How far messages reached the member, by either cursor.
    pub fn delivered_through(self) -> u64 {
        self.delivered.max(self.cursor)
    }

    /// The member as read counts count them. Its `delivered` is the cursor,
    /// so that a delivery alone leaves this view, and the counts, as they are.
    fn read_view(self) -> MemberCursor {
        MemberCursor {
            cursor: Seq(self.cursor),
            delivered: Seq(self.cursor),
            join_seq: Seq(self.join_seq),
        }
    }

    /// The member with the delivered cursor as the cursor: read counts of
    /// this view are delivered counts, by the same join_seq rule.
    fn delivery_view(self) -> MemberCursor {
        let through = Seq(self.delivered_through());
        MemberCursor {
            cursor: through,
            delivered: through,
            join_seq: Seq(self.join_seq),
        }
    }

    fn state(self, user: String) -> MemberState {
        MemberState {
            user,
            cursor: self.cursor,
            delivered: self.delivered_through(),
            join_seq: self.join_seq,
        }
    }
}

/// A conversation's state as the stores have it, to start a room from.
#[derive(Clone, Debug, Default)]
pub struct LoadedConversation {
    pub latest_seq: u64,
    pub members: BTreeMap<String, Member>,
}

/// A by-conversation changelog record: a member's cursor (or join), or a
/// departure (`None`).
#[derive(Clone, Debug)]
pub struct MemberChange {
    pub user: String,
    pub member: Option<Member>,
    pub latest_seq: u64,
}

/// A subscriber waiting for its room to be loaded.
struct Waiter {
    id: ConnId,
    user: String,
    outbox: Arc<Outbox>,
    own: Option<OwnState>,
}

/// How rooms send to their subscribers.
#[derive(Clone, Copy, Debug)]
pub struct HubConfig {
    /// Conversations with at least this many present members are big groups.
    pub batch_from_members: usize,
    /// How many of a big group's newest seqs its read counts cover.
    pub read_counts_window: usize,
    /// At most one read-counts frame per connection per this interval.
    pub read_counts_interval: Duration,
}

impl HubConfig {
    pub fn new(batch_from_members: usize) -> Self {
        HubConfig {
            batch_from_members,
            read_counts_window: 512,
            read_counts_interval: Duration::from_millis(250),
        }
    }
}

/// A big group's v2 subscribers are sent their read counts in this many
/// phases, an interval's fraction apart: each still gets at most one frame
/// per interval, and the gateway writes a fifth of them at a time rather
/// than all at once (a write burst that late subscribers would wait for).
const PHASES: usize = 5;

/// The subscribers of one phase: whether they have a change to be sent,
/// and when they were last sent one.
#[derive(Clone, Copy, Default)]
struct Phase {
    pending: bool,
    sent_at: Option<Instant>,
}

/// A big group's read and delivered counts and when they were last sent.
struct BigGroup {
    counts: RecentReadCounts<String>,
    /// The same counts over the members' delivery views.
    delivered: RecentReadCounts<String>,
    /// The frame of the present state, once built; a change drops it.
    frame: Option<Arc<SharedFrame<ReadCounts>>>,
    phases: [Phase; PHASES],
    /// When any phase was last sent.
    phase_sent_at: Option<Instant>,
}

impl BigGroup {
    /// A member's state changed (`None`: not a present member).
    fn moved(&mut self, before: Option<Member>, after: Option<Member>) {
        self.counts
            .moved(before.map(Member::read_view), after.map(Member::read_view));
        self.delivered.moved(
            before.map(Member::delivery_view),
            after.map(Member::delivery_view),
        );
        self.changed();
    }

    fn changed(&mut self) {
        self.frame = None;
        for phase in &mut self.phases {
            phase.pending = true;
        }
    }

    /// The phase to send now, if one is due: pending, an interval after its
    /// last frame, a fraction of it after any phase's; the longest waiting.
    fn due_phase(&self, now: Instant, interval: Duration) -> Option<usize> {
        let since = |at: Option<Instant>| at.map(|at| now.saturating_duration_since(at));
        if since(self.phase_sent_at).is_some_and(|d| d < interval / PHASES as u32) {
            return None;
        }
        (0..PHASES)
            .filter(|&p| {
                self.phases[p].pending && since(self.phases[p].sent_at).is_none_or(|d| d >= interval)
            })
            .min_by_key(|&p| self.phases[p].sent_at)
    }
}

/// A watched conversation's live state and its subscribers here.
#[derive(Default)]
struct Room {
    loaded: bool,
    /// Changes that came while the stores were being read; applied over
    /// what was read.
    buffered: Vec<MemberChange>,
    /// Messages sent (seq, sender) while the stores were being read.
    buffered_sent: Vec<(u64, String)>,
    waiting: Vec<Waiter>,
    latest_seq: u64,
    /// The highest seq the input topic has shown here, which the changelog
    /// may not have yet: the bound for read receipts.
    input_latest: u64,
    members: BTreeMap<String, Member>,
    subscribers: HashMap<ConnId, Arc<Outbox>>,
    /// Subscribers on v1, who get a big group's member batches.
    v1_subscribers: usize,
    /// A big group's changes not yet sent (None: left), latest per member.
    unsent: BTreeMap<String, Option<Member>>,
    /// The member list snapshots share, until the next change.
    shared: Option<Shared<Vec<MemberState>>>,
    /// Set once the room has `batch_from_members` members; it stays big.
    big: Option<BigGroup>,
}

impl Room {
    /// Max-merges a change; the member's state before and after, if it
    /// changed. A delivery alone is a change.
    fn apply(&mut self, change: &MemberChange) -> Option<(Option<Member>, Option<Member>)> {
        self.latest_seq = self.latest_seq.max(change.latest_seq);
        let before = self.members.get(&change.user).copied();
        let after = match (change.member, before) {
            (Some(new), Some(m))
                if new.cursor <= m.cursor
                    && new.delivered_through() <= m.delivered
                    && new.join_seq == m.join_seq =>
            {
                return None
            }
            (Some(new), Some(m)) => Some(Member {
                cursor: m.cursor.max(new.cursor),
                delivered: m.delivered.max(new.delivered_through()),
                join_seq: new.join_seq,
            }),
            (Some(new), None) => Some(Member {
                delivered: new.delivered_through(),
                ..new
            }),
            (None, None) => return None,
            (None, Some(_)) => None,
        };
        match after {
            Some(m) => self.members.insert(change.user.clone(), m),
            None => self.members.remove(&change.user),
        };
        self.shared = None;
        Some((before, after))
    }

    /// The highest seq known from either topic.
    fn top(&self) -> u64 {
        self.latest_seq.max(self.input_latest)
    }

    /// Becomes a big group once it has `config.batch_from_members` members.
    fn grow(&mut self, config: &HubConfig) {
        if self.big.is_none() && self.members.len() >= config.batch_from_members {
            self.big = Some(BigGroup {
                counts: RecentReadCounts::new(config.read_counts_window, self.latest_seq),
                delivered: RecentReadCounts::new(config.read_counts_window, self.latest_seq),
                frame: None,
                phases: [Phase {
                    pending: true,
                    sent_at: None,
                }; PHASES],
                phase_sent_at: None,
            });
            self.extend_counts();
        }
    }

    /// Counts every seq known, from the members' cursors.
    fn extend_counts(&mut self) {
        let top = self.top();
        if let Some(big) = &mut self.big {
            if top > big.counts.top() {
                let members = self.members.values();
                big.counts.extend_to(top, members.clone().map(|m| m.read_view()));
                big.delivered.extend_to(top, members.map(|m| m.delivery_view()));
                big.changed();
            }
        }
    }

    /// Message `seq` was sent by `sender`.
    fn sent(&mut self, seq: u64, sender: String) {
        self.input_latest = self.input_latest.max(seq);
        self.extend_counts();
        if let Some(big) = &mut self.big {
            big.counts.sent(seq, sender.clone());
            big.delivered.sent(seq, sender);
            big.changed();
        }
    }

    /// The read-counts frame of a big group's present state.
    fn read_counts(&mut self, conversation: &str) -> Option<Arc<SharedFrame<ReadCounts>>> {
        let big = self.big.as_mut()?;
        if big.frame.is_none() {
            let members = &self.members;
            let counts = big.counts.read_counts(|u| members.get(u).map(|m| m.read_view()));
            let delivered_counts = big
                .delivered
                .read_counts(|u| members.get(u).map(|m| m.delivery_view()));
            big.frame = Some(SharedFrame::new(ReadCounts {
                conversation: conversation.to_owned(),
                latest_seq: self.latest_seq,
                member_count: members.len(),
                first_seq: big.counts.first(),
                counts,
                read_by_all_through: read_by_all_through(
                    self.latest_seq,
                    members.values().map(|m| m.read_view()),
                ),
                delivered_counts,
                delivered_to_all_through: read_by_all_through(
                    self.latest_seq,
                    members.values().map(|m| m.delivery_view()),
                ),
            }));
        }
        big.frame.clone()
    }

    fn member_list(&mut self) -> Shared<Vec<MemberState>> {
        self.shared
            .get_or_insert_with(|| {
                Shared(Arc::new(
                    self.members
                        .iter()
                        .map(|(user, m)| m.state(user.clone()))
                        .collect(),
                ))
            })
            .clone()
    }

    /// Sends a present member their snapshot and registers them; tells
    /// anyone else they are not a member.
    fn admit(&mut self, conversation: &str, waiter: Waiter) {
        if !waiter.outbox.wants(conversation) {
            return;
        }
        if !self.members.contains_key(&waiter.user) {
            waiter.outbox.push_control(ServerFrame::error(
                "not_a_member",
                format!("{} is not a present member of {conversation:?}", waiter.user),
                None,
            ));
            return;
        }
        let digest = match waiter.outbox.version() {
            Version::V2 => self.read_counts(conversation),
            Version::V1 => None,
        };
        let members = match digest {
            Some(_) => Shared(Arc::default()),
            None => self.member_list(),
        };
        waiter.outbox.push_control(ServerFrame::Snapshot {
            conversation: conversation.to_owned(),
            latest_seq: self.latest_seq,
            members,
            own: waiter.own,
        });
        if let Some(shared) = digest {
            waiter.outbox.own_on_read_counts(conversation);
            waiter.outbox.push_update(
                Key::ReadCounts {
                    conversation: conversation.to_owned(),
                },
                ServerFrame::ReadCounts { shared, own: None },
            );
        }
        if waiter.outbox.version() == Version::V1 {
            self.v1_subscribers += 1;
        }
        if let Some(old) = self.subscribers.insert(waiter.id, waiter.outbox) {
            self.forget(&old);
        }
    }

    /// Takes a removed subscriber off the counts.
    fn forget(&mut self, outbox: &Outbox) {
        if outbox.version() == Version::V1 {
            self.v1_subscribers -= 1;
        }
    }
}

/// Routes changelog updates to the connections that want them, and keeps
/// each watched conversation's state.
pub struct Hub {
    config: HubConfig,
    next_id: AtomicU64,
    users: RwLock<HashMap<String, HashMap<ConnId, Arc<Outbox>>>>,
    rooms: Mutex<HashMap<String, Room>>,
    threads: Mutex<Threads>,
}

impl Hub {
    /// A hub whose big groups start at `batch_from_members`, with the
    /// default read counts (the newest 512 seqs, 4 frames a second).
    pub fn new(batch_from_members: usize) -> Self {
        Hub::with_config(HubConfig::new(batch_from_members))
    }

    pub fn with_config(config: HubConfig) -> Self {
        Hub {
            config,
            next_id: AtomicU64::new(0),
            users: RwLock::default(),
            rooms: Mutex::default(),
            threads: Mutex::default(),
        }
    }

    fn threads(&self) -> std::sync::MutexGuard<'_, Threads> {
        self.threads.lock().expect("threads lock")
    }

    fn rooms(&self) -> std::sync::MutexGuard<'_, HashMap<String, Room>> {
        self.rooms.lock().expect("rooms lock")
    }

    /// A new v1 connection of `user`; it receives the user's own channel.
    pub fn connect(&self, user: &str) -> (ConnId, Arc<Outbox>) {
        self.connect_with(user, Version::V1)
    }

    /// A new connection of `user` speaking `version`.
    pub fn connect_with(&self, user: &str, version: Version) -> (ConnId, Arc<Outbox>) {
        let outbox = Arc::new(Outbox::new(version));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.users
            .write()
            .expect("users lock")
            .entry(user.to_owned())
            .or_default()
            .insert(id, outbox.clone());
        telemetry::connections(1);
        (id, outbox)
    }

    pub fn disconnect(&self, id: ConnId, user: &str) {
        let (removed, last) = {
            let mut users = self.users.write().expect("users lock");
            let removed = users.get_mut(user).and_then(|c| c.remove(&id));
            let last = users.get(user).is_some_and(HashMap::is_empty);
            if last {
                users.remove(user);
            }
            (removed, last)
        };
        if last {
            self.threads().forget_user(user);
        }
        if let Some(outbox) = removed {
            for conversation in outbox.wanted() {
                self.unsubscribe(id, &conversation, &outbox);
            }
            for (conversation, thread) in outbox.wanted_threads() {
                self.unsubscribe_thread(id, &conversation, thread, &outbox);
            }
            outbox.close();
            telemetry::connections(-1);
        }
    }

    /// Subscribes a connection of `user`: a snapshot once the room is
    /// loaded, then every change. Returns true if the caller must read the
    /// conversation from the stores and hand it to [`Hub::loaded`] (the
    /// first subscriber here); the read starts after this registration, so
    /// it misses nothing the room does not see.
    pub fn subscribe(
        &self,
        id: ConnId,
        conversation: &str,
        user: &str,
        outbox: &Arc<Outbox>,
        own: Option<OwnState>,
    ) -> bool {
        let waiter = Waiter {
            id,
            user: user.to_owned(),
            outbox: outbox.clone(),
            own,
        };
        let mut rooms = self.rooms();
        match rooms.get_mut(conversation) {
            Some(room) if room.loaded => {
                room.admit(conversation, waiter);
                false
            }
            Some(room) => {
                room.waiting.push(waiter);
                false
            }
            None => {
                let room = Room {
                    waiting: vec![waiter],
                    ..Room::default()
                };
                rooms.insert(conversation.to_owned(), room);
                true
            }
        }
    }

    /// The first subscriber's read of the stores: `Ok(None)` for a
    /// conversation they do not know, `Err` when they could not answer
    /// (every waiting subscriber gets `unavailable`).
    pub fn loaded(&self, conversation: &str, read: Result<Option<LoadedConversation>, String>) {
        let mut rooms = self.rooms();
        let Some(room) = rooms.get_mut(conversation) else {
            return;
        };
        match read {
            Err(message) => {
                for waiter in std::mem::take(&mut room.waiting) {
                    waiter
                        .outbox
                        .push_control(ServerFrame::error("unavailable", message.clone(), None));
                }
                rooms.remove(conversation);
                return;
            }
            Ok(loaded) => {
                let loaded = loaded.unwrap_or_default();
                room.latest_seq = loaded.latest_seq;
                // Stores that lag may hold a delivered cursor below the cursor.
                room.members = loaded
                    .members
                    .into_iter()
                    .map(|(user, m)| {
                        let delivered = m.delivered_through();
                        (user, Member { delivered, ..m })
                    })
                    .collect();
                for change in std::mem::take(&mut room.buffered) {
                    room.apply(&change);
                }
                room.loaded = true;
                room.shared = None;
                room.grow(&self.config);
                for (seq, sender) in std::mem::take(&mut room.buffered_sent) {
                    room.sent(seq, sender);
                }
                for waiter in std::mem::take(&mut room.waiting) {
                    room.admit(conversation, waiter);
                }
            }
        }
        if room.subscribers.is_empty() {
            rooms.remove(conversation);
        }
    }

    pub fn unsubscribe(&self, id: ConnId, conversation: &str, outbox: &Outbox) {
        outbox.want(conversation, false);
        let mut rooms = self.rooms();
        if let Some(room) = rooms.get_mut(conversation) {
            if let Some(old) = room.subscribers.remove(&id) {
                room.forget(&old);
            }
            room.waiting.retain(|w| w.id != id);
            if room.loaded && room.subscribers.is_empty() {
                rooms.remove(conversation);
            }
        }
    }

    /// A member's change in `conversation`, for its subscribers: at once in
    /// a small conversation, in the next batch or read counts in a big one.
    pub fn route(&self, conversation: &str, change: MemberChange) {
        let mut rooms = self.rooms();
        let Some(room) = rooms.get_mut(conversation) else {
            return;
        };
        if !room.loaded {
            room.buffered.push(change);
            return;
        }
        Self::route_in(&self.config, conversation, room, change);
    }

    fn route_in(config: &HubConfig, conversation: &str, room: &mut Room, change: MemberChange) {
        let Some((before, after)) = room.apply(&change) else {
            return;
        };
        room.grow(config);
        if let Some(big) = &mut room.big {
            big.moved(before, after);
            room.extend_counts();
            if room.v1_subscribers > 0 {
                room.unsent.insert(change.user, after);
            }
            return;
        }
        let frame = match after {
            Some(m) => ServerFrame::Cursor {
                conversation: conversation.to_owned(),
                user: change.user.clone(),
                cursor: m.cursor,
                delivered: m.delivered_through(),
                join_seq: m.join_seq,
                latest_seq: room.latest_seq,
            },
            None => ServerFrame::Left {
                conversation: conversation.to_owned(),
                user: change.user.clone(),
            },
        };
        let key = Key::Member {
            conversation: conversation.to_owned(),
            user: change.user,
        };
        for outbox in room.subscribers.values() {
            outbox.push_update(key.clone(), frame.clone());
        }
    }

    /// A public read receipt or a delivery report the broker took from
    /// `user`: the fold will max-merge it into their cursor or delivered
    /// cursor, so this gateway's room shows it now rather than after the
    /// processor's flush.
    pub fn receipt_taken(&self, conversation: &str, user: &str, reached: Reached, seq: u64) {
        let mut rooms = self.rooms();
        let Some(room) = rooms.get_mut(conversation).filter(|r| r.loaded) else {
            return;
        };
        let Some(m) = room.members.get(user).copied() else {
            return;
        };
        let member = match reached {
            Reached::Read => Member { cursor: seq, ..m },
            Reached::Delivered => Member { delivered: seq, ..m },
        };
        let change = MemberChange {
            user: user.to_owned(),
            member: Some(member),
            latest_seq: 0,
        };
        Self::route_in(&self.config, conversation, room, change);
    }

    /// Whether a room here already shows `user`'s messages delivered
    /// through `seq` (as the changelog or a report the broker took has it).
    pub fn shows_delivered(&self, conversation: &str, user: &str, seq: u64) -> bool {
        let rooms = self.rooms();
        rooms
            .get(conversation)
            .filter(|r| r.loaded)
            .and_then(|r| r.members.get(user))
            .is_some_and(|m| m.delivered_through() >= seq)
    }

    /// Message `seq` of `conversation` was sent by `sender` (from the input
    /// topic): a big group counts its readers from now on.
    pub fn message_sent(&self, conversation: &str, seq: u64, sender: &str) {
        let mut rooms = self.rooms();
        let Some(room) = rooms.get_mut(conversation) else {
            return;
        };
        if room.loaded {
            room.sent(seq, sender.to_owned());
        } else {
            room.buffered_sent.push((seq, sender.to_owned()));
        }
    }

    /// Sends each big group's gathered changes as one `cursors` frame to
    /// each of its v1 subscribers. Called once per batch interval.
    pub fn send_batches(&self) {
        let mut rooms = self.rooms();
        for (conversation, room) in rooms.iter_mut().filter(|(_, r)| !r.unsent.is_empty()) {
            let (mut members, mut left) = (Vec::new(), Vec::new());
            for (user, member) in std::mem::take(&mut room.unsent) {
                match member {
                    Some(m) => members.push(m.state(user)),
                    None => left.push(user),
                }
            }
            let frame = ServerFrame::Cursors {
                conversation: conversation.clone(),
                latest_seq: room.latest_seq,
                members,
                left,
            };
            for outbox in room.subscribers.values().filter(|o| o.version() == Version::V1) {
                outbox.push_batch(frame.clone());
            }
        }
    }

    /// Sends each big group's v2 subscribers of a due phase (see
    /// [`PHASES`]) the group's read counts, when they changed since that
    /// phase's last frame, at least the read-counts interval ago. Called
    /// often (every few ms), so that a quiet group's first change goes out
    /// soon.
    pub fn send_read_counts(&self, now: Instant) {
        let interval = self.config.read_counts_interval;
        let mut rooms = self.rooms();
        for (conversation, room) in rooms.iter_mut() {
            let Some(phase) = room.big.as_ref().and_then(|big| big.due_phase(now, interval)) else {
                continue;
            };
            if room.subscribers.len() == room.v1_subscribers {
                continue;
            }
            let Some(frame) = room.read_counts(conversation) else {
                continue;
            };
            if let Some(big) = &mut room.big {
                big.phases[phase] = Phase {
                    pending: false,
                    sent_at: Some(now),
                };
                big.phase_sent_at = Some(now);
            }
            let key = Key::ReadCounts {
                conversation: conversation.clone(),
            };
            let in_phase = room
                .subscribers
                .iter()
                .filter(|(id, o)| **id as usize % PHASES == phase && o.version() == Version::V2);
            for (_, outbox) in in_phase {
                let frame = ServerFrame::ReadCounts {
                    shared: frame.clone(),
                    own: None,
                };
                outbox.push_update(key.clone(), frame);
            }
        }
    }

    /// Whether `user` is a present member of `conversation`, and the
    /// highest seq known there, if a room here knows (someone here
    /// subscribes to it).
    pub fn membership(&self, conversation: &str, user: &str) -> Option<(bool, u64)> {
        let rooms = self.rooms();
        let room = rooms.get(conversation).filter(|r| r.loaded)?;
        Some((room.members.contains_key(user), room.top()))
    }

    /// An update for every connection of `user`. An `own` frame gets the
    /// user's thread unread in its conversation.
    pub fn to_user(&self, user: &str, mut frame: ServerFrame) {
        let ServerFrame::Own {
            conversation, own, ..
        } = &mut frame
        else {
            return self.push_to_user(user, frame);
        };
        // Its v2 subscribers take it with the next read counts: one is due.
        if let Some(big) = self
            .rooms()
            .get_mut(conversation.as_str())
            .and_then(|r| r.big.as_mut())
        {
            big.changed();
        }
        // Counted and pushed under the threads lock, so that the frames
        // carrying a conversation's thread unread are pushed in the order
        // of their counts.
        let threads = self.threads();
        own.thread_unread = threads.unread_in(user, conversation);
        self.push_to_user(user, frame);
    }

    /// Conversations with at least one subscriber here.
    pub fn watched_conversations(&self) -> usize {
        self.rooms().len()
    }

    fn push_to_user(&self, user: &str, frame: ServerFrame) {
        let Some(key) = Key::of(&frame) else { return };
        let users = self.users.read().expect("users lock");
        for outbox in users.get(user).into_iter().flat_map(HashMap::values) {
            outbox.push_update(key.clone(), frame.clone());
        }
    }

    fn connected(&self, user: &str) -> bool {
        self.users.read().expect("users lock").contains_key(user)
    }

    /// The user's own state in a thread they follow, from the stores or
    /// the by-user thread changelog (`None`: they left the conversation):
    /// max-merged and pushed to their devices, if they are connected here.
    pub fn own_thread(&self, user: &str, conversation: &str, thread: u64, own: Option<ThreadOwn>) {
        let mut threads = self.threads();
        if !self.connected(user) {
            return;
        }
        let frame = threads.own(user, &(conversation.to_owned(), thread), own);
        self.push_to_user(user, frame);
    }

    /// A reply `thread_seq` in a thread (from the input topic): its
    /// connected followers' unread goes up now, not at the next flush.
    pub fn reply_sent(&self, conversation: &str, thread: u64, thread_seq: u64, sender: &str) {
        let mut threads = self.threads();
        let id = (conversation.to_owned(), thread);
        for (user, frame) in threads.reply(&id, thread_seq, sender, Instant::now()) {
            self.push_to_user(&user, frame);
        }
    }

    /// The user's unread over the threads of `conversation` they follow,
    /// as known here.
    pub fn thread_unread(&self, user: &str, conversation: &str) -> u64 {
        self.threads().unread_in(user, conversation)
    }

    /// Subscribes a connection to a thread's cursors: every change from
    /// now on; the caller reads the stores for its `thread_snapshot`
    /// after this, so that it misses nothing.
    pub fn subscribe_thread(&self, id: ConnId, conversation: &str, thread: u64, outbox: &Arc<Outbox>) {
        self.threads()
            .subscribe((conversation.to_owned(), thread), id, outbox.clone());
    }

    pub fn unsubscribe_thread(&self, id: ConnId, conversation: &str, thread: u64, outbox: &Outbox) {
        outbox.want_thread(conversation, thread, false);
        self.threads().unsubscribe(&(conversation.to_owned(), thread), id);
    }

    /// A follower's public cursor in a thread (`None`: they left), for the
    /// thread's subscribers here.
    pub fn route_thread(&self, conversation: &str, thread: u64, user: &str, change: Option<(u64, u64, u64)>) {
        let threads = self.threads();
        let id = (conversation.to_owned(), thread);
        let frame = match change {
            Some((cursor, join_seq, latest_seq)) => ServerFrame::ThreadCursor {
                conversation: conversation.to_owned(),
                thread,
                user: user.to_owned(),
                cursor,
                join_seq,
                latest_seq,
            },
            None => ServerFrame::ThreadLeft {
                conversation: conversation.to_owned(),
                thread,
                user: user.to_owned(),
            },
        };
        let key = Key::ThreadMember {
            conversation: conversation.to_owned(),
            thread,
            user: user.to_owned(),
        };
        for outbox in threads.subscribers(&id) {
            outbox.push_update(key.clone(), frame.clone());
        }
    }

    /// Threads with a subscriber or a connected follower here.
    pub fn watched_threads(&self) -> usize {
        self.threads().watched()
    }
}

/// What a connection has shown, so that no frame shows a lower value than
/// one shown before: every frame's `latest_seq` in each conversation, its
/// own cursors, and the members' cursors and delivered cursors of small
/// conversations (a resubscription's snapshot, read from stores that may
/// lag the changelog, or updates queued at different times and sent in key
/// order, could otherwise go back). A member's cursors are kept per
/// membership: a rejoin (a higher `join_seq`) starts anew.
///
/// The user's unread mark, unread mentions and mute go either way, so they
/// cannot be raised: what is shown of them is the newest state known. The
/// by-user changelog is ordered per key, so its records replace what was
/// shown, unless one is behind the own cursors shown (it predates a
/// snapshot from a store that was ahead of it). A snapshot's, read from
/// stores that may lag, is taken only until the changelog has shown the
/// conversation's: every own change reaches every connection of the user,
/// so from then on the changelog keeps what is shown current.
pub struct Shown {
    /// Member cursors are kept for conversations below this many members.
    small_below: usize,
    latest: HashMap<String, u64>,
    own: HashMap<String, ShownOwn>,
    members: HashMap<(String, String), Member>,
    /// Followers' cursors in subscribed threads, per membership as members'.
    thread_members: HashMap<(String, u64, String), Member>,
    /// The last badge frame shown.
    badge: Option<ServerFrame>,
}

/// The own state shown in a conversation, and whether it came from the
/// changelog.
#[derive(Clone, Copy)]
struct ShownOwn {
    state: OwnState,
    from_changelog: bool,
}

/// Where an own state comes from: a snapshot's read of the stores, or the
/// by-user changelog (an `own` frame, or the own part of read counts).
#[derive(Clone, Copy, PartialEq, Eq)]
enum OwnFrom {
    Stores,
    Changelog,
}

impl Default for Shown {
    fn default() -> Self {
        Shown::new(usize::MAX)
    }
}

impl Shown {
    pub fn new(small_below: usize) -> Self {
        Shown {
            small_below,
            latest: HashMap::new(),
            own: HashMap::new(),
            members: HashMap::new(),
            thread_members: HashMap::new(),
            badge: None,
        }
    }

    /// Whether `frame` shows something new; records it if so, and raises
    /// what it shows to what was shown already.
    pub fn admit(&mut self, frame: &mut ServerFrame) -> bool {
        let mut fresh = true;
        if let Some((conversation, latest_seq)) = frame.latest_seq() {
            match self.latest.get_mut(conversation) {
                Some(shown) if *shown > latest_seq => frame.set_latest_seq(*shown),
                Some(shown) => *shown = latest_seq,
                None => {
                    self.latest.insert(conversation.to_owned(), latest_seq);
                }
            }
        }
        match frame {
            ServerFrame::Snapshot {
                conversation,
                own,
                members,
                ..
            } => {
                if let Some(o) = own {
                    self.raise_own(conversation, o, OwnFrom::Stores);
                }
                if members.0.len() < self.small_below {
                    // The shared list is copied only when a cursor is raised.
                    let mut raised = Vec::new();
                    for (i, m) in members.0.iter().enumerate() {
                        let key = (conversation.clone(), m.user.clone());
                        let mut member = Member {
                            cursor: m.cursor,
                            delivered: m.delivered,
                            join_seq: m.join_seq,
                        };
                        self.raise_member(key, &mut member);
                        if (member.cursor, member.delivered) != (m.cursor, m.delivered) {
                            raised.push((i, member));
                        }
                    }
                    if !raised.is_empty() {
                        let mut list = (*members.0).clone();
                        for (i, member) in raised {
                            (list[i].cursor, list[i].delivered) = (member.cursor, member.delivered);
                        }
                        *members = Shared(Arc::new(list));
                    }
                }
            }
            ServerFrame::Own {
                conversation, own, ..
            } => {
                fresh = self.raise_own(conversation, own, OwnFrom::Changelog);
            }
            ServerFrame::Cursor {
                conversation,
                user,
                cursor,
                delivered,
                join_seq,
                ..
            } => {
                let mut member = Member {
                    cursor: *cursor,
                    delivered: *delivered,
                    join_seq: *join_seq,
                };
                fresh = self.raise_member((conversation.clone(), user.clone()), &mut member);
                (*cursor, *delivered) = (member.cursor, member.delivered);
            }
            ServerFrame::Left { conversation, user } => {
                self.members.remove(&(conversation.clone(), user.clone()));
            }
            ServerFrame::ThreadSnapshot {
                conversation,
                thread,
                followers,
                ..
            } => {
                for f in followers {
                    let key = (conversation.clone(), *thread, f.user.clone());
                    let mut member = Member {
                        cursor: f.cursor,
                        delivered: f.cursor,
                        join_seq: f.join_seq,
                    };
                    raise_member(&mut self.thread_members, key, &mut member);
                    f.cursor = member.cursor;
                }
            }
            ServerFrame::ThreadCursor {
                conversation,
                thread,
                user,
                cursor,
                join_seq,
                ..
            } => {
                let mut member = Member {
                    cursor: *cursor,
                    delivered: *cursor,
                    join_seq: *join_seq,
                };
                let key = (conversation.clone(), *thread, user.clone());
                fresh = raise_member(&mut self.thread_members, key, &mut member);
                *cursor = member.cursor;
            }
            ServerFrame::ThreadLeft {
                conversation,
                thread,
                user,
            } => {
                self.thread_members
                    .remove(&(conversation.clone(), *thread, user.clone()));
            }
            ServerFrame::ReadCounts { shared, own: Some(o) } => {
                self.raise_own(&shared.value.conversation, o, OwnFrom::Changelog);
            }
            // A badge goes either way, so it is never raised: an older one
            // than shown, or the one shown again, is dropped.
            ServerFrame::Badge { updated_at, .. } => {
                fresh = match &self.badge {
                    Some(shown @ ServerFrame::Badge { updated_at: at, .. }) => {
                        *updated_at > *at || (*updated_at == *at && shown != frame)
                    }
                    _ => true,
                };
                if fresh {
                    self.badge = Some(frame.clone());
                }
            }
            _ => {}
        }
        fresh
    }

    /// Raises own cursors to what was shown in `conversation`, keeps the
    /// mark, mentions and mute shown when `own` may be older (see
    /// [`Shown`]), and records the result; whether it shows something new.
    fn raise_own(&mut self, conversation: &str, own: &mut OwnState, from: OwnFrom) -> bool {
        let Some(shown) = self.own.get_mut(conversation) else {
            self.own.insert(
                conversation.to_owned(),
                ShownOwn {
                    state: *own,
                    from_changelog: from == OwnFrom::Changelog,
                },
            );
            return true;
        };
        let was = shown.state;
        let behind = own.cursor < was.cursor || own.private_cursor < was.private_cursor;
        if behind || (from == OwnFrom::Stores && shown.from_changelog) {
            own.unread_mark = was.unread_mark;
            own.unread_mentions = was.unread_mentions;
            own.muted_until = was.muted_until;
        }
        own.cursor = own.cursor.max(was.cursor);
        own.private_cursor = own.private_cursor.max(was.private_cursor);
        shown.state = *own;
        shown.from_changelog |= from == OwnFrom::Changelog;
        *own != was
    }

    fn raise_member(&mut self, key: (String, String), member: &mut Member) -> bool {
        raise_member(&mut self.members, key, member)
    }
}

/// Raises a member's cursor and delivered cursor to what was shown of the
/// same membership; whether it shows something new (false for an older
/// membership).
fn raise_member<K: Eq + std::hash::Hash>(
    shown: &mut HashMap<K, Member>,
    key: K,
    member: &mut Member,
) -> bool {
    match shown.get_mut(&key) {
        Some(shown) if member.join_seq < shown.join_seq => false,
        Some(shown) if member.join_seq == shown.join_seq => {
            let fresh = member.cursor > shown.cursor || member.delivered > shown.delivered;
            member.cursor = member.cursor.max(shown.cursor);
            member.delivered = member.delivered.max(shown.delivered);
            *shown = *member;
            fresh
        }
        _ => {
            shown.insert(key, *member);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ReadCounts, MUTED_UNTIL_UNMUTED};

    fn cursor(c: &str, u: &str, n: u64) -> ServerFrame {
        ServerFrame::Cursor {
            conversation: c.into(),
            user: u.into(),
            cursor: n,
            delivered: n,
            join_seq: 1,
            latest_seq: n,
        }
    }

    /// An own frame of the user's cursors, nothing else set.
    fn own_frame(conversation: &str, cursor: u64, private_cursor: u64, latest_seq: u64) -> ServerFrame {
        ServerFrame::Own {
            conversation: conversation.into(),
            own: OwnState {
                cursor,
                private_cursor,
                ..OwnState::default()
            },
            latest_seq,
        }
    }

    fn change(u: &str, n: u64) -> MemberChange {
        MemberChange {
            user: u.into(),
            member: Some(Member {
                cursor: n,
                delivered: n,
                join_seq: 1,
            }),
            latest_seq: n,
        }
    }

    fn left(u: &str) -> MemberChange {
        MemberChange {
            user: u.into(),
            member: None,
            latest_seq: 0,
        }
    }

    fn loaded(members: &[(&str, u64)]) -> Result<Option<LoadedConversation>, String> {
        Ok(Some(LoadedConversation {
            latest_seq: members.iter().map(|m| m.1).max().unwrap_or(0),
            members: members
                .iter()
                .map(|(u, n)| {
                    (
                        u.to_string(),
                        Member {
                            cursor: *n,
                            delivered: *n,
                            join_seq: 1,
                        },
                    )
                })
                .collect(),
        }))
    }

    /// Connects `user` and subscribes it to `c`; whether it must load.
    fn join(hub: &Hub, user: &str, c: &str) -> (ConnId, Arc<Outbox>, bool) {
        let (id, outbox) = hub.connect(user);
        outbox.want(c, true);
        let load = hub.subscribe(id, c, user, &outbox, None);
        (id, outbox, load)
    }

    fn snapshot_members(frame: &ServerFrame) -> Vec<(String, u64)> {
        match frame {
            ServerFrame::Snapshot { members, .. } => {
                members.0.iter().map(|m| (m.user.clone(), m.cursor)).collect()
            }
            other => panic!("not a snapshot: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_busy_outbox_coalesces_to_the_latest_value_per_key() {
        let outbox = Outbox::default();
        outbox.push_control(ServerFrame::Pong);
        for n in 1..=1000 {
            outbox.push_update(
                Key::Member {
                    conversation: "G".into(),
                    user: "u".into(),
                },
                cursor("G", "u", n),
            );
        }
        outbox.push_update(
            Key::Member {
                conversation: "G".into(),
                user: "v".into(),
            },
            cursor("G", "v", 7),
        );
        let frames = outbox.take().await.unwrap();
        assert_eq!(
            frames,
            [ServerFrame::Pong, cursor("G", "u", 1000), cursor("G", "v", 7)]
        );
        outbox.close();
        assert!(outbox.take().await.is_none());
    }

    #[tokio::test]
    async fn the_first_subscriber_loads_and_changes_meanwhile_are_not_lost() {
        let hub = Hub::new(100);
        let (_, alice, must_load) = join(&hub, "alice", "G");
        assert!(must_load);
        let (_, bob, must_load) = join(&hub, "bob", "G");
        assert!(!must_load, "one read of the stores per room");
        // Committed after the read started, so maybe not in it: buffered.
        hub.route("G", change("bob", 9));
        hub.route("G", left("carol"));
        hub.loaded("G", loaded(&[("alice", 3), ("bob", 5), ("carol", 2)]));
        let a = alice.take().await.unwrap();
        assert_eq!(snapshot_members(&a[0]), [("alice".into(), 3), ("bob".into(), 9)]);
        assert_eq!(snapshot_members(&bob.take().await.unwrap()[0]).len(), 2);
        // A later subscriber's snapshot comes from the room, with no read.
        hub.route("G", change("alice", 4));
        let (_, bob2, must_load) = join(&hub, "bob", "G");
        assert!(!must_load);
        assert_eq!(
            snapshot_members(&bob2.take().await.unwrap()[0]),
            [("alice".into(), 4), ("bob".into(), 9)]
        );
        assert_eq!(hub.membership("G", "bob"), Some((true, 9)));
        assert_eq!(hub.membership("G", "carol"), Some((false, 9)));
    }

    #[tokio::test]
    async fn strangers_and_failed_reads_get_errors_and_leave_no_room() {
        let hub = Hub::new(100);
        let (_, eve, _) = join(&hub, "eve", "G");
        hub.loaded("G", loaded(&[("alice", 1)]));
        let frames = eve.take().await.unwrap();
        assert!(matches!(
            &frames[0],
            ServerFrame::Error {
                code: "not_a_member",
                ..
            }
        ));
        assert_eq!(hub.watched_conversations(), 0);
        let (_, alice, _) = join(&hub, "alice", "G");
        hub.loaded("G", Err("redis is down".into()));
        let frames = alice.take().await.unwrap();
        assert!(matches!(
            &frames[0],
            ServerFrame::Error {
                code: "unavailable",
                ..
            }
        ));
        assert_eq!(hub.watched_conversations(), 0);
    }

    #[tokio::test]
    async fn a_room_never_lowers_a_cursor_and_shows_a_rejoin() {
        let hub = Hub::new(100);
        let (_, alice, _) = join(&hub, "alice", "G");
        hub.loaded("G", loaded(&[("alice", 1), ("bob", 5)]));
        alice.take().await.unwrap();
        hub.route("G", change("bob", 3));
        hub.route("G", change("bob", 5));
        assert_eq!(
            alice.pending_updates(),
            0,
            "stale and duplicate changes show nothing"
        );
        hub.route("G", change("bob", 6));
        assert_eq!(alice.take().await.unwrap(), [cursor("G", "bob", 6)]);
        // A rejoin is a new membership: its join_seq tells it apart.
        hub.route("G", left("bob"));
        hub.route(
            "G",
            MemberChange {
                user: "bob".into(),
                member: Some(Member {
                    cursor: 6,
                    delivered: 6,
                    join_seq: 7,
                }),
                latest_seq: 7,
            },
        );
        let rejoined = alice.take().await.unwrap();
        assert_eq!(rejoined.len(), 1, "the departure and the rejoin coalesce");
        assert!(matches!(
            &rejoined[0],
            ServerFrame::Cursor {
                cursor: 6,
                join_seq: 7,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn a_big_group_sends_one_batch_per_interval_and_batches_coalesce() {
        let hub = Hub::new(3);
        let (_, alice, _) = join(&hub, "alice", "G");
        hub.loaded("G", loaded(&[("alice", 1), ("bob", 1), ("carol", 1)]));
        alice.take().await.unwrap();
        for n in 2..=50 {
            hub.route("G", change("bob", n));
            hub.route("G", change("carol", n));
        }
        assert_eq!(alice.pending_updates(), 0, "nothing until the interval");
        hub.send_batches();
        // A slow client: the next batch merges into the unsent one.
        hub.route("G", change("bob", 51));
        hub.route("G", left("carol"));
        hub.send_batches();
        hub.send_batches();
        let frames = alice.take().await.unwrap();
        assert_eq!(
            frames,
            [ServerFrame::Cursors {
                conversation: "G".into(),
                latest_seq: 51,
                members: vec![MemberState {
                    user: "bob".into(),
                    cursor: 51,
                    delivered: 51,
                    join_seq: 1
                }],
                left: vec!["carol".into()],
            }]
        );
    }

    #[tokio::test]
    async fn a_single_update_never_overtakes_an_unsent_batch() {
        let outbox = Outbox::default();
        outbox.push_batch(ServerFrame::Cursors {
            conversation: "G".into(),
            latest_seq: 5,
            members: vec![MemberState {
                user: "u".into(),
                cursor: 5,
                delivered: 5,
                join_seq: 1,
            }],
            left: vec![],
        });
        outbox.push_update(
            Key::Member {
                conversation: "G".into(),
                user: "u".into(),
            },
            cursor("G", "u", 6),
        );
        let frames = outbox.take().await.unwrap();
        assert!(
            matches!(&frames[..], [ServerFrame::Cursors { members, .. }] if members[0].cursor == 6),
            "{frames:?}"
        );
        // And a batch replaces older single updates of the members it names.
        outbox.push_update(
            Key::Member {
                conversation: "G".into(),
                user: "u".into(),
            },
            cursor("G", "u", 7),
        );
        outbox.push_batch(ServerFrame::Cursors {
            conversation: "G".into(),
            latest_seq: 8,
            members: vec![MemberState {
                user: "u".into(),
                cursor: 8,
                delivered: 8,
                join_seq: 1,
            }],
            left: vec![],
        });
        let frames = outbox.take().await.unwrap();
        assert_eq!(frames.len(), 1, "{frames:?}");
    }

    #[tokio::test]
    async fn an_unsubscribe_before_the_snapshot_registers_nothing() {
        let hub = Hub::new(100);
        let (id, alice, _) = join(&hub, "alice", "G");
        hub.unsubscribe(id, "G", &alice);
        hub.loaded("G", loaded(&[("alice", 1)]));
        assert_eq!(hub.watched_conversations(), 0);
        assert_eq!(alice.pending_updates(), 0);
    }

    fn own_state(
        cursor: u64,
        private_cursor: u64,
        unread_mentions: u32,
        muted_until: Option<u64>,
    ) -> OwnState {
        OwnState {
            cursor,
            private_cursor,
            unread_mark: false,
            unread_mentions,
            muted_until,
            thread_unread: 0,
        }
    }

    fn own_of(own: OwnState) -> ServerFrame {
        ServerFrame::Own {
            conversation: "G".into(),
            own,
            latest_seq: 9,
        }
    }

    fn admitted(shown: &mut Shown, mut frame: ServerFrame) -> Option<ServerFrame> {
        shown.admit(&mut frame).then_some(frame)
    }

    #[test]
    fn an_own_cursor_shown_is_never_lowered() {
        let mut shown = Shown::default();
        let own = |c, p, m| {
            own_of(OwnState {
                unread_mark: m,
                ..own_state(c, p, 0, None)
            })
        };
        assert!(shown.admit(&mut own(2, 4, false)));
        assert_eq!(admitted(&mut shown, own(1, 3, false)), None);
        assert_eq!(
            admitted(&mut shown, own(2, 4, true)),
            Some(own(2, 4, true)),
            "a mark is news"
        );
        // A record behind the cursors shown predates them: its mark too.
        assert_eq!(admitted(&mut shown, own(1, 3, false)), None);
    }

    #[test]
    fn mentions_and_mutes_shown_go_either_way_as_the_changelog_has_them() {
        let mut shown = Shown::default();
        assert!(admitted(&mut shown, own_of(own_state(3, 0, 0, None))).is_some());
        // Mentioned twice, then muted: each alone is news.
        let mentioned = own_of(own_state(3, 0, 2, None));
        assert_eq!(admitted(&mut shown, mentioned.clone()), Some(mentioned));
        let muted = own_of(own_state(3, 0, 2, Some(MUTED_UNTIL_UNMUTED)));
        assert_eq!(admitted(&mut shown, muted.clone()), Some(muted));
        // Reading privately past one mention brings the count down.
        let read = own_of(own_state(3, 5, 1, Some(MUTED_UNTIL_UNMUTED)));
        assert_eq!(admitted(&mut shown, read.clone()), Some(read));
        // An unmute, and the same state again (nothing new).
        let unmuted = own_of(own_state(3, 5, 1, None));
        assert_eq!(admitted(&mut shown, unmuted.clone()), Some(unmuted.clone()));
        assert_eq!(admitted(&mut shown, unmuted), None);
        // A record behind the cursors shown (from before the read) is older
        // in everything: its two mentions and mute do not come back.
        assert_eq!(admitted(&mut shown, own_of(own_state(3, 0, 2, Some(7)))), None);
    }

    #[test]
    fn a_snapshots_own_state_from_lagging_stores_takes_nothing_back() {
        let snapshot = |own| ServerFrame::Snapshot {
            conversation: "G".into(),
            latest_seq: 9,
            members: Shared(Arc::default()),
            own: Some(own),
        };
        let own_in = |frame: &ServerFrame| match frame {
            ServerFrame::Snapshot { own: Some(own), .. } => *own,
            other => panic!("{other:?}"),
        };
        // Before the changelog said anything, the stores are the best known.
        let mut shown = Shown::default();
        let mut first = snapshot(own_state(3, 0, 4, Some(50)));
        assert!(shown.admit(&mut first));
        assert_eq!(own_in(&first), own_state(3, 0, 4, Some(50)));
        let mut again = snapshot(own_state(3, 0, 5, None));
        shown.admit(&mut again);
        assert_eq!(own_in(&again), own_state(3, 0, 5, None));
        // Once it has, the changelog keeps what is shown current: stores
        // that lag it show neither an old count nor an old mute, nor a
        // lower cursor.
        let unmuted = own_of(own_state(6, 0, 1, None));
        assert!(admitted(&mut shown, unmuted).is_some());
        let mut stale = snapshot(own_state(4, 0, 3, Some(50)));
        shown.admit(&mut stale);
        assert_eq!(own_in(&stale), own_state(6, 0, 1, None));
        // Nor a store that is ahead: the changelog's record of it follows.
        let mut ahead = snapshot(own_state(8, 0, 0, Some(90)));
        shown.admit(&mut ahead);
        assert_eq!(own_in(&ahead), own_state(8, 0, 1, None));
        let caught_up = own_of(own_state(8, 0, 0, Some(90)));
        assert_eq!(admitted(&mut shown, caught_up.clone()), Some(caught_up));
        // The older record the changelog still had queued shows nothing.
        assert_eq!(admitted(&mut shown, own_of(own_state(6, 0, 1, None))), None);
    }

    /// Frames as a session writes them: through its [`Shown`].
    async fn shown_frames(outbox: &Outbox, shown: &mut Shown) -> Vec<ServerFrame> {
        let mut frames = outbox.take().await.unwrap();
        frames.retain_mut(|f| shown.admit(f));
        frames
    }

    #[tokio::test]
    async fn latest_seq_never_goes_back_across_updates_sent_in_key_order() {
        let hub = Hub::new(100);
        let (_, alice, _) = join(&hub, "alice", "G");
        hub.loaded("G", loaded(&[("alice", 1), ("amy", 1), ("zed", 1)]));
        let mut shown = Shown::new(100);
        shown_frames(&alice, &mut shown).await;
        // zed's message 20, then amy's 21: queued in that order, sent in
        // user-id order.
        hub.route("G", change("zed", 20));
        hub.route("G", change("amy", 21));
        let frames = shown_frames(&alice, &mut shown).await;
        let latest: Vec<u64> = frames
            .iter()
            .filter_map(|f| f.latest_seq())
            .map(|l| l.1)
            .collect();
        assert_eq!(latest, [21, 21], "{frames:?}");
        // An own frame queued earlier does not take it back either.
        hub.to_user("alice", own_frame("G", 19, 19, 19));
        let frames = shown_frames(&alice, &mut shown).await;
        assert!(
            matches!(&frames[..], [ServerFrame::Own { latest_seq: 21, .. }]),
            "{frames:?}"
        );
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A member's cursor, how far their delivered cursor is ahead of it,
        /// and the latest seq the changelog gives with them.
        Change(u8, u64, u64, u64),
        /// The by-user changelog's next record of alice's own state: her
        /// cursor (not below the last one's: the changelog is ordered),
        /// unread mentions, mute, and the latest seq.
        Own(u64, u32, Option<u64>, u64),
        Write,
        /// Unsubscribe and subscribe again over stores that lag by this much.
        Resubscribe(u64),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..4u8, 1..40u64, 0..8u64, 0..40u64).prop_map(|(u, c, d, l)| Step::Change(u, c, d, l)),
            2 => (0..40u64, 0..5u32, proptest::option::of(0..3u64), 0..40u64)
                .prop_map(|(c, n, m, l)| Step::Own(c, n, m, l)),
            2 => Just(Step::Write),
            1 => (0..20u64).prop_map(Step::Resubscribe),
        ]
    }

    /// Plays `steps` and checks that no written frame shows a lower latest
    /// seq, member cursor, delivered cursor or own cursor than one written
    /// before, nor a delivered cursor below the cursor; that an own frame
    /// shows the newest own state; and that a snapshot's own state, from
    /// stores that lag, takes back no mention count or mute the changelog
    /// showed.
    async fn never_lower(steps: Vec<Step>) {
        let users = ["alice", "bob", "carol", "dave"];
        let hub = Hub::new(100);
        let (id, alice, _) = join(&hub, "alice", "G");
        // Stores that lag, the delivered cursor further (below the cursor, even).
        let stores = |lag: u64, truth: &BTreeMap<String, (u64, u64)>, latest: u64| LoadedConversation {
            latest_seq: latest.saturating_sub(lag),
            members: users
                .iter()
                .map(|u| {
                    let (cursor, delivered) = truth.get(*u).copied().unwrap_or_default();
                    let member = Member {
                        cursor: cursor.saturating_sub(lag),
                        delivered: delivered.saturating_sub(2 * lag),
                        join_seq: 1,
                    };
                    (u.to_string(), member)
                })
                .collect(),
        };
        let (mut truth, mut latest) = (BTreeMap::new(), 0);
        hub.loaded("G", Ok(Some(stores(0, &truth, latest))));
        let mut shown = Shown::new(100);
        let (mut seen_latest, mut seen_member, mut seen_own) = (0, HashMap::new(), 0);
        // alice's own states in the changelog's order; what an own frame
        // last showed of her mentions and mute.
        let mut own_history: Vec<OwnState> = Vec::new();
        let mut changelog_shown: Option<(u32, Option<u64>)> = None;
        for step in steps.into_iter().chain([Step::Write]) {
            match step {
                Step::Change(u, cursor, ahead, l) => {
                    let user = users[u as usize].to_string();
                    let delivered = cursor + ahead;
                    let t = truth.entry(user.clone()).or_insert((0, 0));
                    *t = (t.0.max(cursor), t.1.max(delivered));
                    latest = latest.max(l);
                    let member = Member {
                        cursor,
                        delivered,
                        join_seq: 1,
                    };
                    hub.route(
                        "G",
                        MemberChange {
                            user,
                            member: Some(member),
                            latest_seq: l,
                        },
                    );
                }
                Step::Own(cursor, mentions, muted_until, l) => {
                    let own = OwnState {
                        cursor: own_history.last().map_or(cursor, |o| o.cursor.max(cursor)),
                        unread_mentions: mentions,
                        muted_until,
                        ..OwnState::default()
                    };
                    own_history.push(own);
                    hub.to_user(
                        "alice",
                        ServerFrame::Own {
                            conversation: "G".into(),
                            own,
                            latest_seq: l,
                        },
                    );
                }
                Step::Resubscribe(lag) => {
                    hub.unsubscribe(id, "G", &alice);
                    alice.want("G", true);
                    // The stores' own state is one `lag` records old.
                    let stale = own_history
                        .len()
                        .checked_sub(1 + lag as usize)
                        .map(|i| own_history[i]);
                    if hub.subscribe(id, "G", "alice", &alice, stale) {
                        hub.loaded("G", Ok(Some(stores(lag, &truth, latest))));
                    }
                }
                Step::Write => {
                    if alice.pending_updates() == 0 && alice.lock().control.is_empty() {
                        continue;
                    }
                    for frame in shown_frames(&alice, &mut shown).await {
                        if let Some((_, l)) = frame.latest_seq() {
                            assert!(l >= seen_latest, "latest {l} after {seen_latest}: {frame:?}");
                            seen_latest = l;
                        }
                        let mut members = Vec::new();
                        match &frame {
                            ServerFrame::Cursor {
                                user,
                                cursor,
                                delivered,
                                ..
                            } => members.push((user.clone(), *cursor, *delivered)),
                            ServerFrame::Snapshot {
                                members: list, own, ..
                            } => {
                                members
                                    .extend(list.0.iter().map(|m| (m.user.clone(), m.cursor, m.delivered)));
                                if let Some(own) = own {
                                    assert!(own.cursor >= seen_own, "own {} after {seen_own}", own.cursor);
                                    seen_own = own.cursor;
                                    if let Some(shown) = changelog_shown {
                                        assert_eq!((own.unread_mentions, own.muted_until), shown);
                                    }
                                }
                            }
                            ServerFrame::Own { own, .. } => {
                                assert!(own.cursor >= seen_own, "own {} after {seen_own}", own.cursor);
                                seen_own = own.cursor;
                                assert_eq!(Some(own), own_history.last(), "not the newest own state");
                                changelog_shown = Some((own.unread_mentions, own.muted_until));
                            }
                            _ => {}
                        }
                        for (user, cursor, delivered) in members {
                            assert!(
                                delivered >= cursor,
                                "{user}: delivered {delivered} < cursor {cursor}"
                            );
                            let seen = seen_member.entry(user.clone()).or_insert((0, 0));
                            assert!(cursor >= seen.0, "{user}: {cursor} after {}", seen.0);
                            assert!(
                                delivered >= seen.1,
                                "{user}: delivered {delivered} after {}",
                                seen.1
                            );
                            *seen = (cursor, delivered);
                        }
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn no_frame_shows_a_lower_value_than_one_shown(steps in proptest::collection::vec(step(), 0..60)) {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(never_lower(steps));
        }
    }

    fn read_counts_of(frames: &[ServerFrame]) -> Option<ReadCounts> {
        frames.iter().find_map(|f| match f {
            ServerFrame::ReadCounts { shared, .. } => Some(shared.value.clone()),
            _ => None,
        })
    }

    #[tokio::test]
    async fn a_big_group_sends_v2_clients_read_counts_and_v1_clients_cursors() {
        let hub = Hub::new(3);
        let (_, alice) = hub.connect_with("alice", Version::V2);
        alice.want("G", true);
        assert!(hub.subscribe(1, "G", "alice", &alice, None));
        let (bob_id, bob) = hub.connect("bob");
        bob.want("G", true);
        hub.subscribe(bob_id, "G", "bob", &bob, None);
        hub.loaded("G", loaded(&[("alice", 0), ("bob", 0), ("carol", 0)]));
        // v2: a snapshot without members, and the read counts (none yet).
        let frames = alice.take().await.unwrap();
        assert!(matches!(&frames[0], ServerFrame::Snapshot { members, .. } if members.0.is_empty()));
        assert_eq!(read_counts_of(&frames).unwrap().counts, []);
        assert_eq!(snapshot_members(&bob.take().await.unwrap()[0]).len(), 3);

        // carol sends 1 and 2 (the input topic first, her cursor after),
        // bob reads 1 through the changelog, alice's receipt for 2 is taken.
        hub.message_sent("G", 1, "carol");
        hub.message_sent("G", 2, "carol");
        hub.route("G", change("carol", 2));
        hub.route("G", change("bob", 1));
        hub.receipt_taken("G", "alice", Reached::Read, 2);
        let t0 = Instant::now();
        let mut now = tick(&hub, t0, 250);
        hub.send_batches();
        let counts = read_counts_of(&alice.take().await.unwrap()).unwrap();
        assert_eq!(
            (
                counts.first_seq,
                counts.counts,
                counts.read_by_all_through,
                counts.member_count
            ),
            (1, vec![Some(2), Some(1)], 1, 3)
        );
        assert!(
            matches!(&bob.take().await.unwrap()[..], [ServerFrame::Cursors { members, .. }] if members.len() == 3),
            "v1 gets the members that moved"
        );

        // However busy the group, at most one frame per interval, and the
        // last change shows.
        let mut frames = 0;
        for step in 0..100 {
            // bob's cursor runs ahead of the latest seq the changelog gave.
            let ahead = MemberChange {
                latest_seq: 2,
                ..change("bob", 2 + step)
            };
            hub.route("G", ahead);
            now = tick(&hub, now, 10);
            if alice.pending_updates() > 0 {
                alice.take().await.unwrap();
                frames += 1;
            }
        }
        assert!((3..=5).contains(&frames), "{frames} frames in 1 s");
        now = tick(&hub, now, 300);
        if alice.pending_updates() > 0 {
            let counts = read_counts_of(&alice.take().await.unwrap()).unwrap();
            assert_eq!(
                (counts.counts, counts.read_by_all_through),
                (vec![Some(2), Some(2)], 2)
            );
        }
        // Nothing changed: nothing sent.
        now = tick(&hub, now, 600);
        assert_eq!(alice.pending_updates(), 0);
        // A departure lowers a count: bob no longer reads anything here.
        hub.route("G", left("bob"));
        tick(&hub, now, 300);
        let counts = read_counts_of(&alice.take().await.unwrap()).unwrap();
        assert_eq!((counts.counts, counts.member_count), (vec![Some(1), Some(1)], 2));
    }

    /// Ticks the read counts every 5 ms for `ms` from `from`, as the
    /// gateway's sender thread does; returns the time reached.
    fn tick(hub: &Hub, from: Instant, ms: u64) -> Instant {
        let mut now = from;
        while now < from + Duration::from_millis(ms) {
            hub.send_read_counts(now);
            now += Duration::from_millis(5);
        }
        now
    }

    #[tokio::test]
    async fn a_v2_big_groups_own_updates_ride_on_its_read_counts() {
        let hub = Hub::new(3);
        let (id, alice) = hub.connect_with("alice", Version::V2);
        alice.want("G", true);
        hub.subscribe(id, "G", "alice", &alice, None);
        hub.loaded("G", loaded(&[("alice", 0), ("bob", 0), ("carol", 0)]));
        alice.take().await.unwrap();
        let own = |conversation: &str, private_cursor| own_frame(conversation, 0, private_cursor, 0);
        // A private receipt changes no count, yet its read counts go out.
        hub.to_user("alice", own("G", 4));
        hub.to_user("alice", own("DM", 1));
        let frames = alice.take().await.unwrap();
        assert_eq!(
            frames,
            [own("DM", 1)],
            "another conversation's own frame goes at once"
        );
        tick(&hub, Instant::now(), 250);
        let frames = alice.take().await.unwrap();
        let [frame] = &frames[..] else {
            panic!("{frames:?}")
        };
        let json: serde_json::Value = serde_json::from_str(&frame.json()).unwrap();
        assert_eq!(json["type"], "read_counts");
        assert_eq!(json["member_count"], 3);
        assert_eq!(json["own"]["private_cursor"], 4, "{json}");
        // Once unsubscribed, own frames go on their own again.
        hub.unsubscribe(id, "G", &alice);
        hub.to_user("alice", own("G", 5));
        assert_eq!(alice.take().await.unwrap(), [own("G", 5)]);
    }

    #[tokio::test]
    async fn own_updates_reach_every_device_of_the_user() {
        let hub = Hub::new(100);
        let (a1, phone) = hub.connect("alice");
        let (_a2, laptop) = hub.connect("alice");
        let own = own_frame("G", 3, 3, 3);
        hub.to_user("alice", own.clone());
        assert_eq!(phone.take().await.unwrap(), std::slice::from_ref(&own));
        assert_eq!(laptop.take().await.unwrap(), [own]);
        hub.disconnect(a1, "alice");
        assert!(phone.take().await.is_none(), "a closed outbox ends its writer");
    }

    fn thread_unread_shown(frames: &[ServerFrame]) -> Vec<(String, u64)> {
        frames
            .iter()
            .filter_map(|f| match f {
                ServerFrame::Own { own, .. } => Some(("own".to_owned(), own.thread_unread)),
                ServerFrame::OwnThread {
                    thread,
                    unread,
                    thread_unread,
                    ..
                } => Some((format!("thread {thread}: {unread}"), *thread_unread)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_thread_read_on_one_device_clears_it_on_every_device() {
        let hub = Hub::new(100);
        let (_, phone) = hub.connect("alice");
        let (_, laptop) = hub.connect("alice");
        let own = |latest_seq, cursor, private_cursor| {
            Some(ThreadOwn {
                latest_seq,
                cursor,
                private_cursor,
            })
        };
        hub.own_thread("alice", "G", 1, own(2, 0, 0));
        hub.own_thread("alice", "G", 4, own(1, 1, 0));
        // Bob replies in thread 1: alice's unread there goes up at once.
        hub.reply_sent("G", 1, 3, "bob");
        hub.to_user("alice", own_frame("G", 3, 3, 3));
        let frames = phone.take().await.unwrap();
        assert_eq!(
            thread_unread_shown(&frames),
            [
                ("own".to_owned(), 3),
                ("thread 1: 3".to_owned(), 3),
                ("thread 4: 0".to_owned(), 3)
            ],
            "unsent frames carry the newest sum"
        );
        // The phone reads thread 1 privately; the laptop is told.
        laptop.take().await.unwrap();
        hub.own_thread("alice", "G", 1, own(3, 0, 3));
        let frames = laptop.take().await.unwrap();
        assert_eq!(thread_unread_shown(&frames), [("thread 1: 0".to_owned(), 0)]);
        assert_eq!(hub.thread_unread("alice", "G"), 0);
        // Nobody else is told, and users not connected here are not held.
        hub.own_thread("bob", "G", 1, own(3, 3, 0));
        assert_eq!(hub.thread_unread("bob", "G"), 0);
        assert_eq!(hub.watched_threads(), 2);
    }

    #[tokio::test]
    async fn a_thread_subscription_gets_its_followers_changes_until_unsubscribed() {
        let hub = Hub::new(100);
        let (id, outbox) = hub.connect("alice");
        outbox.want_thread("G", 1, true);
        hub.subscribe_thread(id, "G", 1, &outbox);
        hub.route_thread("G", 1, "bob", Some((1, 1, 2)));
        hub.route_thread("G", 1, "bob", Some((2, 1, 2)));
        hub.route_thread("G", 2, "bob", Some((5, 1, 5)));
        let frames = outbox.take().await.unwrap();
        assert_eq!(
            frames,
            [ServerFrame::ThreadCursor {
                conversation: "G".into(),
                thread: 1,
                user: "bob".into(),
                cursor: 2,
                join_seq: 1,
                latest_seq: 2,
            }],
            "coalesced, and only the thread subscribed"
        );
        // Unsubscribing the conversation leaves the thread's updates.
        hub.route_thread("G", 1, "carol", None);
        outbox.want("G", false);
        assert_eq!(outbox.pending_updates(), 1);
        hub.unsubscribe_thread(id, "G", 1, &outbox);
        assert_eq!(outbox.pending_updates(), 0);
        hub.route_thread("G", 1, "bob", Some((3, 1, 3)));
        assert_eq!(outbox.pending_updates(), 0);
        assert_eq!(hub.watched_threads(), 0);
    }

    #[test]
    fn a_thread_cursor_shown_is_never_lowered_within_a_membership() {
        let mut shown = Shown::default();
        let cursor = |cursor, join_seq| ServerFrame::ThreadCursor {
            conversation: "G".into(),
            thread: 1,
            user: "bob".into(),
            cursor,
            join_seq,
            latest_seq: 9,
        };
        assert!(admitted(&mut shown, cursor(4, 1)).is_some());
        assert!(admitted(&mut shown, cursor(3, 1)).is_none(), "lower");
        let mut snapshot = ServerFrame::ThreadSnapshot {
            conversation: "G".into(),
            thread: 1,
            latest_seq: 9,
            followers: vec![crate::protocol::FollowerState {
                user: "bob".into(),
                cursor: 2,
                join_seq: 1,
            }],
        };
        assert!(shown.admit(&mut snapshot));
        assert!(
            matches!(&snapshot, ServerFrame::ThreadSnapshot { followers, .. } if followers[0].cursor == 4)
        );
        assert!(
            admitted(&mut shown, cursor(5, 6)).is_some(),
            "a rejoin starts anew"
        );
    }

    fn badge_frame(messages: u64, updated_at: i64) -> ServerFrame {
        ServerFrame::Badge {
            badge: messages,
            conversations: messages.min(1),
            messages,
            mentions: 0,
            updated_at,
        }
    }

    #[tokio::test]
    async fn badges_reach_only_the_users_devices_and_an_unsent_newer_one_stays() {
        let hub = Hub::new(100);
        let (_a1, phone) = hub.connect("alice");
        let (_a2, laptop) = hub.connect("alice");
        let (_b1, bob) = hub.connect("bob");
        hub.to_user("alice", badge_frame(4, 20));
        // A late read of Redis, older than the topic's record, changes nothing.
        phone.push_update(Key::Badge, badge_frame(2, 10));
        assert_eq!(phone.take().await.unwrap(), [badge_frame(4, 20)]);
        assert_eq!(laptop.take().await.unwrap(), [badge_frame(4, 20)]);
        hub.to_user("alice", badge_frame(5, 30));
        hub.to_user("alice", badge_frame(0, 40));
        assert_eq!(phone.take().await.unwrap(), [badge_frame(0, 40)], "coalesced");
        hub.to_user("bob", badge_frame(1, 50));
        assert_eq!(bob.take().await.unwrap(), [badge_frame(1, 50)]);
        // A subscription's end keeps the badge.
        laptop.push_update(Key::Badge, badge_frame(7, 60));
        laptop.want("G", false);
        assert_eq!(laptop.take().await.unwrap().last(), Some(&badge_frame(7, 60)));
    }

    #[test]
    fn a_badge_older_than_the_one_shown_is_never_shown() {
        let mut shown = Shown::default();
        assert!(admitted(&mut shown, badge_frame(3, 20)).is_some());
        assert_eq!(admitted(&mut shown, badge_frame(9, 10)), None, "older");
        assert_eq!(admitted(&mut shown, badge_frame(3, 20)), None, "the same again");
        // Going down is news when it is newer.
        assert_eq!(admitted(&mut shown, badge_frame(0, 30)), Some(badge_frame(0, 30)));
        assert_eq!(admitted(&mut shown, badge_frame(3, 20)), None);
    }

    fn member(cursor: u64, delivered: u64, join_seq: u64) -> Member {
        Member {
            cursor,
            delivered,
            join_seq,
        }
    }

    fn reached(u: &str, cursor: u64, delivered: u64) -> MemberChange {
        MemberChange {
            user: u.into(),
            member: Some(member(cursor, delivered, 1)),
            latest_seq: delivered,
        }
    }

    fn cursor_frame(u: &str, cursor: u64, delivered: u64, latest_seq: u64) -> ServerFrame {
        ServerFrame::Cursor {
            conversation: "G".into(),
            user: u.into(),
            cursor,
            delivered,
            join_seq: 1,
            latest_seq,
        }
    }

    #[tokio::test]
    async fn a_delivery_alone_reaches_a_small_groups_subscribers_as_a_cursor_frame() {
        let hub = Hub::new(100);
        let (_, alice, _) = join(&hub, "alice", "G");
        hub.loaded("G", loaded(&[("alice", 3), ("bob", 1)]));
        alice.take().await.unwrap();
        assert!(!hub.shows_delivered("G", "bob", 2));
        // bob's phone got 2 and 3; he has read 1.
        hub.route("G", reached("bob", 1, 3));
        assert_eq!(alice.take().await.unwrap(), [cursor_frame("bob", 1, 3, 3)]);
        assert!(hub.shows_delivered("G", "bob", 3));
        // An older delivery, or the same one again, shows nothing.
        hub.route("G", reached("bob", 1, 2));
        hub.route("G", reached("bob", 1, 3));
        assert_eq!(alice.pending_updates(), 0);
        // A delivery the broker took moves the room at once.
        hub.message_sent("G", 4, "alice");
        hub.receipt_taken("G", "bob", Reached::Delivered, 4);
        assert_eq!(alice.take().await.unwrap(), [cursor_frame("bob", 1, 4, 3)]);
        // A read past the delivered cursor is a delivery too.
        hub.receipt_taken("G", "bob", Reached::Read, 5);
        assert_eq!(alice.take().await.unwrap(), [cursor_frame("bob", 5, 5, 3)]);
        // Nobody else's delivery is known here, nor any in other rooms.
        assert!(!hub.shows_delivered("G", "carol", 1));
        assert!(!hub.shows_delivered("H", "bob", 1));
    }

    #[tokio::test]
    async fn a_delivered_cursor_below_the_cursor_reads_as_the_cursor() {
        let hub = Hub::new(100);
        let (_, alice, _) = join(&hub, "alice", "G");
        // Stores that lag may hold the delivered cursor below the cursor.
        let stores = LoadedConversation {
            latest_seq: 6,
            members: [("alice", member(6, 6, 1)), ("bob", member(5, 2, 1))]
                .into_iter()
                .map(|(u, m)| (u.to_string(), m))
                .collect(),
        };
        hub.loaded("G", Ok(Some(stores)));
        let frames = alice.take().await.unwrap();
        let ServerFrame::Snapshot { members, .. } = &frames[0] else {
            panic!("{frames:?}")
        };
        assert_eq!(members.0[1].delivered, 5, "{members:?}");
        // A change with no delivered cursor of its own (an earlier writer's).
        hub.route(
            "G",
            MemberChange {
                user: "bob".into(),
                member: Some(member(6, 0, 1)),
                latest_seq: 6,
            },
        );
        assert_eq!(alice.take().await.unwrap(), [cursor_frame("bob", 6, 6, 6)]);
    }

    #[test]
    fn a_delivered_cursor_shown_is_never_lowered() {
        let mut shown = Shown::new(100);
        let admitted = |shown: &mut Shown, mut frame: ServerFrame| shown.admit(&mut frame).then_some(frame);
        assert!(admitted(&mut shown, cursor_frame("bob", 3, 5, 5)).is_some());
        // A read is news, but the delivered cursor shown stays.
        assert_eq!(
            admitted(&mut shown, cursor_frame("bob", 4, 4, 5)),
            Some(cursor_frame("bob", 4, 5, 5))
        );
        assert_eq!(admitted(&mut shown, cursor_frame("bob", 4, 5, 5)), None);
        assert_eq!(admitted(&mut shown, cursor_frame("bob", 2, 4, 5)), None);
        // A delivery alone is news, and the cursor shown stays.
        assert_eq!(
            admitted(&mut shown, cursor_frame("bob", 2, 6, 6)),
            Some(cursor_frame("bob", 4, 6, 6))
        );
        // A snapshot from stores that lag is raised to what was shown.
        let mut snapshot = ServerFrame::Snapshot {
            conversation: "G".into(),
            latest_seq: 6,
            members: Shared(Arc::new(vec![member(3, 3, 1).state("bob".into())])),
            own: None,
        };
        assert!(shown.admit(&mut snapshot));
        assert_eq!(snapshot_members(&snapshot), [("bob".into(), 4)]);
        let ServerFrame::Snapshot { members, .. } = &snapshot else {
            unreachable!()
        };
        assert_eq!(members.0[0].delivered, 6);
    }

    #[tokio::test]
    async fn a_big_group_counts_deliveries_beside_reads() {
        let hub = Hub::new(3);
        let (id, alice) = hub.connect_with("alice", Version::V2);
        alice.want("G", true);
        hub.subscribe(id, "G", "alice", &alice, None);
        let (bob_id, bob) = hub.connect("bob");
        bob.want("G", true);
        hub.subscribe(bob_id, "G", "bob", &bob, None);
        hub.loaded("G", loaded(&[("alice", 0), ("bob", 0), ("carol", 0)]));
        alice.take().await.unwrap();
        bob.take().await.unwrap();
        hub.message_sent("G", 1, "alice");
        hub.message_sent("G", 2, "alice");
        hub.route("G", change("alice", 2));
        // bob's phone got both, carol's the first; nobody read anything.
        hub.route("G", reached("bob", 0, 2));
        hub.receipt_taken("G", "carol", Reached::Delivered, 1);
        let now = tick(&hub, Instant::now(), 250);
        hub.send_batches();
        let counts = read_counts_of(&alice.take().await.unwrap()).unwrap();
        assert_eq!(
            (
                counts.counts,
                counts.read_by_all_through,
                counts.delivered_counts,
                counts.delivered_to_all_through
            ),
            (vec![Some(0), Some(0)], 0, vec![Some(2), Some(1)], 1)
        );
        let batch = bob.take().await.unwrap();
        let [ServerFrame::Cursors { members, .. }] = &batch[..] else {
            panic!("{batch:?}")
        };
        assert!(
            members.contains(&member(0, 1, 1).state("carol".into())),
            "v1 gets the delivery in its batch: {members:?}"
        );
        // carol reads both: read and delivered by all.
        hub.route("G", reached("carol", 2, 2));
        hub.route("G", reached("bob", 2, 2));
        tick(&hub, now, 300);
        let counts = read_counts_of(&alice.take().await.unwrap()).unwrap();
        assert_eq!(
            (
                counts.counts,
                counts.read_by_all_through,
                counts.delivered_counts,
                counts.delivered_to_all_through
            ),
            (vec![Some(2), Some(2)], 2, vec![Some(2), Some(2)], 2)
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Send(u8),
        /// The changelog brings a member's cursor up to this seq.
        Read(u8, u64),
        /// The broker took a delivery report up to this seq.
        Deliver(u8, u64),
        Join(u8),
        Leave(u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (0..6u8).prop_map(Op::Send),
            3 => (0..6u8, 0..40u64).prop_map(|(u, s)| Op::Read(u, s)),
            4 => (0..6u8, 0..40u64).prop_map(|(u, s)| Op::Deliver(u, s)),
            1 => (1..6u8).prop_map(Op::Join),
            1 => (1..6u8).prop_map(Op::Leave),
        ]
    }

    /// Plays `ops` into a big group's room and checks its last read-counts
    /// frame against the read model's ticks of every seq it covers.
    async fn ticks_as_the_read_model(capacity: usize, ops: Vec<Op>) {
        use readfold_core::{ConversationView, MemberCursor, UserId};
        let users: Vec<UserId> = (0..6)
            .map(|i| UserId::parse(&format!("u{i}"), 64).unwrap())
            .collect();
        let hub = Hub::with_config(HubConfig {
            read_counts_window: capacity,
            ..HubConfig::new(3)
        });
        let (id, watcher) = hub.connect_with("u0", Version::V2);
        watcher.want("G", true);
        hub.subscribe(id, "G", "u0", &watcher, None);
        let mut view = ConversationView::default();
        for user in &users[..4] {
            let m = MemberCursor {
                cursor: Seq(0),
                delivered: Seq(0),
                join_seq: Seq(1),
            };
            view.members.insert(user.clone(), m);
        }
        let as_member = |m: &MemberCursor| member(m.cursor.get(), m.delivered.get(), m.join_seq.get());
        hub.loaded(
            "G",
            Ok(Some(LoadedConversation {
                latest_seq: 0,
                members: view
                    .members
                    .iter()
                    .map(|(u, m)| (u.to_string(), as_member(m)))
                    .collect(),
            })),
        );
        let mut senders = BTreeMap::new();
        let change = |user: &UserId, m: Option<&MemberCursor>, latest: Seq| MemberChange {
            user: user.to_string(),
            member: m.map(as_member),
            latest_seq: latest.get(),
        };
        for op in ops {
            let latest = view.latest_seq;
            match op {
                // Only present members send; the sender's cursor follows.
                Op::Send(i) => {
                    if let Some(m) = view.members.get_mut(&users[i as usize]) {
                        let seq = Seq(latest.get() + 1);
                        view.latest_seq = seq;
                        senders.insert(seq.get(), users[i as usize].clone());
                        hub.message_sent("G", seq.get(), users[i as usize].as_str());
                        m.cursor = m.cursor.max(seq);
                        m.delivered = m.delivered.max(seq);
                        hub.route("G", change(&users[i as usize], Some(m), seq));
                    }
                }
                Op::Read(i, seq) => {
                    if let Some(m) = view.members.get_mut(&users[i as usize]) {
                        m.cursor = m.cursor.max(Seq(seq));
                        m.delivered = m.delivered.max(m.cursor);
                        hub.route("G", change(&users[i as usize], Some(m), latest));
                    }
                }
                Op::Deliver(i, seq) => {
                    if let Some(m) = view.members.get_mut(&users[i as usize]) {
                        m.delivered = m.delivered.max(Seq(seq));
                        hub.receipt_taken("G", users[i as usize].as_str(), Reached::Delivered, seq);
                    }
                }
                Op::Join(i) => {
                    if !view.members.contains_key(&users[i as usize]) {
                        let m = MemberCursor {
                            cursor: latest,
                            delivered: latest,
                            join_seq: Seq(latest.get() + 1),
                        };
                        view.members.insert(users[i as usize].clone(), m);
                        hub.route("G", change(&users[i as usize], Some(&m), latest));
                    }
                }
                Op::Leave(i) => {
                    if view.members.remove(&users[i as usize]).is_some() {
                        hub.route("G", change(&users[i as usize], None, latest));
                    }
                }
            }
        }
        tick(&hub, Instant::now(), 300);
        let counts = read_counts_of(&watcher.take().await.unwrap()).unwrap();
        let latest = view.latest_seq.get();
        assert_eq!(counts.latest_seq, latest);
        for (i, seq) in (counts.first_seq..=latest).enumerate() {
            let ticks = view.ticks(Seq(seq), &senders[&seq]);
            assert_eq!(
                counts.counts[i],
                Some(ticks.read_count as u32),
                "seq {seq}: {counts:?}"
            );
            assert_eq!(
                counts.delivered_counts[i],
                Some(ticks.delivered_count as u32),
                "seq {seq}: {counts:?}"
            );
        }
        for seq in 1..=latest {
            let ticks = view.ticks(Seq(seq), &senders[&seq]);
            let all_read = ticks.read_count == ticks.possible_readers;
            let all_delivered = ticks.delivered_count == ticks.possible_readers;
            assert_eq!(
                all_read,
                seq <= counts.read_by_all_through,
                "seq {seq}: {counts:?}"
            );
            assert_eq!(
                all_delivered,
                seq <= counts.delivered_to_all_through,
                "seq {seq}: {counts:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn a_big_groups_counts_equal_the_read_models_ticks(
            capacity in 1..12usize,
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(ticks_as_the_read_model(capacity, ops));
        }
    }
}
