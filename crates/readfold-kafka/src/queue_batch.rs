//! Reading a librdkafka queue a batch at a time.
//!
//! rdkafka's `poll` hands over one message per call, and each call pays for
//! a clock read, a timeout computation, an event object and the queue's
//! lock, which weighs at hundreds of thousands of small records a second.
//! librdkafka's `rd_kafka_consume_batch_queue` takes up to a whole batch off
//! a queue in one call; [`QueueBatch`] keeps that batch and hands it over
//! one message at a time, so callers keep their per-record logic.
//!
//! That call serves a queue as the legacy consumer API does: it must only
//! ever see fetched messages and errors, never a group's rebalance events
//! (without a rebalance callback, librdkafka would answer those itself).
//! So it reads queues of our own: one partition split off
//! ([`crate::partition_queue`]), or every assigned partition routed to one
//! queue ([`crate::routed_queue`]).

use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::ptr::NonNull;

use rdkafka::bindings as rdsys;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// Messages taken off the queue per librdkafka call.
const BATCH: usize = 1024;

/// A message as a reader needs it, borrowed from librdkafka's buffer.
#[derive(Clone, Copy, Debug)]
pub struct QueuedMessage<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The record timestamp (ms), if it has one.
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    pub headers: LazyHeaders<'a>,
}

impl<'a> QueuedMessage<'a> {
    /// A message polled one at a time (from a consumer's own queue), as a
    /// batch lends them.
    pub fn of(message: &'a rdkafka::message::BorrowedMessage<'_>) -> Self {
        use rdkafka::message::Message;
        QueuedMessage {
            topic: message.topic(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            key: message.key(),
            payload: message.payload(),
            headers: LazyHeaders::of(NonNull::new(message.ptr())),
        }
    }
}

/// A message's headers, parsed by librdkafka only when first asked for:
/// most readers never look.
#[derive(Clone, Copy, Debug)]
pub struct LazyHeaders<'a> {
    message: Option<NonNull<rdsys::rd_kafka_message_t>>,
    lent: PhantomData<&'a ()>,
}

impl<'a> LazyHeaders<'a> {
    fn of(message: Option<NonNull<rdsys::rd_kafka_message_t>>) -> Self {
        LazyHeaders {
            message,
            lent: PhantomData,
        }
    }

    /// The value of the last header named `name`, if any (and not null).
    pub fn last(&self, name: &CStr) -> Option<&'a [u8]> {
        let message = self.message?;
        let mut headers = std::ptr::null_mut();
        // SAFETY: a message valid for 'a (lent with this value); librdkafka
        // parses and keeps its headers inside it on the first call.
        let found = unsafe { rdsys::rd_kafka_message_headers(message.as_ptr(), &mut headers) };
        if found != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        let (mut value, mut size) = (std::ptr::null(), 0);
        // SAFETY: headers owned by the message; the value points into them.
        let found = unsafe { rdsys::rd_kafka_header_get_last(headers, name.as_ptr(), &mut value, &mut size) };
        if found != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        // SAFETY: `size` bytes of the message's headers, valid as long.
        unsafe { bytes(value.cast_mut(), size) }
    }
}

/// The last batch librdkafka took off a queue, handed over in order.
pub(crate) struct QueueBatch {
    /// `slots[..taken]` hold the batch, of which `slots[..next]` were
    /// handed over.
    slots: Vec<*mut rdsys::rd_kafka_message_t>,
    taken: usize,
    next: usize,
    /// Whether `slots[next - 1]`, handed over by the last `next`, is still
    /// to be destroyed: by the next call, so that what it lent stays valid
    /// until then.
    lent: bool,
    /// The topic names seen, each checked as UTF-8 once rather than for
    /// every message (a message names its topic as a C string).
    topics: Vec<Box<str>>,
}

// SAFETY: librdkafka's messages may be used and destroyed from any thread,
// and the batch is their only owner.
unsafe impl Send for QueueBatch {}
// SAFETY: through `&self` it only counts; touching a message needs `&mut`.
unsafe impl Sync for QueueBatch {}

impl QueueBatch {
    pub(crate) fn new() -> Self {
        QueueBatch {
            slots: vec![std::ptr::null_mut(); BATCH],
            taken: 0,
            next: 0,
            lent: false,
            topics: Vec::new(),
        }
    }

    /// Whether messages of the last batch are still to be handed over.
    pub(crate) fn has_more(&self) -> bool {
        self.next < self.taken
    }

