//! `readfold tail TOPIC`: a topic's committed records decoded as JSON lines.

use std::ops::ControlFlow;
use std::time::Duration;

use rdkafka::message::Message;
use readfold_kafka::reader::{headers_of, TopicReader, Until};
use readfold_wire::describe::{describe, TopicRole};
use serde_json::Value;

use crate::config::{Config, ConfigError};
use crate::error::Result;

/// The role of one of the configured topics.
pub fn role_of(config: &Config, topic: &str) -> Option<TopicRole> {
    let t = &config.topics;
    [
        (&t.read_reports, TopicRole::ReadReports),
        (&t.conversation_events, TopicRole::ConversationEvents),
        (&t.read_cursors, TopicRole::ReadCursors),
        (&t.user_read_cursors, TopicRole::UserReadCursors),
        (&t.thread_cursors, TopicRole::ThreadCursors),
        (&t.user_thread_cursors, TopicRole::UserThreadCursors),
        (&t.dlq, TopicRole::DeadLetters),
    ]
    .into_iter()
    .find(|(name, _)| name.as_str() == topic)
    .map(|(_, role)| role)
}

/// Emits every committed record of `topic` as JSON, from the beginning;
/// stops at the end unless `follow`, or after `limit` records.
pub fn tail(
    config: &Config,
    topic: &str,
    follow: bool,
    limit: Option<u64>,
    mut emit: impl FnMut(Value),
) -> Result<u64> {
    let role = role_of(config, topic).ok_or_else(|| {
        ConfigError::Invalid(format!(
            "{topic:?} is none of the topics in the configuration ([topics])"
        ))
    })?;
    let reader = TopicReader::new(&config.kafka, &format!("{}-tail", config.kafka.group_id), false)?;
    let assigned = reader.assign_from_beginning(topic, None)?;
    let until = if follow {
        Until::Forever
    } else {
        Until::End {
            within: Duration::from_secs(120),
        }
    };
    let mut count = 0u64;
    if limit == Some(0) {
        return Ok(0);
    }
    reader.read(topic, &assigned, until, |m| {
        let mut line = describe(role, config.input.format, m.key(), m.payload(), &headers_of(m));
        line["partition"] = m.partition().into();
        line["offset"] = m.offset().into();
        emit(line);
        count += 1;
        if limit.is_some_and(|l| count >= l) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })?;
    Ok(count)
}
