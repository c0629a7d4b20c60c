//! Avro encode/decode of the wire contract, with no I/O.
//!
//! The schemas are the `.avsc` files in `schemas/`, compiled in, so the files
//! are the one source of truth. Inputs may be plain Avro binary or framed in
//! the Confluent wire format (magic byte 0, 4-byte schema id, Avro binary).
//! Outputs are plain Avro binary.

mod fast;
pub(crate) mod fast_encode;
mod records;
#[cfg(test)]
mod tests;
mod threads;

use std::io::Read;
use std::str::FromStr;
use std::sync::OnceLock;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;

pub(crate) use fast::Cursor;
pub(crate) use fast_encode::{write_cursor_update, write_key, write_member_state, Writer};
pub use fast_encode::{CursorUpdateFields, MemberStateFields};
pub use records::{
    ConversationEventRecord, ConversationEventView, CursorKeyRecord, CursorUpdateRecord, EventRecord,
    EventView, MemberStateRecord, ReadAction, ReadReportRecord, ReadReportView, UserCursorKeyRecord,
};
pub use threads::{
    decode_thread_cursor, decode_thread_key, decode_thread_state, decode_user_thread_key,
    encode_thread_cursor, encode_thread_key, encode_thread_state, encode_user_thread_key, ThreadCursorFields,
    ThreadCursorRecord, ThreadKeyRecord, ThreadMarkRecord, ThreadStateFields, ThreadStateRecord,
};
pub(crate) use threads::{write_thread_cursor, write_thread_key, write_thread_state, write_user_thread_key};

/// Largest single allocation the Avro decoder may make for one field, so a
/// corrupt length prefix cannot make it reserve gigabytes. (Before the
/// generic reader runs, `overlong_length` also holds every length prefix to
/// the bytes actually there.)
pub const MAX_AVRO_ALLOCATION: usize = 16 * 1024 * 1024;

/// The parsed v1 schemas.
pub struct Schemas {
    pub read_report: Schema,
    pub conversation_event: Schema,
    pub cursor_key: Schema,
    pub user_cursor_key: Schema,
    pub cursor_update: Schema,
    pub member_state: Schema,
    pub thread_cursor_key: Schema,
    pub user_thread_cursor_key: Schema,
    pub thread_cursor_update: Schema,
    pub thread_state: Schema,
    /// Earlier versions of evolved schemas, newest first: records written
    /// with them still decode, with the added fields at their defaults.
    pub read_report_history: Vec<Schema>,
    pub conversation_event_history: Vec<Schema>,
    pub cursor_update_history: Vec<Schema>,
    pub member_state_history: Vec<Schema>,
}

pub const READ_REPORT_AVSC: &str = include_str!("../../../../schemas/ReadReport.avsc");
pub const CONVERSATION_EVENT_AVSC: &str = include_str!("../../../../schemas/ConversationEvent.avsc");
pub const CURSOR_KEY_AVSC: &str = include_str!("../../../../schemas/CursorKey.avsc");
pub const USER_CURSOR_KEY_AVSC: &str = include_str!("../../../../schemas/UserCursorKey.avsc");
pub const CURSOR_UPDATE_AVSC: &str = include_str!("../../../../schemas/CursorUpdate.avsc");
pub const MEMBER_STATE_AVSC: &str = include_str!("../../../../schemas/MemberState.avsc");
pub const THREAD_CURSOR_KEY_AVSC: &str = include_str!("../../../../schemas/ThreadCursorKey.avsc");
pub const USER_THREAD_CURSOR_KEY_AVSC: &str = include_str!("../../../../schemas/UserThreadCursorKey.avsc");
pub const THREAD_CURSOR_UPDATE_AVSC: &str = include_str!("../../../../schemas/ThreadCursorUpdate.avsc");
pub const THREAD_STATE_AVSC: &str = include_str!("../../../../schemas/ThreadState.avsc");
/// Earlier versions of the evolved schemas, kept to read what their
/// producers wrote.
pub const READ_REPORT_V1_0_AVSC: &str = include_str!("../../../../schemas/history/ReadReport.v1.avsc");
pub const READ_REPORT_V1_1_AVSC: &str = include_str!("../../../../schemas/history/ReadReport.v1.1.avsc");
pub const READ_REPORT_V1_2_AVSC: &str = include_str!("../../../../schemas/history/ReadReport.v1.2.avsc");
pub const CURSOR_UPDATE_V1_0_AVSC: &str = include_str!("../../../../schemas/history/CursorUpdate.v1.avsc");
pub const CURSOR_UPDATE_V1_1_AVSC: &str = include_str!("../../../../schemas/history/CursorUpdate.v1.1.avsc");
pub const CONVERSATION_EVENT_V1_0_AVSC: &str =
    include_str!("../../../../schemas/history/ConversationEvent.v1.avsc");
