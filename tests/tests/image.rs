//! The container image and the manifests, as an operator uses them.
//!
//! - The manifests in `deploy/` pass `kubernetes-validate --strict` for the
//!   oldest and newest Kubernetes versions supported, and `yamllint`; a
//!   manifest with a wrong field fails both ways.
//! - The image (`cargo xtask image`, given as WEFT_IMAGE) runs as one node's
//!   agent under podman with the DaemonSet's security contexts and mounts:
//!   the privileged init container's `node-init` mounts the host's bpffs
//!   (propagated to the host) and installs the agent's seccomp profile, the
//!   unprivileged `install-cni` puts the plugin and network config on the
//!   node, and the agent runs unprivileged with the DaemonSet's
//!   capabilities, that seccomp profile, HostToContainer propagation and
//!   the host's /proc/sys/net; pods attached with what it installed reach
//!   pods on the other nodes, the etcd endpoint is a host name resolved
//!   inside the image, and stopping and starting the container (an
//!   upgrade) loses no packet of a running ping. The agent container gets
//!   exactly the DaemonSet's volume mounts (read from the manifest), and
//!   with them adopts a pod another plugin attached.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ipnet::Ipv4Net;
use serde_json::Value;
use weft::dataplane::{EndpointMap, PeerMaps, PinDir};
use weft_tests::{
    agent::eventually,
    cluster::{Node, ping},
    cni::{ConfList, SYSTEM_PLUGINS},
    pins::TestPins,
    podman::Podman,
    traffic::{ping_outcome, ping_run},
    weft_cluster::{ETCD_IP, WeftCluster, http_get},
};

const T: Duration = Duration::from_secs(30);
/// The Kubernetes versions the manifests support: the oldest and newest
/// kubernetes-validate knows.
const KUBERNETES: [&str; 2] = ["1.25.0", "1.37.0"];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .expect("deploy/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

fn kubernetes_validate(file: &Path, version: &str) -> (bool, String) {
    let bin = std::env::var_os("WEFT_KUBERNETES_VALIDATE").expect(
        "WEFT_KUBERNETES_VALIDATE (cargo xtask test sets it; cargo xtask setup installs it)",
    );
    let out = Command::new(bin)
        .args(["--strict", "-k", version])
        .arg(file)
        .output()
        .expect("running kubernetes-validate");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn yamllint(file: &Path) -> (bool, String) {
    let out = Command::new("yamllint")
        .arg("--strict")
        .arg("-c")
        .arg(deploy_dir().join(".yamllint"))
        .arg(file)
        .output()
        .expect("running yamllint (cargo xtask setup)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_manifests_validate() {
    let files = manifests();
    let kinds: Vec<String> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("kind: "))
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    for want in ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"] {
        assert!(
            kinds.iter().any(|k| k == want),
            "deploy/ has a {want}: {kinds:?}"
        );
    }
    for f in &files {
        let (ok, out) = yamllint(f);
        assert!(ok, "yamllint {}: {out}", f.display());
        for v in KUBERNETES {
            let (ok, out) = kubernetes_validate(f, v);
            assert!(ok, "kubernetes-validate -k {v} {}: {out}", f.display());
        }
    }

    // The checks can fail: a misspelt field, and a badly indented line.
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-manifests-"));
    std::fs::create_dir_all(&dir).unwrap();
    let ds = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).unwrap();
    let bad = dir.join("bad-field.yaml");
    std::fs::write(&bad, ds.replace("hostNetwork: true", "hostNetwrok: true")).unwrap();
    let (ok, out) = kubernetes_validate(&bad, KUBERNETES[1]);
    assert!(!ok, "a misspelt field is refused: {out}");
    let bad = dir.join("bad-indent.yaml");
    std::fs::write(
        &bad,
        ds.replace("      hostNetwork: true", "      hostNetwork:   true "),
    )
    .unwrap();
    let (ok, out) = yamllint(&bad);
    assert!(!ok, "yamllint refuses trailing spaces: {out}");
    let _ = std::fs::remove_dir_all(&dir);

    // The DaemonSet runs the image `cargo xtask image` builds.
    if let Ok(reference) = std::env::var("WEFT_IMAGE_REF") {
        assert!(
            ds.contains(&format!("image: {reference}")),
            "the DaemonSet runs {reference}"
        );
    }
}

