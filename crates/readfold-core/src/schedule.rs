//! When the processor flushes, snapshots, pauses and resumes: the policy of
//! its run loop as a state machine. The loop owns the I/O (the consumer,
//! the flush and snapshot tasks) and tells the schedule what happened; the
//! schedule answers with [`Action`]s and the instant the loop's timer waits
//! for ([`FlushSchedule::flush_at`]). Times are given, never read.
//!
//! - A first change waits `linger` for others to join its flush.
//! - One flush is in flight at a time; what arrives meanwhile goes into the
//!   next, which starts as that one commits, or, while the fold is behind
//!   its input, as [`CatchUpPacing`] says.
//! - Flushes that write anything start at least `min_interval` apart.
//! - A failed flush or snapshot is retried with [`Backoff`].
//! - With CQL on, snapshots run in a lane of their own, and flushes wait
//!   once the changelog is more than two snapshot intervals ahead of CQL.
//! - A dirty set over its bound holds the fold while a young flush is in
//!   flight ([`FlushSchedule::holding`]), and pauses the consumer otherwise.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::flush::over_bound;
use crate::pacing::CatchUpPacing;

/// The longest the fold holds for a flush it outran before the consumer
/// is paused instead: rebalances and `max.poll.interval.ms` wait while it
/// holds.
pub const MAX_HOLD: Duration = Duration::from_secs(5);

/// Producer recoveries in a row, with no commit between, before the
/// processor gives up: more means another process shares its
/// transactional id.
pub const MAX_PRODUCER_RECOVERIES: u32 = 3;

/// The schedule's settings (the processor's `flush` and `snapshot`
/// config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleConfig {
    pub linger: Duration,
    pub min_interval: Duration,
    pub catch_up_interval: Duration,
    pub catch_up_max_interval: Duration,
    /// The dirty set's soft bound (see [`over_bound`]).
    pub max_dirty: usize,
    /// `None` with CQL off: no snapshots, and flushes never wait for CQL.
    pub snapshot_interval: Option<Duration>,
    /// Offsets the input may be ahead with the fold still caught up.
    pub caught_up_lag: i64,
}

/// The processor as an event finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    pub now: Instant,
    /// Keys changed and not yet in a flush.
    pub dirty: usize,
    /// Whether a flush would write anything (changes, dead letters or
    /// offsets), with no partition's state damaged.
    pub pending: bool,
    /// Between a revoke and the next assignment: nothing is published.
    pub suspended: bool,
    /// When the flush in flight began, if one is.
    pub flushing_since: Option<Instant>,
    pub snapshotting: bool,
}

/// What the run loop does, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start a flush of everything pending (there is something).
    StartFlush,
    /// Start the next snapshot (CQL on).
    StartSnapshot,
    /// Pause the consumer: the dirty set is over its bound with no young
    /// flush to bring it down.
    Pause,
    Resume,
    /// The next flush waits until then for the fold to get further
    /// through a backlog.
    PaceCatchUp(Instant),
}

/// The scheduling state of one processor.
#[derive(Clone, Debug)]
pub struct FlushSchedule {
    config: ScheduleConfig,
    /// When the next flush starts, if none is in flight.
    flush_at: Option<Instant>,
    /// `flush_at` is a catch-up's wait, which ends early once the fold
    /// catches up.
    catching_up: bool,
    /// The fold found its input's end since the last flush began.
    caught_up: bool,
    /// Records taken since the last flush began: the fold's recent rate.
    taken_since_flush: u64,
    flush_began: Instant,
    /// When the last flush that wrote anything began: an empty one must
    /// not hold back the next real one.
    last_launched: Option<Instant>,
    pacing: CatchUpPacing,
    retry: Backoff,
    snapshot_retry: Backoff,
    next_snapshot: Instant,
    /// The start of the current snapshot pass.
    pass_began: Instant,
    /// The start of the last pass written whole: everything published
    /// before then is in CQL.
    cql_covered_at: Instant,
    paused: bool,
    recoveries: u32,
}

