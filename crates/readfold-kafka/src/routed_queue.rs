//! A group member's fetched messages, routed to one queue of our own and
//! read a batch at a time (see [`crate::queue_batch`]).
//!
//! The consumer's own queue carries the group's rebalance events, which
//! rdkafka serves one event at a time, so it cannot be read in batches.
//! Each assigned partition's fetch queue is forwarded to a [`RoutedQueue`]
//! instead, from the rebalance callback, before the assignment starts
//! fetching; the consumer's queue is left with the events and the errors
//! that are not about one partition. librdkafka calls back when the routed
//! queue turns non-empty, which wakes [`RoutedReader::ready`].

use std::any::Any;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::TopicPartitionList;
use tokio::sync::Notify;

use crate::queue_batch::{forward_partition, QueueBatch, QueuedMessage};

/// The queue the assigned partitions' fetched messages are routed to.
pub struct RoutedQueue {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    client: NonNull<rdsys::rd_kafka_t>,
    /// Woken by librdkafka when the queue turns non-empty; its address is
    /// the callback's opaque pointer, so it lives as long as the queue.
    ready: Arc<Notify>,
}

// SAFETY: librdkafka's clients and queues may be used from any thread; the
// queue is destroyed once, by the last owner.
unsafe impl Send for RoutedQueue {}
unsafe impl Sync for RoutedQueue {}

/// librdkafka's "queue turned non-empty" callback. It runs on librdkafka's
/// threads, under the queue's lock: only a wake-up.
unsafe extern "C" fn wake(_: *mut rdsys::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the `Notify` of a live `RoutedQueue` (see `Drop`).
    unsafe { &*(opaque as *const Notify) }.notify_one();
}

impl RoutedQueue {
    /// Routes partition `partition` of `topic` to this queue. Call before
    /// the partition is assigned: messages fetched before stay where they
    /// went. librdkafka clears the route when the partition stops (revoke),
    /// so route it at every assignment. False if the client does not know
    /// the topic name.
    pub fn route(&self, topic: &str, partition: i32) -> bool {
        // SAFETY: the client outlives this queue (see `RoutedReader`); the
        // partition's queue handle is ours to release.
        unsafe {
            let Some(fetched) =
                forward_partition(self.client.as_ptr(), topic, partition, self.queue.as_ptr())
            else {
                return false;
            };
            rdsys::rd_kafka_queue_destroy(fetched.as_ptr());
        }
        true
    }

    fn is_empty(&self) -> bool {
        // SAFETY: a valid queue.
        unsafe { rdsys::rd_kafka_queue_length(self.queue.as_ptr()) == 0 }
    }
}

impl Drop for RoutedQueue {
    fn drop(&mut self) {
        // SAFETY: turning the callback off takes the queue's lock, under
        // which librdkafka calls it, so none runs once this returns and the
        // `Notify` may go. The queue is ours, destroyed once; the client is
        // still alive (see `RoutedReader`).
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
    }
}

/// Where a consumer context's rebalance callback finds the queue to route
/// an assignment to, while its reader lives.
#[derive(Default)]
pub struct RouteSlot(Mutex<Weak<RoutedQueue>>);

impl RouteSlot {
    /// Routes what `reader` reads from the next assignment on.
    pub fn set(&self, reader: &RoutedReader) {
        *self.0.lock().expect("route slot lock") = reader.queue();
    }

    /// Routes the partitions about to be assigned; call from the rebalance
    /// callback, before they are assigned. One that cannot be routed is
    /// still read, one message at a time, from the consumer's own queue.
    pub fn route(&self, tpl: &TopicPartitionList) {
        let Some(queue) = self.0.lock().expect("route slot lock").upgrade() else {
            return;
        };
        for e in tpl.elements() {
            if !queue.route(e.topic(), e.partition()) {
                tracing::warn!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "could not route a partition to the batched queue; reading it from the consumer's"
                );
            }
        }
    }
}

/// Reads a [`RoutedQueue`] a batch at a time. It owns the queue: the
/// rebalance callback routes partitions through a [`std::sync::Weak`]
/// (`RoutedReader::queue`), which stops working once the reader is gone.
pub struct RoutedReader {
    // Dropped in this order: the batch's messages, then the queue, then
    // the client they belong to.
    batch: QueueBatch,
    queue: Arc<RoutedQueue>,
    _client: Arc<dyn Any + Send + Sync>,
}

