//! Sending a client request ([`vigil_shared::rpc::calls`]) to a server over the transport's
//! client protocol ([`vigil_wire::tls::ALPN_RPC`]) and taking its reply out of the answer.
//! Servers dial each other with it (forming a cluster, handing over leadership) and client
//! agents dial servers.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use vigil_shared::rpc::ServerError;
use vigil_shared::rpc::calls::{Call, RpcRequest, RpcResponse, reply};
use vigil_wire::transport::{CallKind, RpcClient, TransportError};

/// A request built once for as many sends as retries need, that still names its reply.
pub struct Prepared<C> {
    request: RpcRequest,
    call: PhantomData<fn() -> C>,
}

impl<C: Call> Prepared<C> {
    pub fn new(call: C) -> Prepared<C> {
        Prepared {
            request: call.into(),
            call: PhantomData,
        }
    }

    pub fn request(&self) -> &RpcRequest {
        &self.request
    }
}

/// Sends `request` to the server at `addr` and takes its reply out of the answer: the
/// transport's failure, or the server's answer ([`reply`]).
pub async fn send<C: Call>(
    rpc: &RpcClient,
    kind: CallKind,
    addr: SocketAddr,
    request: &Prepared<C>,
    timeout: Duration,
) -> Result<Result<C::Output, ServerError>, TransportError> {
    let response = rpc
        .call_typed_as::<RpcRequest, RpcResponse>(kind, addr, request.request(), timeout)
        .await?;
    Ok(reply::<C>(response))
}

/// Whether nothing listens on UDP `addr` any more: evidence that the server there died (its
/// host is up, its process gone), as opposed to one that is slow or stopped, which still owns
/// its socket. A one-byte datagram, which a QUIC endpoint drops unread, goes from a connected
/// socket; the kernel answers it for a closed port with ICMP port unreachable, reported on
/// the socket as a refused connection (on loopback or a LAN within a round trip). `false`
/// when nothing came within `wait` (a live endpoint, a host that is down, a network that drops
/// ICMP: no evidence either way) or the probe could not be sent.
pub async fn port_closed(addr: SocketAddr, wait: Duration) -> bool {
    let local: SocketAddr = if addr.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let refused = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionRefused;
    let Ok(socket) = tokio::net::UdpSocket::bind(local).await else {
        return false;
    };
    if socket.connect(addr).await.is_err() {
        return false;
    }
    match socket.send(&[0]).await {
        Ok(_) => {}
        Err(e) => return refused(&e),
    }
    let mut buf = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, socket.recv(&mut buf)).await,
        Ok(Err(e)) if refused(&e)
    )
}
