//! The seed articles' scenarios end to end through Kafka.

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_scenarios_through_kafka() {
    let env = TestEnv::new("seeds", 3).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    let (dm, group) = ("dm-P", "group-G");

    // 1:1: A says hello, B reads, B replies, A reads. Group: counts
    // 0 -> 1 -> 1, then 2 and 1; a late joiner is no reader of the history;
    // a stale duplicate never moves anything back.
    feed.seed_chats(dm, group).await;

    let mut processor = env.spawn("a");
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());

    assert_eq!(log.read_count(dm, 1, "A"), 1);
    assert_eq!(log.read_count(dm, 2, "B"), 1);
    assert_eq!(log.read_count(group, 1, "A"), 2, "B and C read #1");
    assert_eq!(log.read_count(group, 2, "A"), 1, "only C read #2");
    assert_eq!(log.read_count(group, 3, "A"), 1, "D read #3");
    assert_eq!(reference.read_count(group, 2, "A"), 1);
    let d = log.latest()[&(group.to_owned(), "D".to_owned())];
    assert_eq!(d, Some((3, 3)), "D: cursor 3, join_seq 3");

    // The by-user changelog carries the same final values.
    let by_user = env.user_changelog();
    assert_eq!(by_user.latest().len(), log.latest().len());
    for (key, value) in log.latest() {
        assert_eq!(by_user.latest().get(&key), Some(&value), "{key:?}");
    }
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "graceful stop: {}",
        processor.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_member_becomes_a_tombstone() {
    let env = TestEnv::new("leave", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.event(joined("G", "A", 0)).await;
    feed.event(joined("G", "B", 0)).await;
    feed.event(sent("G", "A", 1)).await;
    feed.report(report("G", "B", 1)).await;
    let mut processor = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let mut feed = env.feed(&mut reference);
    feed.event(left("G", "B", 1)).await;
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert_eq!(log.latest()[&("G".to_owned(), "B".to_owned())], None);
    assert_eq!(log.read_count("G", 1, "A"), 0);
    processor.kill();
}

/// Flushes follow the load, not a clock: with the interval tick ten minutes
/// away, every report still reaches the changelog, flush after flush, while
/// new input keeps arriving during each flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_follow_the_load_without_waiting_for_the_interval() {
    let env = TestEnv::new("follow-load", 2).await;
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__FLUSH__INTERVAL_MS", "600000"),
            ("READFOLD__SNAPSHOT__INTERVAL_MS", "600000"),
        ],
    );
    let mut reference = Reference::default();
    for round in 1..=5i64 {
        let mut feed = env.feed(&mut reference);
        for u in 0..50 {
            feed.report(report(&format!("c{}", u % 7), &format!("u{u}"), round))
                .await;
        }
        let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
        assert_matches(&log, &reference);
        assert!(log.regressions().is_empty(), "{:?}", log.regressions());
    }
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "graceful stop: {}",
        processor.log_text()
    );
}

/// Under a steady load, `flush.min_interval_ms` spaces the flushes (each
/// one a transaction): 30 reports 50 ms apart would each start a flush of
/// their own (none in flight as each arrives), then batches 5 ms apart
/// would keep one in flight with more waiting as it commits. With an
/// interval of 700 ms they go out in a handful of flushes, all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_trickle_flushes_no_more_often_than_the_min_interval() {
    let env = TestEnv::new("min-interval", 2).await;
    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__FLUSH__MIN_INTERVAL_MS", "700"),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ],
    );
    let mut reference = Reference::default();
    env.feed(&mut reference).report(report("c0", "u0", 1)).await;
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let committed = r#"readfold_flushes_total{result="committed"}"#;
    let before = scraped_sample(&addr, committed);

    let started = std::time::Instant::now();
    let mut feed = env.feed(&mut reference);
    for seq in 2..32i64 {
        feed.report(report("c0", "u0", seq)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(feed);
    let producer = std::sync::Arc::new(env.producer());
    let mut sends = tokio::task::JoinSet::new();
    for round in 1..=300i64 {
        let reports: Vec<_> = (0..20).map(|u| report("c1", &format!("u{u}"), round)).collect();
        reports.iter().for_each(|r| reference.report(r));
        let producer = producer.clone();
        sends.spawn(async move { producer.send_many(&reports, &[]).await });
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while let Some(sent) = sends.join_next().await {
        sent.unwrap().unwrap();
    }
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());

    // Flushes begin at least 700 ms apart: over the trickle and the wait
    // for its last report, at most one per 700 ms, and one at its start.
    let flushes = scraped_sample(&addr, committed) - before;
    let bound = (started.elapsed().as_millis() / 700 + 1) as f64;
    let text = processor.log_text();
    assert!(flushes >= 1.0, "no flush counted:\n{text}");
    assert!(
        flushes <= bound,
        "{flushes} flushes in {:?}, more than one per 700 ms\n{text}",
        started.elapsed()
    );
    assert!(processor.terminate(Duration::from_secs(30)), "{text}");
}

/// `flush.min_interval_ms` counts from the last flush that wrote anything:
/// neither the process's start nor the idle ticks of `flush.interval_ms`
/// (which find nothing to write) hold back the first report, even with an
/// interval of ten minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_ticks_do_not_hold_back_a_first_flush() {
    let env = TestEnv::new("min-interval-idle", 2).await;
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__FLUSH__MIN_INTERVAL_MS", "600000"),
            ("READFOLD__FLUSH__INTERVAL_MS", "100"),
        ],
    );
    // Idle ticks, 100 ms apart, before the first report.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut reference = Reference::default();
    env.feed(&mut reference).report(report("c0", "u0", 3)).await;
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    let text = processor.log_text();
    assert!(processor.terminate(Duration::from_secs(30)), "{text}");
}

