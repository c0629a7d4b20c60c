//! Topics, a group, Redis keys and a CQL keyspace of a bench run's own, so
//! that a run disturbs nothing else, and their clean-up after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use readfold::config::Config;
use readfold_core::fold::CursorUpdate;
use readfold_kafka::now_ms;
use readfold_wire::changelog::ChangelogEntry;

use crate::error::{Error, Result};

/// `config` on topics (the badge stage's too), groups, a Redis key prefix and
/// a CQL keyspace of their own, named `readfold-bench-<tag>-<ms>`.
pub fn on_fresh_topics(config: &Config, tag: &str) -> Config {
    let name = format!("readfold-bench-{tag}-{}", now_ms());
    let mut config = config.clone();
    let t = &mut config.topics;
    for (topic, role) in [
        (&mut t.read_reports, "read-reports"),
        (&mut t.conversation_events, "conversation-events"),
        (&mut t.read_cursors, "read-cursors"),
        (&mut t.user_read_cursors, "user-read-cursors"),
        (&mut t.member_state, "member-state"),
        (&mut t.thread_cursors, "thread-cursors"),
        (&mut t.user_thread_cursors, "user-thread-cursors"),
        (&mut t.thread_state, "thread-state"),
        (&mut t.dlq, "dlq"),
    ] {
        *topic = format!("{name}.{role}");
    }
    config.badge.user_badges = format!("{name}.user-badges");
    config.badge.user_actions = format!("{name}.user-actions");
    config.badge.group_id = format!("{name}-badges");
    config.kafka.group_id = name.clone();
    config.redis.key_prefix = name;
    config.cql.keyspace = "readfold_bench".into();
    config
}

/// Deletes a bench run's topics.
pub async fn delete_bench_topics<'a>(
    kafka: &readfold_kafka::KafkaConfig,
    names: impl IntoIterator<Item = &'a String>,
) -> Result<()> {
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    Ok(readfold_kafka::admin::delete_topics(kafka, &names).await?)
}

/// Deletes the Redis keys a bench run wrote under its own prefix (see
/// [`on_fresh_topics`]): left behind, they grow Redis, and every AOF
/// rewrite's fork with it, which stalls the runs after. Only warns on
/// failure: the figures stand.
pub async fn delete_bench_keys(redis: &readfold_store::redis::RedisConfig) {
    if !redis.enabled || redis.key_prefix.is_empty() {
        return;
    }
    let deleted = async {
        readfold_store::redis::RedisStore::connect(redis)
            .await?
            .delete_all()
            .await
    };
    match deleted.await {
        Ok(keys) => tracing::debug!(prefix = %redis.key_prefix, keys, "deleted the bench's Redis keys"),
        Err(e) => {
            tracing::warn!(prefix = %redis.key_prefix, error = %e, "could not delete the bench's Redis keys")
        }
    }
}

/// A read_committed reader of `config`'s `read-cursors` changelog, in a
/// group of its own, for a bench that watches what the processor publishes.
pub fn changelog_watcher(config: &Config) -> Result<readfold_kafka::changelog::ChangelogReader> {
    Ok(readfold_kafka::changelog::ChangelogReader::new(
        &config.kafka,
        &format!("{}-watch", config.kafka.group_id),
        &config.topics.read_cursors,
        readfold_wire::changelog::ChangelogKind::ByConversation,
        config.input.max_id_bytes,
    )?)
}

/// Follows `config`'s `read-cursors` changelog on a blocking thread,
/// handing each upsert to `each` with its arrival time (epoch ms), until
/// stopped, or dropped: a follower left running on an early return would
/// keep the runtime from shutting down.
pub struct ChangelogFollower {
    following: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl ChangelogFollower {
    pub fn start(config: &Config, mut each: impl FnMut(&CursorUpdate, i64) + Send + 'static) -> Result<Self> {
        let reader = changelog_watcher(config)?;
        reader.follow(None)?;
        let following = Arc::new(AtomicBool::new(true));
        let running = following.clone();
        let task = tokio::task::spawn_blocking(move || -> Result<()> {
            while running.load(Ordering::Relaxed) {
                reader.for_each_available(Duration::from_millis(50), |entry| {
                    if let ChangelogEntry::Upsert(update) = entry {
                        each(&update, now_ms());
                    }
                })?;
            }
            Ok(())
        });
        Ok(ChangelogFollower {
            following,
            task: Some(task),
        })
    }

    /// True until the follower stops: for other loops of the run to stop
    /// with it.
    pub fn running(&self) -> Arc<AtomicBool> {
        self.following.clone()
    }

    /// Stops following and waits for the thread.
    pub async fn stop(mut self) -> Result<()> {
        self.following.store(false, Ordering::Relaxed);
        let task = self.task.take().expect("a running follower");
        task.await.map_err(Error::task("changelog follower"))?
    }
}

impl Drop for ChangelogFollower {
    fn drop(&mut self) {
        self.following.store(false, Ordering::Relaxed);
    }
}
