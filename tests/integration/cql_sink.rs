//! Durable cursors in Cassandra / ScyllaDB (127.0.0.1:9042, or
//! READFOLD_TEST_CQL; `scripts/services/cassandra.sh up` starts one): max-merged
//! through write timestamps, whoever writes and in whatever order.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use readfold_core::flush::{ConversationBatch, MemberWrite, PrivateWrite, UserBatch};
use readfold_core::{ConversationView, Seq};
use readfold_store::cql::{CqlConfig, CqlStore};
use readfold_store::CursorStore;
use scylla::value::CqlTimestamp;

use crate::kit::*;

/// A keyspace of its own for each test.
fn unique_keyspace(name: &str) -> String {
    keyspace_name(&unique(&format!("it_cql_{name}")))
}

async fn writer(config: &CqlConfig) -> CqlStore {
    CqlStore::connect_writer(config).await.unwrap()
}

/// user_id -> cursor for one conversation, through the read half.
async fn cursors(store: &CqlStore, conv: &str) -> HashMap<String, i64> {
    store
        .conversation(conv)
        .await
        .unwrap()
        .map(|v| {
            v.members
                .into_iter()
                .map(|(u, m)| (u.to_string(), m.cursor.get() as i64))
                .collect()
        })
        .unwrap_or_default()
}

/// user_id -> (cursor, delivered cursor) for one conversation, through the
/// read half.
async fn members(store: &CqlStore, conv: &str) -> HashMap<String, (i64, i64)> {
    store
        .conversation(conv)
        .await
        .unwrap()
        .map(|v| {
            v.members
                .into_iter()
                .map(|(u, m)| (u.to_string(), (m.cursor.get() as i64, m.delivered.get() as i64)))
                .collect()
        })
        .unwrap_or_default()
}

async fn latest_seq(store: &CqlStore, conv: &str) -> Option<i64> {
    store.latest_seq(conv).await.unwrap().map(|s| s.get() as i64)
}

/// One user's private cursor in one conversation.
fn private_batch(user: &str, conv: &str, cursor: u64) -> UserBatch {
    UserBatch {
        user_id: user.parse().unwrap(),
        conversations: vec![PrivateWrite {
            conversation_id: conv.parse().unwrap(),
            private_cursor: Seq(cursor),
            mark: None,
            read_up_to: Seq(cursor),
            mentions: Vec::new(),
            mute: None,
        }],
    }
}

async fn drop_keyspace(store: &CqlStore) {
    store
        .session()
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {}", store.keyspace()), &[])
        .await
        .unwrap();
}

