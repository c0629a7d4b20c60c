//! The Grafana dashboard's queries, run by a real Prometheus scraping a
//! live processor: every one is valid PromQL and returns series. (No
//! Grafana can be installed from the registries this project may use, so
//! the page a person sees is Prometheus's graph of a dashboard query.)

use std::time::{Duration, Instant};

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_series_from_a_live_processor() {
    let env = TestEnv::new("dashboard", 2).await;
    let addr = free_local_addr();
    let mut processor = env.spawn_with("a", &[("READFOLD__METRICS__LISTEN", addr.as_str())]);
    let prometheus = Prometheus::scraping(&addr).await;
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    // Load over a few scrapes, so that rates have something to show.
    for round in 1..=8 {
        for u in 0..20 {
            feed.report(report(&format!("c{}", u % 4), &format!("u{u}"), round))
                .await;
        }
        feed.producer
            .send(&env.config.topics.read_reports, "c0", Some(b"junk"), None)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;

    let queries = dashboard_queries();
    assert!(queries.len() >= 15, "{queries:?}");
    let started = Instant::now();
    let mut empty = Vec::new();
    loop {
        empty.clear();
        for (panel, expr) in &queries {
            let result = prometheus
                .query(expr)
                .unwrap_or_else(|e| panic!("{panel}: {expr} is not valid PromQL: {e}"));
            if result.is_empty() {
                empty.push((panel.clone(), expr.clone()));
            }
        }
        if empty.is_empty() || started.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(empty.is_empty(), "dashboard queries without series: {empty:#?}");
    let folded = prometheus
        .query(r#"sum(rate(readfold_records_in_total[30s]))"#)
        .unwrap();
    let rate: f64 = folded[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(rate > 0.0, "records in / s: {folded:?}");
    // The last junk record follows the last reports: the changelog can be
    // complete a scrape (1 s) before Prometheus has seen it dead-lettered.
    let started = Instant::now();
    let dead = loop {
        let dead = prometheus
            .query(r#"sum(readfold_dlq_records_total{reason="decode_error"})"#)
            .unwrap();
        if dead.first().is_some_and(|d| d["value"][1] == "8") || started.elapsed() > Duration::from_secs(30) {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(dead[0]["value"][1], "8", "{dead:?}");

    // What a person sees: the throughput panel's query, graphed.
    let driver = browser::Driver::start().await;
    let mut page = driver.browser().await;
    let query: String =
        form_urlencoded::byte_serialize(br#"sum by (topic) (rate(readfold_records_in_total[30s]))"#)
            .collect();
    page.open(&format!(
        "http://{}/classic/graph?g0.expr={query}&g0.tab=0&g0.range_input=1m",
        prometheus.addr
    ))
    .await;
    page.wait_for("#graph_container", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let png = page.screenshot().await;
    assert!(png.starts_with(b"\x89PNG"));
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-throughput.png");
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
    page.close().await;
    assert!(processor.terminate(Duration::from_secs(30)));
}
