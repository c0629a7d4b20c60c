//! The cursor changelogs, both ways: the records a flush produces, and the
//! one decoder every changelog reader uses (restore, the demo, the tests,
//! and every later reader), so that they all apply the same rules.

use readfold_core::fold::{Change, CursorUpdate};
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, CursorKey, IdError, Seq, UserId};

use crate::codec::{self, CursorKeyRecord, CursorUpdateRecord, DecodeError, UserCursorKeyRecord};

/// One record to produce, partition chosen by readfold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutRecord {
    pub topic: String,
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(&'static str, String)>,
}

/// Partition counts of the output topics, read from the broker at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputLayout {
    pub user_read_cursors_partitions: i32,
    pub dlq_partitions: i32,
}

/// Where the processor's output goes: topic names and partition counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputTopics {
    pub read_cursors: String,
    pub user_read_cursors: String,
    pub dlq: String,
    pub layout: OutputLayout,
}

pub fn cursor_update_record(u: &CursorUpdate) -> CursorUpdateRecord {
    CursorUpdateRecord {
        conversation_id: u.conversation_id.to_string(),
        user_id: u.user_id.to_string(),
        cursor: u.cursor.get() as i64,
        join_seq: u.join_seq.get() as i64,
        latest_seq: u.latest_seq.get() as i64,
        updated_at: u.updated_at,
    }
}

/// The two changelog records of one change: `read_cursors` on the input
/// partition, `user_read_cursors` on murmur2(user_id).
pub fn changelog_records(change: &Change, input_partition: i32, out: &OutputTopics) -> [OutRecord; 2] {
    let key = change.key();
    let (conversation_id, user_id) = (key.conversation_id.to_string(), key.user_id.to_string());
    let value = match change {
        Change::Upsert(u) => Some(codec::encode_cursor_update(&cursor_update_record(u))),
        Change::Left(_) => None,
    };
    let user_partition = partition_for_key(user_id.as_bytes(), out.layout.user_read_cursors_partitions);
    let by_conversation = codec::encode_cursor_key(&CursorKeyRecord {
        conversation_id: conversation_id.clone(),
        user_id: user_id.clone(),
    });
    let by_user = codec::encode_user_cursor_key(&UserCursorKeyRecord {
        user_id,
        conversation_id,
    });
    [
        OutRecord {
            topic: out.read_cursors.clone(),
            partition: input_partition,
            key: Some(by_conversation),
            value: value.clone(),
            headers: Vec::new(),
        },
        OutRecord {
            topic: out.user_read_cursors.clone(),
            partition: user_partition,
            key: Some(by_user),
            value,
            headers: Vec::new(),
        },
    ]
}

/// One decoded changelog record: a member's cursor, or a departure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangelogEntry {
    Upsert(CursorUpdate),
    /// A tombstone: the member left.
    Left(CursorKey),
}

impl ChangelogEntry {
    pub fn key(&self) -> CursorKey {
        match self {
            ChangelogEntry::Upsert(u) => u.key(),
            ChangelogEntry::Left(k) => k.clone(),
        }
    }
}

