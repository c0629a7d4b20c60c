//! The endpoints. Every answer goes through the core's read model, so it is
//! join_seq- and departure-aware exactly as the fold is.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{FromRef, State};
use axum::http::header::CACHE_CONTROL;
use axum::http::HeaderMap;
use axum::Json;
use readfold_core::read_model::Reached;
use readfold_core::{ConversationId, ConversationView, MessageRef, OwnCursor, Seq, UserId};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{Authenticator, Caller};
use crate::cache::{Cached, ViewCache};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::source::{ReadSource, Source};
use crate::telemetry;

/// Bounds on what one request may ask.
#[derive(Clone, Copy, Debug)]
pub struct ApiLimits {
    pub max_items: usize,
    pub default_page: usize,
    pub max_page: usize,
    pub max_id_bytes: usize,
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub source: Arc<ReadSource>,
    pub auth: Arc<Authenticator>,
    pub limits: ApiLimits,
    pub cache: Arc<ViewCache>,
}

impl FromRef<AppState> for Arc<Authenticator> {
    fn from_ref(state: &AppState) -> Self {
        state.auth.clone()
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "readfold query API",
        description = "Read cursors, unread counts, read counts and who-read, answered from Redis with CQL as the fallback. With `auth.mode = \"jwt\"` every request needs `Authorization: Bearer <JWT>` whose `sub` is the caller's user id; a caller sees only conversations they are a present member of, and only their own private cursor and unread mark."
    ),
    modifiers(&BearerAuth),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .bearer_format("JWT")
                        .build(),
                ),
            );
    }
}

/// The routes and their OpenAPI document, built from the same handlers.
pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(get_conversation))
        .routes(routes!(read_counts))
        .routes(routes!(readers))
        .routes(routes!(receivers))
        .routes(routes!(member_cursor))
        .routes(routes!(unread))
        .routes(routes!(badge))
        .routes(routes!(crate::threads::get_thread))
        .routes(routes!(crate::threads::thread_read_counts))
        .routes(routes!(crate::threads::reply_readers))
        .routes(routes!(crate::threads::followed_threads))
}

/// Records the endpoint's latency and status.
pub(crate) async fn timed<T>(
    endpoint: &'static str,
    work: impl Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let started = Instant::now();
    let result = work.await;
    let status = result.as_ref().map_or_else(|e| e.status.as_u16(), |_| 200);
    telemetry::request(endpoint, status, started.elapsed());
    result
}

pub(crate) fn conversation_id(raw: &str, limits: &ApiLimits) -> Result<ConversationId, ApiError> {
    ConversationId::parse(raw, limits.max_id_bytes)
        .map_err(|e| ApiError::bad_request("invalid_path", format!("conversation_id: {e}")))
}

pub(crate) fn user_id(
    raw: &str,
    what: &str,
    code: &'static str,
    limits: &ApiLimits,
) -> Result<UserId, ApiError> {
    UserId::parse(raw, limits.max_id_bytes).map_err(|e| ApiError::bad_request(code, format!("{what}: {e}")))
}

/// A conversation the caller may see: with access control on, one they are
/// a present member of (a conversation that does not exist is answered the
/// same way, so that existence does not leak).
pub(crate) async fn visible_conversation(
    state: &AppState,
    caller: &Caller,
    id: &ConversationId,
    headers: &HeaderMap,
) -> Result<Visible, ApiError> {
    let cached = state
        .cache
        .conversation(&state.source, id.as_str(), wants_fresh(headers))
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let source = cached.1;
    match (caller, &cached.0) {
        (Caller::User(user), Some(view)) if view.members.contains_key(user) => Ok(Visible(cached, source)),
        (Caller::User(_), _) => Err(ApiError::forbidden(format!(
            "you are not a present member of conversation {:?}",
            id.as_str()
        ))),
        (Caller::Trusted, Some(_)) => Ok(Visible(cached, source)),
        (Caller::Trusted, None) => Err(ApiError::not_found(format!(
            "no store holds conversation {:?}",
            id.as_str()
        ))),
    }
}

