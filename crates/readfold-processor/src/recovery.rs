//! Starting over: after a broken transactional producer or a damaged
//! checkpoint, the processor drops what it folded but did not commit,
//! rejoins the group and restores, as Kafka Streams does after a fenced
//! commit. Also the retries of what fails at start.

use std::future::Future;
use std::time::Duration;

use rdkafka::consumer::Consumer;
use readfold_core::backoff;
use readfold_core::fold::StoredFault;

use crate::transaction::Transactions;
use crate::{Error, Processor, Result, Settings};

/// Creates the transactional producers on a blocking thread, retrying while
/// the brokers are away.
pub(crate) async fn init_producer(settings: &Settings) -> Result<Transactions> {
    let attempt = || {
        let kafka = settings.kafka.clone();
        async move {
            match tokio::task::spawn_blocking(move || Transactions::init(&kafka)).await {
                Ok(result) => result,
                Err(e) => Err(Error::Task(e)),
            }
        }
    };
    retrying(attempt, |e, delay| {
        tracing::warn!(sink = "kafka", error = %e, retry_in_ms = delay.as_millis() as u64, "sink unreachable at start; retrying");
    })
    .await
}

/// Runs `attempt` until it succeeds or fails for a reason retrying will not
/// cure, sleeping with backoff between tries. `failed` is told each
/// retriable failure and the wait before the next try, to log it.
pub async fn retrying<T, E, F, Fut>(mut attempt: F, failed: impl Fn(&Error, Duration)) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
    E: Into<Error>,
{
    let mut failures = 0;
    loop {
        match attempt().await.map_err(Into::into) {
            Err(e) if e.is_retriable() => {
                failures += 1;
                let delay = backoff::delay(failures);
                failed(&e, delay);
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

impl Processor {
    /// A transactional producer was fenced or broke, or a commit or abort
    /// did not settle. Either a transaction outlived
    /// `kafka.transaction_timeout_ms` (a broker restart can do that; the
    /// broker then aborts it and bumps the producer's epoch), or another
    /// process runs with this `instance_id`, or the broker stayed away
    /// through a commit's retries. Like Kafka Streams after a fenced commit,
    /// start over: drop what was folded but not committed, rejoin the group
    /// and restore from the changelogs, with new producers (whose
    /// `init_transactions` settles what the old ones left). Whatever reached Redis or CQL was max-merged, so
    /// folding the same input again changes nothing there. After
    /// [`readfold_core::schedule::MAX_PRODUCER_RECOVERIES`] in a row without a commit, give up: a
    /// second instance with the same `instance_id` is a configuration error.
    pub(crate) async fn recover_producer(&mut self, cause: Error) -> Result<()> {
        if !self.schedule.producer_broke() {
            return Err(cause);
        }
        tracing::warn!(
            error = %cause,
            attempt = self.schedule.recoveries(),
            "a transactional producer was fenced or its transaction did not settle; dropping uncommitted state and starting over from the committed offsets"
        );
        self.leave_inputs();
        self.transactions = init_producer(&self.settings).await?;
        self.subscribe_inputs()
    }

    /// The checkpoints some partitions were restored from turned out
    /// damaged (a page's checksum failed when a record touched it, or when
    /// the checkpoint was checked whole beside the fold): their states may
    /// hold wrong cursors for what they could not read. Nothing of them
    /// was published (`start_flush` refuses them). Set the files aside,
    /// let what is in flight settle (it was taken before), and start over
    /// as after a fenced producer: drop every state and what was folded
    /// but not committed, rejoin the group and restore, those partitions
    /// from their changelogs.
    pub(crate) async fn drop_damaged_state(&mut self) -> Result<()> {
        let damaged = self.partitions.stored_faults();
        for (partition, fault) in &damaged {
            self.set_aside_damaged(*partition, fault);
        }
        let partitions: Vec<i32> = damaged.iter().map(|(p, _)| *p).collect();
        tracing::warn!(
            ?partitions,
            "dropping uncommitted state and starting over from the committed offsets"
        );
        let mut producer_broke = false;
        for (what, settled) in [
            ("flush", self.finish_flush().await),
            ("snapshot", self.finish_snapshot().await),
        ] {
            if let Err(e) = settled {
                producer_broke |= matches!(e, Error::FatalTransaction(_) | Error::UnsettledTransaction(_));
                tracing::warn!(error = %e, what, "what was in flight failed; it is folded again");
            }
        }
        self.leave_inputs();
        if producer_broke {
            self.transactions = init_producer(&self.settings).await?;
        }
        self.subscribe_inputs()
    }

    /// Sets aside the checkpoint `partition`'s state was restored from,
    /// found damaged.
    pub(crate) fn set_aside_damaged(&self, partition: i32, fault: &StoredFault) {
        // A state over a checkpoint came from one of these.
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.set_aside_corrupt(partition, fault);
        }
    }

    /// Leaves the group and forgets every partition's state and what was
    /// folded but not committed: the start of starting over.
    fn leave_inputs(&mut self) {
        self.consumer.unsubscribe();
        self.partitions.start_over();
        // What a restore beside the loop reads now belongs to no assignment.
        self.restoring = None;
        self.schedule.started_over();
    }

    /// Joins the group again, for both inputs.
    fn subscribe_inputs(&mut self) -> Result<()> {
        let topics = [
            self.settings.topics.read_reports.as_str(),
            self.settings.topics.conversation_events.as_str(),
        ];
        self.consumer.subscribe(&topics)?;
        Ok(())
    }
}
