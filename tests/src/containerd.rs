//! containerd as a node's container runtime, and a CRI client that makes
//! pods the way the kubelet does: RunPodSandbox with a pod's metadata,
//! PodSandboxStatus for the IPs, StopPodSandbox, RemovePodSandbox.
//!
//! One containerd per node, each with a root, state, socket and CNI config
//! directory of its own, run in the node's network namespace. Its CRI
//! plugin calls the CNI plugins through go-cni and libcni, which keep their
//! result cache in `/var/lib/cni`: each containerd runs in a mount
//! namespace of its own where the node's cache directory is mounted there,
//! so a node's agent reads its own runtime's cache. `/run/netns` stays
//! shared with the host (as on a node), so the namespaces containerd pins
//! for its sandboxes outlive a containerd restart.
//!
//! The sandbox ("pause") image is built here (no registry is reachable):
//! Debian's static busybox sleeping, imported with `ctr images import` as
//! an operator imports an image.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    self as cri, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// The sandbox image every test containerd uses.
pub const PAUSE_IMAGE: &str = "localhost/weft-pause:test";

/// containerd's CRI namespace (the one the kubelet's pods live in).
const K8S_NAMESPACE: &str = "k8s.io";

/// A containerd of one node.
pub struct Containerd {
    pub dir: PathBuf,
    netns: PathBuf,
    cache_dir: PathBuf,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
    channel: Option<Channel>,
}

/// A pod sandbox containerd made: its id, the addresses its CNI result
/// gave, and the pid of its pause process (whose network namespace is the
/// pod's).
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
    pub pid: u32,
    /// The network namespace containerd pinned for it (under /run/netns).
    pub netns_path: Option<String>,
}

impl Sandbox {
    /// The pod's first address of the family of `v6`.
    pub fn ip(&self, v6: bool) -> Option<IpAddr> {
        self.ips.iter().copied().find(|ip| ip.is_ipv6() == v6)
    }