/// Whether the request says `Cache-Control: no-cache` (or `max-age=0`): a
/// client that was just pushed a change wants an answer that has it.
fn wants_fresh(headers: &HeaderMap) -> bool {
    headers
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("no-cache") || v.contains("max-age=0"))
}

/// A conversation the caller may see, and the store it came from.
pub(crate) struct Visible(Cached, Source);

impl Visible {
    fn view(&self) -> &ConversationView {
        self.0 .0.as_ref().expect("visible conversations exist")
    }
}

/// A present member's public read state.
#[derive(Serialize, ToSchema)]
pub struct MemberDto {
    pub user_id: String,
    /// Has read every message with seq <= cursor.
    pub cursor: u64,
    /// Every message with seq <= delivered reached one of the member's
    /// devices; never below `cursor`.
    pub delivered: u64,
    /// First seq the member can see.
    pub join_seq: u64,
}

/// A conversation's cursors.
#[derive(Serialize, ToSchema)]
pub struct ConversationCursors {
    pub conversation_id: String,
    pub latest_seq: u64,
    /// Present members, by user id.
    pub members: Vec<MemberDto>,
    /// The store that answered.
    pub source: Source,
}

/// The cursors of a conversation: its present members, their public cursors
/// and join seqs, and the latest seq.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}",
    tag = "conversations",
    params(("conversation_id" = String, Path, description = "Conversation id")),
    responses(
        (status = 200, body = ConversationCursors, description = "The conversation's cursors"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the conversation"),
        (status = 503, body = ErrorBody, description = "Neither Redis nor CQL could answer")
    ),
    security(("bearer" = []))
)]
pub async fn get_conversation(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(conversation): ApiPath<String>,
) -> Result<Json<ConversationCursors>, ApiError> {
    timed("conversation", async {
        let id = conversation_id(&conversation, &state.limits)?;
        let visible = visible_conversation(&state, &caller, &id, &headers).await?;
        let (view, source) = (visible.view(), visible.1);
        Ok(Json(ConversationCursors {
            conversation_id: conversation,
            latest_seq: view.latest_seq.get(),
            members: view
                .members
                .iter()
                .map(|(u, m)| MemberDto {
                    user_id: u.to_string(),
                    cursor: m.cursor.get(),
                    delivered: m.delivered_through().get(),
                    join_seq: m.join_seq.get(),
                })
                .collect(),
            source,
        }))
    })
    .await
}

/// A message: its seq and its sender.
#[derive(Deserialize, Serialize, ToSchema)]
pub struct MessageDto {
    pub seq: u64,
    /// The sender never counts as a reader of their own message.
    pub sender: String,
}

#[derive(Deserialize, ToSchema)]
pub struct ReadCountsRequest {
    /// The messages on screen, at most `serve.max_items`.
    pub messages: Vec<MessageDto>,
}

#[derive(Serialize, ToSchema)]
pub struct ReadCount {
    pub seq: u64,
    pub sender: String,
    /// Present members other than the sender with join_seq <= seq <= cursor.
    pub read_count: usize,
    /// Present members other than the sender with join_seq <= seq <=
    /// delivered: the message reached one of their devices.
    pub delivered_count: usize,
    /// Present members other than the sender with join_seq <= seq: the
    /// counts' ceiling.
    pub possible_readers: usize,
    /// Every possible reader has it (grey ticks); false with none.
    pub delivered_to_all: bool,
    /// Every possible reader read it (blue ticks); false with none.
    pub read_by_all: bool,
}

#[derive(Serialize, ToSchema)]
pub struct ReadCountsResponse {
    pub conversation_id: String,
    /// One count per message, in the order asked.
    pub counts: Vec<ReadCount>,
    pub source: Source,
}

