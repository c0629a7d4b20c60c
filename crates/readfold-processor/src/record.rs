//! An input record as the fold reads it, from whichever queue it came:
//! borrowed from librdkafka's buffer, or copied to wait for a restore or a
//! schema lookup.

use rdkafka::message::BorrowedMessage;
use readfold_kafka::queue_batch::{LazyHeaders, QueuedMessage};
use readfold_wire::TRACEPARENT_HEADER_C;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Record<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    headers: Headers<'a>,
}

/// The one header the fold may read: librdkafka's, parsed only if asked
/// for, or a copy's.
#[derive(Clone, Copy, Debug)]
enum Headers<'a> {
    Lazy(LazyHeaders<'a>),
    Traceparent(Option<&'a [u8]>),
}

impl<'a> Record<'a> {
    /// A message of the consumer's own queue.
    pub fn of(message: &'a BorrowedMessage<'_>) -> Self {
        QueuedMessage::of(message).into()
    }

    /// Its W3C `traceparent` header, if it has one.
    pub fn traceparent(&self) -> Option<&'a [u8]> {
        match self.headers {
            Headers::Lazy(headers) => headers.last(TRACEPARENT_HEADER_C),
            Headers::Traceparent(value) => value,
        }
    }

    pub fn to_owned(self) -> OwnedRecord {
        OwnedRecord {
            topic: self.topic.to_owned(),
            partition: self.partition,
            offset: self.offset,
            key: self.key.map(<[u8]>::to_vec),
            payload: self.payload.map(<[u8]>::to_vec),
            traceparent: self.traceparent().map(<[u8]>::to_vec),
        }
    }
}

impl<'a> From<QueuedMessage<'a>> for Record<'a> {
    fn from(m: QueuedMessage<'a>) -> Self {
        Record {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            key: m.key,
            payload: m.payload,
            headers: Headers::Lazy(m.headers),
        }
    }
}

/// A record copied out of librdkafka's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OwnedRecord {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    traceparent: Option<Vec<u8>>,
}

impl OwnedRecord {
    pub fn partition(&self) -> i32 {
        self.partition
    }

    pub fn as_record(&self) -> Record<'_> {
        Record {
            topic: &self.topic,
            partition: self.partition,
            offset: self.offset,
            key: self.key.as_deref(),
            payload: self.payload.as_deref(),
            headers: Headers::Traceparent(self.traceparent.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_reads_as_the_record_it_was_made_from() {
        let record = Record {
            topic: "read-reports",
            partition: 3,
            offset: 41,
            key: Some(b"conv"),
            payload: None,
            headers: Headers::Traceparent(Some(b"00-ab-cd-01")),
        };
        let owned = record.to_owned();
        let back = owned.as_record();
        assert_eq!(owned.partition(), 3);
        assert_eq!(
            (back.topic, back.partition, back.offset, back.key, back.payload),
            ("read-reports", 3, 41, Some(&b"conv"[..]), None)
        );
        assert_eq!(back.traceparent(), Some(&b"00-ab-cd-01"[..]));
    }
}
