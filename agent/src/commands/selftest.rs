//! `weft selftest`: runs every eBPF program of this binary on golden
//! frames, in a private pin directory (see `dataplane::selftest`), and
//! says which cases pass. Safe on a node that carries traffic.

use std::path::Path;

use anyhow::{Result, bail};

use crate::dataplane::programs::selftest;

pub(crate) fn selftest(bpffs: &Path, verbose: bool) -> Result<()> {
    let outcomes = selftest::run(
        bpffs,
        &crate::dataplane::LoadOptions::for_kernel(crate::dataplane::ProgramKernel::probe()),
        selftest::Wire::default(),
    )?;
    let failed: Vec<&selftest::Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    for o in &outcomes {
        match &o.failure {
            Some(why) => println!("FAIL  {:<16} {}: {why}", o.program, o.name),
            None if verbose => println!("ok    {:<16} {}", o.program, o.name),
            None => {}
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} golden-frame cases failed",
            failed.len(),
            outcomes.len()
        );
    }
    println!("all {} golden-frame cases passed", outcomes.len());
    Ok(())
}
