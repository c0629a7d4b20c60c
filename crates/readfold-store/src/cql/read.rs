//! The read half: a conversation's rows as the core's read model. A row
//! with no delivered cursor (written before the column existed) reads it as
//! the cursor.

use std::collections::BTreeMap;

use readfold_core::fold::UnreadMark;
use readfold_core::{ConversationId, ConversationView, CursorKey, MemberCursor, Mute, Seq, UserId};

use super::write::decode_mentions;
use super::CqlStore;
use crate::error::{Error, Result};
use crate::redis::PrivateState;

/// A stored bigint as a seq; negative values are never written.
fn seq(n: i64) -> Seq {
    Seq(n.max(0) as u64)
}

/// An id as readfold wrote it, so already within `input.max_id_bytes`.
fn user(id: &str) -> Option<UserId> {
    UserId::parse(id, usize::MAX).ok()
}

impl CqlStore {
    /// The conversation's members and latest seq; `None` when CQL holds no
    /// row of it.
    pub async fn conversation(&self, conversation_id: &str) -> Result<Option<ConversationView>> {
        let ks = &self.keyspace;
        let columns = self.member_columns();
        let rows = self
            .session
            .query_unpaged(
                format!("SELECT user_id, {columns} FROM {ks}.cursors WHERE conversation_id = ?"),
                (conversation_id,),
            )
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?;
        let mut members = BTreeMap::new();
        for row in rows
            .rows::<(String, i64, i64, Option<i64>)>()
            .map_err(Error::cql_result)?
        {
            let (id, cursor, join_seq, delivered) = row.map_err(Error::cql_result)?;
            if let Some(id) = user(&id) {
                members.insert(id, member(cursor, join_seq, delivered));
            }
        }
        let latest = self
            .session
            .query_unpaged(
                format!("SELECT latest_seq FROM {ks}.conversations WHERE conversation_id = ?"),
                (conversation_id,),
            )
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?
            .maybe_first_row::<(i64,)>()
            .map_err(Error::cql_result)?
            .map(|(l,)| seq(l));
        if members.is_empty() && latest.is_none() {
            return Ok(None);
        }
        Ok(Some(ConversationView {
            latest_seq: latest.unwrap_or(Seq::ZERO),
            members,
        }))
    }

    /// Every cursor row of the keyspace, in one unpaged scan: for tests and
    /// small checks, not for production reads.
    pub async fn scan(&self) -> Result<BTreeMap<CursorKey, MemberCursor>> {
        let rows = self
            .session
            .query_unpaged(
                format!(
                    "SELECT conversation_id, user_id, {} FROM {}.cursors",
                    self.member_columns(),
                    self.keyspace
                ),
                (),
            )
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?;
        let mut out = BTreeMap::new();
        for row in rows
            .rows::<(String, String, i64, i64, Option<i64>)>()
            .map_err(Error::cql_result)?
        {
            let (c, u, cursor, join_seq, delivered) = row.map_err(Error::cql_result)?;
            let (Ok(conversation_id), Some(user_id)) = (ConversationId::parse(&c, usize::MAX), user(&u))
            else {
                continue;
            };
            out.insert(
                CursorKey {
                    conversation_id,
                    user_id,
                },
                member(cursor, join_seq, delivered),
            );
        }
        Ok(out)
    }

    /// A user's private state in each of `conversations`, in that order
    /// (defaults where CQL holds none). The mark's time is not stored: it
    /// is the cell's write time, and only orders writes. Unread mentions
    /// count above the stored read point and the private cursor.
    pub async fn private_state(&self, user_id: &str, conversations: &[&str]) -> Result<Vec<PrivateState>> {
        self.private_state_above(user_id, conversations, &[]).await
    }

