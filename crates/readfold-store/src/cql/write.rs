//! The write half: a flush's conversations (and users, for private state)
//! as unlogged batches, with at most `concurrency` batches in flight. A
//! batch holds one partition, or a few small partitions that have the same
//! replicas (and shards), so that it goes to a node that owns every row in
//! it: the CQL server's cost is mostly per request, and a snapshot of many
//! 1:1 chats would otherwise be thousands of requests of two or three rows
//! each.
//!
//! Every write carries its own timestamp, so that the store's
//! last-write-wins becomes the fold's order (see topology.md):
//! - a `cursors` row: `epoch << 40 | cursor`. Membership orders first: a
//!   departure of epoch e deletes the row at `e << 40 | (2^40 - 1)`, above
//!   every write of the member's earlier epochs, and a rejoin (epoch e + 1)
//!   writes above the departure. Within one epoch the cursor orders, so a
//!   stale or racing write never lowers it. The delivered cursor rides in
//!   the same insert: the fold moves it with the cursor, and a tie goes to
//!   the larger value (see the module above).
//! - a `conversations` row: `latest_seq`.
//! - `user_cursors.private_cursor`: the private cursor;
//!   `user_cursors.unread_mark` (the mark's seq, -1 when cleared): the
//!   mark's time, with the larger value winning a tie as the fold orders it.
//! - `user_cursors.mentions` (a set<bigint>: the read point R as -(R + 1),
//!   and the unread mentioned seqs): the whole set at R + 1. Overwriting a
//!   collection deletes it just below the write's timestamp, so the writes
//!   of the highest read point win, their sets unioned, and an older
//!   write's seqs (read since, or held by the newer state) go. A set, not
//!   text, because the server then joins writes of the same read point;
//!   text would keep one of them.
//! - `user_cursors.mute_at` and `muted_until`: both at `at * 4 + rank`,
//!   rank ordering unmute < timed mute < mute until unmuted, so the greatest
//!   (at, until) wins both cells; within a rank the larger (positive) time
//!   wins a tie.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use readfold_core::flush::{ConversationBatch, PrivateWrite, UserBatch};
use readfold_core::{ConversationId, Mute, Seq, UserId};
use scylla::client::session::Session;
use scylla::cluster::ClusterState;
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
/// threshold to a batch of one partition key, but other servers or versions
/// may count the `cursors` and `conversations` updates as two mutations
/// (ScyllaDB: 128 KiB warning, 1 MiB failure), and
/// ids of up to 256 bytes make 500 rows far bigger than that.
pub const MAX_BATCH_BYTES: usize = 48 * 1024;

/// Budget for the estimated size of a batch that spans partitions: under
/// the 5 KiB `batch_size_warn_threshold` of Cassandra, which it applies only
/// to such batches, with a warning to the client for every one above it.
pub const SHARED_BATCH_BYTES: usize = 4 * 1024;

/// Size of a `cursors` row beyond its user id, as Cassandra 5 counts it for
/// the batch thresholds (measured: 105 bytes, and 28 more for `delivered`),
/// rounded up.
const CURSOR_ROW_OVERHEAD: usize = 136;

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

    /// Writes each partition's rows (of one table, or of tables that share
    /// its partition key) as batches: see [`pack`].
    pub(super) async fn write_rows(&self, rows_by_partition: Vec<Vec<Row>>) -> Result<u64> {
        let statements = self
            .statements
            .clone()
            .ok_or_else(|| Error::Config("this CQL connection was opened for reading only".into()))?;
        let limits = BatchLimits {
            max_rows: self.max_batch_rows,
            max_bytes: MAX_BATCH_BYTES,
            partitions: self.partitions_per_batch,
            shared_bytes: SHARED_BATCH_BYTES,
        };
        let ring = (limits.partitions > 1).then(|| self.session.get_cluster_state());
        let keyed = rows_by_partition.into_iter().map(|rows| {
            let replicas = ring
                .as_deref()
                .zip(rows.first())
                .and_then(|(ring, row)| replicas(ring, &self.keyspace, row.partition()));
            (replicas, rows)
        });
        let chunks = pack(keyed, limits, Row::estimated_bytes);
        let mut in_flight = JoinSet::new();
        let mut written = 0;
        for chunk in chunks {
            if in_flight.len() >= self.concurrency {
                written += joined(in_flight.join_next().await)?;
            }
            let session = Arc::clone(&self.session);
            let statements = Arc::clone(&statements);
            let warnings = Arc::clone(&self.server_warnings);
            in_flight.spawn(async move { write_chunk(&session, &statements, &warnings, chunk).await });
        }
        // Returning early drops the set, which aborts the other batches: they
        // are idempotent and the flush is retried.
        while let Some(result) = in_flight.join_next().await {
            written += joined(Some(result))?;
        }
        Ok(written)
    }
}

