//! A full file system under the subnet file (a full /run) while the node
//! moves to another subnet, against a real etcd with a real agent: the
//! file never names the subnet the node lost, the agent keeps running and
//! is not ready, and once there is room the file names the new subnet.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use etcd_client::PutOptions;
use weft_tests::{
    agent::{Agent, eventually},
    etcd::Etcd,
    weft_cluster::PREFIX,
};

const CONFIG: &str = r#"{"Network":"10.6.0.0/16","Backend":{"Type":"vxlan"}}"#;
const T: Duration = Duration::from_secs(30);

/// A small tmpfs of its own, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount() -> Self {
        let dir = std::env::temp_dir().join(weft_tests::unique("weft-full-run-"));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs on {}", dir.display());
        Tmpfs(dir)
    }

    /// Writes a file until the file system is full.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = [0u8; 4096];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    break;
                }
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn flannel_subnet(file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
        .map(str::to_string)
}

fn key_of(subnet_env_value: &str) -> String {
    // FLANNEL_SUBNET=10.6.13.1/24 -> <prefix>/subnets/10.6.13.0-24
    let (ip, len) = subnet_env_value.split_once('/').unwrap();
    let mut o: Vec<u8> = ip.split('.').map(|x| x.parse().unwrap()).collect();
    o[3] -= 1;
    format!("{PREFIX}/subnets/{}.{}.{}.{}-{len}", o[0], o[1], o[2], o[3])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_during_a_move_never_leaves_the_lost_subnet_named() {
    weft_tests::require_root();
    let etcd = Etcd::start().unwrap();
    let mut c = etcd.client().await;
    c.put(format!("{PREFIX}/config"), CONFIG, None)
        .await
        .unwrap();
    let run = Tmpfs::mount();
    let file = run.0.join("subnet.env");
    let args: Vec<String> = [
        "--datapath",
        "none",
        "--etcd-endpoints",
        &etcd.endpoint,
        "--node-id",
        "node-a",
        "--public-ip",
        "198.18.0.1",
        "--subnet-lease-ttl",
        "600",
        "--retry-interval",
        "1",
        "--subnet-file",
        &file.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let a = Agent::start("a", None, &args).unwrap();
    let lost = eventually("A writes its subnet file", T, || flannel_subnet(&file));
    a.wait_metric("weft_ready", |v| v == 1.0, T).unwrap();
    a.wait_metric("weft_subnet_file_current", |v| v == 1.0, T)
        .unwrap();

    // /run fills up; then another node takes A's subnet.
    let filler = run.fill();
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put(
        key_of(&lost),
        r#"{"PublicIP":"198.18.0.2","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"02:00:00:00:00:02"},"NodeID":"node-b"}"#,
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    a.wait_metric("weft_lease_lost_total", |n| n == 1.0, T)
        .unwrap();
    a.wait_log("cannot write the subnet file", T).unwrap();
    // The file that named the lost subnet is gone (the CNI plugin refuses
    // rather than hand out node B's addresses); the agent runs on, not
    // ready, and says why.
    assert_eq!(
        flannel_subnet(&file),
        None,
        "the subnet file still names the subnet A lost; log:\n{}",
        a.log()
    );
    assert!(a.running(), "the agent exited; log:\n{}", a.log());
    a.wait_metric("weft_subnet_file_current", |v| v == 0.0, T)
        .unwrap();
    a.wait_metric("weft_ready", |v| v == 0.0, T).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(a.running(), "the agent exited; log:\n{}", a.log());
    assert!(
        !run.0.read_dir().unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")),
        "no half-written file left behind"
    );

    // Room again: the file names the new subnet, and the node is ready.
    std::fs::remove_file(filler).unwrap();
    let moved = eventually("A writes its new subnet", T, || flannel_subnet(&file));
    assert_ne!(moved, lost);
    a.wait_metric("weft_subnet_file_current", |v| v == 1.0, T)
        .unwrap();
    a.wait_metric("weft_ready", |v| v == 1.0, T).unwrap();
    let held = c.get(key_of(&moved), None).await.unwrap();
    assert!(
        held.kvs()[0].value_str().unwrap().contains("node-a"),
        "A holds the subnet its file names"
    );
    drop(a);
}
