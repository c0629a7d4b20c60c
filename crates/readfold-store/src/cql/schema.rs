//! The tables, created idempotently by writers at connect, and the columns
//! added since, added the same way to tables created before them.

use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, PrepareError, RequestAttemptError};

use crate::error::{Error, Result};

/// The schema, in creation order.
pub fn schema(keyspace: &str, replication: &str) -> [String; 8] {
    [
        format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}"),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.cursors (conversation_id text, user_id text, \
             cursor bigint, join_seq bigint, updated_at timestamp, delivered bigint, \
             PRIMARY KEY ((conversation_id), user_id))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.conversations \
             (conversation_id text PRIMARY KEY, latest_seq bigint)"
        ),
        // What only the user's own devices see, one partition per user.
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.user_cursors (user_id text, conversation_id text, \
             private_cursor bigint, unread_mark bigint, mentions set<bigint>, mute_at bigint, \
             muted_until bigint, PRIMARY KEY ((user_id), conversation_id))"
        ),
        // Which snapshot a local checkpoint of each input partition saw
        // (see `marks`): readfold's own, not read by anyone else.
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.snapshot_marks (group_id text, input_partition int, \
             mark text, PRIMARY KEY ((group_id), input_partition))"
        ),
        // Threads (see `threads`): each thread's latest reply, by
        // conversation; its followers' cursors, one partition per thread;
        // and what a user's own devices need, one partition per user.
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.threads (conversation_id text, thread bigint, \
             latest_seq bigint, PRIMARY KEY ((conversation_id), thread))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.thread_cursors (conversation_id text, thread bigint, \
             user_id text, cursor bigint, join_seq bigint, updated_at timestamp, \
             PRIMARY KEY ((conversation_id, thread), user_id))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.user_threads (user_id text, conversation_id text, \
             thread bigint, private_cursor bigint, PRIMARY KEY ((user_id), conversation_id, thread))"
        ),
    ]
}

/// The columns added since their tables were first created: (table,
/// column, type).
pub(crate) const ADDED_COLUMNS: [(&str, &str, &str); 4] = [
    ("cursors", "delivered", "bigint"),
    ("user_cursors", "mentions", "set<bigint>"),
    ("user_cursors", "mute_at", "bigint"),
    ("user_cursors", "muted_until", "bigint"),
];

/// Adds `table.column` unless `system_schema.columns` lists it: `CREATE
/// TABLE IF NOT EXISTS` leaves a table made before the column as it is.
/// Two writers that start at once may both add it; the second's refusal
/// ([`column_exists`]) means the column is there.
pub(crate) async fn add_column(
    session: &Session,
    keyspace: &str,
    table: &str,
    column: &str,
    kind: &str,
) -> Result<()> {
    let found = session
        .query_unpaged(
            "SELECT column_name FROM system_schema.columns \
             WHERE keyspace_name = ? AND table_name = ? AND column_name = ?",
            (keyspace, table, column),
        )
        .await?
        .into_rows_result()
        .map_err(Error::cql_result)?
        .rows_num();
    if found > 0 {
        return Ok(());
    }
    match session
        .query_unpaged(format!("ALTER TABLE {keyspace}.{table} ADD {column} {kind}"), &[])
        .await
    {
        Err(e) if column_exists(&e) => Ok(()),
        other => other.map(drop).map_err(Error::from),
    }
}

/// Whether an `ALTER TABLE ... ADD` failed because the column exists
/// already (Cassandra: "already exists"; ScyllaDB and older Cassandra:
/// "conflicts with an existing column").
fn column_exists(e: &ExecutionError) -> bool {
    matches!(
        e,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(DbError::Invalid, message))
            if message.contains("already exists") || message.contains("conflicts with an existing column")
    )
}

/// Whether a statement failed to prepare on a column the server does not
/// know (yet): one being added is in `system_schema` before statements can
/// name it.
pub(crate) fn column_pending(e: &PrepareError) -> bool {
    matches!(
        e,
        PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(DbError::Invalid, message)
        } if message.contains("Undefined column name")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_added_by_another_writer_is_no_error() {
        let refused = |error: DbError, message: &str| {
            ExecutionError::LastAttemptError(RequestAttemptError::DbError(error, message.into()))
        };
        assert!(column_exists(&refused(
            DbError::Invalid,
            "Invalid column name delivered because it conflicts with an existing column"
        )));
        assert!(column_exists(&refused(
            DbError::Invalid,
            "Column with name 'delivered' already exists"
        )));
        assert!(!column_exists(&refused(
            DbError::Invalid,
            "Undefined column name x"
        )));
        assert!(!column_exists(&refused(DbError::Unauthorized, "already exists")));
        assert!(!column_exists(&ExecutionError::EmptyPlan));
    }

    #[test]
    fn a_column_being_added_is_waited_for() {
        let failed = |error: DbError, message: &str| PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(error, message.into()),
        };
        assert!(column_pending(&failed(
            DbError::Invalid,
            "Undefined column name delivered in table ks.cursors"
        )));
        assert!(!column_pending(&failed(
            DbError::Invalid,
            "unconfigured table cursors"
        )));
        assert!(!column_pending(&failed(
            DbError::Unauthorized,
            "Undefined column name x"
        )));
        assert!(!column_pending(&PrepareError::PreparedStatementIdsMismatch));
    }

    #[test]
    fn schema_names_the_keyspace() {
        let [ks, cursors, conversations, user_cursors, marks, threads, thread_cursors, user_threads] =
            schema("k", "{'class': 'SimpleStrategy', 'replication_factor': 1}");
        assert!(ks.starts_with("CREATE KEYSPACE IF NOT EXISTS k WITH replication = {"));
        assert!(
            cursors.contains("k.cursors") && cursors.contains("PRIMARY KEY ((conversation_id), user_id)")
        );
        assert!(cursors.contains("delivered bigint"));
        // A new table has every added column.
        for (table, column, kind) in ADDED_COLUMNS {
            let created = if table == "cursors" {
                &cursors
            } else {
                &user_cursors
            };
            assert!(created.contains(&format!("{column} {kind}")), "{table}.{column}");
        }
        assert!(conversations.contains("k.conversations"));
        assert!(
            user_cursors.contains("k.user_cursors")
                && user_cursors.contains("PRIMARY KEY ((user_id), conversation_id)")
        );
        assert!(
            marks.contains("k.snapshot_marks") && marks.contains("PRIMARY KEY ((group_id), input_partition)")
        );
        assert!(threads.contains("k.threads") && threads.contains("PRIMARY KEY ((conversation_id), thread)"));
        assert!(thread_cursors.contains("PRIMARY KEY ((conversation_id, thread), user_id)"));
        assert!(user_threads.contains("PRIMARY KEY ((user_id), conversation_id, thread)"));
    }
}
