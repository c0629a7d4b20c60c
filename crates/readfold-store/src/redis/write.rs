//! The write half: one EVALSHA of the max-merge script per conversation.

use readfold_core::flush::ConversationBatch;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::{keys, RedisStore};
use crate::error::Result;

/// The max-merge script; see the file for its keys and arguments.
pub const MERGE_SCRIPT: &str = include_str!("merge.lua");

impl RedisStore {
    pub(super) async fn load_script(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(MERGE_SCRIPT)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Max-merges a flush: one EVALSHA per conversation, all in one pipeline.
    /// Returns the number of fields raised.
    pub async fn merge(&self, batches: &[ConversationBatch]) -> Result<u64> {
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
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        Ok(raised.iter().sum())
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
