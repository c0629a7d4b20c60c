//! Redis and CQL as the tests see them, through the store crate's own read
//! halves (raw commands only where a test edits a store by hand).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_core::flush::{ConversationBatch, MemberWrite, PrivateWrite, UserBatch};
use readfold_core::fold::UnreadMark;
use readfold_core::{Mute, Seq};
use readfold_store::cql::{CqlConfig, CqlStore};
use readfold_store::redis::{PrivateState, RedisConfig, RedisStore};
use readfold_store::CursorStore;

use super::changelog::Key;
use super::env::TestEnv;
use super::reference::Reference;
use super::services::{cql_contact_point, redis_url};

/// The default `[redis]` section with this URL and key prefix.
pub fn redis_config(url: &str, prefix: &str) -> RedisConfig {
    RedisConfig {
        url: url.to_owned(),
        key_prefix: prefix.to_owned(),
        ..Config::defaults().redis
    }
}

/// A connection to the Redis store, for reading and writing.
pub async fn redis_store(url: &str, prefix: &str) -> RedisStore {
    RedisStore::connect_writer(&redis_config(url, prefix))
        .await
        .expect("connect to Redis")
}

/// A raw connection, for editing Redis by hand.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// user -> cursor of one conversation, through the Redis read half.
pub async fn redis_cursors(url: &str, prefix: &str, conversation: &str) -> HashMap<String, i64> {
    redis_members(url, prefix, conversation)
        .await
        .into_iter()
        .map(|(u, (cursor, _))| (u, cursor))
        .collect()
}

