//! Redis: hot cursors, one hash per conversation. The write half max-merges
//! with one Lua script (`merge.lua`) called with EVALSHA, one call per few
//! dozen conversations, in pipelines; the read half reads a conversation's
//! keys in one round trip.
//!
//! For conversation C, with prefix P:
//! - `P:{C}:cursors` hash user -> public cursor, for every present member;
//! - `P:{C}:latest`  the latest seq;
//! - `P:{C}:joined`  hash user -> join_seq, only where it is above 1;
//! - `P:{C}:epoch`   hash user -> membership epoch, which orders joins and
//!   departures (only where it is above 0);
//! - `P:{C}:delivered` hash user -> delivered cursor, only where a write
//!   carried one above the cursor: readers take the higher of the two.
//!
//! For user U, what only U's own devices see (`merge_private.lua`):
//! - `P:user:{U}:private` hash conversation -> private cursor;
//! - `P:user:{U}:marks`   hash conversation -> `<at>:<seq>` of the latest
//!   mark-as-unread action (seq -1: cleared);
//! - `P:user:{U}:mentions` hash conversation -> `<read>:<s1>,<s2>,...`, the
//!   highest read point written and the mentioned seqs above it, joined
//!   order-independently (see [`crate::mentions`]);
//! - `P:user:{U}:mute`    hash conversation -> `<at>:<until>` of the latest
//!   mute or unmute (until `i64::MAX`: until unmuted; `i64::MIN`: unmuted).
//!
//! Threads have keys of their own in the same slots (see `threads.rs`).

mod badge;
mod config;
mod read;
mod threads;
mod write;

use std::time::Duration;

use readfold_core::flush::{ConversationBatch, UserBatch};
use readfold_core::{ConversationId, ConversationView};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub use badge::badge_key;
pub use config::RedisConfig;
pub use read::{MemberView, PrivateState, UserViews};
pub use threads::{FollowedThread, UserThread, MERGE_THREADS_SCRIPT, MERGE_THREAD_PRIVATE_SCRIPT};
pub use write::{calls, MERGE_PRIVATE_SCRIPT, MERGE_SCRIPT};

use crate::error::{Error, Result};
use crate::CursorStore;

/// used_cpu_sys plus used_cpu_user of an `INFO cpu` answer.
fn used_cpu_secs(info: &str) -> Option<f64> {
    Some(info_field::<f64>(info, "used_cpu_sys")? + info_field::<f64>(info, "used_cpu_user")?)
}

/// The value of `name` in an `INFO` answer ("name:value" lines).
fn info_field<T: std::str::FromStr>(info: &str, name: &str) -> Option<T> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// Keys of one conversation, as [`keys`] lists them and the merge script
/// takes them.
pub const KEYS_PER_CONVERSATION: usize = 5;

/// The Redis keys of one conversation: cursors, latest, joined, epoch,
/// delivered. The braces are a Redis Cluster hash tag: all keys of a
/// conversation live in one slot, as a script call of one conversation
/// needs.
pub fn keys(prefix: &str, conversation_id: &str) -> [String; KEYS_PER_CONVERSATION] {
    [
        format!("{prefix}:{{{conversation_id}}}:cursors"),
        format!("{prefix}:{{{conversation_id}}}:latest"),
        format!("{prefix}:{{{conversation_id}}}:joined"),
        format!("{prefix}:{{{conversation_id}}}:epoch"),
        format!("{prefix}:{{{conversation_id}}}:delivered"),
    ]
}

/// The Redis keys of one user's private state: private cursors, marks,
/// unread mentions, mutes; one slot per user.
pub fn user_keys(prefix: &str, user_id: &str) -> [String; 4] {
    [
        format!("{prefix}:user:{{{user_id}}}:private"),
        format!("{prefix}:user:{{{user_id}}}:marks"),
        format!("{prefix}:user:{{{user_id}}}:mentions"),
        format!("{prefix}:user:{{{user_id}}}:mute"),
    ]
}

