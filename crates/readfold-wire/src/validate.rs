//! Turns decoded wire records into the fold's inputs, or says why not.
//! Pure: the processor sends every rejection to the dead-letter topic.

use std::fmt;

use readfold_core::fold::{
    ConversationEvent, DeliveryReport, EventKind, Input, InputKind, Mentions, MuteReport, ReadReport,
    ThreadReadReport, UnreadMarkReport,
};
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, IdError, Mute, Seq, UserId};

use crate::codec::{
    self, ConversationEventRecord, ConversationEventView, DecodeError, Decoded, EventView, ReadAction,
    ReadReportRecord, ReadReportView, WireFormat,
};

/// Input limits: the `[input]` section of the configuration, whose defaults
/// and documentation are in `config/default.toml`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub format: WireFormat,
    pub max_id_bytes: usize,
    pub max_seq: u64,
    pub check_partitioning: bool,
    /// Most users one message may mention by name.
    pub max_mentions: usize,
}

impl Limits {
    /// Checks the values the types allow but readfold does not.
    pub fn check(&self) -> Result<(), String> {
        if self.max_id_bytes == 0 {
            return Err("input.max_id_bytes must be at least 1".into());
        }
        // Cursors are Avro longs on the changelog and CQL bigints.
        if self.max_seq == 0 || self.max_seq > i64::MAX as u64 {
            return Err(format!(
                "input.max_seq must be between 1 and {} (a signed 64-bit integer), not {}",
                i64::MAX,
                self.max_seq
            ));
        }
        Ok(())
    }
}

/// Why a record went to the dead-letter topic; the `readfold.reason` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    /// No value (a tombstone on an input topic).
    MissingValue,
    /// The bytes are not a record of the topic's schema.
    Decode,
    /// An id is empty.
    EmptyId,
    /// An id is longer than `input.max_id_bytes`.
    IdTooLong,
    /// A seq is below its minimum or above `input.max_seq`.
    SeqOutOfRange,
    /// The record's key is not its conversation id.
    KeyMismatch,
    /// The record is not on the partition murmur2(conversation_id) picks.
    WrongPartition,
    /// Framed with a schema id the registry does not know, or whose schema
    /// is not one of readfold's versions of the topic's schema.
    UnknownSchema,
    /// A message mentions more users than `input.max_mentions`.
    TooManyMentions,
    /// A mark, delivery or mute names a thread: only reads do.
    ThreadAction,
}

impl RejectReason {
    pub const ALL: [RejectReason; 10] = [
        RejectReason::MissingValue,
        RejectReason::Decode,
        RejectReason::EmptyId,
        RejectReason::IdTooLong,
        RejectReason::SeqOutOfRange,
        RejectReason::KeyMismatch,
        RejectReason::WrongPartition,
        RejectReason::UnknownSchema,
        RejectReason::TooManyMentions,
        RejectReason::ThreadAction,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::MissingValue => "missing_value",
            RejectReason::Decode => "decode_error",
            RejectReason::EmptyId => "empty_id",
            RejectReason::IdTooLong => "id_too_long",
            RejectReason::SeqOutOfRange => "seq_out_of_range",
            RejectReason::KeyMismatch => "key_mismatch",
            RejectReason::WrongPartition => "wrong_partition",
            RejectReason::UnknownSchema => "unknown_schema",
            RejectReason::TooManyMentions => "too_many_mentions",
            RejectReason::ThreadAction => "thread_action",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rejected record: the reason and a human-readable detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: RejectReason,
    pub detail: String,
}

impl Rejection {
    fn new(reason: RejectReason, detail: impl Into<String>) -> Self {
        Rejection {
            reason,
            detail: detail.into(),
        }
    }
}

impl From<DecodeError> for Rejection {
    fn from(e: DecodeError) -> Self {
        Rejection::new(RejectReason::Decode, e.to_string())
    }
}

/// Where a record was read from, for the placement checks.
#[derive(Clone, Copy, Debug)]
pub struct Placement<'a> {
    pub key: Option<&'a [u8]>,
    pub partition: i32,
    pub partition_count: i32,
}

