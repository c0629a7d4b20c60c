//! Private receipts, unread marks and departures, end to end: what other
//! members read never shows a private read, a member's own devices see it,
//! and every store agrees with the fold, SIGKILLs or not.

use std::time::Duration;

use crate::kit::*;

/// A group G of A, B, C with three messages from A, B having read #1.
async fn group_with_three_messages(env: &TestEnv, reference: &mut Reference) {
    let mut feed = env.feed(reference);
    for m in ["A", "B", "C"] {
        feed.event(joined("G", m, 0)).await;
    }
    for seq in 1..=3 {
        feed.event(sent("G", "A", seq)).await;
    }
    feed.report(report("G", "B", 1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_receipt_changes_nothing_other_members_read() {
    let env = TestEnv::new("private", 2).await;
    let mut reference = Reference::default();
    group_with_three_messages(&env, &mut reference).await;
    let mut processor = env.spawn("a");
    let before = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&before, &reference);
    let cql_before = wait_for_cql(
        &env.config.cql.keyspace,
        &reference.present(),
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(cql_before, reference.present());
    let redis_before = redis_cursors(&redis_url(), &env.config.redis.key_prefix, "G").await;

    // B reads everything, privately.
    env.feed(&mut reference).report(private_report("G", "B", 3)).await;
    check_private_stores(&env, &reference).await;
    let own = env.user_changelog().own[&("G".to_owned(), "B".to_owned())].unwrap();
    assert_eq!((own.cursor, own.private_cursor), (1, 3));
    let b = reference
        .state
        .conversation(&"G".parse().unwrap())
        .unwrap()
        .member(&"B".parse().unwrap())
        .unwrap();
    assert_eq!(b.own().unread(readfold_core::Seq(3)), 0, "B's own unread is 0");
    // Let several flushes and snapshots pass: nothing others read changes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = env.changelog();
    assert_eq!(
        after.history, before.history,
        "the by-conversation changelog is untouched"
    );
    assert_eq!(
        redis_cursors(&redis_url(), &env.config.redis.key_prefix, "G").await,
        redis_before,
        "the Redis conversation hash is untouched"
    );
    assert_eq!(
        cql_cursors(&env.config.cql.keyspace).await,
        cql_before,
        "CQL cursors are untouched"
    );
    assert_eq!(
        after.read_count("G", 3, "A"),
        0,
        "the group's \"N read\" does not move"
    );

    // A public report below the private cursor catches up as usual.
    env.feed(&mut reference).report(report("G", "B", 2)).await;
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert_eq!(log.read_count("G", 2, "A"), 1);
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_marks_reach_the_members_own_devices_only() {
    let env = TestEnv::new("marks", 2).await;
    let mut reference = Reference::default();
    group_with_three_messages(&env, &mut reference).await;
    let mut processor = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let before = env.changelog();
    let own = |log: &Changelog, user: &str| log.own[&("G".to_owned(), user.to_owned())].unwrap();

    // A has read all three (they sent them) and marks G unread.
    env.feed(&mut reference)
        .report(unread_mark("G", "A", 3, true))
        .await;
    check_private_stores(&env, &reference).await;
    assert!(
        own(&env.user_changelog(), "A").unread_mark,
        "A's devices see the mark"
    );
    assert_eq!(env.changelog().history, before.history, "others see nothing");

    // B marks and clears; A's mark is cleared by reading on.
    let mut feed = env.feed(&mut reference);
    feed.report(unread_mark("G", "B", 1, true)).await;
    feed.report(unread_mark("G", "B", 1, false)).await;
    feed.event(sent("G", "C", 4)).await;
    feed.report(report("G", "A", 4)).await;
    check_private_stores(&env, &reference).await;
    let log = env.user_changelog();
    assert!(!own(&log, "A").unread_mark, "reading on clears the mark");
    assert!(!own(&log, "B").unread_mark, "cleared explicitly");
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_agrees_after_a_mixed_workload_with_sigkills() {
    let env = TestEnv::new("mixed", 3).await;
    let killer = env.kill_repeatedly(
        5,
        Duration::from_millis(1000),
        Duration::from_millis(2000),
        0x5151_2f2f,
    );
    let (load, ()) = tokio::join!(produce_mixed_load(&env, Duration::from_secs(15), 23), killer);
    let mut last = env.spawn("a");
    check_everything(&env, &load).await;
    assert!(last.terminate(Duration::from_secs(30)), "{}", last.log_text());
}
