//! The write half: a flush's conversations (and users, for private state)
//! as unlogged single-partition batches, with at most `concurrency` batches
//! in flight.
//!
//! Every write carries its own timestamp, so that the store's
//! last-write-wins becomes the fold's order (see topology.md):
//! - a `cursors` row: `epoch << 40 | cursor`. Membership orders first: a
//!   departure of epoch e deletes the row at `e << 40 | (2^40 - 1)`, above
//!   every write of the member's earlier epochs, and a rejoin (epoch e + 1)
//!   writes above the departure. Within one epoch the cursor orders, so a
//!   stale or racing write never lowers it.
//! - a `conversations` row: `latest_seq`.
//! - `user_cursors.private_cursor`: the private cursor;
//!   `user_cursors.unread_mark` (the mark's seq, -1 when cleared): the
//!   mark's time, with the larger value winning a tie as the fold orders it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use readfold_core::flush::{ConversationBatch, UserBatch};
use readfold_core::{ConversationId, Seq, UserId};
use scylla::client::session::Session;
use scylla::serialize::row::{RowSerializationContext, SerializeRow};
use scylla::serialize::writers::RowWriter;
use scylla::serialize::SerializationError;
use scylla::statement::batch::{Batch, BatchType};
use scylla::value::CqlTimestamp;
use tokio::task::JoinSet;

use super::{CqlStore, Statements};
use crate::error::{Error, Result};

/// Budget for the estimated data size of one batch, under Cassandra's default
/// `batch_size_fail_threshold` (50 KiB). Cassandra 5 does not apply that
/// threshold to a batch of one partition key (measured: 90 KiB passes), but
/// other servers or versions may count the `cursors` and `conversations`
/// updates as two mutations (ScyllaDB: 128 KiB warning, 1 MiB failure), and
/// ids of up to 256 bytes make 500 rows far bigger than that.
pub const MAX_BATCH_BYTES: usize = 48 * 1024;

/// Size of a `cursors` row beyond its user id, as Cassandra 5 counts it for
/// the batch thresholds (measured: 105 bytes), rounded up.
const CURSOR_ROW_OVERHEAD: usize = 112;

/// Size of the `conversations` row, as counted for the thresholds (estimate).
const CONVERSATION_ROW_BYTES: usize = 64;

/// Bits of a `cursors` write timestamp that hold the cursor.
const CURSOR_BITS: u32 = 40;
/// Highest cursor the CQL store can order: 2^40 - 1 (about 1.1e12). The
/// configuration refuses an `input.max_seq` above it when CQL is on.
pub const MAX_CURSOR: u64 = (1 << CURSOR_BITS) - 1;
/// Highest membership epoch the CQL store can order (joins and departures
/// of one member in one conversation).
pub const MAX_EPOCH: u64 = (1 << (63 - CURSOR_BITS)) - 1;

/// The write timestamp of a live `cursors` row.
pub fn cursor_timestamp(epoch: u64, cursor: Seq) -> Result<i64> {
    if cursor.get() > MAX_CURSOR {
        return Err(Error::SeqOverflow(cursor.get()));
    }
    Ok(epoch_base(epoch)? | cursor.get() as i64)
}

/// The timestamp of a departure's row deletion: above every write of the
/// member's earlier epochs, below every write of later ones.
pub fn departure_timestamp(epoch: u64) -> Result<i64> {
    Ok(epoch_base(epoch)? | MAX_CURSOR as i64)
}

fn epoch_base(epoch: u64) -> Result<i64> {
    if epoch > MAX_EPOCH {
        return Err(Error::EpochOverflow(epoch));
    }
    Ok((epoch as i64) << CURSOR_BITS)
}

impl CqlStore {
    /// Max-merges a flush's public changes. Returns the number of `cursors`
    /// rows written or deleted (`conversations` rows are not counted).
    pub async fn merge(&self, batches: &[ConversationBatch]) -> Result<u64> {
        let now = CqlTimestamp(wall_clock_ms());
        let mut rows_by_partition = Vec::with_capacity(batches.len());
        for batch in batches {
            rows_by_partition.push(rows(batch, now)?);
        }
        self.write_rows(rows_by_partition).await
    }

    /// Max-merges a flush's private state, one partition per user. Returns
    /// the number of `user_cursors` rows written.
    pub async fn merge_private(&self, batches: &[UserBatch]) -> Result<u64> {
        let rows_by_partition = batches.iter().map(private_rows).collect::<Result<Vec<_>>>()?;
        self.write_rows(rows_by_partition).await
    }

