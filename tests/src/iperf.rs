//! iperf3 runs read as tests need them: the whole JSON report of a client
//! (a client whose flow died is killed, not waited on forever), and the
//! bytes of each interval.

use std::{
    io::Read as _,
    sync::Mutex,
    time::{Duration, Instant},
};

/// The JSON report of an iperf3 client run for `secs`; fails (killing it)
/// if it has not finished 30 s after it should have: a client whose flow
/// died waits forever. A client that has written its whole report is
/// done, whether or not it exits (iperf3 at times does not, after a long
/// `-R` UDP test): its report is taken and it is killed.
pub fn report(mut iperf: std::process::Child, secs: u64) -> serde_json::Value {
    let out = std::sync::Arc::new(Mutex::new(Vec::new()));
    let mut stdout = iperf.stdout.take().expect("piped stdout");
    let reader = {
        let out = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                out.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let complete = || {
        serde_json::from_slice::<serde_json::Value>(&out.lock().unwrap())
            .ok()
            .filter(|v| v["end"].is_object())
    };
    let deadline = Instant::now() + Duration::from_secs(secs + 30);
    loop {
        if iperf.try_wait().unwrap().is_some() {
            break;
        }
        if let Some(v) = complete() {
            println!("iperf3 wrote its whole report and has not exited: killed");
            let _ = iperf.kill();
            let _ = iperf.wait();
            return v;
        }
        if Instant::now() > deadline {
            let _ = iperf.kill();
            let _ = iperf.wait();
            let _ = reader.join();
            panic!(
                "iperf3 hung (its flow died): {}",
                String::from_utf8_lossy(&out.lock().unwrap())
                    .lines()
                    .filter(|l| l.contains("\"bytes\""))
                    .take(120)
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = reader.join();
    let mut err = String::new();
    if let Some(mut e) = iperf.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let text = out.lock().unwrap().clone();
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("iperf3 gave no report ({e}): {err}"))
}

/// The bytes of each interval (`-i`) of an iperf3 JSON report.
pub fn intervals(report: &serde_json::Value) -> Vec<f64> {
    report["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["sum"]["bytes"].as_f64())
                .collect()
        })
        .unwrap_or_default()
}
