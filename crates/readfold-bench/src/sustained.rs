//! The highest live rate the pipeline sustains on this machine: what the
//! latency bench's rows take fractions of, unless a maximum is given.
//!
//! A catch-up's rate is no live rate: a backlog folds each hot member once
//! per flush, where a live load publishes nearly every report, and the
//! bench's own load generator needs cores of the same machine. So the rate
//! is found live, by offering it: a rate is sustained when the generator
//! offered it and the processor kept up with it, that is, report-to-changelog
//! latency did not grow over the step (a backlog that grows with every
//! second is the sign of a rate above what the pipeline can take) and its
//! p99 stayed under a second. The search doubles a sustained rate until one
//! is not, then halves the gap between the two, geometrically, until they
//! are within 10% of each other. This module holds that logic, no I/O.

/// The rate the search offers first, records/s.
pub const FIRST_RATE: f64 = 10_000.0;
/// Below this the search gives up: a rate this low not sustained is a
/// broken setup, not a measurement.
pub const FLOOR_RATE: f64 = 1_000.0;
/// Above this the search stops doubling.
pub const CEILING_RATE: f64 = 4_000_000.0;
/// The search ends when the lowest rate not sustained is within this
/// factor of the highest one sustained.
const PRECISION: f64 = 1.1;
/// The generator must offer at least this share of the rate asked for.
const OFFERED_SHARE: f64 = 0.95;
/// How much the median latency may grow from the step's first fifth to its
/// last before the step counts as falling behind, ms.
const GROWTH_MS: f64 = 100.0;
/// The p99 above which a step does not count as sustained, ms.
const TAIL_MS: f64 = 1_000.0;

/// Whether one step kept up, and if not, why.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    KeptUp,
    /// The load generator could not offer the rate beside the pipeline.
    OfferedShort {
        achieved: f64,
    },
    /// No changelog record of the step's reports arrived.
    NothingArrived,
    /// None of the step's last fifth arrived, while earlier ones did.
    LastFifthMissing,
    /// The median latency of the step's last fifth was this much above its
    /// first fifth's.
    FellBehind {
        first_p50: f64,
        last_p50: f64,
    },
    /// The step's p99 was above a second.
    TailOver {
        p99: f64,
    },
}

impl Verdict {
    pub fn kept_up(&self) -> bool {
        matches!(self, Verdict::KeptUp)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::KeptUp => write!(f, "kept up"),
            Verdict::OfferedShort { achieved } => {
                write!(f, "the generator offered only {achieved:.0}/s")
            }
            Verdict::NothingArrived => write!(f, "no changelog record arrived"),
            Verdict::LastFifthMissing => write!(f, "nothing of the step's last fifth arrived"),
            Verdict::FellBehind { first_p50, last_p50 } => write!(
                f,
                "fell behind: p50 grew from {first_p50:.0} to {last_p50:.0} ms over the step"
            ),
            Verdict::TailOver { p99 } => write!(f, "p99 {p99:.0} ms, over {TAIL_MS:.0}"),
        }
    }
}

/// Judges one step: `offered` records/s asked for, `achieved` offered, and
/// each changelog record of the step as (send time in ms, latency in ms),
/// the send times within `[from, to)`.
pub fn judge(offered: f64, achieved: f64, from: i64, to: i64, records: &[(i64, f64)]) -> Verdict {
    if achieved < offered * OFFERED_SHARE {
        return Verdict::OfferedShort { achieved };
    }
    if records.is_empty() {
        return Verdict::NothingArrived;
    }
    let fifth = ((to - from) / 5).max(1);
    // None for a window with no record.
    let p50_within = |lo: i64, hi: i64| {
        let mut ms: Vec<f64> = records
            .iter()
            .filter(|(at, _)| (lo..hi).contains(at))
            .map(|&(_, ms)| ms)
            .collect();
        ms.sort_by(f64::total_cmp);
        (!ms.is_empty()).then(|| crate::stats::percentile(&ms, 0.5))
    };
    let Some(last_p50) = p50_within(to - fifth, to) else {
        return Verdict::LastFifthMissing;
    };
    // A first fifth with nothing to compare with leaves the tail to judge.
    if let Some(first_p50) = p50_within(from, from + fifth) {
        if last_p50 > first_p50 + GROWTH_MS {
            return Verdict::FellBehind { first_p50, last_p50 };
        }
    }
    let mut all: Vec<f64> = records.iter().map(|&(_, ms)| ms).collect();
    all.sort_by(f64::total_cmp);
    let p99 = crate::stats::percentile(&all, 0.99);
    if p99 > TAIL_MS {
        return Verdict::TailOver { p99 };
    }
    Verdict::KeptUp
}

/// One rate the search offered, and how it went.
#[derive(Clone, Debug)]
pub struct SearchStep {
    pub offered: f64,
    pub p50: f64,
    pub p99: f64,
    pub verdict: Verdict,
}

/// The search for the highest sustained rate: ask [`RateSearch::next`] for
/// a rate, offer it, [`RateSearch::record`] the verdict, until `next` says
/// none is left; [`RateSearch::maximum`] is then the answer.
#[derive(Clone, Debug, Default)]
pub struct RateSearch {
    /// The highest rate sustained so far.
    sustained: Option<f64>,
    /// The lowest rate not sustained so far.
    failed: Option<f64>,
}

