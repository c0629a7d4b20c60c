//! Follows both changelogs (read_committed, from their end) and routes every
//! record to the connections that want it. Every gateway instance reads
//! every partition and keeps only its own subscribers' keys (a broker
//! fan-out, as Centrifugo does); see docs/gateway.md for where that stops
//! scaling. It also follows the conversation-events input for the messages
//! sent: their senders (a big group's read counts leave the sender out) and
//! a latest seq that does not wait for the processor's flush.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{BorrowedMessage, Headers, Message};
use readfold_kafka::changelog::ChangelogReader;
use readfold_kafka::reader::TopicReader;
use readfold_kafka::{KafkaConfig, TopicsConfig};
use readfold_trace::{kafka_attributes, OpenSpan, SpanContext, SpanKind, Status, Tracer};
use readfold_wire::badge::decode_user_badge;
use readfold_wire::changelog::{ChangelogEntry, ChangelogKind, ThreadEntry};
use readfold_wire::codec::{decode_conversation_event_view, Decoded, EventRecord, EventView, WireFormat};
use readfold_wire::TRACEPARENT_HEADER;

use crate::hub::{Hub, Member, MemberChange, ThreadOwn};
use crate::protocol::{muted_until, OwnState, ServerFrame};
use crate::{telemetry, Badges, Gateway};

/// Routes a changelog entry: a member's change to the conversation's room,
/// the user's own state to their devices.
pub fn route(hub: &Hub, entry: ChangelogEntry) {
    match entry {
        ChangelogEntry::Upsert(u) => {
            telemetry::routed("by_conversation");
            hub.route(
                u.conversation_id.as_str(),
                MemberChange {
                    user: u.user_id.to_string(),
                    member: Some(Member {
                        cursor: u.cursor.get(),
                        delivered: u.delivered.get(),
                        join_seq: u.join_seq.get(),
                    }),
                    latest_seq: u.latest_seq.get(),
                },
            );
        }
        ChangelogEntry::Own(own) => {
            telemetry::routed("by_user");
            let u = &own.update;
            hub.to_user(
                u.user_id.as_str(),
                ServerFrame::Own {
                    conversation: u.conversation_id.to_string(),
                    own: OwnState {
                        cursor: u.cursor.get(),
                        private_cursor: own.private_cursor.get(),
                        unread_mark: own.unread_mark,
                        unread_mentions: own.unread_mentions,
                        muted_until: muted_until(own.muted_until),
                        // Counted by the hub, which holds the user's threads.
                        thread_unread: 0,
                    },
                    latest_seq: u.latest_seq.get(),
                },
            );
        }
        // A tombstone: on the by-conversation changelog for the other
        // members, on the by-user one for the member's own devices.
        ChangelogEntry::Left(key) => {
            hub.route(
                key.conversation_id.as_str(),
                MemberChange {
                    user: key.user_id.to_string(),
                    member: None,
                    latest_seq: 0,
                },
            );
            hub.to_user(
                key.user_id.as_str(),
                ServerFrame::Left {
                    conversation: key.conversation_id.to_string(),
                    user: key.user_id.to_string(),
                },
            );
        }
        ChangelogEntry::Thread(entry) => route_thread(hub, entry),
        ChangelogEntry::State(_) => {}
    }
}

/// Routes a thread changelog entry: a follower's public cursor to the
/// thread's subscribers; with their private cursor (the by-user topic), to
/// their own devices.
fn route_thread(hub: &Hub, entry: ThreadEntry) {
    match entry {
        ThreadEntry::Cursor(c) => {
            let (conversation, thread, user) = (
                c.key.conversation_id.as_str(),
                c.key.thread.get(),
                c.key.user_id.as_str(),
            );
            match c.private_cursor {
                Some(private_cursor) => {
                    telemetry::routed("thread_by_user");
                    let own = ThreadOwn {
                        latest_seq: c.latest_seq.get(),
                        cursor: c.cursor.get(),
                        private_cursor: private_cursor.get(),
                    };
                    hub.own_thread(user, conversation, thread, Some(own));
                }
                None => {
                    telemetry::routed("thread_by_conversation");
                    let change = (c.cursor.get(), c.join_seq.get(), c.latest_seq.get());
                    hub.route_thread(conversation, thread, user, Some(change));
                }
            }
        }
        // A tombstone of either topic: the same departure.
        ThreadEntry::Left(key) => {
            let (conversation, thread, user) = (
                key.conversation_id.as_str(),
                key.thread.get(),
                key.user_id.as_str(),
            );
            hub.route_thread(conversation, thread, user, None);
            hub.own_thread(user, conversation, thread, None);
        }
        ThreadEntry::Follower { .. } | ThreadEntry::State(_) => {}
    }
}

