//! The gateway's WebSocket protocol, `readfold.v1.json`: JSON text frames,
//! one message each, tagged by `type`. Documented in the README.

use std::sync::Arc;

use serde::{Deserialize, Serialize, Serializer};

/// The subprotocol a client asks for (`Sec-WebSocket-Protocol`).
pub const PROTOCOL: &str = "readfold.v1.json";

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
    /// A read receipt: the user has seen every message up to `seq`.
    /// Acknowledged with `ack` once the broker has it.
    Read {
        conversation: String,
        seq: u64,
        #[serde(default)]
        private: bool,
        /// Echoed in the `ack` or `error`.
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
    Ping,
}

/// A present member in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberState {
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

/// The connected user's own view of a conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OwnState {
    pub cursor: u64,
    pub private_cursor: u64,
    pub unread_mark: bool,
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
    /// A member's public cursor advanced (or they joined), in a conversation
    /// smaller than `gateway.batch_from_members`.
    Cursor {
        conversation: String,
        user: String,
        cursor: u64,
        join_seq: u64,
        latest_seq: u64,
    },
    /// A member left.
    Left {
        conversation: String,
        user: String,
    },
    /// The connected user's own state in a conversation changed (any of
    /// their devices): their cursors and unread mark.
    Own {
        conversation: String,
        cursor: u64,
        private_cursor: u64,
        unread_mark: bool,
        latest_seq: u64,
    },
    /// The broker has a read receipt or mark the client sent.
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
                id: Some("r1".into())
            }
        );
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
    fn frames_are_tagged() {
        let json = ServerFrame::Left {
            conversation: "G".into(),
            user: "u".into(),
        }
        .to_json();
        assert_eq!(json, r#"{"type":"left","conversation":"G","user":"u"}"#);
    }
}
