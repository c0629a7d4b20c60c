//! What the processor tells readiness probes about itself: whether its run
//! loop has started, how many partitions it owns and is still restoring,
//! and whether its flushes commit. Shared atomics, written by the run loop
//! and read by the ops listener on another task.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// The processor's own part of readiness (the stores are probed apart).
#[derive(Debug, Default)]
pub struct Health {
    running: AtomicBool,
    joined: AtomicBool,
    owned: AtomicUsize,
    restoring: AtomicUsize,
    failed_flushes: AtomicU32,
}

/// One reading of [`Health`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthReading {
    /// The run loop has subscribed and is consuming.
    pub running: bool,
    /// The group has given this member its first assignment (possibly of
    /// no partitions: more members than partitions).
    pub joined: bool,
    /// Partitions with state (restored).
    pub owned: usize,
    /// Partitions being restored, or assigned and waiting for a restore.
    pub restoring: usize,
    /// Flushes that failed in a row since the last one that committed.
    pub failed_flushes: u32,
}

/// Failed flushes in a row from which the processor reports itself not
/// ready: one failure is a blip the retry absorbs; this many is an outage.
pub const FAILED_FLUSHES_NOT_READY: u32 = 3;

impl HealthReading {
    /// Whether the processor is ready: running, in the group, every
    /// assigned partition restored, and flushes committing.
    pub fn is_ready(&self) -> bool {
        self.running && self.joined && self.restoring == 0 && self.failed_flushes < FAILED_FLUSHES_NOT_READY
    }
}

impl Health {
    pub fn read(&self) -> HealthReading {
        HealthReading {
            running: self.running.load(Ordering::Relaxed),
            joined: self.joined.load(Ordering::Relaxed),
            owned: self.owned.load(Ordering::Relaxed),
            restoring: self.restoring.load(Ordering::Relaxed),
            failed_flushes: self.failed_flushes.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn set_running(&self, on: bool) {
        self.running.store(on, Ordering::Relaxed);
    }

    pub(crate) fn has_joined(&self) -> bool {
        self.joined.load(Ordering::Relaxed)
    }

    pub(crate) fn joined(&self) {
        self.joined.store(true, Ordering::Relaxed);
    }

    pub(crate) fn set_partitions(&self, owned: usize, restoring: usize) {
        self.owned.store(owned, Ordering::Relaxed);
        self.restoring.store(restoring, Ordering::Relaxed);
    }

    pub(crate) fn flush_outcome(&self, committed: bool) {
        if committed {
            self.failed_flushes.store(0, Ordering::Relaxed);
        } else {
            self.failed_flushes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_running_with_everything_restored_and_flushes_committing() {
        let health = Health::default();
        assert!(!health.read().is_ready(), "not before the run loop starts");
        health.set_running(true);
        assert!(
            !health.read().is_ready(),
            "not before the group assigned partitions"
        );
        health.joined();
        assert!(health.read().is_ready(), "a member with no partitions is ready");
        health.set_partitions(2, 1);
        assert!(!health.read().is_ready(), "a partition is restoring");
        health.set_partitions(3, 0);
        assert!(health.read().is_ready());
        for _ in 0..FAILED_FLUSHES_NOT_READY - 1 {
            health.flush_outcome(false);
        }
        assert!(health.read().is_ready(), "a few failures are retried");
        health.flush_outcome(false);
        assert!(!health.read().is_ready(), "flushes keep failing");
        health.flush_outcome(true);
        assert!(health.read().is_ready());
    }
}
