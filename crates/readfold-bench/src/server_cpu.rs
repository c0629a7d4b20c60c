//! CPU time of the servers a bench row talks to, next to the row's own: on
//! a small machine readfold, the broker, Redis and the CQL server share the
//! cores, and a row's rate (or latency) is bounded by all of them. Redis
//! reports its own (`INFO cpu`); a broker's and a CQL server's are read
//! from /proc when exactly one Kafka server (or one Cassandra) runs on this
//! machine and readfold's addresses for it are all local. Unknown stays
//! None.

use readfold::config::Config;
use readfold_store::redis::RedisStore;

use crate::child::{cpu_secs_of, stat_field};
use crate::run_queue::ThreadWaits;

/// CPU seconds the servers used, since they started or over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ServerCpu {
    pub redis: Option<f64>,
    pub broker: Option<f64>,
    /// A local Cassandra's, with `cql.enabled`.
    pub cql: Option<f64>,
}

impl ServerCpu {
    /// What the servers used between `earlier` and `self`.
    pub fn since(self, earlier: ServerCpu) -> ServerCpu {
        let delta = |now: Option<f64>, then: Option<f64>| Some((now? - then?).max(0.0));
        ServerCpu {
            redis: delta(self.redis, earlier.redis),
            broker: delta(self.broker, earlier.broker),
            cql: delta(self.cql, earlier.cql),
        }
    }

    /// CPU seconds per second (cores) over a window of `secs`.
    pub fn per_second(self, secs: f64) -> ServerCpu {
        let rate = |cpu: Option<f64>| cpu.map(|c| c / secs);
        ServerCpu {
            redis: rate(self.redis),
            broker: rate(self.broker),
            cql: rate(self.cql),
        }
    }
}

/// Seconds the servers' threads waited for a core (see
/// [`crate::run_queue`]), in the same shape.
pub type ServerWaits = ServerCpu;

/// Each local server's threads' waits for a core so far.
#[derive(Clone, Debug, Default)]
pub struct ServerThreadWaits {
    redis: Option<ThreadWaits>,
    broker: Option<ThreadWaits>,
    cql: Option<ThreadWaits>,
}

impl ServerThreadWaits {
    /// Seconds each server waited since `earlier`.
    pub fn since(&self, earlier: &ServerThreadWaits) -> ServerWaits {
        let delta =
            |now: &Option<ThreadWaits>, then: &Option<ThreadWaits>| Some(now.as_ref()?.since(then.as_ref()?));
        ServerWaits {
            redis: delta(&self.redis, &earlier.redis),
            broker: delta(&self.broker, &earlier.broker),
            cql: delta(&self.cql, &earlier.cql),
        }
    }
}

/// Reads the servers' CPU clocks.
pub struct ServerClocks {
    redis: Option<RedisStore>,
    /// A local Redis's, for its waits (its CPU comes from `INFO cpu`).
    redis_pid: Option<u32>,
    broker_pid: Option<u32>,
    cql_pid: Option<u32>,
}

impl ServerClocks {
    pub async fn new(config: &Config) -> ServerClocks {
        let redis = match RedisStore::connect(&config.redis).await {
            Ok(store) => Some(store),
            Err(e) => {
                tracing::debug!(error = %e, "no Redis CPU figures: cannot connect");
                None
            }
        };
        let redis_pid = match &redis {
            Some(store) if redis_is_local(&config.redis.url) => store
                .process_id()
                .await
                .ok()
                .flatten()
                .filter(|&pid| is_redis(pid)),
            _ => None,
        };
        let broker_pid = if all_local(&config.kafka.bootstrap_servers) {
            local_java_pid(KAFKA_MAIN)
        } else {
            None
        };
        let cql_pid = if config.cql.enabled && all_local(&config.cql.contact_points) {
            local_java_pid(CASSANDRA_MAIN)
        } else {
            None
        };
        ServerClocks {
            redis,
            redis_pid,
            broker_pid,
            cql_pid,
        }
    }

    /// Each local server's threads' waits for a core so far.
    pub fn waits(&self) -> ServerThreadWaits {
        ServerThreadWaits {
            redis: self.redis_pid.and_then(ThreadWaits::of),
            broker: self.broker_pid.and_then(ThreadWaits::of),
            cql: self.cql_pid.and_then(ThreadWaits::of),
        }
    }

    pub async fn read(&self) -> ServerCpu {
        let redis = match &self.redis {
            Some(store) => store.used_cpu_secs().await.ok().flatten(),
            None => None,
        };
        // A server that exited (or restarted under another pid) is unknown.
        let of = |pid: Option<u32>| {
            pid.filter(|pid| std::path::Path::new(&format!("/proc/{pid}/stat")).exists())
                .map(|pid| cpu_secs_of(&pid.to_string()))
        };
        ServerCpu {
            redis,
            broker: of(self.broker_pid),
            cql: of(self.cql_pid),
        }
    }

    /// The local broker's and CQL server's priorities, when both run here:
    /// at the same one, a CQL server's snapshot bursts take the broker's
    /// cores (see docs/performance.md).
    pub fn priorities(&self) -> Option<Priorities> {
        Some(Priorities {
            broker: nice_of(self.broker_pid?)?,
            cql: nice_of(self.cql_pid?)?,
        })
    }
}