impl FlushSchedule {
    pub fn new(config: ScheduleConfig, now: Instant) -> Self {
        Self {
            pacing: CatchUpPacing::new(config.catch_up_interval, config.catch_up_max_interval),
            config,
            flush_at: None,
            catching_up: false,
            caught_up: false,
            taken_since_flush: 0,
            flush_began: now,
            last_launched: None,
            retry: Backoff::new(),
            snapshot_retry: Backoff::new(),
            next_snapshot: now,
            pass_began: now,
            cql_covered_at: now,
            paused: false,
            recoveries: 0,
        }
    }

    /// When the run loop's timer starts the next flush, if it waits for one.
    pub fn flush_at(&self) -> Option<Instant> {
        self.flush_at
    }

    /// Whether the wait for the next flush is a catch-up's.
    pub fn is_catching_up(&self) -> bool {
        self.catching_up
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Whether the fold stops taking records for now: its dirty set is
    /// over the bound while a young flush is in flight, whose commit starts
    /// the next with that set. Outrunning it only grows the set.
    pub fn holding(&self, status: &Status) -> bool {
        flight_is_young(status) && over_bound(status.dirty, self.config.max_dirty)
    }

    /// The fold took `records` off its queues.
    pub fn took(&mut self, records: u64) {
        self.taken_since_flush += records;
    }

    /// The fold found no record waiting. It has caught up only if the input
    /// holds no more either, so it asks for the `lag` (offsets still to
    /// take) unless it knows. Returns the lag, if it asked.
    pub fn drained(&mut self, lag: impl FnOnce() -> i64) -> Option<i64> {
        if self.caught_up {
            return None;
        }
        let lag = lag();
        self.caught_up = lag <= self.config.caught_up_lag;
        Some(lag)
    }

    /// After a turn that folded records: a catch-up that caught up
    /// flushes now, and a first change starts the linger.
    pub fn folded(&mut self, mut status: Status) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.catching_up && self.caught_up {
            self.pacing.caught_up();
            self.flush_when_due(&mut status, &mut actions);
        }
        if status.flushing_since.is_none() && self.flush_at.is_none() {
            self.flush_at = Some(status.now + self.config.linger);
        }
        self.backpressure(&mut status, &mut actions);
        actions
    }

    /// The timer for [`FlushSchedule::flush_at`] went off.
    pub fn flush_time(&mut self, mut status: Status) -> Vec<Action> {
        let mut actions = Vec::new();
        self.flush_when_due(&mut status, &mut actions);
        actions
    }

