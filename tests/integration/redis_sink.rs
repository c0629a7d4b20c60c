//! Hot cursors in Redis: max-merged, whoever writes and in whatever order.

use std::collections::HashMap;
use std::time::Duration;

use readfold_core::flush::{ConversationBatch, MemberWrite};
use readfold_core::Seq;
use readfold_store::redis::{keys, RedisConfig, RedisStore};
use readfold_store::CursorStore;

use crate::kit::*;

async fn hash(prefix: &str, conv: &str) -> HashMap<String, i64> {
    redis_cursors(&redis_url(), prefix, conv).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_lower_a_cursor() {
    let _services = shared_services().await;
    let prefix = unique("race");
    let a = redis_store(&redis_url(), &prefix).await;
    let b = redis_store(&redis_url(), &prefix).await;
    // One writer climbs, the other descends, concurrently: the result is the max.
    race_writers(&a, &b).await;
    let h = hash(&prefix, "C").await;
    assert_eq!(h["u"], 300);
    assert_eq!(h["v"], 300);
    let [_, latest, ..] = keys(&prefix, "C");
    let latest: i64 = redis::cmd("GET")
        .arg(latest)
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();
    assert_eq!(latest, 300);
    // A lower value written later changes nothing.
    assert_eq!(a.write(&[sink_batch("C", 2, &[("u", 2)])]).await.unwrap(), 0);
    assert_eq!(hash(&prefix, "C").await["u"], 300);
    a.delete_all().await.unwrap();
}

/// Every field of conversation `conv`'s four keys, raw.
async fn stored(prefix: &str, conv: &str) -> Vec<HashMap<String, String>> {
    let mut conn = redis_conn(&redis_url()).await;
    let [cursors, latest, joined, epoch] = keys(prefix, conv);
    let mut all = Vec::new();
    for key in [cursors, joined, epoch] {
        all.push(
            redis::cmd("HGETALL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap(),
        );
    }
    let latest: Option<String> = redis::cmd("GET")
        .arg(latest)
        .query_async(&mut conn)
        .await
        .unwrap();
    all.push(latest.into_iter().map(|l| ("latest".to_owned(), l)).collect());
    all
}

/// The script reads a batch's stored fields once and writes them back once:
/// that must leave what merging its members one call at a time leaves, and
/// what the merge rules ([`MergeModel`]) leave, with
/// repeated users, departures, rejoins and stale epochs in one batch, and
/// batches larger than the script's chunk of fields per command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_merges_as_its_members_one_at_a_time() {
    let _services = shared_services().await;
    let prefix = unique("batched");
    let sink = redis_store(&redis_url(), &prefix).await;
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    for round in 0..60u64 {
        let (batched, single) = (format!("B{round}"), format!("S{round}"));
        let mut model = MergeModel::default();
        // The last rounds: 2,600 distinct users, past the script's chunks;
        // the others: up to 30 members drawn from 8 users, so repeated.
        let big = round >= 58;
        let size = if big { 2600 } else { 1 + next(30) };
        for batch_no in 0..4u64 {
            let latest = Seq(next(25));
            let members: Vec<MemberWrite> = (0..size)
                .map(|k| MemberWrite {
                    user_id: format!("u{}", if big { k } else { next(8) }).parse().unwrap(),
                    cursor: Seq(next(20)),
                    delivered: Seq::ZERO,
                    // Some batches carry no join_seq above 1 or no epoch,
                    // before or after ones that do: the script skips
                    // reading a hash it does not need or that is absent.
                    join_seq: Seq(if (round + batch_no) % 3 == 0 {
                        1
                    } else {
                        1 + next(6)
                    }),
                    left: next(6) == 0,
                    epoch: if (round + batch_no) % 4 == 1 { 0 } else { next(4) },
                })
                .collect();
            let batch = |conv: &str, members: Vec<MemberWrite>| ConversationBatch {
                conversation_id: conv.parse().unwrap(),
                latest_seq: latest,
                members,
            };
            let raised_batched = sink.write(&[batch(&batched, members.clone())]).await.unwrap();
            let raised_model = model.merge(latest.get(), &members);
            assert_eq!(
                raised_batched, raised_model,
                "round {round}: fields raised, against the model"
            );
            let mut raised_single = 0;
            if big {
                // One call per member would take long: groups of 100 stand
                // in, each against the state the one before left.
                for part in members.chunks(100) {
                    raised_single += sink.write(&[batch(&single, part.to_vec())]).await.unwrap();
                }
            } else {
                for m in members {
                    raised_single += sink.write(&[batch(&single, vec![m])]).await.unwrap();
                }
            }
            assert_eq!(raised_batched, raised_single, "round {round}: fields raised");
        }
        let merged = stored(&prefix, &batched).await;
        assert_eq!(
            merged,
            stored(&prefix, &single).await,
            "round {round}: cursors, joined, epochs and latest"
        );
        assert_eq!(merged, model.stored(), "round {round}: against the model");
    }
    sink.delete_all().await.unwrap();
}

/// A small seeded generator: `next(n)` draws from 0..n.
fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    }
}

