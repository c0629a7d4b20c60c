//! CQL (ScyllaDB, Apache Cassandra): a durable snapshot of the cursors, one
//! partition per conversation, with a write half and a read half.
//!
//! Monotonic without lightweight transactions: every cell is written `USING
//! TIMESTAMP <cursor>` (`<latest_seq>` for `conversations`), so the store's
//! last-write-wins reconciliation becomes max-wins. A lower cursor written
//! later, by a replay or by a racing writer, loses to the higher one already
//! stored. On equal timestamps Cassandra and ScyllaDB keep the larger cell
//! value, which is right for `join_seq` (it only grows) and `updated_at`.
//!
//! The delivered cursor (`cursors.delivered`) goes in the same insert as the
//! cursor, so it carries the cursor's timestamp: a write with a higher
//! cursor replaces it, and among writes of the same cursor the larger
//! delivered wins the tie. That is a max-merge because the fold moves both
//! forward together: a write with a higher cursor comes from a later state,
//! whose delivered cursor is at least as high, so the latest write holds
//! both maxima. A departure's row deletion takes it with the row. Rows
//! written before the column existed hold no delivered cursor, read as the
//! cursor.
//!
//! Consequence of borrowing the write timestamp: these cells carry tiny
//! timestamps (sequence numbers, not microseconds since the epoch), so any
//! ordinary write or `DELETE` made by hand (server or client clock
//! timestamps) beats every future write of this store to the same cells.
//!
//! Each conversation is written as UNLOGGED batches (the `cursors` rows and
//! the `conversations` row share the partition key, so they form one
//! mutation), split to stay under both `max_batch_rows` and
//! [`write::MAX_BATCH_BYTES`], with at most `concurrency` batches in flight.
//! Small conversations whose partitions have the same replicas share a
//! batch, up to `partitions_per_batch` of them and
//! [`write::SHARED_BATCH_BYTES`].

mod config;
mod marks;
mod read;
mod schema;
mod threads;
pub mod write;

use std::sync::Arc;
use std::time::Duration;

use readfold_core::flush::{ConversationBatch, UserBatch};
use readfold_core::{ConversationId, ConversationView};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::prepared::PreparedStatement;

pub use config::CqlConfig;
pub use marks::{new_mark, MarkList, MARKS_KEPT};
pub use schema::schema;
use schema::{add_column, column_pending, ADDED_COLUMNS};

use crate::error::{Error, Result};
use crate::CursorStore;

/// The prepared writes.
struct Statements {
    cursor: PreparedStatement,
    departure: PreparedStatement,
    conversation: PreparedStatement,
    private_cursor: PreparedStatement,
    mark: PreparedStatement,
    mentions: PreparedStatement,
    mute: PreparedStatement,
    thread_latest: PreparedStatement,
    thread_cursor: PreparedStatement,
    thread_departure: PreparedStatement,
    user_thread: PreparedStatement,
    user_thread_departure: PreparedStatement,
}

/// A session on the CQL cluster that holds the cursor snapshots. Clones
/// share the session.
#[derive(Clone)]
pub struct CqlStore {
    session: Arc<Session>,
    /// Present when connected as a writer.
    statements: Option<Arc<Statements>>,
    keyspace: String,
    concurrency: usize,
    max_batch_rows: usize,
    partitions_per_batch: usize,
    /// Warnings the server returned with writes.
    server_warnings: Arc<std::sync::atomic::AtomicU64>,
    /// Present when connected as a writer: see [`CqlStore::store_name`].
    store_name: Option<String>,
}

impl CqlStore {
    /// Connects for reading only: no schema is created (two clients creating
    /// the same table at once can disagree on its id), so reads of a
    /// keyspace nobody wrote yet fail.
    pub async fn connect(config: &CqlConfig) -> Result<Self> {
        config.check().map_err(Error::Config)?;
        let timeout = Duration::from_millis(config.timeout_ms);
        let profile = ExecutionProfile::builder()
            .request_timeout(Some(timeout))
            .build()
            .into_handle();
        let mut builder = SessionBuilder::new()
            .known_nodes(config.contact_points())
            // The ring's view of readfold's own tables is all it needs (to
            // place partitions); a cluster's other keyspaces would only make
            // every metadata fetch longer.
            .keyspaces_to_fetch([config.keyspace.clone()])
            .connection_timeout(timeout)
            .default_execution_profile_handle(profile);
        if !config.username.is_empty() {
            builder = builder.user(&config.username, &config.password);
        }
        if config.tls {
            builder = builder.tls_context(Some(tls_config(config)?));
        }
        let session = builder.build().await?;
        Ok(CqlStore {
            session: Arc::new(session),
            statements: None,
            keyspace: config.keyspace.clone(),
            concurrency: config.concurrency,
            max_batch_rows: config.max_batch_rows,
            partitions_per_batch: config.partitions_per_batch,
            server_warnings: Arc::default(),
            store_name: None,
        })
    }

