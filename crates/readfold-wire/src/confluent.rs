//! readfold's output in the Confluent wire format (magic byte 0, 4-byte
//! schema id, Avro binary), for consumers that decode through a schema
//! registry (`KafkaAvroDeserializer`, Kafka Connect, ksqlDB). Pure: the ids
//! come from the registry adapter; here records are only re-framed.
//!
//! Subjects follow the TopicNameStrategy, `<topic>-key` and
//! `<topic>-value`. The changelogs keep their Avro bytes behind the header.
//! A dead letter becomes a `DeadLetter` record (schemas/DeadLetter.avsc)
//! that carries the original bytes, keyed by the original key as Avro
//! `bytes`, since a rejected record is by definition not of its topic's
//! schema.

use std::collections::HashMap;

use crate::changelog::{ChangelogFrames, OutRecord, OutputTopics};
use crate::codec::{self, frame_confluent, Cursor, Writer};
use crate::dead_letter::headers;

pub const DEAD_LETTER_AVSC: &str = include_str!("../../../schemas/DeadLetter.avsc");
/// The dead-letter key: the original key's bytes (written as Confluent's
/// serializers write `bytes`: raw, behind the header).
pub const DEAD_LETTER_KEY_AVSC: &str = r#""bytes""#;

/// Every subject readfold writes under, with its schema (Avro JSON).
pub fn output_subjects(out: &OutputTopics) -> Vec<(String, &'static str)> {
    let subject = |topic: &str, part: &str| format!("{topic}-{part}");
    vec![
        (subject(&out.read_cursors, "key"), codec::CURSOR_KEY_AVSC),
        (subject(&out.read_cursors, "value"), codec::CURSOR_UPDATE_AVSC),
        (
            subject(&out.user_read_cursors, "key"),
            codec::USER_CURSOR_KEY_AVSC,
        ),
        (
            subject(&out.user_read_cursors, "value"),
            codec::CURSOR_UPDATE_AVSC,
        ),
        (subject(&out.member_state, "key"), codec::CURSOR_KEY_AVSC),
        (subject(&out.member_state, "value"), codec::MEMBER_STATE_AVSC),
        (subject(&out.thread_cursors, "key"), codec::THREAD_CURSOR_KEY_AVSC),
        (
            subject(&out.thread_cursors, "value"),
            codec::THREAD_CURSOR_UPDATE_AVSC,
        ),
        (
            subject(&out.user_thread_cursors, "key"),
            codec::USER_THREAD_CURSOR_KEY_AVSC,
        ),
        (
            subject(&out.user_thread_cursors, "value"),
            codec::THREAD_CURSOR_UPDATE_AVSC,
        ),
        (subject(&out.thread_state, "key"), codec::THREAD_CURSOR_KEY_AVSC),
        (subject(&out.thread_state, "value"), codec::THREAD_STATE_AVSC),
        (subject(&out.dlq, "key"), DEAD_LETTER_KEY_AVSC),
        (subject(&out.dlq, "value"), DEAD_LETTER_AVSC),
    ]
}

/// The schema ids of each output topic's keys and values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Framing {
    ids: HashMap<String, (u32, u32)>,
    dlq: String,
}

impl Framing {
    /// From the ids the registry gave each of [`output_subjects`].
    pub fn new(out: &OutputTopics, ids: &HashMap<String, u32>) -> Result<Framing, String> {
        let mut topics = HashMap::new();
        for topic in [
            &out.read_cursors,
            &out.user_read_cursors,
            &out.member_state,
            &out.thread_cursors,
            &out.user_thread_cursors,
            &out.thread_state,
            &out.dlq,
        ] {
            let id = |part: &str| {
                let subject = format!("{topic}-{part}");
                ids.get(&subject)
                    .copied()
                    .ok_or(format!("no schema id for subject {subject}"))
            };
            topics.insert(topic.clone(), (id("key")?, id("value")?));
        }
        Ok(Framing {
            ids: topics,
            dlq: out.dlq.clone(),
        })
    }

    /// The frames of the changelog topics' records, for
    /// [`crate::changelog::EncodedRecords`]; the same as [`Framing::frame`]
    /// gives them.
    pub fn changelog_frames(&self, out: &OutputTopics) -> ChangelogFrames {
        let ids = |topic: &String| self.ids.get(topic).copied();
        ChangelogFrames {
            by_conversation: ids(&out.read_cursors),
            by_user: ids(&out.user_read_cursors),
            member_state: ids(&out.member_state),
            thread_by_conversation: ids(&out.thread_cursors),
            thread_by_user: ids(&out.user_thread_cursors),
            thread_state: ids(&out.thread_state),
        }
    }