/// One script call merges many conversations (`redis.conversations_per_call`):
/// each must end as the merge rules leave it alone, with conversations of no
/// members, small ones with repeated users, departures and stale epochs, and
/// groups large enough to split calls by their arguments; and as it ends
/// with one conversation per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_sharing_a_call_merge_as_if_alone() {
    let _services = shared_services().await;
    let (shared, alone) = (unique("shared"), unique("alone"));
    let shared_sink = redis_store(&redis_url(), &shared).await;
    let config = RedisConfig {
        conversations_per_call: 1,
        ..redis_config(&redis_url(), &alone)
    };
    let alone_sink = RedisStore::connect_writer(&config)
        .await
        .expect("connect to Redis");
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let conversations = 300u64;
    let mut models: Vec<MergeModel> = (0..conversations).map(|_| MergeModel::default()).collect();
    for round in 0..4 {
        let batches: Vec<ConversationBatch> = (0..conversations)
            .map(|c| {
                let size = match c % 50 {
                    0 => 0,
                    7 => 1500,
                    _ => 1 + next(12),
                };
                let members = (0..size)
                    .map(|k| MemberWrite {
                        user_id: format!("u{}", if size > 100 { k } else { next(6) })
                            .parse()
                            .unwrap(),
                        cursor: Seq(next(40)),
                        delivered: Seq::ZERO,
                        join_seq: Seq(1 + next(3) * next(4)),
                        left: next(8) == 0,
                        epoch: next(3),
                    })
                    .collect();
                ConversationBatch {
                    conversation_id: format!("C{c}").parse().unwrap(),
                    latest_seq: Seq(next(50)),
                    members,
                }
            })
            .collect();
        let expected = MergeModel::merge_each(&mut models, &batches);
        let raised = shared_sink.write(&batches).await.unwrap();
        assert_eq!(raised, expected, "round {round}: cursors raised, shared calls");
        let raised = alone_sink.write(&batches).await.unwrap();
        assert_eq!(
            raised, expected,
            "round {round}: cursors raised, one conversation per call"
        );
    }
    for (c, model) in models.iter().enumerate() {
        let conv = format!("C{c}");
        let merged = stored(&shared, &conv).await;
        assert_eq!(merged, model.stored(), "{conv}: shared calls, against the model");
        assert_eq!(
            merged,
            stored(&alone, &conv).await,
            "{conv}: shared calls, against alone"
        );
    }
    shared_sink.delete_all().await.unwrap();
    alone_sink.delete_all().await.unwrap();
}

