//! Why a bench stopped: the components' typed errors, and what a bench
//! waited for and did not see.

use std::path::PathBuf;
use std::process::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(#[from] readfold::config::ConfigError),
    #[error(transparent)]
    Kafka(#[from] readfold_kafka::Error),
    #[error(transparent)]
    Store(#[from] readfold_store::Error),
    #[error(transparent)]
    Processor(#[from] readfold_processor::Error),
    #[error("loadgen: {0}")]
    Loadgen(#[from] readfold_loadgen::Error),
    /// Replay's reader, which the raw reads and the seed design share.
    #[error("{what}: {source}")]
    Replay {
        what: &'static str,
        #[source]
        source: readfold_replay::Error,
    },
    #[error("seed design: {what}: {source}")]
    SeedDesign {
        what: &'static str,
        #[source]
        source: redis::RedisError,
    },
    #[error("WebSocket client {user}: {source}")]
    WebSocket {
        user: String,
        #[source]
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the {task} task failed: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error(
        "no readfold binary at {}, where the benches look for it (next to this one): build both \
         into the same target directory, e.g. `cargo build --release -p readfold -p readfold-bench`",
        .0.display()
    )]
    ReadfoldMissing(PathBuf),
    #[error("cannot start {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// A child process that was to keep running, or to finish its work
    /// first, exited.
    #[error("{child} exited ({status}) {when}; READFOLD_BENCH_CHILD_LOG=info shows its log")]
    Exited {
        child: &'static str,
        status: ExitStatus,
        when: &'static str,
    },
    #[error(
        "the process of group {group} (pid {pid}) exited before committing the whole backlog{}; \
         READFOLD_BENCH_CHILD_LOG=info shows why",
        unread_note(.unread)
    )]
    ExitedUncommitted {
        group: String,
        pid: u32,
        /// Why its offsets could not be read last, if they could not.
        unread: Option<rdkafka::error::KafkaError>,
    },
    #[error("the kstreams peer exited early ({status}); the end of {}:\n{tail}", .log.display())]
    PeerExited {
        status: ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("kstreams peer: bench/kstreams-peer not found (run from the repository)")]
    PeerNotFound,
    #[error("kstreams peer: mvn package failed:\n{output}")]
    PeerBuild { output: String },
    #[error("cannot signal {child} (pid {pid}): kill exited with {status}")]
    Signal {
        child: &'static str,
        pid: u32,
        status: ExitStatus,
    },
    #[error("the memory bench's child for {shape:?} failed ({status}): {output}")]
    MemoryChild {
        shape: &'static str,
        status: ExitStatus,
        output: String,
    },
    #[error("the raw consumer process printed no usage line: {output:?}")]
    NoUsage { output: String },
    #[error(
        "{connections} connections need more open files than the limit here ({limit}); raise it (ulimit -n)"
    )]
    FileLimit { connections: usize, limit: u64 },
    #[error(
        "the pipeline sustained no rate of {floor:.0} records/s or more here; \
         READFOLD_BENCH_CHILD_LOG=info shows the processor's log"
    )]
    NoSustainedRate { floor: f64 },
    #[error("a WebSocket client got no snapshot: its connection closed first, or it waited {secs} s")]
    NoSnapshot { secs: u64 },
    #[error("the probe poller stopped")]
    ProbePollerStopped,
    /// What a bench waited for did not happen in time.
    #[error("{what} within {secs} s")]
    Timeout { what: String, secs: u64 },
}

impl Error {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    pub fn task(task: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Error {
        move |source| Error::Task { task, source }
    }

    pub fn replay(what: &'static str) -> impl Fn(readfold_replay::Error) -> Error {
        move |source| Error::Replay { what, source }
    }

    pub fn websocket(user: &str) -> impl FnOnce(tokio_tungstenite::tungstenite::Error) -> Error + '_ {
        move |source| Error::WebSocket {
            user: user.to_owned(),
            source: Box::new(source),
        }
    }

    pub fn timeout(what: impl Into<String>, secs: u64) -> Error {
        Error::Timeout {
            what: what.into(),
            secs,
        }
    }
}

fn unread_note(unread: &Option<rdkafka::error::KafkaError>) -> String {
    unread
        .as_ref()
        .map(|e| format!(" (its offsets could not be read: {e})"))
        .unwrap_or_default()
}

impl From<rdkafka::error::KafkaError> for Error {
    fn from(e: rdkafka::error::KafkaError) -> Self {
        Error::Kafka(e.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
