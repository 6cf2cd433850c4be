//! podman confined to a directory of its own (storage, config, CNI
//! networks), run in a node's network namespace.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

pub struct Podman {
    pub dir: PathBuf,
    /// The namespace podman runs in (`nsenter --net`).
    pub netns: PathBuf,
}

impl Podman {
    /// Writes podman's config under `dir`: CNI backend with plugins from
    /// `cni_plugin_dirs`, networks from `dir/net.d`, runc, vfs storage,
    /// limits this machine allows.
    pub fn new(dir: &Path, netns: &Path, cni_plugin_dirs: &[&Path]) -> Self {
        for d in ["net.d", "xdg"] {
            std::fs::create_dir_all(dir.join(d)).expect("podman's directories");
        }
        let plugins: Vec<String> = cni_plugin_dirs
            .iter()
            .map(|d| format!("\"{}\"", d.display()))
            .collect();
        std::fs::write(
            dir.join("containers.conf"),
            format!(
                r#"[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[network]
network_backend = "cni"
cni_plugin_dirs = [{plugins}]
network_config_dir = "{net}"
default_network = "cbr0"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{events}"
tmp_dir = "{tmp}"
conmon_env_vars = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "WEFT_CNI_ROOTS={roots}"]
"#,
                plugins = plugins.join(", "),
                net = dir.join("net.d").display(),
                events = dir.join("events.log").display(),
                tmp = dir.join("libpod-tmp").display(),
                // conmon runs the cleanup (CNI DEL) of a container that
                // stopped with this environment only.
                roots = std::env::temp_dir().display(),
            ),
        )
        .expect("containers.conf");
        std::fs::write(
            dir.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                dir.join("graph").display(),
                dir.join("run").display()
            ),
        )
        .expect("storage.conf");
        Self {
            dir: dir.to_path_buf(),
            netns: netns.to_path_buf(),
        }
    }

    /// Runs `podman ARGS`, printing what it said.
    pub fn run(&self, args: &[&str]) -> Output {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .arg("podman")
            .args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"))
            .env("XDG_RUNTIME_DIR", self.dir.join("xdg"))
            // Passed on to the CNI plugins, as a runtime's environment is:
            // the tests keep agents' state under the temp directory.
            .env("WEFT_CNI_ROOTS", std::env::temp_dir())
            .output()
            .expect("running podman");
        println!(
            "podman {args:?}: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Removes every container of this podman (a test that failed half-way
    /// leaves them running) and what they mounted under its directory.
    fn clean_up(&self) {
        let _ = Command::new("nsenter")
            .arg(format!("--net={}", self.netns.display()))
            .args(["podman", "rm", "--all", "--force", "--time", "0"])
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"))
            .env("XDG_RUNTIME_DIR", self.dir.join("xdg"))
            .output();
        crate::proc::unmount_under(&self.dir);
    }

    /// Runs `podman ARGS` and fails unless it succeeds; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "podman {args:?} failed");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        self.clean_up();
    }
}
