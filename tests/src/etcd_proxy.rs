//! The etcd gRPC proxy (Debian's `etcd grpc-proxy start`) in a namespace of
//! its own on the underlay, in front of an [`crate::etcd_cluster`]: many
//! clients' watches coalesced into one per key range, as a large cluster
//! runs it. Stopped by pid.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{cluster::Underlay, netns::Netns};

pub struct EtcdProxy {
    pub ns: Netns,
    pub ip: String,
    /// The members it proxies, `host:port` each.
    members: String,
    child: Option<Child>,
    dir: PathBuf,
}

impl EtcdProxy {
    /// Starts a proxy listening on `ip:2379` for the members at `endpoints`
    /// (`http://host:port`, comma separated); waits until it serves.
    pub fn start(underlay: &Underlay, ip: &str, endpoints: &str) -> Result<Self> {
        let ns = Netns::new("wp")?;
        underlay.plug(&ns, "eth0", ip)?;
        let dir = std::env::temp_dir().join(crate::unique("weft-etcd-proxy-"));
        std::fs::create_dir_all(&dir)?;
        let members = endpoints
            .split(',')
            .map(|e| e.trim_start_matches("http://"))
            .collect::<Vec<_>>()
            .join(",");
        let mut p = Self {
            ns,
            ip: ip.to_string(),
            members,
            child: None,
            dir,
        };
        p.spawn()?;
        Ok(p)
    }

    /// `http://ip:2379`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:2379", self.ip)
    }

    fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("proxy.log"))?;
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                self.ns.name(),
                "etcd",
                "grpc-proxy",
                "start",
            ])
            .arg(format!("--endpoints={}", self.members))
            .arg(format!("--listen-addr={}:2379", self.ip))
            .arg(format!("--advertise-client-url={}:2379", self.ip))
            .arg(format!("--metrics-addr=http://{}:2381", self.ip))
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting etcd grpc-proxy")?;
        self.child = Some(child);
        let ep = self.endpoint();
        let serves = || {
            Command::new("ip")
                .args(["netns", "exec", self.ns.name(), "etcdctl"])
                .args(["--endpoints", &ep, "--command-timeout", "2s", "get", "x"])
                .env("ETCDCTL_API", "3")
                .output()
                .is_ok_and(|o| o.status.success())
                .then_some(())
        };
        if crate::agent::poll(Duration::from_secs(30), serves).is_none() {
            bail!("the proxy does not serve; its log:\n{}", self.log());
        }
        Ok(())
    }

    /// SIGKILL, then the same proxy again.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("proxy.log")).unwrap_or_default()
    }
}

impl Drop for EtcdProxy {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
