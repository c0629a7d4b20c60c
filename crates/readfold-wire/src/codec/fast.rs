//! Hand-written decoders of the two input records and of the changelog
//! records in their current schema version: the hot paths of the processor,
//! of restores and of replay, several times cheaper than building a generic
//! Avro value first.
//!
//! They accept exactly what the generic reader accepts for the current
//! schema (zigzag varints of at most 10 bytes, booleans 0 or 1, union and
//! enum indexes in range, UTF-8 strings, no trailing bytes) and give up on
//! anything else, so the caller falls back to the generic reader, which
//! also knows the earlier schema versions and words the errors. A property
//! test holds them to the generic reader.

use super::records::{
    ConversationEventView, CursorKeyRecord, CursorUpdateRecord, EventView, MemberStateRecord, ReadAction,
    ReadReportView, UserCursorKeyRecord,
};

/// Avro binary being read, front to back. The module's decoders use it,
/// and so do the length check in front of the generic reader and the
/// dead-letter record's reader (`confluent`).
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes }
    }

    /// How many bytes are left.
    pub(super) fn left(&self) -> usize {
        self.bytes.len()
    }

    /// Skips `n` bytes, or `None` when fewer are left.
    pub(super) fn skip(&mut self, n: usize) -> Option<()> {
        self.bytes = self.bytes.get(n..)?;
        Some(())
    }

    /// A zigzag varint of at most 10 bytes, as the generic reader reads it.
    pub(crate) fn long(&mut self) -> Option<i64> {
        let mut value: u64 = 0;
        for (i, &byte) in self.bytes.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.bytes = &self.bytes[i + 1..];
                return Some(((value >> 1) as i64) ^ -((value & 1) as i64));
            }
        }
        None
    }

    /// Length-prefixed bytes, or `None` when the length runs past the end.
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.long()?).ok()?;
        if len > self.bytes.len() {
            return None;
        }
        let (bytes, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(bytes)
    }

    pub(crate) fn string(&mut self) -> Option<String> {
        self.str().map(str::to_owned)
    }

    /// A string, borrowed from the bytes.
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    fn boolean(&mut self) -> Option<bool> {
        let (&first, rest) = self.bytes.split_first()?;
        self.bytes = rest;
        match first {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    pub(crate) fn index(&mut self, count: i64) -> Option<i64> {
        self.long().filter(|i| (0..count).contains(i))
    }

    /// `["null", long]`.
    pub(super) fn optional_long(&mut self) -> Option<Option<i64>> {
        Some(match self.index(2)? {
            0 => None,
            _ => Some(self.long()?),
        })
    }

    /// `["null", boolean]`.
    fn optional_boolean(&mut self) -> Option<Option<bool>> {
        Some(match self.index(2)? {
            0 => None,
            _ => Some(self.boolean()?),
        })
    }

    /// `["null", int]`: an int is a zigzag varint too, within 32 bits.
    fn optional_int(&mut self) -> Option<Option<i32>> {
        Some(match self.index(2)? {
            0 => None,
            _ => Some(i32::try_from(self.long()?).ok()?),
        })
    }

    /// An array's items, block by block as Avro writes them (a negative
    /// count is followed by the block's size in bytes).
    pub(super) fn array<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        let mut items = Vec::new();
        loop {
            let count = self.long()?;
            if count == 0 {
                return Some(items);
            }
            if count < 0 {
                self.long()?;
            }
            for _ in 0..count.unsigned_abs() {
                // Each item takes at least one byte: a count past what is
                // left is damage, not a reason to loop.
                if self.bytes.is_empty() {
                    return None;
                }
                items.push(item(self)?);
            }
        }
    }

    /// Whether the bytes are all read: a record of an earlier version ends
    /// where later versions append fields.
    fn at_end(&self) -> bool {
        self.bytes.is_empty()
    }

    pub(crate) fn end<T>(&self, value: T) -> Option<T> {
        self.bytes.is_empty().then_some(value)
    }
}

/// `ReadReport` v1.3, v1.2 (which ends before `thread`) or v1.1 (before
/// `muted_until`), or `None` when the bytes are anything else.
pub fn read_report(bytes: &[u8]) -> Option<ReadReportView<'_>> {
    let mut c = Cursor { bytes };
    let conversation_id = c.str()?;
    let user_id = c.str()?;
    let seq = c.long()?;
    let device_id = match c.index(2)? {
        0 => None,
        _ => Some(c.str()?),
    };
    let reported_at = c.long()?;
    let private = c.boolean()?;
    let action = match c.index(6)? {
        0 => ReadAction::Read,
        1 => ReadAction::MarkUnread,
        2 => ReadAction::ClearUnreadMark,
        3 => ReadAction::Delivered,
        4 => ReadAction::Mute,
        _ => ReadAction::Unmute,
    };
    let muted_until = if c.at_end() { None } else { c.optional_long()? };
    let thread = if c.at_end() { 0 } else { c.long()? };
    c.end(ReadReportView {
        conversation_id,
        user_id,
        seq,
        device_id,
        reported_at,
        private,
        action,
        muted_until,
        thread,
    })
}

