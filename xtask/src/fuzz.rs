//! `fuzz`: the parsers of untrusted input under libFuzzer.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::process::run;

/// The fuzz targets (`fuzz/fuzz_targets/`): the parsers of what untrusted
/// writers put into etcd or onto disk.
pub(crate) const FUZZ_TARGETS: [&str; 4] =
    ["lease_json", "network_config", "subnet_key", "subnet_env"];

/// Runs each of `targets` (all when empty) for `seconds` under libFuzzer,
/// starting from the committed seeds in `fuzz/seeds/<target>`. A crash
/// fails the run and leaves its input in `fuzz/artifacts/<target>/`.
pub(crate) fn fuzz(targets: &[String], seconds: u64) -> Result<()> {
    let all: Vec<String> = FUZZ_TARGETS.iter().map(|t| t.to_string()).collect();
    let targets = if targets.is_empty() { &all } else { targets };
    for t in targets {
        if !FUZZ_TARGETS.contains(&t.as_str()) {
            bail!(
                "no fuzz target {t:?}; there are {}",
                FUZZ_TARGETS.join(", ")
            );
        }
    }
    let channel = crate::toolchain::channel(Path::new("dataplane-ebpf"))?;
    for t in targets {
        let corpus = std::env::temp_dir().join(format!("weft-fuzz-{t}-{}", std::process::id()));
        std::fs::create_dir_all(&corpus)?;
        let mut c = crate::lint::ebpf_cargo(&channel);
        c.args(["fuzz", "run", "--fuzz-dir", "fuzz", t])
            .arg(&corpus)
            .arg(format!("fuzz/seeds/{t}"))
            .args([
                "--",
                &format!("-max_total_time={seconds}"),
                "-print_final_stats=1",
            ]);
        // libFuzzer's progress goes to a log; its tail is shown on failure.
        let log = PathBuf::from("target/fuzz-logs").join(format!("{t}.log"));
        std::fs::create_dir_all("target/fuzz-logs")?;
        let file = std::fs::File::create(&log)?;
        c.stdout(file.try_clone()?).stderr(file);
        let r = run(c);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        if r.is_ok() {
            let done = lines.iter().rev().find(|l| l.starts_with("Done "));
            eprintln!("fuzz {t}: {}", done.unwrap_or(&"done"));
        } else {
            for l in &lines[lines.len().saturating_sub(60)..] {
                eprintln!("{l}");
            }
        }
        let _ = std::fs::remove_dir_all(&corpus);
        r.with_context(|| format!("fuzz target {t} (a crashing input is in fuzz/artifacts/{t}/)"))?;
    }
    Ok(())
}
