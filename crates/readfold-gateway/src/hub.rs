//! Who is subscribed to what, each watched conversation's live state, and
//! each connection's outbox.
//!
//! A conversation with subscribers here has a [`Room`]: its present members
//! and their public cursors, read once from the stores when the first
//! subscriber comes, then kept current from the changelog by max-merge.
//! Every later subscriber's snapshot comes from the room, taken under the
//! same lock that registers the subscription, so that no change falls
//! between the two; and a room never lowers a cursor, so that no connection
//! is shown a lower value after a higher one.
//!
//! A conversation smaller than `batch_from_members` pushes each advance at
//! once. A bigger one gathers its changes and sends one `cursors` frame per
//! batch interval ([`Hub::send_batches`]), so that a 5,000-member group does
//! not flood its members: each gets at most one frame per interval, however
//! busy the group.
//!
//! The outbox coalesces: cursors only grow, so only the latest value per
//! (conversation, member) matters. Updates for a key replace each other
//! while a connection's writer is busy, so a slow client gets fewer, newer
//! frames rather than a growing queue, and never holds up the others.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

use crate::protocol::{MemberState, OwnState, ServerFrame, Shared};
use crate::telemetry;

/// What an update is about: a member of a conversation as others see them,
/// the connected user's own view of a conversation, or a big group's batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Member { conversation: String, user: String },
    Own { conversation: String },
    Batch { conversation: String },
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
            _ => None,
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
    closed: bool,
}