    /// The flush interval's tick: retries a failed flush (a lingering one
    /// starts on its own) and starts a snapshot that is due.
    pub fn tick(&mut self, mut status: Status) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.flush_at.is_none() {
            self.flush_when_due(&mut status, &mut actions);
        }
        self.snapshot_when_due(&status, &mut actions);
        actions
    }

    /// The flush in flight committed. `queued` says whether records wait
    /// on the fold's queue; `lag` is asked for as in
    /// [`FlushSchedule::drained`].
    pub fn flush_committed(
        &mut self,
        status: Status,
        queued: bool,
        lag: impl FnOnce() -> i64,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        self.retry.succeeded();
        self.recoveries = 0;
        if self.paused {
            self.paused = false;
            actions.push(Action::Resume);
        }
        self.after_flush(status, queued, lag, &mut actions);
        actions
    }

    /// The flush in flight failed for a reason that may pass (its changes
    /// are pending again). Returns how long until it is retried.
    pub fn flush_failed(
        &mut self,
        mut status: Status,
        queued: bool,
        lag: impl FnOnce() -> i64,
    ) -> (Duration, Vec<Action>) {
        let mut actions = Vec::new();
        let delay = self.retry.failed(status.now);
        self.backpressure(&mut status, &mut actions);
        self.after_flush(status, queued, lag, &mut actions);
        (delay, actions)
    }

    /// The flush in flight failed after the group changed under it (under
    /// the consumer protocol its group metadata is then stale, and the
    /// broker refuses its offsets): not a trouble that passes with time, so
    /// it is tried again as soon as a committed one would be, with the
    /// current metadata, and the backoff does not grow.
    pub fn flush_failed_over_rebalance(
        &mut self,
        mut status: Status,
        queued: bool,
        lag: impl FnOnce() -> i64,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        self.backpressure(&mut status, &mut actions);
        self.after_flush(status, queued, lag, &mut actions);
        actions
    }

    /// A transactional producer broke: whether to start over (drop what
    /// is not committed, rejoin, restore) rather than give up.
    pub fn producer_broke(&mut self) -> bool {
        self.recoveries += 1;
        self.recoveries <= MAX_PRODUCER_RECOVERIES
    }

    /// How many times in a row the producer broke.
    pub fn recoveries(&self) -> u32 {
        self.recoveries
    }

    /// The processor dropped its state and left the group to start over:
    /// nothing waits for a flush, and the consumer is no longer paused.
    pub fn started_over(&mut self) {
        self.flush_at = None;
        self.paused = false;
        self.retry.succeeded();
    }

    /// The group's assignment changed: a new one resumes paused partitions.
    pub fn group_changed(&mut self) {
        self.paused = false;
    }

    /// A snapshot began at `now`; `opens_pass` if it is the first share of a
    /// pass over the published keys.
    pub fn snapshot_began(&mut self, now: Instant, opens_pass: bool) {
        if opens_pass {
            self.pass_began = now;
        }
    }

    /// A snapshot was written (or had nothing to write). When it ended its
    /// pass, everything published before the pass began is in CQL, and the
    /// next pass starts one interval after this one began. The next share
    /// starts at once while the pass goes on or restored keys are owed.
    pub fn snapshot_written(&mut self, now: Instant, pass_done: bool, restored_owed: bool) {
        if pass_done {
            self.cql_covered_at = self.pass_began;
            self.next_snapshot = self.pass_began + self.config.snapshot_interval.unwrap_or_default();
        }
        if !pass_done || restored_owed {
            self.next_snapshot = now;
        }
    }

    /// The snapshot in flight was written (reported with
    /// [`FlushSchedule::snapshot_written`] first).
    pub fn snapshot_succeeded(&mut self, mut status: Status) -> Vec<Action> {
        let mut actions = Vec::new();
        self.snapshot_retry.succeeded();
        self.after_snapshot(&mut status, &mut actions);
        actions
    }

    /// The snapshot in flight failed for a reason that may pass. Returns
    /// how long until it is retried.
    pub fn snapshot_failed(&mut self, mut status: Status) -> (Duration, Vec<Action>) {
        let mut actions = Vec::new();
        let delay = self.snapshot_retry.failed(status.now);
        self.backpressure(&mut status, &mut actions);
        self.after_snapshot(&mut status, &mut actions);
        (delay, actions)
    }

    /// After a snapshot settled: flushes that waited for CQL may start, and
    /// the next share when due.
    fn after_snapshot(&mut self, status: &mut Status, actions: &mut Vec<Action>) {
        // A catch-up's wait is not for CQL, and goes on.
        if status.pending && !self.catching_up {
            self.flush_when_due(status, actions);
        }
        self.backpressure(status, actions);
        self.snapshot_when_due(status, actions);
    }

    /// With changes waiting after a flush settled: the next starts at once,
    /// unless the fold is behind its input (it has not once reached the
    /// input's end since that flush began); then it waits as
    /// [`CatchUpPacing`] says, or less, once the fold catches up.
    fn after_flush(
        &mut self,
        mut status: Status,
        queued: bool,
        lag: impl FnOnce() -> i64,
        actions: &mut Vec<Action>,
    ) {
        if status.pending {
            // The lag is asked for once: whether an empty queue is the
            // input's end, and if not, how long the fold needs to get there.
            let lag = if queued {
                (!self.caught_up).then(lag)
            } else {
                self.drained(lag)
            };
            let catch_up_in = lag
                .filter(|_| !self.caught_up)
                .and_then(|lag| self.catch_up_eta(lag, status.now));
            match self
                .pacing
                .after_commit(self.flush_began, status.now, self.caught_up, catch_up_in)
            {
                None => self.flush_when_due(&mut status, actions),
                Some(at) => {
                    self.flush_at = Some(at);
                    self.catching_up = true;
                    actions.push(Action::PaceCatchUp(at));
                }
            }
        }
        self.backpressure(&mut status, actions);
    }

    /// How long the fold needs to take `lag` more offsets at the rate it
    /// took records since the last flush began; `None` if it took none.
    fn catch_up_eta(&self, lag: i64, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.flush_began).as_secs_f64();
        if self.taken_since_flush == 0 || elapsed <= 0.0 {
            return None;
        }
        let rate = self.taken_since_flush as f64 / elapsed;
        Some(Duration::from_secs_f64(lag as f64 / rate))
    }

    fn flush_when_due(&mut self, status: &mut Status, actions: &mut Vec<Action>) {
        self.flush_when_ready(status, true, actions);
    }

    /// Starts a flush unless one is in flight or a recent failure or CQL
    /// asks to wait. `spaced` false is for a dirty set over its bound,
    /// which must not wait for `min_interval`; spaced, a flush starts no
    /// sooner than that after the last one that wrote anything began (every
    /// flush is a transaction: half a dozen requests, and a marker on each
    /// partition it writes).
    fn flush_when_ready(&mut self, status: &mut Status, spaced: bool, actions: &mut Vec<Action>) {
        self.flush_at = None;
        self.catching_up = false;
        let now = status.now;
        if status.flushing_since.is_some()
            || status.suspended
            || !self.retry.ready(now)
            || !self.cql_keeps_up(now)
        {
            return;
        }
        let earliest = self.last_launched.map(|began| began + self.config.min_interval);
        match earliest {
            Some(at) if spaced && at > now => self.flush_at = Some(at),
            _ => self.start_flush(status, actions),
        }
    }

    /// A flush begins now: with nothing pending it writes nothing and
    /// leaves no trace.
    fn start_flush(&mut self, status: &mut Status, actions: &mut Vec<Action>) {
        if !status.pending {
            return;
        }
        self.caught_up = false;
        self.taken_since_flush = 0;
        self.flush_began = status.now;
        self.last_launched = Some(status.now);
        status.flushing_since = Some(status.now);
        status.pending = false;
        status.dirty = 0;
        actions.push(Action::StartFlush);
    }

    /// Whether CQL keeps up closely enough for the changelog to go further.
    fn cql_keeps_up(&self, now: Instant) -> bool {
        self.config
            .snapshot_interval
            .is_none_or(|interval| now.saturating_duration_since(self.cql_covered_at) <= interval * 2)
    }

    /// Pauses the consumer when the dirty set is over its bound and no
    /// young flush is in flight to bring it down (flushes fail, wait for
    /// CQL, or take long). A flush that may start now brings it down
    /// without a pause.
    fn backpressure(&mut self, status: &mut Status, actions: &mut Vec<Action>) {
        if !over_bound(status.dirty, self.config.max_dirty) || self.paused || status.suspended {
            return;
        }
        if status.flushing_since.is_none() {
            self.flush_when_ready(status, false, actions);
        }
        if !flight_is_young(status) {
            self.paused = true;
            actions.push(Action::Pause);
        }
    }

    fn snapshot_when_due(&mut self, status: &Status, actions: &mut Vec<Action>) {
        let now = status.now;
        if self.config.snapshot_interval.is_some()
            && !status.snapshotting
            && !status.suspended
            && now >= self.next_snapshot
            && self.snapshot_retry.ready(now)
        {
            actions.push(Action::StartSnapshot);
        }
    }
}

