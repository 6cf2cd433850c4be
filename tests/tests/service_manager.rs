//! The agent under systemd: `deploy/systemd/weft.service` is a unit
//! systemd accepts, and the agent speaks the notify protocol its
//! `Type=notify` relies on (READY=1 once the lease is held and the
//! dataplane is up, STATUS naming the subnet, STOPPING=1), tested through
//! `NOTIFY_SOCKET` as systemd sets it, since systemd is not PID 1 here.

use std::{os::unix::net::UnixDatagram, path::PathBuf, time::Duration};

use weft_tests::{agent::Agent, cluster::Node, pins::TestPins, weft_cluster::WeftCluster};

fn unit_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/weft.service")
}

#[test]
fn the_unit_verifies() {
    let text = std::fs::read_to_string(unit_file()).unwrap();
    assert!(text.contains("\nType=notify\n"), "Type=notify");
    // systemd-analyze checks the binary named exists: this build's.
    let bin = weft_tests::agent::weft_bin();
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-unit-"));
    std::fs::create_dir_all(&dir).unwrap();
    let unit = dir.join("weft.service");
    std::fs::write(
        &unit,
        text.replace("/usr/local/bin/weft", bin.to_str().unwrap()),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    // Warnings about the units it names but this machine lacks are not the
    // unit's; anything about its own lines is.
    let own: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("weft.service:"))
        .collect();
    assert!(out.status.success() && own.is_empty(), "{said}");
}

/// The notify messages an agent sent to `sock`, until one contains `until`.
fn messages_until(sock: &UnixDatagram, until: &str, within: Duration) -> Vec<String> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = std::time::Instant::now() + weft_tests::scaled(within);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while std::time::Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = m.contains(until);
            got.push(m);
            if done {
                return got;
            }
        }
    }
    panic!("no {until:?} within {within:?}; got {got:?}");
}

fn start(c: &WeftCluster, node: Node, notify_socket: &str) -> (Node, Agent, TestPins) {
    let i = node.index;
    let pins = TestPins::new();
    let args = c.agent_args(&node, &pins, &[]);
    let agent = Agent::start_with_env(
        &format!("node{i}"),
        Some(&node.ns),
        &args,
        &[("NOTIFY_SOCKET", notify_socket)],
    )
    .unwrap();
    (node, agent, pins)
}

fn subnet_of(agent: &Agent) -> String {
    std::fs::read_to_string(agent.subnet_file())
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET=").map(str::to_string))
        .unwrap()
}

#[test]
fn the_agent_notifies_the_service_manager() {
    let c = WeftCluster::new(0, &[]).unwrap();
    // A socket path, as systemd's /run/systemd/notify.
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-notify-"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    let node = Node::new(&c.underlay, 1).unwrap();
    let (node, mut agent, pins) = start(&c, node, path.to_str().unwrap());
    let got = messages_until(&sock, "READY=1", Duration::from_secs(60));
    let ready = got.last().unwrap();
    // READY comes with the subnet file written and naming the subnet.
    let subnet = subnet_of(&agent);
    let net: ipnet::Ipv4Net = subnet.parse().unwrap();
    assert!(
        ready.contains(&format!("STATUS=holding {}", net.trunc())),
        "{ready:?} names {subnet}"
    );
    messages_until(&sock, "; ready", Duration::from_secs(60));
    agent.stop().unwrap();
    messages_until(&sock, "STOPPING=1", Duration::from_secs(10));
    drop((node, pins));

    // An abstract socket (`@name`), as systemd may set it: abstract names
    // belong to a network namespace, so it is bound in the node's.
    let name = format!("weft-notify-{}", std::process::id());
    let node = Node::new(&c.underlay, 2).unwrap();
    let sock = node
        .ns
        .run({
            let name = name.clone();
            move || {
                use std::os::linux::net::SocketAddrExt as _;
                let addr =
                    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
                UnixDatagram::bind_addr(&addr).unwrap()
            }
        })
        .unwrap();
    let (_node, mut agent, _pins) = start(&c, node, &format!("@{name}"));
    messages_until(&sock, "READY=1", Duration::from_secs(60));
    agent.stop().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
