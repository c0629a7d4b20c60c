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
    /// Added in v1.1; v1.0 records decode as `Read`.
    pub action: ReadAction,
    /// Added in v1.2. `Mute` only: until when; `None`: until unmuted.
    pub muted_until: Option<i64>,
    /// Added in v1.3. `Read` only: the thread's root seq; 0: the conversation.
    pub thread: i64,
}

/// A [`ReadReportRecord`] with its strings borrowed, from the record's
/// bytes (the fast decoder) or from an owned record: validation reads
/// this, so that an id is copied once, into the fold's id, and not first
/// into a `String` it drops right after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadReportView<'a> {
    pub conversation_id: &'a str,
    pub user_id: &'a str,
    pub seq: i64,
    pub device_id: Option<&'a str>,
    pub reported_at: i64,
    pub private: bool,
    pub action: ReadAction,
    pub muted_until: Option<i64>,
    pub thread: i64,
}

impl ReadReportRecord {
    pub fn view(&self) -> ReadReportView<'_> {
        ReadReportView {
            conversation_id: &self.conversation_id,
            user_id: &self.user_id,
            seq: self.seq,
            device_id: self.device_id.as_deref(),
            reported_at: self.reported_at,
            private: self.private,
            action: self.action,
            muted_until: self.muted_until,
            thread: self.thread,
        }
    }
}

impl ReadReportView<'_> {
    pub fn to_record(&self) -> ReadReportRecord {
        ReadReportRecord {
            conversation_id: self.conversation_id.to_owned(),
            user_id: self.user_id.to_owned(),
            seq: self.seq,
            device_id: self.device_id.map(str::to_owned),
            reported_at: self.reported_at,
            private: self.private,
            action: self.action,
            muted_until: self.muted_until,
            thread: self.thread,
        }
    }
}

/// `readfold.v1.ReadAction`, symbols in schema order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReadAction {
    #[default]
    Read,
    MarkUnread,
    ClearUnreadMark,
    /// Added in v1.2.
    Delivered,
    /// Added in v1.2.
    Mute,
    /// Added in v1.2.
    Unmute,
}

impl ReadAction {
    const SYMBOLS: [&'static str; 6] = [
        "READ",
        "MARK_UNREAD",
        "CLEAR_UNREAD_MARK",
        "DELIVERED",
        "MUTE",
        "UNMUTE",
    ];

    fn index(self) -> u32 {
        match self {
            ReadAction::Read => 0,
            ReadAction::MarkUnread => 1,
            ReadAction::ClearUnreadMark => 2,
            ReadAction::Delivered => 3,
            ReadAction::Mute => 4,
            ReadAction::Unmute => 5,
        }
    }

    fn from_index(i: u32) -> Option<Self> {
        match i {
            0 => Some(ReadAction::Read),
            1 => Some(ReadAction::MarkUnread),
            2 => Some(ReadAction::ClearUnreadMark),
            3 => Some(ReadAction::Delivered),
            4 => Some(ReadAction::Mute),
            5 => Some(ReadAction::Unmute),
            _ => None,
        }
    }
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
    /// `mentions` and `mention_all` were added in v1.2, the thread fields
    /// in v1.3 (`thread` 0: a message of the conversation, not a reply).
    MessageSent {
        sender_id: String,
        mentions: Vec<String>,
        mention_all: bool,
        thread: i64,
        thread_seq: i64,
        starter_id: Option<String>,
    },
    MemberJoined {
        user_id: String,
    },
    MemberLeft {
        user_id: String,
    },
}

/// A [`ConversationEventRecord`] with its strings borrowed (see
/// [`ReadReportView`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversationEventView<'a> {
    pub conversation_id: &'a str,
    pub seq: i64,
    pub at: i64,
    pub event: EventView<'a>,
}

/// [`EventRecord`], borrowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventView<'a> {
    MessageSent {
        sender_id: &'a str,
        mentions: Vec<&'a str>,
        mention_all: bool,
        thread: i64,
        thread_seq: i64,
        starter_id: Option<&'a str>,
    },
    MemberJoined {
        user_id: &'a str,
    },
    MemberLeft {
        user_id: &'a str,
    },
}

impl ConversationEventRecord {
    pub fn view(&self) -> ConversationEventView<'_> {
        ConversationEventView {
            conversation_id: &self.conversation_id,
            seq: self.seq,
            at: self.at,
            event: match &self.event {
                EventRecord::MessageSent {
                    sender_id,
                    mentions,
                    mention_all,
                    thread,
                    thread_seq,
                    starter_id,
                } => EventView::MessageSent {
                    sender_id,
                    mentions: mentions.iter().map(String::as_str).collect(),
                    mention_all: *mention_all,
                    thread: *thread,
                    thread_seq: *thread_seq,
                    starter_id: starter_id.as_deref(),
                },
                EventRecord::MemberJoined { user_id } => EventView::MemberJoined { user_id },
                EventRecord::MemberLeft { user_id } => EventView::MemberLeft { user_id },
            },
        }
    }
}

