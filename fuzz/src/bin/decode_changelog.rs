//! The changelog decoders: each of `codec::decode_cursor_key`,
//! `decode_user_cursor_key`, `decode_cursor_update` and `decode_member_state`
//! on both the key and the value bytes, then `changelog::decode_changelog`
//! on the record, then `restore_into` a partition state; and
//! `describe::describe` (what `readfold tail` prints, dead letters
//! included) of the record for every topic role.
//!
//! Input: `[selector][key length][key][value]`. Selector bits 0-1: the kind
//! (0 by-conversation, 1 by-user, 2 member-state, 3 by-conversation); bit 2:
//! no key; bit 3: no value (a tombstone); bit 4: `max_id_bytes` of
//! 1 + (selector >> 5) instead of 256.
//!
//! Checks: no panic, the guard's allocation bound; each decoder agrees with
//! the generic Avro reader (v1.0 included for CursorUpdate) and what it
//! decodes re-encodes and decodes to itself; `decode_changelog` fails
//! exactly when the key or the value (each without its Confluent header,
//! if it has one) does not decode, or an id is empty or too long, or a
//! member-state record has no value, and otherwise gives the kind's entry
//! with values clamped into the fold's ranges.

use readfold_core::fold::PartitionState;
use readfold_core::Seq;
use readfold_fuzz as fz;
use readfold_wire::changelog::{decode_changelog, ChangelogError};
use readfold_wire::codec::{self, WireFormat};
use readfold_wire::confluent::strip_changelog_frame;
use readfold_wire::describe::{describe, TopicRole};
use readfold_wire::{ChangelogEntry, ChangelogKind};

#[global_allocator]
static ALLOC: fz::AllocGuard = fz::AllocGuard;

fn main() {
    fz::warm_up();
    afl::fuzz!(|data: &[u8]| fz::guarded(data, run));
}

/// `decode` agrees with the generic reader, and round-trips through `encode`.
fn check<T: PartialEq + std::fmt::Debug, E: std::fmt::Debug>(
    bytes: &[u8],
    decode: fn(&[u8]) -> Result<T, E>,
    generic: fn(&[u8]) -> Option<T>,
    encode: fn(&T) -> Vec<u8>,
) -> Option<T> {
    let decoded = decode(bytes).ok();
    assert_eq!(
        decoded,
        generic(bytes),
        "the decoder and the generic reader disagree"
    );
    if let Some(record) = &decoded {
        assert_eq!(
            decode(&encode(record)).ok().as_ref(),
            Some(record),
            "re-encoding changed it"
        );
    }
    decoded
}

fn run(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Some((key, value)) = fz::split_key(rest) else {
        return;
    };
    for bytes in [key, value] {
        check(
            bytes,
            codec::decode_cursor_key,
            fz::generic_cursor_key,
            codec::encode_cursor_key,
        );
        check(
            bytes,
            codec::decode_user_cursor_key,
            fz::generic_user_cursor_key,
            codec::encode_user_cursor_key,
        );
        check(
            bytes,
            codec::decode_cursor_update,
            fz::generic_cursor_update,
            codec::encode_cursor_update,
        );
        check(
            bytes,
            codec::decode_member_state,
            fz::generic_member_state,
            codec::encode_member_state,
        );
    }

    let kind = match selector & 3 {
        1 => ChangelogKind::ByUser,
        2 => ChangelogKind::MemberState,
        _ => ChangelogKind::ByConversation,
    };
    let key = (selector & 4 == 0).then_some(key);
    let value = (selector & 8 == 0).then_some(value);
    let max_id_bytes = if selector & 16 != 0 {
        1 + usize::from(selector >> 5)
    } else {
        256
    };
    let result = decode_changelog(kind, key, value, max_id_bytes);
    for role in [
        TopicRole::ReadReports,
        TopicRole::ConversationEvents,
        TopicRole::ReadCursors,
        TopicRole::UserReadCursors,
        TopicRole::DeadLetters,
    ] {
        describe(role, WireFormat::Auto, key, value, &[]);
    }

    // What the result must be, from the record decoders.
    let Some(key) = key else {
        assert_eq!(result, Err(ChangelogError::MissingKey));
        return;
    };
    // Keys and values may be framed (written for a schema registry).
    let key = strip_changelog_frame(key);
    let value = value.map(strip_changelog_frame);
    let ids = match kind {
        ChangelogKind::ByUser => codec::decode_user_cursor_key(key)
            .ok()
            .map(|k| (k.conversation_id, k.user_id)),
        _ => codec::decode_cursor_key(key)
            .ok()
            .map(|k| (k.conversation_id, k.user_id)),
    };
    let Some((conversation_id, user_id)) = ids else {
        assert!(matches!(result, Err(ChangelogError::Key(_))), "{result:?}");
        return;
    };
    let bad_id = |id: &str| id.is_empty() || id.len() > max_id_bytes;
    if bad_id(&conversation_id) || bad_id(&user_id) {
        assert!(matches!(result, Err(ChangelogError::Id(_))), "{result:?}");
        return;
    }
    let entry = match (kind, value) {
        (ChangelogKind::MemberState, None) => {
            assert_eq!(result, Err(ChangelogError::StateTombstone));
            return;
        }
        (ChangelogKind::MemberState, Some(value)) => match codec::decode_member_state(value) {
            Err(_) => {
                assert!(matches!(result, Err(ChangelogError::Value(_))), "{result:?}");
                return;
            }
            Ok(v) => {
                let Ok(ChangelogEntry::State(s)) = &result else {
                    panic!("{result:?}")
                };
                assert_eq!(s.private_cursor, Seq(v.private_cursor.max(0) as u64));
                assert_eq!(s.epoch, v.epoch.max(0) as u64);
                assert_eq!((s.left, s.updated_at), (v.left, v.updated_at));
                assert_eq!(s.mark.map(|m| m.at), v.mark_at);
                assert_eq!(
                    s.membership.is_some(),
                    v.membership_seq.is_some() && v.membership_at.is_some()
                );
                result.unwrap()
            }
        },
        (_, None) => {
            assert!(matches!(result, Ok(ChangelogEntry::Left(_))), "{result:?}");
            result.unwrap()
        }
        (_, Some(value)) => match codec::decode_cursor_update(value) {
            Err(_) => {
                assert!(matches!(result, Err(ChangelogError::Value(_))), "{result:?}");
                return;
            }
            Ok(v) => {
                let update = match (&result, kind) {
                    (Ok(ChangelogEntry::Upsert(u)), ChangelogKind::ByConversation) => u,
                    (Ok(ChangelogEntry::Own(own)), ChangelogKind::ByUser) => {
                        assert_eq!(
                            own.private_cursor,
                            Seq(v.private_cursor.unwrap_or(0).max(0) as u64)
                        );
                        assert_eq!(own.unread_mark, v.unread_mark.unwrap_or(false));
                        &own.update
                    }
                    _ => panic!("{kind:?}: {result:?}"),
                };
                assert_eq!(update.cursor, Seq(v.cursor.max(0) as u64));
                assert_eq!(update.join_seq, Seq(v.join_seq.max(1) as u64));
                assert_eq!(update.latest_seq, Seq(v.latest_seq.max(0) as u64));
                assert_eq!(update.updated_at, v.updated_at);
                result.clone().unwrap()
            }
        },
    };
    // The key names the member, whatever the value says.
    let named = entry.key();
    assert_eq!(
        (named.conversation_id.as_str(), named.user_id.as_str()),
        (&*conversation_id, &*user_id)
    );
    entry.restore_into(&mut PartitionState::new());
}
