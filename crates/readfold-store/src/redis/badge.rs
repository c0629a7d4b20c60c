//! Users' badges, from the badge stage: `P:user:{U}:badge`, a hash of the
//! badge number, the totals and the time the stage published them. A write
//! older than what is stored (a zombie instance's, a retry's) is ignored,
//! so that the newest publication wins whatever the order of writes.

use readfold_core::badge::{Badge, Totals};
use readfold_core::UserId;

use super::RedisStore;
use crate::error::Result;

/// Sets the hash unless it holds a newer `updated_at`. KEYS[1]: the hash;
/// ARGV: updated_at, badge, conversations, messages, mentions.
const WRITE_BADGE: &str = r"
local stored = redis.call('HGET', KEYS[1], 'updated_at')
if stored and tonumber(stored) > tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[1], 'badge', ARGV[2],
  'conversations', ARGV[3], 'messages', ARGV[4], 'mentions', ARGV[5])
return 1
";

/// The key of a user's badge; one slot per user.
pub fn badge_key(prefix: &str, user_id: &str) -> String {
    format!("{prefix}:user:{{{user_id}}}:badge")
}

impl RedisStore {
    /// Writes users' badges, each published at its time, in one pipeline
    /// of EVALSHA calls (the script is loaded first if the server lacks it).
    pub async fn write_badges(&self, badges: &[(UserId, Badge, i64)]) -> Result<()> {
        let script = redis::Script::new(WRITE_BADGE);
        let mut pipe = redis::pipe();
        for (user, badge, at) in badges {
            pipe.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(1)
                .arg(badge_key(&self.prefix, user.as_str()))
                .arg(at)
                .arg(badge.badge)
                .arg(badge.totals.conversations)
                .arg(badge.totals.messages)
                .arg(badge.totals.mentions)
                .ignore();
        }
        let mut conn = self.conn.clone();
        let answer: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
        match answer {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.prepare_invoke().load_async(&mut conn).await?;
                pipe.query_async::<()>(&mut conn).await?;
                Ok(())
            }
            other => Ok(other?),
        }
    }

    /// A user's badge and when it was published; `None` when Redis holds
    /// none (no unread anywhere yet, or never computed).
    pub async fn badge(&self, user_id: &str) -> Result<Option<(Badge, i64)>> {
        let mut conn = self.conn.clone();
        let fields: std::collections::HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(badge_key(&self.prefix, user_id))
            .query_async(&mut conn)
            .await?;
        if fields.is_empty() {
            return Ok(None);
        }
        let get = |name: &str| fields.get(name).copied().unwrap_or(0).max(0) as u64;
        Ok(Some((
            Badge {
                badge: get("badge"),
                totals: Totals {
                    conversations: get("conversations"),
                    messages: get("messages"),
                    mentions: get("mentions"),
                },
            },
            fields.get("updated_at").copied().unwrap_or(0),
        )))
    }
}
