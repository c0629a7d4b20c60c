//! Produces the workload at a constant offered rate: every few
//! milliseconds, the records due by then are handed to the producer in
//! order, and their deliveries are awaited in the background, so that a
//! slow acknowledgement does not hold the rate back (up to a bound on
//! records in flight, past which the run falls behind and says so).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use readfold_kafka::now_ms;
use readfold_kafka::producer::{Deliveries, InputProducer};
use readfold_progress::{Progress, ProgressMode};
use readfold_wire::codec::{ConversationEventRecord, ReadReportRecord};

use crate::workload::{Counts, Generated, Workload, WorkloadSpec};
use crate::Result;

/// How much to produce, and how fast.
#[derive(Clone, Debug)]
pub struct LoadgenOptions {
    pub spec: WorkloadSpec,
    /// Records per second offered.
    pub rate: f64,
    /// Stop after this many records (and/or `duration`; at least one).
    pub records: Option<u64>,
    pub duration: Option<Duration>,
    pub progress: ProgressMode,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct LoadgenSummary {
    pub counts: Counts,
    pub records: u64,
    pub elapsed: Duration,
    /// The most the run was behind its schedule, in records.
    pub max_behind: u64,
}

impl LoadgenSummary {
    pub fn achieved_rate(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// How often records are handed over: often enough for a smooth rate,
/// seldom enough to batch.
const TICK: Duration = Duration::from_millis(5);
/// Records in flight (handed over, not yet acknowledged) before the run
/// waits for the oldest deliveries.
const MAX_IN_FLIGHT: usize = 200_000;

pub async fn run(options: &LoadgenOptions, producer: &InputProducer) -> Result<LoadgenSummary> {
    if options.rate.is_nan()
        || options.rate <= 0.0
        || (options.records.is_none() && options.duration.is_none())
    {
        return Err(crate::Error::Spec(
            "give a rate above 0, and --records or --seconds".into(),
        ));
    }
    let mut workload = Workload::new(options.spec.clone())?;
    let total = options.records.unwrap_or_else(|| {
        options
            .duration
            .map_or(0, |d| (d.as_secs_f64() * options.rate) as u64)
    });
    let mut progress = Progress::new("loadgen", options.progress, total);
    let started = Instant::now();
    let mut in_flight: VecDeque<(usize, Deliveries)> = VecDeque::new();
    let mut in_flight_records = 0usize;
    let (mut produced, mut max_behind) = (0u64, 0u64);
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        ticks.tick().await;
        let elapsed = started.elapsed();
        let mut due = (elapsed.as_secs_f64() * options.rate) as u64;
        if let Some(records) = options.records {
            due = due.min(records);
        }
        let out_of_time = options.duration.is_some_and(|d| elapsed >= d);
        if due > produced && !out_of_time {
            let now = now_ms();
            let (mut reports, mut events): (Vec<ReadReportRecord>, Vec<ConversationEventRecord>) =
                (Vec::new(), Vec::new());
            for _ in produced..due {
                match workload.next(now) {
                    Generated::Report(r) => reports.push(r),
                    Generated::Event(e) => events.push(e),
                }
            }
            let n = (due - produced) as usize;
            in_flight.push_back((n, producer.enqueue(&reports, &events).await?));
            in_flight_records += n;
            produced = due;
            progress.add(n as u64);
        }
        max_behind = max_behind
            .max(((started.elapsed().as_secs_f64() * options.rate) as u64).saturating_sub(produced));
        while in_flight_records > MAX_IN_FLIGHT {
            let (n, deliveries) = in_flight.pop_front().expect("records in flight");
            deliveries.wait().await?;
            in_flight_records -= n;
        }
        let done = options.records.is_some_and(|r| produced >= r) || out_of_time;
        if done {
            break;
        }
    }
    progress.status("waiting for the broker's acknowledgements");
    for (_, deliveries) in in_flight {
        deliveries.wait().await?;
    }
    progress.finish();
    Ok(LoadgenSummary {
        counts: workload.counts(),
        records: produced,
        elapsed: started.elapsed(),
        max_behind,
    })
}