    /// The next message or error, taking a new batch off `queue` (waiting
    /// at most `wait_ms` for one) when this one is done. What it lends is
    /// valid until the next call.
    ///
    /// # Safety
    /// `queue` must be a valid queue of a client that outlives the batch.
    pub(crate) unsafe fn next(
        &mut self,
        queue: NonNull<rdsys::rd_kafka_queue_t>,
        wait_ms: i32,
    ) -> Option<Result<QueuedMessage<'_>, KafkaError>> {
        self.destroy_lent();
        if self.next == self.taken {
            // SAFETY: `slots` has room for `BATCH` pointers; librdkafka
            // writes at most that many and returns how many (or -1).
            let taken = unsafe {
                rdsys::rd_kafka_consume_batch_queue(
                    queue.as_ptr(),
                    wait_ms,
                    self.slots.as_mut_ptr(),
                    self.slots.len(),
                )
            };
            self.taken = taken.max(0) as usize;
            self.next = 0;
        }
        if self.next == self.taken {
            return None;
        }
        // librdkafka fills the slots it counts with messages, never null.
        let message = NonNull::new(self.slots[self.next]).expect("a message in a filled slot");
        self.next += 1;
        self.lent = true;
        // SAFETY: librdkafka owns the message until `rd_kafka_message_destroy`,
        // which happens only in the next call or on `discard`, both of which
        // need `&mut self` and so end this borrow first.
        let m = unsafe { message.as_ref() };
        let topic = if m.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && !m.rkt.is_null() {
            // SAFETY: the message holds its topic, whose name lives as long.
            let name = unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(m.rkt)) }.to_bytes();
            self.topic_index(name)
        } else {
            None
        };
        let topic = topic.map_or("", |i| &*self.topics[i]);
        // SAFETY: as above.
        Some(unsafe { decode(message, topic) })
    }

    /// Where `name` is in `topics`, added if new; `None` if not UTF-8.
    fn topic_index(&mut self, name: &[u8]) -> Option<usize> {
        if let Some(i) = self.topics.iter().position(|t| t.as_bytes() == name) {
            return Some(i);
        }
        let name = std::str::from_utf8(name).ok()?;
        self.topics.push(name.into());
        Some(self.topics.len() - 1)
    }

    /// Destroys every message not yet handed over, and the one lent last.
    pub(crate) fn discard(&mut self) {
        self.destroy_lent();
        for &message in &self.slots[self.next..self.taken] {
            // SAFETY: taken off the queue by us and destroyed once.
            unsafe { rdsys::rd_kafka_message_destroy(message) };
        }
        self.next = 0;
        self.taken = 0;
    }

    /// Destroys the messages not yet handed over (and the one lent last)
    /// of the partitions `gone` says, keeping the others in order.
    pub(crate) fn discard_where(&mut self, gone: impl Fn(&str, i32) -> bool) {
        self.destroy_lent();
        let mut kept = self.next;
        for i in self.next..self.taken {
            let message = self.slots[i];
            // SAFETY: taken off the queue by us, not yet destroyed; its
            // topic lives as long as the message.
            let m = unsafe { &*message };
            let topic = (!m.rkt.is_null())
                .then(|| {
                    unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(m.rkt)) }
                        .to_str()
                        .ok()
                })
                .flatten();
            if topic.is_some_and(|t| gone(t, m.partition)) {
                // SAFETY: as above, destroyed once.
                unsafe { rdsys::rd_kafka_message_destroy(message) };
            } else {
                self.slots[kept] = message;
                kept += 1;
            }
        }
        self.taken = kept;
    }

    fn destroy_lent(&mut self) {
        if std::mem::take(&mut self.lent) {
            // SAFETY: taken off the queue by us and destroyed once.
            unsafe { rdsys::rd_kafka_message_destroy(self.slots[self.next - 1]) };
        }
    }
}

impl Drop for QueueBatch {
    fn drop(&mut self) {
        self.discard();
    }
}

/// A handle of `client`'s fetch queue of `topic`/`partition`, now forwarded
/// to `to` (null: to no other queue, so that it is read on its own). `None`
/// if `topic` has a NUL or the client has no such partition. The handle is
/// the caller's to release with `rd_kafka_queue_destroy`.
///
/// # Safety
/// `client` must be a valid consumer and `to` null or a valid queue of it.
pub(crate) unsafe fn forward_partition(
    client: *mut rdsys::rd_kafka_t,
    topic: &str,
    partition: i32,
    to: *mut rdsys::rd_kafka_queue_t,
) -> Option<NonNull<rdsys::rd_kafka_queue_t>> {
    let topic = CString::new(topic).ok()?;
    // SAFETY: a valid client; the handle returned is the caller's.
    let fetched =
        NonNull::new(unsafe { rdsys::rd_kafka_queue_get_partition(client, topic.as_ptr(), partition) })?;
    // SAFETY: both queues are valid (or `to` null).
    unsafe { rdsys::rd_kafka_queue_forward(fetched.as_ptr(), to) };
    Some(fetched)
}

/// # Safety
/// `message` must be a valid message, living as long as `'a`.
unsafe fn decode<'a>(
    message: NonNull<rdsys::rd_kafka_message_t>,
    topic: &'a str,
) -> Result<QueuedMessage<'a>, KafkaError> {
    let m = unsafe { message.as_ref() };
    if m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(
            if m.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF {
                KafkaError::PartitionEOF(m.partition)
            } else {
                KafkaError::MessageConsumption(RDKafkaErrorCode::from(m.err))
            },
        );
    }
    let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: a valid message, and a valid place for the type.
    let timestamp = unsafe { rdsys::rd_kafka_message_timestamp(message.as_ptr(), &mut kind) };
    Ok(QueuedMessage {
        topic,
        partition: m.partition,
        offset: m.offset,
        timestamp: (kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE)
            .then_some(timestamp),
        // SAFETY: pointer and length describe librdkafka's buffer of the
        // message, valid as long as it is.
        key: unsafe { bytes(m.key, m.key_len) },
        payload: unsafe { bytes(m.payload, m.len) },
        headers: LazyHeaders::of(Some(message)),
    })
}

/// # Safety
/// `ptr` must be null or point to `len` bytes valid for `'a`.
unsafe fn bytes<'a>(ptr: *mut std::ffi::c_void, len: usize) -> Option<&'a [u8]> {
    (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}