/// The whole per-record transform: bytes in, fold input or rejection out.
pub fn ingest(
    kind: InputKind,
    value: Option<&[u8]>,
    placement: Placement<'_>,
    limits: &Limits,
) -> Result<Input, Rejection> {
    let value = value.ok_or_else(|| Rejection::new(RejectReason::MissingValue, "record has no value"))?;
    let input = match kind {
        InputKind::ReadReports => match codec::decode_read_report_view(value, limits.format)? {
            Decoded::Borrowed(view) => read_report_view(view, limits)?,
            Decoded::Owned(record) => read_report(record, limits)?,
        },
        InputKind::ConversationEvents => Input::Event(
            match codec::decode_conversation_event_view(value, limits.format)? {
                Decoded::Borrowed(view) => conversation_event_view(view, limits)?,
                Decoded::Owned(record) => conversation_event(record, limits)?,
            },
        ),
    };
    if limits.check_partitioning {
        check_placement(input.conversation_id(), placement)?;
    }
    Ok(input)
}

fn check_placement(conversation: &ConversationId, placement: Placement<'_>) -> Result<(), Rejection> {
    let id = conversation.as_str().as_bytes();
    if let Some(key) = placement.key {
        if key != id {
            return Err(Rejection::new(
                RejectReason::KeyMismatch,
                format!(
                    "key {:?} is not the conversation id {:?}",
                    String::from_utf8_lossy(key),
                    conversation.as_str()
                ),
            ));
        }
    }
    let expected = partition_for_key(id, placement.partition_count);
    if expected != placement.partition {
        return Err(Rejection::new(
            RejectReason::WrongPartition,
            format!(
                "conversation {:?} belongs on partition {expected} of {} (murmur2), found on {}",
                conversation.as_str(),
                placement.partition_count,
                placement.partition
            ),
        ));
    }
    Ok(())
}

/// Parses id `field` within `input.max_id_bytes`, or says why not.
pub fn id<T>(
    field: &str,
    raw: &str,
    limits: &Limits,
    parse: fn(&str, usize) -> Result<T, IdError>,
) -> Result<T, Rejection> {
    parse(raw, limits.max_id_bytes).map_err(|e| match e {
        IdError::Empty => Rejection::new(RejectReason::EmptyId, format!("{field} is empty")),
        IdError::TooLong { len, max } => Rejection::new(
            RejectReason::IdTooLong,
            format!("{field} is {len} bytes, limit {max}"),
        ),
    })
}

fn seq(field: &str, raw: i64, min: u64, limits: &Limits) -> Result<Seq, Rejection> {
    match u64::try_from(raw) {
        Ok(n) if n >= min && n <= limits.max_seq => Ok(Seq(n)),
        _ => Err(Rejection::new(
            RejectReason::SeqOutOfRange,
            format!("{field} {raw} is outside {min}..={}", limits.max_seq),
        )),
    }
}

/// Validates a read report: ids non-empty and bounded, 1 <= seq <= max_seq.
/// Validates a record of the read-reports topic: ids non-empty and
/// bounded; a read has 1 <= seq <= max_seq, a mark or its clearing
/// 0 <= seq <= max_seq (the cursor may be 0). `private` only applies to
/// reads (marks are only ever seen by the member).
pub fn read_report(r: ReadReportRecord, limits: &Limits) -> Result<Input, Rejection> {
    read_report_view(r.view(), limits)
}

