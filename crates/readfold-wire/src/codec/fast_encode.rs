//! Hand-written encoders of the changelog records (keys and values of
//! `chat.read-cursors`, `chat.user-read-cursors` and the member-state
//! topic): every flush encodes two or three of them per changed cursor, too
//! many to build a generic Avro value for each first. A property test holds
//! them byte for byte to the generic writer of the compiled-in schemas.

use super::records::{CursorKeyRecord, CursorUpdateRecord, MemberStateRecord, UserCursorKeyRecord};

/// Avro binary: zigzag varint longs, length-prefixed bytes and strings,
/// one-byte booleans, unions as a branch index then the value. The
/// dead-letter record (`confluent`) is written with it too.
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Writer(Vec::with_capacity(n))
    }

    pub(crate) fn long(&mut self, value: i64) -> &mut Self {
        let mut z = ((value << 1) ^ (value >> 63)) as u64;
        while z >= 0x80 {
            self.0.push((z as u8) | 0x80);
            z >>= 7;
        }
        self.0.push(z as u8);
        self
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.long(b.len() as i64);
        self.0.extend_from_slice(b);
        self
    }

    pub(crate) fn string(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    fn boolean(&mut self, b: bool) -> &mut Self {
        self.0.push(u8::from(b));
        self
    }

    /// `["null", long]`.
    fn optional_long(&mut self, value: Option<i64>) -> &mut Self {
        match value {
            None => self.long(0),
            Some(v) => self.long(1).long(v),
        }
    }

    /// `["null", boolean]`.
    fn optional_boolean(&mut self, value: Option<bool>) -> &mut Self {
        match value {
            None => self.long(0),
            Some(v) => self.long(1).boolean(v),
        }
    }

    pub(crate) fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }

    /// A writer that appends to `bytes`: many records in one buffer.
    pub(crate) fn appending(bytes: Vec<u8>) -> Self {
        Writer(bytes)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Writes the 5-byte Confluent frame (magic byte 0, schema id).
    pub(crate) fn confluent_frame(&mut self, schema_id: u32) -> &mut Self {
        self.0.push(0);
        self.0.extend_from_slice(&schema_id.to_be_bytes());
        self
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// A `CursorUpdate` value whose ids are borrowed: what a flush encodes
/// straight from the fold's state, with no `String` per field.
#[derive(Clone, Copy, Debug)]
pub struct CursorUpdateFields<'a> {
    pub conversation_id: &'a str,
    pub user_id: &'a str,
    pub cursor: i64,
    pub join_seq: i64,
    pub latest_seq: i64,
    pub updated_at: i64,
    pub private_cursor: Option<i64>,
    pub unread_mark: Option<bool>,
    pub delivered_cursor: Option<i64>,
    pub unread_mentions: Option<i32>,
    pub muted_until: Option<i64>,
}

impl<'a> CursorUpdateFields<'a> {
    pub fn of(r: &'a CursorUpdateRecord) -> Self {
        CursorUpdateFields {
            conversation_id: &r.conversation_id,
            user_id: &r.user_id,
            cursor: r.cursor,
            join_seq: r.join_seq,
            latest_seq: r.latest_seq,
            updated_at: r.updated_at,
            private_cursor: r.private_cursor,
            unread_mark: r.unread_mark,
            delivered_cursor: r.delivered_cursor,
            unread_mentions: r.unread_mentions,
            muted_until: r.muted_until,
        }
    }
}

/// A `MemberState` value whose ids are borrowed.
#[derive(Clone, Debug)]
pub struct MemberStateFields<'a> {
    pub conversation_id: &'a str,
    pub user_id: &'a str,
    pub private_cursor: i64,
    pub mark_at: Option<i64>,
    pub mark_seq: Option<i64>,
    pub left: bool,
    pub membership_seq: Option<i64>,
    pub membership_at: Option<i64>,
    pub epoch: i64,
    pub updated_at: i64,
    pub mentions: Vec<i64>,
    pub mute_at: Option<i64>,
    pub muted_until: Option<i64>,
}

impl<'a> MemberStateFields<'a> {
    pub fn of(r: &'a MemberStateRecord) -> Self {
        MemberStateFields {
            conversation_id: &r.conversation_id,
            user_id: &r.user_id,
            private_cursor: r.private_cursor,
            mark_at: r.mark_at,
            mark_seq: r.mark_seq,
            left: r.left,
            membership_seq: r.membership_seq,
            membership_at: r.membership_at,
            epoch: r.epoch,
            updated_at: r.updated_at,
            mentions: r.mentions.clone(),
            mute_at: r.mute_at,
            muted_until: r.muted_until,
        }
    }
}

/// Room for two ids and a few varints.
fn capacity(ids: &[&str]) -> usize {
    ids.iter().map(|s| s.len() + 2).sum::<usize>() + 48
}

