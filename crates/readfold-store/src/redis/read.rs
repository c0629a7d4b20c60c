//! The read half: a conversation's keys in one pipelined round trip, as
//! the core's read model. A member's delivered cursor is the higher of
//! their `delivered` field (written only above the cursor) and their
//! cursor.

use std::collections::HashMap;

use readfold_core::fold::UnreadMark;
use readfold_core::{ConversationView, MemberCursor, Mute, Seq, UserId};

use super::{keys, user_keys, RedisStore};
use crate::error::Result;
use crate::mentions::Mentions;

impl RedisStore {
    /// The conversation's present members and latest seq; `None` when Redis
    /// holds nothing of it (never written, evicted or flushed). Ids that are
    /// not valid user ids (written by hand) are skipped.
    pub async fn conversation(&self, conversation_id: &str) -> Result<Option<ConversationView>> {
        let [cursors, latest, joined, _, delivered] = keys(&self.prefix, conversation_id);
        let mut conn = self.conn.clone();
        type Answer = (
            HashMap<String, u64>,
            Option<u64>,
            HashMap<String, u64>,
            HashMap<String, u64>,
        );
        let (cursors, latest, joined, delivered): Answer = redis::pipe()
            .cmd("HGETALL")
            .arg(&cursors)
            .cmd("GET")
            .arg(&latest)
            .cmd("HGETALL")
            .arg(&joined)
            .cmd("HGETALL")
            .arg(&delivered)
            .query_async(&mut conn)
            .await?;
        if cursors.is_empty() && latest.is_none() {
            return Ok(None);
        }
        let members = cursors
            .into_iter()
            .filter_map(|(user, cursor)| {
                let join_seq = joined_seq(joined.get(&user).copied().unwrap_or(1));
                let delivered = delivered.get(&user).copied();
                // Written by readfold, so already within `input.max_id_bytes`.
                let user = UserId::parse(&user, usize::MAX).ok()?;
                Some((user, member(cursor, delivered, join_seq)))
            })
            .collect();
        Ok(Some(ConversationView {
            latest_seq: Seq(latest.unwrap_or(0)),
            members,
        }))
    }

    /// One user's cursor in each of `conversation_ids`, in one pipelined
    /// round trip; `None` where the user has none (not a member, or Redis
    /// holds nothing of the conversation).
    pub async fn user_cursors(&self, conversation_ids: &[&str], user_id: &str) -> Result<Vec<Option<Seq>>> {
        let mut pipe = redis::pipe();
        for conversation_id in conversation_ids {
            let [cursors, ..] = keys(&self.prefix, conversation_id);
            pipe.cmd("HGET").arg(cursors).arg(user_id);
        }
        let mut conn = self.conn.clone();
        let cursors: Vec<Option<u64>> = pipe.query_async(&mut conn).await?;
        Ok(cursors.into_iter().map(|c| c.map(Seq)).collect())
    }
}

/// What only a user's own devices see of one conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrivateState {
    pub private_cursor: Seq,
    pub mark: Option<UnreadMark>,
    /// Mentions above the stored read point and the cursors the store read
    /// (the private cursor, and the public one where it was read too).
    pub unread_mentions: u32,
    /// The latest mute or unmute.
    pub mute: Option<Mute>,
}

impl PrivateState {
    /// The state from its stored parts; `public` is the public cursor when
    /// the read has it.
    pub(crate) fn from_parts(
        private_cursor: Seq,
        mark: Option<UnreadMark>,
        mentions: Option<Mentions>,
        mute: Option<Mute>,
        public: Seq,
    ) -> Self {
        PrivateState {
            private_cursor,
            mark,
            unread_mentions: mentions.map_or(0, |m| m.unread(private_cursor.max(public))),
            mute,
        }
    }
}

