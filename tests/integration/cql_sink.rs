//! Durable cursors in Cassandra / ScyllaDB (127.0.0.1:9042, or
//! READFOLD_TEST_CQL; `scripts/services/cassandra.sh up` starts one): max-merged
//! through write timestamps, whoever writes and in whatever order.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use readfold_core::flush::{ConversationBatch, MemberWrite, PrivateWrite, UserBatch};
use readfold_core::Seq;
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
    let all = ["conversations", "cursors", "snapshot_marks", "user_cursors"];
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
    let c = cursors(&a, "C").await;
    assert_eq!(c["u"], 300);
    assert_eq!(c["v"], 300);
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
        let read = cursors(&sink, c).await;
        assert_eq!((read["a"], read["b"]), (9, 6), "{c}");
        assert_eq!(latest_seq(&sink, c).await, Some(9), "{c}");
    }
    // Private state of many users shares batches too, and the racing
    // writes of one user in one call still max-merge.
    let mut private = private_race();
    private.extend((0..100).map(|i| private_batch(&format!("user-{i}"), "C", 5)));
    sink.write_private(&private).await.unwrap();
    assert_eq!(
        sink.private_state("u", &["C", "D", "E"]).await.unwrap(),
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
    assert_eq!(sink.write(&[membership("L", "u", 0, 1, true)]).await.unwrap(), 1);
    assert_eq!(latest_seq(&sink, "L").await, Some(60));
    assert!(!cursors(&sink, "L").await.contains_key("u"), "departed: absent");
    drop_keyspace(&sink).await;
}

/// One member's write with a membership epoch: a departure when `left`.
fn membership(conv: &str, user: &str, cursor: u64, epoch: u64, left: bool) -> ConversationBatch {
    ConversationBatch {
        conversation_id: conv.parse().unwrap(),
        latest_seq: Seq(if left { 0 } else { cursor }),
        members: vec![MemberWrite {
            user_id: user.parse().unwrap(),
            cursor: Seq(if left { 0 } else { cursor }),
            delivered: Seq::ZERO,
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
    sink.write(&[membership("M", "u", 5, 1, false)]).await.unwrap();
    sink.write(&[membership("M", "u", 0, 2, true)]).await.unwrap();
    assert!(!cursors(&sink, "M").await.contains_key("u"), "departed");
    // A racing or replayed write of the earlier membership, even with a
    // higher cursor, does not bring the member back.
    sink.write(&[membership("M", "u", 9, 1, false)]).await.unwrap();
    assert!(!cursors(&sink, "M").await.contains_key("u"), "still departed");
    // A rejoin at the very cursor the member left with is not shadowed.
    sink.write(&[membership("M", "u", 5, 3, false)]).await.unwrap();
    assert_eq!(cursors(&sink, "M").await.get("u"), Some(&5), "rejoined");
    // A replayed departure does not undo the rejoin; cursors still only grow.
    sink.write(&[membership("M", "u", 0, 2, true)]).await.unwrap();
    sink.write(&[membership("M", "u", 4, 3, false)]).await.unwrap();
    assert_eq!(cursors(&sink, "M").await.get("u"), Some(&5));
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
    let got = sink.private_state("u", &["C", "D", "E"]).await.unwrap();
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