/// A connection to the Redis that holds the hot cursors. Clones share the
/// connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    script: redis::Script,
    private_script: redis::Script,
    badge_script: redis::Script,
    thread_script: redis::Script,
    thread_private_script: redis::Script,
    prefix: String,
    conversations_per_call: usize,
}

impl RedisStore {
    /// Connects for reading and writing. Writers should call
    /// [`RedisStore::connect_writer`], which also loads the script.
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        config.check().map_err(Error::Config)?;
        let client = client(config)?;
        let timeout = Duration::from_millis(config.timeout_ms);
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client, manager_config).await?;
        Ok(RedisStore {
            conn,
            script: redis::Script::new(MERGE_SCRIPT),
            private_script: redis::Script::new(MERGE_PRIVATE_SCRIPT),
            badge_script: redis::Script::new(badge::WRITE_BADGES_SCRIPT),
            thread_script: redis::Script::new(MERGE_THREADS_SCRIPT),
            thread_private_script: redis::Script::new(MERGE_THREAD_PRIVATE_SCRIPT),
            prefix: config.key_prefix.clone(),
            conversations_per_call: config.conversations_per_call,
        })
    }

    /// Connects and loads the max-merge scripts.
    pub async fn connect_writer(config: &RedisConfig) -> Result<Self> {
        let store = Self::connect(config).await?;
        store.load_script().await?;
        store.check_hash_encoding().await;
        Ok(store)
    }

    /// Warns when Redis keeps hashes of more than [`LISTPACK_ADVICE`] fields
    /// as listpacks. Best effort: managed Redis often refuses CONFIG.
    async fn check_hash_encoding(&self) {
        let mut conn = self.conn.clone();
        let answer: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("hash-max-listpack-entries")
            .query_async(&mut conn)
            .await;
        match answer {
            Ok(pair) => {
                if let Some(advice) = listpack_advice(pair.get(1).map(String::as_str)) {
                    tracing::warn!("{advice}");
                }
            }
            Err(e) => tracing::debug!(error = %e, "could not read Redis's hash-max-listpack-entries"),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// CPU time Redis has used since it started (system plus user, from
    /// `INFO cpu`), for benches that put its cost next to readfold's; None
    /// from a server that does not report it.
    pub async fn used_cpu_secs(&self) -> Result<Option<f64>> {
        let mut conn = self.conn.clone();
        let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
        Ok(used_cpu_secs(&info))
    }

    /// The server's process id as it reports it (`INFO server`), in its own
    /// PID namespace; None from a server that does not report it.
    pub async fn process_id(&self) -> Result<Option<u32>> {
        let mut conn = self.conn.clone();
        let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await?;
        Ok(info_field(&info, "process_id"))
    }

    /// Deletes every key under this store's prefix (`P:*`), a SCAN page at
    /// a time, with UNLINK (freed off Redis's main thread). Returns how many
    /// went. For benches and tests that made a prefix of their own: keys
    /// left behind grow Redis, and with it the fork of every AOF rewrite,
    /// which stalls what runs next.
    pub async fn delete_all(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let pattern = format!("{}:*", glob_escape(&self.prefix));
        let (mut cursor, mut deleted) = (0u64, 0u64);
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                let unlinked: u64 = redis::cmd("UNLINK").arg(&keys).query_async(&mut conn).await?;
                deleted += unlinked;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
    }
}

/// The largest `hash-max-listpack-entries` readfold advises. A listpack is
/// scanned from its start for each field, and a flush max-merges hundreds
/// of a group's fields at once.
const LISTPACK_ADVICE: u64 = 128;

/// What to tell the operator about Redis's `hash-max-listpack-entries`, if
/// anything.
fn listpack_advice(value: Option<&str>) -> Option<String> {
    let entries: u64 = value?.trim().parse().ok()?;
    (entries > LISTPACK_ADVICE).then(|| {
        format!(
            "Redis keeps hashes of up to {entries} fields as listpacks, which the merge \
             script scans once per field it reads or writes: for groups of {} to {entries} \
             members set hash-max-listpack-entries {LISTPACK_ADVICE} (docs/operations.md, \"Redis settings\")",
            LISTPACK_ADVICE + 1
        )
    })
}

/// `text` with Redis glob metacharacters escaped, to match as is.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// The client for `config`: its URL, the user and password apart from it
/// if given, and the CA file for TLS.
fn client(config: &RedisConfig) -> Result<redis::Client> {
    // The redis crate's URL errors never echo the URL, so no password leaks.
    let mut info = redis::IntoConnectionInfo::into_connection_info(config.url.as_str())
        .map_err(|e| Error::Config(format!("redis.url {}: {e}", config.url_for_logs())))?;
    if !config.username.is_empty() || !config.password.is_empty() {
        let mut settings = info.redis_settings().clone();
        if !config.username.is_empty() {
            settings = settings.set_username(&config.username);
        }
        if !config.password.is_empty() {
            settings = settings.set_password(&config.password);
        }
        info = info.set_redis_settings(settings);
    }
    if config.tls_ca_file.is_empty() {
        return redis::Client::open(info).map_err(|e| Error::Config(format!("redis.url: {e}")));
    }
    let root_cert = std::fs::read(&config.tls_ca_file)
        .map_err(|e| Error::Config(format!("redis.tls_ca_file {:?}: {e}", config.tls_ca_file)))?;
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    };
    redis::Client::build_with_tls(info, certificates)
        .map_err(|e| Error::Config(format!("redis.tls_ca_file {:?}: {e}", config.tls_ca_file)))
}

