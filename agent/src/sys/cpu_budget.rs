//! A thread's CPU budget: at most a share of one core over each window of
//! wall time, read from the thread's own CPU clock. A realtime thread that
//! keeps to it cannot starve the node, however much work arrives.

use std::time::{Duration, Instant};

/// The calling thread's CPU time so far (user and system).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, valid for its size.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// At most `budget` of CPU time in each `window` of wall time.
#[derive(Debug)]
pub(crate) struct CpuBudget {
    window: Duration,
    budget: Duration,
    /// When the current window began, and the CPU time then.
    start: Instant,
    cpu_at_start: Duration,
}

impl CpuBudget {
    pub(crate) fn new(window: Duration, budget: Duration, now: Instant, cpu: Duration) -> Self {
        Self {
            window,
            budget,
            start: now,
            cpu_at_start: cpu,
        }
    }

    /// With the thread's CPU time `cpu` at `now`: how long it must pause
    /// if this window's budget is spent (the rest of the window; the next
    /// one begins when the pause ends), else None.
    pub(crate) fn pause(&mut self, now: Instant, cpu: Duration) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= self.window {
            self.start = now;
            self.cpu_at_start = cpu;
            return None;
        }
        if cpu.saturating_sub(self.cpu_at_start) < self.budget {
            return None;
        }
        let rest = self.window - elapsed;
        self.start = now + rest;
        self.cpu_at_start = cpu;
        Some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_spent_budget_pauses_for_the_rest_of_the_window() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(1000 * MS, 40 * MS, t0, 5 * MS);
        assert_eq!(b.pause(t0 + 100 * MS, 44 * MS), None);
        assert_eq!(b.pause(t0 + 300 * MS, 45 * MS), Some(700 * MS));
        // The next window begins after the pause, with a fresh budget.
        assert_eq!(b.pause(t0 + 1000 * MS, 45 * MS), None);
        assert_eq!(b.pause(t0 + 1500 * MS, 84 * MS), None);
        assert_eq!(b.pause(t0 + 1600 * MS, 85 * MS), Some(400 * MS));
    }

    #[test]
    fn an_idle_window_starts_the_next_fresh() {
        let t0 = Instant::now();
        let mut b = CpuBudget::new(1000 * MS, 40 * MS, t0, Duration::ZERO);
        assert_eq!(b.pause(t0 + 5000 * MS, 30 * MS), None);
        // 30 ms were used before this window: they do not count in it.
        assert_eq!(b.pause(t0 + 5100 * MS, 60 * MS), None);
        assert_eq!(b.pause(t0 + 5200 * MS, 70 * MS), Some(800 * MS));
    }

    #[test]
    fn the_thread_clock_counts_this_threads_work() {
        let before = thread_cpu_time();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < 20 * MS {
            x = x.wrapping_mul(31).wrapping_add(1);
            std::hint::black_box(x);
        }
        // Busy for 20 ms of wall time: most of it on this thread's clock
        // (a loaded machine may have taken the CPU away for some of it).
        assert!(thread_cpu_time() - before >= 5 * MS);
    }
}
