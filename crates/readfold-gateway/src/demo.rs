//! The demo page (`gateway.demo = true`): a group chat whose members each
//! hold a connection of their own. The endpoints here send the messages and
//! joins a chat backend would, so that the page can show "N read", who-read,
//! unread badges and private receipts live. Not for production.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::response::Html;
use axum::routing::{get, post};
use axum::{Json, Router};
use readfold_core::UserId;
use readfold_kafka::now_ms;
use readfold_serve::error::ApiError;
use readfold_serve::extract::ApiJson;
use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};
use serde::{Deserialize, Serialize};

use crate::Gateway;

const PAGE: &str = include_str!("demo.html");

#[derive(Clone, Debug, Serialize)]
pub struct DemoMessage {
    seq: u64,
    sender: String,
    text: String,
    /// Whom the text mentions by name (`@bob`), and whether `@all`.
    mentions: Vec<String>,
    mention_all: bool,
    /// A reply: the root message's seq and the reply's thread seq (0, 0
    /// for a message of the conversation itself).
    thread: u64,
    thread_seq: u64,
}

/// The messages sent through the demo, per conversation: readfold never
/// sees message bodies, so the demo keeps them.
#[derive(Default)]
pub struct DemoState {
    messages: Mutex<HashMap<String, Vec<DemoMessage>>>,
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/demo/", get(|| async { Html(PAGE) }))
        .route("/demo/api/setup", post(setup))
        .route("/demo/api/send", post(send))
        .route("/demo/api/messages", get(messages))
        .route("/demo/api/crowd", post(crowd))
        .with_state(gateway)
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::unavailable(e.to_string())
}

#[derive(Deserialize)]
struct Setup {
    conversation: String,
    members: Vec<String>,
}

/// Joins the members that are not present yet.
async fn setup(
    State(g): State<Arc<Gateway>>,
    ApiJson(s): ApiJson<Setup>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (view, _) = g
        .source
        .conversation(&s.conversation)
        .await
        .map_err(unavailable)?;
    let latest = view.as_ref().map_or(0, |v| v.latest_seq.get());
    let mut joined = Vec::new();
    for member in &s.members {
        let id = UserId::parse(member, g.max_id_bytes)
            .map_err(|e| ApiError::bad_request("invalid_field", e.to_string()))?;
        if view.as_ref().is_some_and(|v| v.members.contains_key(&id)) {
            continue;
        }
        g.producer
            .event(&ConversationEventRecord {
                conversation_id: s.conversation.clone(),
                seq: latest as i64,
                at: now_ms(),
                event: EventRecord::MemberJoined {
                    user_id: member.clone(),
                },
            })
            .await
            .map_err(unavailable)?;
        joined.push(member.clone());
    }
    Ok(Json(serde_json::json!({ "joined": joined })))
}

#[derive(Deserialize)]
struct Send {
    conversation: String,
    sender: String,
    text: String,
    /// Reply in the thread of this message (its seq).
    #[serde(default)]
    thread: u64,
}

/// Sends a message: the next seq of the conversation; or a reply in a
/// thread: the thread's next thread seq, at the conversation's latest seq.
async fn send(
    State(g): State<Arc<Gateway>>,
    ApiJson(m): ApiJson<Send>,
) -> Result<Json<DemoMessage>, ApiError> {
    UserId::parse(&m.sender, g.max_id_bytes)
        .map_err(|e| ApiError::bad_request("invalid_field", e.to_string()))?;
    let (view, _) = g
        .source
        .conversation(&m.conversation)
        .await
        .map_err(unavailable)?;
    let stored = view.map_or(0, |v| v.latest_seq.get());
    let (message, starter) = {
        let mut all = g.demo.messages.lock().expect("demo lock");
        let list = all.entry(m.conversation.clone()).or_default();
        let latest = list.iter().map(|l| l.seq).max().unwrap_or(0).max(stored);
        let text: String = m.text.chars().take(200).collect();
        let (mentions, mention_all) = mentions_in(&text, g.max_id_bytes);
        // A reply's thread starter follows it from its first reply.
        let (seq, thread_seq, starter) = if m.thread == 0 {
            (latest + 1, 0, None)
        } else {
            let Some(root) = list.iter().find(|l| l.thread == 0 && l.seq == m.thread) else {
                return Err(ApiError::bad_request(
                    "invalid_field",
                    format!("thread: no message {} sent through the demo", m.thread),
                ));
            };
            let starter = root.sender.clone();
            let replies = list.iter().filter(|l| l.thread == m.thread).count() as u64;
            (latest, replies + 1, Some(starter))
        };
        let message = DemoMessage {
            seq,
            sender: m.sender.clone(),
            text,
            mentions,
            mention_all,
            thread: m.thread,
            thread_seq,
        };
        list.push(message.clone());
        (message, starter)
    };
    g.producer
        .event(&ConversationEventRecord {
            conversation_id: m.conversation,
            seq: message.seq as i64,
            at: now_ms(),
            event: EventRecord::MessageSent {
                starter_id: starter,
                thread: message.thread as i64,
                thread_seq: message.thread_seq as i64,
                mention_all: message.mention_all,
                mentions: message.mentions.clone(),
                sender_id: m.sender,
            },
        })
        .await
        .map_err(unavailable)?;
    Ok(Json(message))
}

