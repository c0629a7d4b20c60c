//! The gateway's WebSocket protocol: JSON text frames, one message each,
//! tagged by `type`. Documented in docs/gateway.md.
//!
//! `readfold.v2.json` is v1 with one difference: in a big group (at least
//! `gateway.batch_from_members` members) a v2 connection is sent the read
//! counts of the recent messages (`read_counts`, at most one per
//! `gateway.read_counts_interval_ms`) instead of every member's cursor, so
//! that what it receives does not grow with the group.

use std::sync::{Arc, OnceLock};

use readfold_core::{Mute, OwnCursor};
use serde::{Deserialize, Serialize, Serializer};

/// The first subprotocol (`Sec-WebSocket-Protocol`).
pub const PROTOCOL: &str = "readfold.v1.json";
/// The subprotocol with big groups' read counts.
pub const PROTOCOL_V2: &str = "readfold.v2.json";

/// Which subprotocol a connection speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Version {
    #[default]
    V1,
    V2,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V1 => PROTOCOL,
            Version::V2 => PROTOCOL_V2,
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            PROTOCOL => Some(Version::V1),
            PROTOCOL_V2 => Some(Version::V2),
            _ => None,
        }
    }
}

/// What a client sends.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Start receiving a conversation: a `snapshot`, then every change.
    Subscribe {
        conversation: String,
    },
    Unsubscribe {
        conversation: String,
    },
    /// Start receiving a thread's followers' cursors: a `thread_snapshot`,
    /// then every change (`thread_cursor`, `thread_left`).
    SubscribeThread {
        conversation: String,
        /// The root message's seq.
        thread: u64,
    },
    UnsubscribeThread {
        conversation: String,
        thread: u64,
    },
    /// A read receipt: the user has seen every message up to `seq` (with
    /// `thread`: every reply of that thread up to thread seq `seq`).
    /// Acknowledged with `ack` once the broker has it.
    Read {
        conversation: String,
        seq: u64,
        #[serde(default)]
        private: bool,
        /// The root message's seq of the thread read in; none for the
        /// conversation itself.
        #[serde(default)]
        thread: Option<u64>,
        /// Echoed in the `ack` or `error`.
        #[serde(default)]
        id: Option<String>,
        /// The client's W3C trace context: with tracing on, the receipt's
        /// spans join that trace, sampled as it says.
        #[serde(default)]
        traceparent: Option<String>,
    },
    /// A delivery report: every message up to `seq` reached this device
    /// (the sender's grey ticks). Checked and acknowledged as a read is.
    Delivered {
        conversation: String,
        seq: u64,
        #[serde(default)]
        id: Option<String>,
    },
    /// Mark the conversation unread (at the user's cursor `seq`), or clear
    /// the mark (`marked: false`).
    MarkUnread {
        conversation: String,
        seq: u64,
        marked: bool,
        #[serde(default)]
        id: Option<String>,
    },
    /// Mute the conversation until `until` (ms since the epoch), or until
    /// unmuted. A past time is a mute that ran out already.
    Mute {
        conversation: String,
        #[serde(default)]
        until: Option<i64>,
        #[serde(default)]
        id: Option<String>,
    },
    Unmute {
        conversation: String,
        #[serde(default)]
        id: Option<String>,
    },
    /// Mark every conversation of the user read: a user action for the
    /// badge stage (`readfold badges`), acknowledged once the broker has it.
    MarkAllRead {
        #[serde(default)]
        id: Option<String>,
    },
    Ping,
}

/// A present member in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberState {
    pub user: String,
    pub cursor: u64,
    /// Every message up to here reached one of the member's devices; never
    /// below `cursor`.
    pub delivered: u64,
    pub join_seq: u64,
}

/// A follower in a thread snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FollowerState {
    pub user: String,
    pub cursor: u64,
    pub join_seq: u64,
}

/// A value many frames share, serialized as the value: a big group's member
/// list goes into the snapshot of each of its thousands of subscribers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared<T>(pub Arc<T>);

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// A big group's recent messages' read counts, as v2 connections get them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadCounts {
    pub conversation: String,
    pub latest_seq: u64,
    /// Present members.
    pub member_count: usize,
    /// The seq of `counts[0]`.
    pub first_seq: u64,
    /// How many members other than the sender read each seq from
    /// `first_seq` on; `null` where the gateway does not know the sender.
    pub counts: Vec<Option<u32>>,
    /// Every message at or below this seq is read by every member who
    /// could see it.
    pub read_by_all_through: u64,
    /// As `counts`, for delivery: how many members other than the sender
    /// each seq reached (on one of their devices).
    pub delivered_counts: Vec<Option<u32>>,
    /// Every message at or below this seq reached every member who could
    /// see it (the grey ticks; `read_by_all_through` gives the blue ones).
    pub delivered_to_all_through: u64,
}

