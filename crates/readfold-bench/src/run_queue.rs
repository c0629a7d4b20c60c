//! Time each process's threads spent ready to run but waiting for a core,
//! next to the cores they used: on a box the processes oversubscribe, a
//! flush waits for Redis's one thread, and Redis for a core. Linux keeps
//! it per thread in /proc/PID/task/TID/schedstat (time on a core, time
//! waiting on a run queue, timeslices; nanoseconds), where the kernel has
//! `CONFIG_SCHED_INFO`; elsewhere it stays unknown.

use std::collections::HashMap;

/// The run-queue wait so far of each thread of a process, in ns, by
/// thread id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadWaits(HashMap<u32, u64>);

impl ThreadWaits {
    /// The waits of the threads of `pid` alive now; None where Linux does
    /// not keep them (or the process is gone).
    pub fn of(pid: u32) -> Option<ThreadWaits> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let waits: HashMap<u32, u64> = tasks
            .flatten()
            .filter_map(|task| {
                let tid = task.file_name().to_str()?.parse().ok()?;
                let text = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
                Some((tid, schedstat_wait_ns(&text)?))
            })
            .collect();
        (!waits.is_empty()).then_some(ThreadWaits(waits))
    }

    /// Seconds waited since `earlier`: what each thread alive now waited
    /// since then, a thread that started meanwhile counted whole. A thread
    /// that ended meanwhile takes its share of the window with it; Java
    /// servers retire pool threads, and summing totals instead would take
    /// all its waits off the window.
    pub fn since(&self, earlier: &ThreadWaits) -> f64 {
        let nanos: u64 = self
            .0
            .iter()
            .map(|(tid, &now)| now.saturating_sub(earlier.0.get(tid).copied().unwrap_or(0)))
            .sum();
        nanos as f64 / 1e9
    }
}

/// The run-queue wait (the second field) of a schedstat line:
/// "<on a core> <waiting> <timeslices>".
fn schedstat_wait_ns(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_the_second_schedstat_field() {
        assert_eq!(schedstat_wait_ns("81236477 5120332 214\n"), Some(5_120_332));
        assert_eq!(schedstat_wait_ns("81236477"), None);
        assert_eq!(schedstat_wait_ns(""), None);
    }

    #[test]
    fn a_window_counts_each_threads_growth_and_new_threads_whole() {
        let waits = |pairs: &[(u32, u64)]| ThreadWaits(pairs.iter().copied().collect());
        let before = waits(&[(1, 1_000_000_000), (2, 500_000_000), (3, 9_000_000_000)]);
        // Thread 3 ended, thread 4 started: 0.25 + 0.5 + 0.125 s.
        let after = waits(&[(1, 1_250_000_000), (2, 1_000_000_000), (4, 125_000_000)]);
        assert_eq!(after.since(&before), 0.875);
        assert_eq!(before.since(&before), 0.0);
    }

    #[test]
    fn this_process_has_waits_where_linux_keeps_them() {
        let waited = ThreadWaits::of(std::process::id());
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(waited.is_some_and(|w| w.0.contains_key(&std::process::id())));
        } else {
            assert_eq!(waited, None);
        }
    }
}
