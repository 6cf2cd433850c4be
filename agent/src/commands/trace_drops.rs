//! `weft trace-drops on|off`: the running agent's drop trace switched in
//! place, through its socket in the state directory (root only): the
//! programs' config changes, nothing is reloaded or detached.

use std::path::Path;

use anyhow::Result;

pub(crate) fn trace_drops(state_dir: &Path, on: bool) -> Result<()> {
    let switch = if on { "on" } else { "off" };
    super::ask_running_agent(
        state_dir,
        &format!("trace-drops {switch}"),
        &format!("trace-drops {switch}"),
        (
            "trace-drops",
            "drop trace",
            "restart it with or without --trace-drops",
        ),
    )?;
    let log = if on {
        " (its log, target weft_dataplane)"
    } else {
        ""
    };
    println!("the agent's drop trace is {switch}{log}");
    Ok(())
}