/// Both changelog keys are two strings: (conversation, user) for
/// `CursorKey`, (user, conversation) for `UserCursorKey`.
pub(crate) fn write_key(w: &mut Writer, first: &str, second: &str) {
    w.string(first).string(second);
}

pub(crate) fn write_cursor_update(w: &mut Writer, r: &CursorUpdateFields<'_>) {
    w.string(r.conversation_id)
        .string(r.user_id)
        .long(r.cursor)
        .long(r.join_seq)
        .long(r.latest_seq)
        .long(r.updated_at)
        .optional_long(r.private_cursor)
        .optional_boolean(r.unread_mark)
        .optional_long(r.delivered_cursor)
        .optional_long(r.unread_mentions.map(i64::from))
        .optional_long(r.muted_until);
}

pub(crate) fn write_member_state(w: &mut Writer, r: &MemberStateFields<'_>) {
    w.string(r.conversation_id)
        .string(r.user_id)
        .long(r.private_cursor)
        .optional_long(r.mark_at)
        .optional_long(r.mark_seq)
        .boolean(r.left)
        .optional_long(r.membership_seq)
        .optional_long(r.membership_at)
        .long(r.epoch)
        .long(r.updated_at);
    if !r.mentions.is_empty() {
        w.long(r.mentions.len() as i64);
        for &seq in &r.mentions {
            w.long(seq);
        }
    }
    w.long(0).optional_long(r.mute_at).optional_long(r.muted_until);
}

pub fn cursor_key(r: &CursorKeyRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(capacity(&[&r.conversation_id, &r.user_id]));
    write_key(&mut w, &r.conversation_id, &r.user_id);
    w.done()
}

pub fn user_cursor_key(r: &UserCursorKeyRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(capacity(&[&r.user_id, &r.conversation_id]));
    write_key(&mut w, &r.user_id, &r.conversation_id);
    w.done()
}

pub fn cursor_update(r: &CursorUpdateRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(capacity(&[&r.conversation_id, &r.user_id]));
    write_cursor_update(&mut w, &CursorUpdateFields::of(r));
    w.done()
}

pub fn member_state(r: &MemberStateRecord) -> Vec<u8> {
    let mut w = Writer::with_capacity(capacity(&[&r.conversation_id, &r.user_id]));
    write_member_state(&mut w, &MemberStateFields::of(r));
    w.done()
}

#[cfg(test)]
mod tests {
    use super::super::{codecs, encode_value};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn keys_encode_as_the_generic_writer_does(c in "\\PC{0,12}", u in "\\PC{0,8}") {
            let key = CursorKeyRecord { conversation_id: c.clone(), user_id: u.clone() };
            prop_assert_eq!(cursor_key(&key), encode_value(&codecs().cursor_key, key.to_value()));
            let key = UserCursorKeyRecord { user_id: u, conversation_id: c };
            prop_assert_eq!(user_cursor_key(&key), encode_value(&codecs().user_cursor_key, key.to_value()));
        }

        #[test]
        fn cursor_updates_encode_as_the_generic_writer_does(
            c in "\\PC{0,12}",
            u in "[a-z0-9]{0,8}",
            longs in proptest::array::uniform4(any::<i64>()),
            private in proptest::option::of(any::<i64>()),
            mark in proptest::option::of(any::<bool>()),
            delivered in proptest::option::of(any::<i64>()),
            unread_mentions in proptest::option::of(any::<i32>()),
        ) {
            let r = CursorUpdateRecord {
                muted_until: delivered.map(|d| d ^ 1),
                unread_mentions,
                conversation_id: c,
                user_id: u,
                cursor: longs[0],
                join_seq: longs[1],
                latest_seq: longs[2],
                updated_at: longs[3],
                private_cursor: private,
                unread_mark: mark,
                delivered_cursor: delivered,
            };
            prop_assert_eq!(cursor_update(&r), encode_value(&codecs().cursor_update, r.to_value()));
        }

        #[test]
        fn member_states_encode_as_the_generic_writer_does(
            c in "\\PC{0,12}",
            u in "[a-z0-9]{0,8}",
            longs in proptest::array::uniform3(any::<i64>()),
            optional in proptest::array::uniform4(proptest::option::of(any::<i64>())),
            left in any::<bool>(),
            mentions in proptest::collection::vec(any::<i64>(), 0..4),
        ) {
            let r = MemberStateRecord {
                mentions,
                mute_at: optional[0],
                muted_until: optional[1],
                conversation_id: c,
                user_id: u,
                private_cursor: longs[0],
                mark_at: optional[0],
                mark_seq: optional[1],
                left,
                membership_seq: optional[2],
                membership_at: optional[3],
                epoch: longs[1],
                updated_at: longs[2],
            };
            prop_assert_eq!(member_state(&r), encode_value(&codecs().member_state, r.to_value()));
        }
    }
}
