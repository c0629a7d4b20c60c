//! The shared services (Kafka, Redis, a CQL server) and private ones.
//! `scripts/dev test` starts the shared ones; a test that finds one of them
//! unreachable fails and says how to start it, never skips.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

pub fn bootstrap() -> String {
    std::env::var("READFOLD_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub fn redis_url() -> String {
    std::env::var("READFOLD_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

pub fn cql_contact_point() -> String {
    std::env::var("READFOLD_TEST_CQL").unwrap_or_else(|_| "127.0.0.1:9042".into())
}

/// Fails the test, with how to start it, when a shared service does not
/// accept connections.
pub fn require_services() {
    let redis_addr = redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_owned();
    for (name, service, addr, var) in [
        ("Kafka", "kafka", bootstrap(), "READFOLD_TEST_KAFKA"),
        ("Redis", "redis", redis_addr, "READFOLD_TEST_REDIS"),
        (
            "the CQL server",
            "cassandra",
            cql_contact_point(),
            "READFOLD_TEST_CQL",
        ),
    ] {
        let reachable = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(3)).is_ok());
        assert!(
            reachable,
            "{name} is not reachable at {addr}. Start the test services with `scripts/dev test` \
             (or `scripts/services.sh up {service}`), or point {var} at a running one."
        );
    }
    super::sweep::sweep_leftovers_once();
}

/// Tests share one Kafka, Redis and CQL server. Most only need them up
/// (shared); the fault tests that stop or restart one take them exclusively.
static SERVICES: LazyLock<Arc<RwLock<()>>> = LazyLock::new(|| Arc::new(RwLock::new(())));

pub enum ServicesGuard {
    Shared(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Exclusive(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

/// Hold while using the shared services.
pub async fn shared_services() -> ServicesGuard {
    let guard = ServicesGuard::Shared(SERVICES.clone().read_owned().await);
    require_services();
    guard
}

/// Hold while stopping or restarting a shared service.
pub async fn exclusive_services() -> ServicesGuard {
    let guard = ServicesGuard::Exclusive(SERVICES.clone().write_owned().await);
    require_services();
    guard
}

/// Runs `scripts/services.sh ACTION SERVICE`, e.g. ("down", "cassandra").
pub fn service(action: &str, name: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services.sh");
    let status = Command::new("bash")
        .args([script, action, name])
        .status()
        .expect("run services.sh");
    assert!(status.success(), "services.sh {action} {name} failed");
}

/// A shared service stopped for a fault test; started again when dropped,
/// so that a failing test does not leave it down for the others.
pub struct Outage {
    name: &'static str,
    up: bool,
}

impl Outage {
    pub fn begin(name: &'static str) -> Outage {
        service("down", name);
        Outage { name, up: false }
    }

    pub fn end(&mut self) {
        if !self.up {
            service("up", self.name);
            self.up = true;
        }
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        self.end();
    }
}

/// Sends a signal by name (TERM, KILL, STOP, CONT, ...) to a process.
pub fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// Sends a signal to every process of a process group.
pub fn send_signal_to_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .status();
}

/// A port on loopback nobody listens on.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on a local HTTP listener: the status and the whole response
/// (headers and body); `None` while nothing listens.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    Some((status, response))
}

/// The Prometheus text of the metrics listener at `addr`.
pub fn scrape(addr: &str) -> Option<String> {
    http_get(addr, "/metrics").map(|(_, body)| body)
}

/// The value of the unlabelled sample `name` on `addr`'s /metrics (0 when
/// it cannot be read or is absent).
pub fn scraped_sample(addr: &str, name: &str) -> f64 {
    scrape(addr)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// An address on loopback nobody listens on (for a spawned processor's
/// metrics endpoint).
pub fn free_local_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

pub use readfold_kafka::now_ms;

/// A name no other test or run uses: `<prefix>-<pid>-<nanos>`.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// A CQL keyspace name (letters, digits, `_`) made from `prefix`.
pub fn keyspace_name(prefix: &str) -> String {
    prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(48)
        .collect()
}

/// The second instances of the services that want logins over TLS (Kafka
/// SASL/SCRAM-SHA-512, a Redis ACL user, Cassandra's PasswordAuthenticator),
/// as `scripts/services/<name>-secure.sh env` describes them.
pub struct SecureServices {
    vars: std::collections::BTreeMap<String, String>,
}

impl SecureServices {
    /// Reads their settings; fails the test, saying how to start them, when
    /// one is not up.
    pub fn load() -> SecureServices {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut vars = std::collections::BTreeMap::new();
        for service in ["kafka-secure", "redis-secure", "cassandra-secure"] {
            let script = format!("{root}/scripts/services/{service}.sh");
            let status = Command::new("bash").arg(&script).arg("status").output().unwrap();
            assert!(
                status.status.success(),
                "{service} is not up: {}{} Start it with `scripts/dev test` or `scripts/services.sh up {service}`.",
                String::from_utf8_lossy(&status.stdout),
                String::from_utf8_lossy(&status.stderr)
            );
            let env = Command::new("bash").arg(&script).arg("env").output().unwrap();
            for line in String::from_utf8_lossy(&env.stdout).lines() {
                let Some((key, value)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) else {
                    continue;
                };
                vars.insert(key.to_owned(), value.trim_matches('\'').to_owned());
            }
        }
        SecureServices { vars }
    }

    /// One setting, by the name `env` prints.
    pub fn get(&self, name: &str) -> &str {
        self.vars
            .get(name)
            .unwrap_or_else(|| panic!("the secure services' env lacks {name}: {:?}", self.vars.keys()))
    }

    /// The three passwords readfold logs in with.
    pub fn passwords(&self) -> [&str; 3] {
        [
            self.get("READFOLD_KAFKA_SECURE_PASSWORD"),
            self.get("READFOLD_REDIS_SECURE_PASSWORD"),
            self.get("READFOLD_CQL_SECURE_PASSWORD"),
        ]
    }

    /// readfold's settings for all three, as environment variables.
    pub fn readfold_vars(&self) -> Vec<(String, String)> {
        let ca = self.get("READFOLD_KAFKA_SECURE_CA");
        [
            (
                "READFOLD__KAFKA__BOOTSTRAP_SERVERS",
                self.get("READFOLD_TEST_KAFKA_SECURE"),
            ),
            ("READFOLD__KAFKA__PROPERTIES__SECURITY_PROTOCOL", "SASL_SSL"),
            ("READFOLD__KAFKA__PROPERTIES__SASL_MECHANISM", "SCRAM-SHA-512"),
            (
                "READFOLD__KAFKA__PROPERTIES__SASL_USERNAME",
                self.get("READFOLD_KAFKA_SECURE_USER"),
            ),
            (
                "READFOLD__KAFKA__PROPERTIES__SASL_PASSWORD",
                self.get("READFOLD_KAFKA_SECURE_PASSWORD"),
            ),
            ("READFOLD__KAFKA__PROPERTIES__SSL_CA_LOCATION", ca),
            (
                "READFOLD__REDIS__URL",
                &format!(
                    "rediss://{}:{}/",
                    self.get("READFOLD_REDIS_SECURE_HOST"),
                    self.get("READFOLD_REDIS_SECURE_PORT")
                ),
            ),
            (
                "READFOLD__REDIS__USERNAME",
                self.get("READFOLD_REDIS_SECURE_USER"),
            ),
            (
                "READFOLD__REDIS__PASSWORD",
                self.get("READFOLD_REDIS_SECURE_PASSWORD"),
            ),
            (
                "READFOLD__REDIS__TLS_CA_FILE",
                self.get("READFOLD_REDIS_SECURE_CA"),
            ),
            // The driver checks the certificate against the node's IP.
            (
                "READFOLD__CQL__CONTACT_POINTS",
                &self
                    .get("READFOLD_TEST_CQL_SECURE")
                    .replace("localhost", "127.0.0.1"),
            ),
            ("READFOLD__CQL__USERNAME", self.get("READFOLD_CQL_SECURE_USER")),
            (
                "READFOLD__CQL__PASSWORD",
                self.get("READFOLD_CQL_SECURE_PASSWORD"),
            ),
            ("READFOLD__CQL__TLS", "true"),
            ("READFOLD__CQL__TLS_CA_FILE", self.get("READFOLD_CQL_SECURE_CA")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

/// The Confluent-compatible API of the schema registry the tests use
/// (`scripts/services/schema-registry.sh`); fails the test, saying how to
/// start it, when it is not up.
pub fn schema_registry_url() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let script = format!("{root}/scripts/services/schema-registry.sh");
    let status = Command::new("bash").arg(&script).arg("status").output().unwrap();
    assert!(
        status.status.success(),
        "the schema registry is not up: {}{} Start it with `scripts/dev test` or `scripts/services.sh up schema-registry`.",
        String::from_utf8_lossy(&status.stdout),
        String::from_utf8_lossy(&status.stderr)
    );
    std::env::var("READFOLD_TEST_SCHEMA_REGISTRY")
        .unwrap_or_else(|_| "http://127.0.0.1:8081/apis/ccompat/v7".into())
}

/// A private redis-server, so stopping it disturbs no other test.
pub struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    /// A Redis on a free port with an empty data folder, not started yet.
    pub fn fresh() -> PrivateRedis {
        let port = free_port();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("redis-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        PrivateRedis {
            port,
            dir,
            child: None,
        }
    }

    pub fn up(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--dir", self.dir.to_str().unwrap()])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server not found: `scripts/services.sh up redis` installs it");
        self.child = Some(child);
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("private redis did not start");
    }

    /// SIGTERM: Redis writes its append-only file and exits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            send_signal(child.id(), "TERM");
            let _ = child.wait();
        }
    }

    /// SIGSTOP or SIGCONT: a frozen Redis accepts connections but never answers.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            send_signal(child.id(), signal);
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.signal("CONT");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// xorshift: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