impl CursorStore for RedisStore {
    const NAME: &'static str = "redis";

    async fn write(&self, batches: &[ConversationBatch]) -> Result<u64> {
        self.merge(batches).await
    }

    async fn write_private(&self, batches: &[UserBatch]) -> Result<u64> {
        self.merge_private(batches).await
    }

    fn calls(&self, batches: &[ConversationBatch], private: &[UserBatch]) -> usize {
        write::calls(batches, self.conversations_per_call).count() + private.len()
    }

    async fn read(&self, conversation: &ConversationId) -> Result<Option<ConversationView>> {
        self.conversation(conversation.as_str()).await
    }

    async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{glob_escape, info_field, listpack_advice, used_cpu_secs};

    #[test]
    fn sums_system_and_user_cpu_of_info() {
        let info =
            "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\nused_cpu_sys_children:9.0\r\n";
        assert_eq!(used_cpu_secs(info), Some(3.75));
        assert_eq!(used_cpu_secs("# CPU\r\nused_cpu_sys:1.0\r\n"), None);
    }

    #[test]
    fn reads_the_process_id_of_info_server() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:18656\r\nprocess_supervised:no\r\n";
        assert_eq!(info_field::<u32>(info, "process_id"), Some(18656));
        assert_eq!(info_field::<u32>("# Server\r\n", "process_id"), None);
    }

    #[test]
    fn advises_only_above_128_listpack_entries() {
        assert!(listpack_advice(Some("512"))
            .unwrap()
            .contains("hash-max-listpack-entries 128"));
        assert_eq!(listpack_advice(Some("128")), None);
        assert_eq!(listpack_advice(Some("64")), None);
        // Unknown or unreadable: say nothing rather than guess.
        assert_eq!(listpack_advice(None), None);
        assert_eq!(listpack_advice(Some("lots")), None);
    }

    #[test]
    fn a_prefix_matches_only_itself() {
        assert_eq!(glob_escape("readfold-bench-1"), "readfold-bench-1");
        assert_eq!(glob_escape(r"a*b?[c]\d"), r"a\*b\?\[c\]\\d");
    }
}