/// The script's short path: conversations whose members all joined at
/// seq 1 with epoch 0, and no epoch hash anywhere in the call, touch only
/// their cursors hash. It must leave what the merge rules leave, next to
/// conversations it hands to the full merge in the same call (a repeated
/// user, a departure, a join_seq above 1) and, once one conversation has an
/// epoch hash, in calls that take the full merge throughout. Conversations
/// of one and two members, which have short paths of their own, come in
/// each of those kinds too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_conversations_merge_as_the_model_says() {
    let _services = shared_services().await;
    let prefix = unique("plain");
    let sink = redis_store(&redis_url(), &prefix).await;
    let mut next = xorshift(0x5851_f42d_4c95_7f2d);
    let conversations = 200u64;
    let mut models: Vec<MergeModel> = (0..conversations).map(|_| MergeModel::default()).collect();
    for round in 0..6u64 {
        let batches: Vec<ConversationBatch> = (0..conversations)
            .map(|c| {
                let size = c % 7;
                let members = (0..size)
                    .map(|k| {
                        // Conversation 5 in round 3: a member with epoch 1,
                        // so its call has an epoch hash from then on, and
                        // the later rounds' epoch 0 for them is stale (with
                        // a cursor above any other, which must not land).
                        // The same for conversations 141, of one member,
                        // and 198, of two, each in a call of its own (64
                        // conversations a call).
                        let versioned = matches!(c, 5 | 141 | 198) && k == 0 && round == 3;
                        let stale = matches!(c, 5 | 141 | 198) && k == 0 && round > 3;
                        // Repeated users: every other member, or (in
                        // conversations 9 and 163, of two) all of them,
                        // each write above the stored cursor and below the
                        // one before it in the batch.
                        let twice = matches!(c, 9 | 163);
                        let user = match c {
                            _ if twice => 0,
                            _ if c % 11 == 3 => k % 2,
                            _ => k,
                        };
                        // Departures: now and then the second member, and
                        // in round 1 the one member of conversations 8
                        // and 113 (before 8's call has an epoch hash).
                        let departing =
                            (c % 13 == 2 && k == 1 && next(3) == 0) || (c % 105 == 8 && k == 0 && round == 1);
                        MemberWrite {
                            user_id: format!("u{user}").parse().unwrap(),
                            cursor: Seq(match () {
                                _ if stale => 1000,
                                _ if twice => 10 * round + 10 - k,
                                _ => next(30),
                            }),
                            delivered: Seq::ZERO,
                            join_seq: Seq(if c % 17 == 4 { 1 + next(3) } else { 1 }),
                            left: departing,
                            epoch: u64::from(versioned),
                        }
                    })
                    .collect();
                ConversationBatch {
                    conversation_id: format!("P{c}").parse().unwrap(),
                    latest_seq: Seq(next(40)),
                    members,
                }
            })
            .collect();
        let expected = MergeModel::merge_each(&mut models, &batches);
        let raised = sink.write(&batches).await.unwrap();
        assert_eq!(raised, expected, "round {round}: cursors raised");
    }
    for (c, model) in models.iter().enumerate() {
        let conv = format!("P{c}");
        assert_eq!(
            stored(&prefix, &conv).await,
            model.stored(),
            "{conv}: against the model"
        );
    }
    sink.delete_all().await.unwrap();
}

/// A call whose arguments do not match its keys is a bug in the caller:
/// the script refuses it whole, before it writes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_mismatched_arguments_changes_nothing() {
    let _services = shared_services().await;
    let prefix = unique("mismatch");
    let _sink = redis_store(&redis_url(), &prefix).await;
    let mut conn = redis_conn(&redis_url()).await;
    let sha = redis::Script::new(readfold_store::redis::MERGE_SCRIPT)
        .get_hash()
        .to_owned();
    let [a_keys, b_keys] = [keys(&prefix, "A"), keys(&prefix, "B")];
    let calls: [Vec<String>; 5] = [
        // A's arguments are right, B's member count claims two members.
        vec!["1", "5", "u", "3", "1", "0", "2", "5", "v", "3", "1", "0"],
        // One argument left over after B.
        vec!["0", "5", "0", "6", "extra"],
        // B's member count is not a number, or not a whole one: 1.5 would
        // line up with the arguments there are, 0.5 would read no fields.
        vec!["0", "5", "x", "6"],
        vec!["0", "5", "1.5", "6", "u", "3", "1", "0", "v", "3"],
        vec!["0", "5", "0.5", "6", "u", "3"],
    ]
    .map(|args| args.into_iter().map(str::to_owned).collect());
    for args in calls {
        let answer: redis::RedisResult<i64> = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(8)
            .arg(&a_keys)
            .arg(&b_keys)
            .arg(&args)
            .query_async(&mut conn)
            .await;
        let error = answer.expect_err("refused").to_string();
        assert!(error.contains("readfold merge"), "{error}");
    }
    for conv in ["A", "B"] {
        assert!(
            stored(&prefix, conv).await.iter().all(HashMap::is_empty),
            "{conv} untouched"
        );
    }
    // Five keys for two conversations.
    let answer: redis::RedisResult<i64> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(5)
        .arg(&a_keys)
        .arg(&b_keys[0])
        .arg(&["0", "5", "0"])
        .query_async(&mut conn)
        .await;
    assert!(answer
        .expect_err("refused")
        .to_string()
        .contains("4 per conversation"));
}

