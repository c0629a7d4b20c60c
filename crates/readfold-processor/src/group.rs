//! Consumer group handling: the group member's consumer, and what
//! librdkafka's rebalance callbacks report, queued in order for the run loop.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol, StreamConsumer};
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};
use readfold_kafka::routed_queue::{RouteSlot, RoutedReader};
use readfold_kafka::{partitions_of, KafkaConfig, TopicsConfig};

use crate::error::Result;
use crate::telemetry;

/// What the consumer group told us, in order. The classic protocol
/// revokes and assigns whole; the consumer protocol (KIP-848) adds and
/// releases some partitions while the rest go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    /// Everything goes.
    Revoked { lost: bool },
    /// The whole new assignment.
    Assigned {
        partitions: Vec<(String, i32)>,
        /// The assignment already waited for stable committed offsets
        /// ([`start_at_committed`]): a restore need not wait again.
        offsets_stable: bool,
    },
    /// These come, beside what is held.
    Added {
        partitions: Vec<(String, i32)>,
        offsets_stable: bool,
    },
    /// These go; the rest stay.
    Released {
        partitions: Vec<(String, i32)>,
        lost: bool,
    },
}

/// Receives librdkafka's callbacks on its threads; the run loop drains the
/// events before it touches any partition's state.
pub struct GroupContext {
    events: Arc<Queue>,
    /// The input topics (read reports, conversation events), as librdkafka
    /// takes names.
    inputs: [CString; 2],
    /// How long an assignment waits for the group's committed offsets.
    committed_wait: Duration,
    /// Where assigned partitions' fetched messages go, while its reader
    /// lives (see [`routed_reader`]).
    routed: RouteSlot,
    /// Each input partition's end as the last statistics gave it: its last
    /// stable offset (read-committed: what an open transaction holds back
    /// is not there to fold yet), by input as in `inputs`.
    stable_ends: Mutex<[BTreeMap<i32, i64>; 2]>,
}

/// The events, and a wake-up for the run loop when one arrives.
#[derive(Default)]
struct Queue {
    events: Mutex<Vec<GroupEvent>>,
    arrived: Notify,
}

impl GroupContext {
    /// The assigned `partitions` of each input (as in `inputs`) with their
    /// stable ends if known, as (topic, partition, end).
    pub fn stable_ends(&self, partitions: &[Vec<i32>; 2]) -> Vec<(&CStr, i32, Option<i64>)> {
        let stable_ends = self.stable_ends.lock().expect("stable ends lock");
        let mut ends = Vec::with_capacity(partitions[0].len() + partitions[1].len());
        for ((topic, known), assigned) in self.inputs.iter().zip(stable_ends.iter()).zip(partitions) {
            ends.extend(
                assigned
                    .iter()
                    .map(|&p| (topic.as_c_str(), p, known.get(&p).copied())),
            );
        }
        ends
    }

    fn push(&self, event: GroupEvent) {
        self.events.events.lock().expect("group event lock").push(event);
        self.events.arrived.notify_one();
    }
}

/// The group events queued since the last call.
#[derive(Clone)]
pub struct GroupEvents(Arc<Queue>);

impl GroupEvents {
    pub fn take(&self) -> Vec<GroupEvent> {
        std::mem::take(&mut *self.0.events.lock().expect("group event lock"))
    }

    /// Whether events wait to be taken.
    pub fn pending(&self) -> bool {
        !self.0.events.lock().expect("group event lock").is_empty()
    }

    /// Completes once an event arrived since the last time it completed.
    /// A rebalance callback runs inside the consumer's poll but yields no
    /// message, so without this the run loop learnt of an assignment only
    /// at its next flush tick (500 ms after the join, at every start).
    pub async fn arrived(&self) {
        self.0.arrived.notified().await;
    }
}

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        readfold_kafka::context::log_line(level, facility, message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        readfold_kafka::context::log_error(&error, reason);
    }

    fn stats(&self, statistics: Statistics) {
        let mut stable_ends = self.stable_ends.lock().expect("stable ends lock");
        for (name, topic) in &statistics.topics {
            let Some(input) = self.inputs.iter().position(|i| i.to_bytes() == name.as_bytes()) else {
                continue;
            };
            for (&partition, p) in &topic.partitions {
                // librdkafka's own consumer_lag is measured from the
                // consumer's committed offset, which it never learns when
                // offsets are committed through the producer's transaction;
                // the lag here is from the next offset to process.
                let end = if p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                if partition >= 0 && end >= 0 {
                    stable_ends[input].insert(partition, end);
                }
                if partition >= 0 && p.app_offset >= 0 && end >= 0 {
                    telemetry::consumer_lag(name, partition, (end - p.app_offset).max(0));
                }
            }
        }
    }
}

