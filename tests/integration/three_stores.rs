//! The changelog, Redis and CQL end with the same cursors as a reference
//! fold computed in the test.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use readfold::codec::EventRecord;

use crate::harness::*;

/// Polls CQL until it holds `want` (present members) or the timeout passes.
async fn wait_for_cql(
    keyspace: &str,
    want: &BTreeMap<Key, (i64, i64)>,
    timeout: Duration,
) -> BTreeMap<Key, (i64, i64)> {
    let started = Instant::now();
    loop {
        let got = cql_cursors(keyspace).await;
        if &got == want || started.elapsed() > timeout {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn assert_redis_matches(env: &TestEnv, reference: &Reference) {
    let mut by_conv: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for ((c, u), (cursor, _)) in reference.present() {
        by_conv.entry(c).or_default().insert(u, cursor);
    }
    for (conv, want) in by_conv {
        let got: BTreeMap<String, i64> = redis_cursors(&redis_url(), &env.config.redis.key_prefix, &conv)
            .await
            .into_iter()
            .collect();
        assert_eq!(got, want, "redis hash of {conv}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_chats_land_in_all_three_stores() {
    let env = TestEnv::new("three-seed", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("P", "G").await;
    let mut processor = env.spawn("a");
    let log = env
        .wait_for(Duration::from_secs(60), |log| {
            log.latest() == reference.expected()
        })
        .await;
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

/// xorshift: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_reports_end_equal_everywhere() {
    let env = TestEnv::new("three-random", 4).await;
    let mut reference = Reference::default();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let (convs, users) = (40u64, 25u64);
    let mut latest = vec![0i64; convs as usize];
    let (mut reports, mut events) = (Vec::new(), Vec::new());
    // 100k records: messages, late joins, and reports that are often stale
    // or duplicated, for conversations whose two inputs interleave freely.
    for i in 0..100_000u64 {
        let c = rng.below(convs) as usize;
        let conv = format!("conv-{c}");
        match rng.below(20) {
            0..=2 => {
                latest[c] += 1;
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MessageSent {
                        sender_id: format!("u{}", rng.below(users)),
                    },
                );
                reference.event(&e);
                events.push(e);
            }
            3 if i % 7 == 0 => {
                let e = event(
                    &conv,
                    latest[c],
                    EventRecord::MemberJoined {
                        user_id: format!("late{}", rng.below(5)),
                    },
                );
                reference.event(&e);
                events.push(e);
            }
            _ => {
                let seq = (latest[c] - rng.below(4) as i64).max(1);
                let r = report(&conv, &format!("u{}", rng.below(users)), seq);
                reference.report(&r);
                reports.push(r);
            }
        }
    }
    let mut processor = env.spawn("a");
    env.producer().send_many(&reports, &events).await.unwrap();
    let log = env
        .wait_for(Duration::from_secs(180), |log| {
            log.latest() == reference.expected()
        })
        .await;
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
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}
