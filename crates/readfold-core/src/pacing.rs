//! Flush pacing behind a backlog: how long a catch-up's next flush waits.
//!
//! Every flush pays fixed costs (a Kafka transaction, Redis script calls for
//! every changed conversation) and publishes each key it carries once, however
//! often the fold changed it meanwhile. Behind a backlog nobody is waiting
//! for any value but the last, so fewer, larger flushes get through it
//! sooner. But a short burst should not hold a change back for long.
//!
//! So the wait grows with how long the fold has been behind: the next flush
//! starts once `max(base, behind for)` has passed since the last began, at
//! most `max`. A change already waits at least as long as the backlog has
//! lasted, so this at most doubles its delay, while a long catch-up runs at
//! `max`. Once the fold catches up the wait starts again from `base`.
//!
//! A backlog the fold will have folded before `max` has passed needs no
//! flush before then: every key it carried would be published again right
//! after. So when the fold's recent rate says it catches up within that
//! window, the wait is `max`, which ends as soon as it does catch up. A
//! change then waits for the rest of the backlog, never longer than `max`
//! after the last flush began.

use std::time::{Duration, Instant};

/// The catch-up pacing of one processor. Times are given, never read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatchUpPacing {
    base: Duration,
    max: Duration,
    /// When the flush began during which the fold was first found behind,
    /// with no catching up since.
    behind_since: Option<Instant>,
}

impl CatchUpPacing {
    /// A `base` of zero turns pacing off: the next flush always starts as
    /// the last commits. `max` below `base` is taken as `base`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            behind_since: None,
        }
    }

    /// A flush that began at `began` committed at `now`, with changes
    /// waiting, the fold behind its input (`caught_up` false) or not, and
    /// if behind, how long it needs to catch up at its recent rate
    /// (`catch_up_in`, if known). When the next flush starts: `None` for at
    /// once. The caller starts it sooner once the fold catches up.
    pub fn after_commit(
        &mut self,
        began: Instant,
        now: Instant,
        caught_up: bool,
        catch_up_in: Option<Duration>,
    ) -> Option<Instant> {
        if caught_up || self.base.is_zero() {
            self.behind_since = None;
            return None;
        }
        let since = *self.behind_since.get_or_insert(began);
        let latest = began + self.max;
        if catch_up_in.is_some_and(|eta| now + eta <= latest) {
            return Some(latest);
        }
        let wait = now.saturating_duration_since(since).clamp(self.base, self.max);
        Some(began + wait)
    }

    /// The fold caught up with its input: the next backlog starts from
    /// `base` again.
    pub fn caught_up(&mut self) {
        self.behind_since = None;
    }

    /// Whether the fold has been behind since a flush began.
    pub fn is_behind(&self) -> bool {
        self.behind_since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn pacing() -> CatchUpPacing {
        CatchUpPacing::new(100 * MS, 1000 * MS)
    }

    #[test]
    fn a_fold_that_caught_up_flushes_at_once() {
        let t = Instant::now();
        assert_eq!(pacing().after_commit(t, t + 30 * MS, true, None), None);
    }

    #[test]
    fn zero_base_turns_pacing_off() {
        let t = Instant::now();
        let mut p = CatchUpPacing::new(Duration::ZERO, 1000 * MS);
        assert_eq!(p.after_commit(t, t + 30 * MS, false, None), None);
        assert!(!p.is_behind());
    }

    #[test]
    fn the_wait_grows_with_the_backlogs_age_up_to_max() {
        let t = Instant::now();
        let mut p = pacing();
        // Behind for 30 ms: the base.
        assert_eq!(p.after_commit(t, t + 30 * MS, false, None), Some(t + 100 * MS));
        // Behind since t, now 400 ms later: the flush that began at 100
        // waits 400 ms from its start.
        let began = t + 100 * MS;
        assert_eq!(
            p.after_commit(began, t + 400 * MS, false, None),
            Some(began + 400 * MS)
        );
        // Long behind: at most max after the last began.
        let began = t + 5000 * MS;
        assert_eq!(
            p.after_commit(began, t + 5100 * MS, false, None),
            Some(began + 1000 * MS)
        );
    }

    #[test]
    fn catching_up_starts_again_from_base() {
        let t = Instant::now();
        let mut p = pacing();
        p.after_commit(t, t + 900 * MS, false, None);
        assert!(p.is_behind());
        p.caught_up();
        assert!(!p.is_behind());
        let began = t + 2000 * MS;
        assert_eq!(
            p.after_commit(began, began + 10 * MS, false, None),
            Some(began + 100 * MS)
        );
        // A commit that finds the fold caught up resets it too.
        p.after_commit(began + 3000 * MS, began + 3900 * MS, false, None);
        assert_eq!(
            p.after_commit(began + 4000 * MS, began + 4010 * MS, true, None),
            None
        );
        assert!(!p.is_behind());
    }

    #[test]
    fn a_backlog_folded_within_max_waits_for_the_fold() {
        let t = Instant::now();
        let mut p = pacing();
        // A flush of 50 ms behind a backlog the fold needs 600 ms more
        // for: no flush before max (the caller starts one at catch-up).
        assert_eq!(
            p.after_commit(t, t + 50 * MS, false, Some(600 * MS)),
            Some(t + 1000 * MS)
        );
        // Exactly at max still counts.
        assert_eq!(
            p.after_commit(t, t + 50 * MS, false, Some(950 * MS)),
            Some(t + 1000 * MS)
        );
        // A backlog longer than that: the age rule.
        assert_eq!(
            p.after_commit(t, t + 50 * MS, false, Some(951 * MS)),
            Some(t + 100 * MS)
        );
        // Caught up: at once, whatever the estimate.
        assert_eq!(p.after_commit(t, t + 50 * MS, true, Some(MS)), None);
        // Pacing off stays off.
        let mut off = CatchUpPacing::new(Duration::ZERO, 1000 * MS);
        assert_eq!(off.after_commit(t, t + 50 * MS, false, Some(MS)), None);
    }

    #[test]
    fn max_below_base_is_base() {
        let t = Instant::now();
        let mut p = CatchUpPacing::new(100 * MS, 10 * MS);
        assert_eq!(p.after_commit(t, t + 5000 * MS, false, None), Some(t + 100 * MS));
    }
}