    /// Writes each partition's rows as batches, split by row count and size.
    async fn write_rows(&self, rows_by_partition: Vec<Vec<Row>>) -> Result<u64> {
        let statements = self
            .statements
            .clone()
            .ok_or_else(|| Error::Config("this CQL connection was opened for reading only".into()))?;
        let mut chunks = Vec::new();
        for rows in rows_by_partition {
            chunks.extend(split(
                rows,
                self.max_batch_rows,
                MAX_BATCH_BYTES,
                Row::estimated_bytes,
            ));
        }
        let mut in_flight = JoinSet::new();
        let mut written = 0;
        for chunk in chunks {
            if in_flight.len() >= self.concurrency {
                written += joined(in_flight.join_next().await)?;
            }
            let session = Arc::clone(&self.session);
            let statements = Arc::clone(&statements);
            in_flight.spawn(async move { write_chunk(&session, &statements, chunk).await });
        }
        // Returning early drops the set, which aborts the other batches: they
        // are idempotent and the flush is retried.
        while let Some(result) = in_flight.join_next().await {
            written += joined(Some(result))?;
        }
        Ok(written)
    }
}

async fn write_chunk(session: &Session, statements: &Statements, chunk: Vec<Row>) -> Result<u64> {
    let mut batch = Batch::new(BatchType::Unlogged);
    batch.set_is_idempotent(true);
    let mut counted = 0;
    for row in &chunk {
        let statement = match row {
            Row::Cursor { .. } => &statements.cursor,
            Row::Departure { .. } => &statements.departure,
            Row::Conversation { .. } => &statements.conversation,
            Row::PrivateCursor { .. } => &statements.private_cursor,
            Row::Mark { .. } => &statements.mark,
        };
        counted += u64::from(row.counted());
        batch.append_statement(statement.clone());
    }
    session.batch(&batch, &chunk).await?;
    Ok(counted)
}

fn joined(result: Option<std::result::Result<Result<u64>, tokio::task::JoinError>>) -> Result<u64> {
    match result {
        Some(Ok(written)) => written,
        Some(Err(e)) => Err(e.into()),
        None => Ok(0),
    }
}

/// One statement's values, in the order of its bind markers.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Row {
    /// `cursors` insert: conversation_id, user_id, cursor, join_seq,
    /// updated_at, then the write timestamp.
    Cursor {
        conversation_id: ConversationId,
        user_id: UserId,
        cursor: i64,
        join_seq: i64,
        updated_at: CqlTimestamp,
        timestamp: i64,
    },
    /// `cursors` delete of a departed member: the timestamp, then
    /// conversation_id, user_id.
    Departure {
        conversation_id: ConversationId,
        user_id: UserId,
        timestamp: i64,
    },
    /// `conversations`: conversation_id, latest_seq, then the write
    /// timestamp (= latest_seq).
    Conversation {
        conversation_id: ConversationId,
        latest_seq: i64,
    },
    /// `user_cursors.private_cursor`: the timestamp (= the value), the
    /// value, then user_id, conversation_id.
    PrivateCursor {
        user_id: UserId,
        conversation_id: ConversationId,
        private_cursor: i64,
    },
    /// `user_cursors.unread_mark`: the timestamp (= the mark's time), the
    /// value (the seq, -1 when cleared), then user_id, conversation_id.
    Mark {
        user_id: UserId,
        conversation_id: ConversationId,
        at: i64,
        value: i64,
    },
}

impl Row {
    fn estimated_bytes(&self) -> usize {
        match self {
            Row::Cursor { user_id, .. } | Row::Departure { user_id, .. } => {
                user_id.as_str().len() + CURSOR_ROW_OVERHEAD
            }
            Row::PrivateCursor { conversation_id, .. } | Row::Mark { conversation_id, .. } => {
                conversation_id.as_str().len() + CURSOR_ROW_OVERHEAD
            }
            Row::Conversation { .. } => CONVERSATION_ROW_BYTES,
        }
    }

    /// Whether the row counts in what a write returns.
    fn counted(&self) -> bool {
        matches!(
            self,
            Row::Cursor { .. } | Row::Departure { .. } | Row::PrivateCursor { .. }
        )
    }
}