/// The merge rules of `merge.lua`, member by member, in plain Rust: what
/// the script must leave, independently of how it goes about it.
#[derive(Default)]
struct MergeModel {
    cursors: HashMap<String, u64>,
    joined: HashMap<String, u64>,
    epochs: HashMap<String, u64>,
    latest: u64,
}

impl MergeModel {
    /// Merges one batch; the fields raised.
    fn merge(&mut self, latest: u64, members: &[MemberWrite]) -> u64 {
        self.latest = self.latest.max(latest);
        let mut raised = 0;
        for m in members {
            let user = m.user_id.as_str().to_owned();
            let stored = self.epochs.get(&user).copied().unwrap_or(0);
            if m.epoch < stored {
                continue; // stale membership
            }
            if m.epoch > stored {
                self.epochs.insert(user.clone(), m.epoch);
            }
            if m.left {
                self.cursors.remove(&user);
                self.joined.remove(&user);
                continue;
            }
            if self.cursors.get(&user).is_none_or(|&c| m.cursor.get() > c) {
                self.cursors.insert(user.clone(), m.cursor.get());
                raised += 1;
            }
            let join = m.join_seq.get();
            if join > 1 && self.joined.get(&user).is_none_or(|&j| join > j) {
                self.joined.insert(user, join);
            }
        }
        raised
    }

    /// Merges each batch into its conversation's model; the fields raised
    /// in all.
    fn merge_each(models: &mut [MergeModel], batches: &[ConversationBatch]) -> u64 {
        batches
            .iter()
            .zip(models)
            .map(|(b, model)| model.merge(b.latest_seq.get(), &b.members))
            .sum()
    }