/// A frame every subscriber of a big group is sent, serialized once.
#[derive(Debug)]
pub struct SharedFrame<T> {
    pub value: T,
    json: OnceLock<String>,
}

impl<T> SharedFrame<T> {
    pub fn new(value: T) -> Arc<Self> {
        Arc::new(SharedFrame {
            value,
            json: OnceLock::new(),
        })
    }
}

impl<T: PartialEq> PartialEq for SharedFrame<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: Eq> Eq for SharedFrame<T> {}

/// The connected user's own view of a conversation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OwnState {
    pub cursor: u64,
    pub private_cursor: u64,
    pub unread_mark: bool,
    /// Messages above what the user read that mention them, at most 100
    /// (a client shows "99+" past 99).
    pub unread_mentions: u32,
    /// Muted while the time (ms since the epoch) is below this: `null` not
    /// muted, a past time a mute that ran out, [`MUTED_UNTIL_UNMUTED`]
    /// until unmuted.
    pub muted_until: Option<u64>,
    /// Unread replies over the conversation's threads the user follows,
    /// as this gateway knows them (see `own_thread` frames).
    pub thread_unread: u64,
}

/// `muted_until` of a mute with no end: muted until the user unmutes.
pub const MUTED_UNTIL_UNMUTED: u64 = Mute::FOREVER as u64;

impl OwnState {
    /// The user's own state as the read model has it.
    pub fn of(own: &OwnCursor) -> Self {
        OwnState {
            cursor: own.cursor.get(),
            private_cursor: own.private_cursor.get(),
            unread_mark: own.marked_unread(),
            unread_mentions: own.unread_mentions,
            muted_until: muted_until(own.mute.map(|m| m.until).filter(|&until| until != Mute::OFF)),
            thread_unread: 0,
        }
    }
}

/// A mute's end as frames carry it, from the changelog's `muted_until`:
/// a time before the epoch has run out as surely as the epoch has.
pub fn muted_until(until: Option<i64>) -> Option<u64> {
    until.map(|t| t.max(0) as u64)
}

/// What the gateway sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// First frame: who the connection is, and the protocol.
    Welcome {
        user: String,
        protocol: &'static str,
    },
    /// A conversation's state when subscribed; changes follow.
    Snapshot {
        conversation: String,
        latest_seq: u64,
        members: Shared<Vec<MemberState>>,
        own: Option<OwnState>,
    },
    /// A big group's member changes since the last such frame (at most one
    /// per `gateway.batch_interval_ms`): advances and joins in `members`,
    /// departures in `left`.
    Cursors {
        conversation: String,
        latest_seq: u64,
        members: Vec<MemberState>,
        left: Vec<String>,
    },
    /// v2, a big group: its recent messages' read counts, at most one per
    /// `gateway.read_counts_interval_ms`. Replaces member frames there, and
    /// carries the connection's own state there when it changed (no `own`
    /// frame for it), so that a client gets one frame per interval.
    ReadCounts {
        #[serde(flatten)]
        shared: Arc<SharedFrame<ReadCounts>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        own: Option<OwnState>,
    },
    /// A member's public or delivered cursor advanced (or they joined), in
    /// a conversation smaller than `gateway.batch_from_members`.
    Cursor {
        conversation: String,
        user: String,
        cursor: u64,
        /// Never below `cursor`: reading implies delivery.
        delivered: u64,
        join_seq: u64,
        latest_seq: u64,
    },
    /// A member left.
    Left {
        conversation: String,
        user: String,
    },
    /// A thread's followers when subscribed; changes follow.
    ThreadSnapshot {
        conversation: String,
        thread: u64,
        /// The latest reply's thread seq.
        latest_seq: u64,
        followers: Vec<FollowerState>,
    },
    /// A follower's public cursor in a subscribed thread advanced (or they
    /// became a follower).
    ThreadCursor {
        conversation: String,
        thread: u64,
        user: String,
        cursor: u64,
        join_seq: u64,
        latest_seq: u64,
    },
    /// A follower left the conversation: they are in none of its threads.
    ThreadLeft {
        conversation: String,
        thread: u64,
        user: String,
    },
    /// The connected user's own state in a thread they follow changed (a
    /// read on any of their devices, a new reply), with their unread there
    /// and over the conversation's threads they follow. `following: false`
    /// once they left the conversation.
    OwnThread {
        conversation: String,
        thread: u64,
        cursor: u64,
        private_cursor: u64,
        latest_seq: u64,
        /// latest_seq - max(cursor, private_cursor), at least 0.
        unread: u64,
        thread_unread: u64,
        following: bool,
    },
    /// The connected user's own state in a conversation changed (any of
    /// their devices): their cursors, unread mark, unread mentions or mute.
    Own {
        conversation: String,
        #[serde(flatten)]
        own: OwnState,
        latest_seq: u64,
    },
    /// The user's app badge as the badge stage published it, on every
    /// device of theirs: the number to show, what it counts over all their
    /// conversations, and when it was published (ms since the epoch; a
    /// client never shows an older one after a newer one).
    Badge {
        badge: u64,
        conversations: u64,
        messages: u64,
        mentions: u64,
        updated_at: i64,
    },
    /// The broker has a read receipt, delivery report, mark, mute or
    /// mark-all-read the client sent.
    Ack {
        id: Option<String>,
    },
    Error {
        /// Stable: `bad_message`, `not_a_member`, `invalid_seq`,
        /// `unavailable`, `not_subscribed`.
        code: &'static str,
        message: String,
        id: Option<String>,
    },
    Pong,
}