/// One connection's frames waiting to be written.
#[derive(Default)]
pub struct Outbox {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Outbox {
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
                        join_seq,
                        ..
                    } => merge_member(
                        members,
                        left,
                        MemberState {
                            user,
                            cursor,
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
            p.updates.retain(|key, _| match key {
                Key::Member { conversation: c, .. } | Key::Batch { conversation: c } => c != conversation,
                Key::Own { .. } => true,
            });
        }
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
                if !p.control.is_empty() || !p.updates.is_empty() {
                    let mut frames: Vec<ServerFrame> = p.control.drain(..).collect();
                    frames.extend(std::mem::take(&mut p.updates).into_values());
                    return Some(frames);
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

/// A member's public cursor and the seq they joined at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub cursor: u64,
    pub join_seq: u64,
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

/// A watched conversation's live state and its subscribers here.
#[derive(Default)]
struct Room {
    loaded: bool,
    /// Changes that came while the stores were being read; applied over
    /// what was read.
    buffered: Vec<MemberChange>,
    waiting: Vec<Waiter>,
    latest_seq: u64,
    members: BTreeMap<String, Member>,
    subscribers: HashMap<ConnId, Arc<Outbox>>,
    /// A big group's changes not yet sent (None: left), latest per member.
    unsent: BTreeMap<String, Option<Member>>,
    /// The member list snapshots share, until the next change.
    shared: Option<Shared<Vec<MemberState>>>,
}

impl Room {
    /// Max-merges a change; whether it changed anything.
    fn apply(&mut self, change: &MemberChange) -> bool {
        self.latest_seq = self.latest_seq.max(change.latest_seq);
        let changed = match change.member {
            Some(new) => match self.members.get_mut(&change.user) {
                Some(m) if new.cursor <= m.cursor && new.join_seq == m.join_seq => false,
                Some(m) => {
                    m.cursor = m.cursor.max(new.cursor);
                    m.join_seq = new.join_seq;
                    true
                }
                None => {
                    self.members.insert(change.user.clone(), new);
                    true
                }
            },
            None => self.members.remove(&change.user).is_some(),
        };
        if changed {
            self.shared = None;
        }
        changed
    }

    fn member_list(&mut self) -> Shared<Vec<MemberState>> {
        self.shared
            .get_or_insert_with(|| {
                Shared(Arc::new(
                    self.members
                        .iter()
                        .map(|(user, m)| MemberState {
                            user: user.clone(),
                            cursor: m.cursor,
                            join_seq: m.join_seq,
                        })
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
        waiter.outbox.push_control(ServerFrame::Snapshot {
            conversation: conversation.to_owned(),
            latest_seq: self.latest_seq,
            members: self.member_list(),
            own: waiter.own,
        });
        self.subscribers.insert(waiter.id, waiter.outbox);
    }
}

/// Routes changelog updates to the connections that want them, and keeps
/// each watched conversation's state.
pub struct Hub {
    /// Conversations with at least this many present members send batches.
    batch_from_members: usize,
    next_id: AtomicU64,
    users: RwLock<HashMap<String, HashMap<ConnId, Arc<Outbox>>>>,
    rooms: Mutex<HashMap<String, Room>>,
}

impl Hub {
    pub fn new(batch_from_members: usize) -> Self {
        Hub {
            batch_from_members,
            next_id: AtomicU64::new(0),
            users: RwLock::default(),
            rooms: Mutex::default(),
        }
    }

    fn rooms(&self) -> std::sync::MutexGuard<'_, HashMap<String, Room>> {
        self.rooms.lock().expect("rooms lock")
    }

    /// A new connection of `user`; it receives the user's own channel.
    pub fn connect(&self, user: &str) -> (ConnId, Arc<Outbox>) {
        let outbox = Arc::new(Outbox::default());
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
        let removed = {
            let mut users = self.users.write().expect("users lock");
            let removed = users.get_mut(user).and_then(|c| c.remove(&id));
            if users.get(user).is_some_and(HashMap::is_empty) {
                users.remove(user);
            }
            removed
        };
        if let Some(outbox) = removed {
            for conversation in outbox.wanted() {
                self.unsubscribe(id, &conversation, &outbox);
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
                room.members = loaded.members;
                for change in std::mem::take(&mut room.buffered) {
                    room.apply(&change);
                }
                room.loaded = true;
                room.shared = None;
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
            room.subscribers.remove(&id);
            room.waiting.retain(|w| w.id != id);
            if room.loaded && room.subscribers.is_empty() {
                rooms.remove(conversation);
            }
        }
    }

    /// A member's change in `conversation`, for its subscribers: at once in
    /// a small conversation, in the next batch in a big one.
    pub fn route(&self, conversation: &str, change: MemberChange) {
        let mut rooms = self.rooms();
        let Some(room) = rooms.get_mut(conversation) else {
            return;
        };
        if !room.loaded {
            room.buffered.push(change);
            return;
        }
        if !room.apply(&change) {
            return;
        }
        // Once a batch is pending, later changes join it, so that a single
        // update never overtakes an older batch.
        if room.members.len() >= self.batch_from_members || !room.unsent.is_empty() {
            let now = room.members.get(&change.user).copied();
            room.unsent.insert(change.user, now);
            return;
        }
        let frame = match room.members.get(&change.user) {
            Some(m) => ServerFrame::Cursor {
                conversation: conversation.to_owned(),
                user: change.user.clone(),
                cursor: m.cursor,
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

    /// Sends each big group's gathered changes as one `cursors` frame to
    /// each of its subscribers. Called once per batch interval.
    pub fn send_batches(&self) {
        let mut rooms = self.rooms();
        for (conversation, room) in rooms.iter_mut().filter(|(_, r)| !r.unsent.is_empty()) {
            let (mut members, mut left) = (Vec::new(), Vec::new());
            for (user, member) in std::mem::take(&mut room.unsent) {
                match member {
                    Some(m) => members.push(MemberState {
                        user,
                        cursor: m.cursor,
                        join_seq: m.join_seq,
                    }),
                    None => left.push(user),
                }
            }
            let frame = ServerFrame::Cursors {
                conversation: conversation.clone(),
                latest_seq: room.latest_seq,
                members,
                left,
            };
            for outbox in room.subscribers.values() {
                outbox.push_batch(frame.clone());
            }
        }
    }

    /// Whether `user` is a present member of `conversation`, and its latest
    /// seq, if a room here knows (someone here subscribes to it).
    pub fn membership(&self, conversation: &str, user: &str) -> Option<(bool, u64)> {
        let rooms = self.rooms();
        let room = rooms.get(conversation).filter(|r| r.loaded)?;
        Some((room.members.contains_key(user), room.latest_seq))
    }

    /// An update for every connection of `user`.
    pub fn to_user(&self, user: &str, frame: ServerFrame) {
        let Some(key) = Key::of(&frame) else { return };
        let users = self.users.read().expect("users lock");
        for outbox in users.get(user).into_iter().flat_map(HashMap::values) {
            outbox.push_update(key.clone(), frame.clone());
        }
    }

    /// Conversations with at least one subscriber here.
    pub fn watched_conversations(&self) -> usize {
        self.rooms().len()
    }
}

/// What a connection has shown of its own state in each conversation, so
/// that it never shows a lower cursor after a higher one (a snapshot's own
/// part and the user channel may overlap). Members' cursors need no such
/// record: they come from the rooms, which never lower one.
#[derive(Default)]
pub struct Shown {
    own: HashMap<String, (u64, u64, bool)>,
}

impl Shown {
    /// Whether `frame` shows something new; records it if so, and raises an
    /// own frame's cursors to what was shown already.
    pub fn admit(&mut self, frame: &mut ServerFrame) -> bool {
        match frame {
            ServerFrame::Snapshot {
                conversation,
                own: Some(o),
                ..
            } => {
                let shown = self.own.entry(conversation.clone()).or_insert((0, 0, false));
                o.cursor = o.cursor.max(shown.0);
                o.private_cursor = o.private_cursor.max(shown.1);
                *shown = (o.cursor, o.private_cursor, o.unread_mark);
                true
            }
            ServerFrame::Own {
                conversation,
                cursor,
                private_cursor,
                unread_mark,
                ..
            } => {
                let shown = self.own.entry(conversation.clone()).or_insert((0, 0, false));
                let fresh = *cursor > shown.0 || *private_cursor > shown.1 || *unread_mark != shown.2;
                *cursor = (*cursor).max(shown.0);
                *private_cursor = (*private_cursor).max(shown.1);
                *shown = (*cursor, *private_cursor, *unread_mark);
                fresh
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(c: &str, u: &str, n: u64) -> ServerFrame {
        ServerFrame::Cursor {
            conversation: c.into(),
            user: u.into(),
            cursor: n,
            join_seq: 1,
            latest_seq: n,
        }
    }

    fn change(u: &str, n: u64) -> MemberChange {
        MemberChange {
            user: u.into(),
            member: Some(Member {
                cursor: n,
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

    #[test]
    fn an_own_cursor_shown_is_never_lowered() {
        let mut shown = Shown::default();
        let own = |c, p, m| ServerFrame::Own {
            conversation: "G".into(),
            cursor: c,
            private_cursor: p,
            unread_mark: m,
            latest_seq: 9,
        };
        assert!(shown.admit(&mut own(2, 4, false)));
        let mut stale = own(1, 3, false);
        assert!(!shown.admit(&mut stale));
        let mut marked = own(1, 3, true);
        assert!(shown.admit(&mut marked), "a mark is news");
        assert_eq!(marked, own(2, 4, true), "but the cursors shown never go down");
    }

    #[tokio::test]
    async fn own_updates_reach_every_device_of_the_user() {
        let hub = Hub::new(100);
        let (a1, phone) = hub.connect("alice");
        let (_a2, laptop) = hub.connect("alice");
        let own = ServerFrame::Own {
            conversation: "G".into(),
            cursor: 3,
            private_cursor: 3,
            unread_mark: false,
            latest_seq: 3,
        };
        hub.to_user("alice", own.clone());
        assert_eq!(phone.take().await.unwrap(), std::slice::from_ref(&own));
        assert_eq!(laptop.take().await.unwrap(), [own]);
        hub.disconnect(a1, "alice");
        assert!(phone.take().await.is_none(), "a closed outbox ends its writer");
    }
}