pub const CONVERSATION_EVENT_V1_2_AVSC: &str =
    include_str!("../../../../schemas/history/ConversationEvent.v1.2.avsc");
pub const MEMBER_STATE_V1_0_AVSC: &str = include_str!("../../../../schemas/history/MemberState.v1.avsc");

/// The schemas, parsed once. The files are compiled in and covered by tests,
/// so a parse failure is a build defect, not a runtime condition.
pub fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        let parse = |name: &str, text: &str| {
            Schema::parse_str(text).unwrap_or_else(|e| panic!("schemas/{name}.avsc: {e}"))
        };
        Schemas {
            read_report: parse("ReadReport", READ_REPORT_AVSC),
            conversation_event: parse("ConversationEvent", CONVERSATION_EVENT_AVSC),
            cursor_key: parse("CursorKey", CURSOR_KEY_AVSC),
            user_cursor_key: parse("UserCursorKey", USER_CURSOR_KEY_AVSC),
            cursor_update: parse("CursorUpdate", CURSOR_UPDATE_AVSC),
            member_state: parse("MemberState", MEMBER_STATE_AVSC),
            thread_cursor_key: parse("ThreadCursorKey", THREAD_CURSOR_KEY_AVSC),
            user_thread_cursor_key: parse("UserThreadCursorKey", USER_THREAD_CURSOR_KEY_AVSC),
            thread_cursor_update: parse("ThreadCursorUpdate", THREAD_CURSOR_UPDATE_AVSC),
            thread_state: parse("ThreadState", THREAD_STATE_AVSC),
            read_report_history: vec![
                parse("history/ReadReport.v1.2", READ_REPORT_V1_2_AVSC),
                parse("history/ReadReport.v1.1", READ_REPORT_V1_1_AVSC),
                parse("history/ReadReport.v1", READ_REPORT_V1_0_AVSC),
            ],
            conversation_event_history: vec![
                parse("history/ConversationEvent.v1.2", CONVERSATION_EVENT_V1_2_AVSC),
                parse("history/ConversationEvent.v1", CONVERSATION_EVENT_V1_0_AVSC),
            ],
            member_state_history: vec![parse("history/MemberState.v1", MEMBER_STATE_V1_0_AVSC)],
            cursor_update_history: vec![
                parse("history/CursorUpdate.v1.1", CURSOR_UPDATE_V1_1_AVSC),
                parse("history/CursorUpdate.v1", CURSOR_UPDATE_V1_0_AVSC),
            ],
        }
    })
}

/// How input values are framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WireFormat {
    /// Confluent framing when the first byte is 0 and it decodes so, plain
    /// Avro otherwise. A valid plain record never starts with 0: that would
    /// be an empty conversation id.
    #[default]
    Auto,
    Plain,
    Confluent,
}

impl FromStr for WireFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "plain" => Ok(Self::Plain),
            "confluent" => Ok(Self::Confluent),
            other => Err(format!(
                "unknown wire format {other:?} (expected auto, plain or confluent)"
            )),
        }
    }
}

