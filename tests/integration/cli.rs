//! The command line as an operator meets it: refusals, metrics, tail.

use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use crate::kit::*;

fn readfold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_readfold"))
}

#[test]
fn an_unknown_environment_key_is_named() {
    let out = readfold()
        .arg("check-config")
        .env("READFOLD__FLUSH__INTERVL_MS", "5")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("READFOLD__FLUSH__INTERVL_MS"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_inputs_that_are_not_co_partitioned() {
    let _services = shared_services().await;
    // `it.<test>-<pid>-<nanos>`, as the sweep of earlier runs' topics expects.
    let prefix = unique("it.copart");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let (reports, events) = (format!("{prefix}.reports"), format!("{prefix}.events"));
    let topics = [
        NewTopic::new(&reports, 3, TopicReplication::Fixed(1)),
        NewTopic::new(&events, 2, TopicReplication::Fixed(1)),
    ];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await.unwrap() {
        r.unwrap();
    }
    let out = readfold()
        .arg("run")
        .env("READFOLD__KAFKA__BOOTSTRAP_SERVERS", bootstrap())
        .env("READFOLD__TOPICS__READ_REPORTS", &reports)
        .env("READFOLD__TOPICS__CONVERSATION_EVENTS", &events)
        .env("READFOLD__TOPICS__READ_CURSORS", format!("{prefix}.cursors"))
        .env(
            "READFOLD__TOPICS__USER_READ_CURSORS",
            format!("{prefix}.user-cursors"),
        )
        .env("READFOLD__TOPICS__MEMBER_STATE", format!("{prefix}.member-state"))
        .env(
            "READFOLD__TOPICS__THREAD_CURSORS",
            format!("{prefix}.thread-cursors"),
        )
        .env(
            "READFOLD__TOPICS__USER_THREAD_CURSORS",
            format!("{prefix}.user-thread-cursors"),
        )
        .env("READFOLD__TOPICS__THREAD_STATE", format!("{prefix}.thread-state"))
        .env("READFOLD__TOPICS__DLQ", format!("{prefix}.dlq"))
        .env("READFOLD__METRICS__LISTEN", "")
        .output()
        .unwrap();
    assert!(!out.status.success(), "must refuse to start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("co-partitioned") && err.contains(&reports), "{err}");
    let made: Vec<String> = [
        "reports",
        "events",
        "cursors",
        "user-cursors",
        "member-state",
        "thread-cursors",
        "user-thread-cursors",
        "thread-state",
        "dlq",
    ]
    .iter()
    .map(|t| format!("{prefix}.{t}"))
    .collect();
    let made: Vec<&str> = made.iter().map(String::as_str).collect();
    // Best effort, as for every test: the next run's sweep takes what is left.
    let _ = admin.delete_topics(&made, &AdminOptions::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_metrics_and_tails_topics() {
    let env = TestEnv::new("metrics", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.report(report("C", "u", 3)).await;
    feed.report(report("C", "v", 4)).await;
    env.producer()
        .send(&env.config.topics.read_reports, "C", Some(b"junk"), None)
        .await
        .unwrap();

    let addr = free_local_addr();
    let mut processor = env.spawn_with("a", &[("READFOLD__METRICS__LISTEN", addr.as_str())]);
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;

    let wanted = [
        "readfold_records_in_total",
        "readfold_dlq_records_total{reason=\"decode_error\"}",
        "readfold_flushes_total{result=\"committed\"}",
        "readfold_flush_duration_seconds",
        "readfold_dirty_keys",
        "readfold_consumer_lag",
        "readfold_restores_total",
    ];
    let started = Instant::now();
    let mut body = String::new();
    while started.elapsed() < Duration::from_secs(30) {
        body = scrape(&addr).unwrap_or_default();
        if wanted.iter().all(|w| body.contains(w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for w in wanted {
        assert!(body.contains(w), "metric {w} missing from:\n{body}");
    }

    // Every series the Grafana dashboard queries exists after a run (and
    // dashboard.rs runs its queries).
    let dashboard = dashboard_metrics();
    assert!(dashboard.len() >= 10, "{dashboard:?}");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) && !dashboard.iter().all(|m| body.contains(m.as_str()))
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
        body = scrape(&addr).unwrap_or_default();
    }
    for metric in &dashboard {
        assert!(
            body.contains(&format!("{metric}{{")) || body.contains(&format!("{metric} ")),
            "the dashboard queries {metric}, which /metrics lacks:\n{body}"
        );
    }

    // `readfold tail` prints the changelog as JSON lines.
    let out = readfold()
        .args(["tail", &env.config.topics.read_cursors])
        .envs(env.vars())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["key"]["user_id"] == "v" && l["value"]["cursor"] == 4),
        "{lines:?}"
    );
    assert!(processor.terminate(Duration::from_secs(30)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_publishes_what_was_folded_and_exits_within_the_bound() {
    let env = TestEnv::new("sigterm", 2).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for u in 0..20 {
        feed.report(report("G", &format!("u{u}"), 5)).await;
    }
    let addr = free_local_addr();
    // Flushes linger for ten minutes and no snapshot is due: only the stop
    // can publish.
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
            ("READFOLD__FLUSH__LINGER_MS", "600000"),
            ("READFOLD__FLUSH__INTERVAL_MS", "600000"),
            ("READFOLD__SNAPSHOT__INTERVAL_MS", "600000"),
            ("READFOLD__SHUTDOWN__TIMEOUT_MS", "20000"),
        ],
    );
    let started = Instant::now();
    let folded = |body: &str| {
        body.lines()
            .filter(|l| l.starts_with("readfold_records_in_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    while folded(&scrape(&addr).unwrap_or_default()) < 20.0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the processor never consumed the input"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        env.changelog().latest().is_empty(),
        "nothing is published before the stop"
    );
    let stopping = Instant::now();
    assert!(
        processor.terminate(Duration::from_secs(25)),
        "{}",
        processor.log_text()
    );
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "stop took {:?}",
        stopping.elapsed()
    );
    assert_matches(&env.changelog(), &reference);
    let cql = cql_cursors(&env.config.cql.keyspace).await;
    assert_eq!(cql, reference.present(), "the stop snapshots to CQL too");
}
