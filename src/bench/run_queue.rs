//! Time each process's threads spent ready to run but waiting for a core,
//! next to the cores they used: on a box the processes oversubscribe, a
//! flush waits for Redis's one thread, and Redis for a core. Linux keeps
//! it per thread in /proc/PID/task/TID/schedstat (time on a core, time
//! waiting on a run queue, timeslices; nanoseconds), where the kernel has
//! `CONFIG_SCHED_INFO`; elsewhere it stays unknown.

/// Seconds the threads of `pid` have waited for a core, summed over the
/// threads that are alive now (an exited thread's waits go with it, which
/// a window over a few seconds of steady processes barely sees).
pub fn waited_secs_of(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut nanos = 0u64;
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(waited) = schedstat_wait_ns(&text) {
            nanos += waited;
            any = true;
        }
    }
    any.then(|| nanos as f64 / 1e9)
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
    fn this_process_has_waits_where_linux_keeps_them() {
        let waited = waited_secs_of(std::process::id());
        if std::path::Path::new("/proc/self/schedstat").exists() {
            assert!(waited.is_some_and(|w| w >= 0.0), "{waited:?}");
        } else {
            assert_eq!(waited, None);
        }
    }
}
