//! A real container, run by podman (its CNI backend) on a Weft network:
//! Weft's plugin standalone, delegating to bridge + host-local as flannel's
//! plugin would. The container reaches a pod on another node, and `podman
//! rm` leaves no endpoint behind.

use std::{path::Path, time::Duration};

use serde_json::json;
use weft::dataplane::EndpointMap;
use weft_tests::{agent::eventually, cluster::ping, podman::Podman, weft_cluster::WeftCluster};

const T: Duration = Duration::from_secs(30);

/// A tiny root filesystem: Debian's static busybox.
fn rootfs(dir: &Path) {
    for d in ["bin", "proc", "sys", "dev", "etc", "tmp", "run"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", dir.join("bin/busybox"))
        .expect("busybox-static (cargo xtask setup)");
    for tool in ["sh", "sleep", "ping", "ip"] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(tool)).unwrap();
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n").unwrap();
    std::fs::write(dir.join("etc/group"), "root:x:0:\n").unwrap();
}

#[test]
fn a_podman_container_on_a_weft_network() {
    let c = WeftCluster::new(2, &[]).unwrap();
    c.wait_meshed(T);
    let n1 = &c.nodes[0];
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-podman-"));
    rootfs(&dir.join("rootfs"));
    let weft_dir = weft_tests::agent::weft_bin()
        .parent()
        .unwrap()
        .to_path_buf();
    let podman = Podman::new(
        &dir,
        &n1.node.ns.path(),
        &[&weft_dir, Path::new("/usr/lib/cni")],
    );
    // Weft's plugin on its own, as flannel's would be; the network's name is
    // the node's pods' (cbr0), so host-local hands out addresses from one
    // record of allocations.
    let net = json!({
        "cniVersion": "1.0.0",
        "name": "cbr0",
        "plugins": [{
            "type": "weft",
            "stateDir": n1.agent.state_dir(),
            "subnetFile": n1.agent.subnet_file(),
            "dataDir": n1.node.ipam_dir,
        }],
    });
    std::fs::write(dir.join("net.d/cbr0.conflist"), net.to_string()).unwrap();

    let rootfs = dir.join("rootfs").display().to_string();
    let run = podman.run(&[
        "run",
        "-d",
        "--name",
        "weftc",
        "--network",
        "cbr0",
        "--rootfs",
        &rootfs,
        "/bin/sleep",
        "600",
    ]);
    assert!(run.status.success(), "podman run");
    let out = podman.run(&[
        "inspect",
        "weftc",
        "--format",
        "{{(index .NetworkSettings.Networks \"cbr0\").IPAddress}}",
    ]);
    let ip: std::net::Ipv4Addr = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the container's address");
    assert!(n1.subnet.contains(&ip), "{ip} in {}", n1.subnet);
    let endpoints = || {
        EndpointMap::open(c.nodes[0].pins.pins())
            .unwrap()
            .all()
            .unwrap()
    };
    eventually("the container is a registered endpoint", T, || {
        endpoints().contains_key(&ip.into()).then_some(())
    });

    // It reaches a pod on the other node, and that pod reaches it.
    let remote = c.nodes[1].node.pods[0].ip.to_string();
    let out = podman.run(&["exec", "weftc", "/bin/ping", "-c", "3", "-W", "2", &remote]);
    assert!(
        out.status.success(),
        "the container reaches a pod on node 2"
    );
    assert!(
        ping(&c.nodes[1].node.pods[0].ns, ip, 2),
        "node 2's pod reaches the container"
    );

    // podman rm runs CNI DEL: no endpoint, record or address is left.
    let out = podman.run(&["rm", "-f", "-t", "0", "weftc"]);
    assert!(out.status.success());
    eventually("the container's endpoint is gone", T, || {
        (!endpoints().contains_key(&ip.into())).then_some(())
    });
    // The endpoint can go first: the agent drops a pod whose veth is gone
    // before podman's cleanup has run CNI DEL. The record and the address
    // follow once DEL has run.
    let pods = c.nodes[0].node.pods.len();
    let records = || -> Vec<String> {
        std::fs::read_dir(c.nodes[0].agent.state_dir().join("endpoints"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let address = c.nodes[0].node.ipam_dir.join("cbr0").join(ip.to_string());
    eventually(
        "CNI DEL removed the record and released the address",
        T,
        || (records().len() == pods && !address.exists()).then_some(()),
    );
    assert_eq!(records().len(), pods, "only the test pods' records");
    assert!(!address.exists(), "host-local released the address");
    let _ = std::fs::remove_dir_all(&dir);
}
