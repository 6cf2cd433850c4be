//! The `weft` command line: help, version, and clear errors for bad input.

use weft_tests::agent::weft;

#[test]
fn help_and_version() {
    let (ok, out, _) = weft(&["--help"]);
    assert!(ok);
    for cmd in ["agent", "leases", "status", "counters", "teardown"] {
        assert!(out.contains(cmd), "--help lists {cmd}: {out}");
    }
    let (ok, out, _) = weft(&["--version"]);
    assert!(ok);
    assert_eq!(out.trim(), format!("weft {}", env!("CARGO_PKG_VERSION")));
    let (ok, out, _) = weft(&["agent", "--help"]);
    assert!(ok);
    for flag in [
        "--etcd-endpoints",
        "--etcd-prefix",
        "--etcd-cafile",
        "--etcd-certfile",
        "--etcd-keyfile",
        "--etcd-username",
        "--etcd-password",
        "--iface",
        "--public-ip",
        "--subnet-file",
        "--subnet-lease-renew-margin",
        "--subnet-lease-ttl",
        "--node-id",
        "--datapath",
        "--bpffs-dir",
        "--healthz-ip",
        "--healthz-port",
        "FLANNELD_ETCD_ENDPOINTS",
    ] {
        assert!(out.contains(flag), "agent --help lists {flag}");
    }
}

#[test]
fn bad_flags_fail_with_a_clear_message() {
    let cases: [(&[&str], &str); 8] = [
        (
            &["agent", "--peer-probe-interval", "0.5"],
            "0 (off) or between 1 and 3600 seconds",
        ),
        (
            &["agent", "--peer-probe-rate", "0"],
            "between 0.1 and 1000 probes a second",
        ),
        (
            &["rollback", "--bpffs-dir", "/nonexistent/weft"],
            "no previous programs are pinned under /nonexistent/weft/programs-previous",
        ),
        (
            &["agent", "--datapath", "fast"],
            "invalid value 'fast' for '--datapath",
        ),
        (
            &["agent", "--public-ip", "300.1.1.1"],
            "invalid value '300.1.1.1' for '--public-ip",
        ),
        (&["agent", "--subnet-lease-ttl", "1"], "--subnet-lease-ttl"),
        (
            &[
                "agent",
                "--datapath",
                "none",
                "--public-ip",
                "198.18.0.1",
                "--node-id",
                "x",
                "--etcd-endpoints",
                "etcd:2379",
            ],
            "etcd endpoint \"etcd:2379\" must start with http:// or https://",
        ),
        (
            &[
                "agent",
                "--datapath",
                "none",
                "--public-ip",
                "198.18.0.1",
                "--node-id",
                "x",
                "--etcd-username",
                "u",
            ],
            "--etcd-username and --etcd-password must be given together",
        ),
    ];
    for (args, want) in cases {
        let (ok, _, err) = weft(args);
        assert!(!ok, "{args:?} must fail");
        assert!(err.contains(want), "{args:?}: expected {want:?} in:\n{err}");
    }
}

#[test]
fn status_without_an_agent_says_so() {
    weft_tests::require_root();
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-nopins-"));
    let (ok, _, err) = weft(&["status", "--bpffs-dir", dir.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("is the agent running?"), "{err}");
}
