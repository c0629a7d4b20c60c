//! Many records to one topic in one librdkafka call.
//!
//! rdkafka's `send` hands librdkafka one record per call, and each call
//! allocates the topic name as a C string, looks the topic up by name, and
//! reads the clock twice (the record's time, the partitioner's), for each
//! of the hundreds of thousands of changelog records a flush can produce.
//! `rd_kafka_produce_batch` takes a whole array of records for a topic held
//! open, each with its own partition, under one lock and one clock read; it
//! adds their partitions to an open transaction as `send` does.

use std::collections::HashMap;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::error::KafkaError;
use rdkafka::producer::{Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

/// One record of a batch: its partition, key and value (`None`: a
/// tombstone). librdkafka copies both before the call returns.
#[derive(Clone, Copy, Debug)]
pub struct BatchRecord<'a> {
    pub partition: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// A producer's topics held open, for [`BatchProducer::send_batch`].
pub struct BatchProducer<C: ProducerContext + 'static> {
    /// Dropped before `producer` (fields drop in order): a topic handle
    /// must not outlive its client.
    topics: Mutex<HashMap<String, TopicHandle>>,
    producer: Arc<ThreadedProducer<C>>,
}

struct TopicHandle(NonNull<rdsys::rd_kafka_topic_t>);

// SAFETY: librdkafka's topic handles may be used from any thread.
unsafe impl Send for TopicHandle {}

impl Drop for TopicHandle {
    fn drop(&mut self) {
        // SAFETY: our reference, released once, while the client lives
        // (see `BatchProducer::topics`).
        unsafe { rdsys::rd_kafka_topic_destroy(self.0.as_ptr()) };
    }
}

/// How long a blocking sender waits before trying again while the
/// producer's queue is full (for one record too).
pub const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);

impl<C: ProducerContext + 'static> BatchProducer<C> {
    pub fn new(producer: Arc<ThreadedProducer<C>>) -> Self {
        BatchProducer {
            topics: Mutex::new(HashMap::new()),
            producer,
        }
    }

    pub fn producer(&self) -> &ThreadedProducer<C> {
        &self.producer
    }

    /// Queues `records` for `topic`, in order; waits (block the calling
    /// thread) while the producer's queue is full. Delivery is reported as
    /// for `send`: the producer's in-flight count covers these records.
    pub fn send_batch(&self, topic: &str, records: &[BatchRecord<'_>]) -> Result<(), KafkaError> {
        if records.is_empty() {
            return Ok(());
        }
        let topic = self.topic(topic)?;
        let mut messages: Vec<rdsys::rd_kafka_message_t> = records
            .iter()
            .map(|r| {
                let (payload, len) = raw(r.value);
                let (key, key_len) = raw(r.key);
                rdsys::rd_kafka_message_t {
                    err: rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
                    rkt: std::ptr::null_mut(),
                    partition: r.partition,
                    payload,
                    len,
                    key,
                    key_len,
                    offset: 0,
                    _private: std::ptr::null_mut(),
                }
            })
            .collect();
        let mut from = 0;
        while from < messages.len() {
            let pending = &mut messages[from..];
            let count = i32::try_from(pending.len()).unwrap_or(i32::MAX);
            // SAFETY: a valid topic handle, and `count` messages whose key
            // and payload point to bytes alive for the call (COPY: librdkafka
            // copies them before returning).
            unsafe {
                rdsys::rd_kafka_produce_batch(
                    topic.as_ptr(),
                    -1, // RD_KAFKA_PARTITION_UA: each message names its own
                    rdsys::RD_KAFKA_MSG_F_COPY | rdsys::RD_KAFKA_MSG_F_PARTITION,
                    pending.as_mut_ptr(),
                    count,
                )
            };
            let pending = &pending[..count as usize];
            // A full queue fails the rest of the batch; any other error is
            // the caller's (the transaction aborts).
            if let Some(m) = pending.iter().find(|m| {
                m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    && m.err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL
            }) {
                return Err(KafkaError::MessageProduction(RDKafkaErrorCode::from(m.err)));
            }
            match pending
                .iter()
                .position(|m| m.err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL)
            {
                Some(full) => {
                    from += full;
                    for m in &mut messages[from..] {
                        m.err = rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
                    }
                    // Let the broker thread send some and free room.
                    std::thread::sleep(QUEUE_FULL_WAIT);
                }
                None => from += pending.len(),
            }
        }
        Ok(())
    }

    /// Sends everything queued at once, ignoring `linger.ms`, and waits, at
    /// most `timeout`, until it is all delivered (or failed): [`flush_now`].
    pub fn flush_now(&self, timeout: Duration) -> Result<(), KafkaError> {
        flush_now(&self.producer, timeout)
    }

    /// The open handle of `topic`, opened on first use.
    fn topic(&self, topic: &str) -> Result<NonNull<rdsys::rd_kafka_topic_t>, KafkaError> {
        let mut topics = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = topics.get(topic) {
            return Ok(handle.0);
        }
        let name =
            CString::new(topic).map_err(|_| KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic))?;
        // SAFETY: a valid client; a null configuration takes the client's
        // default topic configuration, as `send` does.
        let handle = unsafe {
            rdsys::rd_kafka_topic_new(
                self.producer.client().native_ptr(),
                name.as_ptr(),
                std::ptr::null_mut(),
            )
        };
        let handle =
            NonNull::new(handle).ok_or(KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTopic))?;
        let handle = TopicHandle(handle);
        // Records for partitions the client has no metadata for yet wait
        // in the topic's unassigned queue, and librdkafka does not add the
        // partitions they later go to to the open transaction: they would
        // time out. So learn the topic's partitions first.
        self.producer
            .client()
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
        let ptr = handle.0;
        topics.insert(topic.to_owned(), handle);
        Ok(ptr)
    }
}

/// How long opening a topic waits for its metadata.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

fn raw(bytes: Option<&[u8]>) -> (*mut std::ffi::c_void, usize) {
    match bytes {
        Some(b) => (b.as_ptr() as *mut std::ffi::c_void, b.len()),
        None => (std::ptr::null_mut(), 0),
    }
}

/// Waits until every record queued is delivered, with librdkafka's own
/// `rd_kafka_flush`, not rdkafka's `flush`: that one calls it without a
/// timeout and, while records are in flight, sleeps in 100 ms polls (the
/// producer's own thread takes the delivery events it waits for), which
/// `commit_transaction` pays at every commit. Call it before committing.
pub fn flush_now<C: ProducerContext + 'static>(
    producer: &ThreadedProducer<C>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the client is alive for the call (`producer`).
    let err = unsafe { rdsys::rd_kafka_flush(producer.client().native_ptr(), ms) };
    match err {
        rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
        err => Err(KafkaError::Flush(RDKafkaErrorCode::from(err))),
    }
}
