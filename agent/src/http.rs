//! The health and metrics server: `/healthz`, `/readyz`, `/metrics`.
//!
//! A few lines of HTTP/1.1 over tokio: one request per connection, GET only.

use std::{net::SocketAddr, sync::Arc};

use anyhow::{Context as _, Result};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

use crate::{lease::unix_now, metrics::Metrics};

/// Binds `addr` and serves it in the background.
pub(crate) async fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the health server to {addr}"))?;
    tokio::spawn(serve(listener, metrics));
    Ok(())
}

async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            // Read until the end of the request head (or the buffer is full).
            while n < buf.len() {
                match tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    sock.read(&mut buf[n..]),
                )
                .await
                {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(k)) => {
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
            let (status, ctype, body) = match (method, path) {
                ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
                ("GET", "/readyz") if metrics.ready() => {
                    ("200 OK", "text/plain", "ready\n".to_string())
                }
                ("GET", "/readyz") => (
                    "503 Service Unavailable",
                    "text/plain",
                    "not ready: the lease is not held or the peers are not programmed yet\n"
                        .to_string(),
                ),
                ("GET", "/metrics") => (
                    "200 OK",
                    "text/plain; version=0.0.4",
                    metrics.render(unix_now()),
                ),
                ("GET", _) => (
                    "404 Not Found",
                    "text/plain",
                    "try /healthz, /readyz or /metrics\n".to_string(),
                ),
                _ => (
                    "405 Method Not Allowed",
                    "text/plain",
                    "GET only\n".to_string(),
                ),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}
