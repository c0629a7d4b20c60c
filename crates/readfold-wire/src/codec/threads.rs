//! The thread changelogs' records: `ThreadCursorKey`, `UserThreadCursorKey`,
//! `ThreadCursorUpdate` and `ThreadState`. One version each so far, written
//! and read by hand (a property test holds both to the generic Avro writer
//! of the compiled-in schemas).

use super::fast::Cursor;
use super::fast_encode::Writer;

/// `readfold.v1.ThreadCursorKey` (and `UserThreadCursorKey`, the same
/// triple written user first).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ThreadKeyRecord {
    pub conversation_id: String,
    pub thread: i64,
    pub user_id: String,
}

/// `readfold.v1.ThreadCursorUpdate`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ThreadCursorRecord {
    pub conversation_id: String,
    pub thread: i64,
    pub user_id: String,
    pub cursor: i64,
    pub join_seq: i64,
    pub latest_seq: i64,
    pub updated_at: i64,
    /// On the by-user topic only.
    pub private_cursor: Option<i64>,
}

/// One `readfold.v1.ThreadMark`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadMarkRecord {
    pub thread_seq: i64,
    pub seq: i64,
    pub at: i64,
}

/// `readfold.v1.ThreadState`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadStateRecord {
    pub conversation_id: String,
    pub thread: i64,
    /// Empty: the thread's own record.
    pub user_id: String,
    pub cursor: i64,
    pub private_cursor: i64,
    pub updated_at: i64,
    pub latest_seq: i64,
    pub last_reply_seq: Option<i64>,
    pub last_reply_at: Option<i64>,
    pub marks: Vec<ThreadMarkRecord>,
}

/// A `ThreadCursorUpdate` whose ids are borrowed: what a flush encodes
/// straight from the fold's changes, with no `String` per record.
#[derive(Clone, Copy, Debug)]
pub struct ThreadCursorFields<'a> {
    pub conversation_id: &'a str,
    pub thread: i64,
    pub user_id: &'a str,
    pub cursor: i64,
    pub join_seq: i64,
    pub latest_seq: i64,
    pub updated_at: i64,
    pub private_cursor: Option<i64>,
}

impl<'a> ThreadCursorFields<'a> {
    pub fn of(r: &'a ThreadCursorRecord) -> Self {
        ThreadCursorFields {
            conversation_id: &r.conversation_id,
            thread: r.thread,
            user_id: &r.user_id,
            cursor: r.cursor,
            join_seq: r.join_seq,
            latest_seq: r.latest_seq,
            updated_at: r.updated_at,
            private_cursor: r.private_cursor,
        }
    }
}

/// A `ThreadState` whose ids and marks are borrowed.
#[derive(Clone, Copy, Debug)]
pub struct ThreadStateFields<'a> {
    pub conversation_id: &'a str,
    pub thread: i64,
    /// Empty: the thread's own record.
    pub user_id: &'a str,
    pub cursor: i64,
    pub private_cursor: i64,
    pub updated_at: i64,
    pub latest_seq: i64,
    pub last_reply_seq: Option<i64>,
    pub last_reply_at: Option<i64>,
    pub marks: &'a [ThreadMarkRecord],
}

impl<'a> ThreadStateFields<'a> {
    pub fn of(r: &'a ThreadStateRecord) -> Self {
        ThreadStateFields {
            conversation_id: &r.conversation_id,
            thread: r.thread,
            user_id: &r.user_id,
            cursor: r.cursor,
            private_cursor: r.private_cursor,
            updated_at: r.updated_at,
            latest_seq: r.latest_seq,
            last_reply_seq: r.last_reply_seq,
            last_reply_at: r.last_reply_at,
            marks: &r.marks,
        }
    }
}

/// A thread key, conversation first (`ThreadCursorKey`).
pub(crate) fn write_thread_key(w: &mut Writer, conversation_id: &str, thread: i64, user_id: &str) {
    w.string(conversation_id).long(thread).string(user_id);
}

/// A thread key, user first (`UserThreadCursorKey`).
pub(crate) fn write_user_thread_key(w: &mut Writer, user_id: &str, conversation_id: &str, thread: i64) {
    w.string(user_id).string(conversation_id).long(thread);
}

pub(crate) fn write_thread_cursor(w: &mut Writer, r: &ThreadCursorFields<'_>) {
    write_thread_key(w, r.conversation_id, r.thread, r.user_id);
    w.long(r.cursor)
        .long(r.join_seq)
        .long(r.latest_seq)
        .long(r.updated_at);
    match r.private_cursor {
        None => w.long(0),
        Some(p) => w.long(1).long(p),
    };
}

