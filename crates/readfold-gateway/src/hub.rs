//! Who is subscribed to what, and each connection's outbox.
//!
//! The outbox coalesces: cursors only grow, so only the latest value per
//! (conversation, member) matters. Updates for a key replace each other
//! while a connection's writer is busy, so a slow client gets fewer, newer
//! frames rather than a growing queue, and never holds up the others.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::Notify;

use crate::protocol::ServerFrame;
use crate::telemetry;

/// What an update is about: a member of a conversation as others see them,
/// or the connected user's own view of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    Member { conversation: String, user: String },
    Own { conversation: String },
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
    closed: bool,
}

/// One connection's frames waiting to be written.
#[derive(Default)]
pub struct Outbox {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Outbox {
    /// Queues a frame that is sent in order, before any update.
    pub fn push_control(&self, frame: ServerFrame) {
        self.pending.lock().expect("outbox lock").control.push_back(frame);
        self.notify.notify_one();
    }

    /// Queues an update, replacing an unsent one for the same key.
    pub fn push_update(&self, key: Key, frame: ServerFrame) {
        let replaced = self
            .pending
            .lock()
            .expect("outbox lock")
            .updates
            .insert(key, frame);
        if replaced.is_some() {
            telemetry::coalesced();
        }
        self.notify.notify_one();
    }

    /// Ends the writer's wait for good.
    pub fn close(&self) {
        self.pending.lock().expect("outbox lock").closed = true;
        self.notify.notify_one();
    }

