//! Redis goes away for ~10 s mid-run: the processor keeps running, holds its
//! commits back, and loses nothing once Redis is back.

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_loses_nothing() {
    let env = TestEnv::new("redis-outage", 2).await;
    let mut redis = PrivateRedis::fresh();
    redis.up();
    let url = redis.url();
    let mut processor = env.spawn_with("a", &[("READFOLD__REDIS__URL", url.as_str())]);

    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for c in 0..10 {
        for u in 0..5 {
            feed.report(report(&format!("c{c}"), &format!("u{u}"), 5)).await;
        }
    }
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;

    redis.stop();
    let mut feed = env.feed(&mut reference);
    for c in 0..10 {
        for u in 0..5 {
            feed.report(report(&format!("c{c}"), &format!("u{u}"), 9)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = env.changelog();
    assert!(
        during.latest().values().all(|v| *v == Some((5, 1))),
        "nothing may be committed while Redis cannot take the flush"
    );
    assert!(
        processor.is_running(),
        "the processor must ride out the outage:\n{}",
        processor.log_text()
    );

    redis.up();
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    for c in 0..10 {
        let hash = redis_cursors(&url, &env.config.redis.key_prefix, &format!("c{c}")).await;
        assert_eq!(hash.len(), 5);
        assert!(hash.values().all(|&v| v == 9), "c{c}: {hash:?}");
    }
    assert!(processor.log_text().contains("flush failed; will retry"));
    assert!(processor.terminate(Duration::from_secs(30)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let env = TestEnv::new("second-signal", 2).await;
    let (redis, mut processor, mut reference) =
        one_report_through_a_patient_redis(&env, ("READFOLD__SHUTDOWN__TIMEOUT_MS", "120000")).await;

    // A frozen Redis makes the next flush hang, and the graceful stop with it.
    redis.signal("STOP");
    let mut feed = env.feed(&mut reference);
    feed.report(report("C", "u", 2)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    processor.signal("TERM");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        processor.is_running(),
        "the graceful stop waits for the hanging flush"
    );
    processor.signal("TERM");
    let started = std::time::Instant::now();
    let code = processor.wait(Duration::from_secs(10));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(code, Some(130), "{}", processor.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processor_waits_for_a_sink_that_is_down_at_start() {
    let env = TestEnv::new("sink-late", 2).await;
    let mut redis = PrivateRedis::fresh();
    let url = redis.url();
    let mut reference = Reference::default();
    env.feed(&mut reference).report(report("C", "u", 4)).await;
    let mut processor = env.spawn_with("a", &[("READFOLD__REDIS__URL", url.as_str())]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(processor.is_running(), "{}", processor.log_text());
    redis.up();
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(processor.log_text().contains("sink unreachable at start"));
    assert!(processor.terminate(Duration::from_secs(30)));
}

/// The stores are written while the flush's transaction is open, and the
/// commit waits for them; a Redis that hangs must not keep it open until
/// the broker aborts it (which would fence the producer): the processor
/// aborts it itself, commits nothing, and goes on once Redis answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_aborts_the_open_transaction_in_time() {
    let env = TestEnv::new("frozen-redis", 2).await;
    let (redis, mut processor, mut reference) =
        one_report_through_a_patient_redis(&env, ("READFOLD__KAFKA__TRANSACTION_TIMEOUT_MS", "4000")).await;

    redis.signal("STOP");
    env.feed(&mut reference).report(report("C", "u", 2)).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = env.changelog();
    assert!(
        during.latest().values().all(|v| matches!(v, Some((1, _)))),
        "nothing may be committed while Redis hangs: {:?}",
        during.latest()
    );
    assert!(
        processor.log_text().contains("the stores did not answer in time"),
        "{}",
        processor.log_text()
    );

    redis.signal("CONT");
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(processor.is_running(), "{}", processor.log_text());
    assert!(processor.terminate(Duration::from_secs(30)));
}

/// A processor on a private Redis that it waits on for a minute before a
/// call times out (so that a frozen Redis hangs a flush rather than fails
/// it), with one more setting, once report C/u/1 is in the changelog.
async fn one_report_through_a_patient_redis(
    env: &TestEnv,
    setting: (&str, &str),
) -> (PrivateRedis, Processor, Reference) {
    let mut redis = PrivateRedis::fresh();
    redis.up();
    let url = redis.url();
    let processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__REDIS__URL", url.as_str()),
            ("READFOLD__REDIS__TIMEOUT_MS", "60000"),
            setting,
        ],
    );
    let mut reference = Reference::default();
    env.feed(&mut reference).report(report("C", "u", 1)).await;
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    (redis, processor, reference)
}
