//! The badge stage's records: `UserBadge` (its output) and `UserAction`
//! (its second input). A flush encodes a `UserBadge` per changed user, as
//! many as the stage takes records, so it has a hand-written encoder (held
//! to the generic writer by a property test); the rest are few enough for
//! the generic Avro reader and writer.

use std::sync::OnceLock;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::Schema;

use readfold_core::badge::{Badge, Totals};

use crate::codec::fast_encode::Writer;
use crate::codec::{unframe, DecodeError, WireFormat};

pub const USER_BADGE_AVSC: &str = include_str!("../../../schemas/UserBadge.avsc");
pub const USER_ACTION_AVSC: &str = include_str!("../../../schemas/UserAction.avsc");

fn schema(name: &'static str, text: &'static str, cell: &'static OnceLock<Schema>) -> &'static Schema {
    // Compiled in and covered by tests: a parse failure is a build defect.
    cell.get_or_init(|| Schema::parse_str(text).unwrap_or_else(|e| panic!("schemas/{name}.avsc: {e}")))
}

pub fn user_badge_schema() -> &'static Schema {
    static S: OnceLock<Schema> = OnceLock::new();
    schema("UserBadge", USER_BADGE_AVSC, &S)
}

pub fn user_action_schema() -> &'static Schema {
    static S: OnceLock<Schema> = OnceLock::new();
    schema("UserAction", USER_ACTION_AVSC, &S)
}

/// A `UserBadge` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserBadgeRecord {
    pub user_id: String,
    pub badge: Badge,
    pub updated_at: i64,
}

/// What a user asked for over all their conversations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserActionKind {
    MarkAllRead,
}

/// A `UserAction` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserActionRecord {
    pub user_id: String,
    pub action: UserActionKind,
    pub at: i64,
}

pub fn encode_user_badge(r: &UserBadgeRecord) -> Vec<u8> {
    encode_badge(&r.user_id, &r.badge, r.updated_at)
}

/// A `UserBadge` value of these parts, without building the record.
pub fn encode_badge(user_id: &str, badge: &Badge, updated_at: i64) -> Vec<u8> {
    let long = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Writer::with_capacity(user_id.len() + 32)
        .string(user_id)
        .long(long(badge.badge))
        .long(long(badge.totals.conversations))
        .long(long(badge.totals.messages))
        .long(long(badge.totals.mentions))
        .long(updated_at)
        .done()
}

/// [`encode_user_badge`] by the generic writer, which the property test
/// holds it to.
#[cfg(test)]
fn encode_user_badge_generic(r: &UserBadgeRecord) -> Vec<u8> {
    let long = |n: u64| Value::Long(i64::try_from(n).unwrap_or(i64::MAX));
    let value = Value::Record(vec![
        ("user_id".into(), Value::String(r.user_id.clone())),
        ("badge".into(), long(r.badge.badge)),
        ("conversations".into(), long(r.badge.totals.conversations)),
        ("messages".into(), long(r.badge.totals.messages)),
        ("mentions".into(), long(r.badge.totals.mentions)),
        ("updated_at".into(), Value::TimestampMillis(r.updated_at)),
    ]);
    write(user_badge_schema(), value)
}

pub fn decode_user_badge(bytes: &[u8]) -> Result<UserBadgeRecord, DecodeError> {
    let shape = || DecodeError::Shape("UserBadge");
    let fields = record(user_badge_schema(), "UserBadge", bytes)?;
    let mut it = fields.into_iter().map(|(_, v)| v);
    let mut next = || it.next().ok_or_else(shape);
    let user_id = match next()? {
        Value::String(s) => s,
        _ => return Err(shape()),
    };
    let mut long = || match next()? {
        Value::Long(n) | Value::TimestampMillis(n) => Ok(n),
        _ => Err(shape()),
    };
    let badge = long()?.max(0) as u64;
    let totals = Totals {
        conversations: long()?.max(0) as u64,
        messages: long()?.max(0) as u64,
        mentions: long()?.max(0) as u64,
    };
    Ok(UserBadgeRecord {
        user_id,
        badge: Badge { badge, totals },
        updated_at: long()?,
    })
}

