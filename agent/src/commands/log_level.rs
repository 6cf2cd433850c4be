//! `weft log-level FILTER`: the running agent's log filter changed in
//! place, through its socket in the state directory (root only), so a
//! node can be debugged without restarting its agent.

use std::path::Path;

use anyhow::{Result, bail};

pub(crate) fn log_level(state_dir: &Path, filter: &str) -> Result<()> {
    if filter.contains('\n') {
        bail!("a log filter is one line");
    }
    super::ask_running_agent(
        state_dir,
        &format!("log {filter}"),
        "applied",
        ("log-level", "filter", "restart it with --log-level"),
    )?;
    println!("the agent logs with {filter:?} now");
    Ok(())
}