impl RedisStore {
    /// A user's private state in each of `conversations`, in that order
    /// (defaults where Redis holds none).
    pub async fn private_state(&self, user_id: &str, conversations: &[&str]) -> Result<Vec<PrivateState>> {
        if conversations.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for key in user_keys(&self.prefix, user_id) {
            pipe.cmd("HMGET").arg(key).arg(conversations);
        }
        type Answer = (
            Vec<Option<u64>>,
            Vec<Option<String>>,
            Vec<Option<String>>,
            Vec<Option<String>>,
        );
        let (cursors, marks, mentions, mutes): Answer = pipe.query_async(&mut conn).await?;
        Ok(private_states(cursors, marks, mentions, mutes, |_| Seq::ZERO))
    }
}

/// One conversation as one user sees it: its latest seq and the user's
/// public and delivered cursors when they are a present member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub latest_seq: Seq,
    pub member: Option<MemberCursor>,
}

/// What [`RedisStore::member_views`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserViews {
    /// Per conversation, in the order asked; `None` when Redis holds nothing
    /// of it.
    pub conversations: Vec<Option<MemberView>>,
    /// The user's private state per conversation; `None` when Redis holds no
    /// private state of the user at all (never any, or lost).
    pub private: Option<Vec<PrivateState>>,
}

impl RedisStore {
    /// A user's view of many conversations in one round trip: for a badge
    /// list.
    pub async fn member_views(&self, user_id: &str, conversations: &[&str]) -> Result<UserViews> {
        if conversations.is_empty() {
            return Ok(UserViews {
                conversations: Vec::new(),
                private: Some(Vec::new()),
            });
        }
        let mut pipe = redis::pipe();
        for conversation in conversations {
            let [cursors, latest, joined, _, delivered] = keys(&self.prefix, conversation);
            pipe.cmd("EXISTS")
                .arg(&cursors)
                .cmd("GET")
                .arg(&latest)
                .cmd("HGET")
                .arg(&cursors)
                .arg(user_id)
                .cmd("HGET")
                .arg(&joined)
                .arg(user_id)
                .cmd("HGET")
                .arg(&delivered)
                .arg(user_id);
        }
        let user_keys = user_keys(&self.prefix, user_id);
        pipe.cmd("EXISTS").arg(&user_keys[..]);
        for key in &user_keys {
            pipe.cmd("HMGET").arg(key).arg(conversations);
        }
        let mut conn = self.conn.clone();
        let values: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let n = conversations.len();
        let mut views = Vec::with_capacity(n);
        let per = VIEW_COMMANDS;
        for chunk in values[..per * n].chunks(per) {
            let exists: u64 = redis::from_redis_value_ref(&chunk[0])?;
            let latest: Option<u64> = redis::from_redis_value_ref(&chunk[1])?;
            let cursor: Option<u64> = redis::from_redis_value_ref(&chunk[2])?;
            let joined: Option<u64> = redis::from_redis_value_ref(&chunk[3])?;
            let delivered: Option<u64> = redis::from_redis_value_ref(&chunk[4])?;
            views.push((exists > 0 || latest.is_some()).then(|| MemberView {
                latest_seq: Seq(latest.unwrap_or(0)),
                member: cursor.map(|c| member(c, delivered, joined_seq(joined.unwrap_or(1)))),
            }));
        }
        let has_private: u64 = redis::from_redis_value_ref(&values[per * n])?;
        let cursors: Vec<Option<u64>> = redis::from_redis_value_ref(&values[per * n + 1])?;
        let marks: Vec<Option<String>> = redis::from_redis_value_ref(&values[per * n + 2])?;
        let mentions: Vec<Option<String>> = redis::from_redis_value_ref(&values[per * n + 3])?;
        let mutes: Vec<Option<String>> = redis::from_redis_value_ref(&values[per * n + 4])?;
        let private = (has_private > 0).then(|| {
            private_states(cursors, marks, mentions, mutes, |i| {
                views[i].and_then(|v| v.member).map_or(Seq::ZERO, |m| m.cursor)
            })
        });
        Ok(UserViews {
            conversations: views,
            private,
        })
    }
}

/// Commands [`RedisStore::member_views`] sends per conversation.
const VIEW_COMMANDS: usize = 5;