impl ServerFrame {
    /// The `badge` frame of a badge published at `updated_at`.
    pub fn badge(badge: &readfold_core::badge::Badge, updated_at: i64) -> Self {
        ServerFrame::Badge {
            badge: badge.badge,
            conversations: badge.totals.conversations,
            messages: badge.totals.messages,
            mentions: badge.totals.mentions,
            updated_at,
        }
    }

    pub fn error(code: &'static str, message: impl Into<String>, id: Option<String>) -> Self {
        ServerFrame::Error {
            code,
            message: message.into(),
            id,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("frames serialize")
    }

    /// The frame as sent; a shared frame is serialized once for all.
    pub fn json(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ServerFrame::ReadCounts { shared, own } => {
                let base = shared.json.get_or_init(|| {
                    ServerFrame::ReadCounts {
                        shared: shared.clone(),
                        own: None,
                    }
                    .to_json()
                });
                match own {
                    None => base.as_str().into(),
                    // The shared part, then this connection's own.
                    Some(own) => format!(
                        "{},\"own\":{}}}",
                        &base[..base.len() - 1],
                        serde_json::to_string(own).expect("frames serialize")
                    )
                    .into(),
                }
            }
            _ => self.to_json().into(),
        }
    }

    /// The conversation a frame is about and its `latest_seq`, if it has one.
    pub fn latest_seq(&self) -> Option<(&str, u64)> {
        match self {
            ServerFrame::Snapshot {
                conversation,
                latest_seq,
                ..
            }
            | ServerFrame::Cursors {
                conversation,
                latest_seq,
                ..
            }
            | ServerFrame::Cursor {
                conversation,
                latest_seq,
                ..
            }
            | ServerFrame::Own {
                conversation,
                latest_seq,
                ..
            } => Some((conversation.as_str(), *latest_seq)),
            ServerFrame::ReadCounts { shared, .. } => {
                Some((shared.value.conversation.as_str(), shared.value.latest_seq))
            }
            _ => None,
        }
    }

    /// Sets the frame's `latest_seq` (a shared frame is copied first).
    pub fn set_latest_seq(&mut self, to: u64) {
        match self {
            ServerFrame::Snapshot { latest_seq, .. }
            | ServerFrame::Cursors { latest_seq, .. }
            | ServerFrame::Cursor { latest_seq, .. }
            | ServerFrame::Own { latest_seq, .. } => *latest_seq = to,
            ServerFrame::ReadCounts { shared, .. } => {
                let mut value = shared.value.clone();
                value.latest_seq = to;
                *shared = SharedFrame::new(value);
            }
            _ => {}
        }
    }
}

