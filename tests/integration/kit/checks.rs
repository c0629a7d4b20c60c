//! End-of-run checks shared by the fault and workload tests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use readfold_store::redis::PrivateState;

use super::*;

/// Checks (a), (b) and (c) once the last processor has stopped gracefully.
pub async fn check_everything(env: &TestEnv, load: &Load) {
    let reference = &load.reference;
    let log = env.wait_for_reference(reference, Duration::from_secs(120)).await;
    assert_matches(&log, reference);
    assert!(
        log.regressions().is_empty(),
        "cursors went down: {:?}",
        log.regressions()
    );
    assert_redis_matches(env, reference).await;
    let want = reference.present();
    let cql = wait_for_cql(&env.config.cql.keyspace, &want, Duration::from_secs(60)).await;
    assert_same_rows("CQL", &cql, &want);
    check_private_stores(env, reference).await;
    assert_eq!(
        env.dead_letters().len(),
        load.bad,
        "every bad record dead-lettered exactly once"
    );
    assert_all_input_committed(env);
}

/// The group's committed offsets reach the end of both inputs.
pub fn assert_all_input_committed(env: &TestEnv) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", &env.config.kafka.group_id)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for topic in [
        &env.config.topics.read_reports,
        &env.config.topics.conversation_events,
    ] {
        for p in 0..env.partitions {
            tpl.add_partition(topic, p);
        }
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    for e in committed.elements() {
        let (_, high) = consumer
            .fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(10))
            .unwrap();
        let at = match e.offset() {
            Offset::Offset(o) => o,
            _ => 0,
        };
        assert_eq!(
            at,
            high,
            "{}[{}]: committed {at} of {high}",
            e.topic(),
            e.partition()
        );
    }
}

/// What only members' own devices see agrees with the reference everywhere:
/// the by-user changelog (own cursors, private cursors, unread marks), and
/// the per-user Redis and CQL stores (private cursors and marks).
pub async fn check_private_stores(env: &TestEnv, reference: &Reference) {
    let want_own = reference.own_expected();
    let started = Instant::now();
    let mut own = env.user_changelog().own;
    while own != want_own && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        own = env.user_changelog().own;
    }
    let diff: Vec<_> = want_own
        .iter()
        .filter(|(k, v)| own.get(*k) != Some(v))
        .map(|(k, v)| (k, own.get(k), v))
        .collect();
    assert!(
        diff.is_empty(),
        "by-user changelog differs (key, got, want): {diff:?}"
    );
    let want = reference.private_states();
    let redis = private_states_in(&want, |user, convs| {
        let prefix = env.config.redis.key_prefix.clone();
        async move { redis_private_state(&redis_url(), &prefix, &user, &convs).await }
    })
    .await;
    assert_eq!(redis, want, "Redis private state");
    let started = Instant::now();
    loop {
        let cql = private_states_in(&want, |user, convs| {
            let keyspace = env.config.cql.keyspace.clone();
            async move { cql_private_state(&keyspace, &user, &convs).await }
        })
        .await;
        if cql == want || started.elapsed() > Duration::from_secs(60) {
            assert_eq!(cql, want, "CQL private state");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Reads a store's private state for every (user, conversation) of `want`.
async fn private_states_in<F, Fut>(
    want: &BTreeMap<(String, String), PrivateState>,
    read: F,
) -> BTreeMap<(String, String), PrivateState>
where
    F: Fn(String, Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Vec<PrivateState>>,
{
    let mut by_user: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (user, conv) in want.keys() {
        by_user.entry(user.clone()).or_default().push(conv.clone());
    }
    let mut got = BTreeMap::new();
    for (user, convs) in by_user {
        let states = read(user.clone(), convs.clone()).await;
        for (conv, state) in convs.into_iter().zip(states) {
            got.insert((user.clone(), conv), state);
        }
    }
    got
}

/// Asserts two key -> value maps are equal, naming what differs.
pub fn assert_same_rows<K: std::fmt::Debug + Ord, V: std::fmt::Debug + PartialEq>(
    store: &str,
    got: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
) {
    let missing: Vec<_> = want.iter().filter(|(k, _)| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.iter().filter(|(k, _)| !want.contains_key(*k)).collect();
    let different: Vec<_> = want
        .iter()
        .filter_map(|(k, v)| got.get(k).filter(|g| *g != v).map(|g| (k, g, v)))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && different.is_empty(),
        "{store} rows differ from the reference: missing {missing:?}, extra {extra:?}, (key, got, want) {different:?}"
    );
}

/// Asserts that the processor serving metrics on `addr` read records, all
/// of them from the queue its assigned partitions are routed to, none one
/// at a time from its consumer's own queue.
pub fn assert_all_routed(addr: &str, processor: &Processor) {
    let scraped = scrape(addr).unwrap_or_default();
    let samples = |series: &str| -> Vec<f64> {
        scraped
            .lines()
            .filter(|l| l.starts_with(series))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect()
    };
    let read: f64 = samples("readfold_records_in_total{").iter().sum();
    assert!(read > 0.0, "no records read:\n{scraped}");
    assert_eq!(
        samples("readfold_records_unrouted_total "),
        [0.0],
        "records read from the consumer's own queue:\n{}",
        processor.log_text()
    );
}
