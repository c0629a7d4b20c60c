//! Topic layout at start: create what is missing, refuse what breaks
//! co-partitioning.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;

use readfold_wire::{OutputLayout, OutputTopics};

use crate::config::{KafkaConfig, TopicsConfig};
use crate::context::{CheckedContext, LogContext};
use crate::error::{Error, Result};
use rdkafka::producer::{BaseProducer, Producer};

const TIMEOUT: Duration = Duration::from_secs(30);

/// What readfold needs of each topic it touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub compacted: bool,
}

/// What the broker says about an existing topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicFacts {
    pub partitions: i32,
    pub cleanup_policy: String,
}

/// The checked layout the processor runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Partition count of both inputs and of `read_cursors`.
    pub partitions: i32,
    pub output: OutputLayout,
}

impl Layout {
    /// Where the processor's output goes.
    pub fn output_topics(&self, topics: &TopicsConfig) -> OutputTopics {
        OutputTopics {
            read_cursors: topics.read_cursors.clone(),
            user_read_cursors: topics.user_read_cursors.clone(),
            member_state: topics.member_state.clone(),
            thread_cursors: topics.thread_cursors.clone(),
            user_thread_cursors: topics.user_thread_cursors.clone(),
            thread_state: topics.thread_state.clone(),
            dlq: topics.dlq.clone(),
            layout: self.output,
        }
    }
}

/// The topics readfold uses, in a fixed order: inputs, changelogs, DLQ.
pub fn specs(t: &TopicsConfig) -> [TopicSpec; 9] {
    let spec = |name: &String, compacted| TopicSpec {
        name: name.clone(),
        compacted,
    };
    [
        spec(&t.read_reports, false),
        spec(&t.conversation_events, false),
        spec(&t.read_cursors, true),
        spec(&t.user_read_cursors, true),
        spec(&t.member_state, true),
        spec(&t.thread_cursors, true),
        spec(&t.user_thread_cursors, true),
        spec(&t.thread_state, true),
        spec(&t.dlq, false),
    ]
}

/// Checks the observed topics against what the fold relies on.
pub fn check_layout(t: &TopicsConfig, facts: &HashMap<String, TopicFacts>) -> Result<Layout> {
    let get = |name: &str| {
        facts.get(name).ok_or_else(|| {
            Error::Topology(format!(
                "topic {name:?} does not exist (and topics.create is false)"
            ))
        })
    };
    let reports = get(&t.read_reports)?;
    let events = get(&t.conversation_events)?;
    let cursors = get(&t.read_cursors)?;
    let user_cursors = get(&t.user_read_cursors)?;
    let member_state = get(&t.member_state)?;
    let thread_cursors = get(&t.thread_cursors)?;
    let user_thread_cursors = get(&t.user_thread_cursors)?;
    let thread_state = get(&t.thread_state)?;
    let dlq = get(&t.dlq)?;
    if reports.partitions != events.partitions {
        return Err(Error::Topology(format!(
            "{:?} has {} partitions but {:?} has {}: the inputs must be co-partitioned \
             (same count, same murmur2 partitioner) so one instance sees all of a conversation",
            t.read_reports, reports.partitions, t.conversation_events, events.partitions
        )));
    }
    if cursors.partitions != reports.partitions {
        return Err(Error::Topology(format!(
            "{:?} has {} partitions but the inputs have {}: the changelog must have the same count, \
             since a cursor is written to the partition number of its input and restored from it",
            t.read_cursors, cursors.partitions, reports.partitions
        )));
    }
    for (name, topic, role) in [
        (&t.member_state, member_state, "the member-state topic"),
        (&t.thread_cursors, thread_cursors, "the thread changelog"),
        (&t.thread_state, thread_state, "the thread-state topic"),
    ] {
        if topic.partitions != reports.partitions {
            return Err(Error::Topology(format!(
                "{name:?} has {} partitions but the inputs have {}: {role} must have the same count, \
                 since it is written to the partition number of its input and restored from it",
                topic.partitions, reports.partitions
            )));
        }
    }
    for (name, topic) in [
        (&t.read_cursors, cursors),
        (&t.user_read_cursors, user_cursors),
        (&t.member_state, member_state),
        (&t.thread_cursors, thread_cursors),
        (&t.user_thread_cursors, user_thread_cursors),
        (&t.thread_state, thread_state),
    ] {
        if topic.cleanup_policy.trim() != "compact" {
            return Err(Error::Topology(format!(
                "{name:?} has cleanup.policy={} but a cursor changelog must be compacted and never \
                 deleted (cleanup.policy=compact), or restore and gateways would miss old cursors",
                topic.cleanup_policy
            )));
        }
    }
    Ok(Layout {
        partitions: reports.partitions,
        output: OutputLayout {
            user_read_cursors_partitions: user_cursors.partitions,
            user_thread_cursors_partitions: user_thread_cursors.partitions,
            dlq_partitions: dlq.partitions,
        },
    })
}

