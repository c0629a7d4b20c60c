//! A producer of readfold's inputs, placed as readfold expects: keyed by
//! conversation id, partitioned by murmur2. Used by the demo and the tests;
//! a model for producers elsewhere.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::DeliveryFuture;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;

use readfold_core::partitioner::partition_for_key;
use readfold_wire::codec::{self, ConversationEventRecord, ReadReportRecord};
use readfold_wire::TRACEPARENT_HEADER;

use crate::config::{KafkaConfig, TopicsConfig};
use crate::context::LogContext;
use crate::error::{Error, Result};

/// Records handed to the producer whose acknowledgements are not yet in.
pub struct Deliveries(Vec<DeliveryFuture>);

impl Deliveries {
    /// Waits until the broker has acknowledged every one.
    pub async fn wait(self) -> Result<()> {
        for delivery in self.0 {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(Error::Kafka(e)),
                Err(_) => return Err(Error::DeliveryCanceled),
            }
        }
        Ok(())
    }
}

pub struct InputProducer {
    producer: FutureProducer<LogContext>,
    /// The read-reports topic's name.
    pub read_reports: String,
    conversation_events: String,
    partitions: i32,
}

impl InputProducer {
    pub fn new(kafka: &KafkaConfig, topics: &TopicsConfig, partitions: i32) -> Result<Self> {
        let producer = kafka
            .client_config()
            .set("enable.idempotence", "true")
            // Idempotence implies it; said here because the gateway acks
            // clients only once every in-sync replica has a receipt.
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("partitioner", "murmur2_random")
            .set("message.max.bytes", "2000000")
            .create_with_context(LogContext)?;
        Ok(InputProducer {
            producer,
            read_reports: topics.read_reports.clone(),
            conversation_events: topics.conversation_events.clone(),
            partitions,
        })
    }

    pub async fn report(&self, record: &ReadReportRecord) -> Result<()> {
        self.report_traced(record, None).await
    }

    /// [`InputProducer::report`], with a W3C `traceparent` header when
    /// given: the trace the processor's span joins.
    pub async fn report_traced(&self, record: &ReadReportRecord, traceparent: Option<&str>) -> Result<()> {
        let value = codec::encode_read_report(record);
        let mut out = self.keyed(&self.read_reports, &record.conversation_id, Some(&value), None);
        if let Some(traceparent) = traceparent {
            out = out.headers(OwnedHeaders::new().insert(Header {
                key: TRACEPARENT_HEADER,
                value: Some(traceparent),
            }));
        }
        self.deliver(out).await
    }

    pub async fn event(&self, record: &ConversationEventRecord) -> Result<()> {
        let value = codec::encode_conversation_event(record);
        let topic = self.conversation_events.clone();
        self.send(&topic, &record.conversation_id, Some(&value), None)
            .await
    }

    /// Sends many records at once (one in flight per record, order kept per
    /// partition by the idempotent producer) and waits for all of them.
    pub async fn send_many(
        &self,
        reports: &[ReadReportRecord],
        events: &[ConversationEventRecord],
    ) -> Result<()> {
        self.enqueue(reports, events).await?.wait().await
    }

    /// Hands records to the producer in order, waiting only while its queue
    /// is full; their acknowledgements are awaited with
    /// [`Deliveries::wait`], so that a caller keeping a rate need not stop.
    pub async fn enqueue(
        &self,
        reports: &[ReadReportRecord],
        events: &[ConversationEventRecord],
    ) -> Result<Deliveries> {
        let mut pending = Vec::with_capacity(reports.len() + events.len());
        let encoded = reports
            .iter()
            .map(|r| {
                (
                    &self.read_reports,
                    &r.conversation_id,
                    codec::encode_read_report(r),
                )
            })
            .chain(events.iter().map(|e| {
                (
                    &self.conversation_events,
                    &e.conversation_id,
                    codec::encode_conversation_event(e),
                )
            }));
        for (topic, conversation_id, value) in encoded {
            let mut record = self.keyed(topic, conversation_id, Some(&value), None);
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => break pending.push(delivery),
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(Error::Kafka(e)),
                }
            }
        }
        Ok(Deliveries(pending))
    }

    /// Sends arbitrary bytes keyed by `conversation_id` to its murmur2
    /// partition, or to `partition` when given.
    pub async fn send(
        &self,
        topic: &str,
        conversation_id: &str,
        value: Option<&[u8]>,
        partition: Option<i32>,
    ) -> Result<()> {
        self.deliver(self.keyed(topic, conversation_id, value, partition))
            .await
    }

    /// A record keyed by `conversation_id`, on its murmur2 partition or
    /// on `partition` when given.
    fn keyed<'a>(
        &self,
        topic: &'a str,
        conversation_id: &'a str,
        value: Option<&'a [u8]>,
        partition: Option<i32>,
    ) -> FutureRecord<'a, str, [u8]> {
        let partition =
            partition.unwrap_or_else(|| partition_for_key(conversation_id.as_bytes(), self.partitions));
        let record = FutureRecord::to(topic).key(conversation_id).partition(partition);
        match value {
            Some(value) => record.payload(value),
            None => record,
        }
    }

    /// Sends one record and waits for the broker's acknowledgement.
    async fn deliver(&self, record: FutureRecord<'_, str, [u8]>) -> Result<()> {
        self.producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .map(|_| ())
            .map_err(|(e, _)| Error::Kafka(e))
    }
}
