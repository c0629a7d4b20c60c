//! Consumer group handling: the group member's consumer, and what
//! librdkafka's rebalance callbacks report, queued in order for the run loop.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::statistics::Statistics;
use readfold_kafka::{KafkaConfig, TopicsConfig};

use crate::error::Result;
use crate::telemetry;

/// What the consumer group told us, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEvent {
    Revoked { lost: bool },
    Assigned(Vec<(String, i32)>),
}

/// Receives librdkafka's callbacks on its threads; the run loop drains the
/// events before it touches any partition's state.
pub struct GroupContext {
    events: Arc<Queue>,
    inputs: [String; 2],
}

/// The events, and a wake-up for the run loop when one arrives.
#[derive(Default)]
struct Queue {
    events: Mutex<Vec<GroupEvent>>,
    arrived: Notify,
}

impl GroupContext {
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
        for (name, topic) in &statistics.topics {
            if !self.inputs.contains(name) {
                continue;
            }
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
                if partition >= 0 && p.app_offset >= 0 && end >= 0 {
                    telemetry::consumer_lag(name, partition, (end - p.app_offset).max(0));
                }
            }
        }
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = rebalance {
            telemetry::rebalance("revoke");
            let lost = consumer.assignment_lost();
            self.push(GroupEvent::Revoked { lost });
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            telemetry::rebalance("assign");
            let partitions = tpl
                .elements()
                .iter()
                .map(|e| (e.topic().to_owned(), e.partition()))
                .collect();
            self.push(GroupEvent::Assigned(partitions));
        }
    }
}

pub type GroupConsumer = StreamConsumer<GroupContext>;

/// The group member's consumer, not yet subscribed, and its event queue.
pub fn consumer(kafka: &KafkaConfig, topics: &TopicsConfig) -> Result<(GroupConsumer, GroupEvents)> {
    let events = Arc::new(Queue::default());
    let context = GroupContext {
        events: events.clone(),
        inputs: [topics.read_reports.clone(), topics.conversation_events.clone()],
    };
    let consumer: GroupConsumer = kafka
        .backlog_client_config()
        .set("group.id", &kafka.group_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // Input producers may be transactional too.
        .set("isolation.level", "read_committed")
        // Range puts partition p of both inputs on one member; see topology.md.
        .set("partition.assignment.strategy", "range")
        .set("statistics.interval.ms", "5000")
        .create_with_context(context)?;
    Ok((consumer, GroupEvents(events)))
}
