//! The health and metrics server: `/healthz`, `/readyz`, `/metrics`.
//!
//! A few lines of HTTP/1.1 over tokio: one request per connection, GET only.
//! On hostNetwork the port is open to every pod on the node, so the server
//! bounds what a client can hold: at most [`MAX_CONNS`] connections at once
//! (a connection beyond them is accepted and closed at once), and
//! [`REQUEST_TIME`] for a whole request, however slowly its bytes come.
//! Connections from loopback (kubelet's probes, with `host: 127.0.0.1`)
//! have [`LOOPBACK_CONNS`] slots of their own, so a flood from pods never
//! fails a probe. An accept that fails (out of file descriptors) is retried
//! after a growing pause instead of at once.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use crate::{backoff::Backoff, lease::unix_now, metrics::Metrics};

/// Connections served at once (beyond them: closed on accept).
pub(crate) const MAX_CONNS: usize = 64;
/// Connections from loopback served at once, besides [`MAX_CONNS`].
pub(crate) const LOOPBACK_CONNS: usize = 16;
/// The whole of a request, from accept to the last byte of the answer.
pub(crate) const REQUEST_TIME: Duration = Duration::from_secs(2);
/// Retries of a failed accept: 10 ms doubling to 1 s.
pub(crate) const ACCEPT_RETRY: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_secs(1));

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Serves {
    /// `/healthz`, `/readyz` and `/metrics`.
    All,
    /// `/metrics` only (its own listener, `--metrics-port`).
    Metrics,
}

/// Binds `addr` and serves it in the background.
pub(crate) async fn start(addr: SocketAddr, metrics: Arc<Metrics>, serves: Serves) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the health server to {addr}"))?;
    tokio::spawn(serve(listener, metrics, serves));
    Ok(())
}

async fn serve(listener: TcpListener, metrics: Arc<Metrics>, serves: Serves) {
    let slots = Arc::new(Semaphore::new(MAX_CONNS));
    let loopback = Arc::new(Semaphore::new(LOOPBACK_CONNS));
    let mut failures = 0u32;
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(s) => {
                failures = 0;
                s
            }
            Err(e) => {
                let wait = ACCEPT_RETRY.delay(failures);
                if failures == 0 {
                    tracing::warn!(error = %e, "the health server cannot accept connections; retrying");
                }
                failures += 1;
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        let pool = if peer.ip().is_loopback() {
            &loopback
        } else {
            &slots
        };
        // Over the cap: closed now (dropping the socket).
        let Ok(permit) = pool.clone().try_acquire_owned() else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIME, answer(sock, &metrics, serves)).await;
            drop(permit);
        });
    }
}

/// Reads one request head and answers it.
async fn answer(mut sock: TcpStream, metrics: &Metrics, serves: Serves) {
    let mut buf = [0u8; 1024];
    let mut n = 0;
    // Until the end of the request head (or the buffer is full).
    while n < buf.len() {
        match sock.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                n += k;
                if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = respond(method, path, metrics, serves);
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.write_all(resp.as_bytes()).await;
    let _ = sock.shutdown().await;
}

fn respond(
    method: &str,
    path: &str,
    metrics: &Metrics,
    serves: Serves,
) -> (&'static str, &'static str, String) {
    let health = serves == Serves::All;
    match (method, path) {
        ("GET", "/healthz") if health => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") if health && metrics.ready() => {
            ("200 OK", "text/plain", "ready\n".to_string())
        }
        ("GET", "/readyz") if health => (
            "503 Service Unavailable",
            "text/plain",
            "not ready: the lease is not held or the peers are not programmed yet\n".to_string(),
        ),
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            metrics.render(unix_now()),
        ),
        ("GET", _) if health => (
            "404 Not Found",
            "text/plain",
            "try /healthz, /readyz or /metrics\n".to_string(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_listener_serves_metrics_only() {
        let m = Metrics::default();
        assert_eq!(respond("GET", "/healthz", &m, Serves::All).0, "200 OK");
        assert_eq!(respond("GET", "/metrics", &m, Serves::Metrics).0, "200 OK");
        assert_eq!(
            respond("GET", "/healthz", &m, Serves::Metrics).0,
            "404 Not Found"
        );
        assert_eq!(
            respond("POST", "/metrics", &m, Serves::All).0,
            "405 Method Not Allowed"
        );
        assert_eq!(
            respond("GET", "/readyz", &m, Serves::All).0,
            "503 Service Unavailable"
        );
    }
}