/// Why bytes are not a record of the expected schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty payload")]
    Empty,
    #[error("bad magic byte {0:#04x} (Confluent framing starts with 0x00)")]
    BadMagic(u8),
    #[error("Confluent frame shorter than its 5-byte header")]
    ShortFrame,
    #[error("not valid Avro for {schema}: {reason}")]
    Avro { schema: &'static str, reason: String },
    #[error("{0} bytes left over after the record")]
    TrailingBytes(usize),
    #[error("unexpected Avro value shape for {0}")]
    Shape(&'static str),
}

/// Strips the Confluent header if the format says so.
pub fn unframe(bytes: &[u8], format: WireFormat) -> Result<&[u8], DecodeError> {
    let first = *bytes.first().ok_or(DecodeError::Empty)?;
    let framed = match format {
        WireFormat::Plain => false,
        WireFormat::Confluent if first != 0 => return Err(DecodeError::BadMagic(first)),
        WireFormat::Confluent => true,
        WireFormat::Auto => first == 0,
    };
    if !framed {
        return Ok(bytes);
    }
    bytes.get(5..).ok_or(DecodeError::ShortFrame)
}

/// Prepends the Confluent header (for producers that use a schema registry).
pub fn frame_confluent(schema_id: u32, avro: &[u8]) -> Vec<u8> {
    let mut out = Writer::with_capacity(avro.len() + 5);
    out.confluent_frame(schema_id);
    let mut out = out.into_bytes();
    out.extend_from_slice(avro);
    out
}

/// A schema's reader and writer, resolved once: resolving a schema per
/// record would cost more than decoding it.
struct SchemaCodec {
    name: &'static str,
    /// The current schema, which `reader` reads with.
    schema: &'static Schema,
    reader: GenericDatumReader<'static>,
    writer: GenericDatumWriter<'static>,
    /// Readers of earlier versions, each with the schema it reads with,
    /// resolved to the current schema; tried in order when the current one
    /// does not fit the bytes.
    history: Vec<(&'static Schema, GenericDatumReader<'static>)>,
}

struct Codecs {
    read_report: SchemaCodec,
    conversation_event: SchemaCodec,
    cursor_key: SchemaCodec,
    user_cursor_key: SchemaCodec,
    cursor_update: SchemaCodec,
    member_state: SchemaCodec,
}

fn codecs() -> &'static Codecs {
    static CODECS: OnceLock<Codecs> = OnceLock::new();
    CODECS.get_or_init(|| {
        let s = schemas();
        // The schemas are compiled in and covered by tests, as in `schemas()`.
        let codec = |name: &'static str, schema: &'static Schema, history: &'static [Schema]| SchemaCodec {
            name,
            schema,
            reader: GenericDatumReader::builder(schema)
                .build()
                .unwrap_or_else(|e| panic!("schemas/{name}.avsc: {e}")),
            writer: GenericDatumWriter::builder(schema)
                .build()
                .unwrap_or_else(|e| panic!("schemas/{name}.avsc: {e}")),
            history: history
                .iter()
                .map(|old| {
                    let reader = GenericDatumReader::builder(old)
                        .reader_schema(schema)
                        .build()
                        .unwrap_or_else(|e| panic!("schemas/history of {name}: {e}"));
                    (old, reader)
                })
                .collect(),
        };
        Codecs {
            read_report: codec("ReadReport", &s.read_report, &s.read_report_history),
            conversation_event: codec(
                "ConversationEvent",
                &s.conversation_event,
                &s.conversation_event_history,
            ),
            cursor_key: codec("CursorKey", &s.cursor_key, &[]),
            user_cursor_key: codec("UserCursorKey", &s.user_cursor_key, &[]),
            cursor_update: codec("CursorUpdate", &s.cursor_update, &s.cursor_update_history),
            member_state: codec("MemberState", &s.member_state, &s.member_state_history),
        }
    })
}

/// Decodes with the current schema and, when the bytes do not fit it, with
/// each earlier version (appended fields make an older record end too soon
/// for a newer schema, and a newer record too long for an older one, so at
/// most one fits).
/// The error is the current schema's.
fn decode_value(codec: &SchemaCodec, bytes: &[u8]) -> Result<Value, DecodeError> {
    let current = read_whole(&codec.reader, codec.schema, codec.name, bytes);
    if current.is_ok() {
        return current;
    }
    codec
        .history
        .iter()
        .find_map(|(schema, old)| read_whole(old, schema, codec.name, bytes).ok())
        .map_or(current, Ok)
}

