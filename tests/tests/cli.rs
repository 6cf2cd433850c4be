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

/// What bash offers after `words` (the last one being completed), with the
/// script `weft completions bash` prints loaded.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let (ok, script, err) = weft(&["completions", "bash"]);
    assert!(ok, "{err}");
    let dir = std::env::temp_dir().join(weft_tests::unique("weft-completions-"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("weft.bash");
    std::fs::write(&file, script).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let line = words.join(" ");
    let prog = format!(
        "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; _weft weft '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        file.display(),
        quoted.join(" "),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &prog])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn shell_completions_complete_commands_and_flags() {
    assert_eq!(bash_completes(&["weft", "doc"]), vec!["doctor".to_string()]);
    assert!(
        bash_completes(&["weft", "doctor", "--js"]).contains(&"--json".to_string()),
        "doctor's flags"
    );
    assert!(
        bash_completes(&["weft", "agent", "--host-rou"]).contains(&"--host-routing".to_string()),
        "the agent's flags"
    );
    for shell in ["zsh", "fish"] {
        let (ok, out, err) = weft(&["completions", shell]);
        assert!(
            ok && out.contains("doctor") && out.contains("host-routing"),
            "{shell}: {err}"
        );
    }
    let (ok, _, err) = weft(&["completions", "tcsh"]);
    assert!(
        !ok && err.contains("tcsh"),
        "an unknown shell is refused: {err}"
    );
}
