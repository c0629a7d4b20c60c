//! The tables, created idempotently by writers at connect.

/// The schema, in creation order.
pub fn schema(keyspace: &str, replication: &str) -> [String; 5] {
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
        // What only the user's own devices see, one partition per user.
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.user_cursors (user_id text, conversation_id text, \
             private_cursor bigint, unread_mark bigint, \
             PRIMARY KEY ((user_id), conversation_id))"
        ),
        // Which snapshot a local checkpoint of each input partition saw
        // (see `marks`): readfold's own, not read by anyone else.
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.snapshot_marks (group_id text, input_partition int, \
             mark text, PRIMARY KEY ((group_id), input_partition))"
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_the_keyspace() {
        let [ks, cursors, conversations, user_cursors, marks] =
            schema("k", "{'class': 'SimpleStrategy', 'replication_factor': 1}");
        assert!(ks.starts_with("CREATE KEYSPACE IF NOT EXISTS k WITH replication = {"));
        assert!(
            cursors.contains("k.cursors") && cursors.contains("PRIMARY KEY ((conversation_id), user_id)")
        );
        assert!(conversations.contains("k.conversations"));
        assert!(
            user_cursors.contains("k.user_cursors")
                && user_cursors.contains("PRIMARY KEY ((user_id), conversation_id)")
        );
        assert!(
            marks.contains("k.snapshot_marks") && marks.contains("PRIMARY KEY ((group_id), input_partition)")
        );
    }
}
