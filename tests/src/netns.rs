//! Network namespaces and the links between them.

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::proc::{run, run_quiet};

/// A network namespace, deleted (with everything in it) on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates a namespace with loopback up and IPv6 off (so no router
    /// solicitations or neighbour discovery add packets to what a test counts).
    pub fn new(prefix: &str) -> Result<Self> {
        let name = crate::unique(prefix);
        run("ip", &["netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1")?;
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1")?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Turns IPv6 back on, for the namespace's interfaces now and later
    /// (tests of IPv6 networks).
    pub fn enable_ipv6(&self) -> Result<()> {
        for conf in ["all", "default"] {
            self.sysctl(&format!("net.ipv6.conf.{conf}.disable_ipv6"), "0")?;
        }
        let links = self.ip(&["-o", "link", "show"])?;
        for name in links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n))
        {
            self.sysctl(&format!("net.ipv6.conf.{name}.disable_ipv6"), "0")?;
        }
        Ok(())
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace and returns its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// The index of `iface` in the namespace, if it exists (a device made
    /// again gets a new one).
    pub fn ifindex(&self, iface: &str) -> Option<u32> {
        self.exec("cat", &[&format!("/sys/class/net/{iface}/ifindex")])
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Adds `addr/prefix_len` to `dev`, usable at once (no duplicate
    /// address detection).
    pub fn add_addr6(&self, dev: &str, addr: std::net::Ipv6Addr, prefix_len: u8) -> Result<()> {
        let a = format!("{addr}/{prefix_len}");
        self.ip(&["-6", "addr", "add", &a, "dev", dev, "nodad"])
            .map(drop)
    }

    /// `ip ARGS` inside the namespace.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Drops this namespace's outgoing TCP to `port` (table `inet cut`),
    /// e.g. to cut a node off from etcd; [`Netns::uncut`] undoes it.
    pub fn cut_tcp_out(&self, port: u16) -> Result<()> {
        self.exec("nft", &["add", "table", "inet", "cut"])?;
        let chain = format!(
            "{{ type filter hook output priority 0; policy accept; tcp dport {port} drop; }}"
        );
        self.exec("nft", &["add", "chain", "inet", "cut", "out", &chain])?;
        Ok(())
    }

    pub fn uncut(&self) -> Result<()> {
        self.exec("nft", &["delete", "table", "inet", "cut"])?;
        Ok(())
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.exec("sysctl", &["-qw", &format!("{key}={value}")])?;
        Ok(())
    }

    /// A command that will run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Starts a long-running command inside the namespace; it is killed
    /// (by pid) when the returned guard drops.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Result<ChildGuard> {
        let child = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program} in {}", self.name))?;
        Ok(ChildGuard(Some(child)))
    }

    /// Runs `f` on a thread that has entered this namespace (network
    /// namespace only; the mount namespace stays the host's).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let file = File::open(self.path())
            .with_context(|| format!("opening {}", self.path().display()))?;
        let handle = std::thread::spawn(move || {
            // SAFETY: setns on a valid namespace fd, affecting this thread only.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(anyhow::anyhow!(
                    "setns: {}",
                    std::io::Error::last_os_error()
                ));
            }
            Ok(f())
        });
        match handle.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Like [`Netns::run`], without waiting: the thread runs in the background.
    pub fn spawn_thread<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let file = File::open(self.path()).expect("the namespace exists");
        std::thread::spawn(move || {
            // SAFETY: setns on a valid namespace fd, affecting this thread only.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
    }

    /// The value of a link statistic (e.g. `rx_packets`) of `iface`.
    pub fn link_stat(&self, iface: &str, stat: &str) -> Result<u64> {
        let path = format!("/sys/class/net/{iface}/statistics/{stat}");
        let out = self.exec("cat", &[&path])?;
        out.trim()
            .parse()
            .with_context(|| format!("parsing {path}: {out:?}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill whatever still runs in the namespace, by pid, then delete it.
        if let Ok(out) = run("ip", &["netns", "pids", &self.name]) {
            for pid in out.split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: plain kill(2) on a pid that lives in our namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        run_quiet("ip", &["netns", "del", &self.name]);
    }
}

/// A veth pair `a_if` in `a` and `b_if` in `b`, both up.
pub fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    let tmp_a = crate::unique("va");
    let tmp_b = crate::unique("vb");
    run(
        "ip",
        &[
            "link", "add", &tmp_a, "type", "veth", "peer", "name", &tmp_b,
        ],
    )?;
    run(
        "ip",
        &["link", "set", &tmp_a, "netns", a.name(), "name", a_if],
    )?;
    run(
        "ip",
        &["link", "set", &tmp_b, "netns", b.name(), "name", b_if],
    )?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// The MAC address of `iface` in `ns`.
pub fn mac(ns: &Netns, iface: &str) -> Result<String> {
    let out = ns.exec("cat", &[&format!("/sys/class/net/{iface}/address")])?;
    let mac = out.trim().to_string();
    if mac.len() != 17 {
        bail!("unexpected MAC {mac:?} for {iface}");
    }
    Ok(mac)
}

/// A child process killed by pid on drop.
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn child_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("child present until drop")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