/// Routes a changelog entry, in a span of its trace when its record
/// carries a sampled `traceparent`: the trace's last hop, the push.
fn route_traced(
    hub: &Hub,
    tracer: &Tracer,
    topic: &str,
    entry: ChangelogEntry,
    message: &BorrowedMessage<'_>,
) {
    let parent = message
        .headers()
        .and_then(|headers| headers.iter().filter(|h| h.key == TRACEPARENT_HEADER).last())
        .and_then(|header| header.value)
        .and_then(SpanContext::parse)
        .filter(|parent| parent.sampled);
    let Some(parent) = parent else {
        return route(hub, entry);
    };
    let span = OpenSpan::start(Some(&parent), true);
    route(hub, entry);
    let record = Some((message.partition(), message.offset()));
    let attributes = kafka_attributes("process", topic, record);
    tracer.record(span.end(
        format!("push {topic}"),
        SpanKind::Consumer,
        attributes,
        Status::Unset,
    ));
}

/// Routes a conversation-events record: a message's sender and seq.
pub fn route_event(hub: &Hub, payload: &[u8], format: WireFormat) {
    let Ok(decoded) = decode_conversation_event_view(payload, format) else {
        // The processor sends it to the dead-letter topic; nothing to show.
        return;
    };
    match decoded {
        Decoded::Borrowed(view) => {
            if let EventView::MessageSent {
                sender_id,
                thread,
                thread_seq,
                ..
            } = view.event
            {
                sent(hub, view.conversation_id, view.seq, sender_id, thread, thread_seq);
            }
        }
        Decoded::Owned(record) => {
            if let EventRecord::MessageSent {
                sender_id,
                thread,
                thread_seq,
                ..
            } = &record.event
            {
                sent(
                    hub,
                    &record.conversation_id,
                    record.seq,
                    sender_id,
                    *thread,
                    *thread_seq,
                );
            }
        }
    }
}

/// A message, or a reply in a thread (which takes no conversation seq:
/// its `seq` is the conversation's latest, sent by someone else).
fn sent(hub: &Hub, conversation: &str, seq: i64, sender: &str, thread: i64, thread_seq: i64) {
    if thread > 0 {
        hub.reply_sent(conversation, thread as u64, thread_seq.max(0) as u64, sender);
    } else {
        hub.message_sent(conversation, seq.max(0) as u64, sender);
    }
}

/// Routes a badges-topic record to the user's devices.
pub fn route_badge(hub: &Hub, payload: &[u8]) {
    match decode_user_badge(payload) {
        Ok(record) => {
            telemetry::routed("badges");
            hub.to_user(
                &record.user_id,
                ServerFrame::badge(&record.badge, record.updated_at),
            );
        }
        Err(e) => tracing::debug!(error = %e, "an undecodable badge record; skipped"),
    }
}

