//! Taking records: off the routed queue a batch at a time, or off the
//! consumer's own queue, folded in place into their partition's state, or
//! deferred (copied) until a rebalance is applied, a partition restored or
//! a schema id learned.

use std::future::Future;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::BorrowedMessage;
use readfold_core::fold::{Input, InputKind};
use readfold_core::CursorKey;
use readfold_kafka::routed_queue::RoutedReader;
use readfold_wire::dead_letter::{dead_letter, Source};
use readfold_wire::validate::{ingest, Placement, RejectReason, Rejection};

use crate::group::GroupConsumer;
use crate::partitions::Partitions;
use crate::record::{OwnedRecord, Record};
use crate::schemas::SchemaCheck;
use crate::{telemetry, Error, Processor, Result};

/// Records folded per turn of the run loop at most, so that flushes,
/// ticks and shutdown are still looked at often under load.
const FOLD_BATCH: usize = 512;

/// Offsets the broker may be ahead, over all owned partitions, with the
/// fold still counted as caught up: less than one turn of the fold.
pub(crate) const CAUGHT_UP_LAG: i64 = FOLD_BATCH as i64;

/// What [`Processor::fold_record`] did with a record.
enum Folded {
    Done,
    /// Its partition is not ours (any more): dropped; see
    /// [`partitions::Partitions::owns`].
    NotOwned,
    /// Its partition has no state yet: restore it, then fold again.
    Unrestored,
    /// Framed with a schema id not yet checked: ask the registry, then
    /// fold again.
    UnknownSchema(InputKind, u32),
}

/// The key a read-reports input moves, which its trace follows.
fn traced_key(input: &Input) -> Option<CursorKey> {
    let (conversation_id, user_id) = match input {
        Input::Report(r) => (&r.conversation_id, &r.user_id),
        Input::Delivery(d) => (&d.conversation_id, &d.user_id),
        Input::Mark(m) => (&m.conversation_id, &m.user_id),
        Input::Mute(m) => (&m.conversation_id, &m.user_id),
        Input::ThreadRead(_) | Input::Event(_) => return None,
    };
    Some(CursorKey {
        conversation_id: conversation_id.clone(),
        user_id: user_id.clone(),
    })
}

/// Polls `future` once, with a waker that does nothing: its output if it
/// is ready now.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

/// Offsets the fold has still to take before it reaches its input
/// partitions' stable ends, as the consumer's last statistics gave them
/// (before the first, their last fetch responses' high watermarks).
pub(crate) fn input_lag(partitions: &Partitions, consumer: &GroupConsumer, routed: &RoutedReader) -> i64 {
    routed.fetch_lag(&consumer.context().stable_ends(partitions.owned_by_input()))
}

impl Processor {
    /// Folds the records waiting on the routed queue, up to [`FOLD_BATCH`],
    /// without waiting for more: one turn of the run loop per batch rather
    /// than per record. Group events are applied before every turn, and
    /// none arrive during one (they come with polls of the consumer's own
    /// queue), so no rebalance waits for these records.
    pub(crate) async fn fold_routed(&mut self, routed: &mut RoutedReader) -> Result<()> {
        for taken in 0..FOLD_BATCH {
            let deferred = match routed.next_message() {
                None => {
                    self.schedule.took(taken as u64);
                    self.queue_drained(routed);
                    return Ok(());
                }
                Some(Err(e)) => {
                    self.consumer_error(e)?;
                    continue;
                }
                Some(Ok(message)) => {
                    let record = Record::from(message);
                    match self.fold_record(&record) {
                        Folded::Done | Folded::NotOwned => None,
                        Folded::Unrestored | Folded::UnknownSchema(..) => Some(record.to_owned()),
                    }
                }
            };
            if let Some(record) = deferred {
                self.process(record).await?;
            }
        }
        self.schedule.took(FOLD_BATCH as u64);
        // A batch that ended the queue: whether that is the input's end
        // too is asked now, not at the next record, which may be long.
        if !routed.has_more() {
            self.queue_drained(routed);
        }
        Ok(())
    }

    /// Folds the records left on the consumer's own queue (fetched before
    /// their partition was routed, or not routed), up to [`FOLD_BATCH`],
    /// without waiting for more.
    pub(crate) async fn fold_unrouted(
        &mut self,
        consumer: &GroupConsumer,
        routed: &mut RoutedReader,
    ) -> Result<()> {
        for _ in 1..FOLD_BATCH {
            let deferred = match poll_once(consumer.recv()) {
                None => {
                    if !routed.has_more() {
                        self.queue_drained(routed);
                    }
                    return Ok(());
                }
                Some(Err(e)) => return self.consumer_error(e),
                Some(Ok(message)) => {
                    self.schedule.took(1);
                    self.fold_or_defer(message)
                }
            };
            if let Some(record) = deferred {
                self.apply_group_events(routed);
                self.restore_assigned().await?;
                self.process(record).await?;
            }
        }
        Ok(())
    }

