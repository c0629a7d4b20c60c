//! Two instances in one group split the partitions and together reach the
//! same final changelog as one would, reading their records in batches
//! from the queue each assignment is routed to.

use std::time::Duration;

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_split_partitions_and_agree_with_one() {
    let env = TestEnv::new("scale", 4).await;
    let (a_metrics, b_metrics) = (free_local_addr(), free_local_addr());
    let mut a = env.spawn_with("a", &[("READFOLD__METRICS__LISTEN", a_metrics.as_str())]);
    let mut b = env.spawn_with("b", &[("READFOLD__METRICS__LISTEN", b_metrics.as_str())]);
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    for round in 0..5i64 {
        for c in 0..40 {
            let conv = format!("group-{c}");
            feed.event(sent(&conv, "sender", round + 1)).await;
            for u in 0..5 {
                // Out of order and with duplicates on purpose.
                let seq = (round + 1 + (u + c) % 3 - 1).max(1);
                feed.report(report(&conv, &format!("user-{u}"), seq)).await;
            }
        }
    }
    let log = env.wait_for_reference(&reference, Duration::from_secs(90)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());
    let assigned = |p: &Processor| {
        p.log_text()
            .lines()
            .rfind(|l| l.contains("partitions assigned"))
            .map(|l| l.contains("read_reports=[") && !l.contains("read_reports=[]"))
            .unwrap_or(false)
    };
    assert!(assigned(&a), "instance a got no partitions:\n{}", a.log_text());
    assert!(assigned(&b), "instance b got no partitions:\n{}", b.log_text());
    // Through the rebalances of b joining, every record came from the
    // routed queue, none from the consumer's own.
    assert_all_routed(&a_metrics, &a);
    assert_all_routed(&b_metrics, &b);
    assert!(a.terminate(Duration::from_secs(30)));
    assert!(b.terminate(Duration::from_secs(30)));
}
