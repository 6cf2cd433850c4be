//! This process's resource use, from /proc/self, for the `process_*`
//! metrics every Prometheus exporter has.

/// What `process_*` reports; zero where /proc says nothing.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    pub(crate) cpu_seconds: f64,
    pub(crate) resident_bytes: u64,
    pub(crate) virtual_bytes: u64,
    pub(crate) open_fds: u64,
    pub(crate) max_fds: u64,
    pub(crate) start_time_seconds: f64,
}

/// Clock ticks per second and the page size.
fn sysconf() -> (f64, u64) {
    // SAFETY: sysconf reads a configuration value; no memory is passed.
    let (hz, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        if hz > 0 { hz as f64 } else { 100.0 },
        if page > 0 { page as u64 } else { 4096 },
    )
}

impl Usage {
    pub(crate) fn of_self() -> Self {
        let mut u = Self::default();
        let (hz, page) = sysconf();
        // Fields after the command name (which may hold spaces), from
        // field 3 (state) on: utime 14, stime 15, starttime 22, vsize 23,
        // rss 24 (proc(5)).
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat")
            && let Some((_, rest)) = stat.rsplit_once(") ")
        {
            let f: Vec<&str> = rest.split(' ').collect();
            let num = |i: usize| {
                f.get(i - 3)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            u.cpu_seconds = (num(14) + num(15)) as f64 / hz;
            u.virtual_bytes = num(23);
            u.resident_bytes = num(24) * page;
            let boot = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
            u.start_time_seconds = boot as f64 + num(22) as f64 / hz;
        }
        u.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the rlimit this function owns.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            u.max_fds = lim.rlim_cur;
        }
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_uses_something() {
        let u = Usage::of_self();
        assert!(
            u.resident_bytes > 0 && u.virtual_bytes >= u.resident_bytes,
            "{u:?}"
        );
        assert!(u.open_fds >= 3 && u.max_fds >= u.open_fds, "{u:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            u.start_time_seconds > now - 3600.0 && u.start_time_seconds <= now + 1.0,
            "{u:?}"
        );
    }
}
