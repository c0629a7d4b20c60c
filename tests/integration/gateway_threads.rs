//! Threads at the gateway against the real broker, processor and stores: a
//! thread read on one device clears the thread on the user's other devices,
//! a reply raises their unread at once, a thread's subscribers see "N read"
//! move, and the demo page shows it in a real browser.

use std::time::Duration;

use readfold_wire::codec::{ConversationEventRecord, EventRecord};
use serde_json::{json, Value};

use crate::gateway::{answer, chat, connect, spawn_gateway, stop, subscribe, wait_subscribed};
use crate::kit::browser::Driver;
use crate::kit::*;

/// Reply `thread_seq` of thread `thread` (started by `starter`) from
/// `sender`, at the conversation's latest seq.
fn reply(
    conversation: &str,
    latest: i64,
    thread: i64,
    thread_seq: i64,
    sender: &str,
    starter: &str,
) -> ConversationEventRecord {
    ConversationEventRecord {
        conversation_id: conversation.into(),
        seq: latest,
        at: now_ms(),
        event: EventRecord::MessageSent {
            sender_id: sender.into(),
            mentions: Vec::new(),
            mention_all: false,
            thread,
            thread_seq,
            starter_id: Some(starter.into()),
        },
    }
}

fn own_thread(thread: u64, unread: u64) -> impl Fn(&Value) -> bool {
    move |f: &Value| f["type"] == "own_thread" && f["thread"] == thread && f["unread"] == unread
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_read_on_one_device_clears_it_on_the_others() {
    let env = TestEnv::new("gw-threads", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    chat(&env, &mut reference, "G", &["A", "B"], 3).await;
    let (gateway, addr) = spawn_gateway(&env, &[]).await;
    let mut phone = connect(&addr, "A").await;
    let mut laptop = connect(&addr, "A").await;
    let mut b = connect(&addr, "B").await;

    // B replies twice in the thread of A's message 1: A (the starter)
    // follows it with 2 unread, on every device.
    let mut feed = env.feed(&mut reference);
    feed.event(reply("G", 3, 1, 1, "B", "A")).await;
    feed.event(reply("G", 3, 1, 2, "B", "A")).await;
    laptop.until(Duration::from_secs(30), own_thread(1, 2)).await;
    phone.until(Duration::from_secs(30), own_thread(1, 2)).await;
    // The conversation's own state carries the thread unread.
    let snapshot = subscribe(&mut laptop, "G").await;
    assert_eq!(snapshot["own"]["thread_unread"], 2, "{snapshot}");

    // B watches the thread's cursors.
    b.send(json!({ "type": "subscribe_thread", "conversation": "G", "thread": 1 }))
        .await;
    let seen = b
        .until(Duration::from_secs(20), |f| f["type"] == "thread_snapshot")
        .await;
    let followers = &seen.last().unwrap()["followers"];
    assert!(
        followers
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["user"] == "B" && f["cursor"] == 2),
        "the replier follows at their reply: {followers}"
    );

    // A reads the thread on the phone: acknowledged; the laptop's unread
    // there goes to 0; B sees A's cursor (its "N read").
    phone
        .send(json!({ "type": "read", "conversation": "G", "thread": 1, "seq": 2, "id": "t" }))
        .await;
    let ack = answer(&mut phone).await;
    assert_eq!(ack, json!({ "type": "ack", "id": "t" }));
    let cleared = laptop.until(Duration::from_secs(30), own_thread(1, 0)).await;
    assert_eq!(cleared.last().unwrap()["thread_unread"], 0);
    b.until(Duration::from_secs(30), |f| {
        f["type"] == "thread_cursor" && f["user"] == "A" && f["cursor"] == 2
    })
    .await;

    // A third reply raises A's unread again at once, on every device.
    env.feed(&mut reference)
        .event(reply("G", 3, 1, 3, "B", "A"))
        .await;
    laptop.until(Duration::from_secs(30), own_thread(1, 1)).await;

    // Thread reads are checked: past the thread's latest reply (once the
    // wait runs out), and from a stranger.
    phone
        .send(json!({ "type": "read", "conversation": "G", "thread": 1, "seq": 5000, "id": "far" }))
        .await;
    let refused = phone
        .until(Duration::from_secs(20), |f| f["type"] == "error")
        .await;
    assert_eq!(refused.last().unwrap()["code"], "invalid_seq");
    let mut stranger = connect(&addr, "C").await;
    stranger
        .send(json!({ "type": "subscribe_thread", "conversation": "G", "thread": 1 }))
        .await;
    let refused = stranger
        .until(Duration::from_secs(20), |f| f["type"] == "error")
        .await;
    assert_eq!(refused.last().unwrap()["code"], "not_a_member");
    // B's own channel carries B's state only: B wrote every reply, so B
    // never has one unread.
    let heard = b.drain(Duration::from_secs(1)).await;
    assert!(
        heard
            .iter()
            .filter(|f| f["type"] == "own_thread")
            .all(|f| f["unread"] == 0 && f["private_cursor"] == 0),
        "{heard:?}"
    );
    stop(gateway, processor);
}

/// The demo page with two devices of alice: bob replies in alice's thread,
/// alice reads it on one device, and the other's threads badge clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_shows_a_thread_read_clearing_on_another_device() {
    let env = TestEnv::new("gw-browser-threads", 2).await;
    let processor = env.spawn("a");
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__DEMO", "true")]).await;
    let driver = Driver::start().await;
    let conversation = unique("threads");
    let mut page = driver.browser().await;
    page.open(&format!(
        "http://{addr}/demo/?conversation={conversation}&members=alice,bob&as=alice,alice,bob"
    ))
    .await;
    for who in ["alice", "alice_2", "bob"] {
        wait_subscribed(&mut page, who, &gateway, &processor).await;
    }
    page.click("#send-alice").await;
    page.wait_for("#thread-link-bob-1", Duration::from_secs(30)).await;
    page.click("#thread-link-bob-1").await;
    page.click("#reply-bob").await;
    page.wait_for("#reply-bob-1", Duration::from_secs(30)).await;
    // Alice follows her message's thread: both her devices count the reply.
    for device in ["alice", "alice_2"] {
        page.wait_for_text(
            &format!("#threads-{device}"),
            "threads 1",
            Duration::from_secs(30),
        )
        .await;
    }
    page.wait_for_text("#thread-link-alice_2-1 .dot", "1 new", Duration::from_secs(30))
        .await;
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-threads-unread.png");
    std::fs::write(&path, page.screenshot().await).unwrap();
    println!("screenshot: {}", path.display());
    // Alice reads the thread on her first device.
    page.click("#thread-link-alice-1").await;
    page.wait_for("#reply-alice-1", Duration::from_secs(30)).await;
    page.click("#read-thread-alice").await;
    page.wait_for_text("#threads-alice_2", "threads 0", Duration::from_secs(30))
        .await;
    page.wait_for_text("#thread-link-alice_2-1 .dot", "", Duration::from_secs(30))
        .await;
    // Bob's reply shows alice's read.
    page.wait_for_text("#reply-bob-1 .meta", "reply 1 · 1 read", Duration::from_secs(30))
        .await;
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-threads.png");
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
    page.close().await;
    stop(gateway, processor);
}