impl RateSearch {
    /// The next rate to offer, or `None` once the search is done.
    pub fn next(&self) -> Option<f64> {
        match (self.sustained, self.failed) {
            (None, None) => Some(FIRST_RATE),
            (Some(lo), None) => (lo < CEILING_RATE).then(|| (lo * 2.0).min(CEILING_RATE)),
            (None, Some(hi)) => (hi / 2.0 >= FLOOR_RATE).then_some(hi / 2.0),
            (Some(lo), Some(hi)) => (hi / lo > PRECISION).then(|| (lo * hi).sqrt()),
        }
    }

    pub fn record(&mut self, rate: f64, sustained: bool) {
        if sustained {
            self.sustained = Some(self.sustained.map_or(rate, |lo| lo.max(rate)));
        } else {
            self.failed = Some(self.failed.map_or(rate, |hi| hi.min(rate)));
        }
    }

    /// The highest rate sustained, once there is one.
    pub fn maximum(&self) -> Option<f64> {
        self.sustained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search against a pipeline that sustains up to `capacity`.
    fn search(capacity: f64) -> (Option<f64>, Vec<f64>) {
        let mut search = RateSearch::default();
        let mut offered = Vec::new();
        while let Some(rate) = search.next() {
            offered.push(rate);
            search.record(rate, rate <= capacity);
            assert!(offered.len() < 40, "the search must end");
        }
        (search.maximum(), offered)
    }

    #[test]
    fn doubles_then_narrows_to_within_ten_percent() {
        let (max, offered) = search(123_000.0);
        let max = max.expect("a sustained rate");
        assert!((123_000.0 / PRECISION..=123_000.0).contains(&max), "{max}");
        assert_eq!(&offered[..5], [10_000.0, 20_000.0, 40_000.0, 80_000.0, 160_000.0]);
        assert!(offered.len() <= 9, "{offered:?}");
    }

    #[test]
    fn halves_when_the_first_rate_is_too_high_and_gives_up_at_the_floor() {
        let (max, offered) = search(3_000.0);
        assert_eq!(&offered[..3], [10_000.0, 5_000.0, 2_500.0]);
        assert!(max.expect("sustained") >= 2_500.0);
        let (max, offered) = search(100.0);
        assert_eq!(max, None);
        assert_eq!(offered.last(), Some(&1_250.0));
    }

    #[test]
    fn stops_doubling_at_the_ceiling() {
        let (max, offered) = search(f64::INFINITY);
        assert_eq!(max, Some(CEILING_RATE));
        assert_eq!(offered.last(), Some(&CEILING_RATE));
    }

    /// Records every 10 ms of [0, 5000) whose latency is `ms(at)`.
    fn records(ms: impl Fn(i64) -> f64) -> Vec<(i64, f64)> {
        (0..500).map(|i| (i * 10, ms(i * 10))).collect()
    }

    #[test]
    fn a_step_keeps_up_when_latency_stays_flat_and_under_a_second() {
        let flat = records(|at| 30.0 + (at % 7) as f64);
        assert_eq!(judge(1000.0, 990.0, 0, 5000, &flat), Verdict::KeptUp);
        // A short stall is a tail, not a backlog.
        let stall = records(|at| if (2000..2300).contains(&at) { 400.0 } else { 30.0 });
        assert_eq!(judge(1000.0, 990.0, 0, 5000, &stall), Verdict::KeptUp);
    }

    #[test]
    fn a_step_whose_latency_grows_fell_behind() {
        // 10% over capacity: the backlog grows by 0.1 s every second.
        let growing = records(|at| 30.0 + at as f64 * 0.1);
        match judge(1000.0, 1000.0, 0, 5000, &growing) {
            Verdict::FellBehind { first_p50, last_p50 } => {
                assert!(first_p50 < 100.0 && last_p50 > 450.0, "{first_p50} {last_p50}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_step_fails_on_a_short_offer_missing_records_or_a_tail_over_a_second() {
        let flat = records(|_| 30.0);
        assert_eq!(
            judge(1000.0, 900.0, 0, 5000, &flat),
            Verdict::OfferedShort { achieved: 900.0 }
        );
        assert_eq!(judge(1000.0, 1000.0, 0, 5000, &[]), Verdict::NothingArrived);
        let early = records(|_| 30.0)
            .into_iter()
            .filter(|&(at, _)| at < 4000)
            .collect::<Vec<_>>();
        assert_eq!(judge(1000.0, 1000.0, 0, 5000, &early), Verdict::LastFifthMissing);
        // Nothing of the first fifth: the rest is judged by its tail.
        let late = records(|_| 30.0)
            .into_iter()
            .filter(|&(at, _)| at >= 1000)
            .collect::<Vec<_>>();
        assert_eq!(judge(1000.0, 1000.0, 0, 5000, &late), Verdict::KeptUp);
        let tail = records(|at| if at % 50 == 0 { 1500.0 } else { 30.0 });
        assert!(matches!(
            judge(1000.0, 1000.0, 0, 5000, &tail),
            Verdict::TailOver { .. }
        ));
    }
}
