//! The write half: one EVALSHA of a max-merge script per conversation (and
//! per user with private changes), all in one pipeline.

use readfold_core::flush::{ConversationBatch, UserBatch};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::{keys, user_keys, RedisStore};
use crate::error::Result;

/// The public max-merge script; see the file for its keys and arguments.
pub const MERGE_SCRIPT: &str = include_str!("merge.lua");
/// The private max-merge script; see the file for its keys and arguments.
pub const MERGE_PRIVATE_SCRIPT: &str = include_str!("merge_private.lua");

impl RedisStore {
    pub(super) async fn load_script(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        for script in [MERGE_SCRIPT, MERGE_PRIVATE_SCRIPT] {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(script)
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Max-merges one flush's private state: one EVALSHA per user. Returns
    /// the number of private cursors raised.
    pub async fn merge_private(&self, batches: &[UserBatch]) -> Result<u64> {
        if batches.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for batch in batches {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.private_script.get_hash()).arg(2);
            for key in user_keys(&self.prefix, batch.user_id.as_str()) {
                cmd.arg(key);
            }
            for c in &batch.conversations {
                cmd.arg(c.conversation_id.as_str()).arg(c.private_cursor.get());
                match c.mark {
                    Some(mark) => cmd.arg(mark.at).arg(mark.seq.map_or(-1, |s| s.get() as i64)),
                    None => cmd.arg("").arg(""),
                };
            }
            pipe.add_command(cmd);
        }
        self.run(pipe).await
    }

    /// Runs a pipeline of script calls, loading the scripts again if Redis
    /// lost them (restarted or flushed its script cache).
    async fn run(&self, pipe: redis::Pipeline) -> Result<u64> {
        let mut conn = self.conn.clone();
        let raised: Vec<u64> = match pipe.query_async(&mut conn).await {
            Err(e) if is_noscript(&e) => {
                self.load_script().await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        Ok(raised.iter().sum())
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
            cmd.arg(self.script.get_hash()).arg(4);
            for key in keys(&self.prefix, batch.conversation_id.as_str()) {
                cmd.arg(key);
            }
            cmd.arg(batch.latest_seq.get());
            for m in &batch.members {
                let cursor = if m.left { -1 } else { m.cursor.get() as i64 };
                cmd.arg(m.user_id.as_str())
                    .arg(cursor)
                    .arg(m.join_seq.get())
                    .arg(m.epoch);
            }
            pipe.add_command(cmd);
        }
        self.run(pipe).await
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
