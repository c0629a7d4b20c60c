//! Child processes: `readfold` commands, run as processes of their own so
//! that each one's CPU time and memory are measured apart from the bench,
//! and this binary's own hidden subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use readfold::config::Config;

use crate::error::{Error, Result};

/// A child process, killed when dropped.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// The child's exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.0.try_wait().ok().flatten()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGTERM, then waits for the clean stop (a processor writes its
/// checkpoints and leaves the group); returns how long it took.
pub fn stop(mut child: ChildGuard) -> Result<Duration> {
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.pid().to_string()])
        .status()
        .map_err(Error::io("kill"))?;
    if !status.success() {
        return Err(Error::Signal {
            child: "readfold run",
            pid: child.pid(),
            status,
        });
    }
    child.0.wait().map_err(Error::io("waiting for readfold run"))?;
    Ok(started.elapsed())
}

/// The `readfold` binary: the one built next to this one, so that a bench
/// measures the build it came with.
pub fn readfold_exe() -> Result<PathBuf> {
    let this = std::env::current_exe().map_err(Error::io("cannot find this executable"))?;
    let dir = this.parent().map(PathBuf::from).unwrap_or_default();
    let name = format!("readfold{}", std::env::consts::EXE_SUFFIX);
    // Unit tests run from the profile's `deps` folder, below the binaries.
    let mut candidates = vec![dir.join(&name)];
    if dir.file_name().is_some_and(|d| d == "deps") {
        if let Some(profile) = dir.parent() {
            candidates.push(profile.join(&name));
        }
    }
    candidates
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| Error::ReadfoldMissing(dir.join(name)))
}

/// Starts `readfold <command>` with `vars` added to the environment. Its log
/// level is `warn`, or `READFOLD_BENCH_CHILD_LOG` when set.
pub fn spawn(command: &str, vars: &[(String, String)]) -> Result<ChildGuard> {
    spawn_with(readfold_exe()?, "readfold", command, &[], vars, Stdio::null())
}

/// As [`spawn`], for this binary's hidden `command` with `args`, with its
/// stdout piped to this process.
pub fn spawn_own_piped(command: &str, args: &[String], vars: &[(String, String)]) -> Result<ChildGuard> {
    let exe = std::env::current_exe().map_err(Error::io("cannot find this executable"))?;
    spawn_with(exe, "readfold-bench", command, args, vars, Stdio::piped())
}

fn spawn_with(
    exe: PathBuf,
    name: &str,
    command: &str,
    args: &[String],
    vars: &[(String, String)],
    stdout: Stdio,
) -> Result<ChildGuard> {
    let child = Command::new(exe)
        .arg(command)
        .args(args)
        .envs(vars.iter().cloned())
        .env(
            "READFOLD_LOG",
            std::env::var("READFOLD_BENCH_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(stdout)
        .spawn()
        .map_err(|source| Error::Spawn {
            command: format!("{name} {command}"),
            source,
        })?;
    Ok(ChildGuard(child))
}

/// The whole response (status line, headers, body) of `GET path` on a
/// child's HTTP listener.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// The Prometheus text of a child's `/metrics`.
pub fn scrape(addr: &str) -> std::io::Result<String> {
    http_get(addr, "/metrics")
}

/// The environment that points a child at `config`'s broker, topics, group
/// and Redis key prefix.
pub fn config_vars(config: &Config) -> Vec<(String, String)> {
    let t = &config.topics;
    [
        (
            "READFOLD__KAFKA__BOOTSTRAP_SERVERS",
            config.kafka.bootstrap_servers.clone(),
        ),
        ("READFOLD__KAFKA__GROUP_ID", config.kafka.group_id.clone()),
        ("READFOLD__KAFKA__INSTANCE_ID", "bench".into()),
        ("READFOLD__TOPICS__READ_REPORTS", t.read_reports.clone()),
        (
            "READFOLD__TOPICS__CONVERSATION_EVENTS",
            t.conversation_events.clone(),
        ),
        ("READFOLD__TOPICS__READ_CURSORS", t.read_cursors.clone()),
        ("READFOLD__TOPICS__USER_READ_CURSORS", t.user_read_cursors.clone()),
        ("READFOLD__TOPICS__MEMBER_STATE", t.member_state.clone()),
        ("READFOLD__TOPICS__THREAD_CURSORS", t.thread_cursors.clone()),
        (
            "READFOLD__TOPICS__USER_THREAD_CURSORS",
            t.user_thread_cursors.clone(),
        ),
        ("READFOLD__TOPICS__THREAD_STATE", t.thread_state.clone()),
        ("READFOLD__TOPICS__DLQ", t.dlq.clone()),
        ("READFOLD__BADGE__GROUP_ID", config.badge.group_id.clone()),
        ("READFOLD__BADGE__USER_BADGES", config.badge.user_badges.clone()),
        ("READFOLD__BADGE__USER_ACTIONS", config.badge.user_actions.clone()),
        ("READFOLD__REDIS__URL", config.redis.url.clone()),
        ("READFOLD__REDIS__KEY_PREFIX", config.redis.key_prefix.clone()),
        ("READFOLD__CQL__CONTACT_POINTS", config.cql.contact_points.clone()),
        ("READFOLD__CQL__KEYSPACE", config.cql.keyspace.clone()),
        (
            "READFOLD__FLUSH__INTERVAL_MS",
            config.flush.interval_ms.to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Resident memory of process `pid` now, in bytes.
pub fn rss_of(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:")
}

/// Peak resident memory of process `pid`, in bytes.
pub fn peak_rss_of(pid: u32) -> u64 {
    status_kb(pid, "VmHWM:")
}

/// CPU seconds (user + system) process `pid` used so far; "self" for this one.
pub fn cpu_secs_of(pid: &str) -> f64 {
    // /proc/PID/stat fields 14 and 15: utime and stime in clock ticks.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let ticks = stat_field(&s, 11)?.parse::<f64>().ok()? + stat_field(&s, 12)?.parse::<f64>().ok()?;
            Some(ticks / 100.0)
        })
        .unwrap_or(0.0)
}

/// Field `index` of /proc/PID/stat text counted from the one after the
/// command name (0: the state), since the name, in parentheses, may hold
/// spaces.
pub fn stat_field(stat: &str, index: usize) -> Option<&str> {
    stat.rsplit_once(')')?.1.split_whitespace().nth(index)
}

/// Resident memory of this process, from /proc/self/statm.
pub fn resident_bytes() -> u64 {
    // /proc/self/statm: size resident ... in pages.
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// A free TCP address on this machine.
pub fn free_addr() -> Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(Error::io("cannot find a free local port"))
}
