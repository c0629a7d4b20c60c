//! Hot cursors in Redis: max-merged, whoever writes and in whatever order.

use std::collections::HashMap;
use std::time::Duration;

use readfold_store::redis::keys;
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
    let [_, latest, _] = keys(&prefix, "C");
    let latest: i64 = redis::cmd("GET")
        .arg(latest)
        .query_async(&mut redis_conn(&redis_url()).await)
        .await
        .unwrap();
    assert_eq!(latest, 300);
    // A lower value written later changes nothing.
    assert_eq!(a.write(&[sink_batch("C", 2, &[("u", 2)])]).await.unwrap(), 0);
    assert_eq!(hash(&prefix, "C").await["u"], 300);
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
    let [cursors, latest, joined_key] = keys(&prefix, "G");
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
