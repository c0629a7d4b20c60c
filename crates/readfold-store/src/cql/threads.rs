//! Thread cursors in CQL, written by snapshots as the conversation's are:
//!
//! - `threads`: each thread's latest reply, one partition per conversation,
//!   at the reply's thread seq;
//! - `thread_cursors`: each follower's public cursor and join point, one
//!   partition per thread, at `epoch << 40 | cursor`, a departure deleting
//!   the row at the epoch's departure timestamp (as `cursors` rows are);
//! - `user_threads`: the threads a user follows with their private cursor,
//!   one partition per user, ordered the same way by the private cursor.

use std::collections::BTreeMap;

use readfold_core::fold::ThreadChange;
use readfold_core::{ConversationId, ConversationView, MemberCursor, Seq, UserId};
use scylla::value::CqlTimestamp;

use super::write::{bigint, cursor_timestamp, departure_timestamp, Row};
use super::CqlStore;
use crate::error::{Error, Result};
use crate::redis::FollowedThread;

/// A stored bigint as a seq; negative values are never written.
fn seq(n: i64) -> Seq {
    Seq(n.max(0) as u64)
}

impl CqlStore {
    /// Max-merges a snapshot's thread followers: each thread's latest
    /// reply, the public rows of changes that concern them, and every
    /// follower's own row. Returns the `thread_cursors` rows written or
    /// deleted.
    pub async fn merge_threads<'a>(
        &self,
        changes: impl IntoIterator<Item = &'a ThreadChange>,
    ) -> Result<u64> {
        self.write_rows(thread_rows(changes)?).await
    }

    /// One thread as readers see it: its latest reply and its present
    /// followers; `None` when CQL holds nothing of it.
    pub async fn thread(
        &self,
        conversation: &ConversationId,
        thread: Seq,
    ) -> Result<Option<ConversationView>> {
        let ks = &self.keyspace;
        let root = bigint(thread)?;
        let (latest, followers) = tokio::try_join!(
            self.session.query_unpaged(
                format!("SELECT latest_seq FROM {ks}.threads WHERE conversation_id = ? AND thread = ?"),
                (conversation.as_str(), root),
            ),
            self.session.query_unpaged(
                format!(
                    "SELECT user_id, cursor, join_seq FROM {ks}.thread_cursors \
                     WHERE conversation_id = ? AND thread = ?"
                ),
                (conversation.as_str(), root),
            ),
        )?;
        let latest = latest
            .into_rows_result()
            .map_err(Error::cql_result)?
            .maybe_first_row::<(i64,)>()
            .map_err(Error::cql_result)?
            .map(|(l,)| seq(l));
        let rows = followers.into_rows_result().map_err(Error::cql_result)?;
        let mut members = BTreeMap::new();
        for row in rows.rows::<(String, i64, i64)>().map_err(Error::cql_result)? {
            let (user, cursor, join_seq) = row.map_err(Error::cql_result)?;
            if let Ok(user) = UserId::parse(&user, usize::MAX) {
                members.insert(user, follower(cursor, join_seq));
            }
        }
        if latest.is_none() && members.is_empty() {
            return Ok(None);
        }
        Ok(Some(ConversationView {
            latest_seq: latest.unwrap_or(Seq::ZERO),
            members,
        }))
    }

    /// The threads `user` follows (as a present member), each with its
    /// latest reply and their cursors: their rows, then two reads a thread,
    /// side by side.
    pub async fn followed_threads(&self, user: &UserId) -> Result<Vec<FollowedThread>> {
        let ks = &self.keyspace;
        let rows = self
            .session
            .query_unpaged(
                format!(
                    "SELECT conversation_id, thread, private_cursor FROM {ks}.user_threads WHERE user_id = ?"
                ),
                (user.as_str(),),
            )
            .await?
            .into_rows_result()
            .map_err(Error::cql_result)?;
        let mut followed = Vec::new();
        for row in rows
            .rows::<(String, i64, Option<i64>)>()
            .map_err(Error::cql_result)?
        {
            let (conversation, thread, private) = row.map_err(Error::cql_result)?;
            if let Ok(conversation) = ConversationId::parse(&conversation, usize::MAX) {
                followed.push((conversation, thread, seq(private.unwrap_or(0))));
            }
        }
        let reads = followed
            .into_iter()
            .map(|(conversation, thread, private_cursor)| async move {
                let (latest, own) =
                    tokio::try_join!(
                self.session.query_unpaged(
                    format!("SELECT latest_seq FROM {ks}.threads WHERE conversation_id = ? AND thread = ?"),
                    (conversation.as_str(), thread),
                ),
                self.session.query_unpaged(
                    format!(
                        "SELECT cursor, join_seq FROM {ks}.thread_cursors \
                         WHERE conversation_id = ? AND thread = ? AND user_id = ?"
                    ),
                    (conversation.as_str(), thread, user.as_str()),
                ),
            )?;
                let latest = latest
                    .into_rows_result()
                    .map_err(Error::cql_result)?
                    .maybe_first_row::<(i64,)>()
                    .map_err(Error::cql_result)?
                    .map_or(0, |(l,)| l);
                let own = own
                    .into_rows_result()
                    .map_err(Error::cql_result)?
                    .maybe_first_row::<(i64, i64)>()
                    .map_err(Error::cql_result)?;
                Ok::<_, Error>(own.map(|(cursor, join_seq)| {
                    let own = follower(cursor, join_seq);
                    FollowedThread {
                        conversation_id: conversation,
                        thread: seq(thread),
                        latest_seq: seq(latest),
                        cursor: own.cursor,
                        join_seq: own.join_seq,
                        private_cursor,
                    }
                }))
            });
        let found = futures_util::future::try_join_all(reads).await?;
        Ok(found.into_iter().flatten().collect())
    }
}

