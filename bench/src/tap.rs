//! A counting relay in front of an agent's HTTP port: clients connect to the tap, which copies
//! bytes both ways unchanged and counts the HTTP/1.1 requests going upstream (request heads,
//! skipping `Content-Length` bodies). This is how the lock workloads count the requests each
//! Vigil recipe sends per acquisition without touching the client library. It costs one extra
//! loopback hop per request; dropping the tap closes every relayed connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// See the module documentation.
pub struct Tap {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Tap {
    /// Listens on a free loopback port and relays every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Tap> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        let accept = tokio::spawn(async move {
            // Owned here, so aborting this task drops (and aborts) every relay.
            let mut relays = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                relays.spawn(relay(client, upstream, counter.clone()));
                while relays.try_join_next().is_some() {}
            }
        });
        Ok(Tap {
            addr,
            requests,
            accept,
        })
    }

    /// Where clients connect (`host:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests relayed so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, requests: Arc<AtomicU64>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    // Latency matters more than packet count here, as in the clients themselves.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let upstream_direction = async {
        let mut counter = RequestCounter::default();
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            requests.fetch_add(counter.feed(&buf[..n]), Ordering::Relaxed);
            if server_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_tx.shutdown().await;
    };
    let downstream_direction = async {
        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
        let _ = client_tx.shutdown().await;
    };
    tokio::join!(upstream_direction, downstream_direction);
}

/// Finds request boundaries in an HTTP/1.1 byte stream: a head ends at a blank line and is
/// followed by `Content-Length` bytes of body (the clients measured never send chunked bodies).
#[derive(Debug, Default)]
struct RequestCounter {
    /// The head read so far.
    head: Vec<u8>,
    /// Body bytes still to skip.
    body_left: usize,
}

impl RequestCounter {
    /// Consumes the next bytes; returns how many request heads they completed.
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        let mut count = 0;
        let mut rest = bytes.to_vec();
        loop {
            let skip = self.body_left.min(rest.len());
            self.body_left -= skip;
            rest.drain(..skip);
            if rest.is_empty() {
                return count;
            }
            // Search only where a terminator could newly appear.
            let from = self.head.len().saturating_sub(3);
            self.head.extend_from_slice(&rest);
            let Some(pos) = self.head[from..].windows(4).position(|w| w == b"\r\n\r\n") else {
                return count;
            };
            let end = from + pos + 4;
            rest = self.head.split_off(end);
            count += 1;
            self.body_left = content_length(&self.head);
            self.head.clear();
        }
    }
}

fn content_length(head: &[u8]) -> usize {
    String::from_utf8_lossy(head)
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_heads_across_reads_and_skips_bodies() {
        let stream = b"PUT /v1/kv/a HTTP/1.1\r\ncontent-length: 8\r\n\r\n\r\n\r\nbody\
                       GET /v1/kv/a HTTP/1.1\r\nhost: x\r\n\r\n\
                       PUT /v1/session/create HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        for split in [1, 3, 7, 20, stream.len()] {
            let mut counter = RequestCounter::default();
            let total: u64 = stream.chunks(split).map(|c| counter.feed(c)).sum();
            assert_eq!(total, 3, "read in chunks of {split}");
            assert_eq!(counter.body_left, 0);
            assert!(counter.head.is_empty());
        }
    }
}