/// Creates missing topics (if allowed) and checks the layout.
pub async fn ensure_topics(kafka: &KafkaConfig, topics: &TopicsConfig) -> Result<Layout> {
    let started = std::time::Instant::now();
    let admin = connect(kafka).await?;
    let connected = started.elapsed();
    let specs = specs(topics);
    let mut known = None;
    if topics.create {
        let existing = partition_counts(&admin)?;
        let missing: Vec<&TopicSpec> = specs.iter().filter(|s| !existing.contains_key(&s.name)).collect();
        if missing.is_empty() {
            known = Some(existing);
        } else {
            create(&admin, &missing, topics.partitions, topics.replication_factor).await?;
            wait_for_leaders(&admin, &missing).await;
        }
    }
    let listed = started.elapsed();
    let facts = describe(&admin, &specs, known).await;
    tracing::debug!(
        connect_ms = connected.as_millis() as u64,
        list_ms = (listed - connected).as_millis() as u64,
        describe_ms = (started.elapsed() - listed).as_millis() as u64,
        "topic check phases"
    );
    drop_in_background(admin);
    check_layout(topics, &facts?)
}

/// Drops a librdkafka client on a thread of its own: its destroy waits for
/// the client's threads to wind down, which a start (the topic check comes
/// first) need not wait for.
pub fn drop_in_background<T: Send + 'static>(client: T) {
    std::thread::spawn(move || drop(client));
}

/// Deletes topics, for benches and tests that made their own.
pub async fn delete_topics(kafka: &KafkaConfig, names: &[&str]) -> Result<()> {
    let admin = connect(kafka).await?;
    for result in admin.delete_topics(names, &AdminOptions::new()).await? {
        if let Err((name, code)) = result {
            tracing::warn!(topic = %name, %code, "cannot delete topic");
        }
    }
    Ok(())
}

/// Creates one topic with `partitions` partitions, compacted or not; one
/// that exists already is left alone.
pub async fn create_topic(
    kafka: &KafkaConfig,
    name: &str,
    partitions: i32,
    replication_factor: i32,
    compacted: bool,
) -> Result<()> {
    let admin = connect(kafka).await?;
    let spec = TopicSpec {
        name: name.to_owned(),
        compacted,
    };
    create(&admin, &[&spec], partitions, replication_factor).await
}

/// An admin client, once the brokers have answered: fails at once, with
/// librdkafka's reason, when they reject the credentials or TLS fails, and
/// after [`TIMEOUT`] when none answers.
pub async fn connect(kafka: &KafkaConfig) -> Result<AdminClient<LogContext>> {
    // Made only once the probe got an answer: a TLS or SASL set-up error
    // then costs one client's failed handshakes, not two.
    check_reachable(kafka).await?;
    Ok(kafka.client_config().create_with_context(LogContext)?)
}

