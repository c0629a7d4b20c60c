//! The `[badge]` section, whose defaults and documentation are in
//! `config/default.toml`, and the stage's topics.

use readfold_core::badge::{BadgeCount, BadgeRules, MutedRule};
use readfold_kafka::admin::create_topic;
use readfold_kafka::reader::TopicReader;
use serde::Deserialize;

use crate::{BadgeSettings, Error, Layout, Result};

/// `[badge]`: the badge stage (`readfold badges`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BadgeConfig {
    pub group_id: String,
    pub user_badges: String,
    pub user_actions: String,
    /// `mentions_only`, `exclude` or `include`.
    pub muted: String,
    /// `messages` or `conversations`.
    pub count: String,
    pub flush_interval_ms: u64,
    /// How often badges changed only by others' messages are published.
    pub fanout_interval_ms: u64,
    /// Members held from which a conversation's messages wait for
    /// `fanout_interval_ms`.
    pub fanout_min_members: usize,
}

impl BadgeConfig {
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.group_id.is_empty() {
            return Err("badge.group_id must not be empty".into());
        }
        if self.user_badges.is_empty()
            || self.user_actions.is_empty()
            || self.user_badges == self.user_actions
        {
            return Err("badge.user_badges and badge.user_actions must be two topic names".into());
        }
        if self.flush_interval_ms == 0 {
            return Err("badge.flush_interval_ms must be at least 1".into());
        }
        if self.fanout_interval_ms < self.flush_interval_ms {
            return Err("badge.fanout_interval_ms must be at least badge.flush_interval_ms".into());
        }
        self.rules().map(drop)
    }

    pub fn rules(&self) -> std::result::Result<BadgeRules, String> {
        Ok(BadgeRules {
            muted: self
                .muted
                .parse::<MutedRule>()
                .map_err(|e| format!("badge.muted: {e}"))?,
            count: self
                .count
                .parse::<BadgeCount>()
                .map_err(|e| format!("badge.count: {e}"))?,
        })
    }
}

/// Creates the stage's topics if missing (and allowed) and checks that
/// the user actions are co-partitioned with the by-user changelog.
pub(crate) async fn ensure_topics(settings: &BadgeSettings) -> Result<Layout> {
    let (kafka, topics, badge) = (&settings.kafka, &settings.topics, &settings.badge);
    let reader = TopicReader::new(kafka, &badge.group_id, false)?;
    let count = |name: &str| {
        reader
            .partitions(name)
            .map(|p| p.len() as i32)
            .ok()
            .filter(|&n| n > 0)
    };
    let by_user = count(&topics.user_read_cursors).ok_or_else(|| {
        Error::Topology(format!(
            "{:?} does not exist: start the first stage (readfold run) first",
            topics.user_read_cursors
        ))
    })?;
    if topics.create {
        for (name, compacted) in [(&badge.user_badges, true), (&badge.user_actions, false)] {
            if count(name).is_none() {
                create_topic(kafka, name, by_user, topics.replication_factor, compacted).await?;
            }
        }
    }
    let missing = |name: &str| {
        Error::Topology(format!(
            "topic {name:?} does not exist (and topics.create is false)"
        ))
    };
    let actions = count(&badge.user_actions).ok_or_else(|| missing(&badge.user_actions))?;
    if actions != by_user {
        return Err(Error::Topology(format!(
            "{:?} has {actions} partitions but {:?} has {by_user}: user actions must be co-partitioned \
             with the by-user changelog (same count, murmur2 of the user id) so one instance sees all of a user",
            badge.user_actions, topics.user_read_cursors
        )));
    }
    let threads = count(&topics.user_thread_cursors).ok_or_else(|| missing(&topics.user_thread_cursors))?;
    if threads != by_user {
        return Err(Error::Topology(format!(
            "{:?} has {threads} partitions but {:?} has {by_user}: the by-user thread changelog must be \
             co-partitioned with the by-user changelog (same count, murmur2 of the user id)",
            topics.user_thread_cursors, topics.user_read_cursors
        )));
    }
    Ok(Layout {
        user_actions: actions,
        read_reports: count(&topics.read_reports).ok_or_else(|| missing(&topics.read_reports))?,
        user_badges: count(&badge.user_badges).ok_or_else(|| missing(&badge.user_badges))?,
        dlq: count(&topics.dlq).ok_or_else(|| missing(&topics.dlq))?,
    })
}
