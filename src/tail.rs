//! `readfold tail TOPIC`: a topic's records decoded as JSON lines.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};

use crate::codec;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::kafka::base_client_config;

/// Which decoder a topic needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicRole {
    ReadReports,
    ConversationEvents,
    ReadCursors,
    UserReadCursors,
    DeadLetters,
}

impl TopicRole {
    pub fn of(config: &Config, topic: &str) -> Option<TopicRole> {
        let t = &config.topics;
        [
            (&t.read_reports, TopicRole::ReadReports),
            (&t.conversation_events, TopicRole::ConversationEvents),
            (&t.read_cursors, TopicRole::ReadCursors),
            (&t.user_read_cursors, TopicRole::UserReadCursors),
            (&t.dlq, TopicRole::DeadLetters),
        ]
        .into_iter()
        .find(|(name, _)| name.as_str() == topic)
        .map(|(_, role)| role)
    }
}

fn lossy(bytes: Option<&[u8]>) -> Value {
    bytes.map_or(Value::Null, |b| {
        Value::String(String::from_utf8_lossy(b).into_owned())
    })
}

fn decoded<T: serde::Serialize>(result: std::result::Result<T, codec::DecodeError>) -> Value {
    match result {
        Ok(v) => serde_json::to_value(v).unwrap_or(Value::Null),
        Err(e) => json!({ "undecodable": e.to_string() }),
    }
}

/// One record as JSON: key and value decoded for the topic's role.
pub fn describe(
    role: TopicRole,
    format: codec::WireFormat,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(String, String)],
) -> Value {
    let (key, value) = match role {
        TopicRole::ReadReports => (
            lossy(key),
            value.map_or(Value::Null, |v| decoded(codec::decode_read_report(v, format))),
        ),
        TopicRole::ConversationEvents => (
            lossy(key),
            value.map_or(Value::Null, |v| {
                decoded(codec::decode_conversation_event(v, format))
            }),
        ),
        TopicRole::ReadCursors => (
            key.map_or(Value::Null, |k| decoded(codec::decode_cursor_key(k))),
            value.map_or(Value::Null, |v| decoded(codec::decode_cursor_update(v))),
        ),
        TopicRole::UserReadCursors => (
            key.map_or(Value::Null, |k| decoded(codec::decode_user_cursor_key(k))),
            value.map_or(Value::Null, |v| decoded(codec::decode_cursor_update(v))),
        ),
        TopicRole::DeadLetters => (
            lossy(key),
            json!({ "bytes": value.map(<[u8]>::len), "text": lossy(value) }),
        ),
    };
    let mut out = json!({ "key": key, "value": value });
    if !headers.is_empty() {
        out["headers"] = headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
    }
    out
}

/// Prints every committed record of `topic` as a JSON line, from the
/// beginning; stops at the end unless `follow`, or after `limit` records.
pub fn tail(
    config: &Config,
    topic: &str,
    follow: bool,
    limit: Option<u64>,
    mut emit: impl FnMut(Value),
) -> Result<u64> {
    let role = TopicRole::of(config, topic).ok_or_else(|| {
        Error::Config(format!(
            "{topic:?} is none of the topics in the configuration ([topics])"
        ))
    })?;
    let consumer: BaseConsumer = base_client_config(config)
        .set("group.id", format!("{}-tail", config.kafka.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .first()
        .filter(|t| t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        return Err(Error::Config(format!("topic {topic:?} does not exist")));
    }
    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut at_end = std::collections::HashSet::new();
    let mut count = 0u64;
    let started = Instant::now();
    loop {
        if limit.is_some_and(|l| count >= l) || (!follow && at_end.len() == partitions.len()) {
            return Ok(count);
        }
        if !follow && started.elapsed() > Duration::from_secs(120) {
            return Err(Error::Other(format!(
                "{topic}: did not reach the end within 120 s"
            )));
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                let headers: Vec<(String, String)> = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    h.value
                                        .map(|v| String::from_utf8_lossy(v).into_owned())
                                        .unwrap_or_default(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let mut line = describe(role, config.input.format, m.key(), m.payload(), &headers);
                line["partition"] = m.partition().into();
                line["offset"] = m.offset().into();
                emit(line);
                count += 1;
                at_end.remove(&m.partition());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CursorKeyRecord, CursorUpdateRecord};

    #[test]
    fn describes_changelog_records_and_tombstones() {
        let key = codec::encode_cursor_key(&CursorKeyRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
        });
        let value = codec::encode_cursor_update(&CursorUpdateRecord {
            conversation_id: "G".into(),
            user_id: "u".into(),
            cursor: 3,
            join_seq: 1,
            latest_seq: 4,
            updated_at: 0,
        });
        let line = describe(
            TopicRole::ReadCursors,
            codec::WireFormat::Auto,
            Some(&key),
            Some(&value),
            &[],
        );
        assert_eq!(line["key"]["user_id"], "u");
        assert_eq!(line["value"]["cursor"], 3);
        let tomb = describe(
            TopicRole::ReadCursors,
            codec::WireFormat::Auto,
            Some(&key),
            None,
            &[],
        );
        assert!(tomb["value"].is_null());
    }

    #[test]
    fn describes_dead_letters_with_headers() {
        let headers = vec![("readfold.reason".to_owned(), "decode_error".to_owned())];
        let line = describe(
            TopicRole::DeadLetters,
            codec::WireFormat::Auto,
            Some(b"G"),
            Some(b"\xff"),
            &headers,
        );
        assert_eq!(line["headers"]["readfold.reason"], "decode_error");
        assert_eq!(line["value"]["bytes"], 1);
    }
}