/// "N read" and the delivery ticks for many messages of one conversation
/// in one call.
#[utoipa::path(
    post,
    path = "/v1/conversations/{conversation_id}/read-counts",
    tag = "conversations",
    params(("conversation_id" = String, Path, description = "Conversation id")),
    request_body = ReadCountsRequest,
    responses(
        (status = 200, body = ReadCountsResponse, description = "One read count per message"),
        (status = 400, body = ErrorBody, description = "An invalid parameter or too many messages"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the conversation"),
        (status = 415, body = ErrorBody, description = "The body is not JSON"),
        (status = 503, body = ErrorBody, description = "Neither Redis nor CQL could answer")
    ),
    security(("bearer" = []))
)]
pub async fn read_counts(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath(conversation): ApiPath<String>,
    ApiJson(request): ApiJson<ReadCountsRequest>,
) -> Result<Json<ReadCountsResponse>, ApiError> {
    timed("read_counts", async {
        let id = conversation_id(&conversation, &state.limits)?;
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
        let mut messages = Vec::with_capacity(request.messages.len());
        for (i, m) in request.messages.iter().enumerate() {
            messages.push(MessageRef {
                seq: Seq(m.seq),
                sender: user_id(
                    &m.sender,
                    &format!("messages[{i}].sender"),
                    "invalid_field",
                    &state.limits,
                )?,
            });
        }
        let visible = visible_conversation(&state, &caller, &id, &headers).await?;
        let (view, source) = (visible.view(), visible.1);
        Ok(Json(ReadCountsResponse {
            conversation_id: conversation,
            counts: request
                .messages
                .into_iter()
                .zip(&messages)
                .map(|(m, message)| {
                    let ticks = view.ticks(message.seq, &message.sender);
                    ReadCount {
                        seq: m.seq,
                        sender: m.sender,
                        read_count: ticks.read_count,
                        delivered_count: ticks.delivered_count,
                        possible_readers: ticks.possible_readers,
                        delivered_to_all: ticks.delivered_to_all(),
                        read_by_all: ticks.read_by_all(),
                    }
                })
                .collect(),
            source,
        }))
    })
    .await
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReadersQuery {
    /// The message's sender, who never counts as a reader or receiver.
    pub sender: String,
    /// Return members whose id sorts after this one (the previous page's `next_after`).
    pub after: Option<String>,
    /// Page size; `serve.default_page` when absent, at most `serve.max_page`.
    pub limit: Option<usize>,
}

#[derive(Serialize, ToSchema)]
pub struct ReadersPage {
    pub conversation_id: String,
    pub seq: u64,
    /// All readers, not only this page's.
    pub read_count: usize,
    /// This page of readers, by user id.
    pub readers: Vec<String>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
    pub source: Source,
}

/// Who read one message, a page at a time, in a group of any size: the
/// answer comes from cursors, not per-message rows, so there is no cap.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/messages/{seq}/readers",
    tag = "conversations",
    params(
        ("conversation_id" = String, Path, description = "Conversation id"),
        ("seq" = u64, Path, description = "The message's seq"),
        ReadersQuery
    ),
    responses(
        (status = 200, body = ReadersPage, description = "One page of readers"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the conversation"),
        (status = 503, body = ErrorBody, description = "Neither Redis nor CQL could answer")
    ),
    security(("bearer" = []))
)]
pub async fn readers(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath((conversation, seq)): ApiPath<(String, u64)>,
    ApiQuery(query): ApiQuery<ReadersQuery>,
) -> Result<Json<ReadersPage>, ApiError> {
    timed("readers", async {
        let (page, count, next, source) = reached_page(
            &state,
            &caller,
            &headers,
            &conversation,
            seq,
            &query,
            Reached::Read,
        )
        .await?;
        Ok(Json(ReadersPage {
            conversation_id: conversation,
            seq,
            read_count: count,
            readers: page,
            next_after: next,
            source,
        }))
    })
    .await
}

#[derive(Serialize, ToSchema)]
pub struct ReceiversPage {
    pub conversation_id: String,
    pub seq: u64,
    /// All members the message reached, not only this page's.
    pub delivered_count: usize,
    /// This page of them, by user id.
    pub receivers: Vec<String>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
    pub source: Source,
}