impl ConversationEventView<'_> {
    pub fn to_record(&self) -> ConversationEventRecord {
        ConversationEventRecord {
            conversation_id: self.conversation_id.to_owned(),
            seq: self.seq,
            at: self.at,
            event: match &self.event {
                EventView::MessageSent {
                    sender_id,
                    mentions,
                    mention_all,
                    thread,
                    thread_seq,
                    starter_id,
                } => EventRecord::MessageSent {
                    sender_id: (*sender_id).to_owned(),
                    mentions: mentions.iter().map(|&m| m.to_owned()).collect(),
                    mention_all: *mention_all,
                    thread: *thread,
                    thread_seq: *thread_seq,
                    starter_id: starter_id.map(str::to_owned),
                },
                EventView::MemberJoined { user_id } => EventRecord::MemberJoined {
                    user_id: (*user_id).to_owned(),
                },
                EventView::MemberLeft { user_id } => EventRecord::MemberLeft {
                    user_id: (*user_id).to_owned(),
                },
            },
        }
    }
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
    /// Added in v1.1: by-user changelog only.
    pub private_cursor: Option<i64>,
    /// Added in v1.1: by-user changelog only.
    pub unread_mark: Option<bool>,
    /// Added in v1.2; `None` from earlier writers, read as `cursor`.
    pub delivered_cursor: Option<i64>,
    /// Added in v1.2: by-user changelog only.
    pub unread_mentions: Option<i32>,
    /// Added in v1.2: by-user changelog only; `None`: not muted.
    pub muted_until: Option<i64>,
}