impl SerializeRow for Row {
    fn serialize(
        &self,
        ctx: &RowSerializationContext<'_>,
        writer: &mut RowWriter,
    ) -> Result<(), SerializationError> {
        match self {
            Row::Cursor {
                conversation_id,
                user_id,
                cursor,
                join_seq,
                updated_at,
                timestamp,
            } => (
                conversation_id.as_str(),
                user_id.as_str(),
                *cursor,
                *join_seq,
                *updated_at,
                *timestamp,
            )
                .serialize(ctx, writer),
            Row::Departure {
                conversation_id,
                user_id,
                timestamp,
            } => (*timestamp, conversation_id.as_str(), user_id.as_str()).serialize(ctx, writer),
            Row::Conversation {
                conversation_id,
                latest_seq,
            } => (conversation_id.as_str(), *latest_seq, *latest_seq).serialize(ctx, writer),
            Row::PrivateCursor {
                user_id,
                conversation_id,
                private_cursor,
            } => (
                *private_cursor,
                *private_cursor,
                user_id.as_str(),
                conversation_id.as_str(),
            )
                .serialize(ctx, writer),
            Row::Mark {
                user_id,
                conversation_id,
                at,
                value,
            } => (*at, *value, user_id.as_str(), conversation_id.as_str()).serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// The rows of one conversation: its `conversations` row first (unless
/// `latest_seq` is 0), then one `cursors` row or deletion per member.
fn rows(batch: &ConversationBatch, updated_at: CqlTimestamp) -> Result<Vec<Row>> {
    let mut rows = Vec::with_capacity(batch.members.len() + 1);
    if batch.latest_seq > Seq::ZERO {
        rows.push(Row::Conversation {
            conversation_id: batch.conversation_id.clone(),
            latest_seq: bigint(batch.latest_seq)?,
        });
    }
    for m in &batch.members {
        let (conversation_id, user_id) = (batch.conversation_id.clone(), m.user_id.clone());
        rows.push(if m.left {
            Row::Departure {
                conversation_id,
                user_id,
                timestamp: departure_timestamp(m.epoch)?,
            }
        } else {
            Row::Cursor {
                conversation_id,
                user_id,
                cursor: bigint(m.cursor)?,
                join_seq: bigint(m.join_seq)?,
                updated_at,
                timestamp: cursor_timestamp(m.epoch, m.cursor)?,
            }
        });
    }
    Ok(rows)
}

/// The rows of one user: the private cursor of each conversation, and the
/// mark where there is one.
fn private_rows(batch: &UserBatch) -> Result<Vec<Row>> {
    let mut rows = Vec::with_capacity(batch.conversations.len() * 2);
    for c in &batch.conversations {
        rows.push(Row::PrivateCursor {
            user_id: batch.user_id.clone(),
            conversation_id: c.conversation_id.clone(),
            private_cursor: bigint(c.private_cursor)?,
        });
        if let Some(mark) = c.mark {
            rows.push(Row::Mark {
                user_id: batch.user_id.clone(),
                conversation_id: c.conversation_id.clone(),
                at: mark.at,
                value: mark.seq.map_or(Ok(-1), bigint)?,
            });
        }
    }
    Ok(rows)
}

/// Splits `items`, in order, into pieces of at most `max_rows` items and at
/// most `max_bytes` estimated bytes (an item bigger than `max_bytes` gets a
/// piece of its own). `max_rows` 0 is taken as 1.
fn split<T>(items: Vec<T>, max_rows: usize, max_bytes: usize, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let max_rows = max_rows.max(1);
    let mut pieces = Vec::new();
    let mut piece: Vec<T> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let s = size(&item);
        if !piece.is_empty() && (piece.len() == max_rows || bytes + s > max_bytes) {
            pieces.push(std::mem::take(&mut piece));
            bytes = 0;
        }
        bytes += s;
        piece.push(item);
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// CQL `bigint` (and write timestamps) are signed.
fn bigint(seq: Seq) -> Result<i64> {
    i64::try_from(seq.get()).map_err(|_| Error::SeqOverflow(seq.get()))
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use readfold_core::flush::MemberWrite;

    fn member(user: &str, cursor: u64, left: bool) -> MemberWrite {
        MemberWrite {
            user_id: user.parse().unwrap(),
            cursor: Seq(cursor),
            join_seq: Seq(1),
            left,
            epoch: if left { 2 } else { 1 },
        }
    }

    #[test]
    fn split_respects_the_row_limit() {
        let pieces = split((0..1200).collect(), 500, usize::MAX, |_| 1);
        let lens: Vec<_> = pieces.iter().map(Vec::len).collect();
        assert_eq!(lens, [500, 500, 200]);
        assert_eq!(pieces.concat(), (0..1200).collect::<Vec<_>>());
        assert!(split(Vec::<u8>::new(), 500, 100, |_| 1).is_empty());
        assert_eq!(split(vec![1, 2], 0, 100, |_| 1), [vec![1], vec![2]]);
    }

    #[test]
    fn split_respects_the_byte_budget() {
        // 10 bytes each, 35-byte budget: 3 per piece.
        let pieces = split((0..7).collect(), 500, 35, |_| 10);
        assert_eq!(pieces, [vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
        // An oversized item still goes out, alone.
        let pieces = split(vec![5, 50, 5], 500, 20, |&n| n);
        assert_eq!(pieces, [vec![5], vec![50], vec![5]]);
    }

    #[test]
    fn long_ids_shrink_batches_below_the_byte_budget() {
        let batch = ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: Seq(9),
            members: (0..500)
                .map(|i| member(&format!("{i:0>256}"), 3, false))
                .collect(),
        };
        let pieces = split(
            rows(&batch, CqlTimestamp(0)).unwrap(),
            500,
            MAX_BATCH_BYTES,
            Row::estimated_bytes,
        );
        assert!(pieces.len() > 1);
        for piece in &pieces {
            assert!(piece.iter().map(Row::estimated_bytes).sum::<usize>() <= MAX_BATCH_BYTES);
        }
        assert_eq!(pieces.iter().map(Vec::len).sum::<usize>(), 501);
    }

    #[test]
    fn rows_put_the_conversation_first_and_delete_departures() {
        let batch = ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: Seq(7),
            members: vec![member("a", 5, false), member("b", 0, true), member("c", 7, false)],
        };
        let rows = rows(&batch, CqlTimestamp(42)).unwrap();
        assert_eq!(rows.len(), 4);
        assert!(matches!(rows[0], Row::Conversation { latest_seq: 7, .. }));
        assert!(matches!(&rows[1], Row::Cursor { user_id, cursor: 5, .. } if user_id.as_str() == "a"));
        assert!(matches!(&rows[2], Row::Departure { user_id, .. } if user_id.as_str() == "b"));
        assert!(matches!(&rows[3], Row::Cursor { user_id, cursor: 7, .. } if user_id.as_str() == "c"));
    }

    #[test]
    fn departures_only_write_no_conversation_row() {
        let batch = ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: Seq::ZERO,
            members: vec![member("b", 0, true)],
        };
        let rows = rows(&batch, CqlTimestamp(0)).unwrap();
        assert!(matches!(rows.as_slice(), [Row::Departure { .. }]));
    }

    #[test]
    fn timestamps_order_membership_first_then_cursors() {
        let ts = |epoch, cursor| cursor_timestamp(epoch, Seq(cursor)).unwrap();
        // Within an epoch, a higher cursor wins.
        assert!(ts(1, 5) > ts(1, 4));
        // A departure (epoch 2) beats every write of epoch 1, even a higher
        // cursor from a racing or replayed writer...
        assert!(departure_timestamp(2).unwrap() > ts(1, MAX_CURSOR));
        // ... and a rejoin (epoch 3) beats the departure, at any cursor.
        assert!(ts(3, 0) > departure_timestamp(2).unwrap());
        // Rows written before epochs existed (epoch 0: timestamp = cursor)
        // lose to any joined member's write.
        assert_eq!(ts(0, 9), 9);
        assert!(ts(1, 0) > ts(0, MAX_CURSOR));
        assert!(matches!(
            cursor_timestamp(1, Seq(MAX_CURSOR + 1)),
            Err(Error::SeqOverflow(_))
        ));
        assert!(matches!(
            departure_timestamp(MAX_EPOCH + 1),
            Err(Error::EpochOverflow(_))
        ));
        assert!(departure_timestamp(MAX_EPOCH).unwrap() > 0);
    }

    #[test]
    fn private_rows_carry_the_cursor_and_the_mark() {
        use readfold_core::flush::PrivateWrite;
        use readfold_core::fold::UnreadMark;
        let batch = UserBatch {
            user_id: "u".parse().unwrap(),
            conversations: vec![
                PrivateWrite {
                    conversation_id: "C".parse().unwrap(),
                    private_cursor: Seq(4),
                    mark: None,
                },
                PrivateWrite {
                    conversation_id: "D".parse().unwrap(),
                    private_cursor: Seq(0),
                    mark: Some(UnreadMark { at: 10, seq: None }),
                },
            ],
        };
        let rows = private_rows(&batch).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(matches!(
            rows[2],
            Row::Mark {
                at: 10,
                value: -1,
                ..
            }
        ));
    }

    #[test]
    fn sequence_numbers_beyond_bigint_are_refused() {
        assert_eq!(bigint(Seq(i64::MAX as u64)).unwrap(), i64::MAX);
        assert!(matches!(bigint(Seq(u64::MAX)), Err(Error::SeqOverflow(_))));
    }
}