/// `ConversationEvent` v1.3, v1.2 (whose `MessageSent` ends after
/// `mention_all`) or v1.0 (after its sender), or `None` when the bytes are
/// anything else.
pub fn conversation_event(bytes: &[u8]) -> Option<ConversationEventView<'_>> {
    let mut c = Cursor { bytes };
    let conversation_id = c.str()?;
    let seq = c.long()?;
    let at = c.long()?;
    let branch = c.index(3)?;
    let id = c.str()?;
    let event = match branch {
        0 if c.at_end() => EventView::MessageSent {
            sender_id: id,
            mentions: Vec::new(),
            mention_all: false,
            thread: 0,
            thread_seq: 0,
            starter_id: None,
        },
        0 => {
            let mentions = c.array(Cursor::str)?;
            let mention_all = c.boolean()?;
            let (thread, thread_seq, starter_id) = if c.at_end() {
                (0, 0, None)
            } else {
                let (thread, thread_seq) = (c.long()?, c.long()?);
                let starter_id = match c.index(2)? {
                    0 => None,
                    _ => Some(c.str()?),
                };
                (thread, thread_seq, starter_id)
            };
            EventView::MessageSent {
                sender_id: id,
                mentions,
                mention_all,
                thread,
                thread_seq,
                starter_id,
            }
        }
        1 => EventView::MemberJoined { user_id: id },
        _ => EventView::MemberLeft { user_id: id },
    };
    c.end(ConversationEventView {
        conversation_id,
        seq,
        at,
        event,
    })
}

/// `CursorKey`, or `None` when the bytes are anything else.
pub fn cursor_key(bytes: &[u8]) -> Option<CursorKeyRecord> {
    let mut c = Cursor { bytes };
    let conversation_id = c.string()?;
    let user_id = c.string()?;
    c.end(CursorKeyRecord {
        conversation_id,
        user_id,
    })
}

/// `UserCursorKey`, or `None` when the bytes are anything else.
pub fn user_cursor_key(bytes: &[u8]) -> Option<UserCursorKeyRecord> {
    let mut c = Cursor { bytes };
    let user_id = c.string()?;
    let conversation_id = c.string()?;
    c.end(UserCursorKeyRecord {
        user_id,
        conversation_id,
    })
}

/// `CursorUpdate` v1.2, or `None` when the bytes are anything else
/// (earlier versions are shorter and go to the generic reader).
pub fn cursor_update(bytes: &[u8]) -> Option<CursorUpdateRecord> {
    let mut c = Cursor { bytes };
    let record = CursorUpdateRecord {
        conversation_id: c.string()?,
        user_id: c.string()?,
        cursor: c.long()?,
        join_seq: c.long()?,
        latest_seq: c.long()?,
        updated_at: c.long()?,
        private_cursor: c.optional_long()?,
        unread_mark: c.optional_boolean()?,
        delivered_cursor: c.optional_long()?,
        unread_mentions: c.optional_int()?,
        muted_until: c.optional_long()?,
    };
    c.end(record)
}

/// The conversation id and latest seq of a `CursorUpdate` of any version
/// (v1.0 and v1.1 end after `updated_at`), borrowed; `None` when the bytes
/// are anything else. Every field is walked, none built.
pub fn cursor_update_latest(bytes: &[u8]) -> Option<(&str, i64)> {
    let mut c = Cursor { bytes };
    let conversation_id = c.str()?;
    c.bytes()?;
    c.long()?;
    c.long()?;
    let latest_seq = c.long()?;
    c.long()?;
    if c.at_end() {
        return Some((conversation_id, latest_seq));
    }
    c.optional_long()?;
    c.optional_boolean()?;
    if c.at_end() {
        return Some((conversation_id, latest_seq));
    }
    c.optional_long()?;
    c.optional_int()?;
    c.optional_long()?;
    c.end((conversation_id, latest_seq))
}

