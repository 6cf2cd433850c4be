//! The conntrack marker: the agent's side of the programs' requests to make
//! a fast-path TCP flow's entry liberal (`conntrack.rs` builds the
//! ctnetlink update; `ct.rs` in the eBPF crate asks).
//!
//! Two threads, each reading a ring buffer of its own, each within a CPU
//! budget per [`WINDOW`]:
//! - `weft-ct-bulk` reads `WEFT_CT_REQUESTS`: flows that asked with a GSO
//!   packet, which only a bulk flow sends. Such a flow waits on the host
//!   stack for the answer, so the thread runs realtime (on a node busy with
//!   traffic a normal thread was measured waking 1 to 3 ms after a
//!   request, a realtime one in about 0.1 ms). Past [`BULK`]'s realtime
//!   share of a window it goes on as a normal thread, and past its whole
//!   share it pauses, until the window ends: a pod opening bulk flows by
//!   the thousand cannot take a CPU from the node.
//! - `weft-ct-earned` reads `WEFT_CT_EARNED`: flows that earned the marking
//!   by lasting 10 ms. A flood of short connections asks here, if at all;
//!   the thread is a normal one and pauses past [`EARNED`]'s share. Its
//!   flows have waited 10 ms already and are none the worse for a little
//!   more.
//!
//! A pause or a full ring delays a marking, never loses one for good: the
//! flow stays on the stack, which keeps conntrack true, and asks again.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use dataplane_common::{CtRequest, map_names};

use super::conntrack::{LiberalStats, describe, liberal_update};
use crate::sys::bpffs::PinDir;
use crate::sys::nfnetlink::{Socket, is_enoent};

/// What a marker thread may spend of each window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// CPU it may spend realtime (zero: a normal thread throughout).
    pub(crate) realtime: Duration,
    /// CPU it may spend in all; then it pauses until the window ends.
    pub(crate) all: Duration,
}

/// The window budgets are counted in: a pause lasts less than this.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);

/// The bulk thread: realtime for 4% of a core, then normal up to 10%
/// (a marking takes tens of microseconds: some 2,000 bulk flows a second
/// realtime, 5,000 in all).
pub(crate) const BULK: Budget = Budget {
    realtime: Duration::from_millis(4),
    all: Duration::from_millis(10),
};

/// The earned thread: a normal one, up to 5% of a core.
pub(crate) const EARNED: Budget = Budget {
    realtime: Duration::ZERO,
    all: Duration::from_millis(5),
};

/// How a thread runs for the rest of a window, given the CPU it has used
/// in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Realtime,
    Normal,
    Pause,
}

impl Budget {
    pub(crate) fn mode(&self, used: Duration) -> Mode {
        if used >= self.all {
            Mode::Pause
        } else if used < self.realtime {
            Mode::Realtime
        } else {
            Mode::Normal
        }
    }
}

/// Answers the programs' requests from the pinned ring buffers under
/// `pins`, on two threads of its own (in this thread's network namespace,
/// the node's): a flow waits on the stack for the answer, so it must not
/// wait behind the agent's other work. Stops when the returned [`Marker`]
/// drops.
pub(crate) fn spawn_marker(pins: &PinDir, stats: Arc<LiberalStats>) -> Result<Marker> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for (map, name, budget) in [
        (map_names::CT_REQUESTS, "weft-ct-bulk", BULK),
        (map_names::CT_EARNED, "weft-ct-earned", EARNED),
    ] {
        let path = pins.map(map);
        if map == map_names::CT_EARNED && !path.exists() {
            // Programs of an earlier build kept running (an upgrade they
            // refused): they ask on the bulk ring alone, whose thread's
            // budget bounds it all the same.
            tracing::info!(
                map,
                "the running programs ask for conntrack markings on one ring: one marker thread"
            );
            continue;
        }
        let data = MapData::from_pin(&path)
            .with_context(|| format!("opening the pinned ring buffer {}", path.display()))?;
        let ring = RingBuf::try_from(aya::maps::Map::RingBuf(data))
            .with_context(|| format!("{map} is not a ring buffer"))?;
        let sock = Socket::open()?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn({
                let (stop, stats) = (stop.clone(), stats.clone());
                move || serve(ring, sock, budget, &stats, &stop)
            })
            .with_context(|| format!("starting the conntrack marker thread {name}"))?;
        threads.push(thread);
    }
    Ok(Marker { stop, threads })
}

