//! The Grafana dashboard in `ops/grafana`: its queries, and a real
//! Prometheus (Debian's `prometheus`) to run them against.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::services::{free_local_addr, http_get};

/// Every panel's queries, with Grafana's variables filled in as Grafana
/// would: every instance, and a rate window of 30 s.
pub fn dashboard_queries() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/ops/grafana/dashboards/readfold.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".*")
                .replace("$__rate_interval", "30s");
            queries.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    queries
}

/// The metric names the dashboard queries.
pub fn dashboard_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, expr) in dashboard_queries() {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("readfold_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.insert(name);
        }
    }
    names
}

/// A Prometheus scraping one target every second; stopped when dropped.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    _dir: PathBuf,
}

impl Prometheus {
    pub async fn scraping(target: &str) -> Prometheus {
        let addr = free_local_addr();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("prometheus-{}", addr.replace([':', '.'], "-")));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: readfold\n    static_configs:\n      - targets: [\"{target}\"]\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus not found: `scripts/dev test` installs Debian's prometheus");
        let started = Instant::now();
        while http_get(&addr, "/-/ready").map(|(s, _)| s) != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "prometheus did not start"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// An instant query: Prometheus's `data.result`, or its error.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let encoded: String = form_urlencoded::byte_serialize(expr.as_bytes()).collect();
        let (_, response) = http_get(&self.addr, &format!("/api/v1/query?query={encoded}"))
            .ok_or("prometheus did not answer")?;
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let answer: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
        if answer["status"] != "success" {
            return Err(answer.to_string());
        }
        Ok(answer["data"]["result"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
