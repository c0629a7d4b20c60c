//! Faults under load: the processor killed again and again, a sink server
//! stopped, instances joining and leaving. Each test checks at the end that
//! (a) the changelog, Redis and CQL equal a reference fold of everything
//! produced, (b) no key's committed cursor ever went down, and (c) every
//! input record was folded or dead-lettered (offsets committed to the end,
//! dead letters = bad records sent).

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing() {
    let env = TestEnv::new("sigkill", 3).await;
    let killer = env.kill_repeatedly(
        10,
        Duration::from_millis(700),
        Duration::from_millis(2300),
        0x9e37_79b9,
    );
    let (load, ()) = tokio::join!(produce_load(&env, Duration::from_secs(25), 7), killer);
    let mut last = env.spawn("a");
    check_everything(&env, &load).await;
    assert!(last.terminate(Duration::from_secs(30)), "{}", last.log_text());
    assert_all_input_committed(&env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_join_and_leave_under_load() {
    // The classic protocol takes the session timeout from the client.
    let env = TestEnv::new("join-leave", 6).await;
    let a = join_and_leave_under_load(
        &env,
        &[("READFOLD__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS", "6000")],
    )
    .await;
    assert!(
        !a.contains("partitions released"),
        "the classic protocol revokes whole:\n{a}"
    );
}

/// Under the consumer protocol (KIP-848) the broker's range assignor keeps
/// partition N of both inputs on one member and moves only what must move:
/// the partitions instance a holds throughout are never released (they
/// never stop), the others come and go incrementally, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_join_and_leave_incrementally_under_the_consumer_protocol() {
    let env = TestEnv::with_vars(
        "join-leave-kip848",
        6,
        &[("READFOLD__KAFKA__GROUP_PROTOCOL", "consumer")],
    )
    .await;
    let a = join_and_leave_under_load(&env, &[]).await;
    let released: Vec<i32> = a
        .lines()
        .filter(|l| l.contains("partitions released"))
        .flat_map(|l| listed(l, "read_reports=["))
        .collect();
    assert!(
        !released.is_empty(),
        "a released nothing when b and c joined:\n{a}"
    );
    let assigned: Vec<&str> = a.lines().filter(|l| l.contains("partitions assigned")).collect();
    for line in &assigned {
        assert_eq!(
            listed(line, "read_reports=["),
            listed(line, "conversation_events=["),
            "partition N of both inputs together: {line}"
        );
    }
    let held_throughout: Vec<i32> = (0..6)
        .filter(|p| assigned.iter().all(|l| listed(l, "read_reports=[").contains(p)))
        .collect();
    assert!(
        !held_throughout.is_empty(),
        "a kept nothing through the joins:\n{a}"
    );
    assert!(
        !released.iter().any(|p| held_throughout.contains(p)),
        "a released {released:?} yet held {held_throughout:?} throughout:\n{a}"
    );
}

/// With a warm standby on, the partitions that move (to b and c as they
/// join, from c when it is killed, from b when it stops) are restored from
/// the standby's state and the changelogs' tails, and every store still
/// agrees with the fold: no cursor lost, none moved back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_standby_hands_over_moved_partitions_with_only_their_tails_to_read() {
    let env = TestEnv::with_vars(
        "standby",
        6,
        &[
            ("READFOLD__KAFKA__GROUP_PROTOCOL", "consumer"),
            ("READFOLD__STATE__STANDBY", "true"),
        ],
    )
    .await;
    let a = join_and_leave_under_load(&env, &[]).await;
    let restores: Vec<&str> = a
        .lines()
        .filter(|l| l.contains("restored partition state"))
        .collect();
    // a owns every partition first, then takes c's and b's over.
    let from_standby: Vec<&&str> = restores
        .iter()
        .filter(|l| !l.contains("from_standby=0"))
        .collect();
    assert!(
        !from_standby.is_empty(),
        "a took nothing over from its standby:\n{}",
        restores.join("\n")
    );
}

/// The partitions listed after `label` in a log line.
fn listed(line: &str, label: &str) -> Vec<i32> {
    let Some(start) = line.find(label) else {
        return Vec::new();
    };
    let rest = &line[start + label.len()..];
    rest[..rest.find(']').unwrap_or(0)]
        .split(',')
        .filter_map(|p| p.trim().parse().ok())
        .collect()
}