/// `MemberState` v1.2 or v1.0 (which ends after `updated_at`), or `None`
/// when the bytes are anything else.
pub fn member_state(bytes: &[u8]) -> Option<MemberStateRecord> {
    let mut c = Cursor { bytes };
    let mut record = MemberStateRecord {
        conversation_id: c.string()?,
        user_id: c.string()?,
        private_cursor: c.long()?,
        mark_at: c.optional_long()?,
        mark_seq: c.optional_long()?,
        left: c.boolean()?,
        membership_seq: c.optional_long()?,
        membership_at: c.optional_long()?,
        epoch: c.long()?,
        updated_at: c.long()?,
        mentions: Vec::new(),
        mute_at: None,
        muted_until: None,
    };
    if !c.at_end() {
        record.mentions = c.array(Cursor::long)?;
        record.mute_at = c.optional_long()?;
        record.muted_until = c.optional_long()?;
    }
    c.end(record)
}

#[cfg(test)]
mod tests {
    use super::super::{codecs, decode_value, ConversationEventRecord, EventRecord, ReadReportRecord};
    use super::*;
    use proptest::prelude::*;

    fn generic_report(bytes: &[u8]) -> Option<ReadReportRecord> {
        let codec = &codecs().read_report;
        let value = super::super::read_whole(&codec.reader, codec.schema, codec.name, bytes).ok()?;
        ReadReportRecord::from_value(value).ok()
    }

    fn generic_event(bytes: &[u8]) -> Option<ConversationEventRecord> {
        ConversationEventRecord::from_value(decode_value(&codecs().conversation_event, bytes).ok()?).ok()
    }

    fn action(i: u8) -> ReadAction {
        [
            ReadAction::Read,
            ReadAction::MarkUnread,
            ReadAction::ClearUnreadMark,
            ReadAction::Delivered,
            ReadAction::Mute,
            ReadAction::Unmute,
        ][i as usize % 6]
    }

    proptest! {
        #[test]
        fn reports_decode_as_the_generic_reader_does(
            conversation in "\\PC{0,12}",
            user in "[a-z0-9]{0,8}",
            seq in any::<i64>(),
            device in proptest::option::of("[a-z]{0,4}"),
            at in any::<i64>(),
            private in any::<bool>(),
            act in 0u8..6,
            muted_until in proptest::option::of(any::<i64>()),
            thread in any::<i64>(),
        ) {
            let record = ReadReportRecord { thread,
                muted_until,
                conversation_id: conversation,
                user_id: user,
                seq,
                device_id: device,
                reported_at: at,
                private,
                action: action(act),
            };
            let bytes = super::super::encode_read_report(&record);
            prop_assert_eq!(read_report(&bytes).map(|v| v.to_record()), Some(record.clone()));
            prop_assert_eq!(generic_report(&bytes), Some(record));
        }

        #[test]
        fn arbitrary_bytes_never_decode_differently(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Some(fast) = read_report(&bytes) {
                prop_assert_eq!(Some(fast.to_record()), generic_report(&bytes));
            }
            if let Some(fast) = conversation_event(&bytes) {
                prop_assert_eq!(Some(fast.to_record()), generic_event(&bytes));
            }
        }

        #[test]
        fn events_decode_as_the_generic_reader_does(
            conversation in "\\PC{0,12}",
            seq in any::<i64>(),
            at in any::<i64>(),
            branch in 0u8..3,
            id in "[a-z0-9]{0,8}",
            mentions in proptest::collection::vec("[a-z0-9]{0,4}", 0..4),
            mention_all in any::<bool>(),
            thread in any::<i64>(),
            thread_seq in any::<i64>(),
            starter_id in proptest::option::of("[a-z0-9]{0,4}"),
        ) {
            let event = match branch {
                0 => EventRecord::MessageSent { starter_id, thread, thread_seq, mentions, mention_all, sender_id: id },
                1 => EventRecord::MemberJoined { user_id: id },
                _ => EventRecord::MemberLeft { user_id: id },
            };
            let record = ConversationEventRecord { conversation_id: conversation, seq, at, event };
            let bytes = super::super::encode_conversation_event(&record);
            prop_assert_eq!(conversation_event(&bytes).map(|v| v.to_record()), Some(record.clone()));
            prop_assert_eq!(generic_event(&bytes), Some(record));
        }
    }

    fn generic_update(bytes: &[u8]) -> Option<CursorUpdateRecord> {
        CursorUpdateRecord::from_value(decode_value(&codecs().cursor_update, bytes).ok()?).ok()
    }

    fn generic_member_state(bytes: &[u8]) -> Option<MemberStateRecord> {
        MemberStateRecord::from_value(decode_value(&codecs().member_state, bytes).ok()?).ok()
    }

