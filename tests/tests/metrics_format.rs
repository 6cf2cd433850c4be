//! The agent's scrape as Prometheus reads it: `promtool check metrics`
//! (Prometheus's own parser and linter) finds nothing wrong in it, on a
//! node running host routing, peer health with per-peer series, the
//! self-test, and with pods; the families every exporter has are there.

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::Duration,
};

use weft_tests::weft_cluster::{WeftCluster, http_get};

const T: Duration = Duration::from_secs(60);

fn promtool(scrape: &str) -> (bool, String) {
    let bin = std::env::var("WEFT_PROMTOOL").expect(
        "WEFT_PROMTOOL: promtool (cargo xtask setup installs it; cargo xtask test sets it)",
    );
    let mut child = Command::new(bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_scrape_passes_promtool() {
    // promtool itself refuses what it should: a family without help, a
    // counter without _total.
    let (ok, out) = promtool("# TYPE weft_x counter\nweft_x 1\n");
    assert!(!ok, "promtool accepts a broken scrape: {out}");

    let c = WeftCluster::new(2, &["--peer-metrics"]).unwrap();
    let n = &c.nodes[0];
    n.wait_metric("weft_ready", |v| v == 1.0, T);
    n.wait_metric("weft_peers_reachable", |v| v == 1.0, T);
    let (_, scrape) = http_get(&n.node.ns, n.node.ip, 9090, "/metrics").unwrap();
    let (ok, out) = promtool(&scrape);
    assert!(ok, "promtool check metrics: {out}\n{scrape}");
    let m = n.metrics();
    let version = format!(
        "weft_build_info{{version=\"{}\",map_layout=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        dataplane_common::LAYOUT_VERSION
    );
    assert_eq!(m.get(&version), Some(&1.0), "{version} in the scrape");
    let pid = n.agent.pid();
    let rss: f64 = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse::<f64>()
        .unwrap()
        * 4096.0;
    let reported = m["process_resident_memory_bytes"];
    assert!(
        reported > rss / 2.0 && reported < rss * 2.0,
        "process_resident_memory_bytes {reported} against /proc's {rss}"
    );
    for family in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_virtual_memory_bytes",
    ] {
        assert!(
            m.get(family).is_some_and(|v| *v > 0.0),
            "{family} in the scrape"
        );
    }
}