/// Reads all of `bytes` with `reader`, whose writer schema is `schema`.
fn read_whole(
    reader: &GenericDatumReader<'_>,
    schema: &Schema,
    name: &'static str,
    bytes: &[u8],
) -> Result<Value, DecodeError> {
    if let Some((len, left)) = overlong_length(schema, bytes) {
        return Err(DecodeError::Avro {
            schema: name,
            reason: format!("a length prefix of {len} bytes where {left} are left"),
        });
    }
    let mut input = Whole(bytes);
    let value = reader.read_value(&mut input).map_err(|e| DecodeError::Avro {
        schema: name,
        reason: e.to_string(),
    })?;
    if !input.0.is_empty() {
        return Err(DecodeError::TrailingBytes(input.0.len()));
    }
    Ok(value)
}

/// The bytes of one record, for the generic reader. Reading past their end
/// is an error of its own kind: apache-avro reads a union index, a boolean
/// or a string that meets `UnexpectedEof` as a null, which would let a
/// record cut short decode (a CursorUpdate ending in the `unread_mark`
/// branch index 1 read as `unread_mark: None`).
struct Whole<'a>(&'a [u8]);

impl Read for Whole<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.is_empty() && !buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the record ends early",
            ));
        }
        self.0.read(buf)
    }
}

/// The first string or bytes length prefix in `bytes`, read as a datum of
/// `schema`, that claims more bytes than are left after it: `(length,
/// bytes left)`. The generic reader allocates (and zeroes) a length's worth,
/// up to [`MAX_AVRO_ALLOCATION`], before it finds the bytes missing, so
/// without this check a 5-byte record could cost 16 MiB. Walks the datum
/// as the reader does; stops with no finding at a bad varint, union index
/// or negative length, where the reader fails too, and at a type that
/// readfold's schemas do not use.
fn overlong_length(schema: &Schema, bytes: &[u8]) -> Option<(i64, usize)> {
    enum Stop {
        Overlong(i64, usize),
        Elsewhere,
    }
    fn walk(schema: &Schema, c: &mut fast::Cursor<'_>) -> Result<(), Stop> {
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => c.skip(1).ok_or(Stop::Elsewhere),
            Schema::Int
            | Schema::Long
            | Schema::Enum(_)
            | Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => c.long().map(drop).ok_or(Stop::Elsewhere),
            Schema::String | Schema::Bytes => {
                let len = c.long().ok_or(Stop::Elsewhere)?;
                let n = usize::try_from(len).map_err(|_| Stop::Elsewhere)?;
                let left = c.left();
                c.skip(n).ok_or(Stop::Overlong(len, left))
            }
            Schema::Union(union) => {
                let index = c.long().ok_or(Stop::Elsewhere)?;
                let variant = usize::try_from(index)
                    .ok()
                    .and_then(|i| union.variants().get(i))
                    .ok_or(Stop::Elsewhere)?;
                walk(variant, c)
            }
            Schema::Record(record) => record.fields.iter().try_for_each(|f| walk(&f.schema, c)),
            // Blocks of items; a negative count is followed by the block's size.
            Schema::Array(array) => loop {
                let count = c.long().ok_or(Stop::Elsewhere)?;
                if count == 0 {
                    return Ok(());
                }
                if count < 0 {
                    c.long().ok_or(Stop::Elsewhere)?;
                }
                for _ in 0..count.unsigned_abs() {
                    if c.left() == 0 {
                        return Err(Stop::Elsewhere);
                    }
                    walk(&array.items, c)?;
                }
            },
            _ => Err(Stop::Elsewhere),
        }
    }
    match walk(schema, &mut fast::Cursor::new(bytes)) {
        Err(Stop::Overlong(len, left)) => Some((len, left)),
        _ => None,
    }
}

fn encode_value(codec: &SchemaCodec, value: Value) -> Vec<u8> {
    // Values are built from typed records that match the compiled-in schemas;
    // the unit tests round-trip every record type.
    codec
        .writer
        .write_value_to_vec(value)
        .expect("record matches its schema")
}

/// Decodes an input value. In `Auto` mode a value starting with 0 is tried as
/// a Confluent frame first and as plain Avro after, so that a plain record
/// with an empty first id is reported as such rather than as garbage.
fn decode_input<'a, T>(
    bytes: &'a [u8],
    format: WireFormat,
    decode: impl Fn(&'a [u8]) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    let framed = decode(unframe(bytes, format)?);
    match framed {
        Err(e) if format == WireFormat::Auto && bytes.first() == Some(&0) => decode(bytes).map_err(|_| e),
        other => other,
    }
}

