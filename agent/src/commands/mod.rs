//! The operator commands: `weft leases`, `status`, `counters`, `teardown`,
//! `install-cni`, `uninstall-cni`, `doctor`, `node-init`, `selftest`, `rollback`,
//! `log-level`, `bundle`,
//! and the hidden `reference` (the generated pages of docs/reference/).

mod bundle;
mod counters;
mod doctor;
mod endpoints;
mod install_cni;
mod leases;
mod log_level;
mod node_init;
mod reference;
mod rollback;
mod selftest;
mod status;
mod teardown;
mod trace_drops;

pub(crate) use bundle::bundle;
pub(crate) use counters::counters;
pub(crate) use doctor::{DoctorArgs, doctor};
pub(crate) use endpoints::endpoints;
pub(crate) use install_cni::{install_cni, uninstall_cni};
pub(crate) use leases::leases;
pub(crate) use log_level::log_level;
pub(crate) use node_init::node_init;
pub(crate) use reference::reference;
pub(crate) use rollback::rollback;
pub(crate) use selftest::selftest;
pub(crate) use status::status;
pub(crate) use teardown::teardown;
pub(crate) use trace_drops::trace_drops;

/// Asks the running agent, over its socket in `state_dir`, to carry out
/// `line` (the `weft` command `command`); its answer, which `done` (the
/// answer a current agent gives) or an error. `kept` says what an agent
/// that refuses keeps; `restart` how to get the change from an agent too
/// old to know the command (it takes any line for a CNI sync: `ok`).
pub(crate) fn ask_running_agent(
    state_dir: &std::path::Path,
    line: &str,
    done: &str,
    (command, kept, restart): (&str, &str, &str),
) -> anyhow::Result<()> {
    use anyhow::{Context as _, bail};
    let answer = crate::cni::ask_agent(state_dir, line).with_context(|| {
        format!(
            "no agent answers in {} (is it running, with this --state-dir?)",
            state_dir.display()
        )
    })?;
    match answer.strip_prefix("error: ") {
        Some(why) => bail!("the agent kept its {kept}: {why}"),
        None if answer == done => Ok(()),
        None if answer == "ok" => {
            bail!("the agent predates weft {command}: its {kept} is unchanged ({restart})")
        }
        None => bail!("the agent answered {answer:?}"),
    }
}

/// Text from etcd (keys, node ids, backend types, errors quoting them), fit
/// for an operator's terminal: control characters (terminal escapes among
/// them) shown escaped, and at most [`SHOWN_MAX`] characters.
pub(crate) fn shown(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == SHOWN_MAX {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The longest text from etcd shown whole.
const SHOWN_MAX: usize = 120;

#[cfg(test)]
mod tests {
    #[test]
    fn text_from_etcd_cannot_drive_a_terminal() {
        assert_eq!(super::shown("10.244.3.0-24"), "10.244.3.0-24");
        let hostile = "key\u{1b}]0;pwned\u{7}\u{1b}[2J";
        let shown = super::shown(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert_eq!(super::shown(&"x".repeat(500)).chars().count(), 121);
    }
}