/// The replicas of a partition as the driver sees the ring: (host id,
/// shard) of each. `None` if the driver cannot tell (no metadata for the
/// table yet): that partition then gets batches of its own.
fn replicas(
    ring: &ClusterState,
    keyspace: &str,
    (table, key): (&str, PartitionKey<'_>),
) -> Option<Vec<(u128, u32)>> {
    let endpoints = match key {
        PartitionKey::Text(key) => ring.get_endpoints(keyspace, table, &(key,)),
        PartitionKey::Thread(conversation, thread) => {
            ring.get_endpoints(keyspace, table, &(conversation, thread))
        }
    }
    .ok()?;
    let replicas: Vec<_> = endpoints
        .iter()
        .map(|(node, shard)| (node.host_id.as_u128(), *shard))
        .collect();
    (!replicas.is_empty()).then_some(replicas)
}

async fn write_chunk(
    session: &Session,
    statements: &Statements,
    warnings: &std::sync::atomic::AtomicU64,
    chunk: Vec<Row>,
) -> Result<u64> {
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
            Row::Mentions { .. } => &statements.mentions,
            Row::Mute { .. } => &statements.mute,
            Row::ThreadLatest { .. } => &statements.thread_latest,
            Row::ThreadCursor { .. } => &statements.thread_cursor,
            Row::ThreadDeparture { .. } => &statements.thread_departure,
            Row::UserThread { .. } => &statements.user_thread,
            Row::UserThreadDeparture { .. } => &statements.user_thread_departure,
        };
        counted += u64::from(row.counted());
        batch.append_statement(statement.clone());
    }
    let result = session.batch(&batch, &chunk).await?;
    // The driver logs each warning; counted for the tests and the operator's
    // eye (a server with lower batch thresholds than Cassandra's defaults).
    let warned = result.warnings().count() as u64;
    if warned > 0 {
        warnings.fetch_add(warned, Ordering::Relaxed);
    }
    Ok(counted)
}

fn joined(result: Option<std::result::Result<Result<u64>, tokio::task::JoinError>>) -> Result<u64> {
    match result {
        Some(Ok(written)) => written,
        Some(Err(e)) => Err(e.into()),
        None => Ok(0),
    }
}

