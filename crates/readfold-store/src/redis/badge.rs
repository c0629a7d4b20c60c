//! Users' badges, from the badge stage: `P:user:{U}:badge`, a hash of the
//! badge number, the totals and the time the stage published them. A write
//! older than what is stored (a zombie instance's, a retry's) is ignored,
//! so that the newest publication wins whatever the order of writes.

use readfold_core::badge::{Badge, Totals};
use readfold_core::UserId;

use super::RedisStore;
use crate::error::Result;

/// Sets each user's hash unless it holds a newer `updated_at`; see the
/// file for its keys and arguments.
pub const WRITE_BADGES_SCRIPT: &str = include_str!("write_badges.lua");

/// Script arguments per user.
const ARGS_PER_USER: usize = 5;

/// The key of a user's badge; one slot per user.
pub fn badge_key(prefix: &str, user_id: &str) -> String {
    format!("{prefix}:user:{{{user_id}}}:badge")
}

impl RedisStore {
    /// Writes users' badges, each published at its time: one script call
    /// per `conversations_per_call` users (the setting that bounds a merge
    /// call's keys, for the same Redis Cluster reason), in pipelines of
    /// bounded size.
    pub async fn write_badges(&self, badges: &[(UserId, Badge, i64)]) -> Result<()> {
        if badges.is_empty() {
            return Ok(());
        }
        let per_call = self.conversations_per_call.max(1);
        let calls = badges.chunks(per_call).map(|users| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.badge_script.get_hash()).arg(users.len());
            for (user, _, _) in users {
                cmd.arg(badge_key(&self.prefix, user.as_str()));
            }
            for (_, badge, at) in users {
                cmd.arg(at)
                    .arg(badge.badge)
                    .arg(badge.totals.conversations)
                    .arg(badge.totals.messages)
                    .arg(badge.totals.mentions);
            }
            debug_assert_eq!(cmd.args_iter().count(), 3 + users.len() * (1 + ARGS_PER_USER));
            cmd
        });
        self.run_all(super::write::pipelines(calls)).await?;
        Ok(())
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
