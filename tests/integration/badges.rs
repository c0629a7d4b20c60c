//! The badge stage (`readfold badges`) against the real services: after a
//! mixed workload with both stages SIGKILLed, every user's badge on the
//! badges topic and in Redis equals a count from scratch over the
//! conversations' final state; mark-all-read clears a user's badge through
//! the first stage; bad user actions are dead-lettered.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use readfold_core::badge::{recount, Badge, BadgeRules};
use readfold_core::partitioner::partition_for_key;
use readfold_core::UserId;
use readfold_serve::client::HttpClient;
use readfold_store::redis::RedisStore;
use readfold_wire::badge::{decode_user_badge, encode_user_action, UserActionKind, UserActionRecord};

use crate::kit::load::{produce_mixed_load, Load};
use crate::kit::reference::{joined, report, sent, Reference};
use crate::kit::*;

/// Each user's badge as the reference fold's final state gives it, counted
/// from scratch at `now_ms` (users with nothing unread anywhere included).
pub(crate) fn expected_badges(
    reference: &Reference,
    rules: BadgeRules,
    now_ms: i64,
) -> BTreeMap<String, Badge> {
    recount(&reference.state, rules, now_ms)
        .into_iter()
        .map(|(u, b)| (u.to_string(), b))
        .collect()
}

/// The latest badge per user on the badges topic.
fn published(env: &TestEnv) -> BTreeMap<String, Badge> {
    env.raw_records(&env.config.badge.user_badges)
        .into_iter()
        .filter_map(|(_, value)| decode_user_badge(&value?).ok())
        .map(|r| (r.user_id, r.badge))
        .collect()
}

