//! Pure builders of the records readfold produces: changelog pairs and dead
//! letters. The processor hands them to a producer as they are.

use crate::codec::{self, CursorKeyRecord, CursorUpdateRecord, UserCursorKeyRecord};
use crate::config::TopicsConfig;
use crate::fold::{Change, CursorUpdate};
use crate::kafka::headers;
use crate::partitioner::partition_for_key;
use crate::validate::Rejection;

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
pub fn changelog_records(
    change: &Change,
    input_partition: i32,
    topics: &TopicsConfig,
    layout: OutputLayout,
) -> [OutRecord; 2] {
    let key = change.key();
    let (conversation_id, user_id) = (key.conversation_id.to_string(), key.user_id.to_string());
    let value = match change {
        Change::Upsert(u) => Some(codec::encode_cursor_update(&cursor_update_record(u))),
        Change::Left(_) => None,
    };
    let user_partition = partition_for_key(user_id.as_bytes(), layout.user_read_cursors_partitions);
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
            topic: topics.read_cursors.clone(),
            partition: input_partition,
            key: Some(by_conversation),
            value: value.clone(),
            headers: Vec::new(),
        },
        OutRecord {
            topic: topics.user_read_cursors.clone(),
            partition: user_partition,
            key: Some(by_user),
            value,
            headers: Vec::new(),
        },
    ]
}

/// Where a rejected record came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Largest key + value a dead letter carries. Kafka's default
/// `max.message.bytes` is 1 MiB + 12 bytes; an input record that was just
/// under it must not become a dead letter that is over it (with headers) and
/// block every flush. Longer ones are cut, with `readfold.truncated` giving
/// the original sizes; the source offset still points at the whole record.
pub const MAX_DEAD_LETTER_BYTES: usize = 1_040_000;

/// The dead letter of a rejected record: original key and value, and why.
pub fn dead_letter(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    rejection: &Rejection,
    source: &Source,
    dlq_topic: &str,
    layout: OutputLayout,
) -> OutRecord {
    let mut headers = vec![
        (headers::REASON, rejection.reason.as_str().to_owned()),
        (headers::DETAIL, truncate(&rejection.detail, 1024)),
        (headers::SOURCE_TOPIC, source.topic.clone()),
        (headers::SOURCE_PARTITION, source.partition.to_string()),
        (headers::SOURCE_OFFSET, source.offset.to_string()),
    ];
    let (key_len, value_len) = (key.map_or(0, <[u8]>::len), value.map_or(0, <[u8]>::len));
    let key_kept = key_len.min(MAX_DEAD_LETTER_BYTES);
    let value_kept = value_len.min(MAX_DEAD_LETTER_BYTES - key_kept);
    if (key_kept, value_kept) != (key_len, value_len) {
        headers.push((headers::TRUNCATED, format!("key={key_len},value={value_len}")));
    }
    OutRecord {
        topic: dlq_topic.to_owned(),
        partition: source.partition % layout.dlq_partitions,
        key: key.map(|k| k[..key_kept].to_vec()),
        value: value.map(|v| v[..value_kept].to_vec()),
        headers,
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::domain::{CursorKey, Seq};
    use crate::validate::RejectReason;

    fn topics() -> TopicsConfig {
        Config::from_sources(None, Vec::new()).unwrap().topics
    }
    const LAYOUT: OutputLayout = OutputLayout {
        user_read_cursors_partitions: 5,
        dlq_partitions: 2,
    };

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
        let [by_conv, by_user] = changelog_records(&Change::Upsert(update), 3, &topics(), LAYOUT);
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
        for record in changelog_records(&Change::Left(key), 0, &topics(), LAYOUT) {
            assert!(record.value.is_none());
            assert!(record.key.is_some());
        }
    }

    #[test]
    fn dead_letters_carry_reason_and_source() {
        let rejection = Rejection {
            reason: RejectReason::SeqOutOfRange,
            detail: "x".repeat(5000),
        };
        let source = Source {
            topic: "chat.read-reports".into(),
            partition: 3,
            offset: 77,
        };
        let record = dead_letter(Some(b"k"), Some(b"v"), &rejection, &source, "dlq", LAYOUT);
        assert_eq!(record.partition, 1);
        assert_eq!(record.value.as_deref(), Some(&b"v"[..]));
        let header = |name| record.headers.iter().find(|(k, _)| *k == name).unwrap().1.clone();
        assert_eq!(header(headers::REASON), "seq_out_of_range");
        assert_eq!(header(headers::SOURCE_OFFSET), "77");
        assert_eq!(header(headers::SOURCE_PARTITION), "3");
        assert!(header(headers::DETAIL).len() < 1100);
        assert!(record.headers.iter().all(|(k, _)| *k != headers::TRUNCATED));
    }

    #[test]
    fn oversized_dead_letters_are_cut_to_fit_a_default_broker() {
        let rejection = Rejection {
            reason: RejectReason::Decode,
            detail: "big".into(),
        };
        let source = Source {
            topic: "t".into(),
            partition: 0,
            offset: 1,
        };
        let value = vec![7u8; 3_000_000];
        let record = dead_letter(Some(b"key"), Some(&value), &rejection, &source, "dlq", LAYOUT);
        assert_eq!(record.value.as_ref().unwrap().len() + 3, MAX_DEAD_LETTER_BYTES);
        let truncated = record
            .headers
            .iter()
            .find(|(k, _)| *k == headers::TRUNCATED)
            .unwrap();
        assert_eq!(truncated.1, "key=3,value=3000000");
    }
}
