//! Hot cursors in Redis: max-merged, whoever writes and in whatever order.

use std::collections::{BTreeMap, HashMap};
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
    let members = redis_members(&redis_url(), &prefix, "C").await;
    assert_eq!(
        (members["u"], members["v"]),
        ((300, 300), (300, 300)),
        "delivered"
    );
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

/// A member's (cursor, delivered cursor), through the read half.
async fn member(prefix: &str, conv: &str, user: &str) -> Option<(i64, i64)> {
    redis_members(&redis_url(), prefix, conv).await.get(user).copied()
}

/// A member's field of the `delivered` hash, raw.
async fn delivered_field(prefix: &str, conv: &str, user: &str) -> Option<String> {
    let [_, _, _, _, delivered] = keys(prefix, conv);
    redis::cmd("HGET")
        .arg(delivered)
        .arg(user)
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap()
}

/// Every field of conversation `conv`'s five keys, raw: cursors, joined,
/// epoch, delivered, then latest.
async fn stored(prefix: &str, conv: &str) -> Vec<HashMap<String, String>> {
    let mut conn = redis_conn(&redis_url()).await;
    let [cursors, latest, joined, epoch, delivered] = keys(prefix, conv);
    let mut all = Vec::new();
    for key in [cursors, joined, epoch, delivered] {
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
/// repeated users, departures, rejoins and stale epochs in one batch,
/// delivered cursors ahead of the cursor, at it and stale, and batches
/// larger than the script's chunk of fields per command (delivered ones
/// included). The read halves answer what the rules leave.
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
                .map(|k| {
                    let (cursor, left) = (next(20), next(6) == 0);
                    // Some batches carry no delivered cursor ahead, before
                    // or after ones that do; in the big ones, two members
                    // in three have one, past the script's chunk.
                    let ahead = match () {
                        _ if left => None,
                        _ if big => (k % 3 != 0).then(|| 1 + next(10)),
                        _ if (round + batch_no) % 5 == 2 => None,
                        _ => (next(3) == 0).then(|| 1 + next(10)),
                    };
                    MemberWrite {
                        user_id: format!("u{}", if big { k } else { next(8) }).parse().unwrap(),
                        cursor: Seq(cursor),
                        delivered: Seq(if left { 0 } else { cursor + ahead.unwrap_or(0) }),
                        // Some batches carry no join_seq above 1 or no epoch,
                        // before or after ones that do: the script skips
                        // reading a hash it does not need or that is absent.
                        join_seq: Seq(if (round + batch_no) % 3 == 0 {
                            1
                        } else {
                            1 + next(6)
                        }),
                        left,
                        epoch: if (round + batch_no) % 4 == 1 { 0 } else { next(4) },
                    }
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
            "round {round}: cursors, joined, epochs, delivered and latest"
        );
        assert_eq!(merged, model.stored(), "round {round}: against the model");
        model.assert_read(&sink, &batched).await;
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
/// members, small ones with repeated users, departures, stale epochs and
/// delivered cursors ahead (their pairs shift the next conversation's
/// arguments), and groups large enough to split calls by their arguments;
/// and as it ends with one conversation per call.
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
                    .map(|k| {
                        let (cursor, left) = (next(40), next(8) == 0);
                        // Delivered ahead in one conversation in three.
                        let ahead = if c % 3 == 1 && !left {
                            next(2) * next(15)
                        } else {
                            0
                        };
                        MemberWrite {
                            user_id: format!("u{}", if size > 100 { k } else { next(6) })
                                .parse()
                                .unwrap(),
                            cursor: Seq(cursor),
                            delivered: Seq(if left { 0 } else { cursor + ahead }),
                            join_seq: Seq(1 + next(3) * next(4)),
                            left,
                            epoch: next(3),
                        }
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
        model.assert_read(&shared_sink, &conv).await;
    }
    shared_sink.delete_all().await.unwrap();
    alone_sink.delete_all().await.unwrap();
}

/// The script's short path: conversations whose members all joined at
/// seq 1 with epoch 0, and no epoch hash anywhere in the call, touch only
/// their cursors hash (and their delivered hash, for members delivered
/// ahead). It must leave what the merge rules leave, next to conversations
/// it hands to the full merge in the same call (a repeated user, a
/// departure, a join_seq above 1) and, once one conversation has an epoch
/// hash, in calls that take the full merge throughout; a delivered field
/// left by an earlier round stays as it was. Conversations of one and two
/// members, which have short paths of their own, come in each of those
/// kinds too, with one or two delivered cursors ahead or none.
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
                // In rounds 1 and 2, before its call has an epoch hash,
                // conversation 0 is a plain group past the script's chunk
                // of fields, most of it delivered ahead.
                let big = c == 0 && (1..=2).contains(&round);
                let size = if big { 1500 } else { c % 7 };
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
                        let cursor = match () {
                            _ if stale => 1000,
                            _ if twice => 10 * round + 10 - k,
                            _ => next(30),
                        };
                        // Delivered ahead: in some rounds, now and then;
                        // the stale writes' far ahead, which must not land
                        // either.
                        let ahead = match () {
                            _ if departing => None,
                            _ if stale => Some(1000),
                            _ if big => (k % 10 != 0).then(|| 1 + next(20)),
                            _ if (round + c) % 3 == 0 && next(3) == 0 => Some(1 + next(20)),
                            _ => None,
                        };
                        MemberWrite {
                            user_id: format!("u{user}").parse().unwrap(),
                            cursor: Seq(cursor),
                            delivered: Seq(if departing { 0 } else { cursor + ahead.unwrap_or(0) }),
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
        model.assert_read(&sink, &conv).await;
    }
    sink.delete_all().await.unwrap();
}

/// A call whose arguments do not match its keys is a bug in the caller:
/// the script refuses it whole, before it writes anything. One that does
/// lands as its layout says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_mismatched_arguments_changes_nothing() {
    let _services = shared_services().await;
    let prefix = unique("mismatch");
    let sink = redis_store(&redis_url(), &prefix).await;
    let mut conn = redis_conn(&redis_url()).await;
    let sha = redis::Script::new(readfold_store::redis::MERGE_SCRIPT)
        .get_hash()
        .to_owned();
    let [a_keys, b_keys] = [keys(&prefix, "A"), keys(&prefix, "B")];
    let calls: [Vec<String>; 14] = [
        // A's arguments are right, B's member count claims two members.
        vec![
            "1", "5", "u", "3", "1", "0", "0", "2", "5", "v", "3", "1", "0", "0",
        ],
        // One argument left over after B.
        vec!["0", "5", "0", "0", "6", "0", "extra"],
        // B's member count is not a number, or not a whole one: 1.5 would
        // line up with the arguments there are, 0.5 would read no fields.
        vec!["0", "5", "0", "x", "6", "0"],
        vec!["0", "5", "0", "1.5", "6", "u", "3", "1", "0", "v", "3", "0"],
        vec!["0", "5", "0", "0.5", "6", "u", "3", "0"],
        // B has no count of delivered pairs.
        vec!["0", "5", "0", "0", "6"],
        // A's count of delivered pairs is not a whole number, or claims
        // more pairs than follow it.
        vec!["1", "5", "u", "3", "1", "0", "x", "0", "6", "0"],
        vec!["1", "5", "u", "3", "1", "0", "0.5", "1", "9", "0", "6", "0"],
        vec!["1", "5", "u", "3", "1", "0", "2", "1", "9", "0", "6", "0"],
        // A pair's position names no member of A: past its members, 0, or
        // no number.
        vec!["1", "5", "u", "3", "1", "0", "1", "2", "9", "0", "6", "0"],
        vec!["1", "5", "u", "3", "1", "0", "1", "0", "9", "0", "6", "0"],
        vec!["1", "5", "u", "3", "1", "0", "1", "u", "9", "0", "6", "0"],
        // Positions out of order, or one twice.
        vec![
            "2", "5", "u", "3", "1", "0", "v", "3", "1", "0", "2", "2", "9", "1", "9", "0", "6", "0",
        ],
        vec![
            "2", "5", "u", "3", "1", "0", "v", "3", "1", "0", "2", "1", "9", "1", "9", "0", "6", "0",
        ],
    ]
    .map(|args| args.into_iter().map(str::to_owned).collect());
    for args in calls {
        let answer: redis::RedisResult<i64> = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(10)
            .arg(&a_keys)
            .arg(&b_keys)
            .arg(&args)
            .query_async(&mut conn)
            .await;
        let error = answer.expect_err("refused").to_string();
        assert!(error.contains("readfold merge"), "{args:?}: {error}");
    }
    for conv in ["A", "B"] {
        assert!(
            stored(&prefix, conv).await.iter().all(HashMap::is_empty),
            "{conv} untouched"
        );
    }
    // Seven keys for two conversations.
    let answer: redis::RedisResult<i64> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(7)
        .arg(&a_keys)
        .arg(&b_keys[..2])
        .arg(&["0", "5", "0"])
        .query_async(&mut conn)
        .await;
    assert!(answer
        .expect_err("refused")
        .to_string()
        .contains("5 per conversation"));
    // The layout itself: A's second member delivered to 9, B's none.
    let answer: i64 = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(10)
        .arg(&a_keys)
        .arg(&b_keys)
        .arg(&[
            "2", "5", "u", "3", "1", "0", "v", "3", "1", "0", "1", "2", "9", "1", "6", "w", "4", "1", "0",
            "0",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(answer, 4, "three cursors and one delivered cursor raised");
    let members = redis_members(&redis_url(), &prefix, "A").await;
    assert_eq!((members["u"], members["v"]), ((3, 3), (3, 9)));
    assert_eq!(redis_members(&redis_url(), &prefix, "B").await["w"], (4, 4));
    sink.delete_all().await.unwrap();
}

/// The merge rules of `merge.lua`, member by member, in plain Rust: what
/// the script must leave, independently of how it goes about it.
#[derive(Default)]
struct MergeModel {
    cursors: HashMap<String, u64>,
    joined: HashMap<String, u64>,
    epochs: HashMap<String, u64>,
    /// Only ever raised; a write carries one only above its cursor.
    delivered: HashMap<String, u64>,
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
                self.delivered.remove(&user);
                continue;
            }
            if self.cursors.get(&user).is_none_or(|&c| m.cursor.get() > c) {
                self.cursors.insert(user.clone(), m.cursor.get());
                raised += 1;
            }
            let join = m.join_seq.get();
            if join > 1 && self.joined.get(&user).is_none_or(|&j| join > j) {
                self.joined.insert(user.clone(), join);
            }
            let delivered = m.delivered.get();
            if delivered > m.cursor.get() && self.delivered.get(&user).is_none_or(|&d| delivered > d) {
                self.delivered.insert(user, delivered);
                raised += 1;
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
            strings(&self.delivered),
            latest.into_iter().collect(),
        ]
    }

    /// What readers see: user -> (cursor, delivered, join_seq), delivered
    /// never below the cursor.
    fn view(&self) -> BTreeMap<String, (u64, u64, u64)> {
        self.cursors
            .iter()
            .map(|(user, &cursor)| {
                let delivered = self.delivered.get(user).copied().unwrap_or(0).max(cursor);
                let joined = self.joined.get(user).copied().unwrap_or(1);
                (user.clone(), (cursor, delivered, joined))
            })
            .collect()
    }

    /// The read halves answer [`MergeModel::view`]: the whole conversation,
    /// and each member's own view (with one user who is no member).
    async fn assert_read(&self, store: &RedisStore, conv: &str) {
        let want = self.view();
        let view = store.conversation(conv).await.unwrap();
        let got: BTreeMap<String, (u64, u64, u64)> = view
            .iter()
            .flat_map(|v| &v.members)
            .map(|(u, m)| {
                (
                    u.to_string(),
                    (m.cursor.get(), m.delivered.get(), m.join_seq.get()),
                )
            })
            .collect();
        assert_eq!(got, want, "{conv}: the conversation as read");
        // A few members (a big group's every one would take long), and
        // one user who is none.
        for user in want.keys().take(20).map(String::as_str).chain(["nobody"]) {
            let views = store.member_views(user, &[conv]).await.unwrap();
            let member = views.conversations[0].and_then(|v| v.member);
            let got = member.map(|m| (m.cursor.get(), m.delivered.get(), m.join_seq.get()));
            assert_eq!(got, want.get(user).copied(), "{conv}: {user}'s own view");
        }
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
    // #2 reached B's devices, B read only #1.
    feed.report(delivery("G", "B", 2)).await;

    // Someone raised C by hand beyond anything the processor will write.
    let [cursors, latest, joined_key, ..] = keys(&prefix, "G");
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
    assert_eq!(
        member(&prefix, "G", "B").await,
        Some((1, 2)),
        "B: delivered ahead"
    );
    assert_eq!(
        member(&prefix, "G", "C").await,
        Some((99, 99)),
        "reading implies delivery"
    );
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
    // u's write at `cursor`, delivered up to `delivered`.
    let write = |cursor: u64, delivered: u64, epoch: u64, left: bool| {
        let mut batch = sink_batch("M", cursor, &[("u", if left { 0 } else { cursor })]);
        batch.members[0].delivered = Seq(if left { 0 } else { delivered });
        batch.members[0].left = left;
        batch.members[0].epoch = epoch;
        batch
    };
    sink.write(&[write(5, 8, 1, false)]).await.unwrap();
    assert_eq!(member(&prefix, "M", "u").await, Some((5, 8)));
    sink.write(&[write(0, 0, 2, true)]).await.unwrap();
    assert!(!hash(&prefix, "M").await.contains_key("u"), "departed");
    assert_eq!(
        delivered_field(&prefix, "M", "u").await,
        None,
        "the delivered field went with them"
    );
    sink.write(&[write(9, 12, 1, false)]).await.unwrap();
    assert!(
        !hash(&prefix, "M").await.contains_key("u"),
        "a stale write does not bring them back"
    );
    assert_eq!(
        delivered_field(&prefix, "M", "u").await,
        None,
        "nor their delivered cursor"
    );
    // Rejoined at the very cursor they left with, delivered as far as
    // before (the fold keeps it across the leave).
    sink.write(&[write(5, 8, 3, false)]).await.unwrap();
    assert_eq!(
        member(&prefix, "M", "u").await,
        Some((5, 8)),
        "rejoined at the same cursor"
    );
    sink.write(&[write(0, 0, 2, true)]).await.unwrap();
    sink.write(&[write(4, 6, 3, false)]).await.unwrap();
    assert_eq!(
        member(&prefix, "M", "u").await,
        Some((5, 8)),
        "a replayed departure changes nothing"
    );
    // Reading past the delivered cursor delivers as far; a later delivery
    // goes beyond.
    sink.write(&[write(10, 10, 3, false)]).await.unwrap();
    assert_eq!(member(&prefix, "M", "u").await, Some((10, 10)));
    sink.write(&[write(10, 14, 3, false)]).await.unwrap();
    sink.write(&[write(10, 11, 3, false)]).await.unwrap();
    assert_eq!(
        member(&prefix, "M", "u").await,
        Some((10, 14)),
        "a stale delivery changes nothing"
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
    let got = sink.private_state("u", &PRIVATE_RACE).await.unwrap();
    assert_eq!(got, expected_private_state());
    // The badge-list read gives the same, with no conversation of its own.
    let views = sink.member_views("u", &PRIVATE_RACE).await.unwrap();
    assert_eq!(views.private, Some(expected_private_state()));
    // Mentions are stored as their join: the greatest read point, the
    // unread seqs above it.
    let mut conn = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mentions: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{prefix}:user:{{u}}:mentions"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(mentions["F"], "5:6,7,8");
    assert_eq!(
        mentions["G"], "9:",
        "the read point stays: no stale write brings 4 back"
    );
    let mutes: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{prefix}:user:{{u}}:mute"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(mutes["I"], format!("30:{}", readfold_core::Mute::FOREVER));
    sink.delete_all().await.unwrap();
}

/// Whatever order the private writes land in, the store ends the same: a
/// join, as the flushes of a racing writer or a retry may reorder them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_state_does_not_depend_on_write_order() {
    let _services = shared_services().await;
    let race = private_race();
    let n = race.len();
    for round in 0..4 {
        let prefix = unique("private_order");
        let sink = redis_store(&redis_url(), &prefix).await;
        let mut order: Vec<usize> = (0..n).collect();
        match round {
            0 => order.reverse(),
            // Deterministic shuffles: a stride coprime with the length.
            _ => {
                let stride = [3, 7, 11][round - 1];
                order = (0..n).map(|i| (i * stride + round) % n).collect();
            }
        }
        if round > 0 {
            let mut seen = order.clone();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), n, "a permutation");
        }
        for i in order {
            sink.write_private(std::slice::from_ref(&race[i])).await.unwrap();
        }
        let got = sink.private_state("u", &PRIVATE_RACE).await.unwrap();
        assert_eq!(got, expected_private_state(), "round {round}");
        sink.delete_all().await.unwrap();
    }
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
    // Every cursor, and every delivered cursor (two past it).
    assert_eq!(raised, 600_000);
    for c in [0u64, 299, 599] {
        let members = redis_members(&redis_url(), &prefix, &format!("C{c}")).await;
        assert_eq!(members.len(), 500);
        let want = (7 + c as i64, 9 + c as i64);
        assert!(members.values().all(|&m| m == want), "C{c}: {members:?}");
    }
    // 300k fields: left behind, they would slow every later AOF rewrite.
    store.delete_all().await.unwrap();
}
