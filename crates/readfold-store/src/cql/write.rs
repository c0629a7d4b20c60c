//! The write half: a flush's conversations as unlogged single-partition
//! batches, every cell written `USING TIMESTAMP <cursor>` (see the module
//! documentation), with at most `concurrency` batches in flight.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use readfold_core::flush::ConversationBatch;
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

impl CqlStore {
    /// Max-merges a flush. Returns the number of `cursors` rows written
    /// (departed members are skipped; `conversations` rows are not counted).
    pub async fn merge(&self, batches: &[ConversationBatch]) -> Result<u64> {
        let statements = self
            .statements
            .clone()
            .ok_or_else(|| Error::Config("this CQL connection was opened for reading only".into()))?;
        let now = CqlTimestamp(wall_clock_ms());
        let mut chunks = Vec::new();
        for batch in batches {
            chunks.extend(split(
                rows(batch, now)?,
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
    let mut cursors = 0;
    for row in &chunk {
        match row {
            Row::Cursor { .. } => {
                cursors += 1;
                batch.append_statement(statements.cursor.clone());
            }
            Row::Conversation { .. } => batch.append_statement(statements.conversation.clone()),
        }
    }
    session.batch(&batch, &chunk).await?;
    Ok(cursors)
}

fn joined(result: Option<std::result::Result<Result<u64>, tokio::task::JoinError>>) -> Result<u64> {
    match result {
        Some(Ok(written)) => written,
        Some(Err(e)) => Err(e.into()),
        None => Ok(0),
    }
}

/// One statement's values.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Row {
    /// `cursors`: conversation_id, user_id, cursor, join_seq, updated_at,
    /// then the write timestamp (= cursor).
    Cursor {
        conversation_id: ConversationId,
        user_id: UserId,
        cursor: i64,
        join_seq: i64,
        updated_at: CqlTimestamp,
    },
    /// `conversations`: conversation_id, latest_seq, then the write
    /// timestamp (= latest_seq).
    Conversation {
        conversation_id: ConversationId,
        latest_seq: i64,
    },
}

impl Row {
    fn estimated_bytes(&self) -> usize {
        match self {
            Row::Cursor { user_id, .. } => user_id.as_str().len() + CURSOR_ROW_OVERHEAD,
            Row::Conversation { .. } => CONVERSATION_ROW_BYTES,
        }
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
            } => (
                conversation_id.as_str(),
                user_id.as_str(),
                *cursor,
                *join_seq,
                *updated_at,
                *cursor,
            )
                .serialize(ctx, writer),
            Row::Conversation {
                conversation_id,
                latest_seq,
            } => (conversation_id.as_str(), *latest_seq, *latest_seq).serialize(ctx, writer),
        }
    }

    fn is_empty(&self) -> bool {
        false
    }
}

/// The rows of one conversation: its `conversations` row first (unless
/// `latest_seq` is 0, i.e. only departures), then one `cursors` row per
/// remaining member.
fn rows(batch: &ConversationBatch, updated_at: CqlTimestamp) -> Result<Vec<Row>> {
    let mut rows = Vec::with_capacity(batch.members.len() + 1);
    if batch.latest_seq > Seq::ZERO {
        rows.push(Row::Conversation {
            conversation_id: batch.conversation_id.clone(),
            latest_seq: bigint(batch.latest_seq)?,
        });
    }
    for m in &batch.members {
        if m.left {
            // TODO: forget departed members. A `DELETE ... USING TIMESTAMP T`
            // leaves a tombstone that shadows every write with a timestamp
            // <= T, and on equal timestamps the tombstone wins: a member who
            // leaves and rejoins with the same cursor would stay deleted
            // forever. Needs e.g. a `left_at` column or a separate timestamp
            // scheme (cursor * 2 + 1 for live rows) before deleting.
            continue;
        }
        rows.push(Row::Cursor {
            conversation_id: batch.conversation_id.clone(),
            user_id: m.user_id.clone(),
            cursor: bigint(m.cursor)?,
            join_seq: bigint(m.join_seq)?,
            updated_at,
        });
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
    fn rows_put_the_conversation_first_and_skip_departures() {
        let batch = ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: Seq(7),
            members: vec![member("a", 5, false), member("b", 0, true), member("c", 7, false)],
        };
        let rows = rows(&batch, CqlTimestamp(42)).unwrap();
        assert_eq!(rows.len(), 3);
        assert!(matches!(rows[0], Row::Conversation { latest_seq: 7, .. }));
        assert!(matches!(&rows[1], Row::Cursor { user_id, cursor: 5, .. } if user_id.as_str() == "a"));
        assert!(matches!(&rows[2], Row::Cursor { user_id, cursor: 7, .. } if user_id.as_str() == "c"));
    }

    #[test]
    fn departures_only_write_nothing() {
        let batch = ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: Seq::ZERO,
            members: vec![member("b", 0, true)],
        };
        assert!(rows(&batch, CqlTimestamp(0)).unwrap().is_empty());
    }

    #[test]
    fn sequence_numbers_beyond_bigint_are_refused() {
        assert_eq!(bigint(Seq(i64::MAX as u64)).unwrap(), i64::MAX);
        assert!(matches!(bigint(Seq(u64::MAX)), Err(Error::SeqOverflow(_))));
    }
}
