//! Where answers come from: Redis first (the hot store), and CQL for what
//! Redis does not hold (evicted, flushed, cold) or when Redis fails. The
//! changelog topics are never read on a request path.

use readfold_core::badge::Badge;
use readfold_core::ConversationId;
use readfold_core::{ConversationView, MemberCursor, OwnCursor, Seq, UserId};
use readfold_store::cql::CqlStore;
use readfold_store::redis::{FollowedThread, MemberView, PrivateState, RedisStore};
use serde::Serialize;

use crate::telemetry;

/// Which store answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Redis,
    Cql,
    /// Neither store holds anything of the conversation.
    None,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Redis => "redis",
            Source::Cql => "cql",
            Source::None => "none",
        }
    }
}

/// Both stores failed.
#[derive(Debug, thiserror::Error)]
#[error("no store could answer: {0}")]
pub struct Unavailable(pub String);

/// A user's own view of one conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnView {
    pub latest_seq: Seq,
    /// The user's public cursor and join seq; `None` when not a present member.
    pub member: Option<MemberCursor>,
    pub private: PrivateState,
}

impl OwnView {
    /// The user's own read state, for their unread count.
    pub fn own(&self) -> Option<OwnCursor> {
        let m = self.member?;
        Some(OwnCursor {
            cursor: m.cursor,
            private_cursor: self.private.private_cursor,
            mark_seq: self.private.mark.and_then(|m| m.seq),
            unread_mentions: self.private.unread_mentions,
            mute: self.private.mute,
        })
    }
}

/// The stores the query API reads.
pub struct ReadSource {
    redis: Option<RedisStore>,
    cql: Option<CqlStore>,
}

impl ReadSource {
    pub fn new(redis: Option<RedisStore>, cql: Option<CqlStore>) -> Self {
        ReadSource { redis, cql }
    }

    /// A user's badge as the badge stage last wrote it to Redis, and when
    /// it was published; `None` when Redis is off or holds none.
    pub async fn badge(&self, user: &UserId) -> Result<Option<(Badge, i64)>, Unavailable> {
        let Some(redis) = &self.redis else {
            return Ok(None);
        };
        redis.badge(user.as_str()).await.map_err(|e| {
            telemetry::store_failed("redis");
            Unavailable(e.to_string())
        })
    }

    /// A thread as its conversation's members see it: Redis, then CQL.
    pub async fn thread(
        &self,
        conversation: &ConversationId,
        thread: Seq,
    ) -> Result<(Option<ConversationView>, Source), Unavailable> {
        self.first_found(
            |redis| async move { redis.read_thread(conversation, thread).await },
            |cql| async move { cql.thread(conversation, thread).await },
            Option::is_some,
        )
        .await
    }

    /// The threads `user` follows, with their cursors: Redis, then CQL
    /// when Redis holds none.
    pub async fn followed_threads(
        &self,
        user: &UserId,
    ) -> Result<(Vec<FollowedThread>, Source), Unavailable> {
        self.first_found(
            |redis| async move { redis.read_followed_threads(user).await },
            |cql| async move { cql.followed_threads(user).await },
            |threads: &Vec<_>| !threads.is_empty(),
        )
        .await
    }

