//! Leftovers of earlier test runs on the shared services: each test makes
//! its own topics (`it.<test>-<pid>-<nanos>.<topic>`) and CQL keyspace
//! (`it_<test>_<pid>_<nanos>`), and a failing or killed test cannot remove
//! them, nor its Redis keys (`it.<test>-<pid>-<nanos>:...`); a passing
//! test removes its topics and keys itself. On a machine that keeps the
//! services' data between runs they pile up, and enough keyspaces fill the
//! CQL server's heap and fail a whole run. So each test process, before
//! its first test, deletes those whose process has ended; a running test
//! process's (another `cargo test` on the same services) are left alone.
//! Whether a process runs is known only on this machine, so services
//! elsewhere are never swept; and the sweep stops after [`BUDGET`],
//! leaving the rest to the next run.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::services::{bootstrap, cql_contact_point, redis_url};
use super::stores::{cql_config, redis_conn};

/// How long the sweep may hold up the first test.
const BUDGET: Duration = Duration::from_secs(60);

/// Sweeps once per test process; later callers wait for the first.
pub fn sweep_leftovers_once() {
    static SWEPT: LazyLock<()> = LazyLock::new(|| {
        // Its own runtime on its own thread: callers may be on a runtime's
        // worker, where one cannot block on another.
        let swept = std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(sweep())
        })
        .join();
        if swept.is_err() {
            eprintln!("sweeping earlier runs' test topics and keyspaces failed; went on");
        }
    });
    LazyLock::force(&SWEPT);
}

async fn sweep() {
    if !is_local(&bootstrap()) || !is_local(&cql_contact_point()) || !is_local(&redis_host()) {
        return;
    }
    let started = Instant::now();
    let topics = match leftover_topics() {
        Ok(topics) => topics,
        Err(e) => {
            eprintln!("listing test topics failed ({e}); left them");
            Vec::new()
        }
    };
    if !topics.is_empty() {
        let kafka = readfold_kafka_config();
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        // Batches of a few hundred keep each request small.
        for chunk in names.chunks(200) {
            if started.elapsed() > BUDGET {
                break;
            }
            match tokio::time::timeout(
                Duration::from_secs(60),
                readfold_kafka::admin::delete_topics(&kafka, chunk),
            )
            .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("deleting earlier runs' test topics failed: {e}"),
                Err(_) => eprintln!("deleting earlier runs' test topics took over 60 s"),
            }
        }
    }
    let keyspaces = sweep_keyspaces(started).await;
    let keys = match sweep_redis_keys(started).await {
        Ok(keys) => keys,
        Err(e) => {
            eprintln!("sweeping earlier runs' Redis keys failed ({e}); left the rest");
            0
        }
    };
    if !topics.is_empty() || keyspaces > 0 || keys > 0 {
        eprintln!(
            "removed {} topics, {keyspaces} CQL keyspaces and {keys} Redis keys left by earlier test runs in {:.1} s",
            topics.len(),
            started.elapsed().as_secs_f64()
        );
    }
}

fn readfold_kafka_config() -> readfold_kafka::config::KafkaConfig {
    let mut kafka = readfold::config::Config::defaults().kafka;
    kafka.bootstrap_servers = bootstrap();
    kafka
}

fn leftover_topics() -> Result<Vec<String>, rdkafka::error::KafkaError> {
    let consumer: BaseConsumer = readfold_kafka_config().client_config().create()?;
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|name| {
            // `it.<test>-<pid>-<nanos>.<topic>`
            let Some(rest) = name.strip_prefix("it.") else {
                return false;
            };
            rest.rsplit_once('.')
                .and_then(|(prefix, _)| owner_pid(prefix, '-'))
                .is_some_and(ended)
        })
        .collect())
}

