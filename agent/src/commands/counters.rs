//! `weft counters`: the dataplane's packet counters.

use anyhow::Result;

use crate::{
    cli::PinArgs,
    dataplane::{Counters, PinDir},
};

pub(crate) fn counters(pins: &PinArgs) -> Result<()> {
    let counters = Counters::open(&PinDir::new(&pins.bpffs_dir))?;
    for (reason, c) in counters.all()? {
        println!("{:<20} {:>12} {:>14}", reason.name(), c.packets, c.bytes);
    }
    Ok(())
}
