//! The tables, created idempotently by writers at connect.

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

#[cfg(test)]
mod tests {
    use super::*;

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