    /// `record` as registry-aware consumers read it. Tombstones stay
    /// tombstones; a topic without ids is left as it is.
    pub fn frame(&self, mut record: OutRecord) -> OutRecord {
        let Some(&(key_id, value_id)) = self.ids.get(&record.topic) else {
            return record;
        };
        if record.topic == self.dlq {
            let value = dead_letter_value(&record);
            // Confluent's serializers write a primitive `bytes` value as the
            // bytes themselves, without Avro's length prefix, and their
            // deserializers read it so.
            record.key = record.key.map(|k| frame_confluent(key_id, &k));
            record.value = Some(frame_confluent(value_id, &value));
        } else {
            record.key = record.key.map(|k| frame_confluent(key_id, &k));
            record.value = record.value.map(|v| frame_confluent(value_id, &v));
        }
        record
    }
}

/// Whether a writer schema fetched from the registry is one readfold reads
/// `kind` with: the current or an earlier version of the topic's schema,
/// compared in Avro's Parsing Canonical Form (docs and order of attributes
/// do not matter; names, types and fields do).
pub fn accepts_input_schema(kind: readfold_core::fold::InputKind, writer_schema: &str) -> Result<(), String> {
    use readfold_core::fold::InputKind;
    let writer = apache_avro::Schema::parse_str(writer_schema)
        .map_err(|e| format!("the registered schema is not Avro: {e}"))?;
    let writer = normal_form(&writer);
    let schemas = codec::schemas();
    let (name, known): (&str, Vec<&apache_avro::Schema>) = match kind {
        InputKind::ReadReports => (
            "ReadReport",
            std::iter::once(&schemas.read_report)
                .chain(&schemas.read_report_history)
                .collect(),
        ),
        InputKind::ConversationEvents => (
            "ConversationEvent",
            std::iter::once(&schemas.conversation_event)
                .chain(&schemas.conversation_event_history)
                .collect(),
        ),
    };
    if known.iter().any(|s| normal_form(s) == writer) {
        Ok(())
    } else {
        Err(format!(
            "the registered schema is not a version of readfold's {name} schema"
        ))
    }
}

/// The Parsing Canonical Form, made stable: apache-avro writes a logical
/// type's base as `{"type":"long"}` and a re-parsed one as `"long"`, so
/// one more round makes two equal schemas compare equal.
fn normal_form(schema: &apache_avro::Schema) -> String {
    let canonical = schema.canonical_form();
    apache_avro::Schema::parse_str(&canonical).map_or(canonical, |s| s.canonical_form())
}

/// The Confluent header's schema id, and the Avro bytes behind it, when
/// `bytes` is framed.
pub fn unframe(bytes: &[u8]) -> Option<(u32, &[u8])> {
    match bytes {
        [0, a, b, c, d, rest @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        _ => None,
    }
}

/// A changelog key or value without its Confluent header, if it has one.
/// Unambiguous: every changelog key and value schema starts with a
/// non-empty string, whose length prefix is never the byte 0.
pub fn strip_changelog_frame(bytes: &[u8]) -> &[u8] {
    match unframe(bytes) {
        Some((_, avro)) => avro,
        None => bytes,
    }
}

fn header<'a>(record: &'a OutRecord, name: &str) -> Option<&'a str> {
    record
        .headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

/// The `DeadLetter` record of a dead letter, from its headers and bytes.
fn dead_letter_value(record: &OutRecord) -> Vec<u8> {
    let mut out = Writer::with_capacity(
        64 + record.key.as_ref().map_or(0, Vec::len) + record.value.as_ref().map_or(0, Vec::len),
    );
    let text = |name| header(record, name).unwrap_or_default();
    out.string(text(headers::REASON))
        .string(text(headers::DETAIL))
        .string(text(headers::SOURCE_TOPIC))
        .long(text(headers::SOURCE_PARTITION).parse().unwrap_or(-1))
        .long(text(headers::SOURCE_OFFSET).parse().unwrap_or(-1));
    for bytes in [&record.key, &record.value] {
        match bytes {
            None => out.long(0),
            Some(b) => out.long(1).bytes(b),
        };
    }
    match header(record, headers::TRUNCATED) {
        None => out.long(0),
        Some(t) => out.long(1).string(t),
    };
    out.done()
}

