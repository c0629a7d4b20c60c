//! Test harness: unique topics per test on the local broker, readfold
//! processes started and killed by their own PIDs, topic readers, and a
//! reference fold to compare against.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use readfold::codec::{ConversationEventRecord, ReadReportRecord};
use readfold::config::Config;
use readfold::domain::{ConversationId, UserId};
use readfold::fold::PartitionState;
use readfold::kafka::admin::ensure_topics;
use readfold::kafka::input::InputProducer;
use readfold::validate::{self, Limits};
use serde_json::Value;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

pub fn cql_contact_point() -> String {
    std::env::var("READFOLD_TEST_CQL").unwrap_or_else(|_| "127.0.0.1:9042".into())
}

/// A CQL keyspace name (letters, digits, `_`) unique to a test.
pub fn keyspace_name(prefix: &str) -> String {
    prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect::<String>()
        .chars()
        .take(48)
        .collect()
}

/// An address on loopback with a port nobody listens on (for the metrics
/// endpoint of a spawned processor).
pub fn free_local_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

pub fn bootstrap() -> String {
    std::env::var("READFOLD_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Sends a signal by name (TERM, KILL, STOP, CONT, ...) to a process.
pub fn send_signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
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
    ServicesGuard::Shared(SERVICES.clone().read_owned().await)
}

/// Hold while stopping or restarting a shared service.
pub async fn exclusive_services() -> ServicesGuard {
    ServicesGuard::Exclusive(SERVICES.clone().write_owned().await)
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

/// One test's topics, group and configuration.
pub struct TestEnv {
    pub config: Config,
    pub partitions: i32,
    vars: Vec<(String, String)>,
    logs: PathBuf,
    _services: ServicesGuard,
}

impl TestEnv {
    pub async fn new(test: &str, partitions: i32) -> TestEnv {
        Self::with_services(test, partitions, shared_services().await).await
    }

    /// For tests that stop or restart a shared service.
    pub async fn exclusive(test: &str, partitions: i32) -> TestEnv {
        Self::with_services(test, partitions, exclusive_services().await).await
    }

    async fn with_services(test: &str, partitions: i32, services: ServicesGuard) -> TestEnv {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        let prefix = format!("it.{test}.{}", nanos % 1_000_000_000_000);
        let vars: Vec<(String, String)> = [
            ("READFOLD__KAFKA__BOOTSTRAP_SERVERS", bootstrap()),
            ("READFOLD__KAFKA__GROUP_ID", prefix.clone()),
            ("READFOLD__KAFKA__TRANSACTION_TIMEOUT_MS", "10000".into()),
            ("READFOLD__TOPICS__READ_REPORTS", format!("{prefix}.read-reports")),
            (
                "READFOLD__TOPICS__CONVERSATION_EVENTS",
                format!("{prefix}.conversation-events"),
            ),
            ("READFOLD__TOPICS__READ_CURSORS", format!("{prefix}.read-cursors")),
            (
                "READFOLD__TOPICS__USER_READ_CURSORS",
                format!("{prefix}.user-read-cursors"),
            ),
            ("READFOLD__TOPICS__DLQ", format!("{prefix}.dlq")),
            ("READFOLD__TOPICS__PARTITIONS", partitions.to_string()),
            ("READFOLD__FLUSH__INTERVAL_MS", "100".into()),
            ("READFOLD__METRICS__LISTEN", String::new()),
            ("READFOLD__REDIS__KEY_PREFIX", prefix.clone()),
            ("READFOLD__CQL__KEYSPACE", keyspace_name(&prefix)),
            ("READFOLD__CQL__CONTACT_POINTS", cql_contact_point()),
            ("READFOLD__SNAPSHOT__INTERVAL_MS", "300".into()),
            (
                "READFOLD__REDIS__URL",
                std::env::var("READFOLD_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let config = Config::from_sources(None, vars.clone()).expect("test config");
        let layout = ensure_topics(&config).await.expect("create test topics");
        assert_eq!(layout.partitions, partitions);
        let logs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("it-logs");
        std::fs::create_dir_all(&logs).unwrap();
        TestEnv {
            config,
            partitions,
            vars,
            logs: logs.join(prefix),
            _services: services,
        }
    }

    pub fn producer(&self) -> InputProducer {
        InputProducer::new(&self.config, self.partitions).expect("input producer")
    }

    /// A producer that also folds what it sends into `reference`.
    pub fn feed<'a>(&self, reference: &'a mut Reference) -> Feed<'a> {
        Feed {
            producer: self.producer(),
            reference,
        }
    }

    /// This test's settings as environment variables.
    pub fn vars(&self) -> Vec<(String, String)> {
        self.vars.clone()
    }

    /// Starts `readfold run` as a child process with this test's settings.
    pub fn spawn(&self, instance: &str) -> Processor {
        self.spawn_with(instance, &[])
    }

    /// `spawn` with extra environment variables.
    pub fn spawn_with(&self, instance: &str, extra: &[(&str, &str)]) -> Processor {
        let log = self.logs.with_extension(format!("{instance}.{}.log", now_ms()));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_readfold"))
            .arg("run")
            .envs(self.vars.iter().cloned())
            .env("READFOLD__KAFKA__INSTANCE_ID", instance)
            .env("READFOLD_LOG", "info")
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start readfold");
        Processor {
            child: Some(child),
            log,
        }
    }

    /// Every committed record of a topic, in partition order, as JSON.
    pub fn read_topic(&self, topic: &str) -> Vec<Value> {
        let mut lines = Vec::new();
        readfold::tail::tail(&self.config, topic, false, None, |l| lines.push(l)).expect("read topic");
        lines
    }

    pub fn changelog(&self) -> Changelog {
        Changelog::from_lines(&self.read_topic(&self.config.topics.read_cursors))
    }

    pub fn user_changelog(&self) -> Changelog {
        Changelog::from_lines(&self.read_topic(&self.config.topics.user_read_cursors))
    }

    pub fn dead_letters(&self) -> Vec<Value> {
        self.read_topic(&self.config.topics.dlq)
    }

    /// Polls the changelog until `done` holds or `timeout` passes.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&Changelog) -> bool) -> Changelog {
        let started = Instant::now();
        loop {
            let log = self.changelog();
            if done(&log) {
                return log;
            }
            if started.elapsed() > timeout {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// A running `readfold run`, killed when dropped.
pub struct Processor {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Processor {
    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends a signal by name (TERM, INT, STOP, ...).
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            send_signal(child.id(), signal);
        }
    }

    /// Waits up to `timeout` for the process to exit; its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGKILL: no flush, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        send_signal(child.id(), "TERM");
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        self.kill();
    }
}

/// (conversation, user).
pub type Key = (String, String);
/// A changelog value as the tests compare it: (cursor, join_seq), or `None`
/// for a tombstone.
pub type Cursor = Option<(i64, i64)>;

/// What a changelog says: each key's committed history, in order.
#[derive(Debug, Default)]
pub struct Changelog {
    /// (conversation, user) -> successive values; `None` is a tombstone.
    pub history: BTreeMap<Key, Vec<Cursor>>,
}

impl Changelog {
    pub fn from_lines(lines: &[Value]) -> Changelog {
        let mut log = Changelog::default();
        for line in lines {
            let key = &line["key"];
            let id = (
                key["conversation_id"].as_str().unwrap().to_owned(),
                key["user_id"].as_str().unwrap().to_owned(),
            );
            let value = &line["value"];
            let entry = if value.is_null() {
                None
            } else {
                Some((
                    value["cursor"].as_i64().unwrap(),
                    value["join_seq"].as_i64().unwrap(),
                ))
            };
            log.history.entry(id).or_default().push(entry);
        }
        log
    }

    /// The latest value per key.
    pub fn latest(&self) -> BTreeMap<Key, Cursor> {
        self.history
            .iter()
            .map(|(k, v)| (k.clone(), *v.last().unwrap()))
            .collect()
    }

    /// Keys whose cursor ever went down between two values (tombstones
    /// aside: a member who leaves and rejoins keeps a cursor at least as high).
    pub fn regressions(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (key, values) in &self.history {
            let mut high = 0;
            for (cursor, _) in values.iter().flatten() {
                if *cursor < high {
                    bad.push(format!("{key:?}: {values:?}"));
                    break;
                }
                high = *cursor;
            }
        }
        bad
    }
}

/// The fold the test expects, computed in the test from what it produced.
#[derive(Default)]
pub struct Reference {
    pub state: PartitionState,
}

impl Reference {
    pub fn report(&mut self, r: &ReadReportRecord) {
        self.state
            .apply_report(&validate::read_report(r.clone(), &Limits::default()).unwrap());
    }

    pub fn event(&mut self, e: &ConversationEventRecord) {
        self.state
            .apply_event(&validate::conversation_event(e.clone(), &Limits::default()).unwrap());
    }

    /// The final changelog value per key: (cursor, join_seq), or None if left.
    pub fn expected(&self) -> BTreeMap<Key, Cursor> {
        let mut out = BTreeMap::new();
        for (c, conv) in self.state.conversations() {
            for (u, m) in &conv.members {
                let v = (!m.left).then_some((m.cursor.get() as i64, m.join_seq.get() as i64));
                out.insert((c.to_string(), u.to_string()), v);
            }
        }
        out
    }

    /// Read count of message `seq` sent by `sender`, by the reference.
    pub fn read_count(&self, conversation: &str, seq: u64, sender: &str) -> usize {
        let c: ConversationId = conversation.parse().unwrap();
        let s: UserId = sender.parse().unwrap();
        self.state
            .conversation(&c)
            .map_or(0, |c| c.read_count(readfold::domain::Seq(seq), &s))
    }
}

/// Read count of message `seq` sent by `sender`, from a changelog's latest values.
pub fn changelog_read_count(log: &Changelog, conversation: &str, seq: i64, sender: &str) -> usize {
    log.latest()
        .iter()
        .filter(|((c, u), v)| {
            c == conversation && u != sender && v.is_some_and(|(cursor, join)| join <= seq && seq <= cursor)
        })
        .count()
}

pub fn report(conversation: &str, user: &str, seq: i64) -> ReadReportRecord {
    ReadReportRecord {
        conversation_id: conversation.into(),
        user_id: user.into(),
        seq,
        device_id: None,
        reported_at: now_ms() as i64,
        private: false,
    }
}

pub fn event(conversation: &str, seq: i64, event: readfold::codec::EventRecord) -> ConversationEventRecord {
    ConversationEventRecord {
        conversation_id: conversation.into(),
        seq,
        at: now_ms() as i64,
        event,
    }
}

pub fn sent(conversation: &str, sender: &str, seq: i64) -> ConversationEventRecord {
    event(
        conversation,
        seq,
        readfold::codec::EventRecord::MessageSent {
            sender_id: sender.into(),
        },
    )
}

pub fn joined(conversation: &str, user: &str, seq: i64) -> ConversationEventRecord {
    event(
        conversation,
        seq,
        readfold::codec::EventRecord::MemberJoined { user_id: user.into() },
    )
}

/// Produces and folds into the reference in one go.
pub struct Feed<'a> {
    pub producer: InputProducer,
    pub reference: &'a mut Reference,
}

impl Feed<'_> {
    /// The seed articles' chats: the 1:1 chat of A and B in `dm`, and in
    /// `group` A, B, C with read counts 0 -> 1 -> 1, then 2 and 1, a late
    /// joiner D who reads #3, and a stale duplicate report.
    pub async fn seed_chats(&mut self, dm: &str, group: &str) {
        self.event(joined(dm, "A", 0)).await;
        self.event(joined(dm, "B", 0)).await;
        self.event(sent(dm, "A", 1)).await;
        self.report(report(dm, "B", 1)).await;
        self.event(sent(dm, "B", 2)).await;
        self.report(report(dm, "A", 2)).await;
        for m in ["A", "B", "C"] {
            self.event(joined(group, m, 0)).await;
        }
        self.event(sent(group, "A", 1)).await;
        self.report(report(group, "B", 1)).await;
        self.event(sent(group, "A", 2)).await;
        self.report(report(group, "C", 2)).await;
        self.event(joined(group, "D", 2)).await;
        self.event(sent(group, "A", 3)).await;
        self.report(report(group, "D", 3)).await;
        self.report(report(group, "C", 1)).await;
    }

    pub async fn report(&mut self, r: ReadReportRecord) {
        self.producer.report(&r).await.unwrap();
        self.reference.report(&r);
    }

    pub async fn event(&mut self, e: ConversationEventRecord) {
        self.producer.event(&e).await.unwrap();
        self.reference.event(&e);
    }
}

/// A sink batch for one conversation: members with join_seq 1.
pub fn sink_batch(conv: &str, latest: u64, members: &[(&str, u64)]) -> readfold::sinks::ConversationBatch {
    readfold::sinks::ConversationBatch {
        conversation_id: conv.parse().unwrap(),
        latest_seq: readfold::domain::Seq(latest),
        members: members
            .iter()
            .map(|(u, c)| readfold::sinks::MemberWrite {
                user_id: u.parse().unwrap(),
                cursor: readfold::domain::Seq(*c),
                join_seq: readfold::domain::Seq(1),
                left: false,
            })
            .collect(),
    }
}

/// Asserts the changelog's final values equal the reference, with a diff.
pub fn assert_matches(log: &Changelog, reference: &Reference) {
    let (got, want) = (log.latest(), reference.expected());
    let diff: HashMap<_, _> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), (got.get(k).cloned(), *v)))
        .collect();
    assert!(
        diff.is_empty(),
        "changelog differs from the reference fold (got, want): {diff:?}"
    );
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        extra.is_empty(),
        "changelog has keys the reference lacks: {extra:?}"
    );
}

