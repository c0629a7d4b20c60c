//! Dead letters: a rejected input record, kept whole (up to what a broker
//! takes), with the reason and its source in headers.

use crate::changelog::{OutRecord, OutputTopics};
use crate::validate::Rejection;

/// Header names on dead-letter records.
pub mod headers {
    pub const REASON: &str = "readfold.reason";
    pub const DETAIL: &str = "readfold.detail";
    pub const SOURCE_TOPIC: &str = "readfold.source.topic";
    pub const SOURCE_PARTITION: &str = "readfold.source.partition";
    pub const SOURCE_OFFSET: &str = "readfold.source.offset";
    /// Present when a dead letter's key or value was cut: original sizes.
    pub const TRUNCATED: &str = "readfold.truncated";
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
    out: &OutputTopics,
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
        topic: out.dlq.clone(),
        partition: source.partition % out.layout.dlq_partitions,
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
    use crate::changelog::OutputLayout;
    use crate::validate::RejectReason;

    fn out() -> OutputTopics {
        OutputTopics {
            thread_cursors: "chat.thread-cursors".into(),
            thread_state: "chat.read-thread-state".into(),
            user_thread_cursors: "chat.user-thread-cursors".into(),
            read_cursors: "chat.read-cursors".into(),
            user_read_cursors: "chat.user-read-cursors".into(),
            member_state: "chat.member-state".into(),
            dlq: "dlq".into(),
            layout: OutputLayout {
                user_thread_cursors_partitions: 4,
                user_read_cursors_partitions: 5,
                dlq_partitions: 2,
            },
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
        let record = dead_letter(Some(b"k"), Some(b"v"), &rejection, &source, &out());
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
        let record = dead_letter(Some(b"key"), Some(&value), &rejection, &source, &out());
        assert_eq!(record.value.as_ref().unwrap().len() + 3, MAX_DEAD_LETTER_BYTES);
        let truncated = record
            .headers
            .iter()
            .find(|(k, _)| *k == headers::TRUNCATED)
            .unwrap();
        assert_eq!(truncated.1, "key=3,value=3000000");
    }
}