/// [`read_report`] of a borrowed record.
pub fn read_report_view(r: ReadReportView<'_>, limits: &Limits) -> Result<Input, Rejection> {
    let conversation_id = id(
        "conversation_id",
        r.conversation_id,
        limits,
        ConversationId::parse,
    )?;
    let user_id = id("user_id", r.user_id, limits, UserId::parse)?;
    if r.thread != 0 {
        if r.action != ReadAction::Read {
            return Err(Rejection::new(
                RejectReason::ThreadAction,
                format!("action {:?} names thread {}: only reads do", r.action, r.thread),
            ));
        }
        return Ok(Input::ThreadRead(ThreadReadReport {
            conversation_id,
            thread: seq("thread", r.thread, 1, limits)?,
            user_id,
            seq: seq("seq", r.seq, 1, limits)?,
            reported_at: r.reported_at,
            private: r.private,
        }));
    }
    Ok(match r.action {
        ReadAction::Read => Input::Report(ReadReport {
            conversation_id,
            user_id,
            seq: seq("seq", r.seq, 1, limits)?,
            reported_at: r.reported_at,
            private: r.private,
        }),
        ReadAction::Mute | ReadAction::Unmute => Input::Mute(MuteReport {
            conversation_id,
            user_id,
            mute: Mute {
                at: r.reported_at,
                until: match r.action {
                    ReadAction::Unmute => Mute::OFF,
                    _ => r.muted_until.unwrap_or(Mute::FOREVER),
                },
            },
        }),
        ReadAction::Delivered => Input::Delivery(DeliveryReport {
            conversation_id,
            user_id,
            seq: seq("seq", r.seq, 1, limits)?,
            reported_at: r.reported_at,
        }),
        ReadAction::MarkUnread | ReadAction::ClearUnreadMark => Input::Mark(UnreadMarkReport {
            conversation_id,
            user_id,
            seq: seq("seq", r.seq, 0, limits)?,
            at: r.reported_at,
            marked: r.action == ReadAction::MarkUnread,
        }),
    })
}

/// Validates a conversation event. A message has seq >= 1; a member event
/// carries the latest seq when it happened, which is 0 in a new
/// conversation; a reply the latest seq when it was sent, which is at least
/// its root's, and a thread seq >= 1.
pub fn conversation_event(
    e: ConversationEventRecord,
    limits: &Limits,
) -> Result<ConversationEvent, Rejection> {
    conversation_event_view(e.view(), limits)
}

