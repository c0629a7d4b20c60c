//! Retry policy: capped exponential backoff, shared by flushes and by
//! connections that fail at start.

use std::time::{Duration, Instant};

/// First delay after a failure.
pub const BASE_DELAY: Duration = Duration::from_millis(100);
/// Longest delay between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(10);

/// The delay after `failures` consecutive failures: 100 ms, 200 ms, ...
/// up to 10 s. Zero failures: no delay.
pub fn delay(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (failures - 1).min(7);
    (BASE_DELAY * factor).min(MAX_DELAY)
}

/// Consecutive failures of one operation and when it may be tried again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
    not_before: Option<Instant>,
}

impl Backoff {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether an attempt may be made at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }

    /// Records a failure at `now`; returns the delay before the next attempt.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = delay(self.failures);
        self.not_before = Some(now + wait);
        wait
    }

    /// Records a success: the next failure starts from the first delay again.
    pub fn succeeded(&mut self) {
        *self = Self::default();
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(delay(1), Duration::from_millis(100));
        assert_eq!(delay(2), Duration::from_millis(200));
        assert_eq!(delay(5), Duration::from_millis(1600));
        assert_eq!(delay(50), Duration::from_secs(10));
    }

    #[test]
    fn waits_after_failures_and_resets_on_success() {
        let t0 = Instant::now();
        let mut b = Backoff::new();
        assert!(b.ready(t0));
        assert_eq!(b.failed(t0), Duration::from_millis(100));
        assert!(!b.ready(t0 + Duration::from_millis(99)));
        assert!(b.ready(t0 + Duration::from_millis(100)));
        assert_eq!(b.failed(t0), Duration::from_millis(200));
        assert_eq!(b.failures(), 2);
        b.succeeded();
        assert!(b.ready(t0));
        assert_eq!(b.failed(t0), Duration::from_millis(100));
    }
}