fn follower(cursor: i64, join_seq: i64) -> MemberCursor {
    MemberCursor {
        cursor: seq(cursor),
        delivered: seq(cursor),
        join_seq: Seq(join_seq.max(1) as u64),
    }
}

/// The rows of thread changes, by partition: each thread's latest reply
/// (by conversation), its followers' public rows (by thread), their own
/// rows (by user).
fn thread_rows<'a>(changes: impl IntoIterator<Item = &'a ThreadChange>) -> Result<Vec<Vec<Row>>> {
    let mut latest: BTreeMap<&ConversationId, BTreeMap<Seq, Seq>> = BTreeMap::new();
    let mut public: BTreeMap<(&ConversationId, Seq), Vec<Row>> = BTreeMap::new();
    let mut own: BTreeMap<&UserId, Vec<Row>> = BTreeMap::new();
    for change in changes {
        let key = &change.key;
        let thread = bigint(key.thread)?;
        let slot = latest
            .entry(&key.conversation_id)
            .or_default()
            .entry(key.thread)
            .or_default();
        *slot = (*slot).max(change.latest_seq);
        if change.outputs.public {
            public
                .entry((&key.conversation_id, key.thread))
                .or_default()
                .push(if change.present {
                    Row::ThreadCursor {
                        conversation_id: key.conversation_id.clone(),
                        thread,
                        user_id: key.user_id.clone(),
                        cursor: bigint(change.cursor)?,
                        join_seq: bigint(change.join_seq)?,
                        updated_at: CqlTimestamp(change.updated_at),
                        timestamp: cursor_timestamp(change.epoch, change.cursor)?,
                    }
                } else {
                    Row::ThreadDeparture {
                        conversation_id: key.conversation_id.clone(),
                        thread,
                        user_id: key.user_id.clone(),
                        timestamp: departure_timestamp(change.epoch)?,
                    }
                });
        }
        own.entry(&key.user_id).or_default().push(if change.present {
            Row::UserThread {
                user_id: key.user_id.clone(),
                conversation_id: key.conversation_id.clone(),
                thread,
                private_cursor: bigint(change.private_cursor)?,
                timestamp: cursor_timestamp(change.epoch, change.private_cursor)?,
            }
        } else {
            Row::UserThreadDeparture {
                user_id: key.user_id.clone(),
                conversation_id: key.conversation_id.clone(),
                thread,
                timestamp: departure_timestamp(change.epoch)?,
            }
        });
    }
    let mut partitions = Vec::with_capacity(latest.len() + public.len() + own.len());
    for (conversation, threads) in latest {
        let rows = threads
            .into_iter()
            .filter(|(_, latest)| *latest > Seq::ZERO)
            .map(|(thread, latest)| {
                Ok(Row::ThreadLatest {
                    conversation_id: conversation.clone(),
                    thread: bigint(thread)?,
                    latest_seq: bigint(latest)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if !rows.is_empty() {
            partitions.push(rows);
        }
    }
    partitions.extend(public.into_values());
    partitions.extend(own.into_values());
    Ok(partitions)
}

#[cfg(test)]
mod tests {
    use readfold_core::fold::{Outputs, ThreadKey};

    use super::*;

    fn change(thread: u64, user: &str, cursor: u64, present: bool, public: bool) -> ThreadChange {
        ThreadChange {
            key: ThreadKey {
                conversation_id: "C".parse().unwrap(),
                thread: Seq(thread),
                user_id: user.parse().unwrap(),
            },
            cursor: Seq(cursor),
            private_cursor: Seq(cursor + 1),
            join_seq: Seq(1),
            latest_seq: Seq(cursor + 2),
            present,
            epoch: 3,
            updated_at: 7,
            outputs: Outputs { public, state: true },
        }
    }

    #[test]
    fn rows_go_to_the_conversation_the_thread_and_the_user() {
        let changes = [
            change(1, "u", 2, true, true),
            change(1, "v", 4, false, true),
            change(2, "u", 1, true, false),
        ];
        let partitions = thread_rows(&changes).unwrap();
        // One conversation (threads' latest), thread 1's public rows (2:
        // thread 2's change was private only), and users u and v.
        assert_eq!(partitions.len(), 4);
        assert!(matches!(
            partitions[0].as_slice(),
            [
                Row::ThreadLatest {
                    thread: 1,
                    latest_seq: 6,
                    ..
                },
                Row::ThreadLatest {
                    thread: 2,
                    latest_seq: 3,
                    ..
                }
            ]
        ));
        let ts = cursor_timestamp(3, Seq(2)).unwrap();
        assert!(matches!(
            partitions[1].as_slice(),
            [Row::ThreadCursor { cursor: 2, timestamp, .. }, Row::ThreadDeparture { .. }] if *timestamp == ts
        ));
        assert!(matches!(
            partitions[2].as_slice(),
            [
                Row::UserThread {
                    thread: 1,
                    private_cursor: 3,
                    ..
                },
                Row::UserThread {
                    thread: 2,
                    private_cursor: 2,
                    ..
                }
            ]
        ));
        assert!(matches!(
            partitions[3].as_slice(),
            [Row::UserThreadDeparture { .. }]
        ));
    }
}