/// Who received one message (it reached one of their devices; reading
/// implies it), a page at a time, by the same join_seq rule as who-read.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/messages/{seq}/receivers",
    tag = "conversations",
    params(
        ("conversation_id" = String, Path, description = "Conversation id"),
        ("seq" = u64, Path, description = "The message's seq"),
        ReadersQuery
    ),
    responses(
        (status = 200, body = ReceiversPage, description = "One page of receivers"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "No store holds the conversation"),
        (status = 503, body = ErrorBody, description = "Neither Redis nor CQL could answer")
    ),
    security(("bearer" = []))
)]
pub async fn receivers(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath((conversation, seq)): ApiPath<(String, u64)>,
    ApiQuery(query): ApiQuery<ReadersQuery>,
) -> Result<Json<ReceiversPage>, ApiError> {
    timed("receivers", async {
        let (page, count, next, source) = reached_page(
            &state,
            &caller,
            &headers,
            &conversation,
            seq,
            &query,
            Reached::Delivered,
        )
        .await?;
        Ok(Json(ReceiversPage {
            conversation_id: conversation,
            seq,
            delivered_count: count,
            receivers: page,
            next_after: next,
            source,
        }))
    })
    .await
}

/// A page's sender, `after` and size, checked.
pub(crate) fn page_params(
    query: &ReadersQuery,
    limits: &ApiLimits,
) -> Result<(UserId, Option<UserId>, usize), ApiError> {
    let sender = user_id(&query.sender, "query parameter `sender`", "invalid_query", limits)?;
    let after = query
        .after
        .as_deref()
        .map(|a| user_id(a, "query parameter `after`", "invalid_query", limits))
        .transpose()?;
    let limit = query.limit.unwrap_or(limits.default_page);
    if limit == 0 || limit > limits.max_page {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!(
                "query parameter `limit`: {limit} is outside 1..={} (serve.max_page)",
                limits.max_page
            ),
        ));
    }
    Ok((sender, after, limit))
}

/// One page of who-read or who-received: the page, the whole count, the
/// next page's `after` and the store that answered.
async fn reached_page(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    conversation: &str,
    seq: u64,
    query: &ReadersQuery,
    reached: Reached,
) -> Result<(Vec<String>, usize, Option<String>, Source), ApiError> {
    let id = conversation_id(conversation, &state.limits)?;
    let (sender, after, limit) = page_params(query, &state.limits)?;
    let visible = visible_conversation(state, caller, &id, headers).await?;
    let (view, source) = (visible.view(), visible.1);
    let (page, next) = view.reached_page(reached, Seq(seq), &sender, after.as_ref(), limit);
    let ticks = view.ticks(Seq(seq), &sender);
    let count = match reached {
        Reached::Read => ticks.read_count,
        Reached::Delivered => ticks.delivered_count,
    };
    Ok((
        page.iter().map(UserId::to_string).collect(),
        count,
        next.map(|u| u.to_string()),
        source,
    ))
}

/// One member's cursor in one conversation.
#[derive(Serialize, ToSchema)]
pub struct MemberCursorResponse {
    pub conversation_id: String,
    pub user_id: String,
    pub cursor: u64,
    /// Never below `cursor`.
    pub delivered: u64,
    pub join_seq: u64,
    pub latest_seq: u64,
    /// The member's unread count: with their private cursor and unread mark
    /// when the caller may see those (their own, or access control off),
    /// by the public cursor otherwise.
    pub unread: u64,
    /// Only for the member themselves (or with access control off).
    pub private_cursor: Option<u64>,
    /// Only for the member themselves (or with access control off).
    pub marked_unread: Option<bool>,
    /// Unread messages that mention the member (at most 100); only for the
    /// member themselves (or with access control off).
    pub unread_mentions: Option<u32>,
    /// Muted while the time (ms since the epoch) is below this, 2^63 - 1
    /// until unmuted; null when not muted. Only for the member themselves.
    pub muted_until: Option<i64>,
    pub source: Source,
}