/// A record as its decoder read it: borrowed from the bytes by the fast
/// decoder, or owned from the generic reader (earlier schema versions).
pub enum Decoded<V, R> {
    Borrowed(V),
    Owned(R),
}

pub fn decode_read_report(bytes: &[u8], format: WireFormat) -> Result<ReadReportRecord, DecodeError> {
    Ok(match decode_read_report_view(bytes, format)? {
        Decoded::Borrowed(view) => view.to_record(),
        Decoded::Owned(record) => record,
    })
}

/// [`decode_read_report`], borrowing the strings where it can: the
/// processor's and replay's hot path.
pub fn decode_read_report_view(
    bytes: &[u8],
    format: WireFormat,
) -> Result<Decoded<ReadReportView<'_>, ReadReportRecord>, DecodeError> {
    decode_input(bytes, format, |b| match fast::read_report(b) {
        Some(view) => Ok(Decoded::Borrowed(view)),
        None => ReadReportRecord::from_value(decode_value(&codecs().read_report, b)?).map(Decoded::Owned),
    })
}

pub fn encode_read_report(record: &ReadReportRecord) -> Vec<u8> {
    encode_value(&codecs().read_report, record.to_value())
}

pub fn decode_conversation_event(
    bytes: &[u8],
    format: WireFormat,
) -> Result<ConversationEventRecord, DecodeError> {
    Ok(match decode_conversation_event_view(bytes, format)? {
        Decoded::Borrowed(view) => view.to_record(),
        Decoded::Owned(record) => record,
    })
}

/// [`decode_conversation_event`], borrowing the strings where it can.
pub fn decode_conversation_event_view(
    bytes: &[u8],
    format: WireFormat,
) -> Result<Decoded<ConversationEventView<'_>, ConversationEventRecord>, DecodeError> {
    decode_input(bytes, format, |b| match fast::conversation_event(b) {
        Some(view) => Ok(Decoded::Borrowed(view)),
        None => ConversationEventRecord::from_value(decode_value(&codecs().conversation_event, b)?)
            .map(Decoded::Owned),
    })
}

pub fn encode_conversation_event(record: &ConversationEventRecord) -> Vec<u8> {
    encode_value(&codecs().conversation_event, record.to_value())
}

pub fn decode_cursor_key(bytes: &[u8]) -> Result<CursorKeyRecord, DecodeError> {
    match fast::cursor_key(bytes) {
        Some(record) => Ok(record),
        None => CursorKeyRecord::from_value(decode_value(&codecs().cursor_key, bytes)?),
    }
}

pub fn encode_cursor_key(record: &CursorKeyRecord) -> Vec<u8> {
    fast_encode::cursor_key(record)
}

pub fn decode_user_cursor_key(bytes: &[u8]) -> Result<UserCursorKeyRecord, DecodeError> {
    match fast::user_cursor_key(bytes) {
        Some(record) => Ok(record),
        None => UserCursorKeyRecord::from_value(decode_value(&codecs().user_cursor_key, bytes)?),
    }
}

pub fn encode_user_cursor_key(record: &UserCursorKeyRecord) -> Vec<u8> {
    fast_encode::user_cursor_key(record)
}

pub fn decode_cursor_update(bytes: &[u8]) -> Result<CursorUpdateRecord, DecodeError> {
    match fast::cursor_update(bytes) {
        Some(record) => Ok(record),
        None => CursorUpdateRecord::from_value(decode_value(&codecs().cursor_update, bytes)?),
    }
}

/// The conversation id and latest seq of a `CursorUpdate` (any version),
/// borrowed, without building the record; `None` if it does not decode.
pub fn cursor_update_latest(bytes: &[u8]) -> Option<(&str, i64)> {
    fast::cursor_update_latest(bytes)
}

pub fn encode_cursor_update(record: &CursorUpdateRecord) -> Vec<u8> {
    fast_encode::cursor_update(record)
}

