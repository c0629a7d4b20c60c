//! CQL sink (ScyllaDB, Apache Cassandra): a durable snapshot of the cursors,
//! one partition per conversation.
//!
//! Monotonic without lightweight transactions: every cell is written `USING
//! TIMESTAMP <cursor>` (`<latest_seq>` for `conversations`), so the store's
//! last-write-wins reconciliation becomes max-wins. A lower cursor written
//! later, by a replay or by a racing writer, loses to the higher one already
//! stored. On equal timestamps Cassandra and ScyllaDB keep the larger cell
//! value, which is right for `join_seq` (it only grows) and `updated_at`.
//!
//! Consequence of borrowing the write timestamp: these cells carry tiny
//! timestamps (sequence numbers, not microseconds since the epoch), so any
//! ordinary write or `DELETE` made by hand (server or client clock
//! timestamps) beats every future write of this sink to the same cells.
//!
//! Each conversation is written as UNLOGGED batches of one partition (the
//! `cursors` rows and the `conversations` row share the partition key, so
//! they form one mutation), split to stay under both `max_batch_rows` and
//! [`MAX_BATCH_BYTES`], with at most `concurrency` batches in flight.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::serialize::row::{RowSerializationContext, SerializeRow};
use scylla::serialize::writers::RowWriter;
use scylla::serialize::SerializationError;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlTimestamp;
use tokio::task::JoinSet;

use super::ConversationBatch;
use crate::domain::{ConversationId, Seq, UserId};
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

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CqlConfig {
    pub enabled: bool,
    /// Comma-separated `host:port` list (a string, so that one environment
    /// variable can override it).
    pub contact_points: String,
    /// Created if missing; letters, digits and `_`, at most 48.
    pub keyspace: String,
    /// CQL map literal for `CREATE KEYSPACE ... WITH replication = ...`; only
    /// used when the keyspace does not exist yet.
    pub replication: String,
    /// Batches in flight at once.
    pub concurrency: usize,
    /// Rows per batch (each batch holds one conversation).
    pub max_batch_rows: usize,
    /// Connection and per-request timeout.
    pub timeout_ms: u64,
}

impl Default for CqlConfig {
    fn default() -> Self {
        CqlConfig {
            enabled: true,
            contact_points: "127.0.0.1:9042".into(),
            keyspace: "readfold".into(),
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            concurrency: 16,
            max_batch_rows: 500,
            timeout_ms: 5000,
        }
    }
}

impl CqlConfig {
    /// The contact points, trimmed, empty entries dropped.
    pub fn contact_points(&self) -> Vec<String> {
        self.contact_points
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn check(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        if self.contact_points().is_empty() {
            return bad("cql.contact_points must name at least one host".into());
        }
        if !valid_keyspace(&self.keyspace) {
            return bad(format!(
                "cql.keyspace {:?} must be 1 to 48 letters, digits or underscores",
                self.keyspace
            ));
        }
        if self.concurrency == 0 || self.max_batch_rows == 0 || self.timeout_ms == 0 {
            return bad("cql.concurrency, cql.max_batch_rows and cql.timeout_ms must be positive".into());
        }
        Ok(())
    }
}

/// Unquoted CQL keyspace names: `[A-Za-z0-9_]{1,48}`. The name is spliced into
/// statements, so nothing else is accepted.
fn valid_keyspace(name: &str) -> bool {
    (1..=48).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The schema, in creation order.
pub fn schema(keyspace: &str, replication: &str) -> [String; 3] {
    [
        format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.cursors (conversation_id text, user_id text, \
             cursor bigint, join_seq bigint, updated_at timestamp, \
             PRIMARY KEY ((conversation_id), user_id))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.conversations \
             (conversation_id text PRIMARY KEY, latest_seq bigint)"
        ),
    ]
}

struct Statements {
    cursor: PreparedStatement,
    conversation: PreparedStatement,
}

pub struct CqlSink {
    session: Arc<Session>,
    statements: Arc<Statements>,
    keyspace: String,
    concurrency: usize,
    max_batch_rows: usize,
}

impl CqlSink {
    /// Connects, creates the keyspace and tables if missing, waits for schema
    /// agreement and prepares the writes.
    pub async fn connect(config: &CqlConfig) -> Result<Self> {
        config.check()?;
        let timeout = Duration::from_millis(config.timeout_ms);
        let profile = ExecutionProfile::builder()
            .request_timeout(Some(timeout))
            .build()
            .into_handle();
        let session = SessionBuilder::new()
            .known_nodes(config.contact_points())
            .connection_timeout(timeout)
            .default_execution_profile_handle(profile)
            .build()
            .await
            .map_err(cql_error)?;
        for statement in schema(&config.keyspace, &config.replication) {
            // The driver also awaits agreement after each schema change.
            session.query_unpaged(statement, &[]).await.map_err(cql_error)?;
        }
        session.await_schema_agreement().await.map_err(cql_error)?;
        let ks = &config.keyspace;
        let mut cursor = session
            .prepare(format!(
                "INSERT INTO {ks}.cursors (conversation_id, user_id, cursor, join_seq, updated_at) \
                 VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?"
            ))
            .await
            .map_err(cql_error)?;
        let mut conversation = session
            .prepare(format!(
                "INSERT INTO {ks}.conversations (conversation_id, latest_seq) \
                 VALUES (?, ?) USING TIMESTAMP ?"
            ))
            .await
            .map_err(cql_error)?;
        // Explicit write timestamps make retries harmless.
        cursor.set_is_idempotent(true);
        conversation.set_is_idempotent(true);
        Ok(CqlSink {
            session: Arc::new(session),
            statements: Arc::new(Statements { cursor, conversation }),
            keyspace: config.keyspace.clone(),
            concurrency: config.concurrency,
            max_batch_rows: config.max_batch_rows,
        })
    }

