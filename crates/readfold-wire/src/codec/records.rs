//! The wire records as plain Rust structs, and their mapping to Avro values.
//! Field order follows the `.avsc` files; the tests check it against them.

use apache_avro::types::Value;
use serde::Serialize;

use super::DecodeError;

/// `readfold.v1.ReadReport` as it is on the wire (not yet validated).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadReportRecord {
    pub conversation_id: String,
    pub user_id: String,
    pub seq: i64,
    pub device_id: Option<String>,
    pub reported_at: i64,
    pub private: bool,
}

/// `readfold.v1.ConversationEvent` as it is on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConversationEventRecord {
    pub conversation_id: String,
    pub seq: i64,
    pub at: i64,
    pub event: EventRecord,
}

/// The `event` union, branches in schema order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type")]
pub enum EventRecord {
    MessageSent { sender_id: String },
    MemberJoined { user_id: String },
    MemberLeft { user_id: String },
}

/// `readfold.v1.CursorKey`: key of `chat.read-cursors`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CursorKeyRecord {
    pub conversation_id: String,
    pub user_id: String,
}

/// `readfold.v1.UserCursorKey`: key of `chat.user-read-cursors`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct UserCursorKeyRecord {
    pub user_id: String,
    pub conversation_id: String,
}

/// `readfold.v1.CursorUpdate`: value of both changelogs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CursorUpdateRecord {
    pub conversation_id: String,
    pub user_id: String,
    pub cursor: i64,
    pub join_seq: i64,
    pub latest_seq: i64,
    pub updated_at: i64,
}

/// Reads the fields of a decoded record by position; the decoder has already
/// checked them against the schema, so only the value kinds are matched.
struct Fields {
    fields: std::vec::IntoIter<(String, Value)>,
    schema: &'static str,
}

impl Fields {
    fn of(value: Value, schema: &'static str) -> Result<Self, DecodeError> {
        match value {
            Value::Record(fields) => Ok(Fields {
                fields: fields.into_iter(),
                schema,
            }),
            _ => Err(DecodeError::Shape(schema)),
        }
    }

    fn next(&mut self) -> Result<Value, DecodeError> {
        self.fields
            .next()
            .map(|(_, v)| v)
            .ok_or(DecodeError::Shape(self.schema))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        match self.next()? {
            Value::String(s) => Ok(s),
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn long(&mut self) -> Result<i64, DecodeError> {
        match self.next()? {
            Value::Long(n) | Value::TimestampMillis(n) => Ok(n),
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn boolean(&mut self) -> Result<bool, DecodeError> {
        match self.next()? {
            Value::Boolean(b) => Ok(b),
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn optional_string(&mut self) -> Result<Option<String>, DecodeError> {
        match self.next()? {
            Value::Union(_, inner) => match *inner {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s)),
                _ => Err(DecodeError::Shape(self.schema)),
            },
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }
}

fn record(fields: Vec<(&str, Value)>) -> Value {
    Value::Record(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

impl ReadReportRecord {
    pub(super) fn from_value(value: Value) -> Result<Self, DecodeError> {
        let mut f = Fields::of(value, "ReadReport")?;
        Ok(ReadReportRecord {
            conversation_id: f.string()?,
            user_id: f.string()?,
            seq: f.long()?,
            device_id: f.optional_string()?,
            reported_at: f.long()?,
            private: f.boolean()?,
        })
    }

    pub(super) fn to_value(&self) -> Value {
        let device = match &self.device_id {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(d) => Value::Union(1, Box::new(Value::String(d.clone()))),
        };
        record(vec![
            ("conversation_id", Value::String(self.conversation_id.clone())),
            ("user_id", Value::String(self.user_id.clone())),
            ("seq", Value::Long(self.seq)),
            ("device_id", device),
            ("reported_at", Value::TimestampMillis(self.reported_at)),
            ("private", Value::Boolean(self.private)),
        ])
    }
}

impl ConversationEventRecord {
    pub(super) fn from_value(value: Value) -> Result<Self, DecodeError> {
        const NAME: &str = "ConversationEvent";
        let mut f = Fields::of(value, NAME)?;
        let conversation_id = f.string()?;
        let seq = f.long()?;
        let at = f.long()?;
        let event = match f.next()? {
            Value::Union(branch, inner) => {
                let mut g = Fields::of(*inner, NAME)?;
                match branch {
                    0 => EventRecord::MessageSent {
                        sender_id: g.string()?,
                    },
                    1 => EventRecord::MemberJoined { user_id: g.string()? },
                    2 => EventRecord::MemberLeft { user_id: g.string()? },
                    _ => return Err(DecodeError::Shape(NAME)),
                }
            }
            _ => return Err(DecodeError::Shape(NAME)),
        };
        Ok(ConversationEventRecord {
            conversation_id,
            seq,
            at,
            event,
        })
    }

    pub(super) fn to_value(&self) -> Value {
        let (branch, field, id) = match &self.event {
            EventRecord::MessageSent { sender_id } => (0, "sender_id", sender_id),
            EventRecord::MemberJoined { user_id } => (1, "user_id", user_id),
            EventRecord::MemberLeft { user_id } => (2, "user_id", user_id),
        };
        record(vec![
            ("conversation_id", Value::String(self.conversation_id.clone())),
            ("seq", Value::Long(self.seq)),
            ("at", Value::TimestampMillis(self.at)),
            (
                "event",
                Value::Union(branch, Box::new(record(vec![(field, Value::String(id.clone()))]))),
            ),
        ])
    }
}

impl CursorKeyRecord {
    pub(super) fn from_value(value: Value) -> Result<Self, DecodeError> {
        let mut f = Fields::of(value, "CursorKey")?;
        Ok(CursorKeyRecord {
            conversation_id: f.string()?,
            user_id: f.string()?,
        })
    }

    pub(super) fn to_value(&self) -> Value {
        record(vec![
            ("conversation_id", Value::String(self.conversation_id.clone())),
            ("user_id", Value::String(self.user_id.clone())),
        ])
    }
}

impl UserCursorKeyRecord {
    pub(super) fn from_value(value: Value) -> Result<Self, DecodeError> {
        let mut f = Fields::of(value, "UserCursorKey")?;
        Ok(UserCursorKeyRecord {
            user_id: f.string()?,
            conversation_id: f.string()?,
        })
    }

    pub(super) fn to_value(&self) -> Value {
        record(vec![
            ("user_id", Value::String(self.user_id.clone())),
            ("conversation_id", Value::String(self.conversation_id.clone())),
        ])
    }
}

impl CursorUpdateRecord {
    pub(super) fn from_value(value: Value) -> Result<Self, DecodeError> {
        let mut f = Fields::of(value, "CursorUpdate")?;
        Ok(CursorUpdateRecord {
            conversation_id: f.string()?,
            user_id: f.string()?,
            cursor: f.long()?,
            join_seq: f.long()?,
            latest_seq: f.long()?,
            updated_at: f.long()?,
        })
    }

    pub(super) fn to_value(&self) -> Value {
        record(vec![
            ("conversation_id", Value::String(self.conversation_id.clone())),
            ("user_id", Value::String(self.user_id.clone())),
            ("cursor", Value::Long(self.cursor)),
            ("join_seq", Value::Long(self.join_seq)),
            ("latest_seq", Value::Long(self.latest_seq)),
            ("updated_at", Value::TimestampMillis(self.updated_at)),
        ])
    }
}