/// A writer names its store by the configuration and its tables' ids: the
/// same tables give the same name, tables dropped and created again
/// another, so that a local checkpoint that names the old store is not
/// trusted to be in the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_name_changes_when_the_tables_are_created_again() {
    let _services = shared_services().await;
    let ks = unique_keyspace("name");
    let config = cql_config(&ks);
    let first = writer(&config).await;
    let name = first.store_name().unwrap().to_owned();
    assert!(name.starts_with(&format!("{}#", config.store_name())), "{name}");
    for table in ["conversations", "cursors", "snapshot_marks", "user_cursors"] {
        assert!(name.contains(&format!("{table}=")), "{name}");
    }
    assert_eq!(writer(&config).await.store_name(), Some(name.as_str()));
    drop_keyspace(&first).await;
    let again = writer(&config).await;
    assert_ne!(again.store_name(), Some(name.as_str()));
    assert_eq!(
        CqlStore::connect(&config).await.unwrap().store_name(),
        None,
        "a reader names none"
    );
    drop_keyspace(&again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_is_created_idempotently() {
    let _services = shared_services().await;
    let ks = unique_keyspace("schema");
    let first = writer(&cql_config(&ks)).await;
    assert_eq!(first.write(&[sink_batch("C", 3, &[("u", 3)])]).await.unwrap(), 1);
    // Connecting again finds everything in place and keeps the data.
    let second = writer(&cql_config(&ks)).await;
    let all = [
        "conversations",
        "cursors",
        "snapshot_marks",
        "thread_cursors",
        "threads",
        "user_cursors",
        "user_threads",
    ];
    assert_eq!(table_names(&second, &ks).await, all);
    assert_eq!(cursors(&second, "C").await["u"], 3);
    // A keyspace that lacks one of them gets it back, the rest kept (a
    // writer skips the schema statements only when every table is there).
    second
        .session()
        .query_unpaged(format!("DROP TABLE {ks}.user_cursors"), &[])
        .await
        .unwrap();
    let third = writer(&cql_config(&ks)).await;
    assert_eq!(table_names(&third, &ks).await, all);
    assert_eq!(cursors(&third, "C").await["u"], 3);

    assert!(
        delivered_column(second.session(), &ks).await,
        "created with the column"
    );

    // updated_at is the wall clock at the write, join_seq as given.
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    second.write(&[sink_batch("C", 4, &[("u", 4)])]).await.unwrap();
    let row = second
        .session()
        .query_unpaged(
            format!(
                "SELECT join_seq, updated_at FROM {ks}.cursors WHERE conversation_id = 'C' AND user_id = 'u'"
            ),
            &[],
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (join_seq, updated_at) = row.single_row::<(i64, CqlTimestamp)>().unwrap();
    assert_eq!(join_seq, 1);
    assert!(updated_at.0 >= before - 1000, "{updated_at:?} vs {before}");
    drop_keyspace(&second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_lower_a_cursor() {
    let _services = shared_services().await;
    let ks = unique_keyspace("race");
    let a = writer(&cql_config(&ks)).await;
    let b = writer(&cql_config(&ks)).await;

    // Sequentially: a lower cursor written later changes nothing.
    a.write(&[sink_batch("S", 10, &[("u", 10)])]).await.unwrap();
    a.write(&[sink_batch("S", 5, &[("u", 5)])]).await.unwrap();
    assert_eq!(cursors(&a, "S").await["u"], 10);
    assert_eq!(latest_seq(&a, "S").await, Some(10));

    // One writer climbs, the other descends, concurrently: the result is the max.
    race_writers(&a, &b).await;
    let c = members(&a, "C").await;
    assert_eq!((c["u"], c["v"]), ((300, 300), (300, 300)), "cursors, delivered");
    assert_eq!(latest_seq(&b, "C").await, Some(300));
    a.write(&[sink_batch("C", 2, &[("u", 2)])]).await.unwrap();
    assert_eq!(cursors(&b, "C").await["u"], 300);
    drop_keyspace(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_conversations_are_split_into_batches() {
    let _services = shared_services().await;
    let ks = unique_keyspace("big");
    // Few batches in flight, so that the flush below has to wait for slots.
    let sink = writer(&CqlConfig {
        concurrency: 3,
        ..cql_config(&ks)
    })
    .await;
    let users: Vec<String> = (0..1200).map(|i| format!("user-{i:05}")).collect();
    let members: Vec<(&str, u64)> = users
        .iter()
        .enumerate()
        .map(|(i, u)| (u.as_str(), i as u64))
        .collect();
    // Ids near the 256-byte limit: 500 such rows would be ~150 KiB.
    let long: Vec<String> = (0..600).map(|i| format!("{i:0>250}")).collect();
    let long_members: Vec<(&str, u64)> = long.iter().map(|u| (u.as_str(), 7)).collect();
    let small: Vec<String> = (0..40).map(|i| format!("small-{i}")).collect();
    let mut flush = vec![
        sink_batch("BIG", 1200, &members),
        sink_batch("LONG", 7, &long_members),
    ];
    flush.extend(small.iter().map(|c| sink_batch(c, 3, &[("a", 1), ("b", 3)])));
    assert_eq!(sink.write(&flush).await.unwrap(), 1200 + 600 + 80);

    let big = cursors(&sink, "BIG").await;
    assert_eq!(big.len(), 1200);
    for (i, u) in users.iter().enumerate() {
        assert_eq!(big[u], i as i64, "{u}");
    }
    assert_eq!(latest_seq(&sink, "BIG").await, Some(1200));
    let long_read = cursors(&sink, "LONG").await;
    assert_eq!(long_read.len(), 600);
    assert!(long_read.values().all(|&c| c == 7));
    for c in &small {
        let read = cursors(&sink, c).await;
        assert_eq!((read["a"], read["b"]), (1, 3), "{c}");
        assert_eq!(latest_seq(&sink, c).await, Some(3));
    }
    drop_keyspace(&sink).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_conversations_share_batches_without_server_warnings() {
    let _services = shared_services().await;
    let ks = unique_keyspace("shared");
    // The default: up to 10 small conversations per batch.
    let config = cql_config(&ks);
    assert_eq!(config.partitions_per_batch, 10);
    let sink = writer(&config).await;
    let chats: Vec<String> = (0..300).map(|i| format!("chat-{i:03}")).collect();
    let flush = |a: u64, b: u64| -> Vec<ConversationBatch> {
        chats
            .iter()
            .map(|c| sink_batch(c, a.max(b), &[("a", a), ("b", b)]))
            .collect()
    };
    assert_eq!(sink.write(&flush(4, 6)).await.unwrap(), 600);
    // A stale flush of every chat, packed the same way, lowers nothing.
    assert_eq!(sink.write(&flush(2, 3)).await.unwrap(), 600);
    // And a newer one moves every cursor, whichever batch holds it.
    assert_eq!(sink.write(&flush(9, 6)).await.unwrap(), 600);
    for c in &chats {
        let read = members(&sink, c).await;
        // b's last write has the cursor of its first, 6, delivered
        // further: at the same timestamp, the larger delivered wins.
        assert_eq!((read["a"], read["b"]), ((9, 9), (6, 9)), "{c}");
        assert_eq!(latest_seq(&sink, c).await, Some(9), "{c}");
    }
    // Private state of many users shares batches too, and the racing
    // writes of one user in one call still max-merge.
    let mut private = private_race();
    private.extend((0..100).map(|i| private_batch(&format!("user-{i}"), "C", 5)));
    sink.write_private(&private).await.unwrap();
    assert_eq!(
        sink.private_state("u", &PRIVATE_RACE).await.unwrap(),
        expected_private_state()
    );
    for i in [0, 57, 99] {
        let got = sink.private_state(&format!("user-{i}"), &["C"]).await.unwrap();
        assert_eq!(got[0].private_cursor, Seq(5), "user-{i}");
    }
    // Neither the size nor the partition count of a shared batch draws a
    // warning (Cassandra: batch_size_warn_threshold 5 KiB and
    // unlogged_batch_across_partitions_warn_threshold 10).
    assert_eq!(sink.server_warnings(), 0);
    // Batches do span partitions: past Cassandra's threshold of 10, the
    // server says so.
    let wide = writer(&CqlConfig {
        partitions_per_batch: 20,
        ..cql_config(&ks)
    })
    .await;
    wide.write(&flush(10, 10)).await.unwrap();
    assert!(wide.server_warnings() > 0);
    assert_eq!(cursors(&wide, "chat-123").await["a"], 10);
    drop_keyspace(&sink).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_seq_only_grows() {
    let _services = shared_services().await;
    let ks = unique_keyspace("latest");
    let sink = writer(&cql_config(&ks)).await;
    sink.write(&[sink_batch("L", 50, &[("u", 1)])]).await.unwrap();
    sink.write(&[sink_batch("L", 20, &[("u", 2)])]).await.unwrap();
    assert_eq!(latest_seq(&sink, "L").await, Some(50));
    assert_eq!(
        cursors(&sink, "L").await["u"],
        2,
        "cursors and latest_seq are independent"
    );
    sink.write(&[sink_batch("L", 60, &[])]).await.unwrap();
    assert_eq!(latest_seq(&sink, "L").await, Some(60));
    // Departures only (latest_seq 0) leave latest_seq as it was.
    assert_eq!(
        sink.write(&[membership("L", "u", 0, 0, 1, true)]).await.unwrap(),
        1
    );
    assert_eq!(latest_seq(&sink, "L").await, Some(60));
    assert!(!cursors(&sink, "L").await.contains_key("u"), "departed: absent");
    drop_keyspace(&sink).await;
}

/// One member's write with a membership epoch, delivered `ahead` past the
/// cursor: a departure when `left` (which carries neither).
fn membership(conv: &str, user: &str, cursor: u64, ahead: u64, epoch: u64, left: bool) -> ConversationBatch {
    ConversationBatch {
        conversation_id: conv.parse().unwrap(),
        latest_seq: Seq(if left { 0 } else { cursor }),
        members: vec![MemberWrite {
            user_id: user.parse().unwrap(),
            cursor: Seq(if left { 0 } else { cursor }),
            delivered: Seq(if left { 0 } else { cursor + ahead }),
            join_seq: Seq(if left { 0 } else { 1 }),
            left,
            epoch,
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departures_and_rejoins_are_ordered_by_the_membership_epoch() {
    let _services = shared_services().await;
    let ks = unique_keyspace("epoch");
    let sink = writer(&cql_config(&ks)).await;
    sink.write(&[membership("M", "u", 5, 3, 1, false)]).await.unwrap();
    assert_eq!(members(&sink, "M").await.get("u"), Some(&(5, 8)));
    sink.write(&[membership("M", "u", 0, 0, 2, true)]).await.unwrap();
    assert!(!cursors(&sink, "M").await.contains_key("u"), "departed");
    // A racing or replayed write of the earlier membership, even with a
    // higher cursor, does not bring the member back.
    sink.write(&[membership("M", "u", 9, 3, 1, false)]).await.unwrap();
    assert!(!cursors(&sink, "M").await.contains_key("u"), "still departed");
    // A rejoin at the very cursor the member left with is not shadowed;
    // the fold kept their delivered cursor across the leave.
    sink.write(&[membership("M", "u", 5, 3, 3, false)]).await.unwrap();
    assert_eq!(members(&sink, "M").await.get("u"), Some(&(5, 8)), "rejoined");
    // A replayed departure does not undo the rejoin; cursors still only grow.
    sink.write(&[membership("M", "u", 0, 0, 2, true)]).await.unwrap();
    sink.write(&[membership("M", "u", 4, 2, 3, false)]).await.unwrap();
    assert_eq!(members(&sink, "M").await.get("u"), Some(&(5, 8)));
    // A delivery alone keeps the cursor, and so the timestamp: the larger
    // delivered cursor wins the tie, whichever lands last.
    sink.write(&[membership("M", "u", 5, 6, 3, false)]).await.unwrap();
    sink.write(&[membership("M", "u", 5, 4, 3, false)]).await.unwrap();
    assert_eq!(members(&sink, "M").await.get("u"), Some(&(5, 11)));
    drop_keyspace(&sink).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_state_is_max_merged_per_user() {
    let _services = shared_services().await;
    let ks = unique_keyspace("private");
    let sink = writer(&cql_config(&ks)).await;
    for batch in private_race() {
        sink.write_private(&[batch]).await.unwrap();
    }
    let got = sink.private_state("u", &PRIVATE_RACE).await.unwrap();
    assert_eq!(got, expected_private_state());
    drop_keyspace(&sink).await;
}

/// A partition's snapshot marks change only where CQL holds the list the
/// writer expects (a lightweight transaction): a first list only where
/// none exists, a next one only over the expected one, and nothing over a
/// truncated table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_marks_change_only_over_the_expected_list() {
    let _services = shared_services().await;
    let ks = unique_keyspace("marks");
    let store = writer(&cql_config(&ks)).await;
    let swap = |expected: Option<&'static str>, new: &'static str| {
        let store = store.clone();
        async move {
            let outcome = store.swap_snapshot_marks("g", &[(3, expected, new)]).await;
            assert_eq!(outcome.len(), 1);
            outcome.into_iter().next().unwrap().1.unwrap()
        }
    };
    assert!(swap(None, "a").await, "a first list where none exists");
    assert!(!swap(None, "b").await, "not over an existing one");
    assert!(!swap(Some("b"), "c,a").await, "not over another list");
    assert!(swap(Some("a"), "c,a").await, "over the expected list");
    assert_eq!(store.snapshot_marks("g").await.unwrap()[&3], "c,a");
    assert!(store.snapshot_marks("other").await.unwrap().is_empty());
    store
        .session()
        .query_unpaged(format!("TRUNCATE {ks}.snapshot_marks"), ())
        .await
        .unwrap();
    assert!(!swap(Some("c,a"), "d,c,a").await, "not over a truncated table");
    assert!(store.snapshot_marks("g").await.unwrap().is_empty());
    drop_keyspace(&store).await;
}

/// A session of the CQL driver's own, for statements readfold does not make.
async fn raw_session() -> scylla::client::session::Session {
    scylla::client::session_builder::SessionBuilder::new()
        .known_node(cql_contact_point())
        .build()
        .await
        .unwrap()
}

/// A keyspace whose `cursors` table predates the delivered column, with
/// rows an earlier writer left: a writer adds the column at connect (two
/// writers starting at once both manage), the old rows read as delivered
/// up to their cursor, and new writes carry the delivered cursor. A reader
/// of this version that came first reads the old table without failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_from_before_the_delivered_column_gets_it_at_connect() {
    let _services = shared_services().await;
    let ks = unique_keyspace("upgrade");
    let config = cql_config(&ks);
    let session = raw_session().await;
    // The schema as it was: every table, `cursors` without the column.
    for statement in readfold_store::cql::schema(&ks, &config.replication) {
        let old = statement.replace(" delivered bigint,", "");
        assert_eq!(old != statement, statement.contains(".cursors "), "{statement}");
        session.query_unpaged(old, &[]).await.unwrap();
    }
    assert!(!delivered_column(&session, &ks).await);
    // Rows as the earlier writer wrote them (timestamp: the cursor).
    for (user, cursor) in [("u", 7i64), ("v", 3)] {
        session
            .query_unpaged(
                format!(
                    "INSERT INTO {ks}.cursors (conversation_id, user_id, cursor, join_seq, updated_at) \
                     VALUES ('C', ?, ?, 1, 0) USING TIMESTAMP ?"
                ),
                (user, cursor, cursor),
            )
            .await
            .unwrap();
    }

    let early_reader = CqlStore::connect(&config).await.unwrap();
    let old = HashMap::from([("u".to_owned(), (7, 7)), ("v".to_owned(), (3, 3))]);
    assert_eq!(members(&early_reader, "C").await, old, "before the column");

    let (a, b) = tokio::join!(
        CqlStore::connect_writer(&config),
        CqlStore::connect_writer(&config)
    );
    let (a, b) = (a.expect("first writer"), b.expect("second writer"));
    assert!(delivered_column(&session, &ks).await);
    assert_eq!(members(&a, "C").await, old, "old rows: delivered as far as read");
    assert_eq!(members(&b, "C").await, old);

    // u delivered past the cursor, at the old row's very timestamp; v read
    // and delivered further.
    a.write(&[sink_batch("C", 9, &[("u", 7)])]).await.unwrap();
    b.write(&[sink_batch("C", 6, &[("v", 4)])]).await.unwrap();
    let new = HashMap::from([("u".to_owned(), (7, 9)), ("v".to_owned(), (4, 6))]);
    assert_eq!(members(&a, "C").await, new);
    let scanned = a.scan().await.unwrap();
    assert_eq!(
        scanned
            .values()
            .map(|m| (m.cursor.get(), m.delivered.get()))
            .collect::<Vec<_>>(),
        [(7, 9), (4, 6)],
        "the bulk read"
    );
    // The reader that came first answers delivered as the cursor until its
    // driver's schema metadata lists the column (refreshed every minute
    // after the server's schema change event), then reads it.
    assert_eq!(
        members(&early_reader, "C").await,
        HashMap::from([("u".to_owned(), (7, 7)), ("v".to_owned(), (4, 4))])
    );
    early_reader.session().refresh_metadata().await.unwrap();
    assert_eq!(members(&early_reader, "C").await, new);
    // A writer that finds the column in place adds nothing, and all is kept.
    let again = writer(&config).await;
    assert_eq!(members(&again, "C").await, new);
    drop_keyspace(&again).await;
}

/// A keyspace whose `user_cursors` table predates the unread mentions and
/// the mute: writers add the columns at connect (two at once both manage),
/// a row an earlier writer left reads as before, and the private merge then
/// holds mentions and mutes. A reader that came first reads the old table
/// without failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_from_before_mentions_and_mutes_gets_them_at_connect() {
    let _services = shared_services().await;
    let ks = unique_keyspace("upgrade_private");
    let config = cql_config(&ks);
    let session = raw_session().await;
    let added = " mentions set<bigint>, mute_at bigint, muted_until bigint,";
    for statement in readfold_store::cql::schema(&ks, &config.replication) {
        let old = statement.replace(added, "");
        assert_eq!(
            old != statement,
            statement.contains(".user_cursors "),
            "{statement}"
        );
        session.query_unpaged(old, &[]).await.unwrap();
    }
    assert_eq!(private_columns(&session, &ks).await, 0);
    session
        .query_unpaged(
            format!(
                "UPDATE {ks}.user_cursors USING TIMESTAMP 4 SET private_cursor = 4 \
                 WHERE user_id = 'u' AND conversation_id = 'B'"
            ),
            &[],
        )
        .await
        .unwrap();
    let early_reader = CqlStore::connect(&config).await.unwrap();
    let old = early_reader.private_state("u", &["B"]).await.unwrap();
    assert_eq!(old[0].private_cursor, Seq(4), "before the columns");

    let (a, b) = tokio::join!(
        CqlStore::connect_writer(&config),
        CqlStore::connect_writer(&config)
    );
    let (a, b) = (a.expect("first writer"), b.expect("second writer"));
    assert_eq!(private_columns(&session, &ks).await, 3);
    assert_eq!(a.private_state("u", &["B"]).await.unwrap(), old);
    for (i, batch) in private_race().into_iter().enumerate() {
        let writer = if i % 2 == 0 { &a } else { &b };
        writer.write_private(&[batch]).await.unwrap();
    }
    assert_eq!(
        a.private_state("u", &PRIVATE_RACE).await.unwrap(),
        expected_private_state()
    );
    early_reader.session().refresh_metadata().await.unwrap();
    assert_eq!(
        early_reader.private_state("u", &PRIVATE_RACE).await.unwrap(),
        expected_private_state()
    );
    drop_keyspace(&a).await;
}

/// How many of the mentions and mute columns `keyspace.user_cursors` has.
async fn private_columns(session: &scylla::client::session::Session, keyspace: &str) -> usize {
    session
        .query_unpaged(
            "SELECT column_name FROM system_schema.columns \
             WHERE keyspace_name = ? AND table_name = 'user_cursors'",
            (keyspace,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows::<(String,)>()
        .unwrap()
        .filter(|c| {
            matches!(
                c.as_ref().unwrap().0.as_str(),
                "mentions" | "mute_at" | "muted_until"
            )
        })
        .count()
}

/// Whether `keyspace.cursors` has the `delivered` column.
async fn delivered_column(session: &scylla::client::session::Session, keyspace: &str) -> bool {
    session
        .query_unpaged(
            "SELECT column_name FROM system_schema.columns \
             WHERE keyspace_name = ? AND table_name = 'cursors' AND column_name = 'delivered'",
            (keyspace,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows_num()
        == 1
}

/// One member's history as the fold may write it, state by state:
/// cursor and delivered cursor only grow (delivered never below the
/// cursor, and kept across a leave), leaves and rejoins raise the epoch.
fn history(next: &mut impl FnMut(u64) -> u64, user: &str) -> Vec<MemberWrite> {
    let (mut cursor, mut delivered, mut join_seq) = (next(4), 0, 1);
    let (mut epoch, mut left) = (next(2), false);
    let mut states = Vec::new();
    for _ in 0..14 {
        match next(10) {
            0 if !left => {
                epoch += 1;
                left = true;
            }
            0 | 1 if left => {
                // Rejoined at a later message: the fold lifts the cursor to it.
                let at = cursor + next(3);
                (cursor, join_seq) = (at, at + 1);
                epoch += 1;
                left = false;
            }
            1..=3 => cursor += 1 + next(4),
            4..=6 => delivered = delivered.max(cursor) + 1 + next(6),
            _ => {
                cursor += next(3);
                delivered = delivered.max(cursor) + next(3);
            }
        }
        delivered = delivered.max(cursor);
        states.push(MemberWrite {
            user_id: user.parse().unwrap(),
            cursor: Seq(if left { 0 } else { cursor }),
            delivered: Seq(if left { 0 } else { delivered }),
            join_seq: Seq(if left { 0 } else { join_seq }),
            left,
            epoch,
        });
    }
    states
}

/// Flushes that write states of members' histories out of order, as
/// replays, racing writers and retries do: mostly later states, now and
/// then an earlier one, sometimes two states of one member in one batch,
/// in conversations large and small, many per flush. Both stores must end
/// at each member's latest state written: CQL through its write
/// timestamps (the delivered cursor riding on the cursor's), Redis through
/// its script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_histories_land_as_their_latest_state_in_both_stores() {
    let _services = shared_services().await;
    let ks = unique_keyspace("histories");
    let cql = writer(&cql_config(&ks)).await;
    let prefix = unique("histories");
    let redis = redis_store(&redis_url(), &prefix).await;
    let mut next = xorshift(0x6a09_e667_f3bc_c908);
    // Conversation sizes: mostly 1:1 chats and small groups; one past the
    // CQL batch's rows and the script's chunk of fields.
    let sizes: Vec<u64> = (0..80).map(|c| if c == 7 { 1200 } else { 1 + next(6) }).collect();
    let histories: Vec<Vec<Vec<MemberWrite>>> = sizes
        .iter()
        .map(|&n| (0..n).map(|u| history(&mut next, &format!("u{u}"))).collect())
        .collect();
    // The latest state written so far, per member, by its index.
    let mut latest: Vec<Vec<Option<usize>>> = sizes.iter().map(|&n| vec![None; n as usize]).collect();
    let mut progress: Vec<Vec<usize>> = sizes.iter().map(|&n| vec![0; n as usize]).collect();
    for round in 0..8 {
        let flush: Vec<ConversationBatch> = histories
            .iter()
            .enumerate()
            .map(|(c, members)| {
                let mut writes = Vec::new();
                for (u, states) in members.iter().enumerate() {
                    if next(3) == 0 {
                        continue;
                    }
                    let at = &mut progress[c][u];
                    *at = (*at + next(3) as usize).min(states.len() - 1);
                    let mut picks = vec![*at];
                    match next(6) {
                        0 => picks[0] = next(*at as u64 + 1) as usize,
                        1 => picks.push(next(*at as u64 + 1) as usize),
                        2 => picks.insert(0, next(*at as u64 + 1) as usize),
                        _ => {}
                    }
                    for pick in picks {
                        writes.push(states[pick].clone());
                        latest[c][u] = latest[c][u].max(Some(pick));
                    }
                }
                ConversationBatch {
                    conversation_id: format!("H{c}").parse().unwrap(),
                    latest_seq: Seq(round),
                    members: writes,
                }
            })
            .collect();
        cql.write(&flush).await.unwrap();
        redis.write(&flush).await.unwrap();
    }
    for (c, members) in histories.iter().enumerate() {
        let want: BTreeMap<String, (u64, u64, u64)> = members
            .iter()
            .zip(&latest[c])
            .filter_map(|(states, at)| {
                let m = &states[(*at)?];
                (!m.left).then(|| {
                    (
                        m.user_id.to_string(),
                        (m.cursor.get(), m.delivered.get(), m.join_seq.get()),
                    )
                })
            })
            .collect();
        let conv = format!("H{c}");
        let as_read = |view: Option<ConversationView>| -> BTreeMap<String, (u64, u64, u64)> {
            view.iter()
                .flat_map(|v| &v.members)
                .map(|(u, m)| {
                    (
                        u.to_string(),
                        (m.cursor.get(), m.delivered.get(), m.join_seq.get()),
                    )
                })
                .collect()
        };
        assert_eq!(
            as_read(cql.conversation(&conv).await.unwrap()),
            want,
            "{conv}: CQL"
        );
        assert_eq!(
            as_read(redis.conversation(&conv).await.unwrap()),
            want,
            "{conv}: Redis"
        );
    }
    drop_keyspace(&cql).await;
    redis.delete_all().await.unwrap();
}

/// A small seeded generator: `next(n)` draws from 0..n.
fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    }
}

/// The processor's delivered cursors reach CQL's snapshots and Redis as
/// the fold has them: ahead of the cursor, caught up by a read, kept across
/// a leave and a rejoin, and for a member who joins late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_writes_delivered_cursors_to_both_stores() {
    let env = TestEnv::new("cql-delivered", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for m in ["A", "B", "C"] {
        feed.event(joined("G", m, 0)).await;
    }
    for seq in 1..=3 {
        feed.event(sent("G", "A", seq)).await;
    }
    feed.report(delivery("G", "B", 3)).await;
    feed.report(report("G", "B", 1)).await;
    feed.report(delivery("G", "C", 2)).await;
    feed.report(report("G", "C", 3)).await;
    feed.report(delivery("G", "C", 2)).await;
    feed.event(left("G", "B", 4)).await;
    feed.event(sent("G", "A", 5)).await;
    feed.event(joined("G", "B", 5)).await;
    feed.event(joined("G", "D", 5)).await;
    feed.event(sent("G", "A", 6)).await;
    feed.report(delivery("G", "B", 6)).await;
    feed.report(delivery("G", "D", 6)).await;
    feed.event(joined("P", "A", 0)).await;
    feed.event(joined("P", "E", 0)).await;
    feed.event(sent("P", "A", 1)).await;
    feed.report(delivery("P", "E", 1)).await;

    let mut processor = env.spawn("a");
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert_redis_matches(&env, &reference).await;
    let keyspace = &env.config.cql.keyspace;
    let want = reference.present();
    assert_eq!(wait_for_cql(keyspace, &want, Duration::from_secs(30)).await, want);
    let (got, want) = wait_for_cql_delivered(keyspace, &reference, Duration::from_secs(30)).await;
    assert_eq!(got, want, "CQL's delivered cursors");
    let key = |c: &str, u: &str| (c.to_owned(), u.to_owned());
    assert_eq!(got[&key("G", "B")], 6, "B: delivered ahead after the rejoin");
    assert_eq!(got[&key("G", "C")], 3, "C: a read caught up");
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

/// The tables of `keyspace`, sorted.
async fn table_names(store: &CqlStore, keyspace: &str) -> Vec<String> {
    let tables = store
        .session()
        .query_unpaged(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let mut names: Vec<String> = tables
        .rows::<(String,)>()
        .unwrap()
        .map(|r| r.unwrap().0)
        .collect();
    names.sort();
    names
}
