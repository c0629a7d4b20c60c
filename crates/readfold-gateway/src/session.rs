//! One WebSocket connection: who it is, what it subscribes to, the read
//! receipts it sends, and the frames it is sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{Message, WebSocket};
use readfold_core::partitioner::partition_for_key;
use readfold_core::read_model::Reached;
use readfold_core::{ConversationId, UserId};
use readfold_kafka::now_ms;
use readfold_trace::{kafka_attributes, OpenSpan, SpanContext, SpanKind, Status, Value};
use readfold_wire::badge::{encode_user_action, UserActionKind, UserActionRecord};
use readfold_wire::codec::{ReadAction, ReadReportRecord};

use crate::hub::{ConnId, Key, LoadedConversation, Member, Outbox, Shown, ThreadOwn};
use crate::protocol::{ClientMessage, FollowerState, OwnState, ServerFrame, Version};
use crate::{telemetry, Gateway};

/// Runs a connection until the client goes away.
pub async fn run(mut socket: WebSocket, gateway: Arc<Gateway>, user: UserId, version: Version) {
    let (id, outbox) = gateway.hub.connect_with(user.as_str(), version);
    outbox.push_control(ServerFrame::Welcome {
        user: user.to_string(),
        protocol: version.name(),
    });
    tokio::spawn(initial_badge(gateway.clone(), user.clone(), outbox.clone()));
    tokio::spawn(initial_threads(gateway.clone(), user.clone()));
    let mut shown = Shown::new(gateway.config.batch_from_members);
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    handle(&gateway, &user, id, &outbox, text.as_str());
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
    gateway.hub.disconnect(id, user.as_str());
}

/// Writes frames, skipping those that would show nothing new (or a lower
/// value). Returns false once the socket is gone.
async fn write(socket: &mut WebSocket, shown: &mut Shown, frames: Vec<ServerFrame>) -> bool {
    for mut frame in frames {
        if !shown.admit(&mut frame) {
            continue;
        }
        let json = frame.json();
        if socket.send(Message::Text(json.as_ref().into())).await.is_err() {
            return false;
        }
        telemetry::frame_sent();
    }
    true
}

fn handle(gateway: &Arc<Gateway>, user: &UserId, id: ConnId, outbox: &Arc<Outbox>, text: &str) {
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
            outbox.want(&conversation, true);
            tokio::spawn(subscribe(gateway.clone(), user.clone(), id, outbox.clone(), cid));
        }
        ClientMessage::Unsubscribe { conversation } => {
            gateway.hub.unsubscribe(id, &conversation, outbox);
        }
        ClientMessage::SubscribeThread { conversation, thread } => {
            let Some(cid) = conversation_id(gateway, outbox, &conversation, None) else {
                return;
            };
            if thread == 0 {
                let message = "thread: threads are named by their root's seq, from 1";
                outbox.push_control(ServerFrame::error("bad_message", message, None));
                return;
            }
            outbox.want_thread(&conversation, thread, true);
            tokio::spawn(subscribe_thread(
                gateway.clone(),
                user.clone(),
                id,
                outbox.clone(),
                cid,
                thread,
            ));
        }
        ClientMessage::UnsubscribeThread { conversation, thread } => {
            gateway.hub.unsubscribe_thread(id, &conversation, thread, outbox);
        }
        ClientMessage::Read {
            conversation,
            seq,
            private,
            thread,
            id: request,
            traceparent,
        } => {
            let record = ReadReportRecord {
                thread: thread.unwrap_or(0).min(i64::MAX as u64) as i64,
                ..receipt_record(conversation, user, seq, private, ReadAction::Read)
            };
            let parent = traceparent.and_then(|t| SpanContext::parse(t.as_bytes()));
            spawn_receipt(gateway, user, outbox, record, 1, request, parent)
        }
        ClientMessage::Delivered {
            conversation,
            seq,
            id: request,
        } => spawn_receipt(
            gateway,
            user,
            outbox,
            receipt_record(conversation, user, seq, false, ReadAction::Delivered),
            1,
            request,
            None,
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
                None,
            )
        }
        ClientMessage::Mute {
            conversation,
            until,
            id: request,
        } => {
            if let Some(until) = until.filter(|&t| t < 0) {
                outbox.push_control(ServerFrame::error(
                    "bad_message",
                    format!("until: {until} is not a time (ms since the epoch)"),
                    request,
                ));
                return;
            }
            let record = ReadReportRecord {
                muted_until: until,
                ..receipt_record(conversation, user, 0, false, ReadAction::Mute)
            };
            spawn_receipt(gateway, user, outbox, record, 0, request, None)
        }
        ClientMessage::Unmute {
            conversation,
            id: request,
        } => spawn_receipt(
            gateway,
            user,
            outbox,
            receipt_record(conversation, user, 0, false, ReadAction::Unmute),
            0,
            request,
            None,
        ),
        ClientMessage::MarkAllRead { id: request } => {
            tokio::spawn(mark_all_read(
                gateway.clone(),
                user.clone(),
                outbox.clone(),
                request,
            ));
        }
    }
}

