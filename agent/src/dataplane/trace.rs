//! The drop trace: every packet the programs drop, with its reason and
//! addresses, in the agent's log; on from the start with `--trace-drops`,
//! switched at run time with `weft trace-drops on|off`.
//!
//! The programs always carry their aya-log records; they log a drop only
//! while the config has `CONFIG_F_TRACE_DROPS`, which [`set`] asks the
//! agent's loop to write (no reload, nothing detached). The records arrive
//! in aya-log's ring buffer; [`DropTrace`] drains it whenever it is
//! readable and hands the records to the `log` facade, which the agent's
//! tracing subscriber prints (target `weft_dataplane`).

use std::sync::{
    LazyLock,
    atomic::{AtomicBool, Ordering},
};

use anyhow::{Context as _, Result};
use tokio::{io::unix::AsyncFd, sync::Notify, task::JoinHandle};

type Logger = aya_log::EbpfLogger<&'static dyn log::Log>;

static ON: AtomicBool = AtomicBool::new(false);
static CHANGED: LazyLock<Notify> = LazyLock::new(Notify::new);

/// Whether the drop trace is on.
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The drop trace's state at start (`--trace-drops`), before the programs'
/// config is first written.
pub(crate) fn init(on: bool) {
    ON.store(on, Ordering::Relaxed);
    if on {
        tracing::info!("tracing dropped packets (--trace-drops; `weft trace-drops off` stops it)");
    }
}

/// Turns the drop trace on or off; returns whether that changed anything.
/// The loop writes the programs' config when [`changed`] fires.
pub(crate) fn set(on: bool) -> bool {
    let was = ON.swap(on, Ordering::Relaxed);
    if was != on {
        CHANGED.notify_one();
    }
    was != on
}

/// Fires after [`set`] changed the trace (one wake-up for a burst).
pub(crate) async fn changed() {
    CHANGED.notified().await;
}

/// The task forwarding the trace; stops when dropped.
pub(crate) struct DropTrace(JoinHandle<()>);

impl DropTrace {
    pub(crate) fn start(logger: Logger) -> Result<Self> {
        // SAFETY: the logger owns the ring buffer's fd: it stays open and is
        // the same fd for as long as the AsyncFd (which owns the logger) lives.
        let mut fd = unsafe { AsyncFd::register(logger) }
            .map_err(|e| e.into_parts().1)
            .context("watching the eBPF log buffer")?;
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
