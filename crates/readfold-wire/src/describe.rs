//! One record of any of readfold's topics as JSON, decoded for the topic's
//! role: what `readfold tail` prints and what the tests read.

use serde_json::{json, Value};

use crate::codec::{self, WireFormat};
use crate::confluent::strip_changelog_frame as strip;

/// Which schema a topic's records follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicRole {
    ReadReports,
    ConversationEvents,
    ReadCursors,
    UserReadCursors,
    ThreadCursors,
    UserThreadCursors,
    DeadLetters,
}

fn lossy(bytes: Option<&[u8]>) -> Value {
    bytes.map_or(Value::Null, |b| {
        Value::String(String::from_utf8_lossy(b).into_owned())
    })
}

fn decoded<T: serde::Serialize>(result: Result<T, codec::DecodeError>) -> Value {
    match result {
        Ok(v) => serde_json::to_value(v).unwrap_or(Value::Null),
        Err(e) => json!({ "undecodable": e.to_string() }),
    }
}

/// One record as JSON: key and value decoded for the topic's role, and the
/// headers when there are any.
pub fn describe(
    role: TopicRole,
    format: WireFormat,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(String, String)],
) -> Value {
    let (key, value) = match role {
        TopicRole::ReadReports => (
            lossy(key),
            value.map_or(Value::Null, |v| decoded(codec::decode_read_report(v, format))),
        ),
        TopicRole::ConversationEvents => (
            lossy(key),
            value.map_or(Value::Null, |v| {
                decoded(codec::decode_conversation_event(v, format))
            }),
        ),
        TopicRole::ReadCursors => (
            key.map_or(Value::Null, |k| decoded(codec::decode_cursor_key(strip(k)))),
            value.map_or(Value::Null, |v| decoded(codec::decode_cursor_update(strip(v)))),
        ),
        TopicRole::UserReadCursors => (
            key.map_or(Value::Null, |k| decoded(codec::decode_user_cursor_key(strip(k)))),
            value.map_or(Value::Null, |v| decoded(codec::decode_cursor_update(strip(v)))),
        ),
        TopicRole::ThreadCursors | TopicRole::UserThreadCursors => {
            let key = key.map(strip).map(|k| match role {
                TopicRole::ThreadCursors => codec::decode_thread_key(k),
                _ => codec::decode_user_thread_key(k),
            });
            let shape = |schema| codec::DecodeError::Shape(schema);
            (
                key.map_or(Value::Null, |k| decoded(k.ok_or(shape("ThreadCursorKey")))),
                value.map_or(Value::Null, |v| {
                    decoded(codec::decode_thread_cursor(strip(v)).ok_or(shape("ThreadCursorUpdate")))
                }),
            )
        }
        TopicRole::DeadLetters => match value.and_then(crate::confluent::describe_dead_letter) {
            // Written for a schema registry: the original bytes are inside.
            Some(dead_letter) => (dead_letter["key"].clone(), dead_letter),
            None => (
                lossy(key),
                json!({ "bytes": value.map(<[u8]>::len), "text": lossy(value) }),
            ),
        },
    };
    let mut out = json!({ "key": key, "value": value });
    if !headers.is_empty() {
        out["headers"] = headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CursorKeyRecord, CursorUpdateRecord};

    #[test]
    fn describes_changelog_records_and_tombstones() {
        let key = codec::encode_cursor_key(&CursorKeyRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
        });
        let value = codec::encode_cursor_update(&CursorUpdateRecord {
            muted_until: None,
            unread_mentions: None,
            conversation_id: "G".into(),
            user_id: "u".into(),
            cursor: 3,
            join_seq: 1,
            latest_seq: 4,
            updated_at: 0,
            private_cursor: None,
            unread_mark: None,
            delivered_cursor: None,
        });
        let line = describe(
            TopicRole::ReadCursors,
            WireFormat::Auto,
            Some(&key),
            Some(&value),
            &[],
        );
        assert_eq!(line["key"]["user_id"], "u");
        assert_eq!(line["value"]["cursor"], 3);
        let tomb = describe(TopicRole::ReadCursors, WireFormat::Auto, Some(&key), None, &[]);
        assert!(tomb["value"].is_null());
    }

    #[test]
    fn describes_thread_records() {
        use crate::codec::{ThreadCursorRecord, ThreadKeyRecord};
        let key = ThreadKeyRecord {
            conversation_id: "G".into(),
            thread: 7,
            user_id: "u".into(),
        };
        let value = codec::encode_thread_cursor(&ThreadCursorRecord {
            conversation_id: "G".into(),
            thread: 7,
            user_id: "u".into(),
            cursor: 2,
            join_seq: 1,
            latest_seq: 3,
            updated_at: 0,
            private_cursor: Some(3),
        });
        let line = describe(
            TopicRole::UserThreadCursors,
            WireFormat::Auto,
            Some(&codec::encode_user_thread_key(&key)),
            Some(&value),
            &[],
        );
        assert_eq!(line["key"]["thread"], 7);
        assert_eq!(line["value"]["private_cursor"], 3);
        let line = describe(
            TopicRole::ThreadCursors,
            WireFormat::Auto,
            Some(&codec::encode_thread_key(&key)),
            None,
            &[],
        );
        assert_eq!(line["key"]["user_id"], "u");
        assert!(line["value"].is_null());
    }

    #[test]
    fn describes_dead_letters_with_headers() {
        let headers = vec![("readfold.reason".to_owned(), "decode_error".to_owned())];
        let line = describe(
            TopicRole::DeadLetters,
            WireFormat::Auto,
            Some(b"G"),
            Some(b"\xff"),
            &headers,
        );
        assert_eq!(line["headers"]["readfold.reason"], "decode_error");
        assert_eq!(line["value"]["bytes"], 1);
    }
}