    /// The driver session, for reads and checks.
    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn keyspace(&self) -> &str {
        &self.keyspace
    }

    /// Max-merges a flush. Returns the number of `cursors` rows written
    /// (departed members are skipped; `conversations` rows are not counted).
    pub async fn write(&self, batches: &[ConversationBatch]) -> Result<u64> {
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
            let statements = Arc::clone(&self.statements);
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
    session.batch(&batch, &chunk).await.map_err(cql_error)?;
    Ok(cursors)
}

fn joined(result: Option<std::result::Result<Result<u64>, tokio::task::JoinError>>) -> Result<u64> {
    match result {
        Some(Ok(written)) => written,
        Some(Err(e)) => Err(Error::Sink(format!("cql: batch task failed: {e}"))),
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
    i64::try_from(seq.get())
        .map_err(|_| Error::Sink(format!("cql: sequence number {} exceeds bigint", seq.get())))
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn cql_error(e: impl fmt::Display) -> Error {
    Error::Sink(format!("cql: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::MemberWrite;

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
        assert!(matches!(bigint(Seq(u64::MAX)), Err(Error::Sink(_))));
    }

    #[test]
    fn config_checks() {
        let config = CqlConfig::default();
        config.check().unwrap();
        assert_eq!(config.contact_points(), ["127.0.0.1:9042"]);
        let multi = CqlConfig {
            contact_points: " a:9042, ,b:9042 ".into(),
            ..CqlConfig::default()
        };
        assert_eq!(multi.contact_points(), ["a:9042", "b:9042"]);
        for keyspace in ["", "a-b", "x; DROP KEYSPACE y", &"k".repeat(49)] {
            let config = CqlConfig {
                keyspace: keyspace.into(),
                ..CqlConfig::default()
            };
            assert!(matches!(config.check(), Err(Error::Config(_))), "{keyspace:?}");
        }
        let zero = CqlConfig {
            concurrency: 0,
            ..CqlConfig::default()
        };
        assert!(zero.check().is_err());
    }

    #[test]
    fn schema_names_the_keyspace() {
        let [ks, cursors, conversations] =
            schema("k", "{'class': 'SimpleStrategy', 'replication_factor': 1}");
        assert!(ks.starts_with("CREATE KEYSPACE IF NOT EXISTS k WITH replication = {"));
        assert!(
            cursors.contains("k.cursors") && cursors.contains("PRIMARY KEY ((conversation_id), user_id)")
        );
        assert!(conversations.contains("k.conversations"));
    }
}
