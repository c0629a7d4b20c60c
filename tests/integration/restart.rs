//! A restarted processor restores its state from the changelog and never
//! publishes a lower cursor.

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_emits_no_lower_cursor() {
    let env = TestEnv::new("restart", 3).await;
    let mut reference = Reference::default();
    let convs: Vec<String> = (0..12).map(|i| format!("conv-{i}")).collect();
    let users = ["u1", "u2", "u3", "u4"];

    let mut feed = env.feed(&mut reference);
    for c in &convs {
        for (i, u) in users.iter().enumerate() {
            feed.report(report(c, u, 10 + i as i64)).await;
        }
    }
    let mut first = env.spawn("a");
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    first.kill();

    // After the crash: stale reports for every key, plus a few advances.
    let mut feed = env.feed(&mut reference);
    for c in &convs {
        for u in users {
            feed.report(report(c, u, 3)).await;
        }
        feed.report(report(c, "u1", 20)).await;
    }
    let mut second = env.spawn("a");
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(
        log.regressions().is_empty(),
        "cursors went down: {:?}",
        log.regressions()
    );
    assert!(
        second.log_text().contains("restored partition state"),
        "{}",
        second.log_text()
    );
    assert!(second.terminate(Duration::from_secs(30)), "{}", second.log_text());
}