/// The user's badge as Redis holds it, after `welcome`; the badges topic,
/// followed from its end as of the gateway's start, brings every later one.
/// Nothing is sent while Redis holds none (the badge stage never counted
/// the user, or does not run): the client keeps its own count.
async fn initial_badge(gateway: Arc<Gateway>, user: UserId, outbox: Arc<Outbox>) {
    match gateway.source.badge(&user).await {
        Ok(Some((badge, updated_at))) => {
            outbox.push_update(Key::Badge, ServerFrame::badge(&badge, updated_at))
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(user = user.as_str(), error = %e, "no badge from Redis"),
    }
}

/// The threads the user follows, as the stores hold them, into the hub
/// (which sends an `own_thread` frame for each); the by-user thread
/// changelog, followed from its end as of the gateway's start, brings every
/// later change.
async fn initial_threads(gateway: Arc<Gateway>, user: UserId) {
    match gateway.source.followed_threads(&user).await {
        Ok((threads, _)) => {
            for t in threads {
                let own = ThreadOwn {
                    latest_seq: t.latest_seq.get(),
                    cursor: t.cursor.get(),
                    private_cursor: t.private_cursor.get(),
                };
                let conversation = t.conversation_id.as_str();
                gateway
                    .hub
                    .own_thread(user.as_str(), conversation, t.thread.get(), Some(own));
            }
        }
        Err(e) => tracing::debug!(user = user.as_str(), error = %e, "no followed threads from the stores"),
    }
}

/// Subscribes to a thread's cursors, for a present member of its
/// conversation: every change from now on, then the snapshot read from the
/// stores (a client max-merges; the connection never shows a lower cursor).
async fn subscribe_thread(
    gateway: Arc<Gateway>,
    user: UserId,
    id: ConnId,
    outbox: Arc<Outbox>,
    conversation: ConversationId,
    thread: u64,
) {
    let name = conversation.as_str();
    let refuse = |code, message: String| {
        outbox.want_thread(name, thread, false);
        outbox.push_control(ServerFrame::error(code, message, None));
    };
    match known_membership(&gateway, &conversation, &user).await {
        Ok((true, _)) => {}
        Ok((false, _)) => {
            return refuse(
                "not_a_member",
                format!("{} is not a present member of {name:?}", user.as_str()),
            )
        }
        Err(e) => return refuse("unavailable", e),
    }
    gateway.hub.subscribe_thread(id, name, thread, &outbox);
    let view = match gateway
        .source
        .thread(&conversation, readfold_core::Seq(thread))
        .await
    {
        Ok((view, _)) => view.unwrap_or_default(),
        Err(e) => {
            gateway.hub.unsubscribe_thread(id, name, thread, &outbox);
            return refuse("unavailable", e.to_string());
        }
    };
    if !outbox.wants_thread(name, thread) {
        // Unsubscribed meanwhile.
        gateway.hub.unsubscribe_thread(id, name, thread, &outbox);
        return;
    }
    outbox.push_control(ServerFrame::ThreadSnapshot {
        conversation: name.to_owned(),
        thread,
        latest_seq: view.latest_seq.get(),
        followers: view
            .members
            .iter()
            .map(|(u, m)| FollowerState {
                user: u.to_string(),
                cursor: m.cursor.get(),
                join_seq: m.join_seq.get(),
            })
            .collect(),
    });
}

/// Produces a MARK_ALL_READ user action to the user's partition of the user
/// actions, and acknowledges once the broker has it; the badge stage turns
/// it into read reports.
async fn mark_all_read(gateway: Arc<Gateway>, user: UserId, outbox: Arc<Outbox>, request: Option<String>) {
    let badges = &gateway.badges;
    let Some(partitions) = badges.action_partitions() else {
        outbox.push_control(ServerFrame::error(
            "unavailable",
            format!(
                "topic {:?} does not exist yet: mark-all-read needs the badge stage (readfold badges)",
                badges.user_actions
            ),
            request,
        ));
        return;
    };
    let action = UserActionRecord {
        user_id: user.to_string(),
        action: UserActionKind::MarkAllRead,
        at: now_ms(),
    };
    let partition = partition_for_key(user.as_str().as_bytes(), partitions);
    let started = Instant::now();
    let sent = gateway
        .producer
        .send(
            &badges.user_actions,
            user.as_str(),
            Some(&encode_user_action(&action)),
            Some(partition),
        )
        .await;
    answer_produced(&outbox, request, started, sent, || {});
}

/// Counts a produce and answers it: an ack once the broker has the record
/// (after `taken`), `unavailable` if it does not.
fn answer_produced<E: std::fmt::Display>(
    outbox: &Outbox,
    request: Option<String>,
    started: Instant,
    sent: Result<(), E>,
    taken: impl FnOnce(),
) {
    match sent {
        Ok(()) => {
            telemetry::produced("ok", started.elapsed().as_secs_f64());
            taken();
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

/// Checks the conversation id, then checks, produces and acknowledges the
/// record in the background (`min_seq`: the lowest seq it may carry), in
/// the client's trace when it sent one (`parent`).
fn spawn_receipt(
    gateway: &Arc<Gateway>,
    user: &UserId,
    outbox: &Arc<Outbox>,
    record: ReadReportRecord,
    min_seq: u64,
    request: Option<String>,
    parent: Option<SpanContext>,
) {
    let Some(cid) = conversation_id(gateway, outbox, &record.conversation_id, request.clone()) else {
        return;
    };
    let receipt = Receipt {
        conversation: cid,
        record,
        min_seq,
        request,
        parent,
    };
    tokio::spawn(traced_receipt(
        gateway.clone(),
        user.clone(),
        outbox.clone(),
        receipt,
    ));
}

/// A receipt whose conversation id was checked.
struct Receipt {
    conversation: ConversationId,
    record: ReadReportRecord,
    /// The lowest seq it may carry.
    min_seq: u64,
    /// The client's request id, for the answer.
    request: Option<String>,
    /// The client's trace context, if it sent one.
    parent: Option<SpanContext>,
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

/// Subscribes to a conversation: the user's own state first (its later
/// changes come on the user channel), then the room's snapshot, read from
/// the stores by the first subscriber here.
async fn subscribe(
    gateway: Arc<Gateway>,
    user: UserId,
    id: ConnId,
    outbox: Arc<Outbox>,
    conversation: ConversationId,
) {
    let name = conversation.as_str();
    // Unread mentions and the mute are as the stores give them (0 and not
    // muted where they hold none); the changelog brings every change after.
    let own = match gateway.source.own_views(&user, &[name]).await {
        Ok(views) => views.first().and_then(|(v, _)| v.own()).map(|o| OwnState {
            thread_unread: gateway.hub.thread_unread(user.as_str(), name),
            ..OwnState::of(&o)
        }),
        Err(_) => None,
    };
    if !gateway.hub.subscribe(id, name, user.as_str(), &outbox, own) {
        return;
    }
    let read = match gateway.source.conversation(name).await {
        Ok((view, _)) => Ok(view.map(|view| LoadedConversation {
            latest_seq: view.latest_seq.get(),
            members: view
                .members
                .iter()
                .map(|(u, m)| {
                    let member = Member {
                        cursor: m.cursor.get(),
                        delivered: m.delivered_through().get(),
                        join_seq: m.join_seq.get(),
                    };
                    (u.to_string(), member)
                })
                .collect(),
        })),
        Err(e) => Err(e.to_string()),
    };
    gateway.hub.loaded(name, read);
}

/// Checks a read receipt, delivery report, mark or mute (a present member,
/// a sane seq), produces it, and acknowledges once the broker has it; the
/// trace of a sampled one starts here.
async fn traced_receipt(gateway: Arc<Gateway>, user: UserId, outbox: Arc<Outbox>, receipt: Receipt) {
    // A client's trace decides for itself whether it is sampled.
    let sampled = match receipt.parent {
        Some(parent) => gateway.tracer.is_on() && parent.sampled,
        None => gateway.tracer.sample(),
    };
    let root = sampled.then(|| OpenSpan::start(receipt.parent.as_ref(), true));
    // Copied only for a span: tracing off costs nothing here.
    let noted = root.map(|_| (receipt.record.action, receipt.conversation.clone()));
    let status = check_and_produce(&gateway, &user, &outbox, receipt, root).await;
    if let (Some(root), Some((action, conversation))) = (root, noted) {
        let attributes = vec![
            ("readfold.conversation_id", Value::from(conversation.to_string())),
            ("readfold.user_id", user.to_string().into()),
            ("readfold.action", format!("{action:?}").into()),
        ];
        let span = root.end("receive read receipt", SpanKind::Server, attributes, status);
        gateway.tracer.record(span);
    }
}

/// [`traced_receipt`]'s work; returns the outcome for its span.
async fn check_and_produce(
    gateway: &Gateway,
    user: &UserId,
    outbox: &Outbox,
    receipt: Receipt,
    root: Option<OpenSpan>,
) -> Status {
    let Receipt {
        conversation,
        record,
        min_seq,
        request,
        ..
    } = receipt;
    let conversation = &conversation;
    let seq = record.seq as u64;
    // What this gateway knows may lag: a receipt it would refuse is looked
    // at again until `gateway.receipt_wait_ms` has passed, so that a valid
    // one is never refused for the gateway being behind.
    let deadline = Instant::now() + Duration::from_millis(gateway.config.receipt_wait_ms);
    loop {
        let known = match record.thread {
            thread if thread > 0 => known_thread(gateway, conversation, thread as u64, user).await,
            _ => known_membership(gateway, conversation, user).await,
        };
        let (member, latest_seq) = match known {
            Ok(known) => known,
            Err(e) => {
                outbox.push_control(ServerFrame::error("unavailable", e, request));
                return Status::Error("unavailable".into());
            }
        };
        let ceiling = latest_seq
            .saturating_add(gateway.config.max_seq_ahead)
            .min(gateway.max_seq);
        let refusal = if !member {
            Some((
                "not_a_member",
                format!(
                    "{} is not a present member of {:?}",
                    user.as_str(),
                    conversation.as_str()
                ),
            ))
        } else if seq < min_seq || seq > ceiling {
            Some((
                "invalid_seq",
                format!(
                    "seq {seq} is outside {min_seq}..={ceiling} (the latest seq is {latest_seq}; gateway.max_seq_ahead {})",
                    gateway.config.max_seq_ahead
                ),
            ))
        } else {
            None
        };
        match refusal {
            None => break,
            // A seq below the floor, or past the global bound, never gets valid.
            Some((code, message))
                if Instant::now() >= deadline || (member && (seq < min_seq || seq > gateway.max_seq)) =>
            {
                outbox.push_control(ServerFrame::error(code, message, request));
                return Status::Error(code.into());
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(RECHECK_MS)).await,
        }
    }
    // Each device of each member reports every message's delivery: one the
    // room already shows is on the changelog or with the broker, so it is
    // acknowledged without being produced again.
    if record.action == ReadAction::Delivered
        && gateway
            .hub
            .shows_delivered(conversation.as_str(), user.as_str(), seq)
    {
        outbox.push_control(ServerFrame::Ack { id: request });
        return Status::Unset;
    }
    let started = Instant::now();
    let send = root.map(|root| OpenSpan::start(Some(&root.context), true));
    let traceparent = send.map(|span| span.context.traceparent());
    let sent = gateway
        .producer
        .report_traced(&record, traceparent.as_deref())
        .await;
    let status = match &sent {
        Ok(()) => Status::Unset,
        Err(e) => Status::Error(e.to_string()),
    };
    if let Some(send) = send {
        let topic = &gateway.producer.read_reports;
        let attributes = kafka_attributes("publish", topic, None);
        let span = send.end(
            format!("send {topic}"),
            SpanKind::Producer,
            attributes,
            status.clone(),
        );
        gateway.tracer.record(span);
    }
    answer_produced(outbox, request, started, sent, || {
        let reached = match record.action {
            // A thread's cursors are not the conversation room's.
            _ if record.thread > 0 => None,
            ReadAction::Read if !record.private => Some(Reached::Read),
            ReadAction::Delivered => Some(Reached::Delivered),
            _ => None,
        };
        if let Some(reached) = reached {
            gateway
                .hub
                .receipt_taken(conversation.as_str(), user.as_str(), reached, seq);
        }
    });
    status
}

/// How often a receipt the gateway would refuse is looked at again.
const RECHECK_MS: u64 = 50;

/// Whether `user` is a present member of `conversation` and its latest seq:
/// from a room here if one is loaded, else from the stores.
async fn known_membership(
    gateway: &Gateway,
    conversation: &ConversationId,
    user: &UserId,
) -> Result<(bool, u64), String> {
    if let Some(known) = gateway.hub.membership(conversation.as_str(), user.as_str()) {
        return Ok(known);
    }
    match gateway.source.conversation(conversation.as_str()).await {
        Ok((view, _)) => Ok(view.map_or((false, 0), |v| (v.members.contains_key(user), v.latest_seq.get()))),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether `user` is a present member of the conversation, and the latest
/// reply of `thread` as the stores (or the user's own followed threads
/// here) know it: a thread read is checked against its thread seqs.
async fn known_thread(
    gateway: &Gateway,
    conversation: &ConversationId,
    thread: u64,
    user: &UserId,
) -> Result<(bool, u64), String> {
    let (member, _) = known_membership(gateway, conversation, user).await?;
    let stored = match gateway
        .source
        .thread(conversation, readfold_core::Seq(thread))
        .await
    {
        Ok((view, _)) => view.map_or(0, |v| v.latest_seq.get()),
        Err(e) => return Err(e.to_string()),
    };
    Ok((member, stored))
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
        thread: 0,
        muted_until: None,
        conversation_id: conversation,
        user_id: user.to_string(),
        seq: seq as i64,
        device_id: None,
        reported_at: now_ms(),
        private,
        action,
    }
}