/// One user's cursor in one conversation.
#[utoipa::path(
    get,
    path = "/v1/conversations/{conversation_id}/members/{user_id}",
    tag = "conversations",
    params(
        ("conversation_id" = String, Path, description = "Conversation id"),
        ("user_id" = String, Path, description = "The member")
    ),
    responses(
        (status = 200, body = MemberCursorResponse, description = "The member's cursor"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "The caller is not a present member"),
        (status = 404, body = ErrorBody, description = "The user is not a present member"),
        (status = 503, body = ErrorBody, description = "Neither Redis nor CQL could answer")
    ),
    security(("bearer" = []))
)]
pub async fn member_cursor(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiPath((conversation, user)): ApiPath<(String, String)>,
) -> Result<Json<MemberCursorResponse>, ApiError> {
    timed("member", async {
        let id = conversation_id(&conversation, &state.limits)?;
        let user = user_id(&user, "user_id", "invalid_path", &state.limits)?;
        let visible = visible_conversation(&state, &caller, &id, &headers).await?;
        let (view, source) = (visible.view(), visible.1);
        let Some(member) = view.members.get(&user).copied() else {
            return Err(ApiError::not_found(format!(
                "{:?} is not a present member of {:?}",
                user.as_str(),
                id.as_str()
            )));
        };
        let mut answer = MemberCursorResponse {
            conversation_id: conversation,
            user_id: user.to_string(),
            cursor: member.cursor.get(),
            delivered: member.delivered_through().get(),
            join_seq: member.join_seq.get(),
            latest_seq: view.latest_seq.get(),
            unread: view.unread(&user),
            private_cursor: None,
            marked_unread: None,
            unread_mentions: None,
            muted_until: None,
            source,
        };
        if caller.is(&user) {
            let views = state
                .source
                .own_views(&user, &[id.as_str()])
                .await
                .map_err(|e| ApiError::unavailable(e.to_string()))?;
            if let Some(own) = views.first().and_then(|(v, _)| v.own()) {
                answer.unread = own.unread(view.latest_seq);
                answer.private_cursor = Some(own.private_cursor.get());
                answer.marked_unread = Some(own.marked_unread());
                answer.unread_mentions = Some(own.unread_mentions);
                answer.muted_until = muted_until(&own, now_ms());
            }
        }
        Ok(Json(answer))
    })
    .await
}

/// When the member's mute of the conversation ends, if it is muted at
/// `now_ms`.
fn muted_until(own: &OwnCursor, now_ms: i64) -> Option<i64> {
    own.mute.filter(|m| m.is_muted(now_ms)).map(|m| m.until)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[derive(Deserialize, ToSchema)]
pub struct UnreadRequest {
    /// Conversation ids, at most `serve.max_items`.
    pub conversations: Vec<String>,
}

/// One conversation of a badge list.
#[derive(Serialize, ToSchema)]
pub struct UnreadEntry {
    pub conversation_id: String,
    /// Whether the user is a present member; the other fields are only
    /// given when they are.
    pub member: bool,
    /// max(0, latest_seq - max(cursor, private_cursor)), and at least 1
    /// while the conversation is marked unread.
    pub unread: Option<u64>,
    pub marked_unread: Option<bool>,
    /// Unread messages that mention the user (at most 100).
    pub unread_mentions: Option<u32>,
    /// Muted while the time (ms since the epoch) is below this, 2^63 - 1
    /// until unmuted; null when not muted (or not a member).
    pub muted_until: Option<i64>,
    pub latest_seq: Option<u64>,
    pub cursor: Option<u64>,
    pub private_cursor: Option<u64>,
    pub source: Source,
}

#[derive(Serialize, ToSchema)]
pub struct UnreadResponse {
    pub user_id: String,
    /// One entry per conversation, in the order asked.
    pub conversations: Vec<UnreadEntry>,
}

/// Unread counts of one user across many conversations (a badge list),
/// with their private cursor and unread marks.
#[utoipa::path(
    post,
    path = "/v1/users/{user_id}/unread",
    tag = "users",
    params(("user_id" = String, Path, description = "The user; with access control on, the caller")),
    request_body = UnreadRequest,
    responses(
        (status = 200, body = UnreadResponse, description = "One entry per conversation"),
        (status = 400, body = ErrorBody, description = "An invalid parameter or too many conversations"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "Another user's unread counts"),
        (status = 415, body = ErrorBody, description = "The body is not JSON"),
        (status = 503, body = ErrorBody, description = "Neither Redis nor CQL could answer")
    ),
    security(("bearer" = []))
)]
pub async fn unread(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(user): ApiPath<String>,
    ApiJson(request): ApiJson<UnreadRequest>,
) -> Result<Json<UnreadResponse>, ApiError> {
    timed("unread", async {
        let user = user_id(&user, "user_id", "invalid_path", &state.limits)?;
        if !caller.is(&user) {
            return Err(ApiError::forbidden(
                "a user may only ask for their own unread counts",
            ));
        }
        if request.conversations.len() > state.limits.max_items {
            return Err(ApiError::bad_request(
                "too_many_items",
                format!(
                    "conversations: {} given, at most {} (serve.max_items)",
                    request.conversations.len(),
                    state.limits.max_items
                ),
            ));
        }
        for (i, c) in request.conversations.iter().enumerate() {
            ConversationId::parse(c, state.limits.max_id_bytes)
                .map_err(|e| ApiError::bad_request("invalid_field", format!("conversations[{i}]: {e}")))?;
        }
        let ids: Vec<&str> = request.conversations.iter().map(String::as_str).collect();
        let views = state
            .source
            .own_views(&user, &ids)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
        let now = now_ms();
        let conversations = request
            .conversations
            .iter()
            .zip(views)
            .map(|(c, (view, source))| {
                let own = view.own();
                UnreadEntry {
                    conversation_id: c.clone(),
                    member: own.is_some(),
                    unread: own.map(|o| o.unread(view.latest_seq)),
                    marked_unread: own.map(|o| o.marked_unread()),
                    unread_mentions: own.map(|o| o.unread_mentions),
                    muted_until: own.and_then(|o| muted_until(&o, now)),
                    latest_seq: own.map(|_| view.latest_seq.get()),
                    cursor: own.map(|o| o.cursor.get()),
                    private_cursor: own.map(|o| o.private_cursor.get()),
                    source,
                }
            })
            .collect();
        Ok(Json(UnreadResponse {
            user_id: user.to_string(),
            conversations,
        }))
    })
    .await
}