/// Waits until the brokers answer a metadata request. librdkafka reports
/// connection errors only to the error callback, served by polling the
/// client, so a producer (whose `poll` serves it) asks.
pub async fn check_reachable(kafka: &KafkaConfig) -> Result<()> {
    let context = CheckedContext::default();
    let probe: BaseProducer<CheckedContext> = kafka.client_config().create_with_context(context.clone())?;
    let started = std::time::Instant::now();
    loop {
        // Short attempts, so that a setup error ends the wait early.
        let attempt = probe.client().fetch_metadata(None, Duration::from_millis(500));
        probe.poll(Duration::ZERO);
        if let Some(reason) = context.setup_error() {
            return Err(Error::Setup {
                bootstrap: kafka.bootstrap_servers.clone(),
                reason,
            });
        }
        match attempt {
            Ok(_) => {
                drop_in_background(probe);
                return Ok(());
            }
            Err(e) if started.elapsed() >= TIMEOUT => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn partition_counts<C: rdkafka::client::ClientContext>(
    admin: &AdminClient<C>,
) -> Result<HashMap<String, i32>> {
    let metadata = admin.inner().fetch_metadata(None, TIMEOUT)?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
        .collect())
}

/// Waits, for at most a few seconds, until every partition of the topics
/// just created has a leader that answers for it: the controller answers
/// CreateTopics before the brokers lead them, and a restore that reads them
/// sooner fails (NotLeaderForPartition) and waits out a retry's backoff.
/// Metadata naming a leader is not enough: a KRaft broker lists itself as
/// leader a moment before it answers ListOffsets for the partition, so each
/// partition's offsets are asked too. Blocking calls, as the rest of the
/// check makes.
async fn wait_for_leaders<C: rdkafka::client::ClientContext>(admin: &AdminClient<C>, created: &[&TopicSpec]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // Partitions that answered ListOffsets already, not asked again.
    let mut answered: std::collections::HashSet<(String, i32)> = Default::default();
    let mut led = |spec: &TopicSpec| {
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(metadata) = admin
            .inner()
            .fetch_metadata(Some(&spec.name), left().max(Duration::from_millis(100)))
        else {
            return false;
        };
        let Some(topic) = metadata.topics().iter().find(|t| t.name() == spec.name) else {
            return false;
        };
        topic.error().is_none()
            && !topic.partitions().is_empty()
            && topic.partitions().iter().all(|p| {
                let key = (spec.name.clone(), p.id());
                if answered.contains(&key) {
                    return true;
                }
                let serves = p.error().is_none()
                    && p.leader() >= 0
                    && admin
                        .inner()
                        .fetch_watermarks(
                            &spec.name,
                            p.id(),
                            left().clamp(Duration::from_millis(10), Duration::from_millis(500)),
                        )
                        .is_ok();
                if serves {
                    answered.insert(key);
                }
                serves
            })
    };
    while !created.iter().all(|spec| led(spec)) {
        if std::time::Instant::now() >= deadline {
            tracing::warn!("created topics still have partitions whose leader does not serve them; going on");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create(
    admin: &AdminClient<LogContext>,
    missing: &[&TopicSpec],
    partitions: i32,
    replication_factor: i32,
) -> Result<()> {
    let new_topics: Vec<NewTopic<'_>> = missing
        .iter()
        .map(|spec| {
            let policy = if spec.compacted { "compact" } else { "delete" };
            NewTopic::new(
                &spec.name,
                partitions,
                TopicReplication::Fixed(replication_factor),
            )
            .set("cleanup.policy", policy)
        })
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    for result in admin.create_topics(&new_topics, &options).await? {
        match result {
            Ok(name) => tracing::info!(topic = %name, "created topic"),
            // Another instance created it first.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::Topology(format!("cannot create topic {name:?}: {code}")))
            }
        }
    }
    Ok(())
}

/// The facts of `specs`' topics; `known` holds partition counts just
/// fetched, when no topic was created since.
async fn describe(
    admin: &AdminClient<LogContext>,
    specs: &[TopicSpec],
    mut known: Option<HashMap<String, i32>>,
) -> Result<HashMap<String, TopicFacts>> {
    // Freshly created topics can take a moment to show up in metadata.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let counts = loop {
        let counts = match known.take() {
            Some(counts) => counts,
            None => partition_counts(admin)?,
        };
        if specs.iter().all(|s| counts.contains_key(&s.name)) || tokio::time::Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let present: Vec<&TopicSpec> = specs.iter().filter(|s| counts.contains_key(&s.name)).collect();
    let resources: Vec<ResourceSpecifier<'_>> = present
        .iter()
        .map(|s| ResourceSpecifier::Topic(&s.name))
        .collect();
    let described = admin
        .describe_configs(&resources, &AdminOptions::new().request_timeout(Some(TIMEOUT)))
        .await?;
    let mut facts = HashMap::new();
    for (spec, result) in present.iter().zip(described) {
        let resource = result
            .map_err(|code| Error::Topology(format!("cannot describe topic {:?}: {code}", spec.name)))?;
        let cleanup_policy = resource
            .get("cleanup.policy")
            .and_then(|e| e.value.clone())
            .unwrap_or_else(|| "delete".into());
        facts.insert(
            spec.name.clone(),
            TopicFacts {
                partitions: counts[&spec.name],
                cleanup_policy,
            },
        );
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> TopicsConfig {
        crate::config::tests::default_section("topics")
    }

    /// Facts of the topics in [`specs`]' order: inputs, changelog, by-user
    /// changelog, member state, thread changelog, by-user thread changelog,
    /// thread state, DLQ.
    fn facts(counts: [i32; 9], policies: [&str; 9]) -> HashMap<String, TopicFacts> {
        specs(&topics())
            .iter()
            .zip(counts.iter().zip(policies))
            .map(|(s, (&partitions, policy))| {
                (
                    s.name.clone(),
                    TopicFacts {
                        partitions,
                        cleanup_policy: policy.to_owned(),
                    },
                )
            })
            .collect()
    }
    const POLICIES: [&str; 9] = [
        "delete", "delete", "compact", "compact", "compact", "compact", "compact", "compact", "delete",
    ];
    const SIX: [i32; 9] = [6; 9];

    /// `SIX` with topic `i` at `count`, or POLICIES with topic `i` at `policy`.
    fn count_at(i: usize, count: i32) -> [i32; 9] {
        let mut counts = SIX;
        counts[i] = count;
        counts
    }
    fn policy_at(i: usize, policy: &'static str) -> [&'static str; 9] {
        let mut policies = POLICIES;
        policies[i] = policy;
        policies
    }

    fn check(f: &HashMap<String, TopicFacts>) -> Result<Layout> {
        check_layout(&topics(), f)
    }

    #[test]
    fn accepts_a_co_partitioned_layout() {
        let layout = check(&facts([6, 6, 6, 12, 6, 6, 8, 6, 3], POLICIES)).unwrap();
        assert_eq!(layout.partitions, 6);
        assert_eq!(layout.output.user_read_cursors_partitions, 12);
        assert_eq!(layout.output.user_thread_cursors_partitions, 8);
        assert_eq!(layout.output.dlq_partitions, 3);
    }

    #[test]
    fn refuses_inputs_with_different_counts() {
        let err = check(&facts(count_at(1, 4), POLICIES)).unwrap_err().to_string();
        assert!(err.contains("co-partitioned"), "{err}");
    }

    #[test]
    fn refuses_a_changelog_with_another_count() {
        let err = check(&facts(count_at(2, 8), POLICIES)).unwrap_err().to_string();
        assert!(err.contains("chat.read-cursors"), "{err}");
    }

    #[test]
    fn refuses_an_uncompacted_changelog() {
        let err = check(&facts(SIX, ["delete"; 9])).unwrap_err().to_string();
        assert!(err.contains("cleanup.policy=compact"), "{err}");
        assert!(check(&facts(SIX, policy_at(2, "compact,delete"))).is_err());
    }

    #[test]
    fn refuses_a_member_state_topic_that_is_not_co_partitioned_or_compacted() {
        let err = check(&facts(count_at(4, 4), POLICIES)).unwrap_err().to_string();
        assert!(err.contains("member-state"), "{err}");
        assert!(check(&facts(SIX, policy_at(4, "delete"))).is_err());
    }

    #[test]
    fn refuses_thread_topics_that_are_not_co_partitioned_or_compacted() {
        for (i, name) in [(5, "chat.thread-cursors"), (7, "chat.read-thread-state")] {
            let err = check(&facts(count_at(i, 4), POLICIES)).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains("same count"), "{err}");
        }
        for i in 5..8 {
            let err = check(&facts(SIX, policy_at(i, "delete")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("cleanup.policy=compact"), "{err}");
        }
        // The by-user thread changelog is partitioned by user: any count.
        assert!(check(&facts(count_at(6, 4), POLICIES)).is_ok());
    }

    #[test]
    fn names_a_missing_topic() {
        let mut f = facts(SIX, POLICIES);
        f.remove("chat.read-reports.dlq");
        assert!(check(&f)
            .unwrap_err()
            .to_string()
            .contains("chat.read-reports.dlq"));
    }
}