/// The host side of what the DaemonSet mounts, for one node.
struct HostPaths {
    root: PathBuf,
    run_flannel: PathBuf,
    run_weft: PathBuf,
    machine_id: PathBuf,
    cni_bin: PathBuf,
    cni_conf: PathBuf,
    config: PathBuf,
}

impl HostPaths {
    fn new() -> Self {
        let root = std::env::temp_dir().join(weft_tests::unique("weft-image-node-"));
        let p = Self {
            run_flannel: root.join("run-flannel"),
            run_weft: root.join("run-weft"),
            machine_id: root.join("machine-id"),
            cni_bin: root.join("opt-cni-bin"),
            cni_conf: root.join("etc-cni-net.d"),
            config: root.join("config"),
            root,
        };
        for d in [
            &p.run_flannel,
            &p.run_weft,
            &p.cni_bin,
            &p.cni_conf,
            &p.config,
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        let id: u128 = rand_id();
        std::fs::write(&p.machine_id, format!("{id:032x}\n")).unwrap();
        p
    }
}

/// A failed test's node leaves nothing: what podman mounted there, then the
/// directory.
impl Drop for HostPaths {
    fn drop(&mut self) {
        weft_tests::proc::unmount_under(&self.root);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn rand_id() -> u128 {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u128::from_le_bytes(b)
}

/// One volume mount of the DaemonSet's agent container.
struct Mount {
    /// The hostPath on a node.
    host: String,
    container: String,
    read_only: bool,
    propagation: Option<String>,
}

/// `deploy/daemonset.yaml`, as JSON.
fn daemonset() -> Value {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(deploy_dir().join("daemonset.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The agent container's hostPath mounts, as `deploy/daemonset.yaml`
/// declares them (Secrets and ConfigMaps aside).
fn manifest_mounts() -> Vec<Mount> {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let volumes = spec["volumes"].as_array().unwrap();
    let agent = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "weft")
        .expect("the DaemonSet has a container named weft");
    agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let vol = volumes.iter().find(|v| v["name"] == m["name"])?;
            Some(Mount {
                host: vol["hostPath"]["path"].as_str()?.to_string(),
                container: m["mountPath"].as_str().unwrap().to_string(),
                read_only: m["readOnly"].as_bool().unwrap_or(false),
                propagation: m["mountPropagation"].as_str().map(str::to_string),
            })
        })
        .collect()
}

fn v(host: &Path, container: &str, opts: &str) -> String {
    format!("{}:{container}{opts}", host.display())
}

/// A node whose etcd is plaintext has no Secret: every Secret the
/// DaemonSet mounts is optional, or its pods would never start there (this
/// test's agent runs without one).
#[test]
fn the_daemonsets_secrets_are_optional() {
    let ds = daemonset();
    let secrets: Vec<&Value> = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("secret").is_some())
        .collect();
    assert!(!secrets.is_empty(), "the etcd TLS Secret is mounted");
    for v in secrets {
        assert_eq!(v["secret"]["optional"], true, "{v}");
    }
}

#[test]
fn the_image_as_a_node_agent() {
    let archive = std::env::var("WEFT_IMAGE").expect(
        "WEFT_IMAGE: the image's OCI archive (cargo xtask test builds it with cargo xtask image)",
    );
    let reference = std::env::var("WEFT_IMAGE_REF").expect("WEFT_IMAGE_REF");
    let mut c = WeftCluster::new(2, &[]).unwrap();
    for n in &mut c.nodes {
        n.use_cni();
        n.node.add_pod().unwrap();
    }
    let mut node = Node::new(&c.underlay, 3).unwrap();
    // No bpffs yet: node-init mounts it, as on a fresh node.
    let pins = TestPins::shared_unmounted();
    let host = HostPaths::new();
    let seccomp = host.root.join("kubelet-seccomp");
    std::fs::create_dir_all(&seccomp).unwrap();
    let podman = Podman::new(
        &host.root.join("podman"),
        &node.ns.path(),
        &[Path::new(SYSTEM_PLUGINS)],
    );
    podman.ok(&["load", "-i", &archive]);

    // The network config the ConfigMap carries, pointed at this node's
    // host paths (on a real node they are the defaults).
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "cbr0",
        "plugins": [
            {"type": "weft", "subnetFile": host.run_flannel.join("subnet.env"),
             "stateDir": host.run_weft, "dataDir": node.ipam_dir},
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    std::fs::write(host.config.join("cni-conf.json"), conflist.to_string()).unwrap();

    // The first init container: node-init, privileged, the host's bpffs
    // with Bidirectional propagation (rshared) and the kubelet's seccomp
    // directory.
    podman.ok(&[
        "run",
        "--rm",
        "--network",
        "host",
        "--privileged",
        "-v",
        &v(pins.path(), "/sys/fs/bpf", ":rshared"),
        "-v",
        &v(&seccomp, "/host/var/lib/kubelet/seccomp", ""),
        &reference,
        "node-init",
        "--bpffs-root",
        "/sys/fs/bpf",
        "--seccomp-dir",
        "/host/var/lib/kubelet/seccomp",
    ]);
    assert!(
        weft::dataplane::is_bpffs(pins.path()).unwrap(),
        "the host sees the bpffs node-init mounted"
    );
    let profile = seccomp.join("weft-agent.json");
    assert!(profile.exists(), "the seccomp profile is installed");

    // The second: install-cni, unprivileged, no capabilities.
    podman.ok(&[
        "run",
        "--rm",
        "--network",
        "host",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "-v",
        &v(&host.cni_bin, "/opt/cni/bin", ""),
        "-v",
        &v(&host.cni_conf, "/etc/cni/net.d", ""),
        "-v",
        &v(&host.config, "/etc/weft/config", ":ro"),
        &reference,
        "install-cni",
        "--conflist",
        "/etc/weft/config/cni-conf.json",
    ]);
    assert!(
        host.cni_bin.join("weft").exists(),
        "the plugin is installed"
    );
    let installed = host.cni_conf.join("10-weft.conflist");
    assert!(installed.exists(), "the network config is installed");

    // The agent: unprivileged, the DaemonSet's capabilities and seccomp
    // profile, host network, the DaemonSet's mounts, etcd by host name.
    let etcd_name = "etcd.weft.test";
    let ipam_dir = node.ipam_dir.clone();
    std::fs::create_dir_all(&ipam_dir).unwrap();
    let results = node.cni_cache_dir.join("results");
    std::fs::create_dir_all(&results).unwrap();
    // Each hostPath the DaemonSet mounts into the agent, at this node's
    // place for it.
    let mounts: Vec<String> = manifest_mounts()
        .iter()
        .map(|m| {
            let here = match m.host.as_str() {
                "/run/flannel" => host.run_flannel.clone(),
                "/run/weft" => host.run_weft.clone(),
                "/etc/machine-id" => host.machine_id.clone(),
                "/sys/fs/bpf" => pins.path().to_path_buf(),
                "/proc/sys/net" => PathBuf::from("/proc/sys/net"),
                "/var/lib/cni/networks" => ipam_dir.clone(),
                "/var/lib/cni/results" => results.clone(),
                "/etc/cni/net.d" => host.cni_conf.clone(),
                other => panic!("the DaemonSet mounts {other}: give it a place in this test"),
            };
            let mut opts: Vec<&str> = Vec::new();
            if m.read_only {
                opts.push("ro");
            }
            match m.propagation.as_deref() {
                None | Some("None") => {}
                Some("HostToContainer") => opts.push("rslave"),
                Some(p) => panic!("mountPropagation {p} of {}", m.container),
            }
            let opts = if opts.is_empty() {
                String::new()
            } else {
                format!(":{}", opts.join(","))
            };
            v(&here, &m.container, &opts)
        })
        .collect();
    for want in [
        "/run/flannel",
        "/sys/fs/bpf",
        "/var/lib/cni/networks",
        "/var/lib/cni/results",
        "/etc/cni/net.d",
    ] {
        assert!(
            mounts.iter().any(|m| m.contains(&format!(":{want}"))),
            "the DaemonSet mounts {want} into the agent: {mounts:?}"
        );
    }
    // The agent container's securityContext and environment as the
    // manifest writes them.
    let ds = daemonset();
    let agent_spec = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "weft")
        .unwrap()
        .clone();
    let sc = &agent_spec["securityContext"];
    assert_eq!(sc["privileged"], false, "the agent is not privileged");
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let caps: Vec<String> = sc["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let caps = caps.join(",");
    assert_eq!(
        sc["seccompProfile"]["localhostProfile"], "weft-agent.json",
        "the profile node-init installs"
    );
    let no_new_privileges = sc["allowPrivilegeEscalation"] == false;
    let env: Vec<String> = agent_spec["env"]
        .as_array()
        .map(|e| {
            e.iter()
                .map(|v| {
                    format!(
                        "{}={}",
                        v["name"].as_str().unwrap(),
                        v["value"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let agent_args: Vec<String> = agent_spec["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let seccomp_opt = format!("seccomp={}", profile.display());
    let add_host = format!("{etcd_name}:{ETCD_IP}");
    let etcd_env = format!("FLANNELD_ETCD_ENDPOINTS=http://{etcd_name}:2379");
    let run_agent = || {
        let mut args: Vec<&str> = vec!["run"];
        for m in &mounts {
            args.extend(["-v", m]);
        }
        args.extend([
            "-d",
            "--name",
            "weft",
            "--network",
            "host",
            "--cap-drop",
            "all",
            "--cap-add",
            &caps,
            "--security-opt",
            &seccomp_opt,
            "--add-host",
            &add_host,
        ]);
        if no_new_privileges {
            args.extend(["--security-opt", "no-new-privileges"]);
        }
        for e in &env {
            args.extend(["-e", e]);
        }
        // The ConfigMap's settings for this node.
        args.extend([
            "-e",
            &etcd_env,
            "-e",
            "FLANNELD_IFACE=eth0",
            "-e",
            "FLANNELD_HEALTHZ_PORT=8081",
            &reference,
        ]);
        args.extend(agent_args.iter().map(String::as_str));
        podman.ok(&args)
    };
    run_agent();
    let subnet_file = host.run_flannel.join("subnet.env");
    let subnet: Ipv4Net = eventually("the containerized agent writes subnet.env", T, || {
        let env = std::fs::read_to_string(&subnet_file).ok()?;
        env.lines()
            .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))?
            .parse::<Ipv4Net>()
            .ok()
    })
    .trunc();
    let node_pins = PinDir::new(pins.path().join("weft"));
    let peers = || {
        PeerMaps::open(&node_pins)
            .and_then(|m| m.peers())
            .map(|p| p.len())
            .unwrap_or(0)
    };
    eventually("the containerized agent programs both peers", T, || {
        (peers() == 2).then_some(())
    });

    // A pod another plugin attached (flannel's chain: bridge and
    // host-local, no `weft` line): the agent finds its result in libcni's
    // cache through the DaemonSet's mounts and adopts it for host routing.
    node.use_subnet(subnet, 1450);
    let adopted_ip = node.add_pod().unwrap().ip;
    eventually(
        "the containerized agent adopts the other plugin's pod",
        T,
        || {
            EndpointMap::open(&node_pins)
                .and_then(|m| m.all())
                .ok()?
                .iter()
                .any(|(ip, _)| *ip == std::net::IpAddr::V4(adopted_ip))
                .then_some(())
        },
    );

    // Pods attached with what install-cni put on the node, as a runtime
    // reads it from /etc/cni/net.d and /opt/cni/bin.
    let text: Value = serde_json::from_str(&std::fs::read_to_string(&installed).unwrap()).unwrap();
    node.cni = Some(ConfList {
        name: text["name"].as_str().unwrap().to_string(),
        cni_version: text["cniVersion"].as_str().unwrap().to_string(),
        plugins: text["plugins"].as_array().unwrap().clone(),
        path: vec![host.cni_bin.clone(), PathBuf::from(SYSTEM_PLUGINS)],
    });
    let pod_ip = node.add_pod().unwrap().ip;
    assert!(subnet.contains(&pod_ip), "{pod_ip} in {subnet}");
    let pod = node.pods.last().unwrap();
    for other in &c.nodes {
        let far = &other.node.pods[0];
        eventually("pods reach each other across the image's node", T, || {
            (ping(&pod.ns, far.ip, 1) && ping(&far.ns, pod_ip, 1)).then_some(())
        });
    }

    // `kubectl exec ... weft doctor` in the agent's container as the
    // manifest makes it: every check it makes passes there (what it reads
    // is mounted), in text and as JSON.
    eventually("the containerized agent is ready", T, || {
        http_get(&node.ns, node.ip, 8081, "/readyz")
            .ok()
            .filter(|(status, _)| status.contains("200"))
    });
    let doctor = podman.run(&["exec", "weft", "/weft", "doctor"]);
    assert!(
        doctor.status.success(),
        "weft doctor in the container:\n{}",
        String::from_utf8_lossy(&doctor.stdout)
    );
    let doctor = podman.run(&["exec", "weft", "/weft", "doctor", "--json"]);
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap_or_else(|e| {
        panic!(
            "weft doctor --json printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&doctor.stdout)
        )
    });
    assert_eq!(report["passed"], true, "{report:#}");
    let cni = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "cni")
        .unwrap_or_else(|| panic!("no cni check: {report:#}"));
    assert_eq!(cni["level"], "ok", "{report:#}");

    // An upgrade: the container stops and starts while a ping runs.
    let far: Ipv4Addr = c.nodes[0].node.pods[0].ip;
    let pinger = ping_run(&pod.ns, far, 1500);
    std::thread::sleep(Duration::from_secs(3));
    podman.ok(&["stop", "-t", "10", "weft"]);
    podman.ok(&["rm", "weft"]);
    run_agent();
    eventually("the restarted container is ready", T, || {
        http_get(&node.ns, node.ip, 8081, "/readyz")
            .ok()
            .filter(|(status, _)| status.contains("200"))
    });
    let (sent, received) = ping_outcome(pinger);
    assert_eq!(
        (sent, received),
        (1500, 1500),
        "no packet lost across the upgrade"
    );
    // What the DaemonSet's resource requests rest on: the agent's memory and
    // its CPU while idle (3 peers, pods, the periodic checks).
    let pid = podman.ok(&["inspect", "weft", "--format", "{{.State.Pid}}"]);
    let cpu_ticks = || -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()
    };
    let before = cpu_ticks();
    std::thread::sleep(Duration::from_secs(10));
    let millicores = (cpu_ticks() - before) / 100.0 / 10.0 * 1000.0;
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_string()))
        .unwrap();
    println!("the containerized agent: RSS {rss}, CPU {millicores:.1} millicores idle");
    let logs = podman.ok(&["logs", "weft"]);
    println!("{logs}");
    podman.run(&["rm", "-f", "-t", "0", "weft"]);
    drop(c);
    drop(node);
    drop(pins);
}
