//! The agent's log as operators collect it: JSON lines are flat objects
//! (the event's fields beside `timestamp`, `level`, `target`), and the
//! filter changes on a running agent with `weft log-level`, no restart.

use std::time::Duration;

use serde_json::Value;
use weft_tests::{agent::eventually, weft_cluster::WeftCluster};

const T: Duration = Duration::from_secs(60);

/// The JSON objects of the log, in order.
fn lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

fn debug_lines(log: &[Value]) -> usize {
    log.iter().filter(|l| l["level"] == "DEBUG").count()
}

#[test]
fn json_logs_are_flat_and_the_level_changes_at_runtime() {
    let mut c = WeftCluster::new(0, &[]).unwrap();
    c.start_node(1, &["--log-format", "json", "--log-level", "info"])
        .unwrap();
    let n = &c.nodes[0];
    n.wait_metric("weft_ready", |v| v == 1.0, T);
    let log = lines(&n.agent.log());
    assert!(log.len() > 3, "the log is JSON lines:\n{}", n.agent.log());
    for l in &log {
        assert!(l.get("fields").is_none(), "no nested fields: {l}");
        for key in ["timestamp", "level", "target", "message"] {
            assert!(l.get(key).is_some(), "{key} in {l}");
        }
    }
    // A structured field is a key of its own.
    assert!(
        log.iter()
            .any(|l| l["message"] == "acquired the subnet lease" && l["subnet"].is_string()),
        "the lease line carries its subnet as a field"
    );
    assert_eq!(debug_lines(&log), 0, "info: no DEBUG line");

    let state = n.agent.state_dir();
    let set = |filter: &str| {
        weft_tests::agent::weft(&["log-level", filter, "--state-dir", state.to_str().unwrap()])
    };
    // A filter that does not parse is refused and changes nothing.
    let (ok, _, err) = set("weft=nonsense[");
    assert!(!ok, "a bad filter is refused");
    assert!(err.contains("not a log filter"), "{err}");

    let (ok, out, err) = set("info,weft=debug");
    assert!(ok, "{out}{err}");
    // A second node: the first logs its peer table's change at DEBUG now.
    c.start_node(2, &[]).unwrap();
    let n = &c.nodes[0];
    eventually("DEBUG lines after the change", T, || {
        (debug_lines(&lines(&n.agent.log())) > 0).then_some(())
    });
    let (ok, out, err) = set("info");
    assert!(ok, "{out}{err}");
    let before = debug_lines(&lines(&n.agent.log()));
    c.start_node(3, &[]).unwrap();
    let n = &c.nodes[0];
    n.wait_metric("weft_peers", |v| v == 2.0, T);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        debug_lines(&lines(&n.agent.log())),
        before,
        "back at info: no new DEBUG line"
    );
    assert!(n.agent.running());
}