pub fn decode_member_state(bytes: &[u8]) -> Result<MemberStateRecord, DecodeError> {
    match fast::member_state(bytes) {
        Some(record) => Ok(record),
        None => MemberStateRecord::from_value(decode_value(&codecs().member_state, bytes)?),
    }
}

pub fn encode_member_state(record: &MemberStateRecord) -> Vec<u8> {
    fast_encode::member_state(record)
}

/// Encodes a read report as v1.0 did: for tests that old records still decode.
#[doc(hidden)]
pub fn encode_historic_read_report(record: &ReadReportRecord) -> Vec<u8> {
    let schema = &schemas().read_report_history[2];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        fields.retain(|(name, _)| !["action", "muted_until", "thread"].contains(&name.as_str()));
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("v1.0 record")
}

/// Encodes a changelog value as v1.0 did: for tests that old records still
/// decode.
#[doc(hidden)]
pub fn encode_historic_cursor_update(record: &CursorUpdateRecord) -> Vec<u8> {
    let schema = &schemas().cursor_update_history[1];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        let added = [
            "private_cursor",
            "unread_mark",
            "delivered_cursor",
            "unread_mentions",
            "muted_until",
        ];
        fields.retain(|(name, _)| !added.contains(&name.as_str()));
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("v1.0 record")
}

/// Encodes a changelog value as v1.1 did: for tests that old records still
/// decode.
#[doc(hidden)]
pub fn encode_v1_1_cursor_update(record: &CursorUpdateRecord) -> Vec<u8> {
    let schema = &schemas().cursor_update_history[0];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        let added = ["delivered_cursor", "unread_mentions", "muted_until"];
        fields.retain(|(name, _)| !added.contains(&name.as_str()));
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("v1.1 record")
}

/// Encodes a read report as v1.1 did: for tests that old records still
/// decode.
#[doc(hidden)]
pub fn encode_v1_1_read_report(record: &ReadReportRecord) -> Vec<u8> {
    let schema = &schemas().read_report_history[1];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        fields.retain(|(name, _)| name != "muted_until" && name != "thread");
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("v1.1 record")
}

/// Encodes a read report as v1.2 did: for tests that old records still
/// decode.
#[doc(hidden)]
pub fn encode_v1_2_read_report(record: &ReadReportRecord) -> Vec<u8> {
    let schema = &schemas().read_report_history[0];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        fields.retain(|(name, _)| name != "thread");
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("v1.2 record")
}

/// Encodes a conversation event as v1.2 did (no thread fields): for tests
/// that old records still decode.
#[doc(hidden)]
pub fn encode_v1_2_conversation_event(record: &ConversationEventRecord) -> Vec<u8> {
    encode_event_without(record, 0, &["thread", "thread_seq", "starter_id"])
}

/// `record` written with `conversation_event_history[version]`, its
/// `MessageSent` without the fields that version lacks.
fn encode_event_without(record: &ConversationEventRecord, version: usize, added: &[&str]) -> Vec<u8> {
    let schema = &schemas().conversation_event_history[version];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        for (name, field) in fields.iter_mut() {
            if let (true, Value::Union(_, inner)) = (name == "event", field) {
                if let Value::Record(event) = inner.as_mut() {
                    event.retain(|(name, _)| !added.contains(&name.as_str()));
                }
            }
        }
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("a record of an earlier version")
}

/// Encodes a conversation event as v1.0 did (no mentions): for tests that
/// old records still decode.
#[doc(hidden)]
pub fn encode_historic_conversation_event(record: &ConversationEventRecord) -> Vec<u8> {
    let added = ["mentions", "mention_all", "thread", "thread_seq", "starter_id"];
    encode_event_without(record, 1, &added)
}

/// Encodes a member-state value as v1.0 did: for tests that old records
/// still decode.
#[doc(hidden)]
pub fn encode_historic_member_state(record: &MemberStateRecord) -> Vec<u8> {
    let schema = &schemas().member_state_history[0];
    let mut value = record.to_value();
    if let Value::Record(fields) = &mut value {
        let added = ["mentions", "mute_at", "muted_until"];
        fields.retain(|(name, _)| !added.contains(&name.as_str()));
    }
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("v1.0 record")
}