/// A backlog on fresh topics named after `name`: `rounds` x 10,000 reports
/// on 10,000 keys (100 conversations of 100 members), each round raising
/// every key; and the reference fold of it.
async fn backlog_of_rounds(name: &str, rounds: i64) -> (TestEnv, Reference) {
    let env = TestEnv::new(name, 2).await;
    let mut reference = Reference::default();
    let mut reports = Vec::new();
    for round in 1..=rounds {
        for c in 0..100 {
            for u in 0..100 {
                reports.push(report(&format!("c{c}"), &format!("u{u}"), round + (c + u) % 3));
            }
        }
    }
    reports.iter().for_each(|r| reference.report(r));
    for chunk in reports.chunks(20_000) {
        env.producer().send_many(chunk, &[]).await.unwrap();
    }
    (env, reference)
}

/// Behind a backlog, the next flush waits `flush.catch_up_interval_ms`
/// after the last one began, but only while the fold is behind: with an
/// interval of ten minutes, a backlog still goes out whole, and correct,
/// as soon as the fold catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_waits_between_flushes_only_while_behind() {
    // The fold must still be behind when the first flush, a few
    // milliseconds in, commits: 400,000 reports take it far longer, so
    // that a first transaction slowed by other tests on the broker still
    // commits before the fold reaches the end.
    let (env, reference) = backlog_of_rounds("catchup", 40).await;
    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__FLUSH__CATCH_UP_INTERVAL_MS", "600000"),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ],
    );
    let log = env.wait_for_reference(&reference, Duration::from_secs(90)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());

    let waits = scraped_sample(&addr, "readfold_flush_waits_total");
    let text = processor.log_text();
    assert!(waits >= 1.0, "no flush waited behind the backlog:\n{text}");
    assert!(processor.terminate(Duration::from_secs(30)), "{text}");
}

/// A backlog the fold gets through well within
/// `flush.catch_up_max_interval_ms` goes out in one flush once the fold
/// reaches the inputs' ends, after the first (which starts `linger_ms`
/// after the first record): every key once or twice, not once per flush
/// of a growing series. And it does go out when the fold gets there, not
/// when the minute is up: the fold must see that it reached the end of its
/// partitions, not only the end of what was fetched so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_folded_within_the_max_wait_goes_out_once_the_fold_reaches_the_end() {
    // Any flush that covers a round's worth of the backlog publishes
    // every key.
    let (env, reference) = backlog_of_rounds("catchupend", 20).await;
    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__FLUSH__CATCH_UP_MAX_INTERVAL_MS", "60000"),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ],
    );
    // Well before the minute.
    let log = env.wait_for_reference(&reference, Duration::from_secs(30)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());

    let published = scraped_sample(&addr, "readfold_changelog_updates_total");
    let waits = scraped_sample(&addr, "readfold_flush_waits_total");
    let text = processor.log_text();
    assert!(waits >= 1.0, "no flush waited behind the backlog:\n{text}");
    assert!(
        published <= 20_000.0,
        "{published} changelog updates for 10,000 keys: the backlog went out in more than two flushes\n{text}"
    );
    assert!(processor.terminate(Duration::from_secs(30)), "{text}");
}

/// A backlog of many distinct keys with a tiny `flush.max_dirty`: the fold
/// outruns every flush, and waits for the one in flight rather than pausing
/// the consumer (which would drop librdkafka's prefetch); nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_outrunning_its_flushes_waits_for_them_without_pausing() {
    let env = TestEnv::new("hold", 2).await;
    let mut reference = Reference::default();
    let mut reports = Vec::new();
    for c in 0..40 {
        for u in 0..50 {
            reports.push(report(&format!("c{c}"), &format!("u{u}"), 1 + (c + u) % 7));
        }
    }
    reports.iter().for_each(|r| reference.report(r));
    env.producer().send_many(&reports, &[]).await.unwrap();

    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            // Past 4 x 5 waiting keys the fold holds.
            ("READFOLD__FLUSH__MAX_DIRTY", "5"),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ],
    );
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());

    let holds = scraped_sample(&addr, "readfold_fold_holds_total");
    let text = processor.log_text();
    assert!(holds >= 1.0, "the fold never waited for a flush:\n{text}");
    assert!(
        !text.contains("pausing the consumer"),
        "the consumer paused though every flush succeeded:\n{text}"
    );
    assert!(processor.terminate(Duration::from_secs(30)), "{text}");
}
