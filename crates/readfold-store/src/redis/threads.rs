//! Thread cursors in Redis, in the conversation's slot as its cursors are:
//!
//! - `P:{C}:threads` hash thread -> latest thread seq;
//! - `P:{C}:t:<T>` hash user -> `<epoch>:<cursor>:<join_seq>` of each
//!   follower of thread T (cursor -1: departed in that epoch);
//! - `P:user:{U}:threads` hash `<T>:<C>` -> `<epoch>:<private cursor>` of
//!   every thread U follows (private cursor -1: departed).
//!
//! Written by `merge_threads.lua` (one call per conversation) and
//! `merge_thread_private.lua` (one per user), ordered by the member's
//! membership epoch as the conversation's cursors are.

use std::collections::BTreeMap;

use readfold_core::fold::ThreadChange;
use readfold_core::{ConversationId, ConversationView, MemberCursor, Seq, UserId};

use super::write::pipelines;
use super::RedisStore;
use crate::error::Result;

pub const MERGE_THREADS_SCRIPT: &str = include_str!("merge_threads.lua");
pub const MERGE_THREAD_PRIVATE_SCRIPT: &str = include_str!("merge_thread_private.lua");

/// A thread one user follows, as their own devices see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserThread {
    pub conversation_id: ConversationId,
    pub thread: Seq,
    pub epoch: u64,
    /// `None`: they departed the conversation.
    pub private_cursor: Option<Seq>,
}

/// A thread one user follows, with what their unread in it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowedThread {
    pub conversation_id: ConversationId,
    pub thread: Seq,
    pub latest_seq: Seq,
    /// Their public cursor (never below `join_seq - 1`) and private one.
    pub cursor: Seq,
    pub join_seq: Seq,
    pub private_cursor: Seq,
}

impl FollowedThread {
    /// Their own unread in the thread.
    pub fn unread(&self) -> u64 {
        readfold_core::fold::thread_own_unread(self.latest_seq, self.cursor, self.private_cursor)
    }
}

/// `<epoch>:<cursor>[:<join_seq>]` as numbers; `None` if it is not that.
fn parse(value: &str) -> Option<Vec<i64>> {
    value.split(':').map(|n| n.parse().ok()).collect()
}

impl RedisStore {
    fn threads_key(&self, conversation: &str) -> String {
        format!("{}:{{{conversation}}}:threads", self.prefix)
    }

    fn thread_key(&self, conversation: &str, thread: Seq) -> String {
        format!("{}:{{{conversation}}}:t:{thread}", self.prefix)
    }

    fn user_threads_key(&self, user: &str) -> String {
        format!("{}:user:{{{user}}}:threads", self.prefix)
    }