/// Why a changelog record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangelogError {
    #[error("changelog record without a key")]
    MissingKey,
    #[error("unreadable changelog key: {0}")]
    Key(#[source] DecodeError),
    #[error("unreadable changelog value: {0}")]
    Value(#[source] DecodeError),
    #[error("invalid id in changelog key: {0}")]
    Id(#[from] IdError),
}

/// Which changelog a record is from: the key schemas differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangelogKind {
    /// `chat.read-cursors`, keyed by `CursorKey`.
    ByConversation,
    /// `chat.user-read-cursors`, keyed by `UserCursorKey`.
    ByUser,
}

/// Decodes one changelog record. The key names the member; the value (none
/// for a tombstone) carries the cursor. Values are clamped into the ranges
/// the fold produces (cursor >= 0, join_seq >= 1, latest_seq >= 0), so a
/// reader never holds a value the fold could not have.
pub fn decode_changelog(
    kind: ChangelogKind,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    max_id_bytes: usize,
) -> Result<ChangelogEntry, ChangelogError> {
    let key = key.ok_or(ChangelogError::MissingKey)?;
    let (conversation_id, user_id) = match kind {
        ChangelogKind::ByConversation => {
            let k = codec::decode_cursor_key(key).map_err(ChangelogError::Key)?;
            (k.conversation_id, k.user_id)
        }
        ChangelogKind::ByUser => {
            let k = codec::decode_user_cursor_key(key).map_err(ChangelogError::Key)?;
            (k.conversation_id, k.user_id)
        }
    };
    let key = CursorKey {
        conversation_id: ConversationId::parse(&conversation_id, max_id_bytes)?,
        user_id: UserId::parse(&user_id, max_id_bytes)?,
    };
    let Some(value) = value else {
        return Ok(ChangelogEntry::Left(key));
    };
    let v = codec::decode_cursor_update(value).map_err(ChangelogError::Value)?;
    Ok(ChangelogEntry::Upsert(CursorUpdate {
        conversation_id: key.conversation_id,
        user_id: key.user_id,
        cursor: Seq(v.cursor.max(0) as u64),
        join_seq: Seq(v.join_seq.max(1) as u64),
        latest_seq: Seq(v.latest_seq.max(0) as u64),
        updated_at: v.updated_at,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default topic names, 5 by-user and 2 dead-letter partitions.
    pub(crate) fn out() -> OutputTopics {
        OutputTopics {
            read_cursors: "chat.read-cursors".into(),
            user_read_cursors: "chat.user-read-cursors".into(),
            dlq: "chat.read-reports.dlq".into(),
            layout: OutputLayout {
                user_read_cursors_partitions: 5,
                dlq_partitions: 2,
            },
        }
    }

    #[test]
    fn an_upsert_goes_to_both_changelogs() {
        let update = CursorUpdate {
            conversation_id: "G".parse().unwrap(),
            user_id: "alice".parse().unwrap(),
            cursor: Seq(4),
            join_seq: Seq(1),
            latest_seq: Seq(6),
            updated_at: 9,
        };
        let [by_conv, by_user] = changelog_records(&Change::Upsert(update), 3, &out());
        assert_eq!(by_conv.topic, "chat.read-cursors");
        assert_eq!(by_conv.partition, 3);
        assert_eq!(by_user.topic, "chat.user-read-cursors");
        assert_eq!(by_user.partition, partition_for_key(b"alice", 5));
        let value = codec::decode_cursor_update(by_conv.value.as_deref().unwrap()).unwrap();
        assert_eq!((value.cursor, value.latest_seq), (4, 6));
        assert_eq!(by_conv.value, by_user.value);
        let key = codec::decode_user_cursor_key(by_user.key.as_deref().unwrap()).unwrap();
        assert_eq!(
            (key.user_id.as_str(), key.conversation_id.as_str()),
            ("alice", "G")
        );
    }

    #[test]
    fn a_leave_is_a_tombstone_on_both() {
        let key = CursorKey {
            conversation_id: "G".parse().unwrap(),
            user_id: "bob".parse().unwrap(),
        };
        for record in changelog_records(&Change::Left(key), 0, &out()) {
            assert!(record.value.is_none());
            assert!(record.key.is_some());
        }
    }

    #[test]
    fn the_decoder_reads_back_what_a_flush_writes() {
        let update = CursorUpdate {
            conversation_id: "G".parse().unwrap(),
            user_id: "alice".parse().unwrap(),
            cursor: Seq(4),
            join_seq: Seq(2),
            latest_seq: Seq(6),
            updated_at: 9,
        };
        let [by_conv, by_user] = changelog_records(&Change::Upsert(update.clone()), 0, &out());
        for (kind, record) in [
            (ChangelogKind::ByConversation, by_conv),
            (ChangelogKind::ByUser, by_user),
        ] {
            let entry = decode_changelog(kind, record.key.as_deref(), record.value.as_deref(), 256).unwrap();
            assert_eq!(entry, ChangelogEntry::Upsert(update.clone()));
        }
        let [tomb, _] = changelog_records(&Change::Left(update.key()), 0, &out());
        let entry = decode_changelog(ChangelogKind::ByConversation, tomb.key.as_deref(), None, 256).unwrap();
        assert_eq!(entry, ChangelogEntry::Left(update.key()));
    }

    #[test]
    fn the_decoder_clamps_values_into_the_folds_ranges_and_names_bad_records() {
        let key = codec::encode_cursor_key(&CursorKeyRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
        });
        let value = codec::encode_cursor_update(&CursorUpdateRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
            cursor: -5,
            join_seq: 0,
            latest_seq: -1,
            updated_at: 0,
        });
        let ChangelogEntry::Upsert(u) =
            decode_changelog(ChangelogKind::ByConversation, Some(&key), Some(&value), 256).unwrap()
        else {
            panic!("an upsert");
        };
        assert_eq!((u.cursor, u.join_seq, u.latest_seq), (Seq(0), Seq(1), Seq(0)));
        let bad =
            |k: Option<&[u8]>, v: Option<&[u8]>| decode_changelog(ChangelogKind::ByConversation, k, v, 256);
        assert_eq!(bad(None, None), Err(ChangelogError::MissingKey));
        assert!(matches!(bad(Some(b"\xff"), None), Err(ChangelogError::Key(_))));
        assert!(matches!(
            bad(Some(&key), Some(b"\xff")),
            Err(ChangelogError::Value(_))
        ));
        assert!(matches!(
            decode_changelog(ChangelogKind::ByConversation, Some(&key), None, 0),
            Err(ChangelogError::Id(_))
        ));
    }
}
