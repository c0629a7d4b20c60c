//! The `[kafka]` and `[topics]` sections; defaults and documentation are in
//! `config/default.toml`.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;
use serde::Deserialize;

/// `[kafka]`: how to reach the brokers, as whom.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    pub bootstrap_servers: String,
    pub group_id: String,
    pub instance_id: String,
    pub transaction_timeout_ms: u64,
    /// How the processor's consumer group assigns partitions.
    #[serde(default)]
    pub group_protocol: GroupProtocol,
    /// librdkafka properties passed to every client as they are.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

/// The consumer group protocol of the processor's and the badge stage's
/// groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// Kafka's classic protocol with the eager range assignor: every
    /// rebalance stops every member's partitions.
    #[default]
    Classic,
    /// KIP-848 (Kafka 4): the broker's range assignor, incremental. Only
    /// the partitions that move stop; session timeout and heartbeat
    /// interval are the broker's (`group.consumer.*`).
    Consumer,
}

/// Properties that only the protocol's own settings may set: passed through
/// they would break the rebalance handling, or librdkafka refuses them
/// under the consumer protocol ("defined broker side").
const GROUP_PROTOCOL_OWNED: [&str; 4] = [
    "group.protocol",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
];

impl KafkaConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.properties.contains_key("group.protocol") {
            return Err("kafka.properties must not set group.protocol: use kafka.group_protocol".into());
        }
        if self.group_protocol == GroupProtocol::Consumer {
            if let Some(key) = GROUP_PROTOCOL_OWNED
                .iter()
                .find(|k| self.properties.contains_key(**k))
            {
                return Err(format!(
                    "kafka.properties must not set {key} with kafka.group_protocol = \"consumer\": the broker's group.consumer.* settings decide it"
                ));
            }
        }
        if self.group_id.is_empty() {
            return Err("kafka.group_id must not be empty".into());
        }
        if self.bootstrap_servers.trim().is_empty() {
            return Err("kafka.bootstrap_servers must name at least one broker".into());
        }
        // `#` marks the second transactional id (see `transactional_ids`);
        // an instance named with one could take another's.
        if self.instance_id.contains('#') {
            return Err(format!(
                "kafka.instance_id must not contain '#' (got {:?})",
                self.instance_id
            ));
        }
        Ok(())
    }

    /// The settings every client shares: brokers and the passthrough
    /// properties.
    pub fn client_config(&self) -> ClientConfig {
        self.client_config_over(&[])
    }

    /// [`KafkaConfig::client_config`] for a consumer that reads a backlog
    /// as fast as it can fold it (the processor catching up, replay,
    /// restore), with the passthrough properties still applied last.
    ///
    /// - Once a partition's local queue passes queued.min.messages,
    ///   librdkafka waits fetch.queue.backoff.ms (1 s by default) before it
    ///   fetches that partition again, and a reader that drained its queue
    ///   meanwhile idles. Fetch again 10 ms after.
    /// - Fetched but unfolded records stay few (1 MB per partition, 32 MB
    ///   queued), so that librdkafka reuses their memory: peak RSS stays
    ///   low at the same rate, and a replay takes no fresh pages for the
    ///   kernel to zero.
    pub fn backlog_client_config(&self) -> ClientConfig {
        self.client_config_over(&[
            ("fetch.queue.backoff.ms", "10"),
            ("max.partition.fetch.bytes", "1048576"),
            ("queued.max.messages.kbytes", "32768"),
        ])
    }

    /// [`KafkaConfig::client_config`] for the producers that write the
    /// changelogs, with their tuning as defaults the passthrough properties
    /// override (a deployment that pays for network bytes more than for
    /// CPU may want another `compression.type`):
    /// - linger.ms 5: records batch up while a flush encodes them; the
    ///   flush then sends what is left at once (`BatchProducer::flush_now`).
    /// - compression.type lz4: changelog records are small and alike.
    /// - queue.buffering.max.messages 1,000,000: a large flush queues its
    ///   records without waiting for the first ones' acknowledgements.
    pub fn changelog_producer_config(&self) -> ClientConfig {
        self.client_config_over(&[
            ("linger.ms", "5"),
            ("compression.type", "lz4"),
            ("queue.buffering.max.messages", "1000000"),
        ])
    }

    /// The brokers, then `defaults`, then the passthrough properties, which
    /// override them.
    ///
    /// Every client defaults to reconnect.backoff.ms 10 (librdkafka: 100).
    /// A new client connects to the bootstrap servers, learns the brokers
    /// and drops that connection for one to the broker it learned; a
    /// request made meanwhile waits for that connection, which librdkafka
    /// opens no sooner than half the backoff after its last one. At
    /// librdkafka's default the first request of most new clients would
    /// wait 50 ms, and a start makes several clients one after another. A
    /// broker that is down is still tried with the backoff doubling up to
    /// reconnect.backoff.max.ms (10 s).
    fn client_config_over(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &self.bootstrap_servers);
        client.set("reconnect.backoff.ms", "10");
        for &(key, value) in defaults {
            client.set(key, value);
        }
        for (key, value) in &self.properties {
            client.set(key, value);
        }
        // rdkafka's default log level follows the `log` crate, which
        // readfold does not use, and so lets only errors through: ask for
        // warnings too, and, with `debug` contexts set, for their lines
        // (they reach `--log debug`).
        client.set_log_level(if self.properties.contains_key("debug") {
            rdkafka::config::RDKafkaLogLevel::Debug
        } else {
            rdkafka::config::RDKafkaLogLevel::Warning
        });
        client
    }

    /// Sets a group consumer's protocol and its range assignor, which puts
    /// partition p of every co-partitioned input on one member: the
    /// client's under the classic protocol, the broker's under KIP-848.
    pub fn set_range_assignor(&self, client: &mut ClientConfig) {
        match self.group_protocol {
            GroupProtocol::Classic => client.set("partition.assignment.strategy", "range"),
            GroupProtocol::Consumer => client
                .set("group.protocol", "consumer")
                .set("group.remote.assignor", "range"),
        };
    }

    /// `instance_id`, or the host name when empty.
    pub fn instance_id(&self) -> String {
        if !self.instance_id.is_empty() {
            return self.instance_id.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "readfold".into())
    }

    /// The processor's two transactional ids, one per producer (they take
    /// turns, a flush each): `<group_id>-<instance_id>` and
    /// `<group_id>-<instance_id>#1`, so that a restarted instance fences
    /// both of its previous incarnation's producers. The first is also the
    /// id of a single-producer build, so an upgrade fences that one too.
    pub fn transactional_ids(&self) -> [String; 2] {
        let id = format!("{}-{}", self.group_id, self.instance_id());
        [id.clone(), format!("{id}#1")]
    }
}

