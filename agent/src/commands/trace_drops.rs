//! `weft trace-drops on|off`: the running agent's drop trace switched in
//! place, through its socket in the state directory (root only): the
//! programs' config changes, nothing is reloaded or detached.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

pub(crate) fn trace_drops(state_dir: &Path, on: bool) -> Result<()> {
    let switch = if on { "on" } else { "off" };
    let answer =
        crate::cni::ask_agent(state_dir, &format!("trace-drops {switch}")).with_context(|| {
            format!(
                "no agent answers in {} (is it running, with this --state-dir?)",
                state_dir.display()
            )
        })?;
    match answer.strip_prefix("error: ") {
        Some(why) => bail!("the agent kept its drop trace: {why}"),
        None if answer == format!("trace-drops {switch}") => {
            println!(
                "the agent's drop trace is {switch}{}",
                if on {
                    " (its log, target weft_dataplane)"
                } else {
                    ""
                }
            );
            Ok(())
        }
        // An agent older than this command takes any line for a CNI sync.
        None if answer == "ok" => bail!(
            "the agent predates weft trace-drops: its trace is unchanged (restart it with or without --trace-drops)"
        ),
        None => bail!("the agent answered {answer:?}"),
    }
}