/// A user's badge: the number for the app icon and the totals behind it.
#[derive(Serialize, ToSchema)]
pub struct BadgeResponse {
    pub user_id: String,
    /// Unread messages or unread conversations, as `badge.count` says.
    pub badge: u64,
    /// Conversations with anything unread or marked unread that count (a
    /// muted one only with unread mentions, by default).
    pub conversations: u64,
    /// Unread messages of the conversations that count.
    pub messages: u64,
    /// Unread mentions, muted conversations' included.
    pub mentions: u64,
    /// When the badge stage published it (ms since the epoch); absent when
    /// it never has (nothing unread yet, or the stage is not running).
    pub updated_at: Option<i64>,
}

/// One user's badge, as the badge stage (`readfold badges`) keeps it in
/// Redis: zero until it has published one.
#[utoipa::path(
    get,
    path = "/v1/users/{user_id}/badge",
    tag = "users",
    params(("user_id" = String, Path, description = "The user; with access control on, the caller")),
    responses(
        (status = 200, body = BadgeResponse, description = "The user's badge"),
        (status = 400, body = ErrorBody, description = "An invalid parameter"),
        (status = 401, body = ErrorBody, description = "No valid token"),
        (status = 403, body = ErrorBody, description = "Another user's badge"),
        (status = 503, body = ErrorBody, description = "Redis could not answer")
    ),
    security(("bearer" = []))
)]
pub async fn badge(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(user): ApiPath<String>,
) -> Result<Json<BadgeResponse>, ApiError> {
    timed("badge", async {
        let user = user_id(&user, "user_id", "invalid_path", &state.limits)?;
        if !caller.is(&user) {
            return Err(ApiError::forbidden("a user may only ask for their own badge"));
        }
        let found = state
            .source
            .badge(&user)
            .await
            .map_err(|e| ApiError::unavailable(e.to_string()))?;
        let (badge, updated_at) = match found {
            Some((badge, at)) => (badge, Some(at)),
            None => (Default::default(), None),
        };
        Ok(Json(BadgeResponse {
            user_id: user.to_string(),
            badge: badge.badge,
            conversations: badge.totals.conversations,
            messages: badge.totals.messages,
            mentions: badge.totals.mentions,
            updated_at,
        }))
    })
    .await
}
