//! Threads at the gateway: what each connected user follows (their own
//! cursors in each thread, for `own_thread` frames and the conversation's
//! `thread_unread`), and who subscribes to which thread's cursors.
//!
//! A user's followed threads are read from the stores when they connect
//! and kept current from the by-user thread changelog and the replies on
//! the conversation-events input (a reply raises every follower's unread
//! at once, where the changelog carries only the replier's record). Every
//! value is max-merged, so the order of the read and the records does not
//! matter. Only connected users are held: memory follows connections.
//!
//! A reply can reach the gateway before the record that makes a user a
//! follower (the starter, say, whose record comes with the processor's
//! flush, carrying the latest reply of then): the latest reply of each
//! thread seen in the last [`RECENT_REPLIES`] is kept and merged into a
//! new follower's state, so that their unread does not lag until the next
//! reply.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hub::{ConnId, Outbox};
use crate::protocol::ServerFrame;

/// A connected user's own state in one thread they follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadOwn {
    pub latest_seq: u64,
    pub cursor: u64,
    pub private_cursor: u64,
}

impl ThreadOwn {
    pub fn unread(&self) -> u64 {
        self.latest_seq
            .saturating_sub(self.cursor.max(self.private_cursor))
    }

    fn merge(&mut self, other: ThreadOwn) {
        self.latest_seq = self.latest_seq.max(other.latest_seq);
        self.cursor = self.cursor.max(other.cursor);
        self.private_cursor = self.private_cursor.max(other.private_cursor);
    }
}

/// (conversation, thread).
pub type ThreadId = (String, u64);

/// How long a thread's latest reply seen on the input is kept for
/// followers whose record has yet to come: well beyond a flush and the
/// changelog's lag.
pub const RECENT_REPLIES: Duration = Duration::from_secs(60);

/// The gateway's thread state, under one lock (see [`crate::Hub`]).
#[derive(Default)]
pub struct Threads {
    /// Connected users' followed threads.
    followed: HashMap<String, BTreeMap<ThreadId, ThreadOwn>>,
    /// The connected users following each thread.
    followers: HashMap<ThreadId, HashSet<String>>,
    /// Each subscribed thread's subscribers here.
    rooms: HashMap<ThreadId, HashMap<ConnId, Arc<Outbox>>>,
    /// The latest reply of threads with a reply in the last
    /// [`RECENT_REPLIES`], and when it was seen.
    recent: HashMap<ThreadId, (u64, Instant)>,
    /// When `recent` was last pruned.
    pruned_at: Option<Instant>,
}

impl Threads {
    /// The user's unread over the threads of `conversation` they follow.
    pub fn unread_in(&self, user: &str, conversation: &str) -> u64 {
        self.followed.get(user).map_or(0, |threads| {
            threads
                .range((conversation.to_owned(), 0)..=(conversation.to_owned(), u64::MAX))
                .map(|(_, own)| own.unread())
                .sum()
        })
    }

    /// Merges what `user` (connected) follows in `thread` (`None`: they
    /// left the conversation, and follow it no more); returns the
    /// `own_thread` frame for their devices.
    pub fn own(&mut self, user: &str, thread: &ThreadId, own: Option<ThreadOwn>) -> ServerFrame {
        let threads = self.followed.entry(user.to_owned()).or_default();
        let now = match own {
            Some(mut own) => {
                if let Some(&(latest, _)) = self.recent.get(thread) {
                    own.latest_seq = own.latest_seq.max(latest);
                }
                let held = threads.entry(thread.clone()).or_default();
                held.merge(own);
                self.followers
                    .entry(thread.clone())
                    .or_default()
                    .insert(user.to_owned());
                Some(*held)
            }
            None => {
                threads.remove(thread);
                if let Some(users) = self.followers.get_mut(thread) {
                    users.remove(user);
                    if users.is_empty() {
                        self.followers.remove(thread);
                    }
                }
                None
            }
        };
        self.frame(user, thread, now)
    }

    /// A reply `thread_seq` in `thread` by `sender`: the frames for its
    /// connected followers whose state it moved, by user. The sender has
    /// read their own reply.
    pub fn reply(
        &mut self,
        thread: &ThreadId,
        thread_seq: u64,
        sender: &str,
        now: Instant,
    ) -> Vec<(String, ServerFrame)> {
        if self
            .pruned_at
            .is_none_or(|at| now.duration_since(at) >= RECENT_REPLIES)
        {
            self.recent
                .retain(|_, (_, seen)| now.duration_since(*seen) < RECENT_REPLIES);
            self.pruned_at = Some(now);
        }
        let recent = self.recent.entry(thread.clone()).or_insert((0, now));
        *recent = (recent.0.max(thread_seq), now);
        let Some(users) = self.followers.get(thread) else {
            return Vec::new();
        };
        let mut raised = Vec::new();
        for user in users {
            if let Some(own) = self.followed.get_mut(user).and_then(|t| t.get_mut(thread)) {
                if thread_seq > own.latest_seq {
                    own.latest_seq = thread_seq;
                    if user == sender {
                        own.cursor = own.cursor.max(thread_seq);
                    }
                    raised.push(user.clone());
                }
            }
        }
        raised
            .into_iter()
            .map(|user| {
                let own = self.followed[&user].get(thread).copied();
                let frame = self.frame(&user, thread, own);
                (user, frame)
            })
            .collect()
    }

