//! Thread endpoints: a thread's cursors, "N read" and who-read under its
//! replies, and a user's followed threads with their unread. The read model
//! is the conversation's, over thread seqs (`readfold-core`'s threads).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use readfold_core::{ConversationView, MessageRef, Seq};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::{
    conversation_id, page_params, timed, user_id, visible_conversation, AppState, MessageDto,
    ReadCountsRequest, ReadersQuery,
};
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::source::Source;

/// A follower's public read state in one thread.
#[derive(Serialize, ToSchema)]
pub struct FollowerDto {
    pub user_id: String,
    /// Has read every reply with thread_seq <= cursor.
    pub cursor: u64,
    /// First reply they could read: they joined the conversation after the
    /// replies before it.
    pub join_seq: u64,
}

/// A thread's cursors.
#[derive(Serialize, ToSchema)]
pub struct ThreadCursors {
    pub conversation_id: String,
    /// The root message's seq.
    pub thread: u64,
    /// The latest reply's thread seq.
    pub latest_seq: u64,
    /// Present followers, by user id.
    pub followers: Vec<FollowerDto>,
    pub source: Source,
}

/// One thread as readers see it, for a caller who may see its conversation.
async fn visible_thread(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    conversation: &str,
    thread: u64,
) -> Result<(ConversationView, Source), ApiError> {
    let id = conversation_id(conversation, &state.limits)?;
    if thread == 0 {
        return Err(ApiError::bad_request(
            "invalid_path",
            "thread: threads are named by their root's seq, from 1",
        ));
    }
    visible_conversation(state, caller, &id, headers).await?;
    let (view, source) = state
        .source
        .thread(&id, Seq(thread))
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    view.map(|v| (v, source))
        .ok_or_else(|| ApiError::not_found(format!("no store holds thread {thread} of {conversation:?}")))
}

/// The cursors of a thread: its present followers and the latest reply.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/threads/{thread}",
    tag = "threads",
    params(
        ("conversation_id" = String, Path, description = "Conversation id"),
        ("thread" = u64, Path, description = "The root message's seq")
    ),
    responses(
        (status = 200, body = ThreadCursors, description = "The thread's cursors"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the thread"),
        (status = 503, body = ErrorBody, description = "No store could answer")
    ),
    security(("bearer" = []))
)]
pub async fn get_thread(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath((conversation, thread)): ApiPath<(String, u64)>,
) -> Result<Json<ThreadCursors>, ApiError> {
    timed("thread", async {
        let (view, source) = visible_thread(&state, &caller, &headers, &conversation, thread).await?;
        Ok(Json(ThreadCursors {
            conversation_id: conversation,
            thread,
            latest_seq: view.latest_seq.get(),
            followers: view
                .members
                .iter()
                .map(|(u, m)| FollowerDto {
                    user_id: u.to_string(),
                    cursor: m.cursor.get(),
                    join_seq: m.join_seq.get(),
                })
                .collect(),
            source,
        }))
    })
    .await
}

/// One reply's "N read".
#[derive(Serialize, ToSchema)]
pub struct ReplyReadCount {
    pub seq: u64,
    pub sender: String,
    /// Present followers other than the sender with join_seq <= seq <= cursor.
    pub read_count: usize,
}

#[derive(Serialize, ToSchema)]
pub struct ReplyReadCounts {
    pub conversation_id: String,
    pub thread: u64,
    /// One count per reply, in the order asked.
    pub counts: Vec<ReplyReadCount>,
    pub source: Source,
}

