//! The transactional producers: one transaction per flush carries the
//! changelog records, the dead letters and the input offsets. librdkafka's
//! transaction calls block, so [`Transactions::commit`] runs them on a
//! blocking thread, never on an async worker.
//!
//! The stores are written while the transaction's records are produced,
//! and the commit waits for them ([`StoresGate`]): a flush then takes the
//! longer of the two, not their sum, and the changelog (read_committed)
//! still never shows a cursor before the stores hold it.
//!
//! Two producers take turns, a transaction each. When a commit returns, the
//! coordinator has decided it but is still writing its markers, and until
//! they are written it answers the same producer's next AddPartitionsToTxn
//! and AddOffsetsToTxn with CONCURRENT_TRANSACTIONS, which librdkafka
//! retries 20 ms later (KAFKA-5477): under load, when flushes follow each
//! other at once, every transaction would begin with that wait. The other
//! producer's transaction state is free, so the next flush starts at once.
//! Order still holds: a flush begins only after the one before it
//! committed, so its records follow that one's in every partition, a
//! read_committed reader sees them only after it (the earlier transaction
//! holds the last stable offset back), and its offset commit is written
//! after the earlier one's, which is the one that counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;
use readfold_kafka::batch_producer::{BatchProducer, BatchRecord, QUEUE_FULL_WAIT};
use readfold_kafka::context::LogContext;
use readfold_kafka::{is_fatal, KafkaConfig};
use readfold_wire::changelog::{EncodedRecords, OutputTopics};
use readfold_wire::{ChangelogKind, OutRecord, TRACEPARENT_HEADER};

use crate::error::{Error, Result};

const TXN_TIMEOUT: Duration = Duration::from_secs(60);

/// A flush's records, a chunk at a time as they are encoded, so that the
/// first are on their way to the broker while the last are encoded. The
/// transaction produces them all before it commits: it has all once the
/// [`RecordChunk::Last`] came; closed before that, the flush was cut short
/// and the transaction aborts.
pub type RecordChunks = tokio::sync::mpsc::Receiver<RecordChunk>;

/// A chunk of a flush's records.
pub enum RecordChunk {
    /// Changelog records in one buffer, and the topics they go to.
    Changelog(EncodedRecords, Arc<OutputTopics>),
    /// The flush's last chunk: records with a topic and headers each, its
    /// dead letters, rare enough to go one by one.
    Last(Vec<OutRecord>),
}

/// Records of one topic handed to librdkafka per call.
const SEND_BATCH: usize = 4096;

/// Whether the stores took the flush's writes, sent by the flush once they
/// answered. The commit waits for it; `false` (or a dropped sender) aborts.
/// A plain channel: the blocking thread waits on it with a timeout.
pub type StoresGate = std::sync::mpsc::Receiver<bool>;

/// The processor's transactional producers, taking turns.
#[derive(Clone)]
pub struct Transactions {
    lanes: Arc<[Lane; 2]>,
    /// Counts the calls to [`Transactions::commit`]; its parity picks the
    /// lane. One flush is in flight at a time, and a lane's commit or
    /// abort has settled before its call returns, so the lanes strictly
    /// alternate and never overlap.
    turn: Arc<AtomicUsize>,
}

/// One transactional producer.
struct Lane {
    /// Threaded, not a `FutureProducer`: nothing waits on one record's
    /// delivery (the commit checks them all), and a future per record would
    /// cost a channel and its allocations on every changelog record.
    /// Records go a topic's batch at a time ([`BatchProducer`]).
    producer: BatchProducer<LogContext>,
    /// How long an open transaction waits for the stores before it aborts:
    /// half the transaction timeout, so that the coordinator never aborts
    /// it first (which would fence the producer).
    stores_wait: Duration,
}