/// `[topics]`: names, and how missing topics are created.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicsConfig {
    pub read_reports: String,
    pub conversation_events: String,
    pub read_cursors: String,
    pub user_read_cursors: String,
    /// readfold-internal: what the public changelog does not carry.
    pub member_state: String,
    pub thread_cursors: String,
    pub user_thread_cursors: String,
    /// readfold-internal: what the public thread changelog does not carry.
    pub thread_state: String,
    pub dlq: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub create: bool,
}

impl TopicsConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.partitions < 1 {
            return Err(format!(
                "topics.partitions must be at least 1, not {}",
                self.partitions
            ));
        }
        if self.replication_factor < 1 {
            return Err("topics.replication_factor must be at least 1".into());
        }
        let names = self.names();
        for (i, a) in names.iter().enumerate() {
            if a.is_empty() {
                return Err("topic names must not be empty".into());
            }
            // Kafka's own rule, checked here so that a bad name fails at
            // start with the setting's value rather than at the broker.
            let legal = a
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if a.len() > 249 || !legal || matches!(a.as_str(), "." | "..") {
                return Err(format!(
                    "topic {a:?}: Kafka topic names are at most 249 of the characters a-z, A-Z, 0-9, '.', '_' and '-', and not \".\" or \"..\""
                ));
            }
            if names[..i].contains(a) {
                return Err(format!("topic {a:?} is configured for two roles"));
            }
        }
        Ok(())
    }

    /// Every topic readfold uses, in a fixed order: inputs, changelogs,
    /// member state, thread changelogs, thread state, DLQ.
    pub fn names(&self) -> [&String; 9] {
        [
            &self.read_reports,
            &self.conversation_events,
            &self.read_cursors,
            &self.user_read_cursors,
            &self.member_state,
            &self.thread_cursors,
            &self.user_thread_cursors,
            &self.thread_state,
            &self.dlq,
        ]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A section of `config/default.toml`.
    pub(crate) fn default_section<T: serde::de::DeserializeOwned>(name: &str) -> T {
        let defaults: toml::Table = include_str!("../../../config/default.toml").parse().unwrap();
        defaults[name].clone().try_into().unwrap()
    }

    #[test]
    fn topic_names_follow_kafkas_rule() {
        let mut topics = default_section::<TopicsConfig>("topics");
        topics.dlq = "chat.read-cursors_dlq-2".into();
        topics.check().unwrap();
        for bad in [
            "chat read-reports",
            "chat/reports",
            "chat\0reports",
            "ü",
            ".",
            "..",
        ] {
            topics.dlq = bad.into();
            let e = topics.check().unwrap_err();
            assert!(e.contains("Kafka topic names"), "{bad}: {e}");
        }
        topics.dlq = "x".repeat(250);
        assert!(topics.check().is_err());
    }

    #[test]
    fn the_defaults_pass_their_checks() {
        default_section::<KafkaConfig>("kafka").check().unwrap();
        default_section::<TopicsConfig>("topics").check().unwrap();
    }

    #[test]
    fn the_group_protocol_is_set_only_by_its_own_key() {
        let mut kafka: KafkaConfig = default_section("kafka");
        assert_eq!(kafka.group_protocol, GroupProtocol::Classic);
        kafka
            .properties
            .insert("session.timeout.ms".into(), "6000".into());
        kafka.check().unwrap();
        kafka.group_protocol = GroupProtocol::Consumer;
        let e = kafka.check().unwrap_err();
        assert!(
            e.contains("session.timeout.ms") && e.contains("group.consumer"),
            "{e}"
        );
        kafka.properties.clear();
        kafka.check().unwrap();
        kafka
            .properties
            .insert("group.protocol".into(), "consumer".into());
        assert!(kafka.check().unwrap_err().contains("kafka.group_protocol"));
    }

    #[test]
    fn each_protocol_gets_its_range_assignor() {
        let mut kafka: KafkaConfig = default_section("kafka");
        let mut client = kafka.client_config();
        kafka.set_range_assignor(&mut client);
        assert_eq!(client.get("partition.assignment.strategy"), Some("range"));
        assert_eq!(client.get("group.protocol"), None);
        kafka.group_protocol = GroupProtocol::Consumer;
        let mut client = kafka.client_config();
        kafka.set_range_assignor(&mut client);
        assert_eq!(client.get("group.protocol"), Some("consumer"));
        assert_eq!(client.get("group.remote.assignor"), Some("range"));
        assert_eq!(client.get("partition.assignment.strategy"), None);
    }

    #[test]
    fn passthrough_properties_override_the_backlog_fetch_settings() {
        let mut kafka: KafkaConfig = default_section("kafka");
        let backlog = kafka.backlog_client_config();
        assert_eq!(backlog.get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(backlog.get("max.partition.fetch.bytes"), Some("1048576"));
        assert_eq!(kafka.client_config().get("fetch.queue.backoff.ms"), None);
        kafka
            .properties
            .insert("max.partition.fetch.bytes".into(), "4194304".into());
        let backlog = kafka.backlog_client_config();
        assert_eq!(backlog.get("max.partition.fetch.bytes"), Some("4194304"));
        assert_eq!(
            backlog.get("bootstrap.servers"),
            Some(kafka.bootstrap_servers.as_str())
        );
    }

    #[test]
    fn one_topic_in_two_roles_is_refused() {
        let mut topics: TopicsConfig = default_section("topics");
        topics.dlq = topics.read_reports.clone();
        assert!(topics.check().unwrap_err().contains("two roles"));
        topics.dlq = String::new();
        assert!(topics.check().is_err());
    }

    #[test]
    fn the_transactional_ids_name_group_and_instance() {
        let mut kafka: KafkaConfig = default_section("kafka");
        kafka.instance_id = "a".into();
        assert_eq!(kafka.transactional_ids(), ["readfold-a", "readfold-a#1"]);
        assert!(kafka.check().is_ok());
    }

    #[test]
    fn an_instance_id_with_the_second_ids_mark_is_refused() {
        // Instance "a#1" would take instance "a"'s second id.
        let mut kafka: KafkaConfig = default_section("kafka");
        kafka.instance_id = "a#1".into();
        assert!(kafka.check().unwrap_err().contains("'#'"));
    }
}
