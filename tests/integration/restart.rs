//! A restarted processor restores its state from the changelog and never
//! publishes a lower cursor.

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_emits_no_lower_cursor() {
    let env = TestEnv::new("restart", 3).await;
    let mut reference = Reference::default();
    let convs: Vec<String> = (0..12).map(|i| format!("conv-{i}")).collect();
    let users = ["u1", "u2", "u3", "u4"];

    let mut feed = env.feed(&mut reference);
    for c in &convs {
        for (i, u) in users.iter().enumerate() {
            feed.report(report(c, u, 10 + i as i64)).await;
        }
    }
    let mut first = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    first.kill();

    // After the crash: stale reports for every key, plus a few advances.
    let mut feed = env.feed(&mut reference);
    for c in &convs {
        for u in users {
            feed.report(report(c, u, 3)).await;
        }
        feed.report(report(c, "u1", 20)).await;
    }
    let mut second = env.spawn("a");
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(
        log.regressions().is_empty(),
        "cursors went down: {:?}",
        log.regressions()
    );
    assert!(
        second.log_text().contains("restored partition state"),
        "{}",
        second.log_text()
    );
    assert!(second.terminate(Duration::from_secs(30)), "{}", second.log_text());
}

/// The processor keeps one restorer for its life, and a partition taken
/// away and given back is restored by it again: every restore must read each
/// changelog partition to its end, the ends taken from the settle and the
/// reader's position (past the commit markers a read never returns), never
/// from a position left over from the restorer's earlier read of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restorer_reads_every_partition_to_its_end_each_time() {
    let env = TestEnv::new("restore-again", 3).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for c in 0..12 {
        for (i, u) in ["u1", "u2", "u3"].iter().enumerate() {
            // A read in each of several flushes: many commit markers.
            feed.report(report(&format!("conv-{c}"), u, 5 + i as i64)).await;
        }
    }
    let mut processor = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let mut feed = env.feed(&mut reference);
    for c in 0..12 {
        feed.report(report(&format!("conv-{c}"), "u1", 30)).await;
    }
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );

    let want: std::collections::BTreeMap<(String, String), i64> = reference
        .expected()
        .into_iter()
        .filter_map(|(key, cursor)| cursor.map(|(cursor, _)| (key, cursor)))
        .collect();
    let config = env.config.clone();
    tokio::task::spawn_blocking(move || {
        let restorer =
            readfold_kafka::changelog::Restorer::new(&config.kafka, &config.topics, 256).expect("a restorer");
        // All three, then one alone, then all three again: the reader's
        // partitions are assigned anew each time.
        for round in [&[0, 1, 2][..], &[1], &[0, 1, 2]] {
            let (states, stats) = restorer.restore_many(round).expect("a restore");
            let mut got = std::collections::BTreeMap::new();
            for state in states.values() {
                for (conversation, members) in state.conversations() {
                    for (user, member) in members.members().filter(|(_, m)| !m.left) {
                        got.insert(
                            (conversation.to_string(), user.to_string()),
                            member.cursor.get() as i64,
                        );
                    }
                }
            }
            let expected: std::collections::BTreeMap<_, _> = want
                .iter()
                .filter(|((conversation, _), _)| {
                    states.contains_key(&readfold_core::partitioner::partition_for_key(
                        conversation.as_bytes(),
                        3,
                    ))
                })
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            assert!(
                !expected.is_empty() && stats.records > 0,
                "round {round:?}: nothing to restore"
            );
            assert_eq!(got, expected, "round {round:?} restored other cursors");
        }
    })
    .await
    .unwrap();
}

