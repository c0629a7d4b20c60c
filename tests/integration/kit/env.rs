//! One test's topics, group, keys and keyspace, and the `readfold run`
//! processes it starts.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::producer::InputProducer;
use serde_json::Value;

use super::changelog::Changelog;
use super::reference::{Feed, Reference};
use super::services::*;
use readfold_wire::changelog::ChangelogKind;

/// A record's key and value bytes, as stored.
pub type RawRecord = (Option<Vec<u8>>, Option<Vec<u8>>);

/// One test's topics, group and configuration.
pub struct TestEnv {
    pub config: Config,
    pub partitions: i32,
    vars: Vec<(String, String)>,
    logs: PathBuf,
    /// Topics the test made besides the configured ones, deleted with them.
    extra_topics: std::sync::Mutex<Vec<String>>,
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

    /// With `vars` added to (or replacing) the test's settings.
    pub async fn with_vars(test: &str, partitions: i32, vars: &[(&str, &str)]) -> TestEnv {
        let overrides = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self::with_overrides(test, partitions, shared_services().await, overrides).await
    }

    /// Every record of `topic`, raw, as committed.
    pub fn raw_records(&self, topic: &str) -> Vec<RawRecord> {
        use rdkafka::Message;
        let reader = readfold_kafka::reader::TopicReader::new(&self.config.kafka, &unique("it.raw"), false)
            .expect("raw reader");
        let assigned = reader.assign_from_beginning(topic, None).expect("assign");
        let mut records = Vec::new();
        reader
            .read(
                topic,
                &assigned,
                readfold_kafka::reader::Until::End {
                    within: Duration::from_secs(30),
                },
                |m| {
                    records.push((m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)));
                    std::ops::ControlFlow::Continue(())
                },
            )
            .expect("read raw records");
        records
    }

    /// On the secure instances: every connection logs in, over TLS.
    pub async fn secure(test: &str, partitions: i32, secure: &SecureServices) -> TestEnv {
        Self::with_overrides(test, partitions, shared_services().await, secure.readfold_vars()).await
    }

    async fn with_services(test: &str, partitions: i32, services: ServicesGuard) -> TestEnv {
        Self::with_overrides(test, partitions, services, Vec::new()).await
    }

    /// The test's settings, with `overrides` replacing or adding variables.
    async fn with_overrides(
        test: &str,
        partitions: i32,
        services: ServicesGuard,
        overrides: Vec<(String, String)>,
    ) -> TestEnv {
        let prefix = unique(&format!("it.{test}"));
        let consumer_protocol = overrides
            .iter()
            .any(|(k, v)| k == "READFOLD__KAFKA__GROUP_PROTOCOL" && v == "consumer");
        let vars: Vec<(String, String)> = [
            ("READFOLD__KAFKA__BOOTSTRAP_SERVERS", bootstrap()),
            ("READFOLD__KAFKA__GROUP_ID", prefix.clone()),
            ("READFOLD__KAFKA__TRANSACTION_TIMEOUT_MS", "10000".into()),
            // A killed instance's partitions move once its session expires:
            // 10 s rather than librdkafka's 45 s, as the tests kill many.
            ("READFOLD__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS", "10000".into()),
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
            ("READFOLD__TOPICS__MEMBER_STATE", format!("{prefix}.member-state")),
            (
                "READFOLD__TOPICS__THREAD_CURSORS",
                format!("{prefix}.thread-cursors"),
            ),
            (
                "READFOLD__TOPICS__USER_THREAD_CURSORS",
                format!("{prefix}.user-thread-cursors"),
            ),
            ("READFOLD__TOPICS__THREAD_STATE", format!("{prefix}.thread-state")),
            ("READFOLD__TOPICS__DLQ", format!("{prefix}.dlq")),
            ("READFOLD__BADGE__GROUP_ID", format!("{prefix}-badges")),
            ("READFOLD__BADGE__USER_BADGES", format!("{prefix}.user-badges")),
            ("READFOLD__BADGE__USER_ACTIONS", format!("{prefix}.user-actions")),
            ("READFOLD__TOPICS__PARTITIONS", partitions.to_string()),
            ("READFOLD__FLUSH__INTERVAL_MS", "100".into()),
            ("READFOLD__METRICS__LISTEN", String::new()),
            ("READFOLD__REDIS__KEY_PREFIX", prefix.clone()),
            ("READFOLD__CQL__KEYSPACE", keyspace_name(&prefix)),
            ("READFOLD__CQL__CONTACT_POINTS", cql_contact_point()),
            ("READFOLD__SNAPSHOT__INTERVAL_MS", "300".into()),
            ("READFOLD__REDIS__URL", redis_url()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
        // The consumer protocol's session timeout is the broker's (6 s in
        // services.sh); readfold refuses a client one.
        .filter(|(k, _)| !(consumer_protocol && k == "READFOLD__KAFKA__PROPERTIES__SESSION_TIMEOUT_MS"))
        .chain(overrides.iter().cloned())
        .collect();
        let config = Config::from_sources(None, vars.clone()).expect("test config");
        let layout = ensure_topics(&config.kafka, &config.topics)
            .await
            .expect("create test topics");
        assert_eq!(layout.partitions, partitions);
        // The badge stage's, so that a test may produce to them before the
        // stage runs (the broker would create them with its own count).
        for (topic, compacted) in [
            (&config.badge.user_badges, true),
            (&config.badge.user_actions, false),
        ] {
            readfold_kafka::admin::create_topic(&config.kafka, topic, partitions, 1, compacted)
                .await
                .expect("create the badge topics");
        }
        let logs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("it-logs");
        std::fs::create_dir_all(&logs).unwrap();
        TestEnv {
            config,
            partitions,
            vars,
            logs,
            extra_topics: Default::default(),
            _services: services,
        }
    }

    /// The name of a topic of this test's own besides the configured ones
    /// (for the caller to create), deleted with them when the test passes.
    pub fn extra_topic(&self, name: &str) -> String {
        let topic = format!("{}.{name}", self.config.kafka.group_id);
        self.extra_topics.lock().unwrap().push(topic.clone());
        topic
    }

    pub fn producer(&self) -> InputProducer {
        InputProducer::new(&self.config.kafka, &self.config.topics, self.partitions).expect("input producer")
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
        self.spawn_command("run", instance, extra)
    }

    /// Starts `readfold <command>` (run, serve, ...) as a child process
    /// with this test's settings and `extra` environment variables.
    pub fn spawn_command(&self, command: &str, instance: &str, extra: &[(&str, &str)]) -> Processor {
        let log = self.logs.join(format!(
            "{}.{command}.{instance}.{}.log",
            self.config.kafka.group_id,
            now_ms()
        ));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_readfold"))
            .arg(command)
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

    /// Runs `readfold <args>` to completion with this test's settings;
    /// returns its stdout, and stderr for messages. Panics, with stderr, if
    /// it fails.
    pub async fn run_command(&self, args: &[&str]) -> (Vec<u8>, String) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let vars = self.vars.clone();
        let output = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_readfold"))
                .args(&args)
                .envs(vars)
                .env("READFOLD_LOG", "info")
                .stdin(Stdio::null())
                .output()
                .expect("start readfold")
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "readfold failed ({}):\n{stderr}",
            output.status
        );
        (output.stdout, stderr)
    }

    /// Starts `readfold run` and SIGKILLs it `times` times, each after a
    /// pseudo-random `min..min+spread` wait (from `seed`), checking each time
    /// that it had not died by itself.
    pub async fn kill_repeatedly(&self, times: usize, min: Duration, spread: Duration, mut seed: u64) {
        for i in 0..times {
            let mut p = self.spawn("a");
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let wait = min + Duration::from_millis((seed >> 33) % (spread.as_millis() as u64).max(1));
            tokio::time::sleep(wait).await;
            assert!(
                p.is_running(),
                "kill {i}: the processor died by itself:\n{}",
                p.log_text()
            );
            p.kill();
        }
    }

    /// Every committed record of a topic, in partition order, as JSON (as
    /// `readfold tail` prints it).
    pub fn read_topic(&self, topic: &str) -> Vec<Value> {
        let mut lines = Vec::new();
        readfold::tail::tail(&self.config, topic, false, None, |l| lines.push(l)).expect("read topic");
        lines
    }

    /// The by-conversation changelog, read through the changelog reader.
    pub fn changelog(&self) -> Changelog {
        Changelog::read(
            &self.config,
            &self.config.topics.read_cursors,
            ChangelogKind::ByConversation,
        )
    }

    /// The by-user changelog, read through the changelog reader.
    pub fn user_changelog(&self) -> Changelog {
        Changelog::read(
            &self.config,
            &self.config.topics.user_read_cursors,
            ChangelogKind::ByUser,
        )
    }

    pub fn dead_letters(&self) -> Vec<Value> {
        self.read_topic(&self.config.topics.dlq)
    }

    /// Polls the changelog until its final values equal the reference fold,
    /// or `timeout` passes; returns what it read last.
    pub async fn wait_for_reference(&self, reference: &Reference, timeout: Duration) -> Changelog {
        self.wait_for(timeout, |log| log.latest() == reference.expected())
            .await
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

/// How long a passing test's end waits for its topics and Redis keys to go.
const CLEAN_UP_WAIT: Duration = Duration::from_secs(15);

impl Drop for TestEnv {
    /// Deletes the test's topics and Redis keys when it passed: left on a
    /// machine that keeps the services' data, a full run's would pile up
    /// and slow the benches run after it. A failed test's stay for a look;
    /// the next run's sweep ([`super::sweep`]) removes them, and its CQL
    /// keyspace, later.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let config = self.config.clone();
        let extra = std::mem::take(&mut *self.extra_topics.lock().unwrap_or_else(|e| e.into_inner()));
        let (done, finished) = std::sync::mpsc::channel();
        // Its own runtime on its own thread: a test may drop its env on a
        // runtime's worker, where one cannot block on another.
        std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                runtime.block_on(remove_topics_and_keys(&config, &extra));
            }
            let _ = done.send(());
        });
        if finished.recv_timeout(CLEAN_UP_WAIT).is_err() {
            eprintln!("removing the test's topics and Redis keys took over {CLEAN_UP_WAIT:?}; the next run's sweep will");
        }
    }
}

async fn remove_topics_and_keys(config: &Config, extra: &[String]) {
    let topics: Vec<&str> = config
        .topics
        .names()
        .into_iter()
        .chain([&config.badge.user_badges, &config.badge.user_actions])
        .chain(extra)
        .map(String::as_str)
        .collect();
    let deleted = readfold_kafka::admin::delete_topics(&config.kafka, &topics);
    match tokio::time::timeout(Duration::from_secs(10), deleted).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("deleting the test's topics failed: {e}"),
        Err(_) => eprintln!("deleting the test's topics took over 10 s"),
    }
    let keys = async {
        readfold_store::redis::RedisStore::connect(&config.redis)
            .await?
            .delete_all()
            .await
    };
    match tokio::time::timeout(Duration::from_secs(5), keys).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!("deleting the test's Redis keys failed: {e}"),
        Err(_) => eprintln!("deleting the test's Redis keys took over 5 s"),
    }
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
