//! `/healthz` and `/readyz` on the ops listener, as a Kubernetes probe sees
//! them: through a start, a Redis outage and a restart.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::kit::*;

/// `/readyz`'s status and body.
fn readyz(addr: &str) -> Option<(u16, Value)> {
    let (status, response) = http_get(addr, "/readyz")?;
    let body = response.split("\r\n\r\n").nth(1)?;
    Some((status, serde_json::from_str(body).ok()?))
}

/// Polls `/readyz` until `want(status, body)`; panics with the last answer.
async fn wait_readyz(addr: &str, timeout: Duration, what: &str, want: impl Fn(u16, &Value) -> bool) -> Value {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < timeout {
        if let Some((status, body)) = readyz(addr) {
            if want(status, &body) {
                return body;
            }
            last = Some((status, body));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/readyz never showed {what} within {timeout:?}; last answer: {last:?}");
}

fn check<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name} check in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_once_restored_and_not_while_a_sink_is_down() {
    let env = TestEnv::new("health", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for u in 0..10 {
        feed.report(report("C", &format!("u{u}"), 3)).await;
    }
    let mut redis = PrivateRedis::fresh();
    redis.up();
    let url = redis.url();
    let addr = free_local_addr();
    let vars = [
        ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ("READFOLD__REDIS__URL", url.as_str()),
    ];
    let mut processor = env.spawn_with("a", &vars);

    let ready = wait_readyz(&addr, Duration::from_secs(60), "ready", |status, _| status == 200).await;
    assert_eq!(ready["ready"], true, "{ready}");
    for name in ["processor", "redis", "cql"] {
        assert_eq!(check(&ready, name)["ok"], true, "{ready}");
    }
    assert_eq!(
        check(&ready, "processor")["detail"],
        "2 partition(s) restored and owned",
        "{ready}"
    );
    let (status, alive) = http_get(&addr, "/healthz").expect("healthz answers");
    assert_eq!(status, 200, "{alive}");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;

    // Redis away: not ready, saying why, yet alive (no restart wanted).
    redis.stop();
    let down = wait_readyz(&addr, Duration::from_secs(30), "Redis down", |status, body| {
        status == 503 && check(body, "redis")["ok"] == false
    })
    .await;
    assert_eq!(check(&down, "cql")["ok"], true, "{down}");
    assert_eq!(http_get(&addr, "/healthz").map(|(s, _)| s), Some(200));
    assert!(processor.is_running(), "{}", processor.log_text());

    redis.up();
    wait_readyz(
        &addr,
        Duration::from_secs(60),
        "ready after Redis came back",
        |status, _| status == 200,
    )
    .await;

    // A restart: the new process is ready once it owns and has restored
    // both partitions again, with its state intact.
    assert!(processor.terminate(Duration::from_secs(30)));
    assert!(readyz(&addr).is_none(), "the listener goes with the process");
    let mut feed = env.feed(&mut reference);
    feed.report(report("C", "u0", 7)).await;
    // This time with JSON logs, as a log shipper wants them.
    let json_vars = [vars[0], vars[1], ("READFOLD__LOG__FORMAT", "json")];
    let mut processor = env.spawn_with("a", &json_vars);
    let ready = wait_readyz(
        &addr,
        Duration::from_secs(60),
        "ready after the restart",
        |status, _| status == 200,
    )
    .await;
    assert_eq!(
        check(&ready, "processor")["detail"],
        "2 partition(s) restored and owned",
        "{ready}"
    );
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(processor.terminate(Duration::from_secs(30)));
    let lines: Vec<Value> = processor
        .log_text()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["timestamp"].is_string() && l["level"].is_string()),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l["fields"]["message"] == "left the group"),
        "{lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_api_is_ready_when_its_stores_answer() {
    let env = TestEnv::new("health-serve", 1).await;
    let mut redis = PrivateRedis::fresh();
    redis.up();
    let url = redis.url();
    let (ops, api) = (free_local_addr(), free_local_addr());
    let mut serve = env.spawn_command(
        "serve",
        "api",
        &[
            ("READFOLD__METRICS__LISTEN", ops.as_str()),
            ("READFOLD__SERVE__LISTEN", api.as_str()),
            ("READFOLD__REDIS__URL", url.as_str()),
        ],
    );
    let ready = wait_readyz(&ops, Duration::from_secs(60), "ready", |status, _| status == 200).await;
    assert_eq!(check(&ready, "redis")["ok"], true, "{ready}");
    assert_eq!(check(&ready, "cql")["ok"], true, "{ready}");
    redis.stop();
    wait_readyz(&ops, Duration::from_secs(30), "Redis down", |status, body| {
        status == 503 && check(body, "redis")["ok"] == false
    })
    .await;
    assert!(serve.terminate(Duration::from_secs(30)));
}