pub(crate) fn write_thread_state(w: &mut Writer, r: &ThreadStateFields<'_>) {
    write_thread_key(w, r.conversation_id, r.thread, r.user_id);
    w.long(r.cursor)
        .long(r.private_cursor)
        .long(r.updated_at)
        .long(r.latest_seq);
    for optional in [r.last_reply_seq, r.last_reply_at] {
        match optional {
            None => w.long(0),
            Some(v) => w.long(1).long(v),
        };
    }
    if !r.marks.is_empty() {
        w.long(r.marks.len() as i64);
        for m in r.marks {
            w.long(m.thread_seq).long(m.seq).long(m.at);
        }
    }
    w.long(0);
}

pub fn encode_thread_key(key: &ThreadKeyRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(32);
    write_thread_key(&mut w, &key.conversation_id, key.thread, &key.user_id);
    w.done()
}

pub fn encode_user_thread_key(key: &ThreadKeyRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(32);
    write_user_thread_key(&mut w, &key.user_id, &key.conversation_id, key.thread);
    w.done()
}

pub fn encode_thread_cursor(record: &ThreadCursorRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(48);
    write_thread_cursor(&mut w, &ThreadCursorFields::of(record));
    w.done()
}

pub fn encode_thread_state(record: &ThreadStateRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(64);
    write_thread_state(&mut w, &ThreadStateFields::of(record));
    w.done()
}

/// A `ThreadCursorKey`, or `None` when the bytes are anything else.
pub fn decode_thread_key(bytes: &[u8]) -> Option<ThreadKeyRecord> {
    let mut c = Cursor::new(bytes);
    let key = ThreadKeyRecord {
        conversation_id: c.string()?,
        thread: c.long()?,
        user_id: c.string()?,
    };
    c.end(key)
}

/// A `UserThreadCursorKey`, or `None` when the bytes are anything else.
pub fn decode_user_thread_key(bytes: &[u8]) -> Option<ThreadKeyRecord> {
    let mut c = Cursor::new(bytes);
    let user_id = c.string()?;
    let conversation_id = c.string()?;
    let thread = c.long()?;
    c.end(ThreadKeyRecord {
        conversation_id,
        thread,
        user_id,
    })
}

/// A `ThreadCursorUpdate`, or `None` when the bytes are anything else.
pub fn decode_thread_cursor(bytes: &[u8]) -> Option<ThreadCursorRecord> {
    let mut c = Cursor::new(bytes);
    let record = ThreadCursorRecord {
        conversation_id: c.string()?,
        thread: c.long()?,
        user_id: c.string()?,
        cursor: c.long()?,
        join_seq: c.long()?,
        latest_seq: c.long()?,
        updated_at: c.long()?,
        private_cursor: c.optional_long()?,
    };
    c.end(record)
}

/// A `ThreadState`, or `None` when the bytes are anything else.
pub fn decode_thread_state(bytes: &[u8]) -> Option<ThreadStateRecord> {
    let mut c = Cursor::new(bytes);
    let record = ThreadStateRecord {
        conversation_id: c.string()?,
        thread: c.long()?,
        user_id: c.string()?,
        cursor: c.long()?,
        private_cursor: c.long()?,
        updated_at: c.long()?,
        latest_seq: c.long()?,
        last_reply_seq: c.optional_long()?,
        last_reply_at: c.optional_long()?,
        marks: c.array(|c| {
            Some(ThreadMarkRecord {
                thread_seq: c.long()?,
                seq: c.long()?,
                at: c.long()?,
            })
        })?,
    };
    c.end(record)
}

/// The records as generic Avro values, for the tests that hold the hand
/// written codecs to the schemas.
#[cfg(test)]
mod values {
    use apache_avro::types::Value;

    use super::*;

    fn optional_long(v: Option<i64>) -> Value {
        match v {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(v) => Value::Union(1, Box::new(Value::Long(v))),
        }
    }