/// user -> cursor from a conversation's Redis hash.
pub async fn redis_cursors(url: &str, prefix: &str, conversation: &str) -> HashMap<String, i64> {
    let [cursors, _, _] = readfold::sinks::redis::keys(prefix, conversation);
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("HGETALL")
        .arg(cursors)
        .query_async(&mut conn)
        .await
        .unwrap()
}

pub fn redis_url() -> String {
    std::env::var("READFOLD_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// Every row of `<keyspace>.cursors`: (conversation, user) -> (cursor, join_seq).
pub async fn cql_cursors(keyspace: &str) -> BTreeMap<Key, (i64, i64)> {
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(cql_contact_point())
        .build()
        .await
        .expect("connect to the CQL server");
    let Ok(result) = session
        .query_unpaged(
            format!("SELECT conversation_id, user_id, cursor, join_seq FROM {keyspace}.cursors"),
            (),
        )
        .await
    else {
        return BTreeMap::new(); // not created yet
    };
    result
        .into_rows_result()
        .unwrap()
        .rows::<(String, String, i64, i64)>()
        .unwrap()
        .map(|r| {
            let (c, u, cursor, join) = r.unwrap();
            ((c, u), (cursor, join))
        })
        .collect()
}

impl Reference {
    /// Present members only: (conversation, user) -> (cursor, join_seq).
    pub fn present(&self) -> BTreeMap<Key, (i64, i64)> {
        self.expected()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }
}