/// The CPU priorities (nice values) of a local broker and CQL server, as
/// the scheduler weighs them against each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Priorities {
    pub broker: i32,
    pub cql: i32,
}

/// A process's nice value as the scheduler weighs it against processes of
/// other sessions. Where the kernel groups each session's processes
/// (sched_autogroup), that is its session's group's value, and the services
/// scripts start each server in a session of its own; elsewhere, its own.
fn nice_of(pid: u32) -> Option<i32> {
    let grouped =
        std::fs::read_to_string("/proc/sys/kernel/sched_autogroup_enabled").is_ok_and(|v| v.trim() == "1");
    if grouped {
        if let Some(nice) = std::fs::read_to_string(format!("/proc/{pid}/autogroup"))
            .ok()
            .and_then(|text| autogroup_nice(&text))
        {
            return Some(nice);
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_nice(&stat)
}

/// The nice value in /proc/PID/autogroup: "/autogroup-504 nice 10".
fn autogroup_nice(text: &str) -> Option<i32> {
    text.split_once(" nice ")?.1.trim().parse().ok()
}

/// The nice value in /proc/PID/stat (field 19).
fn stat_nice(stat: &str) -> Option<i32> {
    stat_field(stat, 16)?.parse().ok()
}

/// Whether the Redis of `url` (as the redis crate reads it, which the store
/// connects with) listens on this machine over TCP; a Unix socket's server
/// reports no CPU here.
fn redis_is_local(url: &str) -> bool {
    use redis::ConnectionAddr::{Tcp, TcpTls};
    match redis::IntoConnectionInfo::into_connection_info(url).map(|info| info.addr().clone()) {
        Ok(Tcp(host, _) | TcpTls { host, .. }) => is_local_host(&host),
        _ => false,
    }
}

/// Whether every bootstrap server is this machine.
fn all_local(bootstrap_servers: &str) -> bool {
    bootstrap_servers.split(',').map(str::trim).all(|server| {
        let host = match server.rsplit_once(':') {
            Some((host, _port)) => host,
            None => server,
        };
        is_local_host(host)
    })
}

/// Whether `host` ("localhost", a loopback address, bracketed or not) is
/// this machine.
fn is_local_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The main classes of a Kafka server and of Cassandra.
const KAFKA_MAIN: &[u8] = b"kafka.Kafka";
const CASSANDRA_MAIN: &[u8] = b"org.apache.cassandra.service.CassandraDaemon";

/// The one process on this machine whose command line runs `main_class`;
/// None when there is none or more than one.
fn local_java_pid(main_class: &[u8]) -> Option<u32> {
    let mut found = std::fs::read_dir("/proc").ok()?.filter_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        cmdline
            .split(|&b| b == 0)
            .any(|arg| arg == main_class)
            .then_some(pid)
    });
    let pid = found.next()?;
    found.next().is_none().then_some(pid)
}

/// Whether this machine's process `pid` is a Redis server: the process
/// id Redis reports is its own namespace's (1 in a container), and may
/// name some other process here.
fn is_redis(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_end() == "redis-server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_values_are_read_from_proc_text() {
        assert_eq!(autogroup_nice("/autogroup-504 nice 10\n"), Some(10));
        assert_eq!(autogroup_nice("/autogroup-1 nice -5\n"), Some(-5));
        assert_eq!(autogroup_nice("garbage"), None);
        let stat = "4791 (java main) S 1 4790 4790 0 -1 4194560 1 0 0 0 10 20 0 0 20 10 84 0 5 0";
        assert_eq!(stat_nice(stat), Some(10));
        assert_eq!(stat_nice("4791 (java) S 1"), None);
    }

    #[test]
    fn a_window_is_the_difference_and_unknown_stays_unknown() {
        let then = ServerCpu {
            redis: Some(1.0),
            broker: None,
            cql: Some(2.0),
        };
        let now = ServerCpu {
            redis: Some(3.5),
            broker: Some(7.0),
            cql: Some(2.25),
        };
        assert_eq!(
            now.since(then),
            ServerCpu {
                redis: Some(2.5),
                broker: None,
                cql: Some(0.25),
            }
        );
        assert_eq!(
            now.since(then).per_second(0.5),
            ServerCpu {
                redis: Some(5.0),
                broker: None,
                cql: Some(0.5),
            }
        );
    }

    #[test]
    fn a_redis_url_is_local_on_loopback_over_tcp() {
        assert!(redis_is_local("redis://127.0.0.1:6379/"));
        assert!(redis_is_local("redis://:s3cr@t@localhost:6380/0"));
        assert!(redis_is_local("rediss://[::1]:6379"));
        assert!(!redis_is_local("redis://cache-1:6379"));
        assert!(!redis_is_local("redis+unix:///run/redis.sock"));
        assert!(!redis_is_local("not a url"));
    }

    #[test]
    fn only_loopback_bootstrap_servers_are_local() {
        assert!(all_local("127.0.0.1:9092"));
        assert!(all_local("localhost:9092, 127.0.0.2:9093"));
        assert!(all_local("[::1]:9092"));
        assert!(!all_local("127.0.0.1:9092,kafka-1:9092"));
        assert!(!all_local("10.0.0.5:9092"));
    }
}