    /// The pod's network namespace.
    pub fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid))
    }

    /// A command run in the pod's network namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.netns().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Whether `count` pings from the pod to `to` are answered (any one).
    pub fn ping(&self, to: IpAddr, count: u32) -> bool {
        self.command("ping")
            .args([
                "-c",
                &count.to_string(),
                "-W",
                "1",
                "-i",
                "0.2",
                &to.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Containerd {
    /// Starts a containerd for the node whose network namespace is `netns`
    /// and whose libcni cache is `cache_dir`, with CNI plugins from
    /// `cni_bin_dirs` (linked into one directory: containerd 1.6 takes one)
    /// and network configs from `<dir>/net.d`. The pause image is imported.
    /// `dir` (and whatever else the test put there) is removed on drop.
    pub fn start(
        dir: &Path,
        netns: &Path,
        cache_dir: &Path,
        cni_bin_dirs: &[&Path],
    ) -> Result<Self> {
        crate::require_root();
        for d in ["net.d", "bin", "logs"] {
            std::fs::create_dir_all(dir.join(d)).context("containerd's directories")?;
        }
        std::fs::create_dir_all(cache_dir)?;
        // The mount point of every node's cache (its content is the host's
        // own, never written: each containerd sees its node's there).
        std::fs::create_dir_all("/var/lib/cni")?;
        link_plugins(&dir.join("bin"), cni_bin_dirs)?;
        std::fs::write(dir.join("config.toml"), config(dir))?;
        let mut c = Self {
            dir: dir.to_path_buf(),
            netns: netns.to_path_buf(),
            cache_dir: cache_dir.to_path_buf(),
            child: None,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
            channel: None,
        };
        c.spawn()?;
        c.import(&pause_image()?)?;
        Ok(c)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    fn spawn(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(self.socket());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))?;
        // A mount namespace of its own in which the node's cache directory
        // is /var/lib/cni. The mount that holds /var/lib/cni is made private
        // there first, so the bind mount never reaches the host's namespace;
        // /run/netns (its own shared mount) stays shared both ways.
        let script = r#"set -e
m=$(findmnt -n -o TARGET --target /var/lib/cni)
mount --make-private "$m"
mount --bind "$1" /var/lib/cni
exec nsenter --net="$2" -- containerd --config "$3""#;
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "unchanged",
                "--",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(&self.cache_dir)
            .arg(&self.netns)
            .arg(self.dir.join("config.toml"))
            // libcni runs the plugins with the runtime's environment: the
            // tests keep agents' state under the temp directory.
            .env("WEFT_CNI_ROOTS", std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting containerd (cargo xtask setup installs it)")?;
        self.child = Some(child);
        let deadline = Instant::now() + crate::scaled(Duration::from_secs(30));
        loop {
            if let Some(s) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("containerd exited ({s}):\n{}", self.log());
            }
            if self.socket().exists()
                && let Ok(ch) = self.rt.block_on(connect(self.socket()))
            {
                let mut rt = RuntimeServiceClient::new(ch.clone());
                let ready = self.rt.block_on(rt.version(cri::VersionRequest::default()));
                if ready.is_ok() {
                    self.channel = Some(ch);
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "containerd's CRI did not answer within 30 s:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// containerd's log and runc's, for a failed test.
    fn print_logs(&self) {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        println!("--- containerd {} (last lines) ---", self.dir.display());
        for l in tail.iter().rev() {
            println!("{l}");
        }
        let tasks = self
            .dir
            .join("state/io.containerd.runtime.v2.task")
            .join(K8S_NAMESPACE);
        for id in std::fs::read_dir(tasks).into_iter().flatten().flatten() {
            if let Ok(text) = std::fs::read_to_string(id.path().join("log.json")) {
                println!("--- runc's log for {:?} ---\n{text}", id.file_name());
            }
        }
    }

    /// Stops containerd (SIGTERM) and starts it again with the same
    /// config; its sandboxes run on (their shims outlive it).
    pub fn restart(&mut self) -> Result<()> {
        self.stop_daemon();
        self.spawn()
    }

    fn stop_daemon(&mut self) {
        self.channel = None;
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone().expect("containerd is running"))
    }

    /// `ctr -n k8s.io images import ARCHIVE`, as an operator loads an image
    /// onto a containerd node.
    pub fn import(&self, archive: &Path) -> Result<String> {
        crate::proc::run(
            "ctr",
            &[
                "--address",
                self.socket().to_str().context("a path")?,
                "-n",
                K8S_NAMESPACE,
                "images",
                "import",
                archive.to_str().context("a path")?,
            ],
        )
    }

    /// The images CRI lists (what the kubelet sees): their tags.
    pub fn images(&self) -> Result<Vec<String>> {
        let mut c = ImageServiceClient::new(self.channel.clone().expect("containerd is running"));
        let list = self
            .rt
            .block_on(c.list_images(cri::ListImagesRequest::default()))?
            .into_inner();
        Ok(list.images.into_iter().flat_map(|i| i.repo_tags).collect())
    }

    /// Writes the node's one network config (containerd takes the first
    /// by name).
    pub fn set_network(&self, conflist: &serde_json::Value) -> Result<()> {
        let path = self.dir.join("net.d/10-weft.conflist");
        let tmp = self.dir.join("net.d/.10-weft.conflist.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(conflist)?)?;
        std::fs::rename(tmp, path)?;
        Ok(())
    }

    /// Makes a pod's sandbox as the kubelet does (RunPodSandbox, then
    /// PodSandboxStatus for its addresses).
    pub fn run_pod(&self, name: &str) -> Result<Sandbox> {
        self.run_pods(&[name]).pop().expect("one")
    }

    /// Makes several pods' sandboxes at once, as the kubelet does when many
    /// pods land on a node together.
    pub fn run_pods(&self, names: &[&str]) -> Vec<Result<Sandbox>> {
        let logs = self.dir.join("logs");
        self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (i, name) in names.iter().enumerate() {
                let (mut c, name, logs) = (self.runtime(), name.to_string(), logs.clone());
                set.spawn(async move { (i, run_pod(&mut c, &name, &logs).await) });
            }
            let mut out: Vec<Option<Result<Sandbox>>> = names.iter().map(|_| None).collect();
            while let Some(r) = set.join_next().await {
                let (i, r) = r.expect("the task ran");
                out[i] = Some(r);
            }
            out.into_iter()
                .map(|r| r.expect("every task answered"))
                .collect()
        })
    }

    /// StopPodSandbox (CNI DEL) and RemovePodSandbox.
    pub fn remove_pod(&self, id: &str) -> Result<()> {
        let mut c = self.runtime();
        self.rt.block_on(async {
            c.stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .context("StopPodSandbox")?;
            c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .context("RemovePodSandbox")?;
            Ok(())
        })
    }

    /// The ids of the sandboxes containerd knows.
    pub fn sandboxes(&self) -> Result<Vec<String>> {
        let mut c = self.runtime();
        let list = self
            .rt
            .block_on(c.list_pod_sandbox(cri::ListPodSandboxRequest::default()))?
            .into_inner();
        Ok(list.items.into_iter().map(|s| s.id).collect())
    }

    /// A sandbox's status as PodSandboxStatus reports it now.
    pub fn status(&self, id: &str) -> Result<Sandbox> {
        let mut c = self.runtime();
        self.rt.block_on(status(&mut c, id))
    }

    /// The libcni cache entries of this node (`results/`).
    pub fn cache_entries(&self) -> Vec<String> {
        std::fs::read_dir(self.cache_dir.join("results"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        // Sandboxes first (their shims and pause processes, CNI DEL, the
        // pinned namespaces), while containerd can still do it.
        if self.channel.is_some() {
            for id in self.sandboxes().unwrap_or_default() {
                let _ = self.remove_pod(&id);
            }
        }
        self.stop_daemon();
        // Shims of sandboxes that could not be removed.
        let address = self.socket().display().to_string();
        for pid in crate::proc::pids_with_arg(&address) {
            // SAFETY: kill(2) on a shim this containerd started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn connect(socket: PathBuf) -> Result<Channel> {
    let ch = Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await?;
    Ok(ch)
}

async fn run_pod(
    c: &mut RuntimeServiceClient<Channel>,
    name: &str,
    logs: &Path,
) -> Result<Sandbox> {
    let uid = format!("{:032x}", rand::random::<u128>());
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid,
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: logs.join(name).display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Pod as i32,
                    pid: cri::NamespaceMode::Pod as i32,
                    ipc: cri::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = c
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .with_context(|| format!("RunPodSandbox {name}"))?
        .into_inner()
        .pod_sandbox_id;
    status(c, &id).await
}

async fn status(c: &mut RuntimeServiceClient<Channel>, id: &str) -> Result<Sandbox> {
    let s = c
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: true,
        })
        .await
        .with_context(|| format!("PodSandboxStatus {id}"))?
        .into_inner();
    let status = s.status.context("no status")?;
    let net = status.network.unwrap_or_default();
    let mut ips: Vec<IpAddr> = Vec::new();
    for ip in std::iter::once(net.ip).chain(net.additional_ips.into_iter().map(|p| p.ip)) {
        if !ip.is_empty() {
            ips.push(ip.parse().with_context(|| format!("an address: {ip}"))?);
        }
    }
    let info: serde_json::Value =
        serde_json::from_str(s.info.get("info").context("no verbose info")?)?;
    let pid = info["pid"]
        .as_u64()
        .context("no pid in the sandbox's info")? as u32;
    let netns_path = info["runtimeSpec"]["linux"]["namespaces"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["type"] == "network"))
        .and_then(|n| n["path"].as_str())
        .map(str::to_string);
    Ok(Sandbox {
        id: id.to_string(),
        name: status.metadata.map(|m| m.name).unwrap_or_default(),
        ips,
        pid,
        netns_path,
    })
}

/// containerd's config: everything under `dir`, CRI with the test pause
/// image, the native snapshotter (no overlay mounts needed), runc, CNI from
/// `dir/bin` and `dir/net.d`.
fn config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The sandbox's oom_score_adj no lower than containerd's own: this
  # machine refuses lowering it (-998, the kubelet's for pause) even to root.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/bin"
    conf_dir = "{d}/net.d"
"#
    )
}

/// Links every plugin of `dirs` into `bin` (the first directory's win).
fn link_plugins(bin: &Path, dirs: &[&Path]) -> Result<()> {
    for d in dirs {
        for e in std::fs::read_dir(d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let to = bin.join(e.file_name());
            if !to.exists() {
                std::os::unix::fs::symlink(e.path(), to)?;
            }
        }
    }
    Ok(())
}

/// The pause image's archive: busybox, sleeping. Built once on a machine
/// (it depends on nothing the tests change) and kept in the temp directory
/// for the next test processes.
pub fn pause_image() -> Result<PathBuf> {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| build_pause_image().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_pause_image() -> Result<PathBuf> {
    let archive = std::env::temp_dir().join("weft-pause-image.tar");
    if archive.exists() {
        return Ok(archive);
    }
    let dir = std::env::temp_dir().join(crate::unique("weft-pause-"));
    let built = build_pause_image_in(&dir);
    // Test processes may build it at once: the first rename wins, and each
    // is a whole archive.
    let out = built.and_then(|tar| Ok(std::fs::rename(tar, &archive)?));
    let _ = std::fs::remove_dir_all(&dir);
    out.map(|()| archive)
}

fn build_pause_image_in(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::copy("/bin/busybox", dir.join("busybox"))
        .context("busybox-static (cargo xtask setup)")?;
    std::fs::write(
        dir.join("Containerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\", \"sleep\", \"infinity\"]\n",
    )?;
    std::fs::write(
        dir.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n",
            dir.display()
        ),
    )?;
    let buildah = |args: &[&str]| -> Result<()> {
        let out = Command::new("buildah")
            .args(args)
            .current_dir(dir)
            .env("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"))
            .output()
            .context("running buildah (cargo xtask setup installs it)")?;
        if !out.status.success() {
            bail!("buildah {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    buildah(&["build", "--isolation", "chroot", "-t", PAUSE_IMAGE, "."])?;
    let archive = dir.join("pause.tar");
    buildah(&[
        "push",
        PAUSE_IMAGE,
        &format!("oci-archive:{}:{PAUSE_IMAGE}", archive.display()),
    ])?;
    // buildah's vfs storage goes with the directory; its run directory may
    // hold a mount.
    buildah(&["rmi", "--all", "--force"])?;
    Ok(archive)
}