    /// [`private_state`](Self::private_state), with unread mentions also
    /// above the public cursor `public[i]` of the i-th conversation (0 where
    /// it is not given): a public read rewrites no private row, so the
    /// stored read point may lag it.
    pub async fn private_state_above(
        &self,
        user_id: &str,
        conversations: &[&str],
        public: &[Seq],
    ) -> Result<Vec<PrivateState>> {
        // A table no writer of this version has upgraded yet has none of
        // the later columns: read without them.
        let extras = self.reads_private_extras();
        let columns = if extras {
            "conversation_id, private_cursor, unread_mark, WRITETIME(unread_mark), mentions, mute_at, muted_until"
        } else {
            "conversation_id, private_cursor, unread_mark, WRITETIME(unread_mark)"
        };
        let rows = self
            .session
            .query_unpaged(
                format!(
                    "SELECT {columns} FROM {}.user_cursors WHERE user_id = ?",
                    self.keyspace
                ),
                (user_id,),
            )
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?;
        type Base = (String, Option<i64>, Option<i64>, Option<i64>);
        type Extras = (Option<Vec<i64>>, Option<i64>, Option<i64>);
        let mut all: Vec<(Base, Extras)> = Vec::new();
        if extras {
            type Columns = (
                String,
                Option<i64>,
                Option<i64>,
                Option<i64>,
                Option<Vec<i64>>,
                Option<i64>,
                Option<i64>,
            );
            for row in rows.rows::<Columns>().map_err(Error::cql_result)? {
                let (c, p, m, at, mentions, mute_at, until) = row.map_err(Error::cql_result)?;
                all.push(((c, p, m, at), (mentions, mute_at, until)));
            }
        } else {
            for row in rows.rows::<Base>().map_err(Error::cql_result)? {
                all.push((row.map_err(Error::cql_result)?, (None, None, None)));
            }
        }
        let mut found = BTreeMap::new();
        for ((conversation, cursor, mark, mark_at), (mentions, mute_at, muted_until)) in all {
            let mark = mark.zip(mark_at).map(|(value, at)| UnreadMark {
                at,
                seq: (value >= 0).then(|| seq(value)),
            });
            let mentions = mentions.as_deref().map(decode_mentions);
            let mute = mute_at.zip(muted_until).map(|(at, until)| Mute { at, until });
            found.insert(conversation, (seq(cursor.unwrap_or(0)), mark, mentions, mute));
        }
        Ok(conversations
            .iter()
            .enumerate()
            .map(|(i, c)| {
                found
                    .get(*c)
                    .map_or_else(PrivateState::default, |(cursor, mark, mentions, mute)| {
                        let public = public.get(i).copied().unwrap_or(Seq::ZERO);
                        PrivateState::from_parts(*cursor, *mark, mentions.clone(), *mute, public)
                    })
            })
            .collect())
    }

    /// The `cursors` columns of a member, as [`member`] takes them: cursor,
    /// join_seq, delivered; the cursor again for delivered where the table
    /// has no such column yet.
    fn member_columns(&self) -> &'static str {
        if self.reads_delivered() {
            "cursor, join_seq, delivered"
        } else {
            "cursor, join_seq, cursor"
        }
    }

    /// The latest seq CQL holds for a conversation.
    pub async fn latest_seq(&self, conversation_id: &str) -> Result<Option<Seq>> {
        Ok(self.conversation(conversation_id).await?.map(|v| v.latest_seq))
    }
}

/// A member as stored; no delivered cursor (a row written before the
/// column) reads as the cursor, and none reads below it.
fn member(cursor: i64, join_seq: i64, delivered: Option<i64>) -> MemberCursor {
    MemberCursor {
        cursor: seq(cursor),
        delivered: seq(delivered.unwrap_or(cursor).max(cursor)),
        join_seq: Seq(join_seq.max(1) as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_without_a_delivered_cursor_reads_the_cursor() {
        assert_eq!(member(5, 1, None).delivered, Seq(5));
        assert_eq!(member(5, 1, Some(9)).delivered, Seq(9));
        // Written by an earlier writer after this one: never below.
        assert_eq!(member(5, 1, Some(3)).delivered, Seq(5));
        assert_eq!(member(5, 0, None).join_seq, Seq(1));
    }
}
