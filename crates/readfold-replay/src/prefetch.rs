//! Reading and decoding on a thread of their own, so that the thread that
//! merges and folds does nothing else. Each partition's records come to it
//! decoded, in offset order, in batches on a bounded channel of their own;
//! the reader never blocks on one partition's full channel (the merge may be
//! waiting for another), so memory stays bounded and nothing deadlocks.
//! Emptied batches go back to the reader to be filled again: a fresh one
//! per batch would fault in new pages every time.
//!
//! A table that does not depend on the order of records across partitions
//! (the cursors) takes them [`Arrival::AsFetched`]: every partition's batches
//! on one channel, folded as they come, with no merge waiting for the
//! slowest partition's next batch.

use std::collections::VecDeque;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use readfold_wire::changelog::decode_changelog;
use readfold_wire::validate::{ingest, Placement};
use readfold_wire::Limits;

use crate::error::{Error, Result};
use crate::order::OrderKey;
use crate::replayer::Record;
use crate::source::{InputPartition, KafkaInputs, Polled, RawRecord, Source};

/// A record in replay order, decoded and validated (or rejected).
pub type Head = (OrderKey, Record);

/// Records per batch: large enough to amortise a channel hand-off.
const BATCH: usize = 4096;
/// Batches in flight per partition.
const IN_FLIGHT: usize = 4;
/// How long every partition may give nothing before the replay gives up (a
/// broker away for good, or records held by an open transaction).
const STALL: Duration = Duration::from_secs(120);

/// How the folding side takes the partitions' records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Each partition on its own, for a merge into replay order.
    PerPartition,
    /// All partitions through [`Decoded::next`] of 0, each still in offset
    /// order, interleaved as fetched.
    AsFetched,
}

#[derive(Default)]
pub struct Batch {
    pub heads: Vec<Head>,
    /// Records read from the broker, in range or not.
    pub read: u64,
    /// Records at or after `--until`, left out.
    pub after_until: u64,
}

enum Message {
    Batch(Batch),
    Done,
}

/// The folding side: one receiver per partition, or one for all.
pub struct Decoded {
    receivers: Vec<Receiver<Message>>,
    current: Vec<VecDeque<Head>>,
    /// Per receiver: partitions whose end it has yet to hear of.
    open: Vec<usize>,
    /// Emptied batches, back to the reader.
    recycle: Sender<Vec<Head>>,
}

/// The reading side, to run on its own thread.
pub struct Reader {
    inputs: KafkaInputs,
    senders: Vec<SyncSender<Message>>,
    recycled: Receiver<Vec<Head>>,
    /// A buffer taken for a batch that got no record.
    spare: Option<Vec<Head>>,
}

/// Splits `inputs` into a reader (for a thread) and the decoded streams.
pub fn split(inputs: KafkaInputs, arrival: Arrival) -> (Reader, Decoded) {
    let n = inputs.partitions().len();
    let (senders, receivers, open): (Vec<_>, Vec<_>, Vec<_>) = match arrival {
        Arrival::PerPartition => {
            let (senders, receivers) = (0..n).map(|_| sync_channel(IN_FLIGHT)).unzip();
            (senders, receivers, vec![1; n])
        }
        Arrival::AsFetched => {
            let (sender, receiver) = sync_channel(IN_FLIGHT * n.max(1));
            (vec![sender; n], vec![receiver], vec![n])
        }
    };
    let m = receivers.len();
    let (recycle, recycled) = channel();
    (
        Reader {
            inputs,
            senders,
            recycled,
            spare: None,
        },
        Decoded {
            receivers,
            current: (0..m).map(|_| VecDeque::new()).collect(),
            open,
            recycle,
        },
    )
}

impl Decoded {
    /// Partition `i`'s next record (with [`Arrival::AsFetched`], any
    /// partition's: `i` is 0), waiting for the reader; `None` at its end.
    /// `batch` is told each batch's counts. An error means the reader
    /// stopped: its own error says why.
    pub fn next(&mut self, i: usize, mut batch: impl FnMut(&Batch)) -> Result<Option<Head>> {
        loop {
            if let Some(head) = self.current[i].pop_front() {
                return Ok(Some(head));
            }
            if self.open[i] == 0 {
                return Ok(None);
            }
            match self.receivers[i].recv() {
                Ok(Message::Batch(b)) => {
                    batch(&b);
                    let emptied = std::mem::replace(&mut self.current[i], b.heads.into());
                    if emptied.capacity() > 0 {
                        // The reader may have stopped; then it is simply dropped.
                        let _ = self.recycle.send(emptied.into());
                    }
                }
                Ok(Message::Done) => self.open[i] -= 1,
                Err(_) => return Err(Error::Consumer("the reader thread stopped".into())),
            }
        }
    }
}

