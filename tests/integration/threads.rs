//! Threads end to end: replies, thread reads (public and private), mentions,
//! joins and departures through the real broker, with SIGKILLs, against the
//! core's own fold.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use readfold_core::fold::{PartitionState, ThreadView};
use readfold_core::{ConversationId, Seq};
use readfold_kafka::changelog::{ChangelogReader, Restorer};
use readfold_wire::changelog::{ChangelogEntry, ChangelogKind, ThreadEntry};
use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};

use crate::kit::checks::assert_all_input_committed;
use crate::kit::env::TestEnv;
use crate::kit::reference::{assert_matches, Reference};
use crate::kit::services::{now_ms, redis_url, Rng};
use crate::kit::stores::{cql_config, redis_store};
use crate::serve::spawn_serve;
use readfold_core::fold::thread_own_unread;
use readfold_serve::client::HttpClient;
use readfold_store::cql::CqlStore;
use readfold_store::redis::FollowedThread;
use serde_json::{json, Value};

/// (conversation, thread, user).
type ThreadKey = (String, u64, String);
/// (cursor, join_seq, private cursor: by-user only), or `None`: departed.
type ThreadValue = Option<(u64, u64, Option<u64>)>;

const CONVERSATIONS: u64 = 8;

/// Thread-heavy load for `duration`: per conversation, messages, replies to
/// the first few messages, thread reads (some private, some stale), mentions
/// in replies, joins and departures; folded into a reference as produced.
async fn produce_thread_load(env: &TestEnv, duration: Duration, seed: u64) -> Reference {
    let producer = env.producer();
    let mut reference = Reference::default();
    let mut rng = Rng::new(seed);
    let mut latest = vec![0i64; CONVERSATIONS as usize];
    let mut thread_latest: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    let mut at = now_ms();
    let started = Instant::now();
    while started.elapsed() < duration {
        let (mut reports, mut events) = (Vec::new(), Vec::new());
        for _ in 0..120 {
            let c = rng.below(CONVERSATIONS);
            let conv = format!("t{c}");
            let user = format!("u{}", rng.below(6));
            at += 1;
            let event = |seq, event| ConversationEventRecord {
                conversation_id: conv.clone(),
                seq,
                at,
                event,
            };
            let message = |thread, thread_seq, mentions, starter_id| EventRecord::MessageSent {
                sender_id: user.clone(),
                mentions,
                mention_all: false,
                thread,
                thread_seq,
                starter_id,
            };
            let roll = rng.below(20);
            let e = match roll {
                0..=2 => {
                    latest[c as usize] += 1;
                    Some(event(latest[c as usize], message(0, 0, Vec::new(), None)))
                }
                3 | 4 if latest[c as usize] > 0 => Some(event(
                    latest[c as usize],
                    EventRecord::MemberJoined {
                        user_id: user.clone(),
                    },
                )),
                5 if latest[c as usize] > 0 => Some(event(
                    latest[c as usize],
                    EventRecord::MemberLeft {
                        user_id: user.clone(),
                    },
                )),
                6..=10 if latest[c as usize] > 0 => {
                    let root = 1 + rng.below(latest[c as usize].min(3) as u64) as i64;
                    let thread_seq = thread_latest.entry((c, root)).or_insert(0);
                    *thread_seq += 1;
                    let mentions = match rng.below(4) {
                        0 => vec![format!("u{}", rng.below(6))],
                        _ => Vec::new(),
                    };
                    let starter = format!("u{}", root as u64 % 6);
                    Some(event(
                        latest[c as usize],
                        message(root, *thread_seq, mentions, Some(starter)),
                    ))
                }
                _ => None,
            };
            if let Some(e) = e {
                reference.event(&e);
                events.push(e);
                continue;
            }
            // A thread read, often stale or private.
            let root = 1 + rng.below(3) as i64;
            let known = thread_latest.get(&(c, root)).copied().unwrap_or(0);
            let r = ReadReportRecord {
                conversation_id: conv.clone(),
                user_id: user,
                seq: (known - rng.below(3) as i64).max(1),
                device_id: None,
                reported_at: now_ms(),
                private: rng.below(4) == 0,
                action: ReadAction::Read,
                muted_until: None,
                thread: root,
            };
            reference.report(&r);
            reports.push(r);
        }
        producer.send_many(&reports, &events).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    reference
}

/// The latest value of every key of a thread changelog.
fn thread_changelog(env: &TestEnv, topic: &str, kind: ChangelogKind) -> BTreeMap<ThreadKey, ThreadValue> {
    let reader = ChangelogReader::new(
        &env.config.kafka,
        &format!("{}-test-read", env.config.kafka.group_id),
        topic,
        kind,
        env.config.input.max_id_bytes,
    )
    .expect("changelog reader");
    let mut latest = BTreeMap::new();
    for (_, entry) in reader.entries(None).expect("read the thread changelog") {
        let ChangelogEntry::Thread(entry) = entry else {
            panic!("not a thread record: {entry:?}");
        };
        let (key, value) = match entry {
            ThreadEntry::Cursor(c) => (
                c.key,
                Some((
                    c.cursor.get(),
                    c.join_seq.get(),
                    c.private_cursor.map(|p| p.get()),
                )),
            ),
            ThreadEntry::Left(key) => (key, None),
            other => panic!("not a thread cursor record: {other:?}"),
        };
        latest.insert(
            (
                key.conversation_id.to_string(),
                key.thread.get(),
                key.user_id.to_string(),
            ),
            value,
        );
    }
    latest
}

/// Every thread of `states`, whole: marks, every follower entry (departed
/// ones too) with both cursors and its join point.
fn threads_of<'a>(
    states: impl IntoIterator<Item = &'a PartitionState>,
) -> BTreeMap<(ConversationId, Seq), ThreadView> {
    let mut out = BTreeMap::new();
    for state in states {
        for (id, conversation) in state.conversations() {
            let threads = conversation.threads();
            for root in threads.roots() {
                out.insert((id.clone(), root), threads.thread(root).unwrap());
            }
        }
    }
    out
}