/// A dead letter as JSON, when `value` is a framed `DeadLetter`: what
/// `readfold tail` prints.
pub fn describe_dead_letter(value: &[u8]) -> Option<serde_json::Value> {
    let (_, avro) = unframe(value)?;
    let mut c = Cursor::new(avro);
    let reason = c.string()?;
    let detail = c.string()?;
    let source_topic = c.string()?;
    let source_partition = c.long()?;
    let source_offset = c.long()?;
    let mut optional_bytes = || match c.index(2)? {
        0 => Some(None),
        _ => c.bytes().map(Some),
    };
    let key = optional_bytes()?;
    let original = optional_bytes()?;
    let truncated = match c.index(2)? {
        0 => None,
        _ => Some(c.string()?),
    };
    c.end(())?;
    let lossy = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
    Some(serde_json::json!({
        "reason": reason,
        "detail": detail,
        "source_topic": source_topic,
        "source_partition": source_partition,
        "source_offset": source_offset,
        "key": lossy(key),
        "value_bytes": original.map(<[u8]>::len),
        "value_text": lossy(original),
        "truncated": truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changelog::OutputLayout;
    use crate::codec::{decode_cursor_key, encode_cursor_key, CursorKeyRecord};

    fn out() -> OutputTopics {
        OutputTopics {
            thread_cursors: "chat.thread-cursors".into(),
            thread_state: "chat.read-thread-state".into(),
            user_thread_cursors: "chat.user-thread-cursors".into(),
            read_cursors: "c".into(),
            user_read_cursors: "u".into(),
            member_state: "m".into(),
            dlq: "d".into(),
            layout: OutputLayout {
                user_thread_cursors_partitions: 4,
                user_read_cursors_partitions: 1,
                dlq_partitions: 1,
            },
        }
    }

    fn framing() -> Framing {
        let ids = output_subjects(&out())
            .into_iter()
            .enumerate()
            .map(|(i, (subject, _))| (subject, 100 + i as u32))
            .collect();
        Framing::new(&out(), &ids).unwrap()
    }

    #[test]
    fn every_output_schema_parses_and_every_subject_needs_an_id() {
        for (subject, schema) in output_subjects(&out()) {
            apache_avro::Schema::parse_str(schema).unwrap_or_else(|e| panic!("{subject}: {e}"));
        }
        assert!(Framing::new(&out(), &HashMap::new()).is_err());
    }

    #[test]
    fn a_flush_frames_its_encoded_records_as_frame_does() {
        use crate::changelog::{changelog_records, EncodedRecords};
        use readfold_core::fold::{ConversationEvent, EventKind, PartitionState, ReadReport};
        let event = |seq: u64, kind: EventKind| ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: readfold_core::Seq(seq),
            at: 5,
            kind,
        };
        let report = |user: &str, seq: u64, private: bool| ReadReport {
            conversation_id: "G".parse().unwrap(),
            user_id: user.parse().unwrap(),
            seq: readfold_core::Seq(seq),
            reported_at: 9,
            private,
        };
        let mut state = PartitionState::new();
        for user in ["alice", "bob", "carol"] {
            state.apply_event(&event(
                1,
                EventKind::MemberJoined {
                    user_id: user.parse().unwrap(),
                },
            ));
        }
        state.apply_event(&event(
            2,
            EventKind::MessageSent {
                mentions: Default::default(),
                sender_id: "bob".parse().unwrap(),
            },
        ));
        state.apply_report(&report("alice", 2, false));
        state.apply_report(&report("bob", 2, true));
        state.apply_event(&event(
            3,
            EventKind::MemberLeft {
                user_id: "carol".parse().unwrap(),
            },
        ));
        let changes = state.drain();

        let framing = framing();
        let frames = framing.changelog_frames(&out());
        let mut encoded = EncodedRecords::with_capacity(changes.len());
        let mut expected = Vec::new();
        for (partition, change) in changes.iter().enumerate() {
            let partition = partition as i32;
            encoded.push_change(change, partition, &out().layout, &frames);
            expected.extend(
                changelog_records(change, partition, &out())
                    .into_iter()
                    .map(|r| framing.frame(r)),
            );
        }
        assert_eq!(encoded.len(), expected.len());
        assert_eq!(encoded.to_out_records(&out()), expected);
        assert!(
            expected.iter().any(|r| r.value.is_none()),
            "a tombstone among them"
        );
        assert!(
            expected.iter().any(|r| r.topic == "m"),
            "a member-state record among them"
        );
        assert!(expected
            .iter()
            .all(|r| unframe(r.key.as_deref().unwrap()).is_some()));
    }

    #[test]
    fn changelog_records_keep_their_avro_behind_the_header() {
        let key = encode_cursor_key(&CursorKeyRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
        });
        let record = OutRecord {
            topic: "c".into(),
            partition: 0,
            key: Some(key.clone()),
            value: None,
            headers: vec![],
        };
        let framed = framing().frame(record);
        let framed_key = framed.key.unwrap();
        assert_eq!(unframe(&framed_key), Some((100, key.as_slice())));
        assert_eq!(framed.value, None, "a tombstone stays one");
        assert_eq!(
            decode_cursor_key(strip_changelog_frame(&framed_key))
                .unwrap()
                .conversation_id,
            "G"
        );
        assert_eq!(strip_changelog_frame(&key), key.as_slice(), "plain stays plain");
    }

    #[test]
    fn a_dead_letter_becomes_a_dead_letter_record_with_the_original_bytes() {
        let record = OutRecord {
            topic: "d".into(),
            partition: 0,
            key: Some(b"C".to_vec()),
            value: Some(vec![0, 1, 2, 0xff]),
            headers: vec![
                (headers::REASON, "decode_error".into()),
                (headers::DETAIL, "bad".into()),
                (headers::SOURCE_TOPIC, "in".into()),
                (headers::SOURCE_PARTITION, "3".into()),
                (headers::SOURCE_OFFSET, "123456789".into()),
            ],
        };
        let framed = framing().frame(record);
        // The ids `framing` gave the DLQ's subjects.
        let id = |subject: &str| {
            let at = output_subjects(&out()).iter().position(|(s, _)| s == subject);
            100 + at.expect("a subject") as u32
        };
        assert_eq!(
            unframe(framed.key.as_ref().unwrap()),
            Some((id("d-key"), b"C".as_slice()))
        );
        let value = framed.value.unwrap();
        assert_eq!(unframe(&value).unwrap().0, id("d-value"));
        let json = describe_dead_letter(&value).unwrap();
        assert_eq!(json["reason"], "decode_error");
        assert_eq!(json["source_partition"], 3);
        assert_eq!(json["source_offset"], 123456789);
        assert_eq!(json["key"], "C");
        assert_eq!(json["value_bytes"], 4);
        assert_eq!(json["truncated"], serde_json::Value::Null);
        // The generic Avro reader agrees with the hand-written encoding.
        let schema = apache_avro::Schema::parse_str(DEAD_LETTER_AVSC).unwrap();
        let reader = apache_avro::reader::datum::GenericDatumReader::builder(&schema)
            .build()
            .unwrap();
        let decoded = reader.read_value(&mut &unframe(&value).unwrap().1[..]).unwrap();
        let apache_avro::types::Value::Record(fields) = decoded else {
            panic!()
        };
        assert_eq!(
            fields[5].1,
            apache_avro::types::Value::Union(1, Box::new(apache_avro::types::Value::Bytes(b"C".to_vec())))
        );
        assert_eq!(
            fields[6].1,
            apache_avro::types::Value::Union(
                1,
                Box::new(apache_avro::types::Value::Bytes(vec![0, 1, 2, 0xff]))
            )
        );
    }

    #[test]
    fn input_schemas_are_accepted_by_canonical_form() {
        use readfold_core::fold::InputKind;
        accepts_input_schema(InputKind::ReadReports, codec::READ_REPORT_AVSC).unwrap();
        accepts_input_schema(InputKind::ReadReports, codec::READ_REPORT_V1_0_AVSC).unwrap();
        // Docs do not matter.
        let canonical = codec::schemas().read_report.canonical_form();
        accepts_input_schema(InputKind::ReadReports, &canonical).unwrap();
        assert!(accepts_input_schema(InputKind::ReadReports, codec::CONVERSATION_EVENT_AVSC).is_err());
        assert!(accepts_input_schema(InputKind::ConversationEvents, codec::READ_REPORT_AVSC).is_err());
        assert!(accepts_input_schema(InputKind::ReadReports, "not json").is_err());
        accepts_input_schema(InputKind::ConversationEvents, codec::CONVERSATION_EVENT_AVSC).unwrap();
        // Producers registered with an earlier version go on after an upgrade.
        accepts_input_schema(InputKind::ReadReports, codec::READ_REPORT_V1_2_AVSC).unwrap();
        accepts_input_schema(InputKind::ConversationEvents, codec::CONVERSATION_EVENT_V1_2_AVSC).unwrap();
        accepts_input_schema(InputKind::ConversationEvents, codec::CONVERSATION_EVENT_V1_0_AVSC).unwrap();
    }

    #[test]
    fn longs_round_trip() {
        for n in [0, 1, -1, 63, -64, 64, i64::MAX, i64::MIN, 1 << 40] {
            let out = Writer::with_capacity(10).long(n).done();
            assert_eq!(Cursor::new(&out).long(), Some(n));
        }
        assert_eq!(Cursor::new(&[0x80u8; 11]).long(), None, "overlong varint");
        assert_eq!(Cursor::new(&[0x7eu8]).bytes(), None, "length past the end");
    }
}