/// user -> (cursor, delivered cursor) of one conversation, through the
/// Redis read half.
pub async fn redis_members(url: &str, prefix: &str, conversation: &str) -> HashMap<String, (i64, i64)> {
    let store = RedisStore::connect(&redis_config(url, prefix))
        .await
        .expect("connect to Redis");
    store
        .conversation(conversation)
        .await
        .expect("read Redis")
        .map(|view| {
            view.members
                .into_iter()
                .map(|(u, m)| {
                    (
                        u.to_string(),
                        (m.cursor.get() as i64, m.delivered_through().get() as i64),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every present member's cursor and delivered cursor of the reference is
/// in the test's Redis, and nothing else.
pub async fn assert_redis_matches(env: &TestEnv, reference: &Reference) {
    let delivered = expected_delivered(reference);
    for (conv, want) in reference.present_by_conversation() {
        let members = redis_members(&redis_url(), &env.config.redis.key_prefix, &conv).await;
        let got: BTreeMap<String, i64> = members.iter().map(|(u, &(c, _))| (u.clone(), c)).collect();
        if got != want {
            let why = redis_mismatch_detail(env, &conv, &got, &want).await;
            assert_eq!(got, want, "redis hash of {conv}\n{why}");
        }
        let got: BTreeMap<&String, i64> = members.iter().map(|(u, &(_, d))| (u, d)).collect();
        let want: BTreeMap<&String, i64> = delivered
            .iter()
            .filter(|((c, _), _)| *c == conv)
            .map(|((_, u), &d)| (u, d))
            .collect();
        assert_eq!(got, want, "redis delivered cursors of {conv}");
    }
}

/// The reference's delivered cursor of every present member, as a store
/// answers it: never below the cursor.
fn expected_delivered(reference: &Reference) -> BTreeMap<Key, i64> {
    let present = reference.present();
    reference
        .expected_delivered()
        .into_iter()
        .filter_map(|(k, d)| {
            let &(cursor, _) = present.get(&k)?;
            Some((k, d.max(cursor)))
        })
        .collect()
}

/// What a failing Redis comparison needs to be understood: the
/// conversation's raw join and epoch hashes, and for each user whose cursor
/// differs, the committed changelog history and member-state records.
async fn redis_mismatch_detail(
    env: &TestEnv,
    conv: &str,
    got: &BTreeMap<String, i64>,
    want: &BTreeMap<String, i64>,
) -> String {
    use readfold_kafka::changelog::ChangelogReader;
    use readfold_wire::changelog::{ChangelogEntry, ChangelogKind};
    use redis::AsyncCommands;
    let prefix = &env.config.redis.key_prefix;
    let [_, latest, joined, epoch, delivered] = readfold_store::redis::keys(prefix, conv);
    let mut conn = redis_conn(&redis_url()).await;
    let latest: Option<String> = conn.get(&latest).await.unwrap_or_default();
    let joined: BTreeMap<String, String> = conn.hgetall(&joined).await.unwrap_or_default();
    let epoch: BTreeMap<String, String> = conn.hgetall(&epoch).await.unwrap_or_default();
    let delivered: BTreeMap<String, String> = conn.hgetall(&delivered).await.unwrap_or_default();
    let mut out =
        format!("redis latest {latest:?}, joined {joined:?}, epoch {epoch:?}, delivered {delivered:?}\n");
    let users: std::collections::BTreeSet<&String> = got
        .keys()
        .chain(want.keys())
        .filter(|u| got.get(*u) != want.get(*u))
        .collect();
    let history = env.changelog().history;
    let states = ChangelogReader::new(
        &env.config.kafka,
        &format!("{}-test-detail", env.config.kafka.group_id),
        &env.config.topics.member_state,
        ChangelogKind::MemberState,
        env.config.input.max_id_bytes,
    )
    .and_then(|reader| reader.entries(None))
    .unwrap_or_default();
    for user in users {
        let key = (conv.to_owned(), user.clone());
        out += &format!("{user}: changelog {:?}\n", history.get(&key));
        for (_, entry) in &states {
            if let ChangelogEntry::State(s) = entry {
                if s.key.conversation_id.as_str() == conv && s.key.user_id.as_str() == user {
                    out += &format!("{user}: member state {s:?}\n");
                }
            }
        }
    }
    out
}

/// A user's private state in each conversation, through the Redis read half.
pub async fn redis_private_state(url: &str, prefix: &str, user: &str, convs: &[String]) -> Vec<PrivateState> {
    let store = RedisStore::connect(&redis_config(url, prefix))
        .await
        .expect("connect to Redis");
    let convs: Vec<&str> = convs.iter().map(String::as_str).collect();
    store.private_state(user, &convs).await.expect("read Redis")
}

/// A user's private state in each conversation, through the CQL read half;
/// defaults while the keyspace does not exist yet.
pub async fn cql_private_state(keyspace: &str, user: &str, convs: &[String]) -> Vec<PrivateState> {
    let store = CqlStore::connect(&cql_config(keyspace))
        .await
        .expect("connect to the CQL server");
    let convs: Vec<&str> = convs.iter().map(String::as_str).collect();
    store
        .private_state(user, &convs)
        .await
        .unwrap_or_else(|_| vec![PrivateState::default(); convs.len()])
}

/// The default `[cql]` section on the test CQL server, with this keyspace.
pub fn cql_config(keyspace: &str) -> CqlConfig {
    CqlConfig {
        contact_points: cql_contact_point(),
        keyspace: keyspace.to_owned(),
        timeout_ms: 10_000,
        ..Config::defaults().cql
    }
}

/// Every row of `<keyspace>.cursors`: (conversation, user) -> (cursor,
/// join_seq), through the CQL read half; empty while the keyspace does not
/// exist yet.
pub async fn cql_cursors(keyspace: &str) -> BTreeMap<Key, (i64, i64)> {
    let store = CqlStore::connect(&cql_config(keyspace))
        .await
        .expect("connect to the CQL server");
    let Ok(rows) = store.scan().await else {
        return BTreeMap::new(); // not created yet
    };
    rows.into_iter()
        .map(|(k, m)| {
            (
                (k.conversation_id.to_string(), k.user_id.to_string()),
                (m.cursor.get() as i64, m.join_seq.get() as i64),
            )
        })
        .collect()
}

/// Every row's delivered cursor of `<keyspace>.cursors` (never below its
/// cursor), through the CQL read half; empty while the keyspace does not
/// exist yet.
pub async fn cql_delivered(keyspace: &str) -> BTreeMap<Key, i64> {
    let store = CqlStore::connect(&cql_config(keyspace))
        .await
        .expect("connect to the CQL server");
    let Ok(rows) = store.scan().await else {
        return BTreeMap::new(); // not created yet
    };
    rows.into_iter()
        .map(|(k, m)| {
            (
                (k.conversation_id.to_string(), k.user_id.to_string()),
                m.delivered_through().get() as i64,
            )
        })
        .collect()
}

/// Polls CQL until its rows' delivered cursors are the reference's (every
/// present member's) or the timeout passes; returns (got, want). Snapshots
/// lag the changelog, and a delivery alone changes no cursor that
/// [`wait_for_cql`] would wait for.
pub async fn wait_for_cql_delivered(
    keyspace: &str,
    reference: &Reference,
    timeout: Duration,
) -> (BTreeMap<Key, i64>, BTreeMap<Key, i64>) {
    let want = expected_delivered(reference);
    let started = Instant::now();
    loop {
        let got = cql_delivered(keyspace).await;
        if got == want || started.elapsed() > timeout {
            return (got, want);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Polls CQL until it holds `want` or the timeout passes.
pub async fn wait_for_cql(
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

/// Two writers race on conversation C, concurrently: `a` climbs from 1 to
/// 300 while `b` descends from 300 to 1, both writing u = seq and
/// v = 301 - seq, each delivered up to seq (v's ahead of its cursor above
/// 150). A max-merging store ends with u = v = latest = 300, and both
/// delivered up to 300.
pub async fn race_writers<S: CursorStore>(a: &S, b: &S) {
    let up = async {
        for seq in 1..=300u64 {
            a.write(&[sink_batch("C", seq, &[("u", seq), ("v", 301 - seq)])])
                .await
                .unwrap();
        }
    };
    let down = async {
        for seq in (1..=300u64).rev() {
            b.write(&[sink_batch("C", seq, &[("u", seq), ("v", 301 - seq)])])
                .await
                .unwrap();
        }
    };
    tokio::join!(up, down);
}

/// The conversations [`private_race`] writes, in [`expected_private_state`]'s
/// order.
pub const PRIVATE_RACE: [&str; 7] = ["C", "D", "E", "F", "G", "H", "I"];

/// Private writes for user u, in an order that tests max-merging: C's
/// private cursor goes 7, then a stale 3; D is marked at 10, cleared at 20,
/// then a stale mark at 15 arrives; E is marked at 5 with seq 2, then at the
/// same time with seq 4. F's mentions: read up to 2 with 4 and 6, up to 5
/// with 6 and 8, a stale write of 2 again, and a racing one of 5 with 7. G
/// read its only mention (4) between two stale writes of it. H is muted at
/// 10, unmuted at 20, then a stale mute at 15 arrives; I is muted at 30
/// until 500, then at the same time until unmuted, then until 100.
pub fn private_race() -> Vec<UserBatch> {
    let write = |conv: &str, cursor: u64, mark: Option<(i64, Option<u64>)>| PrivateWrite {
        conversation_id: conv.parse().unwrap(),
        private_cursor: Seq(cursor),
        mark: mark.map(|(at, seq)| UnreadMark {
            at,
            seq: seq.map(Seq),
        }),
        read_up_to: Seq(cursor),
        mentions: Vec::new(),
        mute: None,
    };
    let mentioned = |conv: &str, read: u64, mentions: &[u64]| PrivateWrite {
        read_up_to: Seq(read),
        mentions: mentions.iter().map(|&s| Seq(s)).collect(),
        ..write(conv, 0, None)
    };
    let muted = |conv: &str, at: i64, until: i64| PrivateWrite {
        mute: Some(Mute { at, until }),
        ..write(conv, 0, None)
    };
    let writes = vec![
        write("C", 7, None),
        write("C", 3, None),
        write("D", 0, Some((10, Some(1)))),
        write("D", 0, Some((20, None))),
        write("D", 0, Some((15, Some(1)))),
        write("E", 1, Some((5, Some(2)))),
        write("E", 1, Some((5, Some(4)))),
        mentioned("F", 2, &[4, 6]),
        mentioned("F", 5, &[6, 8]),
        mentioned("F", 2, &[3, 4, 6]),
        mentioned("F", 5, &[7]),
        mentioned("G", 2, &[4]),
        mentioned("G", 9, &[]),
        mentioned("G", 2, &[4]),
        muted("H", 10, Mute::FOREVER),
        muted("H", 20, Mute::OFF),
        muted("H", 15, Mute::FOREVER),
        muted("I", 30, 500),
        muted("I", 30, Mute::FOREVER),
        muted("I", 30, 100),
    ];
    writes
        .into_iter()
        .map(|w| UserBatch {
            user_id: "u".parse().unwrap(),
            conversations: vec![w],
        })
        .collect()
}

/// What a max-merging store holds after [`private_race`], for
/// [`PRIVATE_RACE`].
pub fn expected_private_state() -> Vec<PrivateState> {
    let mute = |at, until| PrivateState {
        mute: Some(Mute { at, until }),
        ..PrivateState::default()
    };
    vec![
        PrivateState {
            private_cursor: Seq(7),
            ..PrivateState::default()
        },
        PrivateState {
            mark: Some(UnreadMark { at: 20, seq: None }),
            ..PrivateState::default()
        },
        PrivateState {
            private_cursor: Seq(1),
            mark: Some(UnreadMark {
                at: 5,
                seq: Some(Seq(4)),
            }),
            ..PrivateState::default()
        },
        PrivateState {
            unread_mentions: 3,
            ..PrivateState::default()
        },
        PrivateState::default(),
        mute(20, Mute::OFF),
        mute(30, Mute::FOREVER),
    ]
}

/// A store batch for one conversation: members with join_seq 1, each with
/// every message up to `latest` delivered (or up to their cursor, if that
/// is higher).
pub fn sink_batch(conv: &str, latest: u64, members: &[(&str, u64)]) -> ConversationBatch {
    ConversationBatch {
        conversation_id: conv.parse().unwrap(),
        latest_seq: Seq(latest),
        members: members
            .iter()
            .map(|(u, c)| MemberWrite {
                user_id: u.parse().unwrap(),
                cursor: Seq(*c),
                delivered: Seq(latest.max(*c)),
                join_seq: Seq(1),
                left: false,
                epoch: 0,
            })
            .collect(),
    }
}