/// [`conversation_event`] of a borrowed record.
pub fn conversation_event_view(
    e: ConversationEventView<'_>,
    limits: &Limits,
) -> Result<ConversationEvent, Rejection> {
    let conversation_id = id(
        "conversation_id",
        e.conversation_id,
        limits,
        ConversationId::parse,
    )?;
    let (kind, min_seq) = match e.event {
        EventView::MessageSent {
            sender_id,
            mentions,
            mention_all,
            thread,
            thread_seq,
            starter_id,
        } => {
            if mentions.len() > limits.max_mentions {
                return Err(Rejection {
                    reason: RejectReason::TooManyMentions,
                    detail: format!(
                        "the message mentions {} users, more than input.max_mentions ({})",
                        mentions.len(),
                        limits.max_mentions
                    ),
                });
            }
            let users = mentions
                .into_iter()
                .map(|m| id("mentions", m, limits, UserId::parse))
                .collect::<Result<Vec<_>, _>>()?;
            if thread != 0 {
                let root = seq("thread", thread, 1, limits)?;
                let kind = EventKind::ReplySent {
                    thread: root,
                    thread_seq: seq("thread_seq", thread_seq, 1, limits)?,
                    sender_id: id("sender_id", sender_id, limits, UserId::parse)?,
                    mentions: users,
                    starter_id: starter_id
                        .map(|s| id("starter_id", s, limits, UserId::parse))
                        .transpose()?,
                };
                (kind, root.get())
            } else if thread_seq != 0 {
                return Err(Rejection::new(
                    RejectReason::SeqOutOfRange,
                    format!("thread_seq {thread_seq} on a message that is no reply (thread 0)"),
                ));
            } else {
                (
                    EventKind::MessageSent {
                        sender_id: id("sender_id", sender_id, limits, UserId::parse)?,
                        mentions: Mentions {
                            users,
                            all: mention_all,
                        },
                    },
                    1,
                )
            }
        }
        EventView::MemberJoined { user_id } => (
            EventKind::MemberJoined {
                user_id: id("user_id", user_id, limits, UserId::parse)?,
            },
            0,
        ),
        EventView::MemberLeft { user_id } => (
            EventKind::MemberLeft {
                user_id: id("user_id", user_id, limits, UserId::parse)?,
            },
            0,
        ),
    };
    Ok(ConversationEvent {
        conversation_id,
        seq: seq("seq", e.seq, min_seq, limits)?,
        at: e.at,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_conversation_event, encode_read_report, frame_confluent, EventRecord};

    fn record(conversation: &str, user: &str, seq: i64) -> ReadReportRecord {
        ReadReportRecord {
            thread: 0,
            muted_until: None,
            conversation_id: conversation.into(),
            user_id: user.into(),
            seq,
            device_id: None,
            reported_at: 0,
            private: false,
            action: ReadAction::Read,
        }
    }

    fn placed(conversation: &str) -> Placement<'static> {
        Placement {
            key: None,
            partition: partition_for_key(conversation.as_bytes(), 3),
            partition_count: 3,
        }
    }

    /// The `[input]` defaults of `config/default.toml`.
    pub(crate) fn default_limits() -> Limits {
        let defaults: toml::Table = include_str!("../../../config/default.toml").parse().unwrap();
        defaults["input"].clone().try_into().unwrap()
    }

    fn reason(kind: InputKind, bytes: &[u8], placement: Placement<'_>) -> Option<RejectReason> {
        ingest(kind, Some(bytes), placement, &default_limits())
            .err()
            .map(|r| r.reason)
    }

    #[test]
    fn accepts_a_valid_report_plain_and_framed() {
        let bytes = encode_read_report(&record("G", "u", 5));
        assert_eq!(reason(InputKind::ReadReports, &bytes, placed("G")), None);
        assert_eq!(
            reason(InputKind::ReadReports, &frame_confluent(3, &bytes), placed("G")),
            None
        );
    }

    #[test]
    fn rejects_each_kind_of_bad_report() {
        use RejectReason::*;
        let cases = [
            (record("", "u", 1), EmptyId),
            (record("G", "", 1), EmptyId),
            (record("G", "u", 0), SeqOutOfRange),
            (record("G", "u", -1), SeqOutOfRange),
            (record("G", "u", i64::MAX), SeqOutOfRange),
            (record("G", &"x".repeat(1 << 20), 1), IdTooLong),
        ];
        for (rec, expected) in cases {
            let bytes = encode_read_report(&rec);
            let conversation = rec.conversation_id.clone();
            assert_eq!(
                reason(InputKind::ReadReports, &bytes, placed(&conversation)),
                Some(expected),
                "{expected}"
            );
        }
        assert_eq!(
            reason(InputKind::ReadReports, b"\xde\xad\xbe\xef", placed("G")),
            Some(Decode)
        );
        assert_eq!(
            ingest(InputKind::ReadReports, None, placed("G"), &default_limits())
                .unwrap_err()
                .reason,
            MissingValue
        );
    }

    #[test]
    fn member_events_allow_seq_zero_but_messages_do_not() {
        let event = |seq, event| ConversationEventRecord {
            conversation_id: "G".into(),
            seq,
            at: 0,
            event,
        };
        let joined = encode_conversation_event(&event(0, EventRecord::MemberJoined { user_id: "u".into() }));
        assert_eq!(reason(InputKind::ConversationEvents, &joined, placed("G")), None);
        let sent = encode_conversation_event(&event(
            0,
            EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                mention_all: false,
                mentions: Default::default(),
                sender_id: "u".into(),
            },
        ));
        assert_eq!(
            reason(InputKind::ConversationEvents, &sent, placed("G")),
            Some(RejectReason::SeqOutOfRange)
        );
    }

    #[test]
    fn checks_key_and_partition() {
        let bytes = encode_read_report(&record("G", "u", 1));
        let right = placed("G");
        let wrong_partition = Placement {
            partition: (right.partition + 1) % 3,
            ..right
        };
        assert_eq!(
            reason(InputKind::ReadReports, &bytes, wrong_partition),
            Some(RejectReason::WrongPartition)
        );
        let wrong_key = Placement {
            key: Some(b"H"),
            ..right
        };
        assert_eq!(
            reason(InputKind::ReadReports, &bytes, wrong_key),
            Some(RejectReason::KeyMismatch)
        );
        let limits = Limits {
            check_partitioning: false,
            ..default_limits()
        };
        assert!(ingest(InputKind::ReadReports, Some(&bytes), wrong_partition, &limits).is_ok());
    }

    #[test]
    fn marks_and_private_reads_validate_into_their_inputs() {
        let limits = default_limits();
        let private = ReadReportRecord {
            private: true,
            ..record("G", "u", 3)
        };
        assert!(matches!(read_report(private, &limits), Ok(Input::Report(r)) if r.private));
        let mark = ReadReportRecord {
            action: ReadAction::MarkUnread,
            ..record("G", "u", 0)
        };
        assert!(matches!(read_report(mark, &limits), Ok(Input::Mark(m)) if m.marked && m.seq == Seq(0)));
        let clear = ReadReportRecord {
            action: ReadAction::ClearUnreadMark,
            ..record("G", "u", 2)
        };
        assert!(matches!(read_report(clear, &limits), Ok(Input::Mark(m)) if !m.marked));
        let delivered = ReadReportRecord {
            action: ReadAction::Delivered,
            ..record("G", "u", 7)
        };
        assert!(matches!(read_report(delivered, &limits), Ok(Input::Delivery(d)) if d.seq == Seq(7)));
        let mute = ReadReportRecord {
            action: ReadAction::Mute,
            ..record("G", "u", 0)
        };
        assert!(matches!(read_report(mute, &limits), Ok(Input::Mute(m)) if m.mute.until == Mute::FOREVER));
        let until = ReadReportRecord {
            action: ReadAction::Mute,
            muted_until: Some(99),
            ..record("G", "u", 0)
        };
        assert!(matches!(read_report(until, &limits), Ok(Input::Mute(m)) if m.mute.until == 99));
        let unmute = ReadReportRecord {
            action: ReadAction::Unmute,
            muted_until: Some(99),
            ..record("G", "u", 0)
        };
        assert!(matches!(read_report(unmute, &limits), Ok(Input::Mute(m)) if m.mute.until == Mute::OFF));
        let nothing_delivered = ReadReportRecord {
            action: ReadAction::Delivered,
            ..record("G", "u", 0)
        };
        assert_eq!(
            read_report(nothing_delivered, &limits).unwrap_err().reason,
            RejectReason::SeqOutOfRange
        );
        let negative = ReadReportRecord {
            action: ReadAction::MarkUnread,
            ..record("G", "u", -1)
        };
        assert_eq!(
            read_report(negative, &limits).unwrap_err().reason,
            RejectReason::SeqOutOfRange
        );
        // A v1.0 record (no action field) is a read.
        let old = codec::encode_historic_read_report(&record("G", "u", 4));
        assert!(matches!(
            ingest(InputKind::ReadReports, Some(&old), placed("G"), &limits),
            Ok(Input::Report(r)) if r.seq == Seq(4) && !r.private
        ));
    }

    #[test]
    fn limits_check_the_seq_range() {
        assert!(default_limits().check().is_ok());
        let too_big = Limits {
            max_seq: u64::MAX,
            ..default_limits()
        };
        assert!(too_big.check().unwrap_err().contains("input.max_seq"));
    }
}

