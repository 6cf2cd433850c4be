//! The plugin telling the agent that the endpoint records changed:
//! `<stateDir>/cni.sock`, one line per connection. The agent answers once
//! it has applied the change, so a pod's endpoint is programmed by the time
//! ADD returns; an agent that is down or slow is not waited for.
//!
//! The same socket answers STATUS (a `status` line gets `ready` or
//! `not-ready` at once) and `weft log-level` (a `log <filter>` line gets
//! `applied` or `error: <why>`), and `weft bundle` (`log-tail` gets the
//! agent's last log lines): it is the agent's socket, writable by root only.

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::sync::{mpsc, oneshot};

const SOCKET: &str = "cni.sock";

fn socket(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET)
}

/// Removes the agent's socket (`weft teardown`, the agent stopped): a
/// stale one would only refuse connections, but uninstalling leaves
/// nothing. Whether there was one.
pub(crate) fn remove_socket(state_dir: &Path) -> bool {
    std::fs::remove_file(socket(state_dir)).is_ok()
}

/// Tells the agent (plugin side). Failures only mean the agent will read
/// the records when it is back.
pub(crate) fn agent(state_dir: &Path) {
    let Ok(mut s) = UnixStream::connect(socket(state_dir)) else {
        return;
    };
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"sync\n").is_ok() {
        let mut answer = [0u8; 8];
        let _ = s.read(&mut answer);
    }
}

/// The agent's readiness, for STATUS (plugin side): `Ok` when it is ready,
/// why not otherwise.
pub(crate) fn agent_status(state_dir: &Path) -> Result<(), String> {
    let path = socket(state_dir);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        format!(
            "the Weft agent is not running on this node (nothing answers on {}: {e})",
            path.display()
        )
    })?;
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    s.write_all(b"status\n")
        .map_err(|e| format!("the Weft agent did not take the question: {e}"))?;
    let mut answer = [0u8; 16];
    let n = s
        .read(&mut answer)
        .map_err(|e| format!("the Weft agent did not answer within 2 s: {e}"))?;
    match answer[..n].trim_ascii() {
        b"ready" => Ok(()),
        // An agent older than STATUS takes any line for a sync and says ok:
        // it runs, which is all it can tell.
        b"ok" => Ok(()),
        b"not-ready" => Err(
            "the Weft agent is not ready (its lease, peers or programs are not in place yet; `weft status` says which)"
                .into(),
        ),
        other => Err(format!(
            "the Weft agent answered {:?}",
            String::from_utf8_lossy(other)
        )),
    }
}

/// Sends `line` to the agent of `state_dir` and returns its one-line
/// answer (`weft log-level`).
pub(crate) fn ask(state_dir: &Path, line: &str) -> std::io::Result<String> {
    ask_raw(state_dir, line).map(|a| a.trim().to_string())
}

/// Like [`ask`], the whole answer as it came (`log-tail`: many lines).
pub(crate) fn ask_raw(state_dir: &Path, line: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket(state_dir))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The agent's side: one message per plugin call, with the channel to
/// answer on once it is applied.
pub(crate) struct Listener {
    rx: mpsc::Receiver<oneshot::Sender<()>>,
}

impl Listener {
    /// Listens on `state_dir`'s socket; `ready` answers STATUS.
    pub(crate) fn bind(
        state_dir: &Path,
        ready: impl Fn() -> bool + Send + Sync + 'static,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let path = socket(state_dir);
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)
            .with_context(|| format!("listening on {}", path.display()))?;
        let (tx, rx) = mpsc::channel(64);
        let ready = std::sync::Arc::new(ready);
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut failures = 0u32;
            loop {
                let mut s = match listener.accept().await {
                    Ok((s, _)) => {
                        failures = 0;
                        s
                    }
                    Err(e) => {
                        // Out of file descriptors: pause, not spin.
                        if failures == 0 {
                            tracing::warn!(error = %e, "cannot accept the CNI plugin's notifications; retrying");
                        }
                        let wait = crate::http::ACCEPT_RETRY.delay(failures);
                        failures += 1;
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                };
                let tx = tx.clone();
                let ready = ready.clone();
                tokio::spawn(async move {
                    let mut line = [0u8; 512];
                    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut line))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or(0);
                    let line = line[..n].trim_ascii();
                    if line == b"status" {
                        let a: &[u8] = if ready() { b"ready\n" } else { b"not-ready\n" };
                        let _ = s.write_all(a).await;
                        return;
                    }
                    if line == b"log-tail" {
                        let mut a = crate::log_tail().join("\n");
                        a.push('\n');
                        let _ = s.write_all(a.as_bytes()).await;
                        return;
                    }
                    if let Some(how) = line.strip_prefix(b"trace-drops ") {
                        let a = match how {
                            b"on" | b"off" => {
                                let on = how == b"on";
                                crate::dataplane::trace::set(on);
                                format!("trace-drops {}\n", if on { "on" } else { "off" })
                            }
                            _ => "error: on or off\n".to_string(),
                        };
                        let _ = s.write_all(a.as_bytes()).await;
                        return;
                    }
                    if let Some(filter) = line.strip_prefix(b"log ") {
                        let a = match std::str::from_utf8(filter)
                            .map_err(|_| "the filter is not UTF-8".to_string())
                            .and_then(crate::set_log_filter)
                        {
                            Ok(()) => "applied\n".to_string(),
                            Err(e) => format!("error: {e}\n"),
                        };
                        let _ = s.write_all(a.as_bytes()).await;
                        return;
                    }
                    let (done_tx, done_rx) = oneshot::channel();
                    if tx.send(done_tx).await.is_ok() {
                        let _ = tokio::time::timeout(Duration::from_secs(5), done_rx).await;
                    }
                    let _ = s.write_all(b"ok\n").await;
                });
            }
        });
        Ok(Self { rx })
    }

    /// The next request; cancel-safe.
    pub(crate) async fn next(&mut self) -> Option<oneshot::Sender<()>> {
        self.rx.recv().await
    }
}