/// Follows the badge stage's badges (from their end as of now, so that a
/// connection's read of Redis and the topic leave no gap) and learns the
/// user actions' partition count. The topics exist once `readfold badges`
/// has run: until then a thread looks for them every few seconds, and
/// reads the badges from their beginning once they appear (all of it is
/// newer than this start).
pub fn start_badges(
    kafka: &KafkaConfig,
    badges: Arc<Badges>,
    hub: Arc<Hub>,
    stop: Arc<AtomicBool>,
) -> readfold_kafka::Result<()> {
    let reader = TopicReader::new(kafka, &format!("{}-gateway-badges", kafka.group_id), false)?;
    let mut following = reader.assign_from_end(&badges.user_badges, None).is_ok();
    if let Ok(p) = reader.partitions(&badges.user_actions) {
        badges.set_action_partitions(p.len() as i32);
    }
    if !following {
        tracing::info!(topic = %badges.user_badges, "no badges topic yet (readfold badges has not run); looking for it");
    }
    let topic = badges.user_badges.clone();
    std::thread::Builder::new()
        .name("follow-badges".into())
        .spawn(move || {
            let mut looked_at = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let missing = !following || badges.action_partitions().is_none();
                if missing && looked_at.elapsed() >= TOPIC_LOOK_INTERVAL {
                    looked_at = std::time::Instant::now();
                    if !following {
                        following = reader.assign_from_beginning(&topic, None).is_ok();
                    }
                    if let Ok(p) = reader.partitions(&badges.user_actions) {
                        badges.set_action_partitions(p.len() as i32);
                    }
                }
                if !following {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                let polled = reader.poll_available(Duration::from_millis(100), |message| {
                    if let Some(payload) = message.payload() {
                        route_badge(&hub, payload);
                    }
                });
                if let Err(e) = polled {
                    tracing::warn!(%topic, error = %e, "read failed; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        })
        .expect("spawn the badges follower");
    Ok(())
}

/// How often the badge stage's topics are looked for while missing.
const TOPIC_LOOK_INTERVAL: Duration = Duration::from_secs(2);

/// How often big groups' read counts are looked at: well under their
/// interval, so that a quiet group's first change goes out soon.
const READ_COUNTS_TICK: Duration = Duration::from_millis(5);

/// Starts one blocking thread per changelog, one following the
/// conversation events, and one that sends the big groups' batches every
/// `gateway.batch_interval_ms` and their read counts when due; they stop
/// when the gateway's `stop` is set.
pub fn start(
    kafka: &KafkaConfig,
    topics: &TopicsConfig,
    input_format: WireFormat,
    gateway: &Gateway,
) -> readfold_kafka::Result<()> {
    let (hub, stop, tracer) = (gateway.hub.clone(), gateway.stop.clone(), gateway.tracer.clone());
    let batch_interval = Duration::from_millis(gateway.config.batch_interval_ms.max(1));
    let max_id_bytes = gateway.max_id_bytes;
    {
        let (hub, stop) = (hub.clone(), stop.clone());
        std::thread::Builder::new()
            .name("send-batches".into())
            .spawn(move || {
                let mut batches_at = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(READ_COUNTS_TICK.min(batch_interval));
                    let now = std::time::Instant::now();
                    hub.send_read_counts(now);
                    if now.duration_since(batches_at) >= batch_interval {
                        batches_at = now;
                        hub.send_batches();
                    }
                }
            })
            .expect("spawn the batch sender");
    }
    let group = format!("{}-gateway", kafka.group_id);
    let events = TopicReader::new(kafka, &group, true)?;
    events.assign_from_end(&topics.conversation_events, None)?;
    let events_hub = hub.clone();
    follow_on_thread(&topics.conversation_events, stop.clone(), move |wait| {
        events.poll_available(wait, |message| {
            if let Some(payload) = message.payload() {
                route_event(&events_hub, payload, input_format);
            }
        })
    });
    for (topic, kind) in [
        (&topics.read_cursors, ChangelogKind::ByConversation),
        (&topics.user_read_cursors, ChangelogKind::ByUser),
        (&topics.thread_cursors, ChangelogKind::ThreadByConversation),
        (&topics.user_thread_cursors, ChangelogKind::ThreadByUser),
    ] {
        let reader = ChangelogReader::new(kafka, &group, topic, kind, max_id_bytes)?;
        reader.follow_from_end(None)?;
        let (hub, tracer, name) = (hub.clone(), tracer.clone(), topic.clone());
        follow_on_thread(topic, stop.clone(), move |wait| match tracer.is_on() {
            false => reader.for_each_available(wait, |entry| route(&hub, entry)),
            true => reader.for_each_available_with(wait, |entry, message| {
                route_traced(&hub, &tracer, &name, entry, message)
            }),
        });
    }
    Ok(())
}

/// Polls `topic` with `poll` on a thread of its own until `stop` is set; a
/// failed read is logged and tried again a second later.
fn follow_on_thread(
    topic: &str,
    stop: Arc<AtomicBool>,
    mut poll: impl FnMut(Duration) -> readfold_kafka::Result<u64> + Send + 'static,
) {
    let topic = topic.to_owned();
    std::thread::Builder::new()
        .name(format!("follow-{topic}"))
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = poll(Duration::from_millis(100)) {
                    tracing::warn!(%topic, error = %e, "read failed; retrying");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        })
        .expect("spawn a follower");
}

#[cfg(test)]
mod tests {
    use readfold_core::badge::{Badge, Totals};
    use readfold_wire::badge::{encode_user_badge, UserBadgeRecord};

    use super::*;

    #[tokio::test]
    async fn a_badge_record_reaches_the_users_devices_and_garbage_nobody() {
        let hub = Hub::new(100);
        let (_, phone) = hub.connect("alice");
        let (_, bob) = hub.connect("bob");
        route_badge(&hub, b"\x02\xff");
        let badge = Badge {
            badge: 2,
            totals: Totals {
                conversations: 1,
                messages: 2,
                mentions: 0,
            },
        };
        let record = UserBadgeRecord {
            user_id: "alice".into(),
            badge,
            updated_at: 1700,
        };
        route_badge(&hub, &encode_user_badge(&record));
        assert_eq!(phone.take().await.unwrap(), [ServerFrame::badge(&badge, 1700)]);
        // A frame of its own, so that take returns: only it is there.
        bob.push_control(ServerFrame::Pong);
        assert_eq!(
            bob.take().await.unwrap(),
            [ServerFrame::Pong],
            "nothing else for bob"
        );
    }
}
