//! One partition's own queue, read a batch at a time.
//!
//! rdkafka's `PartitionQueue::poll` hands over one message per call, and
//! each call pays for a clock read, a timeout computation, an event object
//! and the queue's lock. At replay speeds (hundreds of thousands of small
//! records a second) that was a tenth of all the CPU spent. librdkafka's
//! `rd_kafka_consume_batch_queue` takes up to a whole batch off the queue in
//! one call; [`BatchedPartitionQueue`] wraps it behind the same
//! one-message-at-a-time interface, so callers keep their per-record logic.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Messages taken off the queue per librdkafka call.
const BATCH: usize = 1024;

/// A message as a reader needs it, borrowed from librdkafka's buffer.
#[derive(Clone, Copy, Debug)]
pub struct QueuedMessage<'a> {
    pub offset: i64,
    /// The record timestamp (ms), if it has one.
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
}

/// A partition split off its consumer's shared queue (as
/// `BaseConsumer::split_partition_queue` does), read in batches.
pub struct BatchedPartitionQueue<C: ConsumerContext + 'static> {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    partition: i32,
    /// The last batch librdkafka took off the queue, in offset order:
    /// `slots[..taken]`, of which `slots[..next]` were handed over.
    slots: Vec<*mut rdsys::rd_kafka_message_t>,
    taken: usize,
    next: usize,
    /// Whether `slots[next - 1]`, handed over by the last `next`, is still
    /// to be destroyed: by the next call, so that what it lent stays valid
    /// until then.
    lent: bool,
    /// Keeps the client alive as long as the queue.
    _consumer: Arc<BaseConsumer<C>>,
}

// SAFETY: librdkafka's queues and messages may be used from any thread, and
// this type is their only owner.
unsafe impl<C: ConsumerContext + 'static> Send for BatchedPartitionQueue<C> {}

impl<C: ConsumerContext + 'static> BatchedPartitionQueue<C> {
    /// Splits `topic`/`partition` off `consumer`'s shared queue; `None` if
    /// the consumer does not know the partition. Call right after assigning
    /// it: what was fetched before the split stays on the shared queue.
    pub fn split(consumer: &Arc<BaseConsumer<C>>, topic: &str, partition: i32) -> Option<Self> {
        let topic = CString::new(topic).ok()?;
        // SAFETY: the client pointer is valid while `consumer` lives; the
        // queue returned is ours to destroy.
        let queue = unsafe {
            rdsys::rd_kafka_queue_get_partition(consumer.client().native_ptr(), topic.as_ptr(), partition)
        };
        let queue = NonNull::new(queue)?;
        // SAFETY: `queue` is valid; a null destination stops forwarding to
        // the shared queue.
        unsafe { rdsys::rd_kafka_queue_forward(queue.as_ptr(), std::ptr::null_mut()) };
        Some(BatchedPartitionQueue {
            queue,
            partition,
            slots: vec![std::ptr::null_mut(); BATCH],
            taken: 0,
            next: 0,
            lent: false,
            _consumer: consumer.clone(),
        })
    }

    /// The next message or error, waiting at most `wait` when none is
    /// queued. What it lends is valid until the next call.
    pub fn next(&mut self, wait: Duration) -> Option<Result<QueuedMessage<'_>, KafkaError>> {
        self.destroy_lent();
        if self.next == self.taken {
            self.fill(wait);
        }
        if self.next == self.taken {
            return None;
        }
        // librdkafka fills the slots it counts with messages, never null.
        let message = NonNull::new(self.slots[self.next]).expect("a message in a filled slot");
        self.next += 1;
        self.lent = true;
        // SAFETY: librdkafka owns the message until `rd_kafka_message_destroy`,
        // which happens only in the next call or on drop, both of which need
        // `&mut self` and so end this borrow first.
        let m = unsafe { message.as_ref() };
        if m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Some(Err(
                if m.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
                    KafkaError::PartitionEOF(self.partition)
                } else {
                    KafkaError::MessageConsumption(RDKafkaErrorCode::from(m.err))
                },
            ));
        }
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a valid message, and a valid place for the type.
        let timestamp = unsafe { rdsys::rd_kafka_message_timestamp(message.as_ptr(), &mut kind) };
        Some(Ok(QueuedMessage {
            offset: m.offset,
            timestamp: (kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
                .then_some(timestamp),
            // SAFETY: pointer and length describe librdkafka's buffer of
            // the message, valid as long as it is.
            key: unsafe { bytes(m.key, m.key_len) },
            payload: unsafe { bytes(m.payload, m.len) },
        }))
    }

    fn fill(&mut self, wait: Duration) {
        let timeout = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `slots` has room for `BATCH` pointers; librdkafka writes
        // at most that many and returns how many (or -1 on error).
        let taken = unsafe {
            rdsys::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                timeout,
                self.slots.as_mut_ptr(),
                self.slots.len(),
            )
        };
        self.taken = taken.max(0) as usize;
        self.next = 0;
    }

    fn destroy_lent(&mut self) {
        if std::mem::take(&mut self.lent) {
            // SAFETY: taken off the queue by us and destroyed once.
            unsafe { rdsys::rd_kafka_message_destroy(self.slots[self.next - 1]) };
        }
    }
}

impl<C: ConsumerContext + 'static> Drop for BatchedPartitionQueue<C> {
    fn drop(&mut self) {
        self.destroy_lent();
        for &message in &self.slots[self.next..self.taken] {
            // SAFETY: as in `destroy_lent`.
            unsafe { rdsys::rd_kafka_message_destroy(message) };
        }
        // SAFETY: our reference to the queue, released once, before the
        // consumer (a field) can be dropped.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}

/// # Safety
/// `ptr` must be null or point to `len` bytes valid for `'a`.
unsafe fn bytes<'a>(ptr: *mut std::ffi::c_void, len: usize) -> Option<&'a [u8]> {
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}