/// A present member as stored: their cursor, their delivered field if any
/// (never read below the cursor) and their join_seq.
fn member(cursor: u64, delivered: Option<u64>, join_seq: Seq) -> MemberCursor {
    MemberCursor {
        cursor: Seq(cursor),
        delivered: Seq(delivered.unwrap_or(0).max(cursor)),
        join_seq,
    }
}

/// A stored join_seq; a member missing from `joined` (or at 0) joined at 1.
fn joined_seq(stored: u64) -> Seq {
    Seq(stored.max(1))
}

/// The private states from the answers of one HMGET per user key, in
/// conversation order; `public(i)` is the public cursor read of the i-th.
fn private_states(
    cursors: Vec<Option<u64>>,
    marks: Vec<Option<String>>,
    mentions: Vec<Option<String>>,
    mutes: Vec<Option<String>>,
    public: impl Fn(usize) -> Seq,
) -> Vec<PrivateState> {
    cursors
        .into_iter()
        .zip(marks)
        .zip(mentions.into_iter().zip(mutes))
        .enumerate()
        .map(|(i, ((cursor, mark), (mentions, mute)))| {
            PrivateState::from_parts(
                Seq(cursor.unwrap_or(0)),
                mark.as_deref().and_then(parse_mark),
                mentions.as_deref().and_then(Mentions::decode),
                mute.as_deref().and_then(parse_mute),
                public(i),
            )
        })
        .collect()
}

/// `<at>:<until>` of a mute or an unmute.
fn parse_mute(text: &str) -> Option<Mute> {
    let (at, until) = text.split_once(':')?;
    Some(Mute {
        at: at.parse().ok()?,
        until: until.parse().ok()?,
    })
}

/// `<at>:<seq>`, seq -1 for a cleared mark.
fn parse_mark(text: &str) -> Option<UnreadMark> {
    let (at, seq) = text.rsplit_once(':')?;
    let seq: i64 = seq.parse().ok()?;
    Some(UnreadMark {
        at: at.parse().ok()?,
        seq: (seq >= 0).then_some(Seq(seq as u64)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivered_field_counts_only_above_the_cursor() {
        let at = |cursor, delivered| member(cursor, delivered, Seq(1)).delivered;
        assert_eq!(at(5, None), Seq(5), "no field: delivered as far as read");
        assert_eq!(at(5, Some(9)), Seq(9));
        // A field the cursor has since passed says nothing.
        assert_eq!(at(5, Some(3)), Seq(5));
        assert_eq!(member(5, None, joined_seq(0)).join_seq, Seq(1));
    }

    #[test]
    fn marks_parse_as_the_script_writes_them() {
        assert_eq!(
            parse_mark("1700000000000:5"),
            Some(UnreadMark {
                at: 1_700_000_000_000,
                seq: Some(Seq(5))
            })
        );
        assert_eq!(parse_mark("-3:-1"), Some(UnreadMark { at: -3, seq: None }));
        assert_eq!(parse_mark("garbage"), None);
    }

    #[test]
    fn mutes_parse_as_the_script_writes_them() {
        let forever = format!("-5:{}", Mute::FOREVER);
        assert_eq!(
            parse_mute(&forever),
            Some(Mute {
                at: -5,
                until: Mute::FOREVER
            })
        );
        let off = format!("7:{}", Mute::OFF);
        assert_eq!(
            parse_mute(&off),
            Some(Mute {
                at: 7,
                until: Mute::OFF
            })
        );
        assert_eq!(parse_mute("7"), None);
    }

    #[test]
    fn unread_mentions_count_above_every_cursor_known() {
        let states = private_states(
            vec![Some(6), None, None],
            vec![None, None, None],
            vec![Some("2:5,7,9".into()), Some("2:5,7,9".into()), None],
            vec![None, Some("1:-1".into()), None],
            |i| Seq(if i == 1 { 8 } else { 0 }),
        );
        let counts: Vec<u32> = states.iter().map(|s| s.unread_mentions).collect();
        assert_eq!(counts, [2, 1, 0]);
        assert_eq!(states[1].mute, Some(Mute { at: 1, until: -1 }));
    }
}