impl Transactions {
    /// Creates both producers and fences any earlier incarnation with the
    /// same transactional ids, aborting whatever it left open. Blocks.
    pub fn init(kafka: &KafkaConfig) -> Result<Self> {
        let [first, second] = kafka.transactional_ids();
        // Side by side: each waits for a broker and its coordinator.
        let (first, second) = std::thread::scope(|scope| {
            let second = scope.spawn(|| Lane::init(kafka, &second));
            let first = Lane::init(kafka, &first);
            let second = second
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (first, second)
        });
        Ok(Transactions {
            lanes: Arc::new([first?, second?]),
            turn: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Publishes `records` and commits `offsets` for the group in one
    /// transaction, on a blocking thread, once `stores` says the stores
    /// took the same flush. On failure the transaction is aborted:
    /// [`Error::Transaction`] may be retried, [`Error::FatalTransaction`]
    /// may not; [`Error::StoresNotWritten`] means the stores failed (their
    /// writer has the reason); [`Error::RecordsCutShort`], that the records
    /// stopped before their last chunk.
    pub async fn commit(
        &self,
        records: RecordChunks,
        offsets: TopicPartitionList,
        group: Option<ConsumerGroupMetadata>,
        stores: StoresGate,
    ) -> Result<()> {
        let lanes = Arc::clone(&self.lanes);
        let lane = self.turn.fetch_add(1, Ordering::Relaxed) % lanes.len();
        tokio::task::spawn_blocking(move || lanes[lane].commit(records, &offsets, group.as_ref(), stores))
            .await?
    }
}

impl Lane {
    fn init(kafka: &KafkaConfig, transactional_id: &str) -> Result<Self> {
        let producer: ThreadedProducer<LogContext> = kafka
            .changelog_producer_config()
            .set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", kafka.transaction_timeout_ms.to_string())
            .set("enable.idempotence", "true")
            // The commit checks delivery as a whole; a report per record
            // would only cost an event and a callback each.
            .set("delivery.report.only.error", "true")
            // A transaction's first requests may still meet the markers of
            // this producer's previous one (CONCURRENT_TRANSACTIONS); retry
            // those soon.
            .set("retry.backoff.ms", "10")
            // Dead letters keep records of up to MAX_DEAD_LETTER_BYTES.
            .set("message.max.bytes", "2000000")
            .create_with_context(LogContext)?;
        // Without a broker connection up, librdkafka's first look for the
        // coordinator fails and the next comes 500 ms later. One deadline
        // for both calls.
        let deadline = Instant::now() + TXN_TIMEOUT;
        readfold_kafka::brokers::wait_for_broker(producer.client(), TXN_TIMEOUT)?;
        producer.init_transactions(deadline.saturating_duration_since(Instant::now()))?;
        tracing::info!(%transactional_id, "transactional producer ready");
        Ok(Lane {
            producer: BatchProducer::new(Arc::new(producer)),
            stores_wait: Duration::from_millis(kafka.transaction_timeout_ms / 2),
        })
    }

    fn commit(
        &self,
        mut records: RecordChunks,
        offsets: &TopicPartitionList,
        group: Option<&ConsumerGroupMetadata>,
        stores: StoresGate,
    ) -> Result<()> {
        let started = std::time::Instant::now();
        // It fails only fatally, or with an earlier commit or abort still
        // unfinished, which `end` below never leaves behind: either way
        // this producer cannot go on.
        self.producer
            .producer()
            .begin_transaction()
            .map_err(Error::FatalTransaction)?;
        // Ok(Err(e)): the flush is not to be committed, as `e` says. With
        // the phases' ends, in ms since the transaction began.
        let body = move || -> std::result::Result<std::result::Result<[u64; 4], Error>, KafkaError> {
            let mut complete = false;
            while let Some(chunk) = records.blocking_recv() {
                match chunk {
                    RecordChunk::Changelog(records, out) => self.send_changelog(&records, &out)?,
                    RecordChunk::Last(records) => {
                        self.send_all(&records)?;
                        complete = true;
                    }
                }
            }
            if !complete {
                return Ok(Err(Error::RecordsCutShort));
            }
            let queued = ms(started);
            if offsets.count() > 0 {
                // Not in a group generation (yet): retry after the next rebalance.
                let group = group.ok_or(KafkaError::Global(RDKafkaErrorCode::State))?;
                self.producer
                    .producer()
                    .send_offsets_to_transaction(offsets, group, TXN_TIMEOUT)?;
            }
            let offsets_sent = ms(started);
            self.wait_delivered()?;
            let delivered = ms(started);
            if !self.stores_written(stores) {
                return Ok(Err(Error::StoresNotWritten));
            }
            Ok(Ok([queued, offsets_sent, delivered, ms(started)]))
        };
        let abort = || match end(|| self.producer.producer().abort_transaction(TXN_TIMEOUT)) {
            Err(Error::Transaction(e)) => Err(Error::UnsettledTransaction(e)),
            other => other,
        };
        let [queued, offsets_sent, delivered, stores_took] = match body() {
            Ok(Ok(phases)) => phases,
            Ok(Err(not_to_commit)) => {
                abort()?;
                return Err(not_to_commit);
            }
            Err(e) if is_fatal(&e) => return Err(Error::FatalTransaction(e)),
            Err(e) => {
                abort()?;
                return Err(Error::Transaction(e));
            }
        };
        match end(|| self.producer.producer().commit_transaction(TXN_TIMEOUT)) {
            // Neither retriable nor fatal: the transaction must be aborted.
            Err(Error::Transaction(e)) => {
                abort()?;
                Err(Error::Transaction(e))
            }
            other => {
                tracing::debug!(
                    queued,
                    offsets_sent,
                    delivered,
                    stores_took,
                    committed = ms(started),
                    "transaction phases (ms since it began)"
                );
                other
            }
        }
    }

    /// Waits, at most `stores_wait`, for the stores' answer.
    fn stores_written(&self, stores: StoresGate) -> bool {
        match stores.recv_timeout(self.stores_wait) {
            Ok(written) => written,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => false,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    waited_ms = self.stores_wait.as_millis() as u64,
                    "the stores did not answer in time: aborting the flush's transaction"
                );
                false
            }
        }
    }

    /// Sends every queued record at once, without waiting out
    /// `linger.ms` (the flush queued all it has), and waits until all are
    /// delivered. `commit_transaction` flushes first too, but through
    /// rdkafka's flush, which sleeps in 100 ms polls while records are in
    /// flight.
    fn wait_delivered(&self) -> std::result::Result<(), KafkaError> {
        self.producer.flush_now(TXN_TIMEOUT)
    }

    /// Queues encoded changelog records a topic's batch at a time, in
    /// their order within each topic.
    fn send_changelog(
        &self,
        records: &EncodedRecords,
        out: &OutputTopics,
    ) -> std::result::Result<(), KafkaError> {
        let mut batch = Vec::with_capacity(SEND_BATCH.min(records.len()));
        for kind in ChangelogKind::ALL {
            let topic = out.topic_of(kind);
            for record in records.iter().filter(|r| r.kind == kind) {
                if let Some(traceparent) = record.traceparent {
                    // A header needs librdkafka's one-record call; the
                    // batch so far goes first, keeping the order.
                    self.producer.send_batch(topic, &batch)?;
                    batch.clear();
                    let mut base: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic)
                        .partition(record.partition)
                        .key(record.key)
                        .headers(OwnedHeaders::new().insert(Header {
                            key: TRACEPARENT_HEADER,
                            value: Some(traceparent),
                        }));
                    if let Some(value) = record.value {
                        base = base.payload(value);
                    }
                    self.send_base(base)?;
                    continue;
                }
                batch.push(BatchRecord {
                    partition: record.partition,
                    key: Some(record.key),
                    value: record.value,
                });
                if batch.len() == SEND_BATCH {
                    self.producer.send_batch(topic, &batch)?;
                    batch.clear();
                }
            }
            self.producer.send_batch(topic, &batch)?;
            batch.clear();
        }
        Ok(())
    }