pub fn encode_user_action(r: &UserActionRecord) -> Vec<u8> {
    let value = Value::Record(vec![
        ("user_id".into(), Value::String(r.user_id.clone())),
        ("action".into(), Value::Enum(0, "MARK_ALL_READ".into())),
        ("at".into(), Value::TimestampMillis(r.at)),
    ]);
    write(user_action_schema(), value)
}

/// Decodes a user action, plain Avro or Confluent-framed as `format` says.
pub fn decode_user_action(bytes: &[u8], format: WireFormat) -> Result<UserActionRecord, DecodeError> {
    let shape = || DecodeError::Shape("UserAction");
    let fields = record(user_action_schema(), "UserAction", unframe(bytes, format)?)?;
    let mut it = fields.into_iter().map(|(_, v)| v);
    let user_id = match it.next() {
        Some(Value::String(s)) => s,
        _ => return Err(shape()),
    };
    let action = match it.next() {
        Some(Value::Enum(0, _)) => UserActionKind::MarkAllRead,
        _ => return Err(shape()),
    };
    let at = match it.next() {
        Some(Value::Long(n) | Value::TimestampMillis(n)) => n,
        _ => return Err(shape()),
    };
    Ok(UserActionRecord { user_id, action, at })
}

/// `value`, built from a typed record, encoded with its compiled-in schema.
fn write(schema: &'static Schema, value: Value) -> Vec<u8> {
    GenericDatumWriter::builder(schema)
        .build()
        .and_then(|w| w.write_value_to_vec(value))
        .expect("a record matches its schema")
}

/// All of `bytes` as a record of `schema`.
fn record(schema: &Schema, name: &'static str, bytes: &[u8]) -> Result<Vec<(String, Value)>, DecodeError> {
    let avro = |e: apache_avro::Error| DecodeError::Avro {
        schema: name,
        reason: e.to_string(),
    };
    let mut input = bytes;
    let value = GenericDatumReader::builder(schema)
        .build()
        .and_then(|r| r.read_value(&mut input))
        .map_err(avro)?;
    if !input.is_empty() {
        return Err(DecodeError::TrailingBytes(input.len()));
    }
    match value {
        Value::Record(fields) => Ok(fields),
        _ => Err(DecodeError::Shape(name)),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn badges_encode_as_the_generic_writer_does(
            user in "\\PC{0,12}",
            numbers in proptest::array::uniform4(any::<u64>()),
            at in any::<i64>(),
        ) {
            let record = UserBadgeRecord {
                user_id: user,
                badge: Badge {
                    badge: numbers[0],
                    totals: Totals { conversations: numbers[1], messages: numbers[2], mentions: numbers[3] },
                },
                updated_at: at,
            };
            prop_assert_eq!(encode_user_badge(&record), encode_user_badge_generic(&record));
        }
    }

    #[test]
    fn badges_and_actions_round_trip_and_garbage_is_an_error() {
        let badge = UserBadgeRecord {
            user_id: "alice".into(),
            badge: Badge {
                badge: 7,
                totals: Totals {
                    conversations: 2,
                    messages: 7,
                    mentions: 1,
                },
            },
            updated_at: 1_700_000_000_000,
        };
        assert_eq!(decode_user_badge(&encode_user_badge(&badge)).unwrap(), badge);
        let action = UserActionRecord {
            user_id: "alice".into(),
            action: UserActionKind::MarkAllRead,
            at: 5,
        };
        let bytes = encode_user_action(&action);
        assert_eq!(decode_user_action(&bytes, WireFormat::Auto).unwrap(), action);
        assert!(decode_user_action(b"\x02", WireFormat::Plain).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            decode_user_action(&long, WireFormat::Plain),
            Err(DecodeError::TrailingBytes(1))
        ));
    }
}
