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
use crate::kit::services::{now_ms, Rng};

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
