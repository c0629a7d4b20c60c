//! The changelog, Redis and CQL end with the same cursors as a reference
//! fold computed in the test.

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_chats_land_in_all_three_stores() {
    let env = TestEnv::new("three-seed", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("P", "G").await;
    let mut processor = env.spawn("a");
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    let cql = wait_for_cql(
        &env.config.cql.keyspace,
        &reference.present(),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(cql, reference.present(), "CQL rows");
    assert_eq!(
        cql[&("G".to_owned(), "D".to_owned())],
        (3, 3),
        "D: cursor 3, join_seq 3"
    );
    assert_redis_matches(&env, &reference).await;
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_reports_end_equal_everywhere() {
    let env = TestEnv::new("three-random", 4).await;
    let mut reference = Reference::default();
    // 100k records: messages, late joins, and reports that are often stale
    // or duplicated, for conversations whose two inputs interleave freely.
    let (reports, events) = random_records(&mut reference, 0x2545_f491_4f6c_dd1d, 100_000, 40, 25);
    let addr = free_local_addr();
    let mut processor = env.spawn_with("a", &[("READFOLD__METRICS__LISTEN", addr.as_str())]);
    env.producer().send_many(&reports, &events).await.unwrap();
    let log = env.wait_for_reference(&reference, Duration::from_secs(180)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());
    let cql = wait_for_cql(
        &env.config.cql.keyspace,
        &reference.present(),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(cql.len(), reference.present().len());
    assert!(cql == reference.present(), "CQL rows differ from the reference");
    assert_redis_matches(&env, &reference).await;
    // Snapshots went out in batches the server took without a warning.
    assert!(scraped_sample(&addr, "readfold_snapshot_keys_total") > 0.0);
    let metrics = scrape(&addr).unwrap_or_default();
    assert!(metrics.contains("\nreadfold_cql_warnings_total 0\n"), "{metrics}");
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}
