//! Serving the HTTP API on its listeners: HTTP/1.1 (Consul's API speaks nothing else), in plain
//! text (`--http-addr`) or over TLS (`--https-addr`, the same router), with Consul's per-client
//! connection cap and a header timeout, and a graceful drain on shutdown.
//!
//! - **TLS**: the handshake runs in the connection's own task, bounded by the header timeout,
//!   so a slow or silent client never holds up the accept loop. With `verify_incoming_https`
//!   the rustls config requires a client certificate signed by the CA and the handshake fails
//!   without one (see `vigil_wire::tls::TlsMaterial::https_server_config`).
//! - **Connections per client IP** (Consul's `limits.http_max_conns_per_client`, default 200):
//!   a connection over the cap gets Consul's `429 Too Many Requests` (written only if it fits
//!   the socket buffer at once) and is closed at once, so one client cannot use up the agent's
//!   file descriptors. 0 means no cap.
//! - **Header timeout**: a connection must deliver a complete request head within this long of
//!   being opened or of its previous response, else hyper closes it. It is therefore also the
//!   idle timeout of a keep-alive connection (Go's `http.Server` likewise falls back to its
//!   header timeout for idle connections). A request being handled (a blocking query) is not
//!   timed by it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Consul's answer to a connection over the per-client cap (hashicorp/go-connlimit).
const TOO_MANY_CONNS: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\n\
Content-Type: text/plain\r\n\
Content-Length: 81\r\n\
Connection: close\r\n\r\n\
Your IP is issuing too many concurrent connections, please rate limit your calls\n";
/// Pause after a failed accept (out of file descriptors, say) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How the API's connections are bounded (defaults: the `vigil agent` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections one client IP may have; 0 for no cap.
    pub max_conns_per_client: usize,
    /// How long a connection may take to send a request head (and may stay idle).
    pub header_timeout: Duration,
}

/// Open connections per client IP. A [`Slot`] is one of them, given back when dropped.
#[derive(Debug, Default)]
struct ConnCounts {
    open: Mutex<HashMap<IpAddr, usize>>,
}

struct Slot {
    counts: Arc<ConnCounts>,
    ip: IpAddr,
}

impl ConnCounts {
    /// Takes a slot for `ip`, or `None` when it already has `max` (0: no cap).
    fn take(self: &Arc<ConnCounts>, ip: IpAddr, max: usize) -> Option<Slot> {
        let mut open = self.open.lock();
        let n = open.entry(ip).or_default();
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot {
            counts: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then lets open requests finish. With `tls`
/// every connection is a TLS one (HTTPS).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    tls: Option<TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let counts = Arc::new(ConnCounts::default());
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let Some(slot) = counts.take(peer.ip(), limits.max_conns_per_client) else {
            refuse(stream, peer);
            continue;
        };
        let router = router.clone();
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            match tls {
                None => serve_connection(stream, router, limits, shutdown).await,
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => serve_connection(stream, router, limits, shutdown).await,
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

/// Consul's 429 for a client over its cap, written only if the socket takes it at once; then
/// the connection is closed (dropped).
fn refuse(stream: TcpStream, peer: SocketAddr) {
    tracing::debug!(%peer, "too many connections from this client; closing");
    let _ = stream.try_write(TOO_MANY_CONNS);
}

async fn serve_connection<S>(
    stream: S,
    router: Router,
    limits: ConnLimits,
    shutdown: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "HTTP connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_per_ip_and_given_back() {
        let counts = Arc::new(ConnCounts::default());
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let first = counts.take(a, 2).expect("first");
        let second = counts.take(a, 2).expect("second");
        assert!(counts.take(a, 2).is_none(), "a third from the same IP");
        let other = counts.take(b, 2).expect("another IP has its own cap");
        drop(first);
        let again = counts.take(a, 2).expect("a slot given back is free");
        drop((second, other, again));
        assert!(counts.open.lock().is_empty());
        // 0: no cap.
        let many: Vec<Slot> = (0..1000).filter_map(|_| counts.take(a, 0)).collect();
        assert_eq!(many.len(), 1000);
    }

    #[test]
    fn the_refusal_is_consuls_429() {
        let text = std::str::from_utf8(TOO_MANY_CONNS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 429 Too Many Requests\r\n"));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
    }
}