    /// Connects, creates the keyspace and tables if missing, adds the
    /// columns a table created earlier lacks, waits for schema agreement and
    /// prepares the writes.
    pub async fn connect_writer(config: &CqlConfig) -> Result<Self> {
        let mut store = Self::connect(config).await?;
        let session = &store.session;
        // The metadata the driver fetched while connecting lists the
        // keyspace's tables: at a restart every statement would be a round
        // trip that changes nothing.
        let (present, has_added) = {
            let cluster = session.get_cluster_state();
            let keyspace = cluster.get_keyspace(&config.keyspace);
            (
                keyspace.is_some_and(|ks| TABLES.iter().all(|t| ks.tables.contains_key(*t))),
                ADDED_COLUMNS.iter().all(|(table, column, _)| {
                    keyspace
                        .and_then(|ks| ks.tables.get(*table))
                        .is_some_and(|t| t.columns.contains_key(*column))
                }),
            )
        };
        if !present {
            for statement in schema(&config.keyspace, &config.replication) {
                // The driver also awaits agreement after each schema change.
                session.query_unpaged(statement, &[]).await?;
            }
        }
        if !has_added {
            for (table, column, kind) in ADDED_COLUMNS {
                add_column(session, &config.keyspace, table, column, kind).await?;
            }
            // Reads ask the metadata whether the columns are there
            // ([`CqlStore::reads_delivered`]); the schema change event that
            // would refresh it may come later.
            session.refresh_metadata().await?;
        }
        session.await_schema_agreement().await?;
        let ks = &config.keyspace;
        let prepare = |cql: String| async move {
            // A column another writer is adding shows in the schema tables
            // (and so in the metadata and the check above) a moment before
            // statements can name it.
            let mut waits = 0;
            let mut statement = loop {
                match session.prepare(cql.as_str()).await {
                    Err(e) if column_pending(&e) && waits < COLUMN_WAITS => {
                        waits += 1;
                        tokio::time::sleep(COLUMN_WAIT).await;
                    }
                    other => break other?,
                }
            };
            // Explicit write timestamps make retries harmless.
            statement.set_is_idempotent(true);
            Ok::<_, Error>(statement)
        };
        // Side by side: each is a round trip.
        let (ids, cursor, departure, conversation, private_cursor, mark, mentions, mute) = tokio::try_join!(
            table_ids(session, &config.keyspace),
            prepare(format!(
                "INSERT INTO {ks}.cursors (conversation_id, user_id, cursor, join_seq, updated_at, delivered) \
                 VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
            )),
            prepare(format!(
                "DELETE FROM {ks}.cursors USING TIMESTAMP ? WHERE conversation_id = ? AND user_id = ?"
            )),
            prepare(format!(
                "INSERT INTO {ks}.conversations (conversation_id, latest_seq) \
                 VALUES (?, ?) USING TIMESTAMP ?"
            )),
            prepare(format!(
                "UPDATE {ks}.user_cursors USING TIMESTAMP ? SET private_cursor = ? \
                 WHERE user_id = ? AND conversation_id = ?"
            )),
            prepare(format!(
                "UPDATE {ks}.user_cursors USING TIMESTAMP ? SET unread_mark = ? \
                 WHERE user_id = ? AND conversation_id = ?"
            )),
            prepare(format!(
                "UPDATE {ks}.user_cursors USING TIMESTAMP ? SET mentions = ? \
                 WHERE user_id = ? AND conversation_id = ?"
            )),
            prepare(format!(
                "UPDATE {ks}.user_cursors USING TIMESTAMP ? SET mute_at = ?, muted_until = ? \
                 WHERE user_id = ? AND conversation_id = ?"
            )),
        )?;
        let (thread_latest, thread_cursor, thread_departure, user_thread, user_thread_departure) = tokio::try_join!(
            prepare(format!(
                "INSERT INTO {ks}.threads (conversation_id, thread, latest_seq) VALUES (?, ?, ?) USING TIMESTAMP ?"
            )),
            prepare(format!(
                "INSERT INTO {ks}.thread_cursors (conversation_id, thread, user_id, cursor, join_seq, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
            )),
            prepare(format!(
                "DELETE FROM {ks}.thread_cursors USING TIMESTAMP ? \
                 WHERE conversation_id = ? AND thread = ? AND user_id = ?"
            )),
            prepare(format!(
                "INSERT INTO {ks}.user_threads (user_id, conversation_id, thread, private_cursor) \
                 VALUES (?, ?, ?, ?) USING TIMESTAMP ?"
            )),
            prepare(format!(
                "DELETE FROM {ks}.user_threads USING TIMESTAMP ? \
                 WHERE user_id = ? AND conversation_id = ? AND thread = ?"
            )),
        )?;
        let statements = Statements {
            cursor,
            departure,
            conversation,
            private_cursor,
            mark,
            mentions,
            mute,
            thread_latest,
            thread_cursor,
            thread_departure,
            user_thread,
            user_thread_departure,
        };
        store.statements = Some(Arc::new(statements));
        store.store_name = Some(format!("{}#{ids}", config.store_name()));
        Ok(store)
    }

    /// The store a writer writes to, named for local checkpoints ("the CQL
    /// store that held this state"): [`CqlConfig::store_name`] and the ids
    /// of readfold's tables, which dropping and re-creating them changes,
    /// as does another cluster behind the same contact points. `None` for a
    /// reader.
    pub fn store_name(&self) -> Option<&str> {
        self.store_name.as_deref()
    }

