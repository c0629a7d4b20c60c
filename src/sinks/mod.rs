//! Sinks that hold cursors outside Kafka. Each one receives a flush's changes
//! grouped by conversation and must merge them with `max`, so that a replay
//! or a racing writer never lowers a stored cursor.

pub mod cql;
pub mod redis;

use std::collections::BTreeMap;

use crate::domain::{ConversationId, Seq, UserId};
use crate::fold::Change;

/// One member's new state, as sinks store it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberWrite {
    pub user_id: UserId,
    pub cursor: Seq,
    pub join_seq: Seq,
    /// The member left: sinks forget them.
    pub left: bool,
}

/// The changes of one conversation in one flush.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversationBatch {
    pub conversation_id: ConversationId,
    /// Highest `latest_seq` among the changes (0 if only departures).
    pub latest_seq: Seq,
    pub members: Vec<MemberWrite>,
}

/// Groups a flush's changes by conversation, in conversation order.
pub fn group_by_conversation<'a>(changes: impl IntoIterator<Item = &'a Change>) -> Vec<ConversationBatch> {
    let mut by_conv: BTreeMap<ConversationId, ConversationBatch> = BTreeMap::new();
    for change in changes {
        let key = change.key();
        let batch = by_conv
            .entry(key.conversation_id.clone())
            .or_insert_with(|| ConversationBatch {
                conversation_id: key.conversation_id.clone(),
                latest_seq: Seq::ZERO,
                members: Vec::new(),
            });
        match change {
            Change::Upsert(u) => {
                batch.latest_seq = batch.latest_seq.max(u.latest_seq);
                batch.members.push(MemberWrite {
                    user_id: u.user_id.clone(),
                    cursor: u.cursor,
                    join_seq: u.join_seq,
                    left: false,
                });
            }
            Change::Left(k) => batch.members.push(MemberWrite {
                user_id: k.user_id.clone(),
                cursor: Seq::ZERO,
                join_seq: Seq::ZERO,
                left: true,
            }),
        }
    }
    by_conv.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::CursorKey;
    use crate::fold::CursorUpdate;

    #[test]
    fn groups_changes_by_conversation() {
        let up = |c: &str, u: &str, cursor, latest| {
            Change::Upsert(CursorUpdate {
                conversation_id: c.parse().unwrap(),
                user_id: u.parse().unwrap(),
                cursor: Seq(cursor),
                join_seq: Seq(1),
                latest_seq: Seq(latest),
                updated_at: 0,
            })
        };
        let left = Change::Left(CursorKey {
            conversation_id: "A".parse().unwrap(),
            user_id: "z".parse().unwrap(),
        });
        let batches =
            group_by_conversation(&[up("B", "x", 1, 4), up("A", "y", 2, 3), left, up("B", "w", 3, 5)]);
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].conversation_id.as_str(), "A");
        assert_eq!(batches[0].latest_seq, Seq(3));
        assert_eq!(batches[0].members.len(), 2);
        assert!(batches[0].members[1].left);
        assert_eq!(batches[1].latest_seq, Seq(5));
        assert_eq!(batches[1].members.len(), 2);
    }
}
