//! The read half: a conversation's three keys in one pipelined round trip,
//! as the core's read model.

use std::collections::HashMap;

use readfold_core::{ConversationView, MemberCursor, Seq, UserId};

use super::{keys, RedisStore};
use crate::error::Result;

impl RedisStore {
    /// The conversation's present members and latest seq; `None` when Redis
    /// holds nothing of it (never written, evicted or flushed). Ids that are
    /// not valid user ids (written by hand) are skipped.
    pub async fn conversation(&self, conversation_id: &str) -> Result<Option<ConversationView>> {
        let [cursors, latest, joined] = keys(&self.prefix, conversation_id);
        let mut conn = self.conn.clone();
        let (cursors, latest, joined): (HashMap<String, u64>, Option<u64>, HashMap<String, u64>) =
            redis::pipe()
                .cmd("HGETALL")
                .arg(&cursors)
                .cmd("GET")
                .arg(&latest)
                .cmd("HGETALL")
                .arg(&joined)
                .query_async(&mut conn)
                .await?;
        if cursors.is_empty() && latest.is_none() {
            return Ok(None);
        }
        let members = cursors
            .into_iter()
            .filter_map(|(user, cursor)| {
                let join_seq = joined.get(&user).copied().unwrap_or(1).max(1);
                // Written by readfold, so already within `input.max_id_bytes`.
                let user = UserId::parse(&user, usize::MAX).ok()?;
                Some((
                    user,
                    MemberCursor {
                        cursor: Seq(cursor),
                        join_seq: Seq(join_seq),
                    },
                ))
            })
            .collect();
        Ok(Some(ConversationView {
            latest_seq: Seq(latest.unwrap_or(0)),
            members,
        }))
    }
}