/// "N read" for many replies of one thread in one call (`messages` are the
/// replies, by thread seq).
#[utoipa::path(
    post,
    path = "/v1/conversations/{conversation_id}/threads/{thread}/read-counts",
    tag = "threads",
    params(
        ("conversation_id" = String, Path, description = "Conversation id"),
        ("thread" = u64, Path, description = "The root message's seq")
    ),
    request_body = ReadCountsRequest,
    responses(
        (status = 200, body = ReplyReadCounts, description = "One read count per reply"),
        (status = 400, body = ErrorBody, description = "An invalid parameter or too many replies"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the thread"),
        (status = 415, body = ErrorBody, description = "The body is not JSON"),
        (status = 503, body = ErrorBody, description = "No store could answer")
    ),
    security(("bearer" = []))
)]
pub async fn thread_read_counts(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath((conversation, thread)): ApiPath<(String, u64)>,
    ApiJson(request): ApiJson<ReadCountsRequest>,
) -> Result<Json<ReplyReadCounts>, ApiError> {
    timed("thread_read_counts", async {
        if request.messages.len() > state.limits.max_items {
            return Err(ApiError::bad_request(
                "too_many_items",
                format!(
                    "messages: {} given, at most {} (serve.max_items)",
                    request.messages.len(),
                    state.limits.max_items
                ),
            ));
        }
        let replies = request
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let sender = user_id(
                    &m.sender,
                    &format!("messages[{i}].sender"),
                    "invalid_field",
                    &state.limits,
                )?;
                Ok(MessageRef {
                    seq: Seq(m.seq),
                    sender,
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let (view, source) = visible_thread(&state, &caller, &headers, &conversation, thread).await?;
        Ok(Json(ReplyReadCounts {
            conversation_id: conversation,
            thread,
            counts: request
                .messages
                .into_iter()
                .zip(&replies)
                .map(|(MessageDto { seq, sender }, reply)| ReplyReadCount {
                    seq,
                    sender,
                    read_count: view.read_count(reply.seq, &reply.sender),
                })
                .collect(),
            source,
        }))
    })
    .await
}

#[derive(Serialize, ToSchema)]
pub struct ReplyReadersPage {
    pub conversation_id: String,
    pub thread: u64,
    pub seq: u64,
    /// All readers, not only this page's.
    pub read_count: usize,
    /// This page of readers, by user id.
    pub readers: Vec<String>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
    pub source: Source,
}

/// Who read one reply of a thread, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/threads/{thread}/replies/{seq}/readers",
    tag = "threads",
    params(
        ("conversation_id" = String, Path, description = "Conversation id"),
        ("thread" = u64, Path, description = "The root message's seq"),
        ("seq" = u64, Path, description = "The reply's thread seq"),
        ReadersQuery
    ),
    responses(
        (status = 200, body = ReplyReadersPage, description = "One page of readers"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the thread"),
        (status = 503, body = ErrorBody, description = "No store could answer")
    ),
    security(("bearer" = []))
)]
pub async fn reply_readers(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath((conversation, thread, seq)): ApiPath<(String, u64, u64)>,
    ApiQuery(query): ApiQuery<ReadersQuery>,
) -> Result<Json<ReplyReadersPage>, ApiError> {
    timed("reply_readers", async {
        let (sender, after, limit) = page_params(&query, &state.limits)?;
        let (view, source) = visible_thread(&state, &caller, &headers, &conversation, thread).await?;
        let (page, next) = view.readers_page(Seq(seq), &sender, after.as_ref(), limit);
        Ok(Json(ReplyReadersPage {
            conversation_id: conversation,
            thread,
            seq,
            read_count: view.read_count(Seq(seq), &sender),
            readers: page.iter().map(ToString::to_string).collect(),
            next_after: next.map(|u| u.to_string()),
            source,
        }))
    })
    .await
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FollowedQuery {
    /// Only this conversation's threads.
    pub conversation: Option<String>,
}

/// A thread the user follows, with their own unread in it.
#[derive(Serialize, ToSchema)]
pub struct FollowedThreadDto {
    pub conversation_id: String,
    pub thread: u64,
    pub latest_seq: u64,
    pub cursor: u64,
    pub private_cursor: u64,
    /// latest_seq - max(cursor, private_cursor), at least 0.
    pub unread: u64,
}

/// A conversation's thread unread: the sum over the threads the user follows.
#[derive(Serialize, ToSchema)]
pub struct ConversationThreadUnread {
    pub conversation_id: String,
    pub thread_unread: u64,
}

#[derive(Serialize, ToSchema)]
pub struct FollowedThreads {
    pub user_id: String,
    /// By conversation, then thread.
    pub threads: Vec<FollowedThreadDto>,
    /// Per conversation with a followed thread.
    pub conversations: Vec<ConversationThreadUnread>,
    pub source: Source,
}

/// The threads a user follows (they started, replied, were mentioned or
/// read in them), with their unread in each and the sum per conversation:
/// threads they never touched do not count.
#[utoipa::path(
    get,
    path = "/v1/users/{user_id}/threads",
    tag = "threads",
    params(("user_id" = String, Path, description = "The user"), FollowedQuery),
    responses(
        (status = 200, body = FollowedThreads, description = "The user's followed threads"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "Another user's threads"),
        (status = 503, body = ErrorBody, description = "No store could answer")
    ),
    security(("bearer" = []))
)]
pub async fn followed_threads(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(user): ApiPath<String>,
    ApiQuery(query): ApiQuery<FollowedQuery>,
) -> Result<Json<FollowedThreads>, ApiError> {
    timed("followed_threads", async {
        let user = user_id(&user, "user_id", "invalid_path", &state.limits)?;
        if !caller.is(&user) {
            return Err(ApiError::forbidden("a user may only ask for their own threads"));
        }
        let only = query
            .conversation
            .as_deref()
            .map(|c| conversation_id(c, &state.limits))
            .transpose()?;
        let (mut followed, source) = state
            .source
            .followed_threads(&user)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
        followed.retain(|t| only.as_ref().is_none_or(|c| &t.conversation_id == c));
        followed.sort_by(|a, b| (&a.conversation_id, a.thread).cmp(&(&b.conversation_id, b.thread)));
        let mut conversations: Vec<ConversationThreadUnread> = Vec::new();
        for t in &followed {
            match conversations.last_mut() {
                Some(c) if c.conversation_id == t.conversation_id.as_str() => c.thread_unread += t.unread(),
                _ => conversations.push(ConversationThreadUnread {
                    conversation_id: t.conversation_id.to_string(),
                    thread_unread: t.unread(),
                }),
            }
        }
        Ok(Json(FollowedThreads {
            user_id: user.to_string(),
            threads: followed
                .iter()
                .map(|t| FollowedThreadDto {
                    conversation_id: t.conversation_id.to_string(),
                    thread: t.thread.get(),
                    latest_seq: t.latest_seq.get(),
                    cursor: t.cursor.get(),
                    private_cursor: t.private_cursor.get(),
                    unread: t.unread(),
                })
                .collect(),
            conversations,
            source,
        }))
    })
    .await
}