impl ConsumerContext for GroupContext {
    /// Applies a rebalance as rdkafka's own handler does (whole under the
    /// classic protocol's eager range assignor, incrementally under the
    /// consumer protocol) and queues its event for the run loop, except
    /// that an assignment names where each partition starts. Left to
    /// librdkafka, a partition without a committed offset waits 100 ms
    /// before it asks for its first offset (its offset reset backs off as
    /// after an error): every first start of a group lost that much before
    /// its first record.
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let incremental = matches!(consumer.rebalance_protocol(), RebalanceProtocol::Cooperative);
        if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS {
            // Partitions added beside others are left to librdkafka, which
            // fetches their stable offsets without holding up the run loop
            // (this callback runs inside its poll): a previous owner that
            // died with a transaction open holds them until the broker
            // aborts it. Their restore waits for them beside the loop.
            let beside = incremental && consumer.assignment().is_ok_and(|held| held.count() > 0);
            let offsets_stable = !beside && start_at_committed(consumer, tpl, self.committed_wait);
            self.routed.route(tpl);
            let applied = if incremental {
                consumer.incremental_assign(tpl)
            } else {
                consumer.assign(tpl)
            };
            if let Err(e) = applied {
                tracing::error!(error = %e, "could not apply the group's assignment");
            }
            telemetry::rebalance("assign");
            let partitions = partitions_of(tpl);
            self.push(if incremental {
                GroupEvent::Added {
                    partitions,
                    offsets_stable,
                }
            } else {
                GroupEvent::Assigned {
                    partitions,
                    offsets_stable,
                }
            });
        } else if incremental {
            // A revoke, or a rebalance error: what it names goes.
            if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS {
                telemetry::rebalance("revoke");
            }
            let lost =
                err != RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS || consumer.assignment_lost();
            self.push(GroupEvent::Released {
                partitions: partitions_of(tpl),
                lost,
            });
            if let Err(e) = consumer.incremental_unassign(tpl) {
                tracing::error!(error = %e, "could not apply the group's revoke");
            }
        } else {
            // A revoke, or a rebalance error: either way nothing stays
            // assigned, as rdkafka's own handler does.
            if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS {
                telemetry::rebalance("revoke");
                let lost = consumer.assignment_lost();
                self.push(GroupEvent::Revoked { lost });
            }
            if let Err(e) = consumer.unassign() {
                tracing::error!(error = %e, "could not apply the group's revoke");
            }
        }
    }
}

/// Where a partition with no committed offset starts: the consumer's
/// `auto.offset.reset` is `earliest` (set in [`consumer`]), and an explicit
/// start must agree with it.
const NONE_COMMITTED_START: Offset = Offset::Beginning;

/// Sets each assigned partition's offset to the group's committed one, or
/// to [`NONE_COMMITTED_START`] where none is committed, and says whether it
/// did. The fetch asks for stable offsets (read_committed, KIP-447), as
/// librdkafka's own would: it waits while a transaction that added offsets
/// of these partitions (a previous owner's last flush) is still open, so
/// the offsets it returns include that transaction's outcome. On failure
/// the offsets stay unset, and librdkafka fetches them itself.
fn start_at_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &mut TopicPartitionList,
    wait: Duration,
) -> bool {
    let committed = match consumer.committed_offsets(tpl.clone(), wait) {
        Ok(committed) => committed,
        Err(e) => {
            tracing::debug!(error = %e, "could not fetch the committed offsets at assignment; librdkafka will");
            return false;
        }
    };
    if let Some(failed) = committed.elements().iter().find(|e| e.error().is_err()) {
        tracing::debug!(topic = failed.topic(), partition = failed.partition(), error = ?failed.error(), "could not fetch a committed offset at assignment; librdkafka will");
        return false;
    }
    for element in committed.elements() {
        let start = match element.offset() {
            Offset::Offset(offset) => Offset::Offset(offset),
            Offset::Invalid => NONE_COMMITTED_START,
            _ => continue,
        };
        if let Err(e) = tpl.set_partition_offset(element.topic(), element.partition(), start) {
            tracing::debug!(error = %e, "could not set a partition's start offset; librdkafka will fetch them");
            return false;
        }
    }
    true
}

pub type GroupConsumer = StreamConsumer<GroupContext>;

/// How long a fetch of stable committed offsets waits at most, at an
/// assignment and before a restore: an open transaction holding them is
/// aborted by its coordinator after `transaction.timeout.ms` at most.
pub(crate) fn stable_offsets_wait(kafka: &KafkaConfig) -> Duration {
    Duration::from_millis(kafka.transaction_timeout_ms)
}

/// A topic's name for librdkafka's C calls. `TopicsConfig::check` allows
/// only Kafka's characters, so no NUL.
fn topic_c_name(topic: &str) -> CString {
    CString::new(topic).expect("a checked topic name has no NUL")
}

/// The group member's consumer, not yet subscribed, and its event queue.
pub fn consumer(kafka: &KafkaConfig, topics: &TopicsConfig) -> Result<(GroupConsumer, GroupEvents)> {
    let events = Arc::new(Queue::default());
    let context = GroupContext {
        events: events.clone(),
        inputs: [
            topic_c_name(&topics.read_reports),
            topic_c_name(&topics.conversation_events),
        ],
        // Past it, librdkafka fetches the offsets itself.
        committed_wait: stable_offsets_wait(kafka),
        routed: RouteSlot::default(),
        stable_ends: Mutex::default(),
    };
    let mut config = kafka.backlog_client_config();
    config
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        // As NONE_COMMITTED_START.
        .set("auto.offset.reset", "earliest")
        // Input producers may be transactional too.
        .set("isolation.level", "read_committed")
        // Often enough for a catch-up's pacing to know the inputs' ends
        // (see `Processor::queue_drained`).
        .set("statistics.interval.ms", "100");
    // Partition p of both inputs on one member; see topology.md.
    kafka.set_range_assignor(&mut config);
    let consumer: GroupConsumer = config.create_with_context(context)?;
    Ok((consumer, GroupEvents(events)))
}

/// A batched reader of everything `consumer` fetches from the next
/// assignment on (see [`readfold_kafka::routed_queue`]). Make it before
/// the first poll: the assignment is routed when it is applied.
pub fn routed_reader(consumer: &Arc<GroupConsumer>) -> RoutedReader {
    let reader = RoutedReader::of(consumer);
    consumer.context().routed.set(&reader);
    reader
}