    /// Waits for frames and takes all of them: control frames first, then
    /// updates. `None` once closed.
    pub async fn take(&self) -> Option<Vec<ServerFrame>> {
        loop {
            {
                let mut p = self.pending.lock().expect("outbox lock");
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
        self.pending.lock().expect("outbox lock").updates.len()
    }
}

/// A connection's id within one gateway.
pub type ConnId = u64;

#[derive(Default)]
struct Routes {
    next_id: ConnId,
    conversations: HashMap<String, HashMap<ConnId, Arc<Outbox>>>,
    users: HashMap<String, HashMap<ConnId, Arc<Outbox>>>,
}

/// Routes changelog updates to the connections that want them.
#[derive(Default)]
pub struct Hub {
    routes: RwLock<Routes>,
}

impl Hub {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new connection of `user`; it receives the user's own channel.
    pub fn connect(&self, user: &str) -> (ConnId, Arc<Outbox>) {
        let outbox = Arc::new(Outbox::default());
        let mut r = self.routes.write().expect("routes lock");
        r.next_id += 1;
        let id = r.next_id;
        r.users
            .entry(user.to_owned())
            .or_default()
            .insert(id, outbox.clone());
        telemetry::connections(1);
        (id, outbox)
    }

    pub fn disconnect(&self, id: ConnId, user: &str, conversations: impl IntoIterator<Item = String>) {
        let mut r = self.routes.write().expect("routes lock");
        let removed = r.users.get_mut(user).and_then(|c| c.remove(&id));
        if let Some(outbox) = removed {
            outbox.close();
            telemetry::connections(-1);
        }
        if r.users.get(user).is_some_and(HashMap::is_empty) {
            r.users.remove(user);
        }
        for c in conversations {
            remove(&mut r.conversations, &c, id);
        }
    }

    pub fn subscribe(&self, id: ConnId, conversation: &str, outbox: &Arc<Outbox>) {
        self.routes
            .write()
            .expect("routes lock")
            .conversations
            .entry(conversation.to_owned())
            .or_default()
            .insert(id, outbox.clone());
    }

    pub fn unsubscribe(&self, id: ConnId, conversation: &str) {
        remove(
            &mut self.routes.write().expect("routes lock").conversations,
            conversation,
            id,
        );
    }

    /// An update for everyone subscribed to `conversation`.
    pub fn to_conversation(&self, conversation: &str, frame: ServerFrame) {
        let Some(key) = Key::of(&frame) else { return };
        let r = self.routes.read().expect("routes lock");
        for outbox in r
            .conversations
            .get(conversation)
            .into_iter()
            .flat_map(HashMap::values)
        {
            outbox.push_update(key.clone(), frame.clone());
        }
    }

    /// An update for every connection of `user`.
    pub fn to_user(&self, user: &str, frame: ServerFrame) {
        let Some(key) = Key::of(&frame) else { return };
        let r = self.routes.read().expect("routes lock");
        for outbox in r.users.get(user).into_iter().flat_map(HashMap::values) {
            outbox.push_update(key.clone(), frame.clone());
        }
    }

    /// Conversations with at least one subscriber here.
    pub fn watched_conversations(&self) -> usize {
        self.routes.read().expect("routes lock").conversations.len()
    }
}

fn remove(map: &mut HashMap<String, HashMap<ConnId, Arc<Outbox>>>, key: &str, id: ConnId) {
    if let Some(conns) = map.get_mut(key) {
        conns.remove(&id);
        if conns.is_empty() {
            map.remove(key);
        }
    }
}

/// What a connection has shown of each key, so that it never shows a lower
/// value after a higher one (a snapshot and the changelog may overlap).
#[derive(Default)]
pub struct Shown {
    members: HashMap<(String, String), u64>,
    own: HashMap<String, (u64, u64, bool)>,
}

impl Shown {
    /// Whether `frame` shows something new; records it if so, and raises an
    /// own frame's cursors to what was shown already.
    pub fn admit(&mut self, frame: &mut ServerFrame) -> bool {
        match frame {
            ServerFrame::Snapshot {
                conversation,
                members,
                own,
                ..
            } => {
                for m in members.iter_mut() {
                    let shown = self
                        .members
                        .entry((conversation.clone(), m.user.clone()))
                        .or_insert(0);
                    m.cursor = m.cursor.max(*shown);
                    *shown = m.cursor;
                }
                if let Some(o) = own {
                    let shown = self.own.entry(conversation.clone()).or_insert((0, 0, false));
                    o.cursor = o.cursor.max(shown.0);
                    o.private_cursor = o.private_cursor.max(shown.1);
                    *shown = (o.cursor, o.private_cursor, o.unread_mark);
                }
                true
            }
            ServerFrame::Cursor {
                conversation,
                user,
                cursor,
                ..
            } => {
                let key = (conversation.clone(), user.clone());
                if self.members.get(&key).is_some_and(|shown| *cursor <= *shown) {
                    return false;
                }
                self.members.insert(key, *cursor);
                true
            }
            ServerFrame::Left { conversation, user } => {
                self.members.remove(&(conversation.clone(), user.clone()));
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

    /// Forgets a conversation (unsubscribed).
    pub fn forget(&mut self, conversation: &str) {
        self.members.retain(|(c, _), _| c != conversation);
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

    #[test]
    fn nothing_lower_is_ever_shown() {
        let mut shown = Shown::default();
        assert!(shown.admit(&mut cursor("G", "u", 5)));
        assert!(!shown.admit(&mut cursor("G", "u", 3)), "stale");
        assert!(!shown.admit(&mut cursor("G", "u", 5)), "duplicate");
        assert!(shown.admit(&mut cursor("G", "u", 6)));
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
        assert!(shown.admit(&mut ServerFrame::Left {
            conversation: "G".into(),
            user: "u".into()
        }));
        assert!(shown.admit(&mut cursor("G", "u", 6)), "a rejoin shows again");
    }

    #[tokio::test]
    async fn updates_reach_subscribers_and_every_device_of_the_user() {
        let hub = Hub::new();
        let (a1, phone) = hub.connect("alice");
        let (_a2, laptop) = hub.connect("alice");
        let (b, bob) = hub.connect("bob");
        hub.subscribe(b, "G", &bob);
        hub.to_conversation("G", cursor("G", "alice", 3));
        let own = ServerFrame::Own {
            conversation: "G".into(),
            cursor: 3,
            private_cursor: 3,
            unread_mark: false,
            latest_seq: 3,
        };
        hub.to_user("alice", own.clone());
        assert_eq!(bob.take().await.unwrap(), [cursor("G", "alice", 3)]);
        assert_eq!(phone.take().await.unwrap(), std::slice::from_ref(&own));
        assert_eq!(laptop.take().await.unwrap(), [own]);
        hub.disconnect(a1, "alice", Vec::new());
        assert!(phone.take().await.is_none(), "a closed outbox ends its writer");
        assert_eq!(hub.watched_conversations(), 1);
        hub.unsubscribe(b, "G");
        assert_eq!(hub.watched_conversations(), 0);
    }
}
