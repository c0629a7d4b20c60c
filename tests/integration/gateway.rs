//! `readfold gateway` against the real broker, processor and stores: receipts
//! acknowledged only once the broker has them, members only, snapshots then
//! deltas with no gap across a processor restart, coalescing for a slow
//! client, a big group's batches, every device of a user kept in step, and the demo page in a real
//! browser.

use std::time::Duration;

use readfold_wire::codec::EventRecord;
use serde_json::{json, Value};

use crate::kit::browser::{Browser, Driver};
use crate::kit::*;

/// Starts `readfold gateway` on a free port and waits until it answers.
pub(crate) async fn spawn_gateway(env: &TestEnv, extra: &[(&str, &str)]) -> (Processor, String) {
    let addr = free_local_addr();
    let mut vars = vec![("READFOLD__GATEWAY__LISTEN", addr.as_str())];
    vars.extend_from_slice(extra);
    let mut gateway = env.spawn_command("gateway", "gw", &vars);
    let started = std::time::Instant::now();
    while readfold_serve::client::HttpClient::new(addr.clone())
        .get("/healthz")
        .await
        .is_err()
    {
        assert!(
            gateway.is_running(),
            "readfold gateway exited:\n{}",
            gateway.log_text()
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "readfold gateway never answered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (gateway, addr)
}

/// Joins `members` to `conversation` with `messages` messages from the first,
/// and waits until the stores have it.
pub(crate) async fn chat(
    env: &TestEnv,
    reference: &mut Reference,
    conversation: &str,
    members: &[&str],
    messages: i64,
) {
    let mut feed = env.feed(reference);
    for m in members {
        feed.event(joined(conversation, m, 0)).await;
    }
    for seq in 1..=messages {
        feed.event(sent(conversation, members[0], seq)).await;
    }
    env.wait_for_reference(reference, Duration::from_secs(60)).await;
}

/// The last `lines` lines of a log.
fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(crate) async fn connect(addr: &str, user: &str) -> WsClient {
    let mut ws = WsClient::connect(addr, &format!("/ws?user={user}"))
        .await
        .unwrap();
    let welcome = ws.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(welcome["type"], "welcome");
    assert_eq!(welcome["user"], user);
    ws
}

pub(crate) async fn subscribe(ws: &mut WsClient, conversation: &str) -> Value {
    ws.send(json!({ "type": "subscribe", "conversation": conversation }))
        .await;
    ws.until(Duration::from_secs(20), |f| {
        f["type"] == "snapshot" || f["type"] == "error"
    })
    .await
    .pop()
    .unwrap()
}

/// Stops the gateway and the processor with SIGTERM; both must exit cleanly.
pub(crate) fn stop(mut gateway: Processor, mut processor: Processor) {
    assert!(
        gateway.terminate(Duration::from_secs(30)),
        "{}",
        gateway.log_text()
    );
    assert!(processor.terminate(Duration::from_secs(30)));
}

fn is_cursor_of(frame: &Value, user: &str) -> bool {
    frame["type"] == "cursor" && frame["user"] == user
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_is_acknowledged_once_the_broker_has_it_and_members_only() {
    let env = TestEnv::new("gw-ack", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B"], 3).await;
    let (gateway, addr) = spawn_gateway(&env, &[]).await;

    let mut b = connect(&addr, "B").await;
    let snapshot = subscribe(&mut b, "G").await;
    assert_eq!(snapshot["type"], "snapshot", "{snapshot}");
    assert_eq!(snapshot["latest_seq"], 3);
    b.send(json!({ "type": "read", "conversation": "G", "seq": 2, "id": "r1" }))
        .await;
    let ack = b
        .until(Duration::from_secs(20), |f| {
            f["type"] == "ack" || f["type"] == "error"
        })
        .await;
    assert_eq!(ack.last().unwrap(), &json!({ "type": "ack", "id": "r1" }));
    // Acknowledged means on the topic, keyed and placed as the processor wants.
    let reports = env.read_topic(&env.config.topics.read_reports);
    let mine = reports
        .iter()
        .find(|r| r["value"]["user_id"] == "B" && r["value"]["seq"] == 2)
        .unwrap_or_else(|| panic!("the acknowledged receipt is not on the topic: {reports:?}"));
    assert_eq!(mine["key"], "G");
    assert_eq!(
        mine["partition"],
        readfold_core::partitioner::partition_for_key(b"G", env.partitions)
    );

    // Insane seqs and strangers are refused, with the request's id.
    b.send(json!({ "type": "read", "conversation": "G", "seq": 100_000, "id": "r2" }))
        .await;
    let refused = b.until(Duration::from_secs(20), |f| f["type"] == "error").await;
    assert_eq!(refused.last().unwrap()["code"], "invalid_seq");
    b.send(json!({ "type": "read", "conversation": "G", "seq": 0, "id": "r3" }))
        .await;
    let refused = b.until(Duration::from_secs(20), |f| f["type"] == "error").await;
    assert_eq!(refused.last().unwrap()["code"], "invalid_seq");
    let mut c = connect(&addr, "C").await;
    assert_eq!(subscribe(&mut c, "G").await["code"], "not_a_member");
    c.send(json!({ "type": "read", "conversation": "G", "seq": 1, "id": "c1" }))
        .await;
    let refused = c.until(Duration::from_secs(20), |f| f["type"] == "error").await;
    assert_eq!(refused.last().unwrap()["code"], "not_a_member");
    c.send(json!({ "type": "fly" })).await;
    let refused = c.until(Duration::from_secs(20), |f| f["type"] == "error").await;
    assert_eq!(refused.last().unwrap()["code"], "bad_message");
    // Without the subprotocol, or without a user, there is no connection.
    assert_eq!(
        WsClient::connect_without_protocol(&addr, "/ws?user=A")
            .await
            .err(),
        Some(400)
    );
    assert_eq!(WsClient::connect(&addr, "/ws").await.err(), Some(400));
    stop(gateway, processor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_ahead_of_what_the_gateway_knows_waits_for_its_message() {
    let env = TestEnv::new("gw-ahead", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B"], 3).await;
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__MAX_SEQ_AHEAD", "5")]).await;
    let mut b = connect(&addr, "B").await;
    assert_eq!(subscribe(&mut b, "G").await["latest_seq"], 3);
    // B read message 20 on a screen that got it before this gateway did:
    // the receipt waits for the message instead of being refused.
    b.send(json!({ "type": "read", "conversation": "G", "seq": 20, "id": "early" }))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut feed = env.feed(&mut reference);
    for seq in 4..=20 {
        feed.event(sent("G", "A", seq)).await;
    }
    let answer = b
        .until(Duration::from_secs(20), |f| {
            f["type"] == "ack" || f["type"] == "error"
        })
        .await;
    assert_eq!(answer.last().unwrap(), &json!({ "type": "ack", "id": "early" }));
    // A seq that no message reaches in time is still refused.
    b.send(json!({ "type": "read", "conversation": "G", "seq": 1_000, "id": "insane" }))
        .await;
    let answer = b.until(Duration::from_secs(20), |f| f["type"] == "error").await;
    assert_eq!(answer.last().unwrap()["code"], "invalid_seq");
    stop(gateway, processor);
}

/// The seqs of `user`'s delivery reports on the read-reports topic.
fn deliveries_on_topic(env: &TestEnv, user: &str) -> Vec<i64> {
    env.read_topic(&env.config.topics.read_reports)
        .iter()
        .filter(|r| r["value"]["user_id"] == user && r["value"]["action"] == "DELIVERED")
        .map(|r| r["value"]["seq"].as_i64().unwrap())
        .collect()
}

pub(crate) async fn answer(ws: &mut WsClient) -> Value {
    ws.until(Duration::from_secs(20), |f| {
        f["type"] == "ack" || f["type"] == "error"
    })
    .await
    .pop()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_is_acknowledged_members_only_and_reaches_the_senders_devices() {
    let env = TestEnv::new("gw-delivered", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B", "C"], 3).await;
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__MAX_SEQ_AHEAD", "2")]).await;
    // A's laptop shows A's messages' ticks from the member frames.
    let mut laptop = connect(&addr, "A").await;
    let snapshot = subscribe(&mut laptop, "G").await;
    for m in snapshot["members"].as_array().unwrap() {
        assert_eq!(
            m["delivered"], m["cursor"],
            "nothing delivered unread: {snapshot}"
        );
    }
    let mut b = connect(&addr, "B").await;
    assert_eq!(subscribe(&mut b, "G").await["type"], "snapshot");

    // B's phone got messages 1 and 2: acknowledged once on the topic, and A
    // sees it as a cursor frame (a small group), read nothing yet.
    b.send(json!({ "type": "delivered", "conversation": "G", "seq": 2, "id": "d1" }))
        .await;
    assert_eq!(answer(&mut b).await, json!({ "type": "ack", "id": "d1" }));
    assert_eq!(deliveries_on_topic(&env, "B"), [2]);
    let mut frames = laptop
        .until(Duration::from_secs(30), |f| {
            is_cursor_of(f, "B") && f["delivered"] == 2
        })
        .await;
    assert_eq!(frames.last().unwrap()["cursor"], 0);
    // B's other device reports what is known already: acknowledged, and
    // not produced again.
    b.send(json!({ "type": "delivered", "conversation": "G", "seq": 1, "id": "d2" }))
        .await;
    assert_eq!(answer(&mut b).await, json!({ "type": "ack", "id": "d2" }));

    // A delivery past what the gateway knows waits for its message.
    b.send(json!({ "type": "delivered", "conversation": "G", "seq": 6, "id": "d3" }))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    {
        let mut feed = env.feed(&mut reference);
        for seq in 4..=6 {
            feed.event(sent("G", "A", seq)).await;
        }
    }
    assert_eq!(answer(&mut b).await, json!({ "type": "ack", "id": "d3" }));
    assert_eq!(deliveries_on_topic(&env, "B"), [2, 6]);
    // B reads 4: the cursor moves, the delivered cursor stays ahead.
    b.send(json!({ "type": "read", "conversation": "G", "seq": 4, "id": "r1" }))
        .await;
    assert_eq!(answer(&mut b).await, json!({ "type": "ack", "id": "r1" }));
    frames.extend(
        laptop
            .until(Duration::from_secs(30), |f| {
                is_cursor_of(f, "B") && f["cursor"] == 4
            })
            .await,
    );
    assert_eq!(frames.last().unwrap()["delivered"], 6, "{frames:?}");
    // C's phone reports through another gateway: A learns it from the
    // changelog.
    env.producer().report(&delivery("G", "C", 5)).await.unwrap();
    frames.extend(
        laptop
            .until(Duration::from_secs(30), |f| {
                is_cursor_of(f, "C") && f["delivered"] == 5
            })
            .await,
    );
    assert_eq!(frames.last().unwrap()["cursor"], 0);
    frames.extend(laptop.drain(Duration::from_secs(1)).await);
    for member in ["B", "C"] {
        let shown: Vec<(u64, u64)> = frames
            .iter()
            .filter(|f| is_cursor_of(f, member))
            .map(|f| (f["cursor"].as_u64().unwrap(), f["delivered"].as_u64().unwrap()))
            .collect();
        assert!(
            shown.iter().all(|(c, d)| d >= c),
            "{member}: delivered below the cursor: {shown:?}"
        );
        assert!(
            shown
                .windows(2)
                .all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1 && w[1] != w[0]),
            "{member}: shown twice or going back: {shown:?}"
        );
    }

    // Strangers and insane seqs are refused, with the request's id.
    b.send(json!({ "type": "delivered", "conversation": "G", "seq": 0, "id": "zero" }))
        .await;
    let refused = answer(&mut b).await;
    assert_eq!(
        (refused["code"].as_str(), refused["id"].as_str()),
        (Some("invalid_seq"), Some("zero"))
    );
    b.send(json!({ "type": "delivered", "conversation": "G", "seq": 1_000, "id": "far" }))
        .await;
    assert_eq!(answer(&mut b).await["code"], "invalid_seq");
    b.send(json!({ "type": "delivered", "conversation": "G", "seq": 2, "private": true }))
        .await;
    assert_eq!(answer(&mut b).await["code"], "bad_message");
    let mut d = connect(&addr, "D").await;
    d.send(json!({ "type": "delivered", "conversation": "G", "seq": 1, "id": "x" }))
        .await;
    let refused = answer(&mut d).await;
    assert_eq!(
        (refused["code"].as_str(), refused["id"].as_str()),
        (Some("not_a_member"), Some("x"))
    );
    assert_eq!(deliveries_on_topic(&env, "D"), Vec::<i64>::new());
    stop(gateway, processor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_then_every_change_without_a_gap_across_a_processor_restart() {
    let env = TestEnv::new("gw-nogap", 2).await;
    let mut reference = Reference::default();
    let mut processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B", "C"], 200).await;
    let (mut gateway, addr) = spawn_gateway(&env, &[]).await;
    let mut a = connect(&addr, "A").await;
    let snapshot = subscribe(&mut a, "G").await;
    assert_eq!(snapshot["type"], "snapshot", "{snapshot}");

    // B reads on and on while the processor is killed and started again.
    let producer = env.producer();
    let feed = async {
        for seq in 1..=200 {
            producer.report(&report("G", "B", seq)).await.unwrap();
            producer.report(&report("G", "C", seq)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    };
    let restart = async {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        processor.kill();
        tokio::time::sleep(Duration::from_millis(800)).await;
        env.spawn("a")
    };
    let ((), mut processor) = tokio::join!(feed, restart);
    // Both final cursors arrive, in either order (one flush may carry both).
    let (mut b_done, mut c_done) = (false, false);
    let frames = a
        .until(Duration::from_secs(90), |f| {
            b_done |= is_cursor_of(f, "B") && f["cursor"] == 200;
            c_done |= is_cursor_of(f, "C") && f["cursor"] == 200;
            b_done && c_done
        })
        .await;
    for member in ["B", "C"] {
        let mut last = 0;
        for cursor in frames
            .iter()
            .filter(|f| is_cursor_of(f, member))
            .map(|f| f["cursor"].as_u64().unwrap())
        {
            assert!(
                cursor > last,
                "{member}'s cursor went {last} -> {cursor}: shown twice or lower"
            );
            last = cursor;
        }
    }
    assert!(
        gateway.terminate(Duration::from_secs(30)),
        "{}",
        gateway.log_text()
    );
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

/// A 150-member group, BIG, with 40 messages from m000; a gateway with small
/// socket send buffers (as a gateway holding many connections would have
/// them) and `extra` settings; a slow client m000 (a tiny receive buffer, and
/// it does not read for now) and a fast one m001, both subscribed.
struct BigGroup {
    processor: Processor,
    gateway: Processor,
    slow: WsClient,
    fast: WsClient,
    /// The fast client's.
    snapshot: Value,
    names: Vec<String>,
}

async fn big_group(env: &TestEnv, extra: &[(&str, &str)]) -> BigGroup {
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    let names: Vec<String> = (0..150).map(|i| format!("m{i:03}")).collect();
    let members: Vec<&str> = names.iter().map(String::as_str).collect();
    chat(env, &mut reference, "BIG", &members, 40).await;
    let mut vars = vec![("READFOLD__GATEWAY__SEND_BUFFER_BYTES", "16384")];
    vars.extend_from_slice(extra);
    let (gateway, addr) = spawn_gateway(env, &vars).await;
    let mut slow = WsClient::connect_with(&addr, "/ws?user=m000", Some(2048))
        .await
        .unwrap();
    slow.send(json!({ "type": "subscribe", "conversation": "BIG" }))
        .await;
    let mut fast = connect(&addr, "m001").await;
    let snapshot = subscribe(&mut fast, "BIG").await;
    assert_eq!(snapshot["type"], "snapshot", "{snapshot}");
    BigGroup {
        processor,
        gateway,
        slow,
        fast,
        snapshot,
        names,
    }
}

/// Every member reads each of BIG's 40 messages in turn: 6,000 cursor
/// changes in about five seconds.
async fn everyone_reads(env: &TestEnv, names: &[&str]) {
    let producer = env.producer();
    for seq in 1..=40 {
        let reports: Vec<_> = names.iter().map(|m| report("BIG", m, seq)).collect();
        producer.send_many(&reports, &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_gets_fewer_newer_frames_and_holds_nobody_up() {
    // A frame per change (the per-member path); a big group's batches are
    // the next test's.
    let env = TestEnv::new("gw-slow", 2).await;
    let BigGroup {
        processor,
        gateway,
        mut slow,
        mut fast,
        names,
        ..
    } = big_group(&env, &[("READFOLD__GATEWAY__BATCH_FROM_MEMBERS", "1000")]).await;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    everyone_reads(&env, &names).await;
    let fast_frames = fast
        .until(Duration::from_secs(60), |f| {
            is_cursor_of(f, "m149") && f["cursor"] == 40
        })
        .await;
    // The fast client saw every member reach 40 without waiting for the slow one.
    let done = |frames: &[Value]| {
        names
            .iter()
            .skip(1)
            .all(|m| frames.iter().any(|f| is_cursor_of(f, m) && f["cursor"] == 40))
    };
    let mut all_fast = fast_frames;
    if !done(&all_fast) {
        all_fast.extend(fast.drain(Duration::from_secs(3)).await);
    }
    assert!(done(&all_fast), "the fast client missed final cursors");

    let slow_frames = slow.drain(Duration::from_secs(3)).await;
    let slow_cursors: Vec<&Value> = slow_frames.iter().filter(|f| f["type"] == "cursor").collect();
    let fast_cursors = all_fast.iter().filter(|f| f["type"] == "cursor").count();
    println!(
        "slow client: {} cursor frames, fast client: {fast_cursors}, changes: {}",
        slow_cursors.len(),
        150 * 40
    );
    assert!(
        done(&slow_frames),
        "the slow client must still end at every final cursor"
    );
    assert!(
        slow_cursors.len() < fast_cursors,
        "the slow client got {} frames, the fast one {fast_cursors}: nothing was coalesced",
        slow_cursors.len()
    );
    stop(gateway, processor);
}

/// Each member's cursors in a client's `cursors` frames, in order.
fn batched_cursors(frames: &[Value]) -> std::collections::BTreeMap<String, Vec<u64>> {
    let mut seen: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for frame in frames.iter().filter(|f| f["type"] == "cursors") {
        for m in frame["members"].as_array().unwrap() {
            let user = m["user"].as_str().unwrap().to_owned();
            seen.entry(user).or_default().push(m["cursor"].as_u64().unwrap());
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_group_sends_one_batch_per_interval_and_a_slow_client_the_latest() {
    let env = TestEnv::new("gw-batch", 2).await;
    let interval_ms = 400;
    let BigGroup {
        processor,
        gateway,
        mut slow,
        mut fast,
        snapshot,
        names,
    } = big_group(
        &env,
        &[
            ("READFOLD__GATEWAY__BATCH_FROM_MEMBERS", "100"),
            ("READFOLD__GATEWAY__BATCH_INTERVAL_MS", "400"),
        ],
    )
    .await;
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(snapshot["members"].as_array().unwrap().len(), 150, "{snapshot}");
    let subscribed = std::time::Instant::now();
    everyone_reads(&env, &names).await;
    // m000 sent the 40 messages, so the snapshot has it at 40 already.
    let sender = snapshot["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["user"] == "m000")
        .unwrap();
    assert_eq!(sender["cursor"], 40, "{snapshot}");
    let all_at_40 = |frames: &[Value]| {
        let seen = batched_cursors(frames);
        names
            .iter()
            .skip(1)
            .all(|m| seen.get(*m).and_then(|c| c.last()) == Some(&40))
    };
    let mut fast_frames = Vec::new();
    let started = std::time::Instant::now();
    while !all_at_40(&fast_frames) && started.elapsed() < Duration::from_secs(60) {
        fast_frames.extend(fast.drain(Duration::from_millis(500)).await);
    }
    let elapsed_ms = subscribed.elapsed().as_millis() as usize;
    assert!(all_at_40(&fast_frames), "the fast client missed final cursors");
    assert!(
        fast_frames.iter().all(|f| f["type"] != "cursor"),
        "a big group's changes come only in batches"
    );
    let batches = fast_frames.iter().filter(|f| f["type"] == "cursors").count();
    assert!(
        batches <= elapsed_ms / interval_ms + 1,
        "{batches} batches in {elapsed_ms} ms: more than one per {interval_ms} ms"
    );
    for (member, cursors) in batched_cursors(&fast_frames) {
        assert!(
            cursors.windows(2).all(|w| w[0] < w[1]),
            "{member}'s cursor was shown out of order or twice: {cursors:?}"
        );
    }

    let slow_frames = slow.drain(Duration::from_secs(3)).await;
    let slow_batches = slow_frames.iter().filter(|f| f["type"] == "cursors").count();
    println!("batches: fast client {batches}, slow client {slow_batches}, changes: 6000");
    assert!(
        all_at_40(&slow_frames),
        "the slow client must still end at every final cursor"
    );
    assert!(
        slow_batches < batches,
        "the slow client got {slow_batches} batches, the fast one {batches}: nothing was merged"
    );
    for (member, cursors) in batched_cursors(&slow_frames) {
        assert!(
            cursors.windows(2).all(|w| w[0] < w[1]),
            "{member}'s cursor was shown out of order or twice to the slow client: {cursors:?}"
        );
    }
    stop(gateway, processor);
}

/// Each seq's counts (`field`: `counts` or `delivered_counts`) in a
/// client's `read_counts` frames, in order.
fn counts_by_seq(frames: &[Value], field: &str) -> std::collections::BTreeMap<u64, Vec<u64>> {
    let mut seen: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for frame in frames.iter().filter(|f| f["type"] == "read_counts") {
        let first = frame["first_seq"].as_u64().unwrap();
        for (i, count) in frame[field].as_array().unwrap().iter().enumerate() {
            if let Some(count) = count.as_u64() {
                seen.entry(first + i as u64).or_default().push(count);
            }
        }
    }
    seen
}

/// The read model's ticks of message `seq` over the reference fold.
fn ticks(
    reference: &Reference,
    conversation: &str,
    seq: u64,
    sender: &str,
) -> readfold_core::read_model::Ticks {
    let c: readfold_core::ConversationId = conversation.parse().unwrap();
    let s: readfold_core::UserId = sender.parse().unwrap();
    reference
        .state
        .conversation(&c)
        .map(|c| c.view().ticks(readfold_core::Seq(seq), &s))
        .unwrap_or_default()
}

/// The highest seq up to `last` through which every message has `all` by
/// the read model.
fn all_through(last: u64, all: impl Fn(u64) -> bool) -> u64 {
    (1..=last).take_while(|&seq| all(seq)).last().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_groups_v2_clients_get_read_counts_that_converge_to_the_read_model() {
    let env = TestEnv::new("gw-counts", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    let names: Vec<String> = (0..120).map(|i| format!("m{i:03}")).collect();
    let members: Vec<&str> = names.iter().map(String::as_str).collect();
    chat(&env, &mut reference, "BIG", &members, 2).await;
    let interval_ms = 300;
    let (gateway, addr) = spawn_gateway(
        &env,
        &[
            ("READFOLD__GATEWAY__BATCH_FROM_MEMBERS", "100"),
            ("READFOLD__GATEWAY__READ_COUNTS_INTERVAL_MS", "300"),
        ],
    )
    .await;
    let mut clients = Vec::new();
    for user in ["m000", "m050", "m119"] {
        let mut ws = WsClient::connect_v2(&addr, &format!("/ws?user={user}"))
            .await
            .unwrap();
        let welcome = ws.next(Duration::from_secs(10)).await.unwrap();
        assert_eq!(welcome["protocol"], "readfold.v2.json", "{welcome}");
        ws.send(json!({ "type": "subscribe", "conversation": "BIG" }))
            .await;
        let frames = ws
            .until(Duration::from_secs(20), |f| f["type"] == "read_counts")
            .await;
        let snapshot = frames.iter().find(|f| f["type"] == "snapshot").unwrap();
        assert_eq!(
            snapshot["members"],
            json!([]),
            "a v2 big-group snapshot names no members"
        );
        clients.push(ws);
    }
    // A v1 client in the same group still gets member batches.
    let mut v1 = connect(&addr, "m001").await;
    assert_eq!(
        subscribe(&mut v1, "BIG").await["members"]
            .as_array()
            .unwrap()
            .len(),
        120
    );

    // Messages 3..=30 from many senders; every member reads up to a seq of
    // its own, one of them through its WebSocket, and most got messages
    // further than they read, one of them reporting through its WebSocket.
    let subscribed = std::time::Instant::now();
    let last = 30u64;
    let sender = |seq: u64| {
        if seq < 3 {
            members[0]
        } else {
            members[seq as usize * 7 % 120]
        }
    };
    {
        let mut feed = env.feed(&mut reference);
        for seq in 3..=last {
            feed.event(sent("BIG", sender(seq), seq as i64)).await;
        }
        for (i, m) in members.iter().enumerate().skip(1) {
            let read = 3 + (i as i64 * 11 % 28);
            feed.report(report("BIG", m, read)).await;
            if i % 5 != 0 {
                feed.report(delivery("BIG", m, (read + 1 + i as i64 % 9).min(last as i64)))
                    .await;
            }
        }
    }
    clients[0]
        .send(json!({ "type": "read", "conversation": "BIG", "seq": last, "id": "r" }))
        .await;
    reference.report(&report("BIG", "m000", last as i64));
    clients[1]
        .send(json!({ "type": "delivered", "conversation": "BIG", "seq": last, "id": "d" }))
        .await;
    reference.report(&delivery("BIG", "m050", last as i64));
    let all_ticks: Vec<_> = (1..=last)
        .map(|seq| ticks(&reference, "BIG", seq, sender(seq)))
        .collect();
    let expected: Vec<u64> = all_ticks[2..].iter().map(|t| t.read_count as u64).collect();
    let expected_delivered: Vec<u64> = all_ticks[2..].iter().map(|t| t.delivered_count as u64).collect();
    assert_eq!(
        expected,
        (3..=last)
            .map(|seq| reference.read_count("BIG", seq, sender(seq)) as u64)
            .collect::<Vec<_>>()
    );
    let read_through = all_through(last, |seq| all_ticks[seq as usize - 1].read_by_all());
    let delivered_through = all_through(last, |seq| all_ticks[seq as usize - 1].delivered_to_all());
    assert!(
        read_through < delivered_through && delivered_through < last,
        "the test wants messages read by all, delivered to all, and neither: {read_through}, {delivered_through}"
    );
    let converged = |frames: &[Value]| {
        let (seen, delivered) = (
            counts_by_seq(frames, "counts"),
            counts_by_seq(frames, "delivered_counts"),
        );
        let last_frame = frames.iter().rev().find(|f| f["type"] == "read_counts");
        (3..=last).all(|seq| {
            let i = (seq - 3) as usize;
            seen.get(&seq).and_then(|c| c.last()) == Some(&expected[i])
                && delivered.get(&seq).and_then(|c| c.last()) == Some(&expected_delivered[i])
        }) && last_frame.is_some_and(|f| {
            f["read_by_all_through"] == read_through && f["delivered_to_all_through"] == delivered_through
        })
    };
    for ws in &mut clients {
        let mut frames = Vec::new();
        let started = std::time::Instant::now();
        while !converged(&frames) && started.elapsed() < Duration::from_secs(60) {
            frames.extend(ws.drain(Duration::from_millis(700)).await);
        }
        let seen = counts_by_seq(&frames, "counts");
        let delivered = counts_by_seq(&frames, "delivered_counts");
        let last_frame = frames.iter().rev().find(|f| f["type"] == "read_counts");
        assert!(
            converged(&frames),
            "expected {expected:?} read and {expected_delivered:?} delivered from seq 3, read by all through \
             {read_through}, delivered to all through {delivered_through}; saw {seen:?} and {delivered:?}, \
             last {last_frame:?}"
        );
        assert!(
            frames
                .iter()
                .all(|f| f["type"] != "cursor" && f["type"] != "cursors"),
            "a v2 client of a big group gets no member frames"
        );
        for (seq, counts) in seen.iter().chain(&delivered) {
            assert!(
                counts.windows(2).all(|w| w[0] <= w[1]),
                "seq {seq}'s count went down with nobody leaving: {counts:?}"
            );
        }
        let elapsed_ms = subscribed.elapsed().as_millis() as usize;
        let sent = frames.iter().filter(|f| f["type"] == "read_counts").count();
        assert!(
            sent <= elapsed_ms / interval_ms + 1,
            "{sent} read_counts frames in {elapsed_ms} ms: more than one per {interval_ms} ms"
        );
    }
    let v1_frames = v1.drain(Duration::from_secs(1)).await;
    assert!(v1_frames.iter().any(|f| f["type"] == "cursors"), "{v1_frames:?}");
    stop(gateway, processor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_device_of_a_user_gets_its_own_state_and_nobody_else_does() {
    let env = TestEnv::new("gw-devices", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B"], 5).await;
    let (gateway, addr) = spawn_gateway(&env, &[]).await;
    let mut phone = connect(&addr, "A").await;
    let mut laptop = connect(&addr, "A").await;
    let mut b = connect(&addr, "B").await;
    assert_eq!(subscribe(&mut b, "G").await["type"], "snapshot");

    // A reads privately on the phone: the laptop learns it too.
    phone
        .send(json!({ "type": "read", "conversation": "G", "seq": 4, "private": true, "id": "p" }))
        .await;
    let own = |f: &Value| f["type"] == "own" && f["private_cursor"] == 4;
    phone.until(Duration::from_secs(30), own).await;
    let seen = laptop.until(Duration::from_secs(30), own).await;
    assert_eq!(seen.last().unwrap()["conversation"], "G");
    // Then marks it unread on the laptop (at A's cursor, 5: A sent #5): the
    // phone sees the mark.
    laptop
        .send(json!({ "type": "mark_unread", "conversation": "G", "seq": 5, "marked": true, "id": "m" }))
        .await;
    phone
        .until(Duration::from_secs(30), |f| {
            f["type"] == "own" && f["unread_mark"] == true
        })
        .await;
    // B, subscribed to G, never hears of A's private read or mark.
    let heard = b.drain(Duration::from_secs(2)).await;
    assert!(
        heard
            .iter()
            .all(|f| !(is_cursor_of(f, "A") && f["cursor"].as_u64() >= Some(4)) && f["type"] != "own"),
        "{heard:?}"
    );
    stop(gateway, processor);
}

/// `user`'s mutes and unmutes on the read-reports topic: (action, seq,
/// muted_until).
fn mutes_on_topic(env: &TestEnv, user: &str) -> Vec<(String, i64, Value)> {
    env.read_topic(&env.config.topics.read_reports)
        .iter()
        .filter(|r| r["value"]["user_id"] == user)
        .filter(|r| r["value"]["action"] == "MUTE" || r["value"]["action"] == "UNMUTE")
        .map(|r| {
            let v = &r["value"];
            (
                v["action"].as_str().unwrap().to_owned(),
                v["seq"].as_i64().unwrap(),
                v["muted_until"].clone(),
            )
        })
        .collect()
}

fn is_own_in(frame: &Value, conversation: &str) -> bool {
    frame["type"] == "own" && frame["conversation"] == conversation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mute_is_acknowledged_members_only_and_reaches_the_users_other_devices() {
    let env = TestEnv::new("gw-mute", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B"], 2).await;
    let (gateway, addr) = spawn_gateway(&env, &[]).await;
    let mut phone = connect(&addr, "A").await;
    let mut laptop = connect(&addr, "A").await;
    let mut b = connect(&addr, "B").await;
    assert_eq!(subscribe(&mut b, "G").await["type"], "snapshot");
    let muted_until = |until: Value| move |f: &Value| is_own_in(f, "G") && f["muted_until"] == until;

    // Muted until unmuted on the phone: acknowledged once on the topic, and
    // the laptop shows it.
    phone
        .send(json!({ "type": "mute", "conversation": "G", "id": "m1" }))
        .await;
    assert_eq!(answer(&mut phone).await, json!({ "type": "ack", "id": "m1" }));
    assert_eq!(mutes_on_topic(&env, "A"), [("MUTE".to_owned(), 0, Value::Null)]);
    let mut shown = laptop
        .until(Duration::from_secs(30), muted_until(json!(i64::MAX)))
        .await;
    // For an hour, then unmuted.
    let hour = now_ms() + 3_600_000;
    phone
        .send(json!({ "type": "mute", "conversation": "G", "until": hour, "id": "m2" }))
        .await;
    assert_eq!(answer(&mut phone).await, json!({ "type": "ack", "id": "m2" }));
    shown.extend(
        laptop
            .until(Duration::from_secs(30), muted_until(json!(hour)))
            .await,
    );
    phone
        .send(json!({ "type": "unmute", "conversation": "G", "id": "u1" }))
        .await;
    assert_eq!(answer(&mut phone).await, json!({ "type": "ack", "id": "u1" }));
    shown.extend(
        laptop
            .until(Duration::from_secs(30), muted_until(Value::Null))
            .await,
    );
    // A time gone by is a mute that ran out, taken as one.
    phone
        .send(json!({ "type": "mute", "conversation": "G", "until": 1000, "id": "m3" }))
        .await;
    assert_eq!(answer(&mut phone).await, json!({ "type": "ack", "id": "m3" }));
    shown.extend(
        laptop
            .until(Duration::from_secs(30), muted_until(json!(1000)))
            .await,
    );
    let seen: Vec<&Value> = shown
        .iter()
        .filter(|f| is_own_in(f, "G"))
        .map(|f| &f["muted_until"])
        .collect();
    assert_eq!(
        seen,
        [&json!(i64::MAX), &json!(hour), &Value::Null, &json!(1000)],
        "each mute shown once, in order: {shown:?}"
    );
    assert!(
        shown
            .iter()
            .filter(|f| is_own_in(f, "G"))
            .all(|f| f["cursor"] == 2 && f["unread_mentions"] == 0),
        "{shown:?}"
    );

    // Refused: a time before the epoch, and strangers, with the request's id.
    phone
        .send(json!({ "type": "mute", "conversation": "G", "until": -1, "id": "m4" }))
        .await;
    let refused = answer(&mut phone).await;
    assert_eq!(
        (refused["code"].as_str(), refused["id"].as_str()),
        (Some("bad_message"), Some("m4"))
    );
    let mut d = connect(&addr, "D").await;
    for (message, id) in [("mute", "x1"), ("unmute", "x2")] {
        d.send(json!({ "type": message, "conversation": "G", "id": id }))
            .await;
        let refused = answer(&mut d).await;
        assert_eq!(
            (refused["code"].as_str(), refused["id"].as_str()),
            (Some("not_a_member"), Some(id))
        );
    }
    assert_eq!(mutes_on_topic(&env, "D"), []);
    let actions: Vec<(String, i64)> = mutes_on_topic(&env, "A")
        .into_iter()
        .map(|(action, seq, _)| (action, seq))
        .collect();
    let expected: Vec<(String, i64)> = ["MUTE", "MUTE", "UNMUTE", "MUTE"]
        .iter()
        .map(|a| (a.to_string(), 0))
        .collect();
    assert_eq!(actions, expected);
    // B, subscribed to G, never hears of A's mutes.
    let heard = b.drain(Duration::from_secs(1)).await;
    assert!(heard.iter().all(|f| f["type"] != "own"), "{heard:?}");
    stop(gateway, processor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_mentions_go_up_when_mentioned_and_down_when_read_on_every_device() {
    let env = TestEnv::new("gw-mentions", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B", "C"], 3).await;
    let (gateway, addr) = spawn_gateway(&env, &[]).await;
    let mut phone = connect(&addr, "B").await;
    let mut laptop = connect(&addr, "B").await;
    let message = |sender: &str, seq, named: &[&str], all| {
        event(
            "G",
            seq,
            EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                sender_id: sender.into(),
                mentions: named.iter().map(|u| u.to_string()).collect(),
                mention_all: all,
            },
        )
    };
    let mentions = |n: u64| move |f: &Value| is_own_in(f, "G") && f["unread_mentions"] == n;

    // A names B in #4, C says @all in #5, A names C in #6.
    {
        let mut feed = env.feed(&mut reference);
        feed.event(message("A", 4, &["B"], false)).await;
        feed.event(message("C", 5, &[], true)).await;
        feed.event(message("A", 6, &["C"], false)).await;
    }
    let mut shown = laptop.until(Duration::from_secs(30), mentions(2)).await;
    // B reads #4 on the phone: one mention left; then #5, privately: none.
    phone
        .send(json!({ "type": "read", "conversation": "G", "seq": 4, "id": "r1" }))
        .await;
    assert_eq!(answer(&mut phone).await, json!({ "type": "ack", "id": "r1" }));
    reference.report(&report("G", "B", 4));
    shown.extend(laptop.until(Duration::from_secs(30), mentions(1)).await);
    phone
        .send(json!({ "type": "read", "conversation": "G", "seq": 5, "private": true, "id": "r2" }))
        .await;
    assert_eq!(answer(&mut phone).await, json!({ "type": "ack", "id": "r2" }));
    reference.report(&private_report("G", "B", 5));
    shown.extend(laptop.until(Duration::from_secs(30), mentions(0)).await);
    // Named again in #7.
    {
        let mut feed = env.feed(&mut reference);
        feed.event(message("C", 7, &["B"], false)).await;
    }
    shown.extend(laptop.until(Duration::from_secs(30), mentions(1)).await);
    let mut counts: Vec<u64> = shown
        .iter()
        .filter(|f| is_own_in(f, "G"))
        .map(|f| f["unread_mentions"].as_u64().unwrap())
        .collect();
    counts.dedup();
    assert!(
        counts == [2, 1, 0, 1] || counts == [1, 2, 1, 0, 1],
        "up when mentioned, down when read, nothing stale between: {counts:?} in {shown:?}"
    );
    // The last state shown is the reference fold's.
    let last = shown.last().unwrap();
    let expected = reference.own_expected()[&("G".to_owned(), "B".to_owned())].unwrap();
    assert_eq!(
        (
            last["cursor"].as_i64(),
            last["private_cursor"].as_i64(),
            last["unread_mentions"].as_u64(),
            last["muted_until"].clone()
        ),
        (
            Some(expected.cursor),
            Some(expected.private_cursor),
            Some(u64::from(expected.unread_mentions)),
            json!(expected.muted_until)
        )
    );
    // A device that subscribes now gets the fields in its snapshot's own.
    let mut tablet = connect(&addr, "B").await;
    let snapshot = subscribe(&mut tablet, "G").await;
    let own = &snapshot["own"];
    assert!(
        own["unread_mentions"].is_u64() && own.get("muted_until").is_some(),
        "{snapshot}"
    );
    stop(gateway, processor);
}

/// Waits until `who`'s pane on a demo page has subscribed (the joins went
/// through Kafka and the processor).
/// A browser on the demo page of `conversation` showing alice, bob and
/// carol, once all three panes are subscribed.
pub(crate) async fn open_demo_page(
    driver: &Driver,
    addr: &str,
    conversation: &str,
    gateway: &Processor,
    processor: &Processor,
) -> Browser {
    let mut page = driver.browser().await;
    page.open(&format!(
        "http://{addr}/demo/?conversation={conversation}&members=alice,bob,carol"
    ))
    .await;
    for who in ["alice", "bob", "carol"] {
        wait_subscribed(&mut page, who, gateway, processor).await;
    }
    page
}

pub(crate) async fn wait_subscribed(
    browser: &mut Browser,
    who: &str,
    gateway: &Processor,
    processor: &Processor,
) {
    let started = std::time::Instant::now();
    loop {
        let status = browser.text(&format!("#status-{who}")).await;
        if status.starts_with("subscribed") {
            return;
        }
        if started.elapsed() >= Duration::from_secs(60) {
            let setup = browser.text("#setup").await;
            panic!(
                "{who} never subscribed; the page says {status:?} (setup: {setup:?})\n\
                 the gateway's log ends:\n{}\nthe processor's log ends:\n{}",
                tail(&gateway.log_text(), 40),
                tail(&processor.log_text(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_shows_a_read_on_another_members_screen() {
    let env = TestEnv::new("gw-browser", 2).await;
    let processor = env.spawn("a");
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__DEMO", "true")]).await;
    let driver = Driver::start().await;
    let conversation = unique("page");
    let page = |who: &str| {
        format!("http://{addr}/demo/?conversation={conversation}&members=alice,bob,carol&as={who}")
    };
    let mut alice = driver.browser().await;
    let mut bob = driver.browser().await;
    alice.open(&page("alice")).await;
    bob.open(&page("bob")).await;
    // Both panes subscribed (the joins went through Kafka and the processor).
    wait_subscribed(&mut alice, "alice", &gateway, &processor).await;
    wait_subscribed(&mut bob, "bob", &gateway, &processor).await;
    alice.click("#send-alice").await;
    alice
        .wait_for_text("#msg-alice-1 .read-count", "0 read", Duration::from_secs(30))
        .await;
    bob.wait_for("#msg-bob-1", Duration::from_secs(30)).await;
    bob.click("#read-bob").await;
    // Bob's read reaches Alice's screen: through the gateway, Kafka, the
    // processor, the changelog and back.
    alice
        .wait_for_text("#msg-alice-1 .read-count", "1 read", Duration::from_secs(30))
        .await;
    alice.click("#msg-alice-1 .read-count").await;
    alice
        .wait_for_text("#who-alice", "#1 read by: bob", Duration::from_secs(30))
        .await;
    let png = alice.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo.png");
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
    // The whole chat, every member's pane on one page, for the README.
    let mut everyone = driver.browser().await;
    everyone
        .open(&format!(
            "http://{addr}/demo/?conversation={conversation}&members=alice,bob,carol"
        ))
        .await;
    everyone
        .wait_for_text("#msg-alice-1 .read-count", "1 read", Duration::from_secs(30))
        .await;
    everyone.wait_for("#msg-carol-1", Duration::from_secs(30)).await;
    everyone.click("#msg-alice-1 .read-count").await;
    everyone
        .wait_for_text("#who-alice", "#1 read by: bob", Duration::from_secs(30))
        .await;
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-all.png");
    std::fs::write(&path, everyone.screenshot().await).unwrap();
    println!("screenshot: {}", path.display());
    everyone.close().await;
    alice.close().await;
    bob.close().await;
    stop(gateway, processor);
}

/// Waits until `watch` (a connection subscribed to the conversation) sees
/// `user`'s messages delivered through `seq`.
async fn until_delivered(watch: &mut WsClient, user: &str, seq: u64) {
    watch
        .until(Duration::from_secs(30), |f| {
            is_cursor_of(f, user) && f["delivered"].as_u64() >= Some(seq)
        })
        .await;
}

/// The sender's page shows each message's ticks move: one grey check when
/// sent, two grey once it reached every other member (bob's page reports it
/// as a phone would, carol's phone through another client), two blue once
/// they all read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_shows_ticks_move_from_grey_to_blue() {
    let env = TestEnv::new("gw-browser-ticks", 2).await;
    let processor = env.spawn("a");
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__DEMO", "true")]).await;
    let driver = Driver::start().await;
    let conversation = unique("ticks");
    let page = |who: &str| {
        format!("http://{addr}/demo/?conversation={conversation}&members=alice,bob,carol&as={who}")
    };
    let mut alice = driver.browser().await;
    let mut bob = driver.browser().await;
    alice.open(&page("alice")).await;
    bob.open(&page("bob")).await;
    wait_subscribed(&mut alice, "alice", &gateway, &processor).await;
    wait_subscribed(&mut bob, "bob", &gateway, &processor).await;
    // Another device of alice's, to know when a delivery has been pushed.
    let mut watch = connect(&addr, "alice").await;
    assert_eq!(subscribe(&mut watch, &conversation).await["type"], "snapshot");
    let carol = env.producer();
    let ticks = |seq: u64, reach: &str| format!("#msg-alice-{seq} .ticks.{reach}");
    let wait = Duration::from_secs(30);

    // #1 reaches bob's page, which reports it; carol's phone is off.
    alice.type_text("#text-alice", "Lunch at noon?").await;
    alice.click("#send-alice").await;
    alice.wait_for(&ticks(1, "sent"), wait).await;
    until_delivered(&mut watch, "bob", 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    alice.wait_for(&ticks(1, "sent"), Duration::ZERO).await;
    // Carol's phone gets it: two grey.
    carol.report(&delivery(&conversation, "carol", 1)).await.unwrap();
    alice.wait_for(&ticks(1, "delivered"), wait).await;
    // Bob reads it on his page, carol on her phone: two blue.
    bob.wait_for("#msg-bob-1", wait).await;
    bob.click("#read-bob").await;
    carol.report(&report(&conversation, "carol", 1)).await.unwrap();
    alice.wait_for(&ticks(1, "read"), wait).await;

    // #2 reaches both, #3 only bob's page.
    alice.type_text("#text-alice", "I'll book a table").await;
    alice.click("#send-alice").await;
    alice.wait_for("#msg-alice-2", wait).await;
    until_delivered(&mut watch, "bob", 2).await;
    carol.report(&delivery(&conversation, "carol", 2)).await.unwrap();
    alice.wait_for(&ticks(2, "delivered"), wait).await;
    alice.type_text("#text-alice", "Bring the slides").await;
    alice.click("#send-alice").await;
    alice.wait_for("#msg-alice-3", wait).await;
    until_delivered(&mut watch, "bob", 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (seq, reach) in [(1, "read"), (2, "delivered"), (3, "sent")] {
        alice.wait_for(&ticks(seq, reach), Duration::ZERO).await;
    }
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-ticks-alice.png");
    std::fs::write(&path, alice.screenshot().await).unwrap();
    println!("screenshot: {}", path.display());

    // alice's and bob's panes side by side, for the docs: a new page of
    // theirs starts from the snapshot and shows the same ticks.
    let mut both = driver.browser().await;
    both.open(&page("alice,bob")).await;
    for (seq, reach) in [(1, "read"), (2, "delivered"), (3, "sent")] {
        both.wait_for(&ticks(seq, reach), wait).await;
    }
    both.wait_for_text("#msg-alice-1 .read-count", "2 read", wait)
        .await;
    both.wait_for_text("#badge-bob", "2", wait).await;
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-ticks.png");
    std::fs::write(&path, both.screenshot().await).unwrap();
    println!("screenshot: {}", path.display());
    both.close().await;
    alice.close().await;
    bob.close().await;
    stop(gateway, processor);
}

/// `who` sends `text` from their pane of a demo page, message `seq`.
pub(crate) async fn say(page: &mut Browser, who: &str, text: &str, seq: u64) {
    page.type_text(&format!("#text-{who}"), text).await;
    page.click(&format!("#send-{who}")).await;
    page.wait_for(&format!("#msg-{who}-{seq}"), Duration::from_secs(30))
        .await;
}

/// Mentions typed on the demo page count on the mentioned members' panes
/// ("@3", "@99+" past 99) and go once read; a muted conversation's unread
/// badge is grey, and its app badge counts only mentions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_shows_mentions_and_a_muted_conversation() {
    let env = TestEnv::new("gw-browser-mentions", 2).await;
    let processor = env.spawn("a");
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__DEMO", "true")]).await;
    let driver = Driver::start().await;
    let conversation = unique("mentions");
    let mut page = open_demo_page(&driver, &addr, &conversation, &gateway, &processor).await;
    let wait = Duration::from_secs(30);
    say(&mut page, "alice", "Standup in 5, @bob", 1).await;
    say(&mut page, "carol", "@all the release is out", 2).await;
    page.wait_for_text("#mentions-bob", "@2", wait).await;
    page.wait_for_text("#mentions-alice", "@1", wait).await;
    // carol mutes the chat, and is named in it after.
    page.click("#mute-carol").await;
    page.wait_for_text("#muted-carol", "muted", wait).await;
    page.wait_for_text("#mute-carol", "Unmute", wait).await;
    say(&mut page, "alice", "@bob can you review it?", 3).await;
    say(&mut page, "alice", "@carol your notes?", 4).await;
    page.wait_for_text("#mentions-bob", "@3", wait).await;
    page.wait_for_text("#badge-bob", "4", wait).await;
    page.wait_for_text("#app-bob", "app badge 4", wait).await;
    page.wait_for_text("#mentions-carol", "@1", wait).await;
    page.wait_for_text("#badge-carol", "2", wait).await;
    page.wait_for("#badge-carol.muted", wait).await;
    page.wait_for_text("#app-carol", "app badge 1", wait).await;
    page.wait_for("#msg-carol-4.mentions-me", Duration::ZERO).await;
    // alice read past carol's @all when she wrote #3.
    page.wait_for_text("#mentions-alice", "", wait).await;
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-mentions.png");
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());

    // Read, the mentions go; unmuted, the badge is red again.
    page.click("#read-bob").await;
    page.wait_for_text("#mentions-bob", "", wait).await;
    page.wait_for_text("#app-bob", "app badge 0", wait).await;
    page.click("#mute-carol").await;
    page.wait_for_text("#muted-carol", "", wait).await;
    page.wait_for("#badge-carol:not(.muted):not(.zero)", wait).await;
    page.wait_for_text("#app-carol", "app badge 2", wait).await;
    // Past 99 mentions a pane says "99+".
    let producer = env.producer();
    for seq in 5..=124 {
        let named = event(
            &conversation,
            seq,
            EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                sender_id: "alice".into(),
                mentions: vec!["bob".into()],
                mention_all: false,
            },
        );
        producer.event(&named).await.unwrap();
    }
    page.wait_for_text("#mentions-bob", "@99+", wait).await;
    page.close().await;
    stop(gateway, processor);
}

/// The gateway's followers start at the changelogs' end as of their start,
/// looked up before they return: a record committed right after that is
/// read, never skipped. (librdkafka's own `Offset::End` is resolved some
/// time after the assignment; a room loaded from the stores in between
/// missed a join for good, and a demo page waited for it forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_shows_a_big_groups_n_read_live() {
    let env = TestEnv::new("gw-browser-big", 2).await;
    let processor = env.spawn("a");
    let (gateway, addr) = spawn_gateway(
        &env,
        &[
            ("READFOLD__GATEWAY__DEMO", "true"),
            ("READFOLD__GATEWAY__BATCH_FROM_MEMBERS", "100"),
        ],
    )
    .await;
    let driver = Driver::start().await;
    let conversation = unique("big");
    let mut alice = driver.browser().await;
    alice
        .open(&format!(
            "http://{addr}/demo/?conversation={conversation}&members=alice,bob&crowd=120&as=alice,bob"
        ))
        .await;
    let started = std::time::Instant::now();
    while !alice.text("#status-alice").await.starts_with("subscribed") {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "alice never subscribed; the page says {:?} (setup: {:?})\nthe gateway's log ends:\n{}",
            alice.text("#status-alice").await,
            alice.text("#setup").await,
            tail(&gateway.log_text(), 40)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    alice.click("#send-alice").await;
    alice
        .wait_for_text("#msg-alice-1 .read-count", "0 read", Duration::from_secs(30))
        .await;
    // The read counts are pushed: the status says so once one arrives.
    let started = std::time::Instant::now();
    while !alice.text("#status-alice").await.contains("big group of 122") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no read_counts frame: {:?}",
            alice.text("#status-alice").await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Each click: the 25 crowd members furthest behind read everything.
    for n in [25, 50] {
        alice.click("#crowd-read").await;
        alice
            .wait_for_text(
                "#msg-alice-1 .read-count",
                &format!("{n} read"),
                Duration::from_secs(30),
            )
            .await;
    }
    alice
        .wait_for_text("#badge-bob", "1", Duration::from_secs(30))
        .await;
    alice.click("#read-bob").await;
    alice
        .wait_for_text("#msg-alice-1 .read-count", "51 read", Duration::from_secs(30))
        .await;
    // Bob's own state rides on the read counts: his badge clears.
    alice
        .wait_for_text("#badge-bob", "0", Duration::from_secs(30))
        .await;
    // The crowd's phones reported nothing: one grey check.
    alice.wait_for("#msg-alice-1 .ticks.sent", Duration::ZERO).await;
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-big.png");
    std::fs::write(&path, alice.screenshot().await).unwrap();
    println!("screenshot: {}", path.display());
    alice.close().await;
    stop(gateway, processor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_from_the_end_reads_what_is_committed_right_after_it_starts() {
    use readfold_kafka::reader::{TopicReader, Until};
    use std::ops::ControlFlow;
    let env = TestEnv::new("follow-end", 1).await;
    let topic = env.config.topics.read_reports.clone();
    let producer = env.producer();
    // Records before the reader starts must not be read.
    producer.report(&report("before", "u", 1)).await.unwrap();
    for round in 0..5 {
        let reader = TopicReader::new(&env.config.kafka, &unique("it.follow"), false).unwrap();
        let assigned = reader.assign_from_end(&topic, None).unwrap();
        let conversation = format!("after-{round}");
        producer.report(&report(&conversation, "u", 1)).await.unwrap();
        let (topic, mut keys) = (topic.clone(), Vec::new());
        let read = tokio::task::spawn_blocking(move || {
            reader
                .read(
                    &topic,
                    &assigned,
                    Until::End {
                        within: Duration::from_secs(30),
                    },
                    |m| {
                        use rdkafka::Message;
                        keys.push(String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned());
                        ControlFlow::Continue(())
                    },
                )
                .map(|_| keys)
        });
        let keys = read.await.unwrap().unwrap();
        assert_eq!(keys, vec![conversation], "round {round}");
    }
}
