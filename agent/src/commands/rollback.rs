//! `weft rollback`: the programs an upgrade replaced, put back into every
//! link (see `dataplane::generations`).

use anyhow::Result;

use crate::{
    cli::PinArgs,
    dataplane::{self, PinDir},
};

pub(crate) fn rollback(pins: &PinArgs) -> Result<()> {
    let swapped = dataplane::rollback(&PinDir::new(&pins.bpffs_dir))?;
    for s in &swapped {
        println!(
            "{:<36} {:<15} program {} -> {}",
            s.link, s.program, s.from_id, s.to_id
        );
    }
    println!(
        "rolled back {} link(s); the programs replaced are kept as the previous generation (run weft rollback again to undo)",
        swapped.len()
    );
    Ok(())
}