    fn generic_key(bytes: &[u8]) -> Option<CursorKeyRecord> {
        CursorKeyRecord::from_value(decode_value(&codecs().cursor_key, bytes).ok()?).ok()
    }

    fn generic_user_key(bytes: &[u8]) -> Option<UserCursorKeyRecord> {
        UserCursorKeyRecord::from_value(decode_value(&codecs().user_cursor_key, bytes).ok()?).ok()
    }

    proptest! {
        #[test]
        fn changelog_records_decode_as_the_generic_reader_does(
            c in "\\PC{0,12}",
            u in "[a-z0-9]{0,8}",
            longs in proptest::array::uniform6(any::<i64>()),
            optional in proptest::array::uniform5(proptest::option::of(any::<i64>())),
            mark in proptest::option::of(any::<bool>()),
            left in any::<bool>(),
            mentions in proptest::collection::vec(any::<i64>(), 0..4),
            unread_mentions in proptest::option::of(any::<i32>()),
        ) {
            let key = CursorKeyRecord { conversation_id: c.clone(), user_id: u.clone() };
            let bytes = super::super::encode_cursor_key(&key);
            prop_assert_eq!(cursor_key(&bytes), Some(key.clone()));
            prop_assert_eq!(generic_key(&bytes), Some(key));
            let key = UserCursorKeyRecord { user_id: u.clone(), conversation_id: c.clone() };
            let bytes = super::super::encode_user_cursor_key(&key);
            prop_assert_eq!(user_cursor_key(&bytes), Some(key.clone()));
            prop_assert_eq!(generic_user_key(&bytes), Some(key));
            let update = CursorUpdateRecord {
                muted_until: optional[1],
                unread_mentions,
                conversation_id: c.clone(),
                user_id: u.clone(),
                cursor: longs[0],
                join_seq: longs[1],
                latest_seq: longs[2],
                updated_at: longs[3],
                private_cursor: optional[0],
                unread_mark: mark,
                delivered_cursor: None,
            };
            let bytes = super::super::encode_cursor_update(&update);
            prop_assert_eq!(cursor_update(&bytes), Some(update.clone()));
            prop_assert_eq!(generic_update(&bytes), Some(update));
            let state = MemberStateRecord {
                mentions,
                mute_at: optional[2],
                muted_until: optional[3],
                conversation_id: c,
                user_id: u,
                private_cursor: longs[4],
                mark_at: optional[1],
                mark_seq: optional[2],
                left,
                membership_seq: optional[3],
                membership_at: optional[4],
                epoch: longs[5],
                updated_at: longs[0],
            };
            let bytes = super::super::encode_member_state(&state);
            prop_assert_eq!(member_state(&bytes), Some(state.clone()));
            prop_assert_eq!(generic_member_state(&bytes), Some(state));
        }

        #[test]
        fn arbitrary_changelog_bytes_never_decode_differently(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Some(fast) = cursor_key(&bytes) {
                prop_assert_eq!(Some(fast), generic_key(&bytes));
            }
            if let Some(fast) = user_cursor_key(&bytes) {
                prop_assert_eq!(Some(fast), generic_user_key(&bytes));
            }
            if let Some(fast) = cursor_update(&bytes) {
                prop_assert_eq!(Some(fast), generic_update(&bytes));
            }
            if let Some(fast) = member_state(&bytes) {
                prop_assert_eq!(Some(fast), generic_member_state(&bytes));
            }
        }
    }

    #[test]
    fn a_v1_0_cursor_update_is_left_to_the_generic_reader() {
        let record = CursorUpdateRecord {
            muted_until: None,
            unread_mentions: None,
            conversation_id: "c".into(),
            user_id: "u".into(),
            cursor: 3,
            join_seq: 1,
            latest_seq: 4,
            updated_at: 9,
            private_cursor: None,
            unread_mark: None,
            delivered_cursor: None,
        };
        let old = super::super::encode_historic_cursor_update(&record);
        assert_eq!(cursor_update(&old), None);
        assert_eq!(super::super::decode_cursor_update(&old).unwrap(), record);
    }

    #[test]
    fn a_v1_0_report_is_left_to_the_generic_reader() {
        let record = ReadReportRecord {
            thread: 0,
            muted_until: None,
            conversation_id: "c".into(),
            user_id: "u".into(),
            seq: 3,
            device_id: None,
            reported_at: 1,
            private: false,
            action: ReadAction::Read,
        };
        let old = super::super::encode_historic_read_report(&record);
        assert_eq!(read_report(&old), None);
        assert_eq!(
            super::super::decode_read_report(&old, super::super::WireFormat::Plain).unwrap(),
            record
        );
    }
}