impl RoutedReader {
    /// A new queue of `client` (a consumer's native handle), which
    /// `keep_alive` keeps alive as long as the reader.
    ///
    /// # Safety
    /// `client` must be the native handle of the consumer `keep_alive`
    /// owns.
    pub unsafe fn new(client: NonNull<rdsys::rd_kafka_t>, keep_alive: Arc<dyn Any + Send + Sync>) -> Self {
        let ready = Arc::new(Notify::new());
        // SAFETY: a valid client; the queue is ours to destroy, and the
        // callback's `Notify` lives as long as it.
        let queue = unsafe {
            let queue = NonNull::new(rdsys::rd_kafka_queue_new(client.as_ptr()))
                .expect("librdkafka allocates a queue");
            rdsys::rd_kafka_queue_cb_event_enable(
                queue.as_ptr(),
                Some(wake),
                Arc::as_ptr(&ready) as *mut c_void,
            );
            queue
        };
        RoutedReader {
            batch: QueueBatch::new(),
            queue: Arc::new(RoutedQueue { queue, client, ready }),
            _client: keep_alive,
        }
    }

    /// A reader of a new queue of `consumer`, which it keeps alive. Have
    /// the consumer's rebalance callback route to it ([`RouteSlot`]).
    pub fn of<C, X>(consumer: &Arc<C>) -> Self
    where
        C: Consumer<X> + Send + Sync + 'static,
        X: ConsumerContext,
    {
        let client = NonNull::new(consumer.client().native_ptr()).expect("a consumer has a native client");
        // SAFETY: `client` is the handle of the consumer kept alive.
        unsafe { RoutedReader::new(client, consumer.clone()) }
    }

    /// The queue, for the rebalance callback to route partitions to.
    pub fn queue(&self) -> std::sync::Weak<RoutedQueue> {
        Arc::downgrade(&self.queue)
    }

    /// The next message or error without waiting, taking a new batch off
    /// the queue when the last is done; `None` when the queue is empty.
    /// What it lends is valid until the next call.
    pub fn next_message(&mut self) -> Option<Result<QueuedMessage<'_>, KafkaError>> {
        // SAFETY: a valid queue, whose client `_client` keeps alive.
        unsafe { self.batch.next(self.queue.queue, 0) }
    }

    /// Whether a message waits, in the batch taken or on the queue.
    pub fn has_more(&self) -> bool {
        self.batch.has_more() || !self.queue.is_empty()
    }

    /// Drops the rest of the batch taken off the queue. After a rebalance
    /// its messages are stale: librdkafka would have dropped them had they
    /// still been queued, and fetches again from the committed offsets.
    pub fn discard(&mut self) {
        self.batch.discard();
    }

    /// Destroys the taken messages not yet handed over of the `released`
    /// partitions (topic, partition): the group took them away, and
    /// whoever holds them next reads them again from the committed offsets.
    pub fn discard_released(&mut self, released: &[(String, i32)]) {
        self.batch
            .discard_where(|topic, partition| released.iter().any(|(t, p)| t == topic && *p == partition));
    }

    /// How many offsets this consumer has still to take before it reaches
    /// the ends of `partitions` (topic, partition, end offset if known),
    /// summed: each end less the consumer's position in that partition
    /// (one past the last message taken off its queues, commit markers
    /// included), which librdkafka keeps current. An unknown end is the
    /// high watermark of the partition's last fetch response, as librdkafka
    /// caches it. No broker call. A partition with no position or end yet
    /// counts as 0.
    pub fn fetch_lag(&self, partitions: &[(&CStr, i32, Option<i64>)]) -> i64 {
        if partitions.is_empty() {
            return 0;
        }
        let client = self.queue.client.as_ptr();
        let ok = rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
        let mut lag = 0;
        // SAFETY: a valid client, whose handle `_client` keeps alive; the
        // list is ours, destroyed once; its elements are read within its
        // count, in the order they were added.
        unsafe {
            let list = rdsys::rd_kafka_topic_partition_list_new(partitions.len() as i32);
            for (topic, partition, _) in partitions {
                rdsys::rd_kafka_topic_partition_list_add(list, topic.as_ptr(), *partition);
            }
            rdsys::rd_kafka_position(client, list);
            let positions = std::slice::from_raw_parts((*list).elems, (*list).cnt.max(0) as usize);
            for (elem, &(topic, partition, end)) in positions.iter().zip(partitions) {
                if elem.err != ok || elem.offset < 0 {
                    continue;
                }
                let end = end.unwrap_or_else(|| {
                    let (mut low, mut high) = (-1, -1);
                    if rdsys::rd_kafka_get_watermark_offsets(
                        client,
                        topic.as_ptr(),
                        partition,
                        &mut low,
                        &mut high,
                    ) != ok
                    {
                        high = -1;
                    }
                    high
                });
                if end >= 0 {
                    lag += (end - elem.offset).max(0);
                }
            }
            rdsys::rd_kafka_topic_partition_list_destroy(list);
        }
        lag
    }

    /// Completes once a message waits (at once if one does).
    pub async fn ready(&self) {
        loop {
            // Asked for before the check: a message queued after the check
            // leaves a permit, so the wait below cannot miss it.
            let notified = self.queue.ready.notified();
            if self.has_more() {
                return;
            }
            notified.await;
        }
    }
}