    /// Max-merges a flush's thread changes: the public ones per
    /// conversation, all of them per user. Returns the values written.
    pub async fn merge_threads<'a>(
        &self,
        changes: impl IntoIterator<Item = &'a ThreadChange>,
    ) -> Result<u64> {
        let mut by_conversation: BTreeMap<&ConversationId, BTreeMap<Seq, Vec<&ThreadChange>>> =
            BTreeMap::new();
        let mut by_user: BTreeMap<&UserId, Vec<&ThreadChange>> = BTreeMap::new();
        for change in changes {
            let key = &change.key;
            if change.outputs.public {
                by_conversation
                    .entry(&key.conversation_id)
                    .or_default()
                    .entry(key.thread)
                    .or_default()
                    .push(change);
            }
            by_user.entry(&key.user_id).or_default().push(change);
        }
        let public = by_conversation.into_iter().map(|(conversation, threads)| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.thread_script.get_hash()).arg(1 + threads.len());
            cmd.arg(self.threads_key(conversation.as_str()));
            for &thread in threads.keys() {
                cmd.arg(self.thread_key(conversation.as_str(), thread));
            }
            for (thread, followers) in &threads {
                let latest = followers.iter().map(|c| c.latest_seq).max().unwrap_or_default();
                cmd.arg(thread.get()).arg(latest.get()).arg(followers.len());
                for c in followers {
                    let cursor = if c.present { c.cursor.get() as i64 } else { -1 };
                    cmd.arg(c.key.user_id.as_str())
                        .arg(c.epoch)
                        .arg(cursor)
                        .arg(c.join_seq.get());
                }
            }
            cmd
        });
        let private = by_user.into_iter().map(|(user, changes)| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.thread_private_script.get_hash())
                .arg(1)
                .arg(self.user_threads_key(user.as_str()));
            for c in changes {
                let private = if c.present {
                    c.private_cursor.get() as i64
                } else {
                    -1
                };
                cmd.arg(format!("{}:{}", c.key.thread, c.key.conversation_id))
                    .arg(c.epoch)
                    .arg(private);
            }
            cmd
        });
        let cmds: Vec<redis::Cmd> = public.chain(private).collect();
        if cmds.is_empty() {
            return Ok(0);
        }
        self.run_all(pipelines(cmds.into_iter())).await
    }

    /// One thread as readers see it: its latest reply and its present
    /// followers; `None` when Redis holds nothing of it.
    pub async fn read_thread(
        &self,
        conversation: &ConversationId,
        thread: Seq,
    ) -> Result<Option<ConversationView>> {
        let mut conn = self.conn.clone();
        let (latest, followers): (Option<u64>, BTreeMap<String, String>) = redis::pipe()
            .cmd("HGET")
            .arg(self.threads_key(conversation.as_str()))
            .arg(thread.get())
            .cmd("HGETALL")
            .arg(self.thread_key(conversation.as_str(), thread))
            .query_async(&mut conn)
            .await?;
        if latest.is_none() && followers.is_empty() {
            return Ok(None);
        }
        let members = followers
            .into_iter()
            .filter_map(|(user, value)| {
                let [_, cursor, join] = parse(&value)?[..] else {
                    return None;
                };
                let user = UserId::parse(&user, usize::MAX).ok()?;
                let cursor = Seq(u64::try_from(cursor).ok()?);
                Some((
                    user,
                    MemberCursor {
                        cursor,
                        delivered: cursor,
                        join_seq: Seq(join.max(1) as u64),
                    },
                ))
            })
            .collect();
        Ok(Some(ConversationView {
            latest_seq: Seq(latest.unwrap_or(0)),
            members,
        }))
    }

    /// The threads `user` follows (as a present member), each with its
    /// latest reply and their cursors: their index, then one round trip.
    pub async fn read_followed_threads(&self, user: &UserId) -> Result<Vec<FollowedThread>> {
        let followed: Vec<UserThread> = self
            .read_user_threads(user)
            .await?
            .into_iter()
            .filter(|t| t.private_cursor.is_some())
            .collect();
        if followed.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for t in &followed {
            let conversation = t.conversation_id.as_str();
            pipe.cmd("HGET")
                .arg(self.threads_key(conversation))
                .arg(t.thread.get());
            pipe.cmd("HGET")
                .arg(self.thread_key(conversation, t.thread))
                .arg(user.as_str());
        }
        let mut conn = self.conn.clone();
        let answers: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
        Ok(followed
            .into_iter()
            .zip(answers.chunks(2))
            .filter_map(|(t, answer)| {
                let latest = answer[0].as_deref().and_then(|l| l.parse().ok()).unwrap_or(0);
                let [_, cursor, join] = parse(answer[1].as_deref()?)?[..] else {
                    return None;
                };
                Some(FollowedThread {
                    conversation_id: t.conversation_id,
                    thread: t.thread,
                    latest_seq: Seq(latest),
                    cursor: Seq(u64::try_from(cursor).ok()?),
                    join_seq: Seq(join.max(1) as u64),
                    private_cursor: t.private_cursor.unwrap_or_default(),
                })
            })
            .collect())
    }

    /// Every thread `user` follows or followed, with their private cursor.
    pub async fn read_user_threads(&self, user: &UserId) -> Result<Vec<UserThread>> {
        let mut conn = self.conn.clone();
        let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(self.user_threads_key(user.as_str()))
            .query_async(&mut conn)
            .await?;
        Ok(fields
            .into_iter()
            .filter_map(|(field, value)| {
                let (thread, conversation) = field.split_once(':')?;
                let [epoch, private] = parse(&value)?[..] else {
                    return None;
                };
                Some(UserThread {
                    conversation_id: ConversationId::parse(conversation, usize::MAX).ok()?,
                    thread: Seq(thread.parse().ok()?),
                    epoch: epoch.max(0) as u64,
                    private_cursor: u64::try_from(private).ok().map(Seq),
                })
            })
            .collect())
    }
}