/// The marker's threads; stops them when dropped.
pub(crate) struct Marker {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Marker {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How long a thread waits for requests before it looks at `stop`.
const POLL_MS: i32 = 200;

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Makes the calling thread realtime (SCHED_FIFO, the lowest priority) or
/// normal again; whether the kernel agreed.
fn set_realtime(on: bool) -> std::io::Result<()> {
    // SAFETY: sched_param is plain old data (musl's has more fields than
    // glibc's); all zeroes is a valid value.
    let mut p: libc::sched_param = unsafe { std::mem::zeroed() };
    p.sched_priority = i32::from(on);
    let policy = if on {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_OTHER
    };
    // The system call itself (musl's wrapper answers ENOSYS: the kernel's
    // call is per thread, POSIX's per process).
    // SAFETY: sched_setscheduler on the calling thread (0) with a valid
    // parameter block.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            0,
            policy,
            &p as *const libc::sched_param,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A thread's account of its budget in the current window.
struct Meter {
    budget: Budget,
    /// Realtime was refused (no CAP_SYS_NICE, or a container's cgroup
    /// without a realtime budget): not asked again.
    refused: bool,
    realtime: bool,
    start: Instant,
    cpu: Duration,
}

impl Meter {
    fn new(budget: Budget, name: &str) -> Self {
        let mut m = Meter {
            budget,
            refused: budget.realtime.is_zero(),
            realtime: false,
            start: Instant::now(),
            cpu: thread_cpu(),
        };
        if m.refused {
            return m;
        }
        match set_realtime(true) {
            Ok(()) => {
                m.realtime = true;
                tracing::debug!(thread = name, "the conntrack marker thread is realtime");
            }
            Err(why) => {
                m.refused = true;
                // SAFETY: setpriority on the calling thread (Linux: who 0
                // is the calling thread) with a plain value.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) } == 0 {
                    tracing::info!(thread = name, realtime = %why, "the conntrack marker thread runs at nice -20 (realtime refused): bulk flows may wait a little longer on the host stack on a busy node");
                } else {
                    tracing::info!(thread = name, realtime = %why, nice = %std::io::Error::last_os_error(), "the conntrack marker runs as a normal thread (no CAP_SYS_NICE): bulk flows may wait a little longer on the host stack on a busy node");
                }
            }
        }
        m
    }

    /// After a request: starts a new window if this one is over, else
    /// demotes the thread or pauses it as its budget says. Whether it
    /// paused.
    fn account(&mut self) -> bool {
        if self.renew() {
            return false;
        }
        let elapsed = self.start.elapsed();
        match self.budget.mode(thread_cpu().saturating_sub(self.cpu)) {
            Mode::Realtime => false,
            Mode::Normal => {
                if self.realtime && set_realtime(false).is_ok() {
                    self.realtime = false;
                }
                false
            }
            Mode::Pause => {
                // Saturating: the window may have ended since `renew`
                // looked.
                std::thread::sleep(WINDOW.saturating_sub(elapsed));
                self.start = Instant::now();
                self.cpu = thread_cpu();
                self.promote();
                true
            }
        }
    }

    /// Starts a new window if this one is over (the thread realtime again
    /// where allowed): at a wake-up, so a request after a quiet spell is
    /// served as the budget says, not as the last window left it. Whether
    /// it did.
    fn renew(&mut self) -> bool {
        if self.start.elapsed() < WINDOW {
            return false;
        }
        self.start = Instant::now();
        self.cpu = thread_cpu();
        self.promote();
        true
    }

    /// Back to realtime for a new window, where the thread is allowed it.
    fn promote(&mut self) {
        if !self.refused && !self.realtime && set_realtime(true).is_ok() {
            self.realtime = true;
        }
    }
}

fn serve(
    mut ring: RingBuf<MapData>,
    sock: Socket,
    budget: Budget,
    stats: &LiberalStats,
    stop: &AtomicBool,
) {
    use std::os::fd::AsRawFd as _;
    let name = std::thread::current().name().unwrap_or("marker").to_owned();
    let mut meter = Meter::new(budget, &name);
    let mut seq = 0u32;
    while !stop.load(Relaxed) {
        let mut pfd = libc::pollfd {
            fd: ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd, for at most POLL_MS.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(thread = %name, error = %e, "cannot poll the conntrack requests; fast-path TCP flows stay on the stack");
            return;
        }
        meter.renew();
        loop {
            let Some(item) = ring.next() else { break };
            if item.len() < std::mem::size_of::<CtRequest>() {
                continue;
            }
            // SAFETY: the item holds at least a CtRequest's bytes, written
            // by the programs as one; read_unaligned has no alignment
            // requirement and every bit pattern is valid.
            let req: CtRequest = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            drop(item);

            seq = seq.wrapping_add(1);
            if let Some(msg) = liberal_update(&req, seq) {
                match sock.send(&msg).and_then(|()| sock.acks(1)) {
                    Ok(()) => {
                        stats.marked.fetch_add(1, Relaxed);
                        tracing::trace!(flow = %describe(&req), "conntrack: flow made liberal for the fast path");
                    }
                    Err(e) if is_enoent(&e) => {
                        stats.gone.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        stats.failed.fetch_add(1, Relaxed);
                        tracing::debug!(flow = %describe(&req), error = %format!("{e:#}"), "conntrack: cannot make a flow liberal; it stays on the stack");
                    }
                }
            }
            if meter.account() {
                stats.paused.fetch_add(1, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_realtime_then_normal_then_a_pause() {
        let ms = Duration::from_millis;
        assert_eq!(BULK.mode(ms(0)), Mode::Realtime);
        assert_eq!(BULK.mode(ms(3)), Mode::Realtime);
        assert_eq!(BULK.mode(ms(4)), Mode::Normal);
        assert_eq!(BULK.mode(ms(9)), Mode::Normal);
        assert_eq!(BULK.mode(ms(10)), Mode::Pause);
        // The earned thread is never realtime.
        assert_eq!(EARNED.mode(ms(0)), Mode::Normal);
        assert_eq!(EARNED.mode(ms(5)), Mode::Pause);
    }

    #[test]
    fn the_budgets_stay_under_the_issue_bounds() {
        // No thread realtime above 5% of a core; the two in all, beside
        // the agent's other work, well under 10% in a flood of short
        // connections (which asks only on the earned ring).
        assert!(BULK.realtime.as_secs_f64() / WINDOW.as_secs_f64() <= 0.05);
        assert!(EARNED.all.as_secs_f64() / WINDOW.as_secs_f64() <= 0.05);
    }

    #[test]
    fn a_thread_that_spends_its_budget_pauses_for_the_rest_of_the_window() {
        // A normal thread (the earned budget) that spins: the meter
        // pauses it once it has used its share, so over several windows
        // it uses about that share of a core.
        let mut m = Meter::new(EARNED, "test");
        let (t0, c0) = (Instant::now(), thread_cpu());
        let mut paused = 0;
        // Bounded in time: on a CPU shared with other tests the share
        // comes later, and is smaller.
        while paused < 3 && t0.elapsed() < Duration::from_secs(10) {
            spin();
            if m.account() {
                paused += 1;
            }
        }
        let share = (thread_cpu() - c0).as_secs_f64() / t0.elapsed().as_secs_f64();
        assert_eq!(paused, 3, "paused {paused} times in {:?}", t0.elapsed());
        assert!(share < 0.10, "used {share:.3} of a core");
    }

    /// Spins the calling thread for 50 µs.
    fn spin() {
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(50) {}
    }

    /// Runs `f` on a thread of its own (the test harness's threads are not
    /// to be made realtime), as root; without root realtime is refused and
    /// there is nothing to measure.
    fn as_root_on_a_thread(f: impl FnOnce() + Send + 'static) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: realtime is refused, nothing to measure");
            return;
        }
        std::thread::spawn(f).join().unwrap();
    }

    #[test]
    fn a_bulk_thread_is_realtime_for_its_share_then_normal_then_paused() {
        as_root_on_a_thread(|| {
            let mut m = Meter::new(BULK, "test");
            assert!(m.realtime, "root is refused realtime");
            let (t0, mut paused) = (Instant::now(), 0);
            let (mut realtime, mut normal) = (Duration::ZERO, Duration::ZERO);
            while paused < 3 && t0.elapsed() < Duration::from_secs(10) {
                // SAFETY: sched_getscheduler on the calling thread.
                let policy = unsafe { libc::sched_getscheduler(0) };
                let c = thread_cpu();
                spin();
                let used = thread_cpu() - c;
                if policy == libc::SCHED_FIFO {
                    realtime += used;
                } else {
                    normal += used;
                }
                if m.account() {
                    paused += 1;
                }
            }
            let wall = t0.elapsed().as_secs_f64();
            assert_eq!(paused, 3, "paused {paused} times in {wall:.1} s");
            let (rt, all) = (
                realtime.as_secs_f64() / wall,
                (realtime + normal).as_secs_f64() / wall,
            );
            // Spinning, it is realtime for 4 ms of each 100 ms window,
            // normal for 6 more, then pauses.
            assert!(rt < 0.05, "realtime for {rt:.3} of a core");
            assert!(
                rt > 0.0 && normal > Duration::ZERO,
                "{realtime:?} realtime, {normal:?} normal"
            );
            assert!(all < 0.13, "{all:.3} of a core in all");
        });
    }

    #[test]
    fn a_demoted_bulk_thread_is_realtime_again_in_the_next_window() {
        as_root_on_a_thread(|| {
            let mut m = Meter::new(BULK, "test");
            let t0 = Instant::now();
            // Spends its realtime share (and less than its whole one).
            while m.realtime && t0.elapsed() < Duration::from_secs(10) {
                spin();
                m.account();
            }
            // SAFETY: sched_getscheduler on the calling thread.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_OTHER);
            // A quiet spell, then a wake-up.
            std::thread::sleep(WINDOW);
            assert!(m.renew());
            // SAFETY: as above.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_FIFO);
        });
    }
}