/// A partition key's value: one text column, or a thread's
/// (conversation_id, thread).
#[derive(Clone, Copy, Debug)]
pub(super) enum PartitionKey<'a> {
    Text(&'a str),
    Thread(&'a str, i64),
}

/// One statement's values, in the order of its bind markers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Row {
    /// `cursors` insert: conversation_id, user_id, cursor, join_seq,
    /// updated_at, delivered, then the write timestamp.
    Cursor {
        conversation_id: ConversationId,
        user_id: UserId,
        cursor: i64,
        join_seq: i64,
        updated_at: CqlTimestamp,
        delivered: i64,
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
    /// `user_cursors.mentions`: the timestamp, the set, then user_id,
    /// conversation_id.
    Mentions {
        user_id: UserId,
        conversation_id: ConversationId,
        timestamp: i64,
        set: Vec<i64>,
    },
    /// `user_cursors.mute_at` and `muted_until`: the timestamp, the two
    /// values, then user_id, conversation_id.
    Mute {
        user_id: UserId,
        conversation_id: ConversationId,
        mute: Mute,
    },
    /// `threads`: conversation_id, thread, latest_seq, then the write
    /// timestamp (= latest_seq).
    ThreadLatest {
        conversation_id: ConversationId,
        thread: i64,
        latest_seq: i64,
    },
    /// `thread_cursors` insert: conversation_id, thread, user_id, cursor,
    /// join_seq, updated_at, then the write timestamp.
    ThreadCursor {
        conversation_id: ConversationId,
        thread: i64,
        user_id: UserId,
        cursor: i64,
        join_seq: i64,
        updated_at: CqlTimestamp,
        timestamp: i64,
    },
    /// `thread_cursors` delete of a departed follower: the timestamp, then
    /// conversation_id, thread, user_id.
    ThreadDeparture {
        conversation_id: ConversationId,
        thread: i64,
        user_id: UserId,
        timestamp: i64,
    },
    /// `user_threads` insert: user_id, conversation_id, thread,
    /// private_cursor, then the write timestamp.
    UserThread {
        user_id: UserId,
        conversation_id: ConversationId,
        thread: i64,
        private_cursor: i64,
        timestamp: i64,
    },
    /// `user_threads` delete: the timestamp, then user_id,
    /// conversation_id, thread.
    UserThreadDeparture {
        user_id: UserId,
        conversation_id: ConversationId,
        thread: i64,
        timestamp: i64,
    },
}

impl Row {
    fn estimated_bytes(&self) -> usize {
        match self {
            Row::Cursor { user_id, .. } | Row::Departure { user_id, .. } => {
                user_id.as_str().len() + CURSOR_ROW_OVERHEAD
            }
            Row::PrivateCursor { conversation_id, .. }
            | Row::Mark { conversation_id, .. }
            | Row::Mute { conversation_id, .. } => conversation_id.as_str().len() + CURSOR_ROW_OVERHEAD,
            Row::Mentions {
                conversation_id, set, ..
            } => conversation_id.as_str().len() + CURSOR_ROW_OVERHEAD + MENTION_BYTES * set.len(),
            Row::Conversation { .. } | Row::ThreadLatest { .. } => CONVERSATION_ROW_BYTES,
            Row::ThreadCursor { user_id, .. } | Row::ThreadDeparture { user_id, .. } => {
                user_id.as_str().len() + CURSOR_ROW_OVERHEAD
            }
            Row::UserThread { conversation_id, .. } | Row::UserThreadDeparture { conversation_id, .. } => {
                conversation_id.as_str().len() + CURSOR_ROW_OVERHEAD
            }
        }
    }

    /// The table (one of those sharing the partition key) and the
    /// partition key's value: the conversation, a thread, or for private
    /// state the user.
    fn partition(&self) -> (&'static str, PartitionKey<'_>) {
        match self {
            Row::Cursor { conversation_id, .. }
            | Row::Departure { conversation_id, .. }
            | Row::Conversation { conversation_id, .. } => {
                ("cursors", PartitionKey::Text(conversation_id.as_str()))
            }
            Row::PrivateCursor { user_id, .. }
            | Row::Mark { user_id, .. }
            | Row::Mentions { user_id, .. }
            | Row::Mute { user_id, .. } => ("user_cursors", PartitionKey::Text(user_id.as_str())),
            Row::ThreadLatest { conversation_id, .. } => {
                ("threads", PartitionKey::Text(conversation_id.as_str()))
            }
            Row::ThreadCursor {
                conversation_id,
                thread,
                ..
            }
            | Row::ThreadDeparture {
                conversation_id,
                thread,
                ..
            } => (
                "thread_cursors",
                PartitionKey::Thread(conversation_id.as_str(), *thread),
            ),
            Row::UserThread { user_id, .. } | Row::UserThreadDeparture { user_id, .. } => {
                ("user_threads", PartitionKey::Text(user_id.as_str()))
            }
        }
    }

    /// Whether the row counts in what a write returns.
    fn counted(&self) -> bool {
        matches!(
            self,
            Row::Cursor { .. }
                | Row::Departure { .. }
                | Row::PrivateCursor { .. }
                | Row::ThreadCursor { .. }
                | Row::ThreadDeparture { .. }
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
                delivered,
                timestamp,
            } => (
                conversation_id.as_str(),
                user_id.as_str(),
                *cursor,
                *join_seq,
                *updated_at,
                *delivered,
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
            Row::Mentions {
                user_id,
                conversation_id,
                timestamp,
                set,
            } => (*timestamp, set, user_id.as_str(), conversation_id.as_str()).serialize(ctx, writer),
            Row::Mute {
                user_id,
                conversation_id,
                mute,
            } => (
                mute_timestamp(*mute),
                mute.at,
                mute.until,
                user_id.as_str(),
                conversation_id.as_str(),
            )
                .serialize(ctx, writer),
            Row::ThreadLatest {
                conversation_id,
                thread,
                latest_seq,
            } => (conversation_id.as_str(), *thread, *latest_seq, *latest_seq).serialize(ctx, writer),
            Row::ThreadCursor {
                conversation_id,
                thread,
                user_id,
                cursor,
                join_seq,
                updated_at,
                timestamp,
            } => (
                conversation_id.as_str(),
                *thread,
                user_id.as_str(),
                *cursor,
                *join_seq,
                *updated_at,
                *timestamp,
            )
                .serialize(ctx, writer),
            Row::ThreadDeparture {
                conversation_id,
                thread,
                user_id,
                timestamp,
            } => (*timestamp, conversation_id.as_str(), *thread, user_id.as_str()).serialize(ctx, writer),
            Row::UserThread {
                user_id,
                conversation_id,
                thread,
                private_cursor,
                timestamp,
            } => (
                user_id.as_str(),
                conversation_id.as_str(),
                *thread,
                *private_cursor,
                *timestamp,
            )
                .serialize(ctx, writer),
            Row::UserThreadDeparture {
                user_id,
                conversation_id,
                thread,
                timestamp,
            } => (*timestamp, user_id.as_str(), conversation_id.as_str(), *thread).serialize(ctx, writer),
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
                // Never below the cursor: reading implies delivery.
                delivered: bigint(m.delivered.max(m.cursor))?,
                timestamp: cursor_timestamp(m.epoch, m.cursor)?,
            }
        });
    }
    Ok(rows)
}