/// `readfold.v1.MemberState`: value of the internal member-state topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberStateRecord {
    pub conversation_id: String,
    pub user_id: String,
    pub private_cursor: i64,
    pub mark_at: Option<i64>,
    pub mark_seq: Option<i64>,
    pub left: bool,
    pub membership_seq: Option<i64>,
    pub membership_at: Option<i64>,
    pub epoch: i64,
    pub updated_at: i64,
    /// Added in v1.2.
    pub mentions: Vec<i64>,
    /// Added in v1.2, with `muted_until`.
    pub mute_at: Option<i64>,
    pub muted_until: Option<i64>,
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

    fn optional_long(&mut self) -> Result<Option<i64>, DecodeError> {
        match self.next()? {
            Value::Union(_, inner) => match *inner {
                Value::Null => Ok(None),
                Value::Long(n) => Ok(Some(n)),
                _ => Err(DecodeError::Shape(self.schema)),
            },
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn optional_int(&mut self) -> Result<Option<i32>, DecodeError> {
        match self.next()? {
            Value::Union(_, inner) => match *inner {
                Value::Null => Ok(None),
                Value::Int(n) => Ok(Some(n)),
                _ => Err(DecodeError::Shape(self.schema)),
            },
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn optional_timestamp(&mut self) -> Result<Option<i64>, DecodeError> {
        match self.next()? {
            Value::Union(_, inner) => match *inner {
                Value::Null => Ok(None),
                Value::Long(n) | Value::TimestampMillis(n) => Ok(Some(n)),
                _ => Err(DecodeError::Shape(self.schema)),
            },
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn strings(&mut self) -> Result<Vec<String>, DecodeError> {
        match self.next()? {
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(DecodeError::Shape(self.schema)),
                })
                .collect(),
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn longs(&mut self) -> Result<Vec<i64>, DecodeError> {
        match self.next()? {
            Value::Array(items) => items
                .into_iter()
                .map(|v| match v {
                    Value::Long(n) => Ok(n),
                    _ => Err(DecodeError::Shape(self.schema)),
                })
                .collect(),
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn optional_boolean(&mut self) -> Result<Option<bool>, DecodeError> {
        match self.next()? {
            Value::Union(_, inner) => match *inner {
                Value::Null => Ok(None),
                Value::Boolean(b) => Ok(Some(b)),
                _ => Err(DecodeError::Shape(self.schema)),
            },
            _ => Err(DecodeError::Shape(self.schema)),
        }
    }

    fn action(&mut self) -> Result<ReadAction, DecodeError> {
        match self.next()? {
            Value::Enum(i, _) => ReadAction::from_index(i).ok_or(DecodeError::Shape(self.schema)),
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

fn optional(value: Option<Value>) -> Value {
    match value {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(v) => Value::Union(1, Box::new(v)),
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
            action: f.action()?,
            muted_until: f.optional_timestamp()?,
            thread: f.long()?,
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
            (
                "action",
                Value::Enum(
                    self.action.index(),
                    ReadAction::SYMBOLS[self.action.index() as usize].to_owned(),
                ),
            ),
            (
                "muted_until",
                optional(self.muted_until.map(Value::TimestampMillis)),
            ),
            ("thread", Value::Long(self.thread)),
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
                        mentions: g.strings()?,
                        mention_all: g.boolean()?,
                        thread: g.long()?,
                        thread_seq: g.long()?,
                        starter_id: g.optional_string()?,
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
        let (branch, event) = match &self.event {
            EventRecord::MessageSent {
                sender_id,
                mentions,
                mention_all,
                thread,
                thread_seq,
                starter_id,
            } => (
                0,
                record(vec![
                    ("sender_id", Value::String(sender_id.clone())),
                    (
                        "mentions",
                        Value::Array(mentions.iter().cloned().map(Value::String).collect()),
                    ),
                    ("mention_all", Value::Boolean(*mention_all)),
                    ("thread", Value::Long(*thread)),
                    ("thread_seq", Value::Long(*thread_seq)),
                    ("starter_id", optional(starter_id.clone().map(Value::String))),
                ]),
            ),
            EventRecord::MemberJoined { user_id } => {
                (1, record(vec![("user_id", Value::String(user_id.clone()))]))
            }
            EventRecord::MemberLeft { user_id } => {
                (2, record(vec![("user_id", Value::String(user_id.clone()))]))
            }
        };
        record(vec![
            ("conversation_id", Value::String(self.conversation_id.clone())),
            ("seq", Value::Long(self.seq)),
            ("at", Value::TimestampMillis(self.at)),
            ("event", Value::Union(branch, Box::new(event))),
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

    /// The generic writer's input, to hold the hand-written encoder to.
    #[cfg(test)]
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

    /// The generic writer's input, to hold the hand-written encoder to.
    #[cfg(test)]
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
            private_cursor: f.optional_long()?,
            unread_mark: f.optional_boolean()?,
            delivered_cursor: f.optional_long()?,
            unread_mentions: f.optional_int()?,
            muted_until: f.optional_timestamp()?,
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
            ("private_cursor", optional(self.private_cursor.map(Value::Long))),
            ("unread_mark", optional(self.unread_mark.map(Value::Boolean))),
            (
                "delivered_cursor",
                optional(self.delivered_cursor.map(Value::Long)),
            ),
            ("unread_mentions", optional(self.unread_mentions.map(Value::Int))),
            (
                "muted_until",
                optional(self.muted_until.map(Value::TimestampMillis)),
            ),
        ])
    }
}

impl MemberStateRecord {
    pub(super) fn from_value(value: Value) -> Result<Self, DecodeError> {
        let mut f = Fields::of(value, "MemberState")?;
        Ok(MemberStateRecord {
            conversation_id: f.string()?,
            user_id: f.string()?,
            private_cursor: f.long()?,
            mark_at: f.optional_long()?,
            mark_seq: f.optional_long()?,
            left: f.boolean()?,
            membership_seq: f.optional_long()?,
            membership_at: f.optional_long()?,
            epoch: f.long()?,
            updated_at: f.long()?,
            mentions: f.longs()?,
            mute_at: f.optional_long()?,
            muted_until: f.optional_long()?,
        })
    }

    /// The generic writer's input, to hold the hand-written encoder to.
    pub(super) fn to_value(&self) -> Value {
        record(vec![
            ("conversation_id", Value::String(self.conversation_id.clone())),
            ("user_id", Value::String(self.user_id.clone())),
            ("private_cursor", Value::Long(self.private_cursor)),
            ("mark_at", optional(self.mark_at.map(Value::Long))),
            ("mark_seq", optional(self.mark_seq.map(Value::Long))),
            ("left", Value::Boolean(self.left)),
            ("membership_seq", optional(self.membership_seq.map(Value::Long))),
            ("membership_at", optional(self.membership_at.map(Value::Long))),
            ("epoch", Value::Long(self.epoch)),
            ("updated_at", Value::TimestampMillis(self.updated_at)),
            (
                "mentions",
                Value::Array(self.mentions.iter().copied().map(Value::Long).collect()),
            ),
            ("mute_at", optional(self.mute_at.map(Value::Long))),
            ("muted_until", optional(self.muted_until.map(Value::Long))),
        ])
    }
}
