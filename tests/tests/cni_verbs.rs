//! CNI 1.1's verbs about a whole network, called as libcni 1.2 calls them
//! (no container, netns or interface in the environment): STATUS answers
//! whether the node's agent can serve pods, GC releases what the plugin
//! holds for attachments the runtime no longer names.

use std::{path::Path, time::Duration};

use serde_json::Value;
use weft_tests::{
    agent::eventually,
    cni::{cni_error, weft_standalone},
    weft_cluster::{WeftCluster, WeftNode},
};

const T: Duration = Duration::from_secs(60);

fn status(n: &WeftNode) -> Result<(), Value> {
    let conf = n.node.cni.as_ref().expect("a CNI network");
    conf.network_verb(&n.node.ns, "STATUS", "weft", None)
        .map_err(|e| cni_error(&e).unwrap_or_else(|| panic!("not a CNI error: {e:#}")))
}

fn gc(n: &WeftNode, valid: Option<&[(&str, &str)]>) -> Result<(), Value> {
    let conf = n.node.cni.as_ref().expect("a CNI network");
    conf.network_verb(&n.node.ns, "GC", "weft", valid)
        .map_err(|e| cni_error(&e).unwrap_or_else(|| panic!("not a CNI error: {e:#}")))
}

/// One node whose pods Weft's standalone plugin attaches (CNI 1.1.0).
fn node() -> WeftCluster {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    let n = c.start_node(1, &[]).unwrap();
    let mut conf = weft_standalone(
        &n.agent.subnet_file(),
        &n.agent.state_dir(),
        &n.node.ipam_dir,
    );
    conf.cni_version = "1.1.0".into();
    n.node.cni = Some(conf);
    c
}

/// STATUS is 0 while the agent is ready; error 50 (with why) when it is
/// not ready (its etcd stopped answering), does not answer (stopped) or
/// does not run.
#[test]
fn status_is_ok_only_while_the_agent_is_ready() {
    let mut c = node();
    c.nodes[0].wait_metric("weft_ready", |v| v == 1.0, T);
    status(&c.nodes[0]).expect("ready");

    c.etcd.pause();
    let e = eventually("STATUS says not ready", T, || status(&c.nodes[0]).err());
    c.etcd.resume();
    assert_eq!(e["code"], 50, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("not ready"), "{e}");
    eventually("STATUS ready again", T, || status(&c.nodes[0]).ok());

    c.nodes[0].agent.pause();
    let e = status(&c.nodes[0]).expect_err("a stopped agent cannot be ready");
    c.nodes[0].agent.resume();
    assert_eq!(e["code"], 50, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("did not answer"), "{e}");

    c.nodes[0].agent.kill();
    let e = status(&c.nodes[0]).expect_err("no agent, not ready");
    assert_eq!(e["code"], 50, "{e}");
    assert!(e["msg"].as_str().unwrap().contains("not running"), "{e}");
}

/// host-local's reservations in the network's directory: (address, owner).
fn reservations(ipam_dir: &Path) -> Vec<(String, String)> {
    let mut r: Vec<(String, String)> = std::fs::read_dir(ipam_dir.join("cbr0"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.parse::<std::net::IpAddr>().ok()?;
                    let owner = std::fs::read_to_string(e.path()).ok()?;
                    Some((name, owner.replace("\r\n", "/")))
                })
                .collect()
        })
        .unwrap_or_default();
    r.sort();
    r
}

fn records(n: &WeftNode) -> Vec<String> {
    let mut r: Vec<String> = std::fs::read_dir(n.agent.state_dir().join("endpoints"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    r.sort();
    r
}

fn endpoints(n: &WeftNode) -> Vec<std::net::IpAddr> {
    let mut e: Vec<_> = weft::dataplane::EndpointMap::open(n.pins.pins())
        .and_then(|m| m.all())
        .map(|m| m.into_keys().collect())
        .unwrap_or_default();
    e.sort();
    e
}

/// GC releases exactly what belongs to attachments the runtime did not
/// name: their records, endpoints, veths and addresses, and addresses no
/// record names (an ADD that died before registering); a GC without the
/// list releases nothing; with the agent down, GC still releases.
#[test]
fn gc_releases_only_attachments_not_named() {
    let mut c = node();
    let n = &mut c.nodes[0];
    for _ in 0..3 {
        n.node.add_pod().unwrap();
    }
    eventually("three endpoints", T, || {
        (endpoints(n).len() == 3).then_some(())
    });
    // A reservation whose ADD died before the plugin registered it.
    let ghost = n.subnet.hosts().nth(200).unwrap().to_string();
    std::fs::write(n.node.ipam_dir.join("cbr0").join(&ghost), "ghost\r\neth0").unwrap();
    let before = (records(n), endpoints(n), reservations(&n.node.ipam_dir));
    assert_eq!(before.0.len(), 3, "{before:?}");
    assert_eq!(before.2.len(), 4, "{before:?}");

    // Without the list: refused, nothing released.
    let e = gc(n, None).expect_err("GC without the list");
    assert_eq!(e["code"], 7, "{e}");
    assert_eq!(
        (records(n), endpoints(n), reservations(&n.node.ipam_dir)),
        before
    );

    let ids: Vec<String> = n.node.pods.iter().map(|p| p.container_id.clone()).collect();
    let gone = (n.node.pods[1].ip, n.node.pods[1].host_if.clone());
    gc(n, Some(&[(&ids[0], "eth0"), (&ids[2], "eth0")])).expect("GC");
    let after = (records(n), endpoints(n), reservations(&n.node.ipam_dir));
    assert_eq!(after.0.len(), 2, "{after:?}");
    assert!(!after.0.iter().any(|r| r.starts_with(&ids[1])), "{after:?}");
    assert_eq!(after.1.len(), 2, "{after:?}");
    assert!(!after.1.contains(&gone.0.into()), "{after:?}");
    assert_eq!(after.2.len(), 2, "{after:?}");
    assert!(
        after.2.iter().all(|(ip, owner)| ip != &ghost
            && ip != &gone.0.to_string()
            && (owner.starts_with(&ids[0]) || owner.starts_with(&ids[2]))),
        "{after:?}"
    );
    assert!(
        n.node.ns.ifindex(&gone.1).is_none(),
        "the released pod's veth {} is gone",
        gone.1
    );
    // The pods named keep their network.
    let (a, b) = (&n.node.pods[0], &n.node.pods[2]);
    assert!(
        weft_tests::cluster::ping(&a.ns, b.ip, 3),
        "pod 0 reaches pod 2"
    );

    // The agent down: GC still releases (pod 2's record, endpoint and
    // address), and keeps pod 0's.
    n.agent.kill();
    gc(n, Some(&[(&ids[0], "eth0")])).expect("GC with the agent down");
    let down = (records(n), endpoints(n), reservations(&n.node.ipam_dir));
    assert_eq!(down.0.len(), 1, "{down:?}");
    assert!(down.0[0].starts_with(&ids[0]), "{down:?}");
    assert_eq!(
        down.1,
        vec![std::net::IpAddr::from(n.node.pods[0].ip)],
        "{down:?}"
    );
    assert_eq!(down.2.len(), 1, "{down:?}");
    assert!(down.2[0].1.starts_with(&ids[0]), "{down:?}");
}