    /// Queues records of their own (dead letters, with headers), one by one.
    fn send_all(&self, records: &[OutRecord]) -> std::result::Result<(), KafkaError> {
        records.iter().try_for_each(|record| self.send(record))
    }

    /// Queues one record of its own, with its headers.
    fn send(&self, record: &OutRecord) -> std::result::Result<(), KafkaError> {
        let mut base: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&record.topic).partition(record.partition);
        // A record without headers gets no header list.
        if !record.headers.is_empty() {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
            for (name, value) in &record.headers {
                headers = headers.insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                });
            }
            base = base.headers(headers);
        }
        if let Some(key) = &record.key {
            base = base.key(key);
        }
        if let Some(value) = &record.value {
            base = base.payload(value);
        }
        self.send_base(base)
    }

    /// Queues one record; waits (this is a blocking thread) while the
    /// producer's queue is full.
    fn send_base(&self, mut base: BaseRecord<'_, [u8], [u8]>) -> std::result::Result<(), KafkaError> {
        loop {
            match self.producer.producer().send(base) {
                // Delivery is checked by commit_transaction as a whole.
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    base = back;
                    std::thread::sleep(QUEUE_FULL_WAIT);
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// How many times a commit or an abort is called before it counts as
/// unsettled.
const END_ATTEMPTS: u32 = 3;

/// Calls `end`, a commit or an abort, until it settles. librdkafka leaves
/// one that failed with a retriable error (a timeout, say) unfinished, to
/// be called again, and may still complete it in the background. So no
/// other transaction may begin before it settled: the flush, retried on
/// the other producer, would be committed twice if this commit went
/// through after all. Still unsettled after [`END_ATTEMPTS`]:
/// [`Error::UnsettledTransaction`], and the processor starts over from
/// what was committed, which is right whichever way this one went. Other
/// failures come back as [`Error::Transaction`]: a commit's ask for an
/// abort, and an abort's leave it unsettled.
fn end(call: impl FnMut() -> std::result::Result<(), KafkaError>) -> Result<()> {
    let failure = |e: &KafkaError| match e {
        _ if is_fatal(e) => Failure::Fatal,
        KafkaError::Transaction(t) if t.is_retriable() => Failure::Retriable,
        _ => Failure::Other,
    };
    let retrying = |e: &KafkaError, attempt: u32| {
        tracing::warn!(error = %e, attempt, "a transaction's commit or abort failed; calling it again");
    };
    end_with(call, failure, retrying).map_err(|unended| match unended {
        Unended::Fatal(e) => Error::FatalTransaction(e),
        Unended::Unsettled(e) => Error::UnsettledTransaction(e),
        Unended::Other(e) => Error::Transaction(e),
    })
}

/// How a commit or an abort failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    Fatal,
    /// Unfinished: to be called again.
    Retriable,
    Other,
}

/// A commit or an abort that did not succeed.
#[derive(Debug, PartialEq, Eq)]
enum Unended<E> {
    Fatal(E),
    /// Still retriable after [`END_ATTEMPTS`] calls.
    Unsettled(E),
    Other(E),
}

/// [`end`]'s policy, apart from librdkafka's errors.
fn end_with<E>(
    mut call: impl FnMut() -> std::result::Result<(), E>,
    failure: impl Fn(&E) -> Failure,
    retrying: impl Fn(&E, u32),
) -> std::result::Result<(), Unended<E>> {
    let mut attempt = 1;
    loop {
        let Err(e) = call() else { return Ok(()) };
        match failure(&e) {
            Failure::Fatal => return Err(Unended::Fatal(e)),
            Failure::Other => return Err(Unended::Other(e)),
            Failure::Retriable if attempt == END_ATTEMPTS => return Err(Unended::Unsettled(e)),
            Failure::Retriable => {
                retrying(&e, attempt);
                attempt += 1;
            }
        }
    }
}

fn ms(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls that fail with `failures` in turn, then succeed.
    fn calls(failures: &[Failure]) -> (std::result::Result<(), Unended<Failure>>, usize) {
        let mut made = 0;
        let outcome = end_with(
            || {
                made += 1;
                failures.get(made - 1).map_or(Ok(()), |&f| Err(f))
            },
            |&f| f,
            |_, _| {},
        );
        (outcome, made)
    }

    #[test]
    fn a_retriable_failure_is_called_again_until_it_settles() {
        use Failure::Retriable;
        assert_eq!(calls(&[]), (Ok(()), 1));
        assert_eq!(calls(&[Retriable, Retriable]), (Ok(()), 3));
    }

    #[test]
    fn one_still_retriable_after_the_last_attempt_is_unsettled() {
        let failures = [Failure::Retriable; END_ATTEMPTS as usize];
        let (outcome, made) = calls(&failures);
        assert_eq!(outcome, Err(Unended::Unsettled(Failure::Retriable)));
        assert_eq!(made, END_ATTEMPTS as usize);
    }

    #[test]
    fn fatal_and_other_failures_end_at_once() {
        use Failure::{Fatal, Other, Retriable};
        assert_eq!(calls(&[Fatal]), (Err(Unended::Fatal(Fatal)), 1));
        assert_eq!(calls(&[Retriable, Other]), (Err(Unended::Other(Other)), 2));
    }
}