#[derive(Deserialize)]
struct Crowd {
    conversation: String,
    readers: usize,
}

/// Up to `readers` of the members furthest behind (the crowd of a big-group
/// demo) read everything sent so far.
async fn crowd(
    State(g): State<Arc<Gateway>>,
    ApiJson(c): ApiJson<Crowd>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let latest = {
        let all = g.demo.messages.lock().expect("demo lock");
        all.get(&c.conversation)
            .and_then(|l| l.last())
            .map_or(0, |m| m.seq)
    };
    let (view, _) = g
        .source
        .conversation(&c.conversation)
        .await
        .map_err(unavailable)?;
    let mut behind: Vec<(u64, String)> = view
        .map(|v| {
            v.members
                .iter()
                .filter(|(u, m)| m.cursor.get() < latest && u.as_str().starts_with("crowd"))
                .map(|(u, m)| (m.cursor.get(), u.to_string()))
                .collect()
        })
        .unwrap_or_default();
    behind.sort();
    let mut reported = 0;
    for (_, user) in behind.into_iter().take(c.readers.min(1000)) {
        g.producer
            .report(&ReadReportRecord {
                thread: 0,
                muted_until: None,
                conversation_id: c.conversation.clone(),
                user_id: user,
                seq: latest as i64,
                device_id: None,
                reported_at: now_ms(),
                private: false,
                action: ReadAction::Read,
            })
            .await
            .map_err(unavailable)?;
        reported += 1;
    }
    Ok(Json(serde_json::json!({ "reported": reported, "seq": latest })))
}

#[derive(Deserialize)]
struct Which {
    conversation: String,
}

async fn messages(State(g): State<Arc<Gateway>>, Query(w): Query<Which>) -> Json<Vec<DemoMessage>> {
    let all = g.demo.messages.lock().expect("demo lock");
    Json(all.get(&w.conversation).cloned().unwrap_or_default())
}

/// The `@word` tokens of a message: the users it names, once each, and
/// whether it says `@all`. A word is a token's letters, digits and `_.-`,
/// without trailing `.` or `-` (`@bob.` ends a sentence); an `@` inside a
/// word (`a@b.com`) mentions nobody.
fn mentions_in(text: &str, max_id_bytes: usize) -> (Vec<String>, bool) {
    let (mut users, mut all) = (Vec::new(), false);
    for token in text.split_whitespace() {
        let Some(rest) = token.strip_prefix('@') else {
            continue;
        };
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-')))
            .unwrap_or(rest.len());
        let name = rest[..end].trim_end_matches(['.', '-']);
        if name == "all" {
            all = true;
        } else if UserId::parse(name, max_id_bytes).is_ok() && !users.iter().any(|u| u == name) {
            users.push(name.to_owned());
        }
    }
    (users, all)
}

#[cfg(test)]
mod tests {
    use super::mentions_in;

    #[test]
    fn at_words_are_mentions_and_at_all_is_everyone() {
        let names = |text| mentions_in(text, 64);
        assert_eq!(
            names("@bob, lunch? @carol-x. cc @bob"),
            (vec!["bob".to_owned(), "carol-x".to_owned()], false)
        );
        assert_eq!(names("heads up @all!"), (vec![], true));
        assert_eq!(names("mail a@b.com or @ alone, @@x"), (vec![], false));
        assert_eq!(names("@crowd0001: @all"), (vec!["crowd0001".to_owned()], true));
        let long = format!("@{}", "x".repeat(65));
        assert_eq!(names(&long), (vec![], false), "too long to be an id");
    }
}