/// Drops ended runs' keyspaces until `started + BUDGET`; returns how many.
async fn sweep_keyspaces(started: Instant) -> usize {
    let store = match readfold_store::cql::CqlStore::connect(&cql_config("system")).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("connecting to the CQL server to sweep test keyspaces failed ({e}); left them");
            return 0;
        }
    };
    let session = store.session();
    let names: Vec<String> = match session
        .query_unpaged("SELECT keyspace_name FROM system_schema.keyspaces", &[])
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.into_rows_result().map_err(|e| e.to_string()))
        .and_then(|rows| {
            rows.rows::<(String,)>()
                .map_err(|e| e.to_string())?
                .map(|row| row.map(|(name,)| name).map_err(|e| e.to_string()))
                .collect()
        }) {
        Ok(names) => names,
        Err(e) => {
            eprintln!("listing CQL keyspaces failed ({e}); left them");
            return 0;
        }
    };
    let mut dropped = 0;
    for name in names {
        // `it_<test>_<pid>_<nanos>`
        let leftover = name
            .strip_prefix("it_")
            .and_then(|rest| owner_pid(rest, '_'))
            .is_some_and(ended);
        if !leftover {
            continue;
        }
        if started.elapsed() > BUDGET {
            eprintln!("the sweep of earlier runs' keyspaces took over {BUDGET:?}; the next run goes on");
            break;
        }
        match session
            .query_unpaged(format!("DROP KEYSPACE IF EXISTS {name}"), &[])
            .await
        {
            Ok(_) => dropped += 1,
            Err(e) => eprintln!("dropping leftover keyspace {name} failed: {e}"),
        }
    }
    dropped
}

/// Unlinks ended runs' Redis keys until `started + BUDGET`; returns how
/// many went.
async fn sweep_redis_keys(started: Instant) -> redis::RedisResult<u64> {
    let mut conn = redis_conn(&redis_url()).await;
    let (mut cursor, mut unlinked) = (0u64, 0u64);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("it.*")
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        let leftovers: Vec<&String> = keys.iter().filter(|key| leftover_key(key)).collect();
        if !leftovers.is_empty() {
            unlinked += redis::cmd("UNLINK")
                .arg(&leftovers)
                .query_async::<u64>(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(unlinked);
        }
        if started.elapsed() > BUDGET {
            eprintln!("the sweep of earlier runs' Redis keys took over {BUDGET:?}; the next run goes on");
            return Ok(unlinked);
        }
        cursor = next;
    }
}

/// Whether `key` (`it.<test>-<pid>-<nanos>:...`) is an ended run's.
fn leftover_key(key: &str) -> bool {
    key.strip_prefix("it.")
        .and_then(|rest| rest.split_once(':'))
        .and_then(|(prefix, _)| owner_pid(prefix, '-'))
        .is_some_and(ended)
}

/// The host:port of the test Redis URL.
fn redis_host() -> String {
    let url = redis_url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// The process id in `<anything><sep><pid><sep><nanos>`, as `unique`
/// makes names (its nanos are below 10^12, so at most 12 digits).
fn owner_pid(name: &str, sep: char) -> Option<u32> {
    let mut parts = name.rsplitn(3, sep);
    let nanos = parts.next()?;
    let pid = parts.next()?;
    parts.next()?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(nanos) || nanos.len() > 12 || !digits(pid) {
        return None;
    }
    pid.parse().ok().filter(|&pid| pid > 1)
}

/// Whether `address` (host:port) is on this machine, where `/proc` tells
/// which test processes still run.
fn is_local(address: &str) -> bool {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// True when no process with this id runs on this machine (the services
/// are local); a reused id only keeps a leftover for a later sweep.
fn ended(pid: u32) -> bool {
    pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn reads_the_pid_of_topic_prefixes_and_keyspaces() {
        assert_eq!(owner_pid("checkpoint-bad-4242-123456789012", '-'), Some(4242));
        assert_eq!(owner_pid("cql_race_17_99", '_'), Some(17));
        assert_eq!(owner_pid("other-value", '-'), None);
        assert_eq!(owner_pid("a-b-c", '-'), None);
        assert_eq!(owner_pid("sales_2023_-1", '_'), None);
        assert_eq!(owner_pid("x_1_2", '_'), None, "pid 1 is init, never a test");
    }

    #[test]
    fn finds_ended_runs_redis_keys() {
        // pid 2^22 + 1 is above Linux's pid_max: never a running process.
        assert!(super::leftover_key("it.serve-4194305-123:conv:C1"));
        assert!(!super::leftover_key(&format!(
            "it.serve-{}-123:conv:C1",
            std::process::id()
        )));
        assert!(
            !super::leftover_key("it.serve-4194305-123"),
            "no ':' after the prefix"
        );
        assert!(!super::leftover_key("bench-4194305-123:conv:C1"));
    }

    #[test]
    fn sweeps_only_services_on_this_machine() {
        assert!(super::is_local("127.0.0.1:9092"));
        assert!(super::is_local("localhost:9042"));
        assert!(super::is_local("[::1]:9042"));
        assert!(!super::is_local("kafka.internal:9092"));
        assert!(!super::is_local("10.0.0.5:9042"));
    }
}
