//! One partition's own queue, read a batch at a time (see
//! [`crate::queue_batch`]).

use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

pub use crate::queue_batch::QueuedMessage;
use crate::queue_batch::{forward_partition, QueueBatch};

/// A partition split off its consumer's shared queue (as
/// `BaseConsumer::split_partition_queue` does), read in batches.
pub struct BatchedPartitionQueue<C: ConsumerContext + 'static> {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    batch: QueueBatch,
    /// Keeps the client alive as long as the queue.
    _consumer: Arc<BaseConsumer<C>>,
}

// SAFETY: librdkafka's queues may be used from any thread, and this type is
// the only owner of its reference.
unsafe impl<C: ConsumerContext + 'static> Send for BatchedPartitionQueue<C> {}

impl<C: ConsumerContext + 'static> BatchedPartitionQueue<C> {
    /// Splits `topic`/`partition` off `consumer`'s shared queue; `None` if
    /// the consumer does not know the partition. Call right after assigning
    /// it: what was fetched before the split stays on the shared queue.
    pub fn split(consumer: &Arc<BaseConsumer<C>>, topic: &str, partition: i32) -> Option<Self> {
        // SAFETY: the client pointer is valid while `consumer` lives; the
        // queue returned is ours to destroy. A null destination stops
        // forwarding to the shared queue.
        let queue = unsafe {
            forward_partition(
                consumer.client().native_ptr(),
                topic,
                partition,
                std::ptr::null_mut(),
            )
        }?;
        Some(BatchedPartitionQueue {
            queue,
            batch: QueueBatch::new(),
            _consumer: consumer.clone(),
        })
    }

    /// The next message or error, waiting at most `wait` when none is
    /// queued. What it lends is valid until the next call.
    pub fn next(&mut self, wait: Duration) -> Option<Result<QueuedMessage<'_>, KafkaError>> {
        let wait_ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the queue is valid, and the consumer field keeps its
        // client alive as long as the batch.
        unsafe { self.batch.next(self.queue, wait_ms) }
    }
}

impl<C: ConsumerContext + 'static> Drop for BatchedPartitionQueue<C> {
    fn drop(&mut self) {
        self.batch.discard();
        // SAFETY: our reference to the queue, released once, before the
        // consumer (a field) can be dropped.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}
