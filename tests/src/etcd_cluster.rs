//! A multi-member etcd cluster (Debian's etcd-server), one member per
//! network namespace on a test underlay, optionally with mutual TLS for
//! clients (certificates made by [`Pki`] with openssl) and with auth
//! enabled; members can be killed, paused, cut off from their peers or from
//! everyone (nftables in the member's namespace).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};

use crate::{cluster::Underlay, netns::Netns};

/// Members listen on 198.18.0.241, .242, ...
pub fn member_ip(i: usize) -> String {
    format!("198.18.0.{}", 241 + i)
}

/// Certificates for a test: a CA, a server certificate for the members'
/// addresses, a client certificate signed by the CA, and one signed by
/// another CA (to be refused).
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(members: usize) -> Result<Self> {
        let dir = std::env::temp_dir().join(crate::unique("weft-pki-"));
        std::fs::create_dir_all(&dir)?;
        let p = Self { dir };
        for ca in ["ca", "other-ca"] {
            p.openssl(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=weft test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ])?;
        }
        let sans: Vec<String> = (0..members)
            .map(|i| format!("IP:{}", member_ip(i)))
            .collect();
        p.sign(
            "server",
            "ca",
            &format!("subjectAltName={}", sans.join(",")),
        )?;
        p.sign("client", "ca", "extendedKeyUsage=clientAuth")?;
        // A renewed client certificate (a rotation).
        p.sign("client2", "ca", "extendedKeyUsage=clientAuth")?;
        p.sign("rogue", "other-ca", "extendedKeyUsage=clientAuth")?;
        Ok(p)
    }

    fn sign(&self, name: &str, ca: &str, ext: &str) -> Result<()> {
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN=weft test {name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ])?;
        std::fs::write(self.dir.join(format!("{name}.ext")), format!("{ext}\n"))?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<()> {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .context("running openssl (installed by `cargo xtask setup`)")?;
        if !out.status.success() {
            bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How the cluster is set up.
#[derive(Default)]
pub struct Options<'a> {
    /// Mutual TLS for clients.
    pub pki: Option<&'a Pki>,
    /// `--auth-token-ttl` (seconds) for simple tokens.
    pub auth_token_ttl: Option<u32>,
}

pub struct Member {
    pub ns: Netns,
    pub ip: String,
    child: Option<Child>,
    dir: PathBuf,
}

pub struct EtcdCluster {
    pub members: Vec<Member>,
    tls: Option<(PathBuf, PathBuf, PathBuf)>,
    /// root's password once auth is enabled.
    root_password: Option<String>,
    initial_cluster: String,
    auth_token_ttl: Option<u32>,
    scheme: &'static str,
}

impl EtcdCluster {
    /// Starts `n` members on `underlay` and waits until the cluster has a
    /// leader.
    pub fn start(underlay: &Underlay, n: usize, o: Options<'_>) -> Result<Self> {
        let initial_cluster = (0..n)
            .map(|i| format!("m{i}=http://{}:2380", member_ip(i)))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Self {
            members: Vec::new(),
            tls: o
                .pki
                .map(|p| (p.path("ca.pem"), p.path("client.pem"), p.path("client.key"))),
            root_password: None,
            initial_cluster,
            auth_token_ttl: o.auth_token_ttl,
            scheme: if o.pki.is_some() { "https" } else { "http" },
        };
        for i in 0..n {
            let ns = Netns::new("we")?;
            underlay.plug(&ns, "eth0", &member_ip(i))?;
            ns.ip(&["link", "set", "lo", "up"])?;
            let dir = std::env::temp_dir().join(crate::unique("weft-etcd-m-"));
            std::fs::create_dir_all(&dir)?;
            c.members.push(Member {
                ns,
                ip: member_ip(i),
                child: None,
                dir,
            });
        }
        for i in 0..n {
            c.spawn(i, o.pki)?;
        }
        c.wait_healthy(Duration::from_secs(30))?;
        Ok(c)
    }

    fn spawn(&mut self, i: usize, pki: Option<&Pki>) -> Result<()> {
        let scheme = self.scheme;
        let m = &mut self.members[i];
        let client = format!("{scheme}://{}:2379", m.ip);
        let peer = format!("http://{}:2380", m.ip);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.dir.join("etcd.log"))?;
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            m.ns.name(),
            "etcd",
            "--name",
            &format!("m{i}"),
        ])
        .arg("--data-dir")
        .arg(m.dir.join("data"))
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
        .args(["--initial-cluster", &self.initial_cluster])
        .args([
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            "weft-test",
        ])
        .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
        .args(["--log-level", "warn"]);
        if let Some(ttl) = self.auth_token_ttl {
            cmd.args([
                "--auth-token",
                "simple",
                "--auth-token-ttl",
                &ttl.to_string(),
            ]);
        }
        if let Some(p) = pki {
            cmd.arg("--cert-file")
                .arg(p.path("server.pem"))
                .arg("--key-file")
                .arg(p.path("server.key"))
                .arg("--trusted-ca-file")
                .arg(p.path("ca.pem"))
                .arg("--client-cert-auth");
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        m.child = Some(cmd.spawn().context("starting etcd")?);
        Ok(())
    }

    /// The client endpoints, comma separated.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}://{}:2379", self.scheme, m.ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn etcdctl_cmd(&self, endpoints: &str) -> Command {
        let mut c = Command::new("ip");
        // Run from the first member's namespace: it reaches every member.
        c.args(["netns", "exec", self.members[0].ns.name(), "etcdctl"])
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints, "--command-timeout", "3s"]);
        if let Some((ca, cert, key)) = &self.tls {
            c.arg("--cacert")
                .arg(ca)
                .arg("--cert")
                .arg(cert)
                .arg("--key")
                .arg(key);
        }
        if let Some(pw) = &self.root_password {
            c.args(["--user", &format!("root:{pw}")]);
        }
        c
    }

    /// Runs etcdctl (as root once auth is on) against every member.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let out = self.etcdctl_cmd(&self.endpoints()).args(args).output()?;
        if !out.status.success() {
            bail!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn wait_healthy(&self, within: Duration) -> Result<()> {
        if crate::agent::poll(within, || self.leader().ok()).is_some() {
            return Ok(());
        }
        bail!(
            "the etcd cluster has no leader after {within:?}; logs:\n{}",
            self.logs()
        )
    }

    /// The index of the member that is leader (as a healthy member says).
    pub fn leader(&self) -> Result<usize> {
        for m in &self.members {
            let ep = format!("{}://{}:2379", self.scheme, m.ip);
            let out = self
                .etcdctl_cmd(&ep)
                .args(["endpoint", "status", "-w", "json"])
                .output()?;
            if !out.status.success() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            let s = &v[0]["Status"];
            let (me, leader) = (s["header"]["member_id"].as_u64(), s["leader"].as_u64());
            if let (Some(me), Some(leader)) = (me, leader)
                && leader != 0
            {
                if me == leader {
                    return Ok(self
                        .members
                        .iter()
                        .position(|x| x.ip == m.ip)
                        .expect("listed"));
                }
                // Ask the others who they are.
                for (j, other) in self.members.iter().enumerate() {
                    let ep = format!("{}://{}:2379", self.scheme, other.ip);
                    let out = self
                        .etcdctl_cmd(&ep)
                        .args(["endpoint", "status", "-w", "json"])
                        .output()?;
                    let v: serde_json::Value =
                        serde_json::from_slice(&out.stdout).unwrap_or_default();
                    if v[0]["Status"]["header"]["member_id"].as_u64() == Some(leader) {
                        return Ok(j);
                    }
                }
            }
        }
        bail!("no member knows a leader")
    }

    /// Each member's id (None for one that does not answer).
    pub fn member_ids(&self) -> Vec<Option<u64>> {
        self.members
            .iter()
            .map(|m| {
                let ep = format!("{}://{}:2379", self.scheme, m.ip);
                let out = self
                    .etcdctl_cmd(&ep)
                    .args(["endpoint", "status", "-w", "json"])
                    .output()
                    .ok()?;
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
                v[0]["Status"]["header"]["member_id"].as_u64()
            })
            .collect()
    }

    /// Enables auth: root (password `rootpw`), and a role for nodes with
    /// exactly what an agent needs under `prefix`, held by user `node`
    /// (password `nodepw`).
    pub fn enable_auth(&mut self, prefix: &str) -> Result<()> {
        for args in [
            vec!["user", "add", "root", "--new-user-password=rootpw"],
            vec!["role", "add", "weft-node"],
            vec![
                "role",
                "grant-permission",
                "weft-node",
                "readwrite",
                "--prefix=true",
                &format!("{prefix}/subnets/"),
            ],
            vec![
                "role",
                "grant-permission",
                "weft-node",
                "read",
                &format!("{prefix}/config"),
            ],
            vec!["user", "add", "node", "--new-user-password=nodepw"],
            vec!["user", "grant-role", "node", "weft-node"],
            vec!["auth", "enable"],
        ] {
            self.etcdctl(&args)?;
        }
        self.root_password = Some("rootpw".into());
        Ok(())
    }

    pub fn pid(&self, i: usize) -> i32 {
        self.members[i].child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// SIGKILL member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed member again (same data).
    pub fn restart(&mut self, i: usize, pki: Option<&Pki>) -> Result<()> {
        self.kill(i);
        self.spawn(i, pki)
    }

    /// SIGSTOP (true) or SIGCONT (false) every member.
    pub fn pause_all(&self, stop: bool) {
        for i in 0..self.members.len() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(
                    self.pid(i),
                    if stop { libc::SIGSTOP } else { libc::SIGCONT },
                )
            };
        }
    }

    /// Cuts member `i` off from its peers (port 2380 both ways): it still
    /// answers clients, without a leader.
    pub fn cut_from_peers(&self, i: usize) -> Result<()> {
        let r = "tcp dport 2380 drop\n tcp sport 2380 drop";
        self.nft(i, r, r)
    }

    /// Cuts member `i` off from everyone (all traffic but loopback).
    pub fn cut_off(&self, i: usize) -> Result<()> {
        self.nft(i, "iifname != \"lo\" drop", "oifname != \"lo\" drop")
    }

    /// Undoes [`EtcdCluster::cut_from_peers`] and [`EtcdCluster::cut_off`],
    /// and waits (up to 30 s) until the member serves quorum reads again,
    /// so that what the test does next does not meet a member still
    /// catching up with its leader.
    pub fn reconnect(&self, i: usize) -> Result<()> {
        let _ = self.members[i]
            .ns
            .exec("nft", &["delete", "table", "inet", "cut"]);
        let ep = format!("{}://{}:2379", self.scheme, self.members[i].ip);
        let healthy = || {
            self.etcdctl_cmd(&ep)
                .args(["endpoint", "health"])
                .output()
                .is_ok_and(|o| o.status.success())
                .then_some(())
        };
        if crate::agent::poll(Duration::from_secs(30), healthy).is_none() {
            bail!(
                "member m{i} is not healthy 30 s after it was reconnected; logs:\n{}",
                self.logs()
            );
        }
        Ok(())
    }

    fn nft(&self, i: usize, input: &str, output: &str) -> Result<()> {
        let script = format!(
            "table inet cut {{\n chain in {{ type filter hook input priority 0; policy accept;\n {input}\n }}\n chain out {{ type filter hook output priority 0; policy accept;\n {output}\n }}\n}}\n"
        );
        let path = self.members[i].dir.join("cut.nft");
        std::fs::write(&path, script)?;
        self.members[i]
            .ns
            .exec("nft", &["-f", path.to_str().expect("utf-8")])?;
        Ok(())
    }

    pub fn logs(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                format!(
                    "--- m{i}\n{}",
                    std::fs::read_to_string(m.dir.join("etcd.log")).unwrap_or_default()
                )
            })
            .collect()
    }

    /// The etcd-client options an outside observer uses (TLS and root).
    pub fn client_files(&self) -> Option<(&Path, &Path, &Path)> {
        self.tls
            .as_ref()
            .map(|(a, b, c)| (a.as_path(), b.as_path(), c.as_path()))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.pause_all(false);
        for i in 0..self.members.len() {
            self.kill(i);
        }
        for m in &self.members {
            let _ = std::fs::remove_dir_all(&m.dir);
        }
    }
}