    fn frame(&self, user: &str, (conversation, thread): &ThreadId, own: Option<ThreadOwn>) -> ServerFrame {
        let own_or_none = own.unwrap_or_default();
        ServerFrame::OwnThread {
            conversation: conversation.clone(),
            thread: *thread,
            cursor: own_or_none.cursor,
            private_cursor: own_or_none.private_cursor,
            latest_seq: own_or_none.latest_seq,
            unread: own.map_or(0, |o| o.unread()),
            thread_unread: self.unread_in(user, conversation),
            following: own.is_some(),
        }
    }

    /// The user's last connection here closed.
    pub fn forget_user(&mut self, user: &str) {
        for thread in self
            .followed
            .remove(user)
            .into_iter()
            .flat_map(BTreeMap::into_keys)
        {
            if let Some(users) = self.followers.get_mut(&thread) {
                users.remove(user);
                if users.is_empty() {
                    self.followers.remove(&thread);
                }
            }
        }
    }

    pub fn subscribe(&mut self, thread: ThreadId, id: ConnId, outbox: Arc<Outbox>) {
        self.rooms.entry(thread).or_default().insert(id, outbox);
    }

    pub fn unsubscribe(&mut self, thread: &ThreadId, id: ConnId) {
        if let Some(room) = self.rooms.get_mut(thread) {
            room.remove(&id);
            if room.is_empty() {
                self.rooms.remove(thread);
            }
        }
    }

    /// The connections subscribed to `thread` here.
    pub fn subscribers(&self, thread: &ThreadId) -> impl Iterator<Item = &Arc<Outbox>> {
        self.rooms.get(thread).into_iter().flat_map(HashMap::values)
    }

    /// Threads with a subscriber or a connected follower here.
    pub fn watched(&self) -> usize {
        self.rooms.len() + self.followers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(latest_seq: u64, cursor: u64, private_cursor: u64) -> Option<ThreadOwn> {
        Some(ThreadOwn {
            latest_seq,
            cursor,
            private_cursor,
        })
    }

    fn unread_of(frame: &ServerFrame) -> (u64, u64, bool) {
        match frame {
            ServerFrame::OwnThread {
                unread,
                thread_unread,
                following,
                ..
            } => (*unread, *thread_unread, *following),
            other => panic!("not an own_thread frame: {other:?}"),
        }
    }

    #[test]
    fn thread_unread_sums_the_followed_threads_of_one_conversation() {
        let mut threads = Threads::default();
        let (t1, t2, other) = (("G".to_owned(), 1), ("G".to_owned(), 2), ("H".to_owned(), 1));
        assert_eq!(unread_of(&threads.own("u", &t1, own(3, 1, 0))), (2, 2, true));
        assert_eq!(unread_of(&threads.own("u", &t2, own(5, 0, 4))), (1, 3, true));
        assert_eq!(unread_of(&threads.own("u", &other, own(9, 0, 0))), (9, 9, true));
        assert_eq!(threads.unread_in("u", "G"), 3);
        // An older record changes nothing: every value is max-merged.
        assert_eq!(unread_of(&threads.own("u", &t1, own(2, 0, 0))), (2, 3, true));
        // A read on another device clears the thread, and the sum with it.
        assert_eq!(unread_of(&threads.own("u", &t1, own(3, 0, 3))), (0, 1, true));
        // A reply raises every connected follower's unread at once.
        threads.own("v", &t2, own(5, 5, 0));
        let now = Instant::now();
        let mut raised = threads.reply(&t2, 6, "w", now);
        raised.sort_by(|a, b| a.0.cmp(&b.0));
        let raised: Vec<_> = raised.iter().map(|(u, f)| (u.as_str(), unread_of(f))).collect();
        assert_eq!(raised, [("u", (2, 2, true)), ("v", (1, 1, true))]);
        assert!(threads.reply(&t2, 6, "w", now).is_empty(), "a reply seen already");
        // A departure: followed no more, counted no more.
        assert_eq!(unread_of(&threads.own("u", &t2, None)), (0, 0, false));
        assert!(threads.reply(&t2, 7, "w", now).iter().all(|(u, _)| u == "v"));
        // The sender's own reply is not unread to them.
        let sent: Vec<_> = threads.reply(&t2, 8, "v", now);
        assert_eq!(sent.len(), 1);
        assert_eq!(unread_of(&sent[0].1), (0, 0, true));
        threads.forget_user("v");
        assert!(threads.reply(&t2, 9, "w", now).is_empty());
        assert_eq!(threads.unread_in("u", "H"), 9);
    }

    #[test]
    fn a_follower_whose_record_comes_after_a_reply_counts_it() {
        let mut threads = Threads::default();
        let t = ("G".to_owned(), 1);
        let start = Instant::now();
        // Reply 2 is seen before the starter's record of reply 1.
        threads.reply(&t, 2, "w", start);
        assert_eq!(unread_of(&threads.own("u", &t, own(1, 0, 0))), (2, 2, true));
        // Long after, a pruning forgets it.
        threads.reply(&("G".to_owned(), 9), 1, "w", start + RECENT_REPLIES);
        assert_eq!(unread_of(&threads.own("v", &t, own(1, 1, 0))), (0, 0, true));
    }
}
