//! The gateway with the badge stage (`readfold badges`): every device of a
//! user is sent the user's badge as it moves, and nobody else's; a device
//! that connects gets it from Redis; `mark_all_read` from one device brings
//! every device's badge to nothing.

use std::time::Duration;

use readfold_core::badge::{recount, Badge};
use readfold_core::UserId;
use serde_json::{json, Value};

use crate::gateway::{chat, connect, open_demo_page, say, spawn_gateway, stop};
use crate::kit::browser::Driver;
use crate::kit::*;

fn totals(frame: &Value) -> [u64; 4] {
    ["badge", "conversations", "messages", "mentions"].map(|f| frame[f].as_u64().unwrap())
}

fn of(badge: &Badge) -> [u64; 4] {
    [
        badge.badge,
        badge.totals.conversations,
        badge.totals.messages,
        badge.totals.mentions,
    ]
}

/// Badge frames until one shows `want`; checks that none is older than the
/// one before.
async fn until_badge(ws: &mut WsClient, want: [u64; 4], last_at: &mut i64) {
    let frames = ws
        .until(Duration::from_secs(60), |f| {
            f["type"] == "badge" && totals(f) == want
        })
        .await;
    for f in frames.iter().filter(|f| f["type"] == "badge") {
        let at = f["updated_at"].as_i64().unwrap();
        assert!(
            at >= *last_at,
            "a badge of {at} after one of {last_at}: {frames:?}"
        );
        *last_at = at;
    }
}

fn expected(reference: &Reference, env: &TestEnv, user: &str) -> [u64; 4] {
    let user: UserId = user.parse().unwrap();
    let all = recount(
        &reference.state,
        env.config.badge.rules().unwrap(),
        readfold_kafka::now_ms(),
    );
    of(&all.get(&user).copied().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_device_of_a_user_follows_their_badge_and_marks_all_read() {
    let env = TestEnv::new("gw-badges", 2).await;
    let mut reference = Reference::default();
    let processor = env.spawn("a");
    let mut stage = env.spawn_command("badges", "b1", &[]);
    chat(&env, &mut reference, "G", &["A", "U"], 3).await;
    chat(&env, &mut reference, "H", &["B", "U"], 2).await;
    let (gateway, addr) = spawn_gateway(&env, &[]).await;
    let mut phone = connect(&addr, "U").await;
    let mut laptop = connect(&addr, "U").await;
    let mut stranger = connect(&addr, "V").await;

    let want = expected(&reference, &env, "U");
    assert!(want[2] >= 5, "U has unread messages: {want:?}");
    let (mut phone_at, mut laptop_at) = (0, 0);
    until_badge(&mut phone, want, &mut phone_at).await;
    until_badge(&mut laptop, want, &mut laptop_at).await;

    // More messages: both devices follow.
    {
        let mut feed = env.feed(&mut reference);
        feed.event(sent("G", "A", 4)).await;
        feed.event(sent("H", "B", 3)).await;
    }
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let want = expected(&reference, &env, "U");
    until_badge(&mut phone, want, &mut phone_at).await;
    until_badge(&mut laptop, want, &mut laptop_at).await;

    // Mark all read from one device; both see the badge empty.
    phone.send(json!({ "type": "mark_all_read", "id": "all" })).await;
    let acked = phone
        .until(Duration::from_secs(20), |f| {
            f["type"] == "ack" || f["type"] == "error"
        })
        .await;
    assert_eq!(acked.last().unwrap(), &json!({ "type": "ack", "id": "all" }));
    for (ws, at) in [(&mut phone, &mut phone_at), (&mut laptop, &mut laptop_at)] {
        let frames = ws
            .until(Duration::from_secs(60), |f| {
                f["type"] == "badge" && f["messages"] == 0
            })
            .await;
        let last = frames.last().unwrap();
        assert_eq!(totals(last), [0, 0, 0, 0], "{frames:?}\n{}", stage.log_text());
        assert!(last["updated_at"].as_i64().unwrap() >= *at);
    }

    // A device that connects now is sent the badge Redis holds.
    let started = std::time::Instant::now();
    loop {
        let mut tablet = connect(&addr, "U").await;
        let first = tablet.next(Duration::from_secs(3)).await;
        if first
            .as_ref()
            .is_some_and(|f| f["type"] == "badge" && totals(f) == [0, 0, 0, 0])
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "a new device's first frame after welcome: {first:?}"
        );
    }
    // Nobody else is sent U's badge.
    let seen = stranger.drain(Duration::from_millis(500)).await;
    assert!(seen.iter().all(|f| f["type"] != "badge"), "{seen:?}");
    assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
    stop(gateway, processor);
}

/// The demo page shows the badge stage's badge as each pane's app badge,
/// labelled, and its "Mark all read" button brings it to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_shows_the_servers_badge_and_marks_all_read() {
    let env = TestEnv::new("gw-browser-badges", 2).await;
    let processor = env.spawn("a");
    let mut stage = env.spawn_command("badges", "b1", &[]);
    let (gateway, addr) = spawn_gateway(&env, &[("READFOLD__GATEWAY__DEMO", "true")]).await;
    let driver = Driver::start().await;
    let conversation = unique("badges");
    let mut page = open_demo_page(&driver, &addr, &conversation, &gateway, &processor).await;
    let wait = Duration::from_secs(30);
    say(&mut page, "alice", "lunch?", 1).await;
    say(&mut page, "alice", "@bob at noon", 2).await;
    say(&mut page, "carol", "yes", 3).await;
    page.wait_for("#app-bob.server", wait).await;
    page.wait_for("#app-carol.server", wait).await;
    // bob has 3 unread in one conversation, one of them naming him: the
    // count the badge stage's rules make of it.
    let rules = env.config.badge.rules().unwrap();
    let bob_badge = match rules.count {
        readfold_core::badge::BadgeCount::Conversations => 1,
        readfold_core::badge::BadgeCount::Messages => 3,
    };
    page.wait_for_text("#app-bob", &format!("app badge {bob_badge} · server"), wait)
        .await;
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gateway-demo-badge.png");
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());

    page.click("#mark-all-bob").await;
    page.wait_for_text("#status-bob", "broker acknowledged mark-all", wait)
        .await;
    page.wait_for_text("#app-bob", "app badge 0 · server", Duration::from_secs(60))
        .await;
    page.wait_for_text("#badge-bob", "0", wait).await;
    page.close().await;
    assert!(stage.terminate(Duration::from_secs(30)), "{}", stage.log_text());
    stop(gateway, processor);
}
