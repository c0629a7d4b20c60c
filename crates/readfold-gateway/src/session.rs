//! One WebSocket connection: who it is, what it subscribes to, the read
//! receipts it sends, and the frames it is sent.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::ws::{Message, WebSocket};
use readfold_core::{ConversationId, UserId};
use readfold_wire::codec::{ReadAction, ReadReportRecord};

use crate::hub::{ConnId, Outbox, Shown};
use crate::protocol::{ClientMessage, MemberState, OwnState, ServerFrame, PROTOCOL};
use crate::{telemetry, Gateway};

/// Runs a connection until the client goes away.
pub async fn run(mut socket: WebSocket, gateway: Arc<Gateway>, user: UserId) {
    let (id, outbox) = gateway.hub.connect(user.as_str());
    outbox.push_control(ServerFrame::Welcome {
        user: user.to_string(),
        protocol: PROTOCOL,
    });
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut shown = Shown::default();
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    handle(&gateway, &user, id, &outbox, &mut subscribed, &mut shown, text.as_str());
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            frames = outbox.take() => {
                let Some(frames) = frames else { break };
                if !write(&mut socket, &mut shown, frames).await {
                    break;
                }
            }
        }
    }
    gateway.hub.disconnect(id, user.as_str(), subscribed);
}

/// Writes frames, skipping those that would show nothing new (or a lower
/// value). Returns false once the socket is gone.
async fn write(socket: &mut WebSocket, shown: &mut Shown, frames: Vec<ServerFrame>) -> bool {
    for mut frame in frames {
        if !shown.admit(&mut frame) {
            continue;
        }
        if socket.send(Message::Text(frame.to_json().into())).await.is_err() {
            return false;
        }
        telemetry::frame_sent();
    }
    true
}

fn handle(
    gateway: &Arc<Gateway>,
    user: &UserId,
    id: ConnId,
    outbox: &Arc<Outbox>,
    subscribed: &mut HashSet<String>,
    shown: &mut Shown,
    text: &str,
) {
    let message = match serde_json::from_str::<ClientMessage>(text) {
        Ok(m) => m,
        Err(e) => {
            outbox.push_control(ServerFrame::error("bad_message", e.to_string(), None));
            return;
        }
    };
    match message {
        ClientMessage::Ping => outbox.push_control(ServerFrame::Pong),
        ClientMessage::Subscribe { conversation } => {
            let Some(cid) = conversation_id(gateway, outbox, &conversation, None) else {
                return;
            };
            // Registered before the snapshot is read, so that no change
            // committed after it is missed; overlaps are filtered by `Shown`.
            gateway.hub.subscribe(id, &conversation, outbox);
            subscribed.insert(conversation);
            tokio::spawn(snapshot(gateway.clone(), user.clone(), id, outbox.clone(), cid));
        }
        ClientMessage::Unsubscribe { conversation } => {
            gateway.hub.unsubscribe(id, &conversation);
            subscribed.remove(&conversation);
            shown.forget(&conversation);
        }
        ClientMessage::Read {
            conversation,
            seq,
            private,
            id: request,
        } => spawn_receipt(
            gateway,
            user,
            outbox,
            receipt_record(conversation, user, seq, private, ReadAction::Read),
            1,
            request,
        ),
        ClientMessage::MarkUnread {
            conversation,
            seq,
            marked,
            id: request,
        } => {
            let action = if marked {
                ReadAction::MarkUnread
            } else {
                ReadAction::ClearUnreadMark
            };
            // A mark is set at the user's cursor, which may still be 0.
            spawn_receipt(
                gateway,
                user,
                outbox,
                receipt_record(conversation, user, seq, false, action),
                0,
                request,
            )
        }
    }
}

/// Checks the conversation id, then checks, produces and acknowledges the
/// record in the background (`min_seq`: the lowest seq it may carry).
fn spawn_receipt(
    gateway: &Arc<Gateway>,
    user: &UserId,
    outbox: &Arc<Outbox>,
    record: ReadReportRecord,
    min_seq: u64,
    request: Option<String>,
) {
    let Some(cid) = conversation_id(gateway, outbox, &record.conversation_id, request.clone()) else {
        return;
    };
    tokio::spawn(receipt(
        gateway.clone(),
        user.clone(),
        outbox.clone(),
        cid,
        record,
        min_seq,
        request,
    ));
}

