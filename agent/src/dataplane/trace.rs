//! `--trace-drops`: every packet the programs drop, with its reason and
//! addresses, in the agent's log.
//!
//! The programs log through aya-log only when the dataplane config carries
//! `CONFIG_F_TRACE_DROPS`, so the trace costs nothing when it is off. The
//! records arrive in aya-log's ring buffer; this task drains it whenever it
//! is readable and hands the records to the `log` facade, which the agent's
//! tracing subscriber prints (target `weft_dataplane`).

use anyhow::{Context as _, Result};
use tokio::{io::unix::AsyncFd, task::JoinHandle};

type Logger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The task forwarding the trace; stops when dropped.
pub(crate) struct DropTrace(JoinHandle<()>);

impl DropTrace {
    pub(crate) fn start(logger: Logger) -> Result<Self> {
        // SAFETY: the logger owns the ring buffer's fd: it stays open and is
        // the same fd for as long as the AsyncFd (which owns the logger) lives.
        let mut fd = unsafe { AsyncFd::register(logger) }
            .map_err(|e| e.into_parts().1)
            .context("watching the eBPF log buffer")?;
        tracing::info!("tracing dropped packets (--trace-drops)");
        Ok(Self(tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    return;
                };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        })))
    }
}

impl Drop for DropTrace {
    fn drop(&mut self) {
        self.0.abort();
    }
}
