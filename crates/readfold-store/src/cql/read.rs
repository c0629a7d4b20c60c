//! The read half: a conversation's rows as the core's read model. A row
//! with no delivered cursor (written before the column existed) reads it as
//! the cursor.

use std::collections::BTreeMap;

use readfold_core::fold::UnreadMark;
use readfold_core::{ConversationId, ConversationView, CursorKey, MemberCursor, Seq, UserId};

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
    /// is the cell's write time, and only orders writes.
    pub async fn private_state(&self, user_id: &str, conversations: &[&str]) -> Result<Vec<PrivateState>> {
        let rows = self
            .session
            .query_unpaged(
                format!(
                    "SELECT conversation_id, private_cursor, unread_mark, WRITETIME(unread_mark) \
                     FROM {}.user_cursors WHERE user_id = ?",
                    self.keyspace
                ),
                (user_id,),
            )
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?;
        let mut found = BTreeMap::new();
        for row in rows
            .rows::<(String, Option<i64>, Option<i64>, Option<i64>)>()
            .map_err(Error::cql_result)?
        {
            let (conversation, cursor, mark, mark_at) = row.map_err(Error::cql_result)?;
            found.insert(
                conversation,
                PrivateState {
                    private_cursor: seq(cursor.unwrap_or(0)),
                    mark: mark.zip(mark_at).map(|(value, at)| UnreadMark {
                        at,
                        seq: (value >= 0).then(|| seq(value)),
                    }),
                },
            );
        }
        Ok(conversations
            .iter()
            .map(|c| found.get(*c).copied().unwrap_or_default())
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