/// Waits until the topic and Redis hold `want` for every user (a user
/// missing from either counts as an empty badge).
pub(crate) async fn wait_for_badges(env: &TestEnv, want: &BTreeMap<String, Badge>, timeout: Duration) {
    let redis = RedisStore::connect(&env.config.redis).await.unwrap();
    let started = Instant::now();
    loop {
        let got = published(env);
        let mut wrong = Vec::new();
        for (user, badge) in want {
            let on_topic = got.get(user).copied().unwrap_or_default();
            let in_redis = redis
                .badge(user)
                .await
                .unwrap()
                .map(|(b, _)| b)
                .unwrap_or_default();
            if on_topic != *badge || in_redis != *badge {
                wrong.push(format!(
                    "{user}: topic {on_topic:?}, redis {in_redis:?}, want {badge:?}"
                ));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < timeout,
            "badges differ from a recount of the final state:\n{}",
            wrong[..wrong.len().min(10)].join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Ends a mixed load with messages nobody reads (every other member's
/// badge follows, though their own records do not change; the sender may
/// have left), waits until the first stage folded everything, and returns
/// each user's badge counted from scratch.
async fn close_and_recount(env: &TestEnv, load: &mut Load) -> BTreeMap<String, Badge> {
    for c in ["c0", "c1", "c2"] {
        let id: readfold_core::ConversationId = c.parse().unwrap();
        let next = load
            .reference
            .state
            .conversation(&id)
            .map_or(0, |v| v.latest_seq().get()) as i64
            + 1;
        env.feed(&mut load.reference).event(sent(c, "u0", next)).await;
    }
    env.wait_for_reference(&load.reference, Duration::from_secs(60))
        .await;
    let rules = env.config.badge.rules().unwrap();
    expected_badges(&load.reference, rules, readfold_kafka::now_ms())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn badges_equal_a_recount_after_a_mixed_workload_with_both_stages_killed() {
    let env = TestEnv::new("badges", 3).await;
    let mut processor = env.spawn("a");
    let mut stage = env.spawn_command("badges", "b1", &[]);
    let killer = async {
        for round in 0..3u64 {
            tokio::time::sleep(Duration::from_millis(1500 + 700 * round)).await;
            assert!(
                stage.is_running(),
                "the badge stage died by itself:\n{}",
                stage.log_text()
            );
            stage.kill();
            stage = env.spawn_command("badges", "b1", &[]);
            if round == 1 {
                assert!(processor.is_running(), "{}", processor.log_text());
                processor.kill();
                processor = env.spawn("a");
            }
        }
    };
    let (mut load, ()) = tokio::join!(produce_mixed_load(&env, Duration::from_secs(10), 77), killer);
    let want = close_and_recount(&env, &mut load).await;
    assert!(
        want.values().any(|b| b.badge > 0),
        "the load leaves something unread"
    );
    wait_for_badges(&env, &want, Duration::from_secs(60)).await;

    // The query API answers them from Redis.
    let addr = free_local_addr();
    let mut serve = env.spawn_command("serve", "api", &[("READFOLD__SERVE__LISTEN", addr.as_str())]);
    let started = Instant::now();
    while HttpClient::new(addr.clone()).get("/healthz").await.is_err() {
        assert!(
            serve.is_running() && started.elapsed() < Duration::from_secs(60),
            "{}",
            serve.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (user, badge) in want.iter().take(5) {
        let body = HttpClient::new(addr.clone())
            .get(&format!("/v1/users/{user}/badge"))
            .await
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(body["badge"], badge.badge, "{user}: {body}");
        assert_eq!(body["mentions"], badge.totals.mentions, "{user}: {body}");
        assert_eq!(
            body["conversations"], badge.totals.conversations,
            "{user}: {body}"
        );
    }
    assert!(serve.terminate(Duration::from_secs(30)), "{}", serve.log_text());

    // Mark all read: the stage sends read reports (and clears of marks)
    // through the first stage, and the user's badge follows to nothing.
    let (user, _) = want.iter().max_by_key(|(_, b)| b.totals.messages).unwrap();
    let action = UserActionRecord {
        user_id: user.clone(),
        action: UserActionKind::MarkAllRead,
        at: readfold_kafka::now_ms(),
    };
    let partition = partition_for_key(user.as_bytes(), env.partitions);
    env.producer()
        .send(
            &env.config.badge.user_actions,
            user,
            Some(&encode_user_action(&action)),
            Some(partition),
        )
        .await
        .unwrap();
    let redis = RedisStore::connect(&env.config.redis).await.unwrap();
    let started = Instant::now();
    loop {
        let badge = redis
            .badge(user)
            .await
            .unwrap()
            .map(|(b, _)| b)
            .unwrap_or_default();
        // Muted conversations' unread messages are not part of the badge,
        // but a read clears everything.
        if badge.totals.conversations == 0 && badge.totals.messages == 0 && badge.totals.mentions == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "mark-all-read left {user}'s badge at {badge:?}\n{}",
            stage.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every conversation of the user is read to its latest seq.
    let user_id: UserId = user.parse().unwrap();
    let log = env.user_changelog();
    for (c, conv) in load.reference.state.conversations() {
        if conv.member(&user_id).is_some_and(|m| !m.left) {
            let key = (c.to_string(), user.clone());
            let own = log.own.get(&key).copied().flatten().expect("the user's view");
            assert!(
                own.cursor.max(own.private_cursor) >= conv.latest_seq().get() as i64 && !own.unread_mark,
                "{c}: {own:?}"
            );
        }
    }
    assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn badge_instances_join_and_leave_under_load() {
    let env = TestEnv::new("badges-scale", 3).await;
    badge_instances_join_and_leave(&env).await;
}

/// The same under the consumer protocol (KIP-848): each instance keeps the
/// users of the partitions it holds through every change, forgets those of
/// the ones it gives up and restores those it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn badge_instances_join_and_leave_incrementally_under_the_consumer_protocol() {
    let env = TestEnv::with_vars(
        "badges-scale-kip848",
        3,
        &[("READFOLD__KAFKA__GROUP_PROTOCOL", "consumer")],
    )
    .await;
    let b1 = badge_instances_join_and_leave(&env).await;
    assert!(b1.contains("partitions forgotten"), "b1 gave nothing up:\n{b1}");
}

/// b1 starts before anything is on the changelogs; b2 and b3 join under
/// load and b2 is SIGKILLed. The closing messages come from a member who
/// may have left: every badge still equals a recount. Returns b1's log.
async fn badge_instances_join_and_leave(env: &TestEnv) -> String {
    let mut processor = env.spawn("a");
    let mut b1 = env.spawn_command("badges", "b1", &[]);
    let scaler = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut b2 = env.spawn_command("badges", "b2", &[]);
        tokio::time::sleep(Duration::from_millis(2000)).await;
        let b3 = env.spawn_command("badges", "b3", &[]);
        tokio::time::sleep(Duration::from_millis(2000)).await;
        assert!(b2.is_running(), "{}", b2.log_text());
        b2.kill();
        b3
    };
    let (mut load, mut b3) = tokio::join!(produce_mixed_load(env, Duration::from_secs(10), 91), scaler);
    let want = close_and_recount(env, &mut load).await;
    wait_for_badges(env, &want, Duration::from_secs(60)).await;
    for stage in [&mut b1, &mut b3] {
        assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
    }
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
    b1.log_text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_while_the_badge_stage_is_down_reaches_the_badge_after_it() {
    // b reads everything, then a message comes while no badge stage runs:
    // b's own record does not change, only the conversation's latest seq.
    let env = TestEnv::new("badges-down", 2).await;
    let mut processor = env.spawn("a");
    let mut stage = env.spawn_command("badges", "b1", &[]);
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for (c, peer) in [("down-1", "p1"), ("down-2", "p2")] {
        feed.event(joined(c, "b", 0)).await;
        feed.event(joined(c, peer, 0)).await;
        feed.event(sent(c, peer, 1)).await;
        feed.report(report(c, "b", 1)).await;
    }
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let rules = env.config.badge.rules().unwrap();
    let read = expected_badges(&reference, rules, readfold_kafka::now_ms());
    assert_eq!(read["b"].badge, 0);
    wait_for_badges(&env, &read, Duration::from_secs(60)).await;

    stage.kill();
    env.feed(&mut reference).event(sent("down-1", "p1", 2)).await;
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let mut stage = env.spawn_command("badges", "b1", &[]);
    let want = expected_badges(&reference, rules, readfold_kafka::now_ms());
    assert_eq!(want["b"].badge, 1, "one message unread");
    wait_for_badges(&env, &want, Duration::from_secs(60)).await;
    assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_user_actions_go_to_the_dead_letter_topic() {
    let env = TestEnv::new("badges-dlq", 2).await;
    let _processor = env.spawn("a");
    let mut stage = env.spawn_command("badges", "b1", &[]);
    let producer = env.producer();
    let topic = env.config.badge.user_actions.clone();
    producer
        .send(&topic, "u", Some(b"\x02\xff"), Some(0))
        .await
        .unwrap();
    // A user's action on another user's partition.
    let user = "someone";
    let wrong = (partition_for_key(user.as_bytes(), 2) + 1) % 2;
    let action = UserActionRecord {
        user_id: user.into(),
        action: UserActionKind::MarkAllRead,
        at: 1,
    };
    producer
        .send(&topic, user, Some(&encode_user_action(&action)), Some(wrong))
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let reasons: Vec<String> = env
            .dead_letters()
            .iter()
            .filter_map(|d| d["headers"]["readfold.reason"].as_str().map(str::to_owned))
            .collect();
        if reasons.contains(&"decode_error".to_owned()) && reasons.contains(&"wrong_partition".to_owned()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "dead letters: {reasons:?}\n{}",
            stage.log_text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        stage.is_running(),
        "bad input must not stop the stage:\n{}",
        stage.log_text()
    );
    assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
}