/// The old owner's last flush may count for the group (its offsets) before
/// its commit markers reach the changelog: a restore must wait for the
/// changelog's open transactions, never stop short of them and then fold on
/// with an older state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_waits_for_a_transaction_open_in_the_changelog() {
    use rdkafka::producer::Producer;

    let env = TestEnv::new("settle", 1).await;
    let timeout = Duration::from_secs(30);
    // Another owner's flush, produced but not committed yet: u has read 7.
    let old_owner = open_transaction(&env, &unique("it.settle-old-owner"), "c0", 7, timeout);

    let mut processor = env.spawn("a");
    let waiting = "waiting for a transaction open in the changelog";
    let deadline = std::time::Instant::now() + timeout;
    while !processor.log_text().contains(waiting) {
        assert!(std::time::Instant::now() < deadline, "{}", processor.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !processor.log_text().contains("restored partition state"),
        "restored past an open transaction:\n{}",
        processor.log_text()
    );
    old_owner.commit_transaction(timeout).unwrap();

    // A stale read of u, then a read of v to know both were folded.
    let producer = env.producer();
    producer.report(&report("c0", "u", 6)).await.unwrap();
    producer.report(&report("c0", "v", 1)).await.unwrap();
    let v = ("c0".to_owned(), "v".to_owned());
    let log = loop {
        let log = env.changelog();
        if log.history.contains_key(&v) {
            break log;
        }
        assert!(
            std::time::Instant::now() < deadline + timeout,
            "{}",
            processor.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        log.history[&("c0".to_owned(), "u".to_owned())],
        [Some((7, 1))],
        "the restore missed the committed read of 7"
    );
    assert!(processor.terminate(timeout), "{}", processor.log_text());
}

/// The processor's two transactional producers take turns, and an instance
/// that crashed may have left a transaction open on either. A restart must
/// fence both: neither open transaction may commit once the new incarnation
/// runs, and the changelog never shows what they held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_fences_both_transactional_producers() {
    use rdkafka::producer::{DefaultProducerContext, Producer, ThreadedProducer};

    let env = TestEnv::new("fence-both", 1).await;
    let timeout = Duration::from_secs(30);
    let mut config = env.config.kafka.clone();
    config.instance_id = "a".into();
    // The crashed incarnation's flushes, one per producer, produced but not
    // committed: each says its conversation's u has read 99.
    let crashed: Vec<(String, ThreadedProducer<DefaultProducerContext>)> = config
        .transactional_ids()
        .into_iter()
        .enumerate()
        .map(|(lane, id)| {
            let producer = open_transaction(&env, &id, &format!("c{lane}"), 99, timeout);
            (id, producer)
        })
        .collect();

    let mut processor = env.spawn("a");
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.report(report("c0", "u", 5)).await;
    feed.report(report("c1", "u", 5)).await;
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    for (id, producer) in &crashed {
        let ready = format!("transactional_id={id}");
        assert!(
            processor
                .log_text()
                .lines()
                .any(|l| l.trim_end().ends_with(&ready)),
            "no producer with transactional id {id}:\n{}",
            processor.log_text()
        );
        assert!(
            producer.commit_transaction(timeout).is_err(),
            "{id}: the crashed incarnation's transaction committed after the restart"
        );
    }
    let log = env.changelog();
    for conversation in ["c0", "c1"] {
        let history = &log.history[&(conversation.to_owned(), "u".to_owned())];
        assert!(
            !history.iter().any(|c| matches!(c, Some((99, _)))),
            "{conversation}: the changelog shows an aborted flush: {history:?}"
        );
    }
    assert!(processor.terminate(timeout), "{}", processor.log_text());
}

/// A transactional producer, as another incarnation's, with a flush
/// produced to the changelog but not committed: `conversation`'s u has read
/// `cursor`.
fn open_transaction(
    env: &TestEnv,
    transactional_id: &str,
    conversation: &str,
    cursor: i64,
    timeout: Duration,
) -> rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use rdkafka::ClientConfig;
    use readfold_wire::codec::{
        encode_cursor_key, encode_cursor_update, CursorKeyRecord, CursorUpdateRecord,
    };

    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", transactional_id)
        .create()
        .unwrap();
    producer.init_transactions(timeout).unwrap();
    producer.begin_transaction().unwrap();
    let key = encode_cursor_key(&CursorKeyRecord {
        conversation_id: conversation.into(),
        user_id: "u".into(),
    });
    let value = encode_cursor_update(&CursorUpdateRecord {
        muted_until: None,
        unread_mentions: None,
        conversation_id: conversation.into(),
        user_id: "u".into(),
        cursor,
        join_seq: 1,
        latest_seq: cursor,
        updated_at: 1,
        private_cursor: None,
        unread_mark: None,
        delivered_cursor: None,
    });
    let record = BaseRecord::to(&env.config.topics.read_cursors)
        .partition(0)
        .key(&key)
        .payload(&value);
    producer.send(record).map_err(|(e, _)| e).unwrap();
    producer.flush(timeout).unwrap();
    producer
}