    /// As `stored` reads it back.
    fn stored(&self) -> Vec<HashMap<String, String>> {
        let strings =
            |map: &HashMap<String, u64>| map.iter().map(|(k, v)| (k.clone(), v.to_string())).collect();
        let latest = (self.latest > 0).then(|| ("latest".to_owned(), self.latest.to_string()));
        vec![
            strings(&self.cursors),
            strings(&self.joined),
            strings(&self.epochs),
            latest.into_iter().collect(),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_a_flushed_script_cache() {
    let _services = shared_services().await;
    let prefix = unique("noscript");
    let sink = redis_store(&redis_url(), &prefix).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();
    assert_eq!(sink.write(&[sink_batch("C", 5, &[("u", 5)])]).await.unwrap(), 1);
    assert_eq!(hash(&prefix, "C").await["u"], 5);
    sink.delete_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_writes_redis_and_keeps_higher_hand_edits() {
    let env = TestEnv::new("redis", 2).await;
    let prefix = env.config.redis.key_prefix.clone();
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for m in ["A", "B", "C"] {
        feed.event(joined("G", m, 0)).await;
    }
    feed.event(sent("G", "A", 1)).await;
    feed.report(report("G", "B", 1)).await;
    feed.event(sent("G", "A", 2)).await;
    feed.report(report("G", "C", 2)).await;
    feed.event(joined("G", "D", 2)).await;

    // Someone raised C by hand beyond anything the processor will write.
    let [cursors, latest, joined_key, _] = keys(&prefix, "G");
    let _: () = redis::cmd("HSET")
        .arg(&cursors)
        .arg("C")
        .arg(99)
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();

    let mut processor = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let h = hash(&prefix, "G").await;
    assert_eq!(h["A"], 2);
    assert_eq!(h["B"], 1);
    assert_eq!(h["C"], 99, "a higher value set by hand is kept");
    assert_eq!(h["D"], 2);
    let latest: i64 = redis::cmd("GET")
        .arg(latest)
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();
    assert_eq!(latest, 2);
    let joined: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(joined_key)
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();
    assert_eq!(joined.get("D"), Some(&3), "D joined after #2");
    assert!(processor.terminate(Duration::from_secs(30)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departures_and_rejoins_are_ordered_by_the_membership_epoch() {
    let _services = shared_services().await;
    let prefix = unique("epoch");
    let sink = redis_store(&redis_url(), &prefix).await;
    let write = |cursor: u64, epoch: u64, left: bool| {
        let mut batch = sink_batch("M", cursor, &[("u", if left { 0 } else { cursor })]);
        batch.members[0].left = left;
        batch.members[0].epoch = epoch;
        batch
    };
    sink.write(&[write(5, 1, false)]).await.unwrap();
    sink.write(&[write(0, 2, true)]).await.unwrap();
    assert!(!hash(&prefix, "M").await.contains_key("u"), "departed");
    sink.write(&[write(9, 1, false)]).await.unwrap();
    assert!(
        !hash(&prefix, "M").await.contains_key("u"),
        "a stale write does not bring them back"
    );
    sink.write(&[write(5, 3, false)]).await.unwrap();
    assert_eq!(
        hash(&prefix, "M").await.get("u"),
        Some(&5),
        "rejoined at the same cursor"
    );
    sink.write(&[write(0, 2, true)]).await.unwrap();
    sink.write(&[write(4, 3, false)]).await.unwrap();
    assert_eq!(
        hash(&prefix, "M").await.get("u"),
        Some(&5),
        "a replayed departure changes nothing"
    );
    sink.delete_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_state_is_max_merged_per_user() {
    let _services = shared_services().await;
    let prefix = unique("private");
    let sink = redis_store(&redis_url(), &prefix).await;
    for batch in private_race() {
        sink.write_private(&[batch]).await.unwrap();
    }
    let got = sink.private_state("u", &["C", "D", "E"]).await.unwrap();
    assert_eq!(got, expected_private_state());
    sink.delete_all().await.unwrap();
}

/// A flush goes to Redis as several requests, each well within
/// `redis.timeout_ms`: one that takes Redis several times that in all still
/// lands whole (as one request it timed out, and so did every retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_longer_than_the_timeout_lands_in_bounded_requests() {
    let _services = shared_services().await;
    let prefix = unique("large");
    let config = RedisConfig {
        timeout_ms: 250,
        ..redis_config(&redis_url(), &prefix)
    };
    let store = RedisStore::connect_writer(&config)
        .await
        .expect("connect to Redis");
    // 300k member merges: several timeouts' worth of Redis's time.
    let users: Vec<String> = (0..500).map(|u| format!("u{u}")).collect();
    let batches: Vec<ConversationBatch> = (0..600)
        .map(|c| {
            let members: Vec<(&str, u64)> = users.iter().map(|u| (u.as_str(), 7 + c)).collect();
            sink_batch(&format!("C{c}"), 9 + c, &members)
        })
        .collect();
    let started = std::time::Instant::now();
    let raised = store.write(&batches).await.expect("a large flush lands");
    eprintln!("600 x 500 members in {:?}", started.elapsed());
    assert_eq!(raised, 300_000);
    for c in [0u64, 299, 599] {
        let h = hash(&prefix, &format!("C{c}")).await;
        assert_eq!(h.len(), 500);
        assert!(h.values().all(|&v| v == 7 + c as i64), "C{c}: {h:?}");
    }
    // 300k fields: left behind, they would slow every later AOF rewrite.
    store.delete_all().await.unwrap();
}