/// The rows of one user: the private cursor of each conversation, and the
/// mark, the unread mentions and the mute where there are any.
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
        if let Some((timestamp, set)) = mentions_set(c)? {
            rows.push(Row::Mentions {
                user_id: batch.user_id.clone(),
                conversation_id: c.conversation_id.clone(),
                timestamp,
                set,
            });
        }
        if let Some(mute) = c.mute {
            rows.push(Row::Mute {
                user_id: batch.user_id.clone(),
                conversation_id: c.conversation_id.clone(),
                mute,
            });
        }
    }
    Ok(rows)
}

/// Estimated bytes of one element of the mentions set.
const MENTION_BYTES: usize = 16;

/// The `mentions` write of one conversation: its timestamp (the read point
/// plus one) and the set (the read point R as -(R + 1), then the seqs);
/// `None` when there is nothing to write (no mention, nothing read).
fn mentions_set(c: &PrivateWrite) -> Result<Option<(i64, Vec<i64>)>> {
    let read = bigint(c.read_up_to)?;
    if c.mentions.is_empty() && read == 0 {
        return Ok(None);
    }
    let mut set = Vec::with_capacity(c.mentions.len() + 1);
    set.push(-read - 1);
    for &s in c.mentions.iter().filter(|&&s| s > c.read_up_to) {
        set.push(bigint(s)?);
    }
    // The read point is below i64::MAX, as bigint checked: R + 1 fits.
    Ok(Some((read + 1, set)))
}

/// The write timestamp of a mute's cells: its time, then its rank.
/// Saturating: times that far off are no real event's.
fn mute_timestamp(mute: Mute) -> i64 {
    let rank = match mute.until {
        Mute::OFF => 0,
        Mute::FOREVER => 2,
        _ => 1,
    };
    mute.at.saturating_mul(4).saturating_add(rank)
}

/// The mentions as `user_cursors.mentions` holds them; see [`mentions_set`].
pub(crate) fn decode_mentions(set: &[i64]) -> crate::mentions::Mentions {
    let read = set
        .iter()
        .filter(|&&v| v < 0)
        .map(|&v| (-(v + 1)) as u64)
        .max()
        .unwrap_or(0);
    crate::mentions::Mentions::new(Seq(read), set.iter().filter(|&&v| v > 0).map(|&v| Seq(v as u64)))
}

/// How big a batch may be.
#[derive(Clone, Copy, Debug)]
struct BatchLimits {
    /// Rows in any batch (`cql.max_batch_rows`).
    max_rows: usize,
    /// Estimated bytes of a batch of one partition.
    max_bytes: usize,
    /// Partitions in a batch that spans several (`cql.partitions_per_batch`;
    /// 1: none does).
    partitions: usize,
    /// Estimated bytes of a batch that spans several partitions.
    shared_bytes: usize,
}

