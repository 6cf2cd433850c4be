//! systemd's notify protocol (`Type=notify`, sd_notify(3)): datagrams of
//! `KEY=value` lines to the socket `NOTIFY_SOCKET` names (a path, or an
//! abstract name after `@`). Nothing happens where it is unset (not under
//! systemd, or in a pod); a failure to send is logged once, never fatal.

use std::{
    os::unix::net::UnixDatagram,
    sync::atomic::{AtomicBool, Ordering::Relaxed},
};

/// Whether a send already failed (said once).
static FAILED: AtomicBool = AtomicBool::new(false);

/// Sends `state` (`READY=1\nSTATUS=...`) to the service manager, if any.
pub(crate) fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let r = (|| -> std::io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let bytes = path.as_encoded_bytes();
        match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)?;
            }
            None => {
                sock.send_to(state.as_bytes(), &path)?;
            }
        }
        Ok(())
    })();
    if let Err(e) = r
        && !FAILED.swap(true, Relaxed)
    {
        tracing::warn!(socket = %path.to_string_lossy(), error = %e, "cannot notify the service manager (NOTIFY_SOCKET)");
    }
}