impl<T: Serialize> Serialize for SharedFrame<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_messages_parse_and_unknown_fields_are_refused() {
        let read: ClientMessage =
            serde_json::from_str(r#"{"type":"read","conversation":"G","seq":3,"id":"r1"}"#).unwrap();
        assert_eq!(
            read,
            ClientMessage::Read {
                conversation: "G".into(),
                seq: 3,
                private: false,
                thread: None,
                id: Some("r1".into()),
                traceparent: None,
            }
        );
        let traced: ClientMessage = serde_json::from_str(
            r#"{"type":"read","conversation":"G","seq":3,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#,
        )
        .unwrap();
        assert!(matches!(traced, ClientMessage::Read { traceparent: Some(t), .. } if t.ends_with("-01")));
        assert!(serde_json::from_str::<ClientMessage>(
            r#"{"type":"read","conversation":"G","seq":3,"sneaky":1}"#
        )
        .is_err());
        assert!(serde_json::from_str::<ClientMessage>(r#"{"type":"fly"}"#).is_err());
        assert_eq!(
            serde_json::from_str::<ClientMessage>(r#"{"type":"ping"}"#).unwrap(),
            ClientMessage::Ping
        );
    }

    #[test]
    fn mark_all_read_parses_and_badge_frames_serialize() {
        assert_eq!(
            serde_json::from_str::<ClientMessage>(r#"{"type":"mark_all_read","id":"a1"}"#).unwrap(),
            ClientMessage::MarkAllRead {
                id: Some("a1".into())
            }
        );
        assert_eq!(
            serde_json::from_str::<ClientMessage>(r#"{"type":"mark_all_read"}"#).unwrap(),
            ClientMessage::MarkAllRead { id: None }
        );
        assert!(
            serde_json::from_str::<ClientMessage>(r#"{"type":"mark_all_read","conversation":"G"}"#).is_err()
        );
        let badge = readfold_core::badge::Badge {
            badge: 3,
            totals: readfold_core::badge::Totals {
                conversations: 2,
                messages: 5,
                mentions: 1,
            },
        };
        let json: serde_json::Value =
            serde_json::from_str(&ServerFrame::badge(&badge, 1700).to_json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type":"badge","badge":3,"conversations":2,"messages":5,"mentions":1,"updated_at":1700})
        );
    }

    #[test]
    fn a_delivery_report_parses_and_takes_no_private_flag() {
        let delivered: ClientMessage =
            serde_json::from_str(r#"{"type":"delivered","conversation":"G","seq":7,"id":"d1"}"#).unwrap();
        assert_eq!(
            delivered,
            ClientMessage::Delivered {
                conversation: "G".into(),
                seq: 7,
                id: Some("d1".into())
            }
        );
        assert!(serde_json::from_str::<ClientMessage>(
            r#"{"type":"delivered","conversation":"G","seq":7,"private":true}"#
        )
        .is_err());
    }

    #[test]
    fn member_frames_carry_the_delivered_cursor_beside_the_cursor() {
        let json = ServerFrame::Cursor {
            conversation: "G".into(),
            user: "bob".into(),
            cursor: 3,
            delivered: 5,
            join_seq: 1,
            latest_seq: 5,
        }
        .to_json();
        assert_eq!(
            json,
            r#"{"type":"cursor","conversation":"G","user":"bob","cursor":3,"delivered":5,"join_seq":1,"latest_seq":5}"#
        );
        let counts = ServerFrame::ReadCounts {
            shared: SharedFrame::new(ReadCounts {
                conversation: "G".into(),
                latest_seq: 2,
                member_count: 3,
                first_seq: 1,
                counts: vec![Some(1), None],
                read_by_all_through: 0,
                delivered_counts: vec![Some(2), None],
                delivered_to_all_through: 1,
            }),
            own: None,
        };
        let value: serde_json::Value = serde_json::from_str(&counts.json()).unwrap();
        assert_eq!(value["delivered_counts"], serde_json::json!([2, null]));
        assert_eq!(value["delivered_to_all_through"], 1);
    }

    #[test]
    fn mute_and_unmute_parse_and_an_unmute_takes_no_time() {
        let parse = |json: &str| serde_json::from_str::<ClientMessage>(json);
        assert_eq!(
            parse(r#"{"type":"mute","conversation":"G","until":1700000000000,"id":"m1"}"#).unwrap(),
            ClientMessage::Mute {
                conversation: "G".into(),
                until: Some(1_700_000_000_000),
                id: Some("m1".into())
            }
        );
        assert_eq!(
            parse(r#"{"type":"mute","conversation":"G"}"#).unwrap(),
            ClientMessage::Mute {
                conversation: "G".into(),
                until: None,
                id: None
            }
        );
        assert_eq!(
            parse(r#"{"type":"unmute","conversation":"G","id":"u1"}"#).unwrap(),
            ClientMessage::Unmute {
                conversation: "G".into(),
                id: Some("u1".into())
            }
        );
        assert!(parse(r#"{"type":"unmute","conversation":"G","until":5}"#).is_err());
        assert!(parse(r#"{"type":"mute","conversation":"G","until":"soon"}"#).is_err());
    }

    #[test]
    fn own_state_carries_unread_mentions_and_the_mute() {
        let frame = ServerFrame::Own {
            conversation: "G".into(),
            own: OwnState {
                cursor: 3,
                private_cursor: 4,
                unread_mark: false,
                unread_mentions: 2,
                muted_until: None,
                thread_unread: 6,
            },
            latest_seq: 5,
        };
        assert_eq!(
            frame.to_json(),
            r#"{"type":"own","conversation":"G","cursor":3,"private_cursor":4,"unread_mark":false,"unread_mentions":2,"muted_until":null,"thread_unread":6,"latest_seq":5}"#
        );
        let own = |mute| OwnCursor {
            unread_mentions: 7,
            mute,
            ..OwnCursor::default()
        };
        let at = |until| Some(Mute { at: 1, until });
        assert_eq!(OwnState::of(&own(None)).muted_until, None);
        assert_eq!(OwnState::of(&own(at(Mute::OFF))).muted_until, None, "unmuted");
        assert_eq!(
            OwnState::of(&own(at(Mute::FOREVER))).muted_until,
            Some(MUTED_UNTIL_UNMUTED)
        );
        assert_eq!(OwnState::of(&own(at(90))).muted_until, Some(90));
        assert_eq!(OwnState::of(&own(at(-90))).muted_until, Some(0), "ran out");
        assert_eq!(OwnState::of(&own(None)).unread_mentions, 7);
        // The own part of read counts has the same fields.
        let counts = ServerFrame::ReadCounts {
            shared: SharedFrame::new(ReadCounts {
                conversation: "G".into(),
                latest_seq: 2,
                member_count: 3,
                first_seq: 1,
                counts: vec![],
                read_by_all_through: 0,
                delivered_counts: vec![],
                delivered_to_all_through: 0,
            }),
            own: Some(OwnState::of(&own(at(Mute::FOREVER)))),
        };
        let value: serde_json::Value = serde_json::from_str(&counts.json()).unwrap();
        assert_eq!(value["own"]["unread_mentions"], 7);
        assert_eq!(value["own"]["muted_until"], i64::MAX);
    }

    #[test]
    fn thread_messages_parse_and_thread_frames_serialize() {
        let parse = |json: &str| serde_json::from_str::<ClientMessage>(json);
        assert_eq!(
            parse(r#"{"type":"subscribe_thread","conversation":"G","thread":4}"#).unwrap(),
            ClientMessage::SubscribeThread {
                conversation: "G".into(),
                thread: 4
            }
        );
        assert!(parse(r#"{"type":"subscribe_thread","conversation":"G"}"#).is_err());
        assert!(matches!(
            parse(r#"{"type":"read","conversation":"G","seq":2,"thread":4,"private":true}"#).unwrap(),
            ClientMessage::Read {
                thread: Some(4),
                seq: 2,
                private: true,
                ..
            }
        ));
        let own = ServerFrame::OwnThread {
            conversation: "G".into(),
            thread: 4,
            cursor: 1,
            private_cursor: 2,
            latest_seq: 5,
            unread: 3,
            thread_unread: 7,
            following: true,
        };
        assert_eq!(
            own.to_json(),
            r#"{"type":"own_thread","conversation":"G","thread":4,"cursor":1,"private_cursor":2,"latest_seq":5,"unread":3,"thread_unread":7,"following":true}"#
        );
        assert_eq!(own.latest_seq(), None, "a thread seq is not the conversation's");
    }

    #[test]
    fn frames_are_tagged() {
        let json = ServerFrame::Left {
            conversation: "G".into(),
            user: "u".into(),
        }
        .to_json();
        assert_eq!(json, r#"{"type":"left","conversation":"G","user":"u"}"#);
    }
}