/// What the thread changelogs must end with: every follower's published
/// cursor and join point, `None` for a departed one; with `own`, their
/// private cursor too.
fn expected_threads(reference: &Reference, own: bool) -> BTreeMap<ThreadKey, ThreadValue> {
    let mut out = BTreeMap::new();
    for (id, conversation) in reference.state.conversations() {
        let threads = conversation.threads();
        for root in threads.roots() {
            for (user, f) in threads.thread(root).unwrap().followers {
                let value = f.present.then(|| {
                    let private = own.then_some(f.private_cursor.get());
                    (f.cursor.get(), f.join_seq.get(), private)
                });
                out.insert((id.to_string(), root.get(), user.to_string()), value);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_cursors_survive_sigkills_and_agree_with_the_fold() {
    let env = TestEnv::new("threads", 3).await;
    let killer = env.kill_repeatedly(
        5,
        Duration::from_millis(1500),
        Duration::from_millis(2500),
        0x5eed,
    );
    let (reference, ()) = tokio::join!(produce_thread_load(&env, Duration::from_secs(18), 11), killer);
    let mut last = env.spawn("a");
    let want = expected_threads(&reference, false);
    let want_own = expected_threads(&reference, true);
    assert!(want.len() > 50, "the load made few followers: {}", want.len());
    assert!(
        want.values().any(|v| v.is_some_and(|(_, join, _)| join > 1)),
        "no follower joined after a reply"
    );
    assert!(want.values().any(Option::is_none), "no follower departed");
    let deadline = Instant::now() + Duration::from_secs(60);
    let topics = &env.config.topics;
    loop {
        let got = thread_changelog(&env, &topics.thread_cursors, ChangelogKind::ThreadByConversation);
        let got_own = thread_changelog(&env, &topics.user_thread_cursors, ChangelogKind::ThreadByUser);
        if got == want && got_own == want_own {
            break;
        }
        if Instant::now() > deadline {
            let diff: Vec<_> = want
                .iter()
                .filter(|(k, v)| got.get(*k) != Some(v))
                .map(|(k, v)| (k, got.get(k), v))
                .take(20)
                .collect();
            let own_diff: Vec<_> = want_own
                .iter()
                .filter(|(k, v)| got_own.get(*k) != Some(v))
                .map(|(k, v)| (k, got_own.get(k), v))
                .take(20)
                .collect();
            panic!(
                "the thread changelogs differ from the fold (key, got, want): {diff:?}\nby user: {own_diff:?}\n{}",
                last.log_text()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The conversations' own cursors are as the fold has them, threads or not.
    let log = env.wait_for_reference(&reference, Duration::from_secs(30)).await;
    assert_matches(&log, &reference);
    assert!(last.terminate(Duration::from_secs(30)), "{}", last.log_text());
    assert_all_input_committed(&env);
    // Redis holds each thread as its readers see it, and each follower's
    // own state.
    let redis = redis_store(&redis_url(), &env.config.redis.key_prefix).await;
    for ((conversation, root), view) in threads_of([&reference.state]) {
        let got = redis.read_thread(&conversation, root).await.unwrap();
        assert_eq!(
            got,
            Some(view.conversation_view()),
            "Redis thread {conversation:?} {root}"
        );
    }
    let mut own = BTreeMap::new();
    for user in (0..6).map(|u| format!("u{u}").parse().unwrap()) {
        for t in redis.read_user_threads(&user).await.unwrap() {
            let key = (t.conversation_id.to_string(), t.thread.get(), user.to_string());
            own.insert(key, t.private_cursor.map(|p| p.get()));
        }
    }
    let want_own_private: BTreeMap<ThreadKey, Option<u64>> = want_own
        .iter()
        .map(|(k, v)| (k.clone(), v.and_then(|(_, _, private)| private)))
        .collect();
    assert_eq!(own, want_own_private, "Redis per-user threads");
    // So does CQL, written by the snapshots (the graceful stop wrote every
    // thread published).
    let cql = CqlStore::connect(&cql_config(&env.config.cql.keyspace))
        .await
        .expect("connect to the CQL server");
    for ((conversation, root), view) in threads_of([&reference.state]) {
        let got = cql.thread(&conversation, root).await.unwrap();
        assert_eq!(
            got,
            Some(view.conversation_view()),
            "CQL thread {conversation:?} {root}"
        );
    }
    for user in (0..6).map(|u| format!("u{u}").parse().unwrap()) {
        let mut redis_threads = redis.read_followed_threads(&user).await.unwrap();
        let mut cql_threads = cql.followed_threads(&user).await.unwrap();
        let order = |t: &FollowedThread| (t.conversation_id.clone(), t.thread);
        redis_threads.sort_by_key(order);
        cql_threads.sort_by_key(order);
        assert_eq!(cql_threads, redis_threads, "{user}'s followed threads in CQL");
    }
    // The query API answers from Redis as the read model does, and from
    // CQL once Redis holds nothing.
    let (mut serve, addr) = spawn_serve(&env, &[]).await;
    let mut client = HttpClient::new(addr);
    let threads = threads_of([&reference.state]);
    assert_thread_answers(&mut client, &threads, "redis").await;
    redis.delete_all().await.unwrap();
    assert_thread_answers(&mut client, &threads, "cql").await;
    assert!(serve.terminate(Duration::from_secs(10)), "{}", serve.log_text());
    // A restore from the changelogs alone holds the fold's threads whole.
    let restorer = Restorer::new(&env.config.kafka, topics, env.config.input.max_id_bytes).unwrap();
    let partitions: Vec<i32> = (0..env.partitions).collect();
    let (restored, _) = tokio::task::spawn_blocking(move || restorer.restore_many(&partitions))
        .await
        .unwrap()
        .unwrap();
    let (got, want) = (threads_of(restored.values()), threads_of([&reference.state]));
    assert_eq!(got.len(), want.len(), "threads restored");
    for (key, view) in &want {
        assert_eq!(got.get(key), Some(view), "thread {key:?} restored");
    }
}

/// The query API's four thread endpoints answer as the read model does,
/// from `source`.
async fn assert_thread_answers(
    client: &mut HttpClient,
    threads: &BTreeMap<(ConversationId, Seq), ThreadView>,
    source: &str,
) {
    for ((conversation, root), view) in threads.iter().take(12) {
        let want = view.conversation_view();
        let path = format!("/v1/conversations/{conversation}/threads/{root}");
        let got: Value = client.get(&path).await.unwrap().json().unwrap();
        let followers: Vec<Value> = want
            .members
            .iter()
            .map(|(u, m)| json!({ "user_id": u.as_str(), "cursor": m.cursor.get(), "join_seq": m.join_seq.get() }))
            .collect();
        assert_eq!(got["followers"], json!(followers), "{path}");
        assert_eq!(got["source"], source, "{path}");
        assert_eq!(got["latest_seq"], want.latest_seq.get(), "{path}");
        let replies: Vec<Value> = (1..=want.latest_seq.get())
            .map(|s| json!({ "seq": s, "sender": "u0" }))
            .collect();
        let counts: Value = client
            .post_json(&format!("{path}/read-counts"), &json!({ "messages": replies }))
            .await
            .unwrap()
            .json()
            .unwrap();
        for (i, count) in counts["counts"].as_array().unwrap().iter().enumerate() {
            let seq = Seq(i as u64 + 1);
            assert_eq!(
                count["read_count"],
                want.read_count(seq, &"u0".parse().unwrap()),
                "{path} reply {seq}"
            );
        }
        let readers: Value = client
            .get(&format!("{path}/replies/1/readers?sender=u0&limit=100"))
            .await
            .unwrap()
            .json()
            .unwrap();
        let (page, _) = want.readers_page(Seq(1), &"u0".parse().unwrap(), None, 100);
        let page: Vec<&str> = page.iter().map(|u| u.as_str()).collect();
        assert_eq!(readers["readers"], json!(page), "{path} readers of reply 1");
    }
    for u in 0..6 {
        let user = format!("u{u}");
        let got: Value = client
            .get(&format!("/v1/users/{user}/threads"))
            .await
            .unwrap()
            .json()
            .unwrap();
        let mut want_threads = Vec::new();
        let mut sums: BTreeMap<String, u64> = BTreeMap::new();
        for ((conversation, root), view) in threads {
            let Some((_, f)) = view
                .followers
                .iter()
                .find(|(id, f)| id.as_str() == user && f.present)
            else {
                continue;
            };
            let unread = thread_own_unread(view.latest_seq, f.cursor, f.private_cursor);
            *sums.entry(conversation.to_string()).or_default() += unread;
            want_threads.push(json!({
                "conversation_id": conversation.as_str(),
                "thread": root.get(),
                "latest_seq": view.latest_seq.get(),
                "cursor": f.cursor.get(),
                "private_cursor": f.private_cursor.get(),
                "unread": unread,
            }));
        }
        let want_sums: Vec<Value> = sums
            .iter()
            .map(|(c, n)| json!({ "conversation_id": c, "thread_unread": n }))
            .collect();
        assert_eq!(got["threads"], json!(want_threads), "{user}'s threads");
        if !want_threads.is_empty() {
            assert_eq!(got["source"], source, "{user}'s threads");
        }
        assert_eq!(
            got["conversations"],
            json!(want_sums),
            "{user}'s thread unread per conversation"
        );
    }
}

/// The badge stage counts followed threads' unread replies: under thread
/// load, with the badge stage SIGKILLed twice, every user's badge equals a
/// count from scratch over the fold's final state, threads included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn badges_count_followed_threads_across_badge_stage_kills() {
    let env = TestEnv::new("threads-badges", 3).await;
    let processor = env.spawn("a");
    let mut stage = env.spawn_command("badges", "b1", &[]);
    let killer = async {
        for round in 0..2u64 {
            tokio::time::sleep(Duration::from_millis(2000 + 1500 * round)).await;
            assert!(
                stage.is_running(),
                "the badge stage died by itself:\n{}",
                stage.log_text()
            );
            stage.kill();
            stage = env.spawn_command("badges", "b1", &[]);
        }
    };
    let (reference, ()) = tokio::join!(produce_thread_load(&env, Duration::from_secs(8), 23), killer);
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let rules = env.config.badge.rules().unwrap();
    let want = crate::badges::expected_badges(&reference, rules, crate::kit::services::now_ms());
    let without_threads = {
        let mut state = reference.state.clone();
        for (id, conversation) in reference.state.conversations() {
            let threads = conversation.threads();
            for root in threads.roots() {
                for (user, _) in threads.thread(root).unwrap().followers {
                    // Read to the end: the thread adds nothing.
                    state.apply_thread_read(&readfold_core::fold::ThreadReadReport {
                        conversation_id: id.clone(),
                        thread: root,
                        user_id: user,
                        seq: Seq(u64::MAX / 2),
                        reported_at: 0,
                        private: true,
                    });
                }
            }
        }
        readfold_core::badge::recount(&state, rules, crate::kit::services::now_ms())
    };
    assert!(
        want.iter()
            .any(|(u, b)| without_threads.get(&u.parse::<readfold_core::UserId>().unwrap()) != Some(b)),
        "the load leaves thread replies unread"
    );
    crate::badges::wait_for_badges(&env, &want, Duration::from_secs(60)).await;
    assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
    let mut processor = processor;
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

/// u's history in thread 7 of `conversation`: reads in epoch 1, a
/// departure (epoch 2), a rejoin after reply 4 (epoch 3) and a read there.
fn follower_history(conversation: &str) -> [readfold_core::fold::ThreadChange; 5] {
    let change = |cursor, private, join, epoch, present| {
        follower_change(conversation, cursor, private, join, epoch, present)
    };
    [
        change(1, 0, 1, 1, true),
        change(3, 2, 1, 1, true),
        change(3, 2, 1, 2, false),
        change(5, 4, 4, 3, true),
        change(6, 4, 4, 3, true),
    ]
}

const WRITE_ORDERS: [[usize; 5]; 4] = [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3], [1, 4, 0, 3, 2]];

fn follower_change(
    conversation: &str,
    cursor: u64,
    private: u64,
    join: u64,
    epoch: u64,
    present: bool,
) -> readfold_core::fold::ThreadChange {
    use readfold_core::fold::{Outputs, ThreadChange, ThreadKey};
    ThreadChange {
        key: ThreadKey {
            conversation_id: conversation.parse().unwrap(),
            thread: Seq(7),
            user_id: "u".parse().unwrap(),
        },
        cursor: Seq(cursor),
        private_cursor: Seq(private),
        join_seq: Seq(join),
        latest_seq: Seq(cursor.max(2)),
        present,
        epoch,
        updated_at: 0,
        outputs: Outputs {
            public: true,
            state: true,
        },
    }
}

/// The same in CQL: a follower's rows are ordered by their write
/// timestamps (epoch, then cursor), whatever the order of the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_cursors_in_cql_do_not_depend_on_write_order() {
    let _services = crate::kit::services::shared_services().await;
    let keyspace = crate::kit::keyspace_name(&crate::kit::services::unique("it_cql_thread_order"));
    let cql = CqlStore::connect_writer(&cql_config(&keyspace)).await.unwrap();
    let user: readfold_core::UserId = "u".parse().unwrap();
    for (i, order) in WRITE_ORDERS.iter().enumerate() {
        let conversation = format!("G{i}");
        let history = follower_history(&conversation);
        for &at in order {
            cql.merge_threads([&history[at]]).await.unwrap();
        }
        let view = cql
            .thread(&conversation.parse().unwrap(), Seq(7))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(view.latest_seq, Seq(6), "order {order:?}");
        let u = &view.members[&user];
        assert_eq!(
            (u.cursor, u.join_seq),
            (Seq(6), Seq(4)),
            "the rejoin's epoch, order {order:?}"
        );
    }
    let followed = cql.followed_threads(&user).await.unwrap();
    assert_eq!(followed.len(), WRITE_ORDERS.len());
    assert!(
        followed
            .iter()
            .all(|t| (t.cursor, t.private_cursor, t.latest_seq, t.unread()) == (Seq(6), Seq(4), Seq(6), 0)),
        "{followed:?}"
    );
    // A departure of a later epoch hides them again, and an older write
    // does not bring them back.
    cql.merge_threads([&follower_change("G0", 6, 4, 4, 4, false)])
        .await
        .unwrap();
    cql.merge_threads([&follower_history("G0")[3]]).await.unwrap();
    let view = cql.thread(&"G0".parse().unwrap(), Seq(7)).await.unwrap().unwrap();
    assert!(view.members.is_empty(), "departed");
    let followed = cql.followed_threads(&user).await.unwrap();
    assert!(
        followed.iter().all(|t| t.conversation_id.as_str() != "G0"),
        "departed on their own devices too"
    );
}

/// A follower's Redis values are ordered by the member's epoch: a stale
/// write never lowers a cursor nor brings back a departed follower, and
/// every order of the same writes ends the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_cursors_in_redis_do_not_depend_on_write_order() {
    let _services = crate::kit::services::shared_services().await;
    let change =
        |cursor, private, join, epoch, present| follower_change("G", cursor, private, join, epoch, present);
    let history = follower_history("G");
    let mut ends = Vec::new();
    for order in WRITE_ORDERS {
        let prefix = crate::kit::services::unique("threads-order");
        let redis = redis_store(&redis_url(), &prefix).await;
        for i in order {
            redis.merge_threads([&history[i]]).await.unwrap();
        }
        let view = redis
            .read_thread(&"G".parse().unwrap(), Seq(7))
            .await
            .unwrap()
            .unwrap();
        let own = redis.read_user_threads(&"u".parse().unwrap()).await.unwrap();
        ends.push((view, own));
        redis.delete_all().await.unwrap();
    }
    let (view, own) = &ends[0];
    assert_eq!(view.latest_seq, Seq(6));
    let u = &view.members[&"u".parse::<readfold_core::UserId>().unwrap()];
    assert_eq!((u.cursor, u.join_seq), (Seq(6), Seq(4)), "the rejoin's epoch");
    assert_eq!(own[0].private_cursor, Some(Seq(4)));
    assert!(ends.iter().all(|end| end == &ends[0]), "{ends:?}");
    // A departure of a later epoch hides them again, and an older write
    // does not bring them back.
    let prefix = crate::kit::services::unique("threads-order");
    let redis = redis_store(&redis_url(), &prefix).await;
    redis
        .merge_threads([&history[4], &change(6, 4, 4, 4, false)])
        .await
        .unwrap();
    redis.merge_threads([&history[3]]).await.unwrap();
    let view = redis
        .read_thread(&"G".parse().unwrap(), Seq(7))
        .await
        .unwrap()
        .unwrap();
    assert!(view.members.is_empty(), "departed");
    let own = redis.read_user_threads(&"u".parse().unwrap()).await.unwrap();
    assert_eq!(own[0].private_cursor, None, "departed on their own devices too");
    redis.delete_all().await.unwrap();
}
