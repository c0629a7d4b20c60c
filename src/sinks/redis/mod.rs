//! Redis sink: hot cursors, one hash per conversation, max-merged by one Lua
//! script (`merge.lua`) called with EVALSHA, one call per conversation, one
//! pipeline per flush.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::ConversationBatch;
use crate::config::RedisConfig;
use crate::error::{Error, Result};

/// The max-merge script; see the file for its keys and arguments.
pub const MERGE_SCRIPT: &str = include_str!("merge.lua");

/// The Redis keys of one conversation. The braces are a Redis Cluster hash
/// tag: all keys of a conversation live in one slot, as the script needs.
pub fn keys(prefix: &str, conversation_id: &str) -> [String; 3] {
    [
        format!("{prefix}:{{{conversation_id}}}:cursors"),
        format!("{prefix}:{{{conversation_id}}}:latest"),
        format!("{prefix}:{{{conversation_id}}}:joined"),
    ]
}

pub struct RedisSink {
    conn: ConnectionManager,
    script: redis::Script,
    prefix: String,
}

impl RedisSink {
    pub async fn connect(config: &RedisConfig) -> Result<Self> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| Error::Config(format!("redis.url {:?}: {e}", config.url)))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(config.timeout_ms)))
            .set_response_timeout(Some(Duration::from_millis(config.timeout_ms)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client, manager_config)
            .await
            .map_err(redis_error)?;
        let sink = RedisSink {
            conn,
            script: redis::Script::new(MERGE_SCRIPT),
            prefix: config.key_prefix.clone(),
        };
        sink.load_script().await?;
        Ok(sink)
    }

    async fn load_script(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(MERGE_SCRIPT)
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        Ok(())
    }

    /// Max-merges a flush: one EVALSHA per conversation, all in one pipeline.
    /// Returns the number of fields raised.
    pub async fn write(&self, batches: &[ConversationBatch]) -> Result<u64> {
        if batches.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for batch in batches {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.get_hash()).arg(3);
            for key in keys(&self.prefix, batch.conversation_id.as_str()) {
                cmd.arg(key);
            }
            cmd.arg(batch.latest_seq.get());
            for m in &batch.members {
                let cursor = if m.left { -1 } else { m.cursor.get() as i64 };
                cmd.arg(m.user_id.as_str()).arg(cursor).arg(m.join_seq.get());
            }
            pipe.add_command(cmd);
        }
        let mut conn = self.conn.clone();
        let raised: Vec<u64> = match pipe.query_async(&mut conn).await {
            Err(e) if is_noscript(&e) => {
                // Redis restarted or flushed its script cache.
                self.load_script().await?;
                pipe.query_async(&mut conn).await.map_err(redis_error)?
            }
            other => other.map_err(redis_error)?,
        };
        Ok(raised.iter().sum())
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

fn redis_error(e: RedisError) -> Error {
    Error::Sink(format!("redis: {e}"))
}
