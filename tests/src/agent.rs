//! `weft` processes under test: started with arguments, logs to a file,
//! stopped by pid.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::netns::Netns;

/// The weft binary: `$WEFT_BIN` (set by `cargo xtask test`), else the debug build.
/// An agent's own directory (log, subnet file, state), empty: a name
/// [`crate::unique`] gives again (its process id recurs across runs) may
/// hold an earlier run's files, and a stale subnet.env there would pass
/// for this agent's before it has written one.
fn fresh_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(crate::unique(&format!("weft-agent-{name}-")));
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub fn weft_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WEFT_BIN") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/weft");
    assert!(
        p.exists(),
        "no weft binary at {}: run the tests through `cargo xtask test` or `cargo build -p weft` first",
        p.display()
    );
    p
}

/// Runs `weft ARGS` to completion; returns (success, stdout, stderr).
pub fn weft(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(weft_bin())
        .args(args)
        .output()
        .expect("running weft");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub struct Agent {
    child: Option<Child>,
    pub name: String,
    pub dir: PathBuf,
    args: Vec<String>,
    netns: Option<String>,
    /// Extra environment for the agent's process.
    env: Vec<(String, String)>,
    /// A cgroup (its directory) the process starts in.
    cgroup: Option<PathBuf>,
    /// Started as PID 1 of a PID namespace of its own, as in a container.
    pid_namespace: bool,
    /// The loopback port of the health and metrics server the helper gave
    /// an agent in the host's namespace (unless its arguments name one).
    healthz_port: Option<u16>,
}

impl Agent {
    /// Starts `weft agent ARGS` (inside `ns` if given). Its working files
    /// (log, subnet file) live in a private temp directory.
    pub fn start(name: &str, ns: Option<&Netns>, args: &[String]) -> Result<Self> {
        Self::start_seeded(name, ns, args, None)
    }

    /// Like [`Agent::start`], with extra environment variables.
    pub fn start_with_env(
        name: &str,
        ns: Option<&Netns>,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::launch(name, ns, args, env, None)
    }

    /// Like [`Agent::start`], with a subnet file already in place naming
    /// `subnet` (FLANNEL_SUBNET form, e.g. 10.5.3.1/24): a stale or copied
    /// file, as a restarted or cloned machine has.
    pub fn start_seeded(
        name: &str,
        ns: Option<&Netns>,
        args: &[String],
        subnet: Option<&str>,
    ) -> Result<Self> {
        Self::launch(name, ns, args, &[], subnet)
    }

    /// Like [`Agent::start`], with a subnet file of exactly `text` in place
    /// (a stale dual-stack or IPv6-only file, say).
    pub fn start_with_file(
        name: &str,
        ns: Option<&Netns>,
        args: &[String],
        text: &str,
    ) -> Result<Self> {
        Self::launch_with(name, ns, args, &[], Some(text.to_string()))
    }

    fn launch(
        name: &str,
        ns: Option<&Netns>,
        args: &[String],
        env: &[(&str, &str)],
        subnet: Option<&str>,
    ) -> Result<Self> {
        let text = subnet.map(|s| {
            format!(
                "FLANNEL_NETWORK=10.0.0.0/8\nFLANNEL_SUBNET={s}\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n"
            )
        });
        Self::launch_with(name, ns, args, env, text)
    }

    fn launch_with(
        name: &str,
        ns: Option<&Netns>,
        args: &[String],
        env: &[(&str, &str)],
        subnet_file: Option<String>,
    ) -> Result<Self> {
        let dir = fresh_dir(name)?;
        if let Some(text) = subnet_file {
            std::fs::write(dir.join("subnet.env"), text)?;
        }
        let mut a = Self {
            child: None,
            name: name.to_string(),
            dir,
            args: args.to_vec(),
            netns: ns.map(|n| n.name().to_string()),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cgroup: None,
            pid_namespace: false,
            healthz_port: healthz_port(ns, args)?,
        };
        a.spawn()?;
        Ok(a)
    }

    /// Like [`Agent::start`], with the process started inside the cgroup
    /// `cgroup` (a directory of the cgroup file system, see
    /// [`crate::cgroup::MemCgroup`]), so its memory limit holds from the
    /// first allocation.
    pub fn start_in_cgroup(
        name: &str,
        ns: Option<&Netns>,
        args: &[String],
        cgroup: &Path,
    ) -> Result<Self> {
        let dir = fresh_dir(name)?;
        let mut a = Self {
            child: None,
            name: name.to_string(),
            dir,
            args: args.to_vec(),
            netns: ns.map(|n| n.name().to_string()),
            env: Vec::new(),
            cgroup: Some(cgroup.to_path_buf()),
            pid_namespace: false,
            healthz_port: healthz_port(ns, args)?,
        };
        a.spawn()?;
        Ok(a)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        // As PID 1 of a PID namespace: unshare forks the agent into it and
        // kills it when it is killed itself.
        let pidns = ["unshare", "--pid", "--fork", "--kill-child"];
        let mut cmd = match (&self.netns, self.pid_namespace) {
            (Some(ns), false) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(weft_bin());
                c
            }
            (Some(ns), true) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).args(pidns).arg(weft_bin());
                c
            }
            (None, false) => Command::new(weft_bin()),
            (None, true) => {
                let mut c = Command::new(pidns[0]);
                c.args(&pidns[1..]).arg(weft_bin());
                c
            }
        };
        cmd.arg("agent").args(&self.args);
        if !self.args.iter().any(|a| a == "--subnet-file") {
            cmd.arg("--subnet-file").arg(self.subnet_file());
        }
        if !self.args.iter().any(|a| a == "--state-dir") {
            cmd.arg("--state-dir").arg(self.state_dir());
        }
        if let Some(port) = self.healthz_port {
            cmd.args([
                "--healthz-ip",
                "127.0.0.1",
                "--healthz-port",
                &port.to_string(),
            ]);
        }
        if let Some(cg) = &self.cgroup {
            let procs =
                std::ffi::CString::new(cg.join("cgroup.procs").as_os_str().as_encoded_bytes())?;
            use std::os::unix::process::CommandExt as _;
            // SAFETY: between fork and exec only async-signal-safe calls
            // (open, write, close) on memory prepared before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // "0": the writing process itself.
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if n != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("WEFT_LOG", "info,weft=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(cmd.spawn().context("starting weft agent")?);
        Ok(())
    }

    /// The agent's state directory (saved host settings, status report).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    pub fn subnet_file(&self) -> PathBuf {
        self.dir.join("subnet.env")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("agent.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Whether the process is still running (not exited, not a zombie).
    pub fn running(&self) -> bool {
        let Some(pid) = self.child.as_ref().map(|c| c.id()) else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().to_string())
            })
            .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
    }

    /// Sends signal `sig` to the agent.
    pub fn signal(&self, sig: i32) {
        if self.pid() > 0 {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(self.pid(), sig) };
        }
    }

    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.signal(libc::SIGCONT);
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and wait for the exit.
    pub fn stop(&mut self) -> Result<()> {
        self.signal(libc::SIGTERM);
        if let Some(mut c) = self.child.take() {
            let within = crate::scaled(Duration::from_secs(10));
            let deadline = Instant::now() + within;
            loop {
                if let Some(s) = c.try_wait()? {
                    if !s.success() {
                        bail!(
                            "{} exited with {s} on SIGTERM; log:\n{}",
                            self.name,
                            self.log()
                        );
                    }
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    bail!("{} did not exit within {within:?} of SIGTERM", self.name);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// From its next (re)start, the agent runs as PID 1 of a PID
    /// namespace of its own, as it does in a container.
    pub fn in_pid_namespace(&mut self) {
        self.pid_namespace = true;
    }

    /// The arguments the agent is (re)started with.
    pub fn args_mut(&mut self) -> &mut Vec<String> {
        &mut self.args
    }

    /// Starts the same agent again (same arguments, same files).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    /// Waits until the log contains `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> Result<()> {
        if poll(within, || self.log().contains(needle).then_some(())).is_some() {
            return Ok(());
        }
        bail!(
            "{}: no {needle:?} in the log after {within:?}:\n{}",
            self.name,
            self.log()
        )
    }

    /// Waits until the log contains `needle` at least `n` times.
    pub fn wait_log_count(&self, needle: &str, n: usize, within: Duration) -> Result<()> {
        if poll(within, || {
            (self.log().matches(needle).count() >= n).then_some(())
        })
        .is_some()
        {
            return Ok(());
        }
        bail!(
            "{}: fewer than {n} {needle:?} in the log after {within:?}:\n{}",
            self.name,
            self.log()
        )
    }

    /// One series (`name{labels}`) of the agent's `/metrics`: None while
    /// it is not served (not up yet) or the series is absent. For agents
    /// in the host's namespace (the helper gives them a loopback port).
    pub fn metric(&self, series: &str) -> Option<f64> {
        use std::io::{Read as _, Write as _};
        let port = self.healthz_port?;
        let addr = (std::net::Ipv4Addr::LOCALHOST, port).into();
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
        s.set_read_timeout(Some(crate::scaled(Duration::from_secs(5))))
            .ok()?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.rsplit_once(' ').filter(|(k, _)| *k == series))
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    /// Waits until the series `series` of the agent's `/metrics` satisfies
    /// `ok`; returns its value.
    pub fn wait_metric(
        &self,
        series: &str,
        ok: impl Fn(f64) -> bool,
        within: Duration,
    ) -> Result<f64> {
        if let Some(v) = poll(within, || self.metric(series).filter(|v| ok(*v))) {
            return Ok(v);
        }
        bail!(
            "{}: {series} is {:?} after {within:?}; log:\n{}",
            self.name,
            self.metric(series),
            self.log()
        )
    }

    /// Waits until the agent holds a lease it acquired `n` times since it
    /// started (`weft_lease_held` and the acquisition histogram's count).
    pub fn wait_acquired(&self, n: usize, within: Duration) -> Result<()> {
        self.wait_metric(
            "weft_lease_acquire_seconds_count",
            |v| v >= n as f64,
            within,
        )?;
        self.wait_metric("weft_lease_held", |v| v == 1.0, within)?;
        Ok(())
    }

    /// Waits until the agent has written its subnet file `n` times (it logs
    /// the write after the file is in place); returns what the file names.
    pub fn wait_subnet_written(&self, n: usize, within: Duration) -> Result<String> {
        self.wait_log_count("wrote the subnet file", n, within)?;
        self.subnet()
            .with_context(|| format!("{}: the subnet file names no subnet", self.name))
    }

    /// Waits until the subnet file names a subnet other than `old`.
    pub fn wait_subnet_change(&self, old: &str, within: Duration) -> Result<String> {
        if let Some(s) = poll(within, || self.subnet().filter(|s| s != old)) {
            return Ok(s);
        }
        bail!(
            "{}: subnet file still names {old} after {within:?}; log:\n{}",
            self.name,
            self.log()
        )
    }

    /// Waits until the subnet file names a subnet; returns it (FLANNEL_SUBNET).
    pub fn wait_subnet(&self, within: Duration) -> Result<String> {
        if let Some(s) = poll(within, || self.subnet()) {
            return Ok(s);
        }
        bail!(
            "{}: no subnet file after {within:?}; log:\n{}",
            self.name,
            self.log()
        )
    }

    /// Both subnets the subnet file names (FLANNEL_SUBNET and
    /// FLANNEL_IPV6_SUBNET), if written.
    pub fn subnets(&self) -> Option<weft::lease::Subnets> {
        let text = std::fs::read_to_string(self.subnet_file()).ok()?;
        weft::lease::parse_subnet_env(&text).ok()
    }

    /// FLANNEL_SUBNET from the subnet file, if written.
    pub fn subnet(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.subnet_file()).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
            .map(str::to_string)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("--- log of agent {} ---\n{}", self.name, self.log());
        }
    }
}

/// The loopback port an agent in the host's namespace serves /metrics on
/// (one free at the time of asking), unless its arguments name a port.
fn healthz_port(ns: Option<&Netns>, args: &[String]) -> Result<Option<u16>> {
    if ns.is_some() || args.iter().any(|x| x == "--healthz-port") {
        return Ok(None);
    }
    Ok(Some(crate::ports::loopback()?))
}

/// Polls `f` every 25 ms until it returns Some (that), or `within`
/// (scaled by [`crate::scaled`]) passes (None).
pub fn poll<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + crate::scaled(within);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Polls `f` until it returns Some, or fails after `within` saying `what`.
pub fn eventually<T>(what: &str, within: Duration, f: impl FnMut() -> Option<T>) -> T {
    poll(within, f).unwrap_or_else(|| {
        panic!(
            "timed out after {:?} waiting for: {what}",
            crate::scaled(within)
        )
    })
}
