//! The plugin telling the agent that the endpoint records changed:
//! `<stateDir>/cni.sock`, one line per connection. The agent answers once
//! it has applied the change, so a pod's endpoint is programmed by the time
//! ADD returns; an agent that is down or slow is not waited for.

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

/// The agent's side: one message per plugin call, with the channel to
/// answer on once it is applied.
pub(crate) struct Listener {
    rx: mpsc::Receiver<oneshot::Sender<()>>,
}

impl Listener {
    pub(crate) fn bind(state_dir: &Path) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let path = socket(state_dir);
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path)
            .with_context(|| format!("listening on {}", path.display()))?;
        let (tx, rx) = mpsc::channel(64);
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
                tokio::spawn(async move {
                    let mut line = [0u8; 64];
                    let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut line)).await;
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
