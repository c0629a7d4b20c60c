//! The Kafka Streams peer of the throughput bench: the Maven project in
//! `bench/kstreams-peer` (the same max-fold of read reports, Processor API,
//! no repartition, EOS v2, one thread, changed keys in a logged store),
//! built here with `mvn`, run as a child JVM on the bench's reports topic,
//! and timed from its start until its output holds every key's final
//! cursor, not merely until its input offsets are committed: it emits what
//! changed on a punctuation, after the input that changed it is committed.
//!
//! The row is skipped, with the reason, where Maven or Java is missing, the
//! project is not found, or the broker needs TLS or SASL (the peer speaks
//! plaintext only).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_wire::changelog::ChangelogEntry;
use readfold_wire::codec::{ReadAction, ReadReportRecord};

use crate::child::{cpu_secs_of, peak_rss_of, ChildGuard};
use crate::error::{Error, Result};
use crate::throughput::ThroughputRow;

/// The peer's commit interval, and so its emit interval: Kafka Streams'
/// default under exactly-once.
pub const COMMIT_INTERVAL_MS: u64 = 100;

/// (conversation, user) -> the highest public READ seq among the reports.
pub type Expected = HashMap<(String, String), u64>;

/// Adds a produced report to what the peer's output must hold: the peer
/// folds READ reports that are not private, as `Peer.java` does.
pub fn expect(expected: &mut Expected, r: &ReadReportRecord) {
    if r.action == ReadAction::Read && !r.private {
        let key = (r.conversation_id.clone(), r.user_id.clone());
        let cursor = expected.entry(key).or_insert(0);
        *cursor = (*cursor).max(r.seq.max(0) as u64);
    }
}

/// The repository's `bench/kstreams-peer` and `schemas`: from the working
/// directory, else from the repository this binary was built in.
fn project_dirs() -> Option<(PathBuf, PathBuf)> {
    [
        PathBuf::from("."),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    ]
    .into_iter()
    .map(|root| (root.join("bench/kstreams-peer"), root.join("schemas")))
    .find(|(peer, schemas)| peer.join("pom.xml").is_file() && schemas.is_dir())
}

/// Why the peer cannot run here, if it cannot.
pub fn unavailable(config: &Config) -> Option<String> {
    let secured = config
        .kafka
        .properties
        .get("security.protocol")
        .is_some_and(|p| !p.eq_ignore_ascii_case("plaintext"));
    if secured {
        return Some("the peer speaks plaintext only and the broker is secured".into());
    }
    if project_dirs().is_none() {
        return Some("bench/kstreams-peer not found (run from the repository)".into());
    }
    for tool in ["mvn", "java"] {
        let found = Command::new(tool)
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{tool}` is not on the PATH"));
        }
    }
    None
}

/// Builds the peer (not timed) and returns its class path.
fn build(peer: &Path) -> Result<String> {
    let started = Instant::now();
    let out = Command::new("mvn")
        .args(["-q", "-B", "clean", "package"])
        .current_dir(peer)
        .output()
        .map_err(|source| Error::Spawn {
            command: "mvn (the kstreams peer's build)".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::PeerBuild {
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    tracing::info!(secs = started.elapsed().as_secs_f64(), "kstreams peer built");
    let target = peer.join("target");
    Ok(format!(
        "{}:{}/*",
        target.join("classes").display(),
        target.join("lib").display()
    ))
}

/// Runs the peer on `config`'s reports topic into `config`'s two cursor
/// topics until they hold `expected`, and measures it.
pub fn kstreams_peer(config: &Config, expected: Expected, reports: u64) -> Result<ThroughputRow> {
    let (peer, schemas) = project_dirs().ok_or(Error::PeerNotFound)?;
    let class_path = build(&peer)?;
    let state_dir = std::env::temp_dir().join(format!("readfold-kstreams-peer-{}", std::process::id()));
    let reader = crate::fresh::changelog_watcher(config)?;
    reader.follow(None)?;

    let log_path = state_dir.with_extension("log");
    let log = std::fs::File::create(&log_path).map_err(Error::io(log_path.display().to_string()))?;
    let started = Instant::now();
    let child = Command::new("java")
        .args(["-cp", &class_path, "readfold.peer.Peer"])
        .args(["--bootstrap", &config.kafka.bootstrap_servers])
        .args(["--reports", &config.topics.read_reports])
        .args(["--by-conversation", &config.topics.read_cursors])
        .args(["--by-user", &config.topics.user_read_cursors])
        .args(["--application-id", &config.kafka.group_id])
        .args(["--state-dir", &state_dir.display().to_string()])
        .args(["--schemas", &schemas.display().to_string()])
        .args(["--commit-interval-ms", &COMMIT_INTERVAL_MS.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|source| Error::Spawn {
            command: "the kstreams peer".into(),
            source,
        })?;
    let mut child = ChildGuard(child);
    let pid = child.pid();

    let mut missing = expected;
    while !missing.is_empty() {
        if let Some(status) = child.exited() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            return Err(Error::PeerExited {
                status,
                log: log_path,
                tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        if started.elapsed() > Duration::from_secs(900) {
            return Err(Error::timeout(
                format!("the kstreams peer did not publish {} cursors", missing.len()),
                900,
            ));
        }
        reader.for_each_available(Duration::from_millis(200), |entry| {
            if let ChangelogEntry::Upsert(update) = entry {
                let key = (update.conversation_id.to_string(), update.user_id.to_string());
                if missing.get(&key).is_some_and(|&want| update.cursor.get() >= want) {
                    missing.remove(&key);
                }
            }
        })?;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu_secs = cpu_secs_of(&pid.to_string());
    let peak_rss = peak_rss_of(pid);
    drop(child);
    let _ = std::fs::remove_dir_all(&state_dir);
    let _ = std::fs::remove_file(&log_path);
    Ok(ThroughputRow {
        what: "Kafka Streams peer (EOS v2, 1 thread)",
        records: reports,
        secs,
        cpu_secs,
        peak_rss,
        redis_calls: 0.0,
        cql_statements: 0.0,
        flushes: 0.0,
        servers: Default::default(),
    })
}

/// The internal topics the peer's application creates (its two stores'
/// changelogs), to delete after the run.
pub fn internal_topics(config: &Config) -> Vec<String> {
    ["cursors", "changed"]
        .iter()
        .map(|store| format!("{}-{store}-changelog", config.kafka.group_id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_project_and_the_schemas_are_found_from_the_repository() {
        let (peer, schemas) = project_dirs().expect("bench/kstreams-peer and schemas/");
        assert!(peer.join("src/main/java/readfold/peer/Peer.java").is_file());
        assert!(schemas.join("ReadReport.avsc").is_file());
    }

    #[test]
    fn a_secured_broker_skips_the_peer_with_the_reason() {
        let mut config = Config::defaults();
        config
            .kafka
            .properties
            .insert("security.protocol".into(), "SASL_SSL".into());
        let why = unavailable(&config).expect("skipped");
        assert!(why.contains("plaintext"), "{why}");
    }

    #[test]
    fn the_internal_topics_are_the_two_stores_changelogs() {
        let mut config = Config::defaults();
        config.kafka.group_id = "g".into();
        assert_eq!(
            internal_topics(&config),
            ["g-cursors-changelog", "g-changed-changelog"]
        );
    }
}
