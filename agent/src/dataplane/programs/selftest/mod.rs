//! The programs checked on golden frames, outside any traffic.
//!
//! Each program is run by the kernel (`BPF_PROG_TEST_RUN`) on frames built
//! here from the wire format ([`packets`]), with maps of its own: the
//! object this binary carries is loaded into a private pin directory and
//! its maps are seeded with a fixed node, peers and pod ([`fixture`]).
//! Each case ([`cases`]) checks the program's verdict, the one counter it
//! moves, and every byte of the frame it leaves. Nothing a running agent
//! uses is touched: no program is attached, no pinned map is shared, and
//! no frame leaves the kernel's test context. `weft selftest` runs it, and
//! so can an agent before it swaps its programs in.

mod cases;
mod fixture;
mod packets;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use dataplane_common::Reason;

use crate::dataplane::{Counters, EndpointMap, LoadOptions, Loaded, PeerMaps, PinDir, is_bpffs};

/// One case's outcome.
#[derive(Clone, Debug)]
pub(crate) struct Outcome {
    pub name: String,
    pub program: &'static str,
    /// Why it failed; None: it passed.
    pub failure: Option<String>,
}

pub(crate) use fixture::Wire;

/// Runs every golden case with the programs of this binary, loaded with
/// `opts` (as the agent loads them), their frames carrying the node's VNI
/// and port (`wire`), in a private pin directory under `bpffs` (a mounted
/// bpf filesystem), removed after. The rest of the fixture's node is
/// fixed: addresses from the documentation ranges (a test frame can never
/// pass for traffic), and a 1500-byte uplink (a test run takes a frame of
/// one page at most).
pub(crate) fn run(bpffs: &Path, opts: &LoadOptions, wire: Wire) -> Result<Vec<Outcome>> {
    fixture::set_wire(wire);
    let dir = Private::create(bpffs)?;
    // The maps are the self-test's own: the default capacity will do.
    let opts = LoadOptions {
        max_peers: dataplane_common::MAX_PEERS.min(opts.max_peers),
        ..*opts
    };
    let mut loaded =
        Loaded::load(&dir.pins, &opts).context("loading the programs for the self-test")?;
    let mut maps = PeerMaps::open(&dir.pins)?;
    let mut endpoints = EndpointMap::open(&dir.pins)?;
    let counters = Counters::open(&dir.pins)?;
    fixture::seed(&mut maps, &mut endpoints).context("seeding the self-test's maps")?;
    let mut out = Vec::new();
    for case in cases::all() {
        // No XDP program on a kernel without XDP for it: TC decapsulates,
        // and its cases run.
        if case.program == dataplane_common::program_names::DECAP_XDP && !opts.kernel.xdp {
            continue;
        }
        maps.set_config(&fixture::config(case.mode))?;
        let before = counts(&counters)?;
        let (action, frame) = loaded
            .test_run(case.program, &case.input)
            .with_context(|| format!("running {} on the case {:?}", case.program, case.name))?;
        let after = counts(&counters)?;
        out.push(Outcome {
            failure: judge(&case, action, &frame, &before, &after).err(),
            name: case.name,
            program: case.program,
        });
    }
    Ok(out)
}

/// Every counter's packets.
fn counts(c: &Counters) -> Result<HashMap<Reason, u64>> {
    Ok(c.all()?.into_iter().map(|(r, c)| (r, c.packets)).collect())
}

/// Whether a run gave what its case expects; what differs if not.
fn judge(
    case: &cases::Case,
    action: u32,
    frame: &[u8],
    before: &HashMap<Reason, u64>,
    after: &HashMap<Reason, u64>,
) -> std::result::Result<(), String> {
    let e = &case.expect;
    if action != e.action {
        return Err(format!("returned {action}, expected {}", e.action));
    }
    let moved: Vec<(Reason, u64)> = Reason::ALL
        .iter()
        .filter_map(|r| {
            let d = after.get(r).copied().unwrap_or(0) - before.get(r).copied().unwrap_or(0);
            (d != 0).then_some((*r, d))
        })
        .collect();
    let want: Vec<(Reason, u64)> = e.reason.map(|r| (r, 1)).into_iter().collect();
    if moved != want {
        let show = |v: &[(Reason, u64)]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter()
                    .map(|(r, n)| format!("{} +{n}", r.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        return Err(format!(
            "counted {}, expected {}",
            show(&moved),
            show(&want)
        ));
    }
    compare(frame, &e.frame, &e.varies)?;
    if let Some(valid) = e.valid {
        valid(frame)?;
    }
    Ok(())
}

/// Whether `got` is `want` outside the ranges that vary; the first
/// difference if not.
pub(crate) fn compare(
    got: &[u8],
    want: &[u8],
    varies: &[std::ops::Range<usize>],
) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "left a {}-byte frame, expected {} bytes",
            got.len(),
            want.len()
        ));
    }
    let first =
        (0..got.len()).find(|i| got[*i] != want[*i] && !varies.iter().any(|r| r.contains(i)));
    match first {
        None => Ok(()),
        Some(i) => {
            let window = |b: &[u8]| {
                b[i..(i + 8).min(b.len())]
                    .iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            Err(format!(
                "byte {i} differs: got {}, expected {}",
                window(got),
                window(want)
            ))
        }
    }
}

/// The self-test's own pin directory, removed with everything in it.
struct Private {
    pins: PinDir,
    root: PathBuf,
}

impl Private {
    fn create(bpffs: &Path) -> Result<Self> {
        if !is_bpffs(bpffs).unwrap_or(false) {
            bail!(
                "{} is not a bpf filesystem (mount -t bpf bpf {})",
                bpffs.display(),
                bpffs.display()
            );
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let root = bpffs.join(format!("weft-selftest-{}-{nanos}", std::process::id()));
        Ok(Self {
            pins: PinDir::new(&root),
            root,
        })
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        // Unpinning drops the maps with their last reference (this
        // process's, closed as the loaded object goes).
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_finds_the_first_difference_outside_what_varies() {
        let want = [1u8, 2, 3, 4, 5];
        assert!(compare(&want, &want, &[]).is_ok());
        let got = [1u8, 9, 3, 4, 6];
        let e = compare(&got, &want, &[]).unwrap_err();
        assert!(e.starts_with("byte 1 differs"), "{e}");
        let one_byte = std::ops::Range { start: 1, end: 2 };
        let e = compare(&got, &want, std::slice::from_ref(&one_byte)).unwrap_err();
        assert!(e.starts_with("byte 4 differs"), "{e}");
        assert!(compare(&got, &want, &[1..2, 4..5]).is_ok());
        assert!(
            compare(&got[..4], &want, &[])
                .unwrap_err()
                .contains("4-byte")
        );
    }

    #[test]
    fn every_program_has_cases_and_names_are_unique() {
        let all = cases::all();
        for p in [
            dataplane_common::program_names::ENCAP,
            dataplane_common::program_names::ENCAP6,
            dataplane_common::program_names::TUNNEL_RX,
            dataplane_common::program_names::DECAP_XDP,
            dataplane_common::program_names::DECAP_TC,
            dataplane_common::program_names::FROM_POD,
            dataplane_common::program_names::DELIVER,
        ] {
            assert!(all.iter().any(|c| c.program == p), "no case for {p}");
        }
        let mut names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "two cases share a name");
    }
}