fn conversation_id(
    gateway: &Gateway,
    outbox: &Outbox,
    raw: &str,
    request: Option<String>,
) -> Option<ConversationId> {
    match ConversationId::parse(raw, gateway.max_id_bytes) {
        Ok(id) => Some(id),
        Err(e) => {
            outbox.push_control(ServerFrame::error(
                "bad_message",
                format!("conversation: {e}"),
                request,
            ));
            None
        }
    }
}

/// Sends the conversation's state, if the user is a present member.
async fn snapshot(
    gateway: Arc<Gateway>,
    user: UserId,
    id: ConnId,
    outbox: Arc<Outbox>,
    conversation: ConversationId,
) {
    let name = conversation.as_str();
    let view = match gateway.source.conversation(name).await {
        Ok((view, _)) => view,
        Err(e) => {
            gateway.hub.unsubscribe(id, name);
            outbox.push_control(ServerFrame::error("unavailable", e.to_string(), None));
            return;
        }
    };
    let Some(view) = view.filter(|v| v.members.contains_key(&user)) else {
        gateway.hub.unsubscribe(id, name);
        outbox.push_control(ServerFrame::error(
            "not_a_member",
            format!("{} is not a present member of {name:?}", user.as_str()),
            None,
        ));
        return;
    };
    let own = match gateway.source.own_views(&user, &[name]).await {
        Ok(views) => views.first().and_then(|(v, _)| v.own()).map(|o| OwnState {
            cursor: o.cursor.get(),
            private_cursor: o.private_cursor.get(),
            unread_mark: o.marked_unread(),
        }),
        Err(_) => None,
    };
    outbox.push_control(ServerFrame::Snapshot {
        conversation: name.to_owned(),
        latest_seq: view.latest_seq.get(),
        members: view
            .members
            .iter()
            .map(|(u, m)| MemberState {
                user: u.to_string(),
                cursor: m.cursor.get(),
                join_seq: m.join_seq.get(),
            })
            .collect(),
        own,
    });
}

/// Checks a read receipt or mark (a present member, a sane seq), produces
/// it, and acknowledges once the broker has it.
async fn receipt(
    gateway: Arc<Gateway>,
    user: UserId,
    outbox: Arc<Outbox>,
    conversation: ConversationId,
    record: ReadReportRecord,
    min_seq: u64,
    request: Option<String>,
) {
    let seq = record.seq as u64;
    let view = match gateway.source.conversation(conversation.as_str()).await {
        Ok((view, _)) => view,
        Err(e) => {
            outbox.push_control(ServerFrame::error("unavailable", e.to_string(), request));
            return;
        }
    };
    let Some(view) = view.filter(|v| v.members.contains_key(&user)) else {
        outbox.push_control(ServerFrame::error(
            "not_a_member",
            format!(
                "{} is not a present member of {:?}",
                user.as_str(),
                conversation.as_str()
            ),
            request,
        ));
        return;
    };
    let ceiling = view
        .latest_seq
        .get()
        .saturating_add(gateway.config.max_seq_ahead)
        .min(gateway.max_seq);
    if seq < min_seq || seq > ceiling {
        outbox.push_control(ServerFrame::error(
            "invalid_seq",
            format!(
                "seq {seq} is outside {min_seq}..={ceiling} (the latest seq is {}; gateway.max_seq_ahead {})",
                view.latest_seq, gateway.config.max_seq_ahead
            ),
            request,
        ));
        return;
    }
    let started = Instant::now();
    match gateway.producer.report(&record).await {
        Ok(()) => {
            telemetry::produced("ok", started.elapsed().as_secs_f64());
            outbox.push_control(ServerFrame::Ack { id: request });
        }
        Err(e) => {
            telemetry::produced("error", started.elapsed().as_secs_f64());
            outbox.push_control(ServerFrame::error(
                "unavailable",
                format!("the broker did not take it: {e}"),
                request,
            ));
        }
    }
}

/// The read-reports record a client's message stands for, stamped now.
fn receipt_record(
    conversation: String,
    user: &UserId,
    seq: u64,
    private: bool,
    action: ReadAction,
) -> ReadReportRecord {
    ReadReportRecord {
        conversation_id: conversation,
        user_id: user.to_string(),
        seq: seq as i64,
        device_id: None,
        reported_at: now_ms(),
        private,
        action,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