#[cfg(test)]
mod mention_tests {
    use super::tests::default_limits;
    use super::*;

    fn message(mentions: Vec<String>) -> ConversationEventRecord {
        ConversationEventRecord {
            conversation_id: "G".into(),
            seq: 3,
            at: 1,
            event: codec::EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                sender_id: "a".into(),
                mentions,
                mention_all: true,
            },
        }
    }

    #[test]
    fn mentions_are_checked_ids_and_at_most_max_mentions() {
        let limits = default_limits();
        let ok = conversation_event(message(vec!["b".into()]), &limits).unwrap();
        assert!(
            matches!(ok.kind, EventKind::MessageSent { mentions, .. } if mentions.all && mentions.users.len() == 1)
        );
        let empty = conversation_event(message(vec![String::new()]), &limits).unwrap_err();
        assert_eq!(empty.reason, RejectReason::EmptyId);
        let many = (0..=limits.max_mentions).map(|i| format!("u{i}")).collect();
        let too_many = conversation_event(message(many), &limits).unwrap_err();
        assert_eq!(too_many.reason, RejectReason::TooManyMentions);
        assert!(
            too_many.detail.contains("input.max_mentions"),
            "{}",
            too_many.detail
        );
    }
}

#[cfg(test)]
mod thread_tests {
    use super::tests::default_limits;
    use super::*;
    use readfold_core::fold::ThreadReadReport;