    /// Redis's answer if it has one (`found`), else CQL's; the store that
    /// failed is counted, and the answer is unavailable only when none
    /// could answer.
    async fn first_found<'a, T: Default, R, C>(
        &'a self,
        redis_read: impl FnOnce(&'a RedisStore) -> R,
        cql_read: impl FnOnce(&'a CqlStore) -> C,
        found: impl Fn(&T) -> bool,
    ) -> Result<(T, Source), Unavailable>
    where
        R: std::future::Future<Output = readfold_store::Result<T>>,
        C: std::future::Future<Output = readfold_store::Result<T>>,
    {
        let mut failure = String::new();
        if let Some(redis) = &self.redis {
            match redis_read(redis).await {
                Ok(value) if found(&value) => return Ok(counted(value, Source::Redis)),
                Ok(_) => {}
                Err(e) => {
                    telemetry::store_failed("redis");
                    tracing::warn!(error = %e, "redis read failed; asking CQL");
                    failure = e.to_string();
                }
            }
        }
        if let Some(cql) = &self.cql {
            match cql_read(cql).await {
                Ok(value) if found(&value) => return Ok(counted(value, Source::Cql)),
                Ok(_) => {}
                Err(e) => {
                    telemetry::store_failed("cql");
                    return Err(Unavailable(if failure.is_empty() {
                        e.to_string()
                    } else {
                        format!("{failure}; {e}")
                    }));
                }
            }
        }
        if !failure.is_empty() && self.cql.is_none() {
            return Err(Unavailable(failure));
        }
        Ok(counted(T::default(), Source::None))
    }

    /// A conversation as other members see it.
    pub async fn conversation(
        &self,
        conversation: &str,
    ) -> Result<(Option<ConversationView>, Source), Unavailable> {
        self.first_found(
            |redis| async move { redis.conversation(conversation).await },
            |cql| async move { cql.conversation(conversation).await },
            Option::is_some,
        )
        .await
    }

    /// A user's own view of many conversations: Redis in one round trip,
    /// CQL for the conversations (and the private state) Redis lacks.
    pub async fn own_views(
        &self,
        user: &UserId,
        conversations: &[&str],
    ) -> Result<Vec<(OwnView, Source)>, Unavailable> {
        let mut found: Vec<Option<(MemberView, Source)>> = vec![None; conversations.len()];
        let mut private = None;
        let mut failure = String::new();
        if let Some(redis) = &self.redis {
            match redis.member_views(user.as_str(), conversations).await {
                Ok(views) => {
                    for (slot, view) in found.iter_mut().zip(views.conversations) {
                        *slot = view.map(|v| (v, Source::Redis));
                    }
                    private = views.private;
                }
                Err(e) => {
                    telemetry::store_failed("redis");
                    tracing::warn!(error = %e, "redis read failed; asking CQL");
                    failure = e.to_string();
                }
            }
        }
        let missing = found.iter().any(Option::is_none) || private.is_none();
        if let (true, Some(cql)) = (missing, &self.cql) {
            let unavailable = |e: readfold_store::Error| {
                telemetry::store_failed("cql");
                Unavailable(if failure.is_empty() {
                    e.to_string()
                } else {
                    format!("{failure}; {e}")
                })
            };
            for (slot, conversation) in found.iter_mut().zip(conversations) {
                if slot.is_some() {
                    continue;
                }
                let view = cql.conversation(conversation).await.map_err(unavailable)?;
                *slot = view.map(|v| {
                    (
                        MemberView {
                            latest_seq: v.latest_seq,
                            member: v.members.get(user).copied(),
                        },
                        Source::Cql,
                    )
                });
            }
            if private.is_none() {
                // Public reads rewrite no private row: count mentions above
                // the public cursors too.
                let public: Vec<Seq> = found
                    .iter()
                    .map(|v| v.and_then(|(v, _)| v.member).map_or(Seq::ZERO, |m| m.cursor))
                    .collect();
                private = Some(
                    cql.private_state_above(user.as_str(), conversations, &public)
                        .await
                        .map_err(unavailable)?,
                );
            }
        } else if missing && !failure.is_empty() {
            return Err(Unavailable(failure));
        }
        let private = private.unwrap_or_else(|| vec![PrivateState::default(); conversations.len()]);
        Ok(found
            .into_iter()
            .zip(private)
            .map(|(view, private)| {
                let (view, source) = view.unwrap_or((
                    MemberView {
                        latest_seq: Seq::ZERO,
                        member: None,
                    },
                    Source::None,
                ));
                telemetry::answered_from(source.as_str());
                (
                    OwnView {
                        latest_seq: view.latest_seq,
                        member: view.member,
                        private,
                    },
                    source,
                )
            })
            .collect())
    }
}

fn counted<T>(value: T, source: Source) -> (T, Source) {
    telemetry::answered_from(source.as_str());
    (value, source)
}