/// Packs partitions' rows into batches. A partition too big to share a
/// batch (over `shared_bytes` or `max_rows`), or whose replicas are
/// unknown (`None`), is split on its own as [`split`] does. The others go
/// together with partitions of the same replicas, in order, up to
/// `partitions` partitions, `max_rows` rows and `shared_bytes` per batch.
fn pack<T, K: Eq + Hash>(
    partitions: impl IntoIterator<Item = (Option<K>, Vec<T>)>,
    limits: BatchLimits,
    size: impl Fn(&T) -> usize,
) -> Vec<Vec<T>> {
    /// A batch being filled for one replica set.
    struct Open<T> {
        rows: Vec<T>,
        partitions: usize,
        bytes: usize,
    }
    let mut pieces = Vec::new();
    let mut open: Vec<Open<T>> = Vec::new();
    let mut open_for: HashMap<K, usize> = HashMap::new();
    for (replicas, rows) in partitions {
        let bytes: usize = rows.iter().map(&size).sum();
        let shareable =
            limits.partitions > 1 && bytes <= limits.shared_bytes && rows.len() <= limits.max_rows;
        let Some(replicas) = replicas.filter(|_| shareable) else {
            pieces.extend(split(rows, limits.max_rows, limits.max_bytes, &size));
            continue;
        };
        let index = *open_for.entry(replicas).or_insert_with(|| {
            open.push(Open {
                rows: Vec::new(),
                partitions: 0,
                bytes: 0,
            });
            open.len() - 1
        });
        let batch = &mut open[index];
        if batch.partitions == limits.partitions
            || batch.bytes + bytes > limits.shared_bytes
            || batch.rows.len() + rows.len() > limits.max_rows
        {
            pieces.push(std::mem::take(&mut batch.rows));
            (batch.partitions, batch.bytes) = (0, 0);
        }
        batch.rows.extend(rows);
        batch.partitions += 1;
        batch.bytes += bytes;
    }
    pieces.extend(open.into_iter().map(|o| o.rows).filter(|rows| !rows.is_empty()));
    pieces
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
pub(super) fn bigint(seq: Seq) -> Result<i64> {
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

    /// A member whose devices got two messages past the cursor; a
    /// departure carries none, as the flush writes it.
    fn member(user: &str, cursor: u64, left: bool) -> MemberWrite {
        MemberWrite {
            user_id: user.parse().unwrap(),
            cursor: Seq(cursor),
            delivered: Seq(if left { 0 } else { cursor + 2 }),
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

    const LIMITS: BatchLimits = BatchLimits {
        max_rows: 500,
        max_bytes: 1000,
        partitions: 3,
        shared_bytes: 100,
    };

    /// A partition of `rows` rows of 10 bytes, numbered from `first`.
    fn partition(replicas: Option<u8>, first: u32, rows: u32) -> (Option<u8>, Vec<u32>) {
        (replicas, (first..first + rows).collect())
    }

    #[test]
    fn small_partitions_of_the_same_replicas_share_batches() {
        let pieces = pack(
            [
                partition(Some(1), 0, 2),
                partition(Some(2), 10, 2),
                partition(Some(1), 20, 2),
                partition(Some(1), 30, 2),
                partition(Some(1), 40, 2),
            ],
            LIMITS,
            |_| 10,
        );
        // Three partitions per batch at most; replicas 2 alone.
        assert_eq!(pieces, [vec![0, 1, 20, 21, 30, 31], vec![40, 41], vec![10, 11]]);
    }

    #[test]
    fn shared_batches_keep_to_their_byte_budget() {
        // 40 bytes each: two fit in 100 bytes, not three.
        let pieces = pack((0..3).map(|i| partition(Some(1), i * 10, 4)), LIMITS, |_| 10);
        assert_eq!(pieces, [vec![0, 1, 2, 3, 10, 11, 12, 13], vec![20, 21, 22, 23]]);
    }

    #[test]
    fn big_and_unplaced_partitions_get_batches_of_their_own() {
        let pieces = pack(
            [
                partition(Some(1), 0, 1),
                // 150 bytes: over the shared budget, split by the single one.
                partition(Some(1), 100, 15),
                // Replicas unknown.
                partition(None, 200, 1),
                partition(Some(1), 300, 1),
            ],
            LIMITS,
            |_| 10,
        );
        assert_eq!(pieces, [(100..115).collect(), vec![200], vec![0, 300]]);
    }

    #[test]
    fn one_partition_per_batch_is_the_old_split() {
        let one = BatchLimits {
            partitions: 1,
            ..LIMITS
        };
        let pieces = pack(
            [partition(Some(1), 0, 2), partition(Some(1), 10, 120)],
            one,
            |_| 10,
        );
        // 1,200 bytes in pieces of at most 1,000.
        let lens: Vec<_> = pieces.iter().map(Vec::len).collect();
        assert_eq!(lens, [2, 100, 20]);
        assert!(pack(Vec::<(Option<u8>, Vec<u32>)>::new(), LIMITS, |_| 1).is_empty());
    }

    #[test]
    fn a_shared_batch_keeps_to_the_row_limit() {
        let rows = BatchLimits {
            max_rows: 3,
            shared_bytes: usize::MAX,
            ..LIMITS
        };
        let pieces = pack((0..3).map(|i| partition(Some(1), i * 10, 2)), rows, |_| 1);
        assert_eq!(pieces, [vec![0, 1], vec![10, 11], vec![20, 21]]);
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
        assert!(matches!(
            &rows[1],
            Row::Cursor { user_id, cursor: 5, delivered: 7, .. } if user_id.as_str() == "a"
        ));
        assert!(matches!(&rows[2], Row::Departure { user_id, .. } if user_id.as_str() == "b"));
        assert!(matches!(
            &rows[3],
            Row::Cursor { user_id, cursor: 7, delivered: 9, .. } if user_id.as_str() == "c"
        ));
    }

    #[test]
    fn the_delivered_cursor_shares_the_cursor_timestamp_and_never_sits_below() {
        let mut behind = member("a", 5, false);
        behind.delivered = Seq::ZERO;
        let batch = ConversationBatch {
            conversation_id: "C".parse().unwrap(),
            latest_seq: Seq::ZERO,
            members: vec![behind, member("b", 5, false)],
        };
        let rows = rows(&batch, CqlTimestamp(0)).unwrap();
        let ts = cursor_timestamp(1, Seq(5)).unwrap();
        assert!(matches!(
            rows[0],
            Row::Cursor { cursor: 5, delivered: 5, timestamp, .. } if timestamp == ts
        ));
        assert!(matches!(
            rows[1],
            Row::Cursor { cursor: 5, delivered: 7, timestamp, .. } if timestamp == ts
        ));
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
                    read_up_to: Seq(4),
                    mentions: Vec::new(),
                    mute: None,
                },
                PrivateWrite {
                    conversation_id: "D".parse().unwrap(),
                    private_cursor: Seq(0),
                    mark: Some(UnreadMark { at: 10, seq: None }),
                    read_up_to: Seq(0),
                    mentions: Vec::new(),
                    mute: None,
                },
            ],
        };
        let rows = private_rows(&batch).unwrap();
        assert_eq!(rows.len(), 4, "C's read point goes with its mentions");
        assert!(matches!(
            rows[3],
            Row::Mark {
                at: 10,
                value: -1,
                ..
            }
        ));
    }

    #[test]
    fn mentions_are_a_set_over_their_read_point() {
        use readfold_core::flush::PrivateWrite;
        let write = |read: u64, mentions: &[u64]| PrivateWrite {
            conversation_id: "C".parse().unwrap(),
            private_cursor: Seq::ZERO,
            mark: None,
            read_up_to: Seq(read),
            mentions: mentions.iter().map(|&s| Seq(s)).collect(),
            mute: None,
        };
        assert_eq!(mentions_set(&write(0, &[])).unwrap(), None);
        let (ts, set) = mentions_set(&write(3, &[5, 9])).unwrap().unwrap();
        assert_eq!((ts, &set[..]), (4, &[-4, 5, 9][..]));
        assert_eq!(
            decode_mentions(&set),
            crate::mentions::Mentions::new(Seq(3), [Seq(5), Seq(9)])
        );
        // The union of two writes of the same read point, and a stale
        // read point left in by an older write, read as the join.
        let joined = decode_mentions(&[-6, -4, 5, 7, 9]);
        assert_eq!(joined, crate::mentions::Mentions::new(Seq(5), [Seq(7), Seq(9)]));
        assert_eq!(decode_mentions(&[]), crate::mentions::Mentions::default());
    }

    #[test]
    fn mutes_order_by_time_then_rank() {
        let ts = |at, until| mute_timestamp(Mute { at, until });
        assert!(ts(5, Mute::OFF) < ts(5, 100));
        assert!(ts(5, 100) < ts(5, Mute::FOREVER));
        assert!(ts(5, Mute::FOREVER) < ts(6, Mute::OFF));
        assert!(ts(-2, Mute::FOREVER) < ts(0, Mute::OFF));
    }

    #[test]
    fn sequence_numbers_beyond_bigint_are_refused() {
        assert_eq!(bigint(Seq(i64::MAX as u64)).unwrap(), i64::MAX);
        assert!(matches!(bigint(Seq(u64::MAX)), Err(Error::SeqOverflow(_))));
    }
}
