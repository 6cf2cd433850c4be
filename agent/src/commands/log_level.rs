//! `weft log-level FILTER`: the running agent's log filter changed in
//! place, through its socket in the state directory (root only), so a
//! node can be debugged without restarting its agent.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

pub(crate) fn log_level(state_dir: &Path, filter: &str) -> Result<()> {
    if filter.contains('\n') {
        bail!("a log filter is one line");
    }
    let answer = crate::cni::ask_agent(state_dir, &format!("log {filter}")).with_context(|| {
        format!(
            "no agent answers in {} (is it running, with this --state-dir?)",
            state_dir.display()
        )
    })?;
    match answer.strip_prefix("error: ") {
        Some(why) => bail!("the agent kept its filter: {why}"),
        None if answer == "applied" => {
            println!("the agent logs with {filter:?} now");
            Ok(())
        }
        // An agent older than this command takes any line for a CNI sync.
        None if answer == "ok" => {
            bail!(
                "the agent predates weft log-level: its filter is unchanged (restart it with --log-level)"
            )
        }
        None => bail!("the agent answered {answer:?}"),
    }
}