    fn record(fields: Vec<(&str, Value)>) -> Value {
        Value::Record(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }

    pub(super) fn key(k: &ThreadKeyRecord) -> Value {
        record(vec![
            ("conversation_id", Value::String(k.conversation_id.clone())),
            ("thread", Value::Long(k.thread)),
            ("user_id", Value::String(k.user_id.clone())),
        ])
    }

    pub(super) fn user_key(k: &ThreadKeyRecord) -> Value {
        record(vec![
            ("user_id", Value::String(k.user_id.clone())),
            ("conversation_id", Value::String(k.conversation_id.clone())),
            ("thread", Value::Long(k.thread)),
        ])
    }

    pub(super) fn cursor(r: &ThreadCursorRecord) -> Value {
        record(vec![
            ("conversation_id", Value::String(r.conversation_id.clone())),
            ("thread", Value::Long(r.thread)),
            ("user_id", Value::String(r.user_id.clone())),
            ("cursor", Value::Long(r.cursor)),
            ("join_seq", Value::Long(r.join_seq)),
            ("latest_seq", Value::Long(r.latest_seq)),
            ("updated_at", Value::TimestampMillis(r.updated_at)),
            ("private_cursor", optional_long(r.private_cursor)),
        ])
    }

    pub(super) fn state(r: &ThreadStateRecord) -> Value {
        let marks = r
            .marks
            .iter()
            .map(|m| {
                record(vec![
                    ("thread_seq", Value::Long(m.thread_seq)),
                    ("seq", Value::Long(m.seq)),
                    ("at", Value::Long(m.at)),
                ])
            })
            .collect();
        record(vec![
            ("conversation_id", Value::String(r.conversation_id.clone())),
            ("thread", Value::Long(r.thread)),
            ("user_id", Value::String(r.user_id.clone())),
            ("cursor", Value::Long(r.cursor)),
            ("private_cursor", Value::Long(r.private_cursor)),
            ("updated_at", Value::TimestampMillis(r.updated_at)),
            ("latest_seq", Value::Long(r.latest_seq)),
            ("last_reply_seq", optional_long(r.last_reply_seq)),
            ("last_reply_at", optional_long(r.last_reply_at)),
            ("marks", Value::Array(marks)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use apache_avro::types::Value;
    use apache_avro::writer::datum::GenericDatumWriter;
    use apache_avro::Schema;
    use proptest::prelude::*;

    use super::*;
    use crate::codec::schemas;

    fn generic(schema: &Schema, value: Value) -> Vec<u8> {
        GenericDatumWriter::builder(schema)
            .build()
            .and_then(|w| w.write_value_to_vec(value))
            .unwrap()
    }

    proptest! {
        #[test]
        fn thread_records_are_written_as_the_generic_writer_writes_them_and_read_back(
            c in "\\PC{0,8}",
            u in "[a-z0-9]{0,6}",
            longs in proptest::array::uniform7(any::<i64>()),
            optional in proptest::array::uniform3(proptest::option::of(any::<i64>())),
            marks in proptest::collection::vec(proptest::array::uniform3(any::<i64>()), 0..3),
        ) {
            let s = schemas();
            let key = ThreadKeyRecord { conversation_id: c.clone(), thread: longs[0], user_id: u.clone() };
            let bytes = encode_thread_key(&key);
            prop_assert_eq!(&bytes, &generic(&s.thread_cursor_key, values::key(&key)));
            prop_assert_eq!(decode_thread_key(&bytes), Some(key.clone()));
            let bytes = encode_user_thread_key(&key);
            prop_assert_eq!(&bytes, &generic(&s.user_thread_cursor_key, values::user_key(&key)));
            prop_assert_eq!(decode_user_thread_key(&bytes), Some(key));
            let cursor = ThreadCursorRecord {
                conversation_id: c.clone(),
                thread: longs[0],
                user_id: u.clone(),
                cursor: longs[1],
                join_seq: longs[2],
                latest_seq: longs[3],
                updated_at: longs[4],
                private_cursor: optional[0],
            };
            let bytes = encode_thread_cursor(&cursor);
            prop_assert_eq!(&bytes, &generic(&s.thread_cursor_update, values::cursor(&cursor)));
            prop_assert_eq!(decode_thread_cursor(&bytes), Some(cursor));
            let state = ThreadStateRecord {
                conversation_id: c,
                thread: longs[0],
                user_id: u,
                cursor: longs[1],
                private_cursor: longs[5],
                updated_at: longs[4],
                latest_seq: longs[6],
                last_reply_seq: optional[1],
                last_reply_at: optional[2],
                marks: marks.iter().map(|m| ThreadMarkRecord { thread_seq: m[0], seq: m[1], at: m[2] }).collect(),
            };
            let bytes = encode_thread_state(&state);
            prop_assert_eq!(&bytes, &generic(&s.thread_state, values::state(&state)));
            prop_assert_eq!(decode_thread_state(&bytes), Some(state));
        }

        #[test]
        fn arbitrary_bytes_are_read_or_refused_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = (decode_thread_key(&bytes), decode_user_thread_key(&bytes));
            let _ = (decode_thread_cursor(&bytes), decode_thread_state(&bytes));
        }
    }
}
