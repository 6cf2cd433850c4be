//! A real etcd (Debian's etcd-server) per test: free loopback ports (or an
//! address in a test namespace), a temporary data directory, stopped by pid.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::netns::Netns;

pub struct Etcd {
    child: Option<Child>,
    pub endpoint: String,
    ip: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    netns: Option<String>,
}

fn free_port() -> u16 {
    crate::ports::loopback().expect("a free loopback port")
}

impl Etcd {
    /// Starts etcd on loopback.
    pub fn start() -> Result<Self> {
        Self::start_at(None, "127.0.0.1")
    }

    /// Starts etcd inside `ns`, listening on `ip` (an address of that namespace).
    pub fn start_in(ns: &Netns, ip: &str) -> Result<Self> {
        Self::start_at(Some(ns), ip)
    }

    fn start_at(ns: Option<&Netns>, ip: &str) -> Result<Self> {
        let mut e = Self::prepare_at(ns, ip)?;
        e.launch()?;
        Ok(e)
    }

    /// Chooses ports and a data directory without starting etcd, so a test
    /// can point agents at an etcd that is not up yet.
    pub fn prepare() -> Result<Self> {
        Self::prepare_at(None, "127.0.0.1")
    }

    fn prepare_at(ns: Option<&Netns>, ip: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(crate::unique("weft-etcd-"));
        std::fs::create_dir_all(&dir)?;
        let (client_port, peer_port) = if ns.is_some() {
            (2379, 2380)
        } else {
            (free_port(), free_port())
        };
        Ok(Self {
            child: None,
            endpoint: format!("http://{ip}:{client_port}"),
            ip: ip.to_string(),
            client_port,
            peer_port,
            dir,
            netns: ns.map(|n| n.name().to_string()),
        })
    }

    /// Starts a prepared etcd and waits until it is healthy.
    pub fn launch(&mut self) -> Result<()> {
        self.spawn()?;
        self.wait_ready(Duration::from_secs(20))
    }

    fn spawn(&mut self) -> Result<()> {
        let client = format!("http://{}:{}", self.ip, self.client_port);
        let peer = format!("http://{}:{}", self.ip, self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))?;
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcd"]);
                c
            }
            None => Command::new("etcd"),
        };
        cmd.args(["--name", "t", "--data-dir"])
            .arg(self.dir.join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("t={peer}")])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.child = Some(
            cmd.spawn()
                .context("starting etcd (is etcd-server installed? `cargo xtask setup`)")?,
        );
        Ok(())
    }

    fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let within = crate::scaled(within);
        let deadline = Instant::now() + within;
        loop {
            let mut c = self.etcdctl_cmd();
            c.args(["endpoint", "health"]);
            if c.output().map(|o| o.status.success()).unwrap_or(false) {
                return Ok(());
            }
            if let Some(Some(status)) = self.child.as_mut().map(|c| c.try_wait().ok().flatten()) {
                bail!("etcd exited ({status}); log: {}", self.log());
            }
            if Instant::now() > deadline {
                bail!("etcd not healthy after {within:?}; log: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn etcdctl_cmd(&self) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "etcdctl"]);
                c
            }
            None => Command::new("etcdctl"),
        };
        c.env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint, "--command-timeout", "3s"]);
        c
    }

    /// Runs etcdctl against this etcd; returns stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let mut c = self.etcdctl_cmd();
        c.args(args);
        let out = c.output()?;
        if !out.status.success() {
            bail!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `etcdctl put key` with the value on stdin (a value larger than an
    /// argument may be).
    pub fn put_large(&self, key: &str, value: &[u8]) -> Result<()> {
        use std::io::Write as _;
        let mut c = self.etcdctl_cmd();
        c.args(["put", key])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn()?;
        child.stdin.take().expect("stdin").write_all(value)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "etcdctl put {key}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn pause(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), libc::SIGSTOP) };
    }

    pub fn resume(&self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
    }

    /// Kills etcd (SIGKILL); the data directory stays for [`Etcd::restart`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready(Duration::from_secs(20))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    /// An etcd-client connection (lazy).
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect([&self.endpoint], None)
            .await
            .expect("etcd client")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