    fn reply(seq: i64, thread: i64, thread_seq: i64) -> ConversationEventRecord {
        ConversationEventRecord {
            conversation_id: "G".into(),
            seq,
            at: 1,
            event: codec::EventRecord::MessageSent {
                sender_id: "b".into(),
                mentions: vec!["c".into()],
                mention_all: true,
                thread,
                thread_seq,
                starter_id: Some("a".into()),
            },
        }
    }

    #[test]
    fn a_reply_validates_into_a_reply_of_its_thread() {
        let event = conversation_event(reply(9, 4, 2), &default_limits()).unwrap();
        assert_eq!(event.seq, Seq(9));
        assert_eq!(
            event.kind,
            EventKind::ReplySent {
                thread: Seq(4),
                thread_seq: Seq(2),
                sender_id: "b".parse().unwrap(),
                mentions: vec!["c".parse().unwrap()],
                starter_id: Some("a".parse().unwrap()),
            }
        );
    }

    #[test]
    fn a_reply_needs_a_thread_seq_and_a_latest_seq_past_its_root() {
        let limits = default_limits();
        for (record, field) in [
            (reply(9, 4, 0), "thread_seq"),
            (reply(3, 4, 1), "seq"),
            (reply(9, -1, 1), "thread"),
            (reply(9, 0, 1), "thread_seq"),
        ] {
            let rejection = conversation_event(record, &limits).unwrap_err();
            assert_eq!(rejection.reason, RejectReason::SeqOutOfRange);
            assert!(rejection.detail.starts_with(field), "{}", rejection.detail);
        }
    }

    #[test]
    fn only_reads_name_a_thread() {
        let limits = default_limits();
        let report = |action, thread| ReadReportRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
            seq: 3,
            device_id: None,
            reported_at: 5,
            private: true,
            action,
            muted_until: None,
            thread,
        };
        assert_eq!(
            read_report(report(ReadAction::Read, 4), &limits).unwrap(),
            Input::ThreadRead(ThreadReadReport {
                conversation_id: "G".parse().unwrap(),
                thread: Seq(4),
                user_id: "u".parse().unwrap(),
                seq: Seq(3),
                reported_at: 5,
                private: true,
            })
        );
        let marked = read_report(report(ReadAction::MarkUnread, 4), &limits).unwrap_err();
        assert_eq!(marked.reason, RejectReason::ThreadAction);
        let negative = read_report(report(ReadAction::Read, -4), &limits).unwrap_err();
        assert_eq!(negative.reason, RejectReason::SeqOutOfRange);
    }
}