fn flight_is_young(status: &Status) -> bool {
    status
        .flushing_since
        .is_some_and(|began| status.now.saturating_duration_since(began) < MAX_HOLD)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> ScheduleConfig {
        ScheduleConfig {
            linger: 5 * MS,
            min_interval: Duration::ZERO,
            catch_up_interval: 100 * MS,
            catch_up_max_interval: 1000 * MS,
            max_dirty: 10,
            snapshot_interval: None,
            caught_up_lag: 512,
        }
    }

    /// A processor seen by the schedule, driven by a virtual clock.
    struct Loop {
        schedule: FlushSchedule,
        status: Status,
        t0: Instant,
    }

    impl Loop {
        fn new(config: ScheduleConfig) -> Self {
            let t0 = Instant::now();
            Self {
                schedule: FlushSchedule::new(config, t0),
                status: Status {
                    now: t0,
                    dirty: 0,
                    pending: false,
                    suspended: false,
                    flushing_since: None,
                    snapshotting: false,
                },
                t0,
            }
        }

        fn at(&mut self, ms: u64) -> &mut Self {
            self.status.now = self.t0 + Duration::from_millis(ms);
            self
        }

        fn ms(&self, ms: u64) -> Instant {
            self.t0 + Duration::from_millis(ms)
        }

        /// Folds `dirty` changed keys (and offsets).
        fn fold(&mut self, dirty: usize) -> Vec<Action> {
            self.status.dirty += dirty;
            self.status.pending = true;
            let actions = self.schedule.folded(self.status);
            self.carry_out(&actions);
            actions
        }

        /// Does what the run loop does with `actions`.
        fn carry_out(&mut self, actions: &[Action]) {
            for action in actions {
                match action {
                    Action::StartFlush => {
                        assert!(self.status.flushing_since.is_none(), "one flush at a time");
                        self.status.flushing_since = Some(self.status.now);
                        self.status.dirty = 0;
                        self.status.pending = false;
                    }
                    Action::StartSnapshot => self.status.snapshotting = true,
                    _ => {}
                }
            }
        }

        fn timer(&mut self) -> Vec<Action> {
            let actions = self.schedule.flush_time(self.status);
            self.carry_out(&actions);
            actions
        }

        fn tick(&mut self) -> Vec<Action> {
            let actions = self.schedule.tick(self.status);
            self.carry_out(&actions);
            actions
        }

        fn committed(&mut self, queued: bool, lag: i64) -> Vec<Action> {
            self.status.flushing_since = None;
            let actions = self.schedule.flush_committed(self.status, queued, || lag);
            self.carry_out(&actions);
            actions
        }

        /// The flush in flight failed: its keys are dirty again.
        fn failed(&mut self, dirty: usize) -> (Duration, Vec<Action>) {
            self.status.flushing_since = None;
            self.status.dirty += dirty;
            self.status.pending = true;
            let (delay, actions) = self.schedule.flush_failed(self.status, false, || 0);
            self.carry_out(&actions);
            (delay, actions)
        }
    }

    #[test]
    fn a_first_change_lingers_then_flushes() {
        let mut l = Loop::new(config());
        assert_eq!(l.at(0).fold(1), []);
        assert_eq!(l.schedule.flush_at(), Some(l.ms(5)));
        // More changes join; the linger does not start again.
        assert_eq!(l.at(3).fold(1), []);
        assert_eq!(l.schedule.flush_at(), Some(l.ms(5)));
        assert_eq!(l.at(5).timer(), [Action::StartFlush]);
        assert_eq!(l.schedule.flush_at(), None);
        // A change during the flush waits for its commit, not a linger.
        assert_eq!(l.at(7).fold(1), []);
        assert_eq!(l.schedule.flush_at(), None);
        assert_eq!(l.at(20).committed(false, 0), [Action::StartFlush]);
    }

    #[test]
    fn nothing_pending_starts_nothing_and_holds_nothing_back() {
        let mut l = Loop::new(ScheduleConfig {
            min_interval: 50 * MS,
            ..config()
        });
        // The interval's tick with nothing to write.
        assert_eq!(l.at(0).tick(), []);
        // It does not count as a flush for min_interval.
        l.at(1).fold(1);
        assert_eq!(l.at(6).timer(), [Action::StartFlush]);
    }

    #[test]
    fn flushes_that_write_start_min_interval_apart() {
        let mut l = Loop::new(ScheduleConfig {
            min_interval: 50 * MS,
            ..config()
        });
        l.at(0).fold(1);
        assert_eq!(l.at(5).timer(), [Action::StartFlush]);
        l.at(10).fold(1);
        // Committed at 20 with changes waiting: not before 55.
        assert_eq!(l.at(20).committed(false, 0), []);
        assert_eq!(l.schedule.flush_at(), Some(l.ms(55)));
        assert_eq!(l.at(55).timer(), [Action::StartFlush]);
    }

    #[test]
    fn a_dirty_set_over_its_bound_does_not_wait_for_min_interval() {
        let mut l = Loop::new(ScheduleConfig {
            min_interval: 50 * MS,
            ..config()
        });
        l.at(0).fold(1);
        assert_eq!(l.at(5).timer(), [Action::StartFlush]);
        l.at(10).fold(39);
        assert_eq!(l.at(20).committed(false, 0), []);
        // 40 keys is the bound (4 x max_dirty): flush now, not at 55.
        assert_eq!(l.at(21).fold(1), [Action::StartFlush]);
    }

    #[test]
    fn a_failed_flush_is_retried_with_backoff() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        let (delay, actions) = l.at(10).failed(1);
        assert_eq!((delay, actions), (100 * MS, vec![]));
        // Neither the tick nor more changes start it before the delay.
        assert_eq!(l.at(50).tick(), []);
        assert_eq!(l.at(60).fold(1), []);
        assert_eq!(l.at(65).timer(), []);
        assert_eq!(l.at(110).tick(), [Action::StartFlush]);
        let (delay, _) = l.at(120).failed(2);
        assert_eq!(delay, 200 * MS);
        assert_eq!(l.at(320).tick(), [Action::StartFlush]);
        // A commit resets the backoff.
        l.at(330).committed(false, 0);
        l.at(340).fold(1);
        assert_eq!(l.at(345).timer(), [Action::StartFlush]);
        let (delay, _) = l.at(350).failed(1);
        assert_eq!(delay, 100 * MS);
    }

    #[test]
    fn a_flush_failed_over_a_rebalance_is_retried_at_once() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        l.status.flushing_since = None;
        l.status.dirty += 1;
        l.status.pending = true;
        let status = l.at(10).status;
        let actions = l.schedule.flush_failed_over_rebalance(status, false, || 0);
        assert_eq!(actions, [Action::StartFlush]);
        // A later failure of the broker's still backs off from the first delay.
        l.carry_out(&actions);
        let (delay, _) = l.at(20).failed(1);
        assert_eq!(delay, 100 * MS);
    }

    #[test]
    fn the_fold_holds_for_a_young_flush_and_pauses_without_one() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        // Over the bound with a young flush in flight: hold, don't pause.
        assert_eq!(l.at(6).fold(40), []);
        assert!(l.schedule.holding(&l.status));
        // The flush grows old: no longer held; the consumer pauses.
        l.at(5 + MAX_HOLD.as_millis() as u64);
        assert!(!l.schedule.holding(&l.status));
        assert_eq!(l.fold(0), [Action::Pause]);
        assert!(l.schedule.is_paused());
        // Its commit resumes, and the next flush takes the set at once.
        let now = 6 + MAX_HOLD.as_millis() as u64;
        assert_eq!(
            l.at(now).committed(false, 0),
            [Action::Resume, Action::StartFlush]
        );
        assert!(!l.schedule.holding(&l.status));
    }

    #[test]
    fn failures_that_let_the_set_grow_pause_the_consumer_until_a_commit() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        // The flush fails with the set over its bound, and no flush may
        // start during the backoff: pause.
        let (_, actions) = l.at(10).failed(40);
        assert_eq!(actions, [Action::Pause]);
        // Paused once, not again; the linger's end finds the backoff.
        assert_eq!(l.at(20).fold(0), []);
        assert_eq!(l.at(25).timer(), []);
        assert_eq!(l.at(110).tick(), [Action::StartFlush]);
        assert_eq!(l.at(120).committed(false, 0), [Action::Resume]);
        assert!(!l.schedule.is_paused());
    }

    #[test]
    fn a_new_assignment_unpauses() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        l.at(10).failed(40);
        assert!(l.schedule.is_paused());
        l.schedule.group_changed();
        assert!(!l.schedule.is_paused());
    }

    #[test]
    fn behind_a_backlog_the_next_flush_waits_until_the_fold_catches_up() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        assert_eq!(l.at(5).timer(), [Action::StartFlush]);
        // The fold took 1,000 records during the flush and 1M are left:
        // it will not catch up within max, so the age rule: base.
        l.schedule.took(1000);
        l.at(10).fold(10);
        let actions = l.at(55).committed(true, 1_000_000);
        assert_eq!(actions, [Action::PaceCatchUp(l.ms(105))]);
        assert!(l.schedule.is_catching_up());
        // Folding on, still behind: no flush.
        assert_eq!(l.at(60).fold(1), []);
        // The fold reaches the input's end: the flush starts at once.
        assert_eq!(l.schedule.drained(|| 10), Some(10));
        assert_eq!(l.at(70).fold(1), [Action::StartFlush]);
        assert!(!l.schedule.is_catching_up());
    }

    #[test]
    fn a_backlog_folded_within_max_waits_for_max_or_the_catch_up() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        // 10,000 records in 50 ms: the 20,000 left take 100 ms more.
        l.schedule.took(10_000);
        l.at(10).fold(10);
        let actions = l.at(55).committed(true, 20_000);
        assert_eq!(actions, [Action::PaceCatchUp(l.ms(1005))]);
        // The timer ends the wait if the fold never catches up.
        assert_eq!(l.at(1005).timer(), [Action::StartFlush]);
    }

    #[test]
    fn a_queue_found_empty_at_the_inputs_end_flushes_at_once() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        l.at(10).fold(1);
        // Nothing queued and the input's lag within a batch: caught up.
        assert_eq!(l.at(20).committed(false, 3), [Action::StartFlush]);
    }

    #[test]
    fn the_lag_is_asked_for_only_when_it_matters() {
        let mut l = Loop::new(config());
        assert_eq!(l.schedule.drained(|| 0), Some(0));
        // Caught up since the last flush began: not asked again.
        assert_eq!(l.schedule.drained(|| panic!("asked")), None);
        l.at(0).fold(1);
        l.at(5).timer();
        assert_eq!(l.schedule.drained(|| 7), Some(7));
    }

    #[test]
    fn a_suspended_processor_starts_nothing() {
        let mut l = Loop::new(ScheduleConfig {
            snapshot_interval: Some(1000 * MS),
            ..config()
        });
        l.status.suspended = true;
        l.at(0).fold(100);
        assert_eq!(l.at(5).timer(), []);
        assert_eq!(l.at(10).tick(), []);
        assert!(!l.schedule.is_paused());
    }

    #[test]
    fn snapshots_run_a_pass_per_interval_and_owed_shares_back_to_back() {
        let mut l = Loop::new(ScheduleConfig {
            snapshot_interval: Some(1000 * MS),
            ..config()
        });
        assert_eq!(l.at(0).tick(), [Action::StartSnapshot]);
        l.schedule.snapshot_began(l.ms(0), true);
        // A share of a pass that goes on: the next at once.
        l.schedule.snapshot_written(l.ms(100), false, false);
        l.at(100).status.snapshotting = false;
        assert_eq!(l.schedule.snapshot_succeeded(l.status), [Action::StartSnapshot]);
        // The pass ends: the next one interval after it began.
        l.schedule.snapshot_written(l.ms(200), true, false);
        l.at(200).status.snapshotting = false;
        assert_eq!(l.schedule.snapshot_succeeded(l.status), []);
        assert_eq!(l.at(999).tick(), []);
        assert_eq!(l.at(1000).tick(), [Action::StartSnapshot]);
        // Restored keys still owed go out back to back.
        l.schedule.snapshot_began(l.ms(1000), true);
        l.schedule.snapshot_written(l.ms(1100), true, true);
        l.at(1100).status.snapshotting = false;
        assert_eq!(l.schedule.snapshot_succeeded(l.status), [Action::StartSnapshot]);
    }

    #[test]
    fn flushes_wait_once_the_changelog_is_two_intervals_ahead_of_cql() {
        let mut l = Loop::new(ScheduleConfig {
            snapshot_interval: Some(1000 * MS),
            ..config()
        });
        l.at(0).tick();
        l.schedule.snapshot_began(l.ms(0), true);
        l.status.snapshotting = false;
        // Snapshots keep failing.
        l.at(10);
        let (delay, _) = l.schedule.snapshot_failed(l.status);
        assert_eq!(delay, 100 * MS);
        l.at(1000).fold(1);
        assert_eq!(l.at(1005).timer(), [Action::StartFlush]);
        l.at(1010).committed(false, 0);
        // Past 2 s without a whole pass: the changelog waits for CQL.
        l.at(2001).fold(1);
        assert_eq!(l.at(2006).timer(), []);
        assert_eq!(l.at(2010).tick(), [Action::StartSnapshot]);
        l.schedule.snapshot_began(l.ms(2010), true);
        l.schedule.snapshot_written(l.ms(2100), true, false);
        l.at(2100).status.snapshotting = false;
        // The pass that began at 2010 covers what waited: it goes now.
        assert_eq!(l.schedule.snapshot_succeeded(l.status), [Action::StartFlush]);
    }

    #[test]
    fn a_catch_ups_wait_survives_a_snapshot() {
        let mut l = Loop::new(ScheduleConfig {
            snapshot_interval: Some(1000 * MS),
            ..config()
        });
        l.at(0).fold(1);
        l.at(5).timer();
        l.schedule.took(1000);
        l.at(10).fold(10);
        assert!(matches!(
            l.at(55).committed(true, 1_000_000)[..],
            [Action::PaceCatchUp(_)]
        ));
        l.schedule.snapshot_began(l.ms(0), true);
        l.schedule.snapshot_written(l.ms(60), true, false);
        l.at(60);
        assert_eq!(l.schedule.snapshot_succeeded(l.status), []);
        assert_eq!(l.schedule.flush_at(), Some(l.ms(105)));
    }

    #[test]
    fn a_broken_producer_is_recovered_three_times_in_a_row_at_most() {
        let mut l = Loop::new(config());
        for _ in 0..MAX_PRODUCER_RECOVERIES {
            assert!(l.schedule.producer_broke());
            l.schedule.started_over();
        }
        assert!(!l.schedule.producer_broke());
        // A commit between breaks starts the count again.
        let mut l = Loop::new(config());
        assert!(l.schedule.producer_broke());
        l.at(0).fold(1);
        l.at(5).timer();
        l.at(10).committed(false, 0);
        assert_eq!(l.schedule.recoveries(), 0);
    }

    #[test]
    fn starting_over_forgets_the_wait_the_pause_and_the_backoff() {
        let mut l = Loop::new(config());
        l.at(0).fold(1);
        l.at(5).timer();
        l.at(10).failed(40);
        assert!(l.schedule.is_paused());
        l.schedule.started_over();
        assert!(!l.schedule.is_paused());
        assert_eq!(l.schedule.flush_at(), None);
        // No backoff left: the first change after flushes after its linger.
        l.status.dirty = 0;
        l.at(11).fold(1);
        assert_eq!(l.at(16).timer(), [Action::StartFlush]);
    }
}