/// Instance a under load from the start; b and c join at 3 s, c is
/// SIGKILLed at 9 s and b stops at 13 s, each with `vars`. Checks every
/// store against the reference and returns a's log.
async fn join_and_leave_under_load(env: &TestEnv, group: &[(&str, &str)]) -> String {
    let a_metrics = free_local_addr();
    let mut a_vars = group.to_vec();
    a_vars.push(("READFOLD__METRICS__LISTEN", a_metrics.as_str()));
    let mut a = env.spawn_with("a", &a_vars);
    let membership = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut b = env.spawn_with("b", group);
        let mut c = env.spawn_with("c", group);
        tokio::time::sleep(Duration::from_secs(6)).await;
        c.kill();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(b.terminate(Duration::from_secs(30)), "b: {}", b.log_text());
    };
    let (load, ()) = tokio::join!(produce_load(env, Duration::from_secs(20), 11), membership);
    check_everything(env, &load).await;
    // Through every rebalance, records came a batch at a time from the
    // queue the assignment was routed to.
    assert_all_routed(&a_metrics, &a);
    assert!(a.terminate(Duration::from_secs(30)), "{}", a.log_text());
    assert_all_input_committed(env);
    a.log_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cql_outage_pauses_the_consumer_and_loses_nothing() {
    let env = TestEnv::exclusive("cql-outage", 2).await;
    let small = [("READFOLD__FLUSH__MAX_DIRTY", "20")];
    let mut processor = env.spawn_with("a", &small);
    let first = produce_load(&env, Duration::from_secs(2), 3).await;
    env.wait_for_reference(&first.reference, Duration::from_secs(60))
        .await;

    let mut outage = Outage::begin("cassandra");
    // Between snapshot ticks the changelog may run up to one interval ahead
    // of CQL; once a snapshot tick has failed, nothing more is committed.
    let producer = env.producer();
    let mut reference = first.reference;
    let trigger = report("c0", "trigger", 1);
    reference.report(&trigger);
    producer.report(&trigger).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Many distinct keys while CQL is away: the dirty set passes 4 x 20.
    let mut reports = Vec::new();
    for c in 0..20 {
        for u in 0..10 {
            reports.push(report(&format!("c{c}"), &format!("new{u}"), 1));
        }
    }
    reports.iter().for_each(|r| reference.report(r));
    producer.send_many(&reports, &[]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let held = env.changelog().latest();
    assert!(
        held.keys().all(|(_, u)| !u.starts_with("new")),
        "a flush committed while CQL was down"
    );
    assert!(processor.is_running(), "{}", processor.log_text());
    outage.end();

    let load = Load {
        reference,
        bad: first.bad,
    };
    check_everything(&env, &load).await;
    let log = processor.log_text();
    assert!(
        log.contains("pausing the consumer"),
        "the consumer never paused:\n{log}"
    );
    assert!(processor.terminate(Duration::from_secs(30)), "{log}");
}

/// Stops `name` for ~8 s in the middle of a 25 s load; the processor rides
/// it out and nothing is lost.
async fn restart_under_load(test: &str, name: &'static str) {
    let env = TestEnv::exclusive(test, 3).await;
    let mut processor = env.spawn("a");
    let outage = async {
        tokio::time::sleep(Duration::from_secs(6)).await;
        let mut outage = Outage::begin(name);
        tokio::time::sleep(Duration::from_secs(8)).await;
        outage.end();
    };
    let (load, ()) = tokio::join!(produce_load(&env, Duration::from_secs(25), 13), outage);
    assert!(
        processor.is_running(),
        "the processor died during the {name} restart:\n{}",
        processor.log_text()
    );
    check_everything(&env, &load).await;
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
    assert_all_input_committed(&env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_restart_under_load_loses_nothing() {
    restart_under_load("kafka-restart", "kafka").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_under_load_loses_nothing() {
    restart_under_load("redis-restart", "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cql_restart_under_load_loses_nothing() {
    restart_under_load("cql-restart", "cassandra").await;
}