    /// Whether reads may select `cursors.delivered`: unless the driver's
    /// schema metadata shows the table without it (created before it, and
    /// no writer of this version has connected since), so that a reader
    /// that is upgraded first reads delivered as the cursor, not errors.
    fn reads_delivered(&self) -> bool {
        self.session
            .get_cluster_state()
            .get_keyspace(&self.keyspace)
            .and_then(|ks| ks.tables.get("cursors"))
            .is_none_or(|t| t.columns.contains_key("delivered"))
    }

    /// Whether reads may select the unread mentions and the mute of
    /// `user_cursors`, as [`reads_delivered`](Self::reads_delivered) does
    /// for `cursors.delivered`.
    fn reads_private_extras(&self) -> bool {
        self.session
            .get_cluster_state()
            .get_keyspace(&self.keyspace)
            .and_then(|ks| ks.tables.get("user_cursors"))
            .is_none_or(|t| {
                ["mentions", "mute_at", "muted_until"]
                    .iter()
                    .all(|c| t.columns.contains_key(*c))
            })
    }

    /// The driver session, for checks outside readfold's reads.
    pub fn session(&self) -> &Session {
        &self.session
    }

    pub fn keyspace(&self) -> &str {
        &self.keyspace
    }
}

/// `table=id` of readfold's tables in `keyspace`, sorted, comma-separated.
async fn table_ids(session: &Session, keyspace: &str) -> Result<String> {
    let rows = session
        .query_unpaged(
            "SELECT table_name, id FROM system_schema.tables WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await?
        .into_rows_result()
        .map_err(Error::cql_result)?;
    let mut ids = Vec::new();
    for row in rows
        .rows::<(String, scylla::value::CqlValue)>()
        .map_err(Error::cql_result)?
    {
        let (table, id) = row.map_err(Error::cql_result)?;
        if NAMED_TABLES.contains(&table.as_str()) {
            let id = match id {
                scylla::value::CqlValue::Uuid(id) => id.to_string(),
                other => format!("{other:?}"),
            };
            ids.push(format!("{table}={id}"));
        }
    }
    ids.sort();
    Ok(ids.join(","))
}

/// How long, and how often, a writer waits for a column just added to be
/// usable: 5 s in all, then connecting fails (and is retried).
const COLUMN_WAIT: Duration = Duration::from_millis(100);
const COLUMN_WAITS: u32 = 50;

/// The tables readfold creates and writes.
const TABLES: [&str; 7] = [
    "conversations",
    "cursors",
    "snapshot_marks",
    "user_cursors",
    "threads",
    "thread_cursors",
    "user_threads",
];

/// The tables whose ids name the store for local checkpoints. Not the
/// thread tables: every restore owes CQL its threads whole anyway, and
/// naming them would make checkpoints of versions without threads name
/// another store.
const NAMED_TABLES: [&str; 4] = ["conversations", "cursors", "snapshot_marks", "user_cursors"];

impl CqlStore {
    /// How many warnings the server has returned with this store's writes
    /// (the driver logs each one).
    pub fn server_warnings(&self) -> u64 {
        self.server_warnings.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// OpenSSL, checking the servers' certificates against `tls_ca_file` (or
/// the system's CAs). The driver checks each node's certificate against the
/// address it connects to, so certificates need the nodes' IPs as SANs.
fn tls_config(config: &CqlConfig) -> Result<scylla::client::session::OpenSsl010Config> {
    use openssl::ssl::{SslConnector, SslMethod};
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        Error::Config(format!("cql.tls_ca_file {:?}: {what}: {e}", config.tls_ca_file))
    };
    let mut builder = SslConnector::builder(SslMethod::tls()).map_err(|e| bad("OpenSSL", &e))?;
    if !config.tls_ca_file.is_empty() {
        let pem = std::fs::read(&config.tls_ca_file).map_err(|e| bad("cannot read", &e))?;
        let mut store = openssl::x509::store::X509StoreBuilder::new().map_err(|e| bad("OpenSSL", &e))?;
        for cert in openssl::x509::X509::stack_from_pem(&pem).map_err(|e| bad("not PEM certificates", &e))? {
            store
                .add_cert(cert)
                .map_err(|e| bad("cannot add a certificate", &e))?;
        }
        builder.set_cert_store(store.build());
    }
    Ok(scylla::client::session::OpenSsl010Config::new(builder))
}

impl CursorStore for CqlStore {
    const NAME: &'static str = "cql";

    async fn write(&self, batches: &[ConversationBatch]) -> Result<u64> {
        self.merge(batches).await
    }

    async fn write_private(&self, batches: &[UserBatch]) -> Result<u64> {
        self.merge_private(batches).await
    }

    async fn read(&self, conversation: &ConversationId) -> Result<Option<ConversationView>> {
        self.conversation(conversation.as_str()).await
    }

    async fn ping(&self) -> Result<()> {
        self.session
            .query_unpaged("SELECT release_version FROM system.local", &[])
            .await?;
        Ok(())
    }
}
