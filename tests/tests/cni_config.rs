//! A CNI network config is not trusted more than the runtime's environment
//! (a Multus NetworkAttachmentDefinition is namespaced: whoever writes one
//! must not get root on the node through it). Weft's plugin, invoked as a
//! runtime invokes it, refuses a delegate that names a plugin by path or
//! sets anything beyond the bridge's own behaviour, a bridge that is the
//! uplink, and paths outside their roots: a CNI error with code 7 (invalid
//! network config), nothing run, nothing changed on the node.

use serde_json::{Value, json};
use weft_tests::{
    cluster::{Node, Underlay},
    cni::{ConfList, Invocation, SYSTEM_PLUGINS, cni_error},
    netns::Netns,
};

#[test]
fn a_hostile_network_config_runs_nothing_and_changes_nothing() {
    weft_tests::require_root();
    let underlay = Underlay::new().unwrap();
    let node = Node::new(&underlay, 1).unwrap();
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-cni-hostile-"));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // What a hostile config would have run: writes a marker.
    let marker = dir.join("marker");
    for script in [dir.join("x"), bin.join("evil")] {
        std::fs::write(
            &script,
            format!("#!/bin/sh\ntouch {}\necho '{{}}'\n", marker.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let state = dir.join("state");
    let subnet_file = dir.join("subnet.env");
    std::fs::write(
        &subnet_file,
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n",
    )
    .unwrap();
    let weft_dir = weft_tests::agent::weft_bin()
        .parent()
        .unwrap()
        .to_path_buf();
    let list = ConfList {
        name: "cbr0".into(),
        cni_version: "1.0.0".into(),
        plugins: vec![],
        path: vec![weft_dir, bin.clone(), SYSTEM_PLUGINS.into()],
    };
    let links_before = node.ns.ip(&["-o", "link", "show"]).unwrap();
    let pod = Netns::new("wq").unwrap();
    let base = json!({
        "type": "weft",
        "stateDir": state,
        "subnetFile": subnet_file,
        "dataDir": node.ipam_dir,
    });
    let with = |patch: Value| {
        let mut c = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let hostile = [
        (
            "an absolute delegate type",
            with(json!({"delegate": {"type": dir.join("x")}})),
        ),
        (
            "a relative delegate type",
            with(json!({"delegate": {"type": "../x"}})),
        ),
        (
            "a delegate plugin from CNI_PATH",
            with(json!({"delegate": {"type": "evil"}})),
        ),
        (
            "the uplink as the delegate's bridge",
            with(json!({"delegate": {"bridge": "eth0"}})),
        ),
        ("the uplink as the bridge", with(json!({"bridge": "eth0"}))),
        (
            "a state dir outside the roots",
            with(json!({"stateDir": "/etc/weft-hostile-state"})),
        ),
        (
            "a subnet file outside the roots",
            with(json!({"subnetFile": "/etc/shadow"})),
        ),
        (
            "a data dir with ..",
            with(json!({"dataDir": format!("{}/../../etc", node.ipam_dir.display())})),
        ),
    ];
    for (what, conf) in &hostile {
        let at = Invocation {
            runtime_ns: &node.ns,
            container_id: "hostile0",
            pod: Some(&pod),
            ifname: "eth0",
            args: "",
        };
        let err = list
            .exec(&at, "ADD", conf, None)
            .expect_err(&format!("{what}: refused"));
        let e = cni_error(&err).unwrap_or_else(|| panic!("{what}: a CNI error, got {err:#}"));
        assert_eq!(e["code"], 7, "{what}: {e}");
        assert!(!marker.exists(), "{what}: ran the hostile script");
    }
    assert!(!marker.exists());
    assert!(!std::path::Path::new("/etc/weft-hostile-state").exists());
    assert!(!state.exists(), "no record written");
    assert_eq!(
        node.ns.ip(&["-o", "link", "show"]).unwrap(),
        links_before,
        "no device created on the node"
    );
    assert_eq!(
        pod.ip(&["-o", "link", "show"]).unwrap().lines().count(),
        1,
        "the pod got nothing but its loopback"
    );
    // The same config without the hostile field works.
    let at = Invocation {
        runtime_ns: &node.ns,
        container_id: "fine0",
        pod: Some(&pod),
        ifname: "eth0",
        args: "",
    };
    let ok = list
        .exec(
            &at,
            "ADD",
            &with(json!({"delegate": {"hairpinMode": true}})),
            None,
        )
        .unwrap();
    assert!(
        ok["ips"][0]["address"]
            .as_str()
            .unwrap()
            .starts_with("10.244.7."),
        "{ok}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