impl Reader {
    /// Reads every partition to its end. Returns early, without error, if
    /// the folding side hung up.
    pub fn run(mut self, until: Option<i64>, limits: &Limits) -> Result<()> {
        let n = self.senders.len();
        let mut outgoing: Vec<VecDeque<Message>> = (0..n).map(|_| VecDeque::new()).collect();
        let mut done = vec![false; n];
        let mut idle_since: Option<Instant> = None;
        let mut warned_at = Instant::now();
        loop {
            let mut progressed = false;
            for i in 0..n {
                if !self.drain(i, &mut outgoing[i], &mut progressed) {
                    return Ok(());
                }
                if done[i] || !outgoing[i].is_empty() {
                    continue;
                }
                let mut batch = Batch {
                    heads: self.buffer(),
                    ..Batch::default()
                };
                while batch.heads.len() < BATCH {
                    match self
                        .inputs
                        .poll_next(i, Duration::ZERO, |p, r| decode(p, r, until, limits))?
                    {
                        Polled::Record(head) => {
                            batch.read += 1;
                            match head {
                                Some(head) => batch.heads.push(head),
                                None => batch.after_until += 1,
                            }
                        }
                        Polled::Empty => break,
                        Polled::Done => {
                            done[i] = true;
                            break;
                        }
                    }
                }
                if batch.read > 0 {
                    outgoing[i].push_back(Message::Batch(batch));
                    progressed = true;
                } else if batch.heads.capacity() > 0 {
                    // Nothing read: keep the buffer for the next batch.
                    self.spare = Some(batch.heads);
                }
                if done[i] {
                    outgoing[i].push_back(Message::Done);
                }
                if !self.drain(i, &mut outgoing[i], &mut progressed) {
                    return Ok(());
                }
            }
            if done.iter().all(|d| *d) && outgoing.iter().all(VecDeque::is_empty) {
                return Ok(());
            }
            if progressed {
                idle_since = None;
                continue;
            }
            // Nothing fetched and nothing taken: wait a little for either.
            let idle = *idle_since.get_or_insert_with(Instant::now);
            std::thread::sleep(Duration::from_micros(500));
            let waiting = (0..n).find(|&i| !done[i] && outgoing[i].is_empty());
            if let Some(i) = waiting {
                let p = &self.inputs.partitions()[i];
                if idle.elapsed() > STALL {
                    return Err(Error::Stalled {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        end: p.end,
                        secs: STALL.as_secs(),
                    });
                }
                if idle.elapsed() > Duration::from_secs(10) && warned_at.elapsed() > Duration::from_secs(10) {
                    warned_at = Instant::now();
                    tracing::warn!(
                        topic = %p.topic,
                        partition = p.partition,
                        end = p.end,
                        "no record for {} s before the partition's end; still waiting",
                        idle.elapsed().as_secs()
                    );
                }
            }
        }
    }

    /// An empty buffer for a batch: a spare or an emptied one if any.
    fn buffer(&mut self) -> Vec<Head> {
        self.spare
            .take()
            .or_else(|| self.recycled.try_recv().ok())
            .unwrap_or_else(|| Vec::with_capacity(BATCH))
    }

    /// Hands partition `i`'s queued messages over while its channel has
    /// room; false if the folding side hung up.
    fn drain(&self, i: usize, outgoing: &mut VecDeque<Message>, progressed: &mut bool) -> bool {
        while let Some(message) = outgoing.pop_front() {
            match self.senders[i].try_send(message) {
                Ok(()) => *progressed = true,
                Err(TrySendError::Full(message)) => {
                    outgoing.push_front(message);
                    return true;
                }
                Err(TrySendError::Disconnected(_)) => return false,
            }
        }
        true
    }
}

/// One record to its place in the order and its fold input, or `None` if it
/// is at or after `until`.
fn decode(p: &InputPartition, r: RawRecord<'_>, until: Option<i64>, limits: &Limits) -> Option<Head> {
    if until.is_some_and(|u| r.timestamp >= u) {
        return None;
    }
    let placement = Placement {
        key: r.key,
        partition: p.partition,
        partition_count: p.partition_count,
    };
    let record = match p.source {
        Source::Input(kind) => Record::Input(ingest(kind, r.value, placement, limits)),
        Source::Changelog(kind) => {
            Record::Changelog(decode_changelog(kind, r.key, r.value, limits.max_id_bytes))
        }
    };
    Some((
        OrderKey::new(r.timestamp, p.source.rank(), p.partition, r.offset),
        record,
    ))
}