    /// The fold found no record waiting. It has caught up with its input
    /// only if the broker held no more either: during a catch-up the fold
    /// often empties librdkafka's queue before the next fetch response
    /// lands. So the schedule compares its position with the inputs' last
    /// stable offsets from the consumer's statistics (every 100 ms), or
    /// until the first statistics, the high watermarks of the last fetch
    /// responses.
    fn queue_drained(&mut self, routed: &RoutedReader) {
        let (partitions, consumer) = (&self.partitions, &self.consumer);
        self.schedule.drained(|| input_lag(partitions, consumer, routed));
    }

    /// Folds a fetched record at once, in place, unless a rebalance waits
    /// to be applied or its partition has no state yet: then it returns a
    /// copy for [`Processor::process`], after the rebalance. A record of a
    /// partition no longer assigned is dropped.
    pub(crate) fn fold_or_defer(&mut self, message: BorrowedMessage<'_>) -> Option<OwnedRecord> {
        telemetry::unrouted();
        let record = Record::of(&message);
        if self.events.pending() {
            return Some(record.to_owned());
        }
        match self.fold_record(&record) {
            Folded::Done | Folded::NotOwned => None,
            Folded::Unrestored | Folded::UnknownSchema(..) => Some(record.to_owned()),
        }
    }

    /// Folds a record, first restoring its partition's state or asking the
    /// registry about its schema id if needed; drops it if its partition is
    /// no longer assigned.
    pub(crate) async fn process(&mut self, owned: OwnedRecord) -> Result<()> {
        loop {
            // Bound first: the borrowed record must not live across the
            // awaits below (its headers are librdkafka's, not `Send`).
            let folded = self.fold_record(&owned.as_record());
            match folded {
                Folded::Done | Folded::NotOwned => return Ok(()),
                Folded::Unrestored => {
                    if let Some(restoring) = &mut self.restoring {
                        // Folded once that restore is in (and, if it is
                        // not one of its partitions, restored then).
                        restoring.stash.push(owned);
                        return Ok(());
                    }
                    for (partition, slot) in self.restore(&[owned.partition()]).await? {
                        self.partitions.slots.insert(partition, slot);
                    }
                    self.report_partitions();
                }
                Folded::UnknownSchema(kind, id) => {
                    let schemas = self.input_schemas.as_mut().expect("only checked with a registry");
                    schemas.learn(kind, id).await?;
                }
            }
        }
    }

    pub(crate) fn consumer_error(&self, e: KafkaError) -> Result<()> {
        tracing::warn!(error = %e, "consumer error");
        if matches!(e, KafkaError::MessageConsumptionFatal(_)) {
            return Err(Error::Consumer(e));
        }
        Ok(())
    }

    /// Folds one input record into its partition's state (or its dead
    /// letters).
    fn fold_record(&mut self, message: &Record<'_>) -> Folded {
        let topic = message.topic;
        let kind = if topic == self.settings.topics.read_reports {
            InputKind::ReadReports
        } else if topic == self.settings.topics.conversation_events {
            InputKind::ConversationEvents
        } else {
            tracing::warn!(topic, "message from an unexpected topic");
            return Folded::Done;
        };
        let partition = message.partition;
        if !self.partitions.owns(partition) {
            tracing::debug!(
                topic,
                partition,
                offset = message.offset,
                "dropping a record of a partition no longer assigned"
            );
            return Folded::NotOwned;
        }
        let Some(slot) = self.partitions.slots.get_mut(&partition) else {
            return Folded::Unrestored;
        };
        let schema = match &self.input_schemas {
            None => SchemaCheck::Accepted,
            Some(schemas) => schemas.check(kind, message.payload, self.settings.input.format),
        };
        if let SchemaCheck::Unknown(id) = schema {
            return Folded::UnknownSchema(kind, id);
        }
        self.records_in.record(kind);
        let placement = Placement {
            key: message.key,
            partition,
            partition_count: self.layout.partitions,
        };
        let ingested = match schema {
            SchemaCheck::Refused(detail) => Err(Rejection {
                reason: RejectReason::UnknownSchema,
                detail,
            }),
            _ => ingest(kind, message.payload, placement, &self.settings.input),
        };
        match ingested {
            Ok(input) => {
                slot.state.apply(&input);
                if self.tracer.is_on() {
                    if let Some(key) = traced_key(&input) {
                        self.traces
                            .took(message.traceparent(), partition, message.offset, &key);
                    }
                }
            }
            Err(rejection) => {
                telemetry::dead_lettered(rejection.reason);
                tracing::debug!(topic, partition, offset = message.offset, reason = %rejection.reason, detail = %rejection.detail, "dead-lettering");
                let source = Source {
                    topic: topic.to_owned(),
                    partition,
                    offset: message.offset,
                };
                slot.dead_letters.push(dead_letter(
                    message.key,
                    message.payload,
                    &rejection,
                    &source,
                    &self.out,
                ));
            }
        }
        slot.processed(kind, message.offset);
        Folded::Done
    }
}
