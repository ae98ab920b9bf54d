//! Refusals reported by the kernel on the gossip socket (Linux): with `IP_RECVERR` /
//! `IPV6_RECVERR` set, an ICMP error answering one of our datagrams is queued on the socket's
//! error queue with the datagram's destination, and the socket reports error readiness. Only a
//! port unreachable (`ECONNREFUSED`) is kept: it says the host is up and nothing listens on the
//! port, which is evidence that the member's process is gone. Every other error (host or network
//! unreachable, a message too big) says nothing about the process and is dropped.
//!
//! Elsewhere (and where the option cannot be set) nothing is enabled and no refusal is ever
//! reported: failure detection is by timeout alone.

use std::io;
use std::net::SocketAddr;

#[cfg(target_os = "linux")]
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Asks the kernel to queue ICMP errors on `socket`; whether it will.
#[cfg(target_os = "linux")]
pub fn enable(socket: &UdpSocket) -> bool {
    use nix::sys::socket::{setsockopt, sockopt};
    let set = match socket.local_addr() {
        Ok(SocketAddr::V4(_)) => setsockopt(socket, sockopt::Ipv4RecvErr, &true),
        Ok(SocketAddr::V6(_)) => setsockopt(socket, sockopt::Ipv6RecvErr, &true),
        Err(e) => {
            tracing::debug!(error = %e, "gossip socket has no address; no refusal evidence");
            return false;
        }
    };
    match set {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "could not enable IP_RECVERR on the gossip socket; failures are detected by timeout only");
            false
        }
    }
}

/// Refusal evidence is Linux-only.
#[cfg(not(target_os = "linux"))]
pub fn enable(_socket: &UdpSocket) -> bool {
    false
}

/// Waits for the next queued error on `socket` (see [`enable`]) and takes it off the queue:
/// `Some(destination)` for a port unreachable, `None` for any other error.
#[cfg(target_os = "linux")]
pub async fn next(socket: &UdpSocket) -> io::Result<Option<SocketAddr>> {
    socket.async_io(Interest::ERROR, || take_one(socket)).await
}

/// Never ready: no error is queued where [`enable`] enables nothing.
#[cfg(not(target_os = "linux"))]
pub async fn next(_socket: &UdpSocket) -> io::Result<Option<SocketAddr>> {
    std::future::pending().await
}

#[cfg(target_os = "linux")]
fn take_one(socket: &UdpSocket) -> io::Result<Option<SocketAddr>> {
    use std::io::IoSliceMut;
    use std::os::fd::AsRawFd as _;

    use nix::libc;
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};

    // The payload is the start of our own datagram; only its destination matters.
    let mut payload = [0u8; 64];
    let mut iov = [IoSliceMut::new(&mut payload)];
    let mut control = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
    let msg = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let refused = msg.cmsgs().map_err(io::Error::from)?.any(|c| {
        let err = match c {
            ControlMessageOwned::Ipv4RecvErr(err, _) | ControlMessageOwned::Ipv6RecvErr(err, _) => {
                err
            }
            _ => return false,
        };
        let icmp =
            err.ee_origin == libc::SO_EE_ORIGIN_ICMP || err.ee_origin == libc::SO_EE_ORIGIN_ICMP6;
        icmp && err.ee_errno == libc::ECONNREFUSED as u32
    });
    let destination = msg.address.and_then(|a| {
        a.as_sockaddr_in()
            .map(|v4| SocketAddr::from(std::net::SocketAddrV4::from(*v4)))
            .or_else(|| {
                a.as_sockaddr_in6()
                    .map(|v6| SocketAddr::from(std::net::SocketAddrV6::from(*v6)))
            })
    });
    Ok(destination
        .filter(|_| refused)
        .map(|d| SocketAddr::new(d.ip().to_canonical(), d.port())))
}
