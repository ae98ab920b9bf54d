//! RPC over QUIC, bytes in and bytes out: the frame format, the accepting side ([`serve`] hands
//! each request to the [`RpcHandler`] of the connection's ALPN [`Protocol`] with the caller's
//! [`PeerIdentity`]) and the dialing side ([`RpcClient`], one pooled connection per peer and
//! protocol). Invariants: a connection speaks one protocol, chosen at the handshake, and one
//! that only servers may speak is closed before any request is read when the certificate is
//! not a server's; one request and one response per bidirectional stream, each a frame
//! `[version: u8][len: u32 BE][payload]` of at most [`MAX_FRAME_LEN`] bytes, except on a stream
//! that opens with an empty frame: a stream call ([`RpcClient::stream`]), whose requests follow
//! one frame each as the caller has them and are answered one frame each, in order, or, on a
//! protocol that multiplexes, the stream a client's blocking calls share, answered as each is
//! ready (`transport/mux.rs`); a request
//! is sent twice only when the first attempt is known not to have reached a live handler (see
//! [`RpcClient::call`]); every server task is tracked and stops on shutdown. The message types
//! live elsewhere; this module never decodes payloads.
//!
//! What a peer can make the accepting side hold is bounded ([`RequestLimits`], per protocol): a
//! request frame's buffer grows as its bytes arrive, never from the length it announces; the
//! frames one peer (a certificate from one IP address) has being read count against its budget
//! by their announced length, and a frame above the protocol's per-peer size takes the
//! protocol's one slot for large frames (snapshot restores); a frame that finds no room is
//! refused at once, unread ([`TransportError::Refused`]: refused streams free what QUIC holds
//! of them, where a waiting one would keep its share of the connection receive window and
//! could starve the frame being read); a frame must arrive whole by its deadline
//! ([`FRAME_DEADLINE`] plus a second per MiB), else its stream is reset and its room freed;
//! and a peer has at most [`MAX_CONNECTIONS_PER_PEER`] connections per protocol.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Either};
use futures::stream::{BoxStream, StreamExt as _};
use parking_lot::Mutex;
use quinn::{ClientConfig, Connection, ConnectionError, Endpoint, RecvStream, SendStream, VarInt};
use rustls_pki_types::CertificateDer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use crate::tls::{PeerIdentity, Role, TlsError, TlsMaterial, peer_identity};

mod mux;

/// The frame version this node writes and the only one it reads.
pub const FRAME_VERSION: u8 = 1;
/// Largest payload in one frame; snapshots are the big ones.
pub const MAX_FRAME_LEN: usize = 64 * 1024 * 1024;
/// Largest request frame a peer may send on the client protocol at any time: near the
/// servers' command limit (2 MiB), which only a snapshot restore's archive exceeds.
pub const MAX_REQUEST_FRAME: usize = 3 * 1024 * 1024;
/// A request frame must be whole within this long of being admitted (its header read and its
/// bytes within the peer's budget), plus a second per [`FRAME_MIN_RATE`] bytes it announces; a
/// stream's first header must come within this long of the stream's opening.
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);
/// The slowest a request frame may arrive at, in bytes per second, beyond [`FRAME_DEADLINE`].
pub const FRAME_MIN_RATE: usize = 1024 * 1024;
/// Connections one peer (a certificate from one IP address) may have open per protocol: a
/// client opens one control and up to `MAX_WATCH_CONNECTIONS` watch connections, and a
/// restarted one may overlap with its old ones for a while.
pub const MAX_CONNECTIONS_PER_PEER: usize = 40;
/// Version byte plus big-endian length.
const HEADER_LEN: usize = 5;

/// Stream reset code: the request frame was malformed (unknown version, too large, truncated).
const STREAM_BAD_REQUEST: VarInt = VarInt::from_u32(1);
/// Stream reset code: the handler's response does not fit in a frame.
const STREAM_RESPONSE_TOO_LARGE: VarInt = VarInt::from_u32(2);
/// Stream reset code: the server shut down while the handler was running.
const STREAM_SHUTTING_DOWN: VarInt = VarInt::from_u32(3);
/// Stream reset code: a stream call to a protocol that has none.
const STREAM_NOT_STREAMED: VarInt = VarInt::from_u32(4);
/// Stream reset code: the request frame did not arrive whole by its deadline.
const STREAM_TOO_SLOW: VarInt = VarInt::from_u32(5);
/// Stream reset code: the request was refused unread, the peer having as much being read as
/// it may (or the large-frame slot being taken).
const STREAM_BUSY: VarInt = VarInt::from_u32(6);
/// Connection close code: this node is shutting down.
const CLOSE_SHUTDOWN: VarInt = VarInt::from_u32(0);
/// Connection close code: the peer's certificate names no role.
const CLOSE_UNKNOWN_PEER: VarInt = VarInt::from_u32(1);
/// Connection close code: the caller dropped the connection on purpose.
const CLOSE_DISCONNECT: VarInt = VarInt::from_u32(2);
/// Connection close code: the negotiated ALPN protocol is not served here.
const CLOSE_UNKNOWN_PROTOCOL: VarInt = VarInt::from_u32(3);
/// Connection close code: the protocol is for servers and the certificate is not a server's.
const CLOSE_SERVERS_ONLY: VarInt = VarInt::from_u32(4);
/// Connection close code: the peer has [`MAX_CONNECTIONS_PER_PEER`] connections open already.
const CLOSE_TOO_MANY_CONNECTIONS: VarInt = VarInt::from_u32(5);
/// How long shutdown waits for close frames to reach the peers.
const CLOSE_GRACE: Duration = Duration::from_secs(1);
/// Blocking calls one watch connection carries at most: under the peer's stream limit
/// ([`crate::tls::MAX_CONCURRENT_STREAMS`]), so opening a stream never waits for a free one.
const WATCH_STREAMS_PER_CONNECTION: usize = 1000;
/// Watch connections per peer at most, which bounds blocking calls to one peer.
const MAX_WATCH_CONNECTIONS: usize = 16;

/// Why an RPC failed, in terms a caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// No connection could be made: nothing listens there, the handshake timed out, or TLS
    /// refused one side's certificate. Try another server.
    #[error("{addr} is unreachable: {reason}")]
    Unreachable { addr: SocketAddr, reason: String },
    /// No response within the deadline; the request may or may not have been handled.
    #[error("no response from {addr} within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    /// The connection was lost after the request may have been sent; it may or may not have
    /// been handled. The next call redials.
    #[error("connection to {addr} lost: {reason}")]
    Closed { addr: SocketAddr, reason: String },
    /// A frame broke the protocol (unknown version, too large, truncated) or a payload did not
    /// encode or decode. Retrying will not help.
    #[error("RPC protocol error: {0}")]
    Protocol(String),
    /// Every watch connection to the peer carries as many blocking calls as it may; the call
    /// was not sent.
    #[error("too many blocking calls in flight to {addr}")]
    Busy { addr: SocketAddr },
    /// The peer refused the request unread: it is reading as much from this node as it may, or
    /// another large request. It was not handled; retry later.
    #[error("{addr} refused the request unread: it is reading as much as it may; retry later")]
    Refused { addr: SocketAddr },
}

/// Why a QUIC endpoint could not be created.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The certificates could not be turned into TLS configurations.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The UDP address could not be bound (in use, not local, no permission).
    #[error("binding UDP {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    /// The socket could not be handed to the runtime.
    #[error("setting up the QUIC endpoint: {0}")]
    Socket(#[source] io::Error),
    /// Endpoints must be created inside a tokio runtime.
    #[error("no tokio runtime to run the QUIC endpoint on")]
    NoRuntime,
}

/// The endpoint of a server (or of any agent that accepts RPCs): accepts connections with the
/// certificates in `tls` and dials with them too.
pub fn server_endpoint(bind: SocketAddr, tls: &TlsMaterial) -> Result<Endpoint, EndpointError> {
    let socket =
        UdpSocket::bind(bind).map_err(|source| EndpointError::Bind { addr: bind, source })?;
    server_endpoint_from_socket(socket, tls)
}

/// Like [`server_endpoint`] on a socket bound earlier (the agent binds its RPC port first to
/// learn the port number).
pub fn server_endpoint_from_socket(
    socket: UdpSocket,
    tls: &TlsMaterial,
) -> Result<Endpoint, EndpointError> {
    let runtime = quinn::default_runtime().ok_or(EndpointError::NoRuntime)?;
    let mut endpoint = Endpoint::new(
        tls.endpoint_config(),
        Some(tls.server_config()?),
        socket,
        runtime,
    )
    .map_err(EndpointError::Socket)?;
    endpoint.set_default_client_config(tls.client_config()?);
    Ok(endpoint)
}

/// A dial-only endpoint on an OS-chosen IPv4 port, for agents that only call servers.
pub fn client_endpoint(tls: &TlsMaterial) -> Result<Endpoint, EndpointError> {
    let bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let socket =
        UdpSocket::bind(bind).map_err(|source| EndpointError::Bind { addr: bind, source })?;
    let runtime = quinn::default_runtime().ok_or(EndpointError::NoRuntime)?;
    let mut endpoint = Endpoint::new(tls.endpoint_config(), None, socket, runtime)
        .map_err(EndpointError::Socket)?;
    endpoint.set_default_client_config(tls.client_config()?);
    Ok(endpoint)
}

/// Answers requests. `peer` is who the caller's certificate proves it is, so handlers can
/// refuse server-only requests (joins, leader-internal writes) from client agents. The
/// response is always a payload: errors are part of the message types.
pub trait RpcHandler: Send + Sync + 'static {
    fn handle(&self, peer: &PeerIdentity, request: Vec<u8>) -> BoxFuture<'static, Vec<u8>>;

    /// Answers a stream call ([`RpcClient::stream`]): `requests` yields each request as it
    /// arrives and ends when the caller finishes (or the stream breaks); each item of the
    /// returned stream goes back as one response, in order. `None` (the default): this protocol
    /// has no stream calls, and the stream is reset.
    fn handle_stream(&self, _peer: &PeerIdentity, _requests: Frames) -> Option<Frames> {
        None
    }

    /// Whether a stream call on this protocol is the stream the peer's blocking calls share
    /// (see [`RpcClient::call_blocking`]): each request on it is answered by
    /// [`RpcHandler::handle`], as it would be on a stream of its own, as soon as it is ready,
    /// and [`RpcHandler::handle_stream`] is not asked.
    fn multiplexes(&self) -> bool {
        false
    }
}

/// Frames of a stream call, one message each.
pub type Frames = BoxStream<'static, Vec<u8>>;

/// The answers to a stream call, in order.
pub type Responses = BoxStream<'static, Result<Vec<u8>, TransportError>>;

/// One ALPN protocol the accepting side speaks, and who answers it.
#[derive(Clone)]
pub struct Protocol {
    /// The ALPN id, one of those the endpoint's TLS configuration offers.
    pub alpn: &'static [u8],
    /// Whether only a peer whose certificate proves a server may speak it.
    pub servers_only: bool,
    /// What one peer may send on it at once.
    pub limits: RequestLimits,
    pub handler: Arc<dyn RpcHandler>,
}

/// How much one peer may make a protocol hold in request frames being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Largest request frame a peer may send at any time. A larger one (up to
    /// [`MAX_FRAME_LEN`]) is read only while no other such frame of this protocol is, from any
    /// peer: one at a time.
    pub frame: usize,
    /// Bytes of frames (counted by their announced length) one peer may have being read at
    /// once; at least `frame`.
    pub in_flight: usize,
}

impl RequestLimits {
    /// The client protocol's ([`crate::tls::ALPN_RPC`]): requests near the command limit, and
    /// one larger one at a time (a snapshot restore's archive).
    pub const RPC: RequestLimits = RequestLimits {
        frame: MAX_REQUEST_FRAME,
        in_flight: 4 * MAX_REQUEST_FRAME,
    };
    /// Raft's ([`crate::tls::ALPN_RAFT`], servers only): snapshots travel in frames of up to
    /// [`MAX_FRAME_LEN`], beside the replication stream.
    pub const RAFT: RequestLimits = RequestLimits {
        frame: MAX_FRAME_LEN,
        in_flight: 2 * MAX_FRAME_LEN,
    };
}

/// A protocol as [`serve`] runs it.
struct Served {
    protocol: Protocol,
    /// One permit: the frame above `limits.frame` being read.
    large: Arc<Semaphore>,
}

/// The peers connected per protocol, for [`MAX_CONNECTIONS_PER_PEER`] and their budgets.
#[derive(Default)]
struct Peers {
    /// Keys certificates without keeping them (a random seed: no peer can make two collide).
    hasher: std::hash::RandomState,
    open: Mutex<HashMap<PeerKey, PeerEntry>>,
}

/// One peer of one protocol: which protocol, a hash of its certificate, and its IP address.
type PeerKey = (&'static [u8], u64, IpAddr);

struct PeerEntry {
    connections: usize,
    /// Permits are bytes of request frames being read ([`RequestLimits::in_flight`]).
    budget: Arc<Semaphore>,
    /// Permits are calls on the peer's multiplexed streams ([`mux::MAX_CALLS`]).
    muxed: Arc<Semaphore>,
}

/// A connection counted against its peer's cap until dropped, with the peer's budget.
struct PeerSlot {
    peers: Arc<Peers>,
    key: PeerKey,
    budget: Arc<Semaphore>,
    muxed: Arc<Semaphore>,
}

impl Peers {
    /// Counts a connection of the peer holding `certificate` at `ip` on `protocol`; `None` when
    /// it has [`MAX_CONNECTIONS_PER_PEER`] already.
    fn admit(
        self: &Arc<Peers>,
        protocol: &Protocol,
        certificate: &[u8],
        ip: IpAddr,
    ) -> Option<PeerSlot> {
        let key = (protocol.alpn, self.hasher.hash_one(certificate), ip);
        let mut open = self.open.lock();
        let entry = open.entry(key).or_insert_with(|| PeerEntry {
            connections: 0,
            budget: Arc::new(Semaphore::new(protocol.limits.in_flight)),
            muxed: Arc::new(Semaphore::new(mux::MAX_CALLS)),
        });
        if entry.connections >= MAX_CONNECTIONS_PER_PEER {
            return None;
        }
        entry.connections += 1;
        Some(PeerSlot {
            peers: Arc::clone(self),
            key,
            budget: Arc::clone(&entry.budget),
            muxed: Arc::clone(&entry.muxed),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock();
        if let Some(entry) = open.get_mut(&self.key) {
            entry.connections -= 1;
            if entry.connections == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// What bounds the request frames of one connection: its protocol's limits and large-frame
/// slot, and its peer's budget.
#[derive(Clone)]
struct RequestBounds {
    limits: RequestLimits,
    large: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    /// The peer's calls on multiplexed streams, all of its connections together.
    muxed: Arc<Semaphore>,
}

impl RequestBounds {
    /// Room to read a frame of `len` bytes, held until it is whole: the large-frame slot, or
    /// `len` bytes of the peer's budget. `None` when there is none now.
    fn admit(&self, len: usize) -> Option<OwnedSemaphorePermit> {
        if len > self.limits.frame {
            Arc::clone(&self.large).try_acquire_owned().ok()
        } else {
            let bytes = u32::try_from(len).ok()?;
            Arc::clone(&self.budget).try_acquire_many_owned(bytes).ok()
        }
    }
}

/// By when a frame of `len` bytes admitted at `since` must be whole.
fn frame_deadline(since: Instant, len: usize) -> Instant {
    since + FRAME_DEADLINE + Duration::from_secs((len / FRAME_MIN_RATE) as u64)
}

/// Accepts connections on `endpoint` until `shutdown`, serving every bidirectional stream as
/// one request to the handler of the [`Protocol`] the connection negotiated, with the caller's
/// identity judged against `server_name` (`server.<dc>.<domain>`). All tasks go on `tasks`. On
/// shutdown, in-flight handlers are dropped and the endpoint is closed (peers see the close at
/// once), so an [`RpcClient`] sharing this endpoint stops working too.
pub fn serve(
    endpoint: Endpoint,
    server_name: &str,
    protocols: Vec<Protocol>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let server_name: Arc<str> = Arc::from(server_name);
    let protocols: Arc<[Served]> = protocols
        .into_iter()
        .map(|protocol| Served {
            protocol,
            large: Arc::new(Semaphore::new(1)),
        })
        .collect();
    let peers = Arc::new(Peers::default());
    let tracker = tasks.clone();
    tasks.spawn(async move {
        loop {
            let incoming = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                incoming = endpoint.accept() => match incoming {
                    Some(incoming) => incoming,
                    None => break,
                },
            };
            tracker.spawn(serve_connection(
                incoming,
                Arc::clone(&server_name),
                Arc::clone(&protocols),
                Arc::clone(&peers),
                shutdown.clone(),
                tracker.clone(),
            ));
        }
        endpoint.close(CLOSE_SHUTDOWN, b"shutting down");
        let _ = tokio::time::timeout(CLOSE_GRACE, endpoint.wait_idle()).await;
    });
}

async fn serve_connection(
    incoming: quinn::Incoming,
    server_name: Arc<str>,
    protocols: Arc<[Served]>,
    peers: Arc<Peers>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    let remote = incoming.remote_address();
    let connection = tokio::select! {
        biased;
        () = shutdown.cancelled() => return,
        connection = incoming => match connection {
            Ok(connection) => connection,
            Err(error) => {
                tracing::warn!(%remote, %error, "RPC handshake failed");
                return;
            }
        },
    };
    let (Some(peer), Some(certificate)) = (
        peer_identity(&connection, &server_name),
        peer_certificate(&connection),
    ) else {
        tracing::warn!(%remote, "RPC peer certificate names no role; closing");
        connection.close(CLOSE_UNKNOWN_PEER, b"certificate names no role");
        return;
    };
    let alpn = negotiated_protocol(&connection);
    let Some(served) = protocols
        .iter()
        .find(|p| Some(p.protocol.alpn) == alpn.as_deref())
    else {
        tracing::warn!(%remote, alpn = ?alpn, "RPC peer speaks no protocol served here; closing");
        connection.close(CLOSE_UNKNOWN_PROTOCOL, b"protocol not served");
        return;
    };
    let protocol = &served.protocol;
    if protocol.servers_only && peer.role != Role::Server {
        tracing::warn!(%remote, role = %peer.role, "a server-only protocol from a non-server; closing");
        connection.close(
            CLOSE_SERVERS_ONLY,
            b"this protocol needs a server certificate",
        );
        return;
    }
    let Some(slot) = peers.admit(protocol, &certificate, remote.ip()) else {
        tracing::warn!(%remote, role = %peer.role, node = ?peer.node, "too many connections from this peer; closing");
        connection.close(
            CLOSE_TOO_MANY_CONNECTIONS,
            b"too many connections from this peer",
        );
        return;
    };
    let bounds = RequestBounds {
        limits: protocol.limits,
        large: Arc::clone(&served.large),
        budget: Arc::clone(&slot.budget),
        muxed: Arc::clone(&slot.muxed),
    };
    let handler = Arc::clone(&protocol.handler);
    let peer = Arc::new(peer);
    tracing::debug!(%remote, role = %peer.role, node = ?peer.node, "RPC peer connected");
    loop {
        let (send, recv) = tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            stream = connection.accept_bi() => match stream {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%remote, %error, "RPC connection ended");
                    return;
                }
            },
        };
        let opened = Instant::now();
        let handler = Arc::clone(&handler);
        let peer = Arc::clone(&peer);
        let bounds = bounds.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            let mut send = send;
            let stream = Accepted {
                recv,
                opened,
                bounds,
                remote,
            };
            tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    // Say so explicitly: a plain drop would finish the stream, which the caller
                    // would read as a truncated response.
                    let _ = send.reset(STREAM_SHUTTING_DOWN);
                }
                () = serve_stream(&mut send, stream, &peer, handler.as_ref()) => {}
            }
        });
    }
}

/// The leaf certificate the peer presented (verified by the handshake).
fn peer_certificate(connection: &Connection) -> Option<CertificateDer<'static>> {
    let identity = connection.peer_identity()?;
    let chain = identity.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    chain.into_iter().next()
}

/// An accepted stream's receiving side, and what bounds the requests read from it.
struct Accepted {
    recv: RecvStream,
    /// When the stream was accepted: its first frame's deadline counts from then.
    opened: Instant,
    bounds: RequestBounds,
    remote: SocketAddr,
}

impl Accepted {
    /// The next request frame, or `None` when the peer finished the stream between frames.
    /// The first frame's header must come within [`FRAME_DEADLINE`] of the stream's opening;
    /// a later one's (a stream call's) may come any time. The frame is then read if the bounds
    /// have room for it ([`Failure::Busy`] if not), and must be whole by its
    /// [`frame_deadline`] from then, else [`Failure::Late`].
    async fn next_request(&mut self, first: bool) -> Result<Option<Vec<u8>>, Failure> {
        let header = if first {
            tokio::time::timeout_at(self.opened + FRAME_DEADLINE, read_header(&mut self.recv))
                .await
                .map_err(|_| Failure::Late)??
        } else {
            read_header(&mut self.recv).await?
        };
        let Some(len) = header else {
            return Ok(None);
        };
        let Some(_room) = self.bounds.admit(len) else {
            return Err(Failure::Busy);
        };
        let deadline = frame_deadline(Instant::now(), len);
        match tokio::time::timeout_at(deadline, read_payload(&mut self.recv, len)).await {
            Ok(payload) => payload.map(Some),
            Err(_) => Err(Failure::Late),
        }
    }

    /// Refuses the stream's request: stops the peer's sending and resets ours with `code`.
    fn refuse(&mut self, send: &mut SendStream, code: VarInt) {
        let _ = self.recv.stop(code);
        let _ = send.reset(code);
    }
}

/// The ALPN protocol the handshake settled on.
fn negotiated_protocol(connection: &Connection) -> Option<Vec<u8>> {
    connection
        .handshake_data()?
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()?
        .protocol
}

/// One request/response exchange on the accepting side, or a stream call.
async fn serve_stream(
    send: &mut SendStream,
    mut stream: Accepted,
    peer: &PeerIdentity,
    handler: &dyn RpcHandler,
) {
    let remote = stream.remote;
    let request = match stream.next_request(true).await {
        Ok(Some(request)) => request,
        Ok(None) => {
            tracing::warn!(%remote, "rejecting RPC request: stream ended before a frame");
            return stream.refuse(send, STREAM_BAD_REQUEST);
        }
        Err(Failure::Protocol(reason)) => {
            tracing::warn!(%remote, %reason, "rejecting RPC request");
            return stream.refuse(send, STREAM_BAD_REQUEST);
        }
        Err(Failure::Late) => {
            tracing::warn!(%remote, "rejecting RPC request: its frame did not arrive in time");
            return stream.refuse(send, STREAM_TOO_SLOW);
        }
        Err(Failure::Busy) => {
            tracing::debug!(%remote, "refusing RPC request: the peer has as much being read as it may");
            return stream.refuse(send, STREAM_BUSY);
        }
        Err(Failure::Open(_) | Failure::Lost(_) | Failure::PeerShutdown | Failure::NotStreamed) => {
            return;
        }
    };
    if request.is_empty() {
        return serve_frames(send, stream, peer, handler).await;
    }
    let response = handler.handle(peer, request).await;
    if respond(send, response, remote).await {
        let _ = send.finish();
    }
}

/// Writes one response frame; false (the stream reset or broken) when it could not.
async fn respond(send: &mut SendStream, response: Vec<u8>, remote: SocketAddr) -> bool {
    if response.len() > MAX_FRAME_LEN {
        tracing::error!(%remote, len = response.len(), "RPC response exceeds the frame limit");
        let _ = send.reset(STREAM_RESPONSE_TOO_LARGE);
        return false;
    }
    match write_frame(send, response.into()).await {
        Ok(()) => true,
        Err(failure) => {
            tracing::debug!(%remote, error = %failure.into_error(remote), "RPC response not sent");
            false
        }
    }
}

/// The accepting side of a stream call: the handler's responses go back as they come, and
/// the stream is finished when they end. On a protocol whose handler multiplexes
/// ([`RpcHandler::multiplexes`]), the stream is the one the peer's blocking calls share
/// ([`mux`]), each request on it handed to the handler on its own.
async fn serve_frames(
    send: &mut SendStream,
    stream: Accepted,
    peer: &PeerIdentity,
    handler: &dyn RpcHandler,
) {
    let remote = stream.remote;
    let muxed = Arc::clone(&stream.bounds.muxed);
    let requests = futures::stream::unfold(stream, move |mut stream| async move {
        match stream.next_request(false).await {
            Ok(Some(frame)) => Some((frame, stream)),
            Ok(None) => None,
            Err(failure) => {
                tracing::debug!(%remote, error = %failure.into_error(remote), "stream call broken");
                None
            }
        }
    });
    let mut responses = if handler.multiplexes() {
        mux::serve(requests.boxed(), muxed, |request| {
            handler.handle(peer, request)
        })
        .boxed()
    } else {
        match handler.handle_stream(peer, requests.boxed()) {
            Some(responses) => responses,
            None => {
                tracing::warn!(%remote, "a stream call to a protocol that has none");
                let _ = send.reset(STREAM_NOT_STREAMED);
                return;
            }
        }
    };
    while let Some(response) = responses.next().await {
        if !respond(send, response, remote).await {
            return;
        }
    }
    let _ = send.finish();
}

/// Calls servers: each request on its own stream of a cached QUIC connection (a stream call,
/// all its requests on one). Per address there is one control connection (writes, pings,
/// reads that answer at once, raft) and, for calls that may block for minutes, watch
/// connections of at most `WATCH_STREAMS_PER_CONNECTION` calls each: however many blocking
/// queries wait, a write or a ping never queues behind them for a stream. A client speaks one
/// protocol: its endpoint's default ([`crate::tls::ALPN_RPC`]), or the one the configuration
/// given to [`RpcClient::with_config`] names (raft's, [`crate::tls::ALPN_RAFT`]). Cheap to
/// clone; clones share the pool.
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    endpoint: Endpoint,
    /// How to dial when not with the endpoint's default configuration.
    config: Option<ClientConfig>,
    /// The name every server certificate carries (`server.<dc>.<domain>`).
    server_name: String,
    /// One slot per peer and lane. The slot's async lock is held while dialing, so concurrent
    /// callers wait for one handshake instead of each starting their own.
    pool: Mutex<HashMap<(SocketAddr, Lane), Slot>>,
    /// Per peer, the stream its blocking calls share ([`mux`]).
    muxes: Mutex<HashMap<SocketAddr, mux::MuxSlot>>,
    /// Cancelled when the last clone is dropped: the multiplexed streams' tasks stop.
    closing: CancellationToken,
    /// Blocking calls in flight per peer and watch connection.
    watch_load: Mutex<HashMap<SocketAddr, [usize; MAX_WATCH_CONNECTIONS]>>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.closing.cancel();
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

/// Whether a call answers promptly or may wait at the server for long (a blocking query),
/// which decides the connection it travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Prompt,
    Blocking,
}

/// Which of a peer's connections a call travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lane {
    Control,
    Watch(usize),
}

/// A blocking call's place on a watch connection, given back when the call ends.
struct WatchSlot {
    inner: Arc<ClientInner>,
    addr: SocketAddr,
    connection: usize,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut load = self.inner.watch_load.lock();
        if let Some(counts) = load.get_mut(&self.addr) {
            counts[self.connection] -= 1;
            if counts.iter().all(|&n| n == 0) {
                load.remove(&self.addr);
            }
        }
    }
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("server_name", &self.inner.server_name)
            .field("local_addr", &self.inner.endpoint.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// A client dialing from `endpoint` (which must have a default client config, as the
    /// endpoints built here do) and verifying servers against `server_name`
    /// ([`TlsMaterial::server_name`]).
    pub fn new(endpoint: Endpoint, server_name: impl Into<String>) -> RpcClient {
        RpcClient::dialing(endpoint, None, server_name.into())
    }

    /// A client dialing from `endpoint` with `config` (e.g.
    /// [`TlsMaterial::raft_client_config`]), not the endpoint's default.
    pub fn with_config(
        endpoint: Endpoint,
        server_name: impl Into<String>,
        config: ClientConfig,
    ) -> RpcClient {
        RpcClient::dialing(endpoint, Some(config), server_name.into())
    }

    fn dialing(endpoint: Endpoint, config: Option<ClientConfig>, server_name: String) -> RpcClient {
        RpcClient {
            inner: Arc::new(ClientInner {
                endpoint,
                config,
                server_name,
                pool: Mutex::new(HashMap::new()),
                watch_load: Mutex::new(HashMap::new()),
                muxes: Mutex::new(HashMap::new()),
                closing: CancellationToken::new(),
            }),
        }
    }

    /// The endpoint this client dials from.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    /// Sends `request` to `addr` and waits at most `timeout` (dialing included) for the
    /// response. Uses the cached connection; a closed one is replaced first. When the cached
    /// connection turns out to be stale during the call (no stream could be opened, or the
    /// peer answered with a stateless reset because it restarted), the request cannot have
    /// reached a live handler there, so it is sent once more on a fresh connection. Any other
    /// connection loss drops the cached connection and returns [`TransportError::Closed`]
    /// without retrying, since the request may have been handled.
    ///
    /// This and the calls below are plain functions returning futures, not `async fn`s, which
    /// would keep their arguments twice: a blocking query holds these futures while it waits.
    pub fn call(
        &self,
        addr: SocketAddr,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send + '_ {
        self.call_on(addr, Lane::Control, request, timeout)
    }

    /// [`RpcClient::call`] for a call that may block for long (a blocking query): it travels
    /// on the stream the peer's blocking calls share (`transport/mux.rs`), or, to a peer that
    /// does not multiplex, on a stream of its own on one of the peer's watch connections; never
    /// on the control connection. On the shared stream, a peer silent for a second while calls
    /// wait is pinged, and one that does not answer within another fails them all with
    /// [`TransportError::Closed`]. Fails with [`TransportError::Busy`] when the peer carries as
    /// many blocking calls from this node as it may.
    pub fn call_blocking(
        &self,
        addr: SocketAddr,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send + '_ {
        self.call_muxed(addr, request, timeout)
    }

    /// A blocking call on a stream of its own, on the first watch connection to `addr` with
    /// room.
    fn call_alone(
        &self,
        addr: SocketAddr,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send + '_ {
        match self.watch_slot(addr) {
            Err(e) => Either::Left(std::future::ready(Err(e))),
            Ok(slot) => {
                let call = self.call_on(addr, Lane::Watch(slot.connection), request, timeout);
                // The place is held until the call ends.
                Either::Right(call.map(move |answer| {
                    drop(slot);
                    answer
                }))
            }
        }
    }

    fn call_on(
        &self,
        addr: SocketAddr,
        lane: Lane,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send + '_ {
        let checked = fits_a_frame(&request).and_then(|()| {
            if request.is_empty() {
                Err(TransportError::Protocol(
                    "an empty request: an empty first frame opens a stream call".to_owned(),
                ))
            } else {
                Ok(())
            }
        });
        if let Err(e) = checked {
            return Either::Left(std::future::ready(Err(e)));
        }
        let call = self.call_with_retry(addr, lane, Bytes::from(request));
        Either::Right(tokio::time::timeout(timeout, call).map(move |answer| {
            answer.unwrap_or(Err(TransportError::Timeout {
                addr,
                after: timeout,
            }))
        }))
    }

    /// Takes a place on the first watch connection to `addr` with room.
    fn watch_slot(&self, addr: SocketAddr) -> Result<WatchSlot, TransportError> {
        let mut load = self.inner.watch_load.lock();
        let counts = load.entry(addr).or_insert([0; MAX_WATCH_CONNECTIONS]);
        let connection = counts
            .iter()
            .position(|&n| n < WATCH_STREAMS_PER_CONNECTION)
            .ok_or(TransportError::Busy { addr })?;
        counts[connection] += 1;
        Ok(WatchSlot {
            inner: Arc::clone(&self.inner),
            addr,
            connection,
        })
    }

    /// [`RpcClient::call`] with postcard-encoded request and response.
    pub async fn call_typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        addr: SocketAddr,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, TransportError> {
        let request = encode(request)?;
        decode(&self.call(addr, request, timeout).await?)
    }

    /// [`RpcClient::call`] or [`RpcClient::call_blocking`], as `kind` says, with
    /// postcard-encoded request and response.
    pub async fn call_typed_as<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        kind: CallKind,
        addr: SocketAddr,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, TransportError> {
        let request = encode(request)?;
        self.call_encoded_as(kind, addr, request, timeout).await
    }

    /// [`RpcClient::call_typed_as`] for a request already encoded (by [`encode`]'s rule,
    /// postcard), so a caller that sends it to one server after another keeps only its bytes.
    pub fn call_encoded_as<Resp: DeserializeOwned>(
        &self,
        kind: CallKind,
        addr: SocketAddr,
        request: Vec<u8>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Resp, TransportError>> + Send + '_ {
        // A prompt call, on a stream of its own, is boxed: a blocking call (the multiplexed
        // kind, a few hundred bytes smaller) is held for as long as it waits, and would
        // otherwise keep room for one.
        let call = match kind {
            CallKind::Prompt => Either::Left(Box::pin(self.call(addr, request, timeout))),
            CallKind::Blocking => Either::Right(self.call_blocking(addr, request, timeout)),
        };
        call.map(|response| decode(&response?))
    }

    /// A stream call to `addr` on the control connection: each item of `requests` leaves as
    /// one request as soon as it is ready, without waiting for the answers before it, and the
    /// returned stream yields the answers in order. Each answer must come within `timeout` of
    /// its request's sending. The answers end after the last request's once `requests` ends,
    /// and at the first error; dropping them stops the call. The peer handles the requests in
    /// the order sent ([`RpcHandler::handle_stream`]). Nothing is sent twice: a connection
    /// lost mid-call fails it and is dropped from the pool.
    pub async fn stream(
        &self,
        addr: SocketAddr,
        requests: Frames,
        timeout: Duration,
    ) -> Result<Responses, TransportError> {
        let opened = async {
            let (connection, _) = self.connection(addr, Lane::Control).await?;
            match open_stream_call(&connection).await {
                Ok(streams) => Ok((connection, streams)),
                Err(failure) => {
                    self.forget(addr, Lane::Control, &connection).await;
                    Err(failure.into_error(addr))
                }
            }
        };
        let (connection, (send, recv)) = tokio::time::timeout(timeout, opened)
            .await
            .unwrap_or_else(|_| {
                Err(TransportError::Timeout {
                    addr,
                    after: timeout,
                })
            })?;
        let (deadlines, pending) = tokio::sync::mpsc::unbounded_channel();
        let writer = AbortOnDropHandle::new(tokio::spawn(write_requests(
            send, requests, deadlines, timeout, addr,
        )));
        let call = StreamCall {
            client: self.clone(),
            connection,
            addr,
            timeout,
            recv,
            pending,
            _writer: writer,
        };
        Ok(futures::stream::unfold(Some(call), |call| async move {
            let mut call = call?;
            let answer = call.next_answer().await?;
            let more = answer.is_ok().then_some(call);
            Some((answer, more))
        })
        .boxed())
    }

    /// Closes and forgets every connection to `addr` (e.g. a server that left the cluster, or
    /// one that stopped answering pings). Never waits: a slot still dialing is only forgotten,
    /// so its dial serves the one call that started it and nothing after.
    pub async fn disconnect(&self, addr: SocketAddr) {
        self.end_mux(addr);
        let slots: Vec<Slot> = {
            let mut pool = self.pool();
            let lanes: Vec<_> = pool.keys().filter(|(a, _)| *a == addr).copied().collect();
            lanes.iter().filter_map(|key| pool.remove(key)).collect()
        };
        for slot in slots {
            if let Ok(mut cached) = slot.try_lock()
                && let Some(connection) = cached.take()
            {
                connection.close(CLOSE_DISCONNECT, b"disconnect");
            }
        }
    }

    fn pool(&self) -> parking_lot::MutexGuard<'_, HashMap<(SocketAddr, Lane), Slot>> {
        self.inner.pool.lock()
    }

    fn call_with_retry(
        &self,
        addr: SocketAddr,
        lane: Lane,
        request: Bytes,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send + '_ {
        self.on_connection(addr, lane, move |connection| {
            let request = request.clone();
            async move { exchange(&connection, request).await }
        })
    }

    /// Runs `op` on the cached connection to `addr` on `lane`. When it fails because that
    /// connection was stale (no stream could be opened, or the peer, restarted, answered with a
    /// stateless reset: `op` cannot have reached a live handler), the connection is dropped and
    /// `op` runs once more on a fresh one; any other loss of the connection drops it too.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` would keep its arguments twice"
    )]
    fn on_connection<'a, T, F, Fut>(
        &'a self,
        addr: SocketAddr,
        lane: Lane,
        op: F,
    ) -> impl Future<Output = Result<T, TransportError>> + Send + 'a
    where
        F: Fn(Connection) -> Fut + Send + 'a,
        Fut: Future<Output = Result<T, Failure>> + Send + 'a,
        T: Send + 'a,
    {
        async move {
            // Dialing and dropping a connection are boxed on their own: a call holds this
            // future while it waits, which would otherwise keep room for a whole handshake.
            let (connection, reused) = Box::pin(self.connection(addr, lane)).await?;
            let failure = match op(connection.clone()).await {
                Ok(done) => return Ok(done),
                Err(failure) => failure,
            };
            if matches!(
                failure,
                Failure::Protocol(_) | Failure::PeerShutdown | Failure::Busy
            ) {
                return Err(failure.into_error(addr));
            }
            Box::pin(self.forget(addr, lane, &connection)).await;
            if !(reused && failure.is_stale()) {
                return Err(failure.into_error(addr));
            }
            tracing::debug!(%addr, error = %failure.into_error(addr), "cached RPC connection was stale; redialing");
            let (connection, _) = Box::pin(self.connection(addr, lane)).await?;
            match op(connection.clone()).await {
                Ok(done) => Ok(done),
                Err(failure) => {
                    if matches!(failure, Failure::Open(_) | Failure::Lost(_)) {
                        Box::pin(self.forget(addr, lane, &connection)).await;
                    }
                    Err(failure.into_error(addr))
                }
            }
        }
    }

    /// The cached connection to `addr` on `lane` if it is still open, else a new one. The flag
    /// says whether it was cached.
    async fn connection(
        &self,
        addr: SocketAddr,
        lane: Lane,
    ) -> Result<(Connection, bool), TransportError> {
        let slot = Arc::clone(self.pool().entry((addr, lane)).or_default());
        let mut cached = slot.lock().await;
        if let Some(connection) = cached.as_ref() {
            if connection.close_reason().is_none() {
                return Ok((connection.clone(), true));
            }
            tracing::debug!(%addr, "dropping closed RPC connection");
        }
        *cached = None;
        let unreachable = |reason: String| TransportError::Unreachable { addr, reason };
        let inner = &self.inner;
        let connecting = match &inner.config {
            Some(config) => inner
                .endpoint
                .connect_with(config.clone(), addr, &inner.server_name),
            None => inner.endpoint.connect(addr, &inner.server_name),
        }
        .map_err(|e| unreachable(e.to_string()))?;
        let connection = connecting.await.map_err(|e| unreachable(e.to_string()))?;
        *cached = Some(connection.clone());
        Ok((connection, false))
    }

    /// Drops `connection` from the pool unless it was already replaced.
    async fn forget(&self, addr: SocketAddr, lane: Lane, connection: &Connection) {
        let slot = self.pool().get(&(addr, lane)).cloned();
        if let Some(slot) = slot {
            let mut cached = slot.lock().await;
            if cached
                .as_ref()
                .is_some_and(|c| c.stable_id() == connection.stable_id())
            {
                *cached = None;
            }
        }
    }
}

/// A request as the typed calls send it (postcard).
pub fn encode<Req: Serialize>(request: &Req) -> Result<Vec<u8>, TransportError> {
    postcard::to_allocvec(request)
        .map_err(|e| TransportError::Protocol(format!("encoding the request: {e}")))
}

fn decode<Resp: DeserializeOwned>(response: &[u8]) -> Result<Resp, TransportError> {
    postcard::from_bytes(response)
        .map_err(|e| TransportError::Protocol(format!("decoding the response: {e}")))
}

/// How one exchange failed; decides whether to retry and what the caller sees.
#[derive(Debug)]
enum Failure {
    /// No stream could be opened: the request never left this node.
    Open(ConnectionError),
    /// The connection died once the request may have been sent.
    Lost(ConnectionError),
    /// The peer shut down while handling the request.
    PeerShutdown,
    /// The peer or the bytes broke the protocol.
    Protocol(String),
    /// A request frame did not arrive whole by its deadline (the accepting side).
    Late,
    /// A request refused unread for want of room (by the accepting side, or the peer).
    Busy,
    /// The peer serves no stream calls on this protocol (it reset the stream saying so).
    NotStreamed,
}

impl Failure {
    /// True when the request cannot have reached a live handler over this connection.
    fn is_stale(&self) -> bool {
        match self {
            Failure::Open(_) => true,
            Failure::Lost(error) => matches!(error, ConnectionError::Reset),
            Failure::PeerShutdown
            | Failure::Protocol(_)
            | Failure::Late
            | Failure::Busy
            | Failure::NotStreamed => false,
        }
    }

    fn into_error(self, addr: SocketAddr) -> TransportError {
        match self {
            Failure::Open(error) | Failure::Lost(error) if is_tls_rejection(&error) => {
                TransportError::Unreachable {
                    addr,
                    reason: format!("TLS handshake rejected: {error}"),
                }
            }
            Failure::Open(ConnectionError::ApplicationClosed(close))
            | Failure::Lost(ConnectionError::ApplicationClosed(close))
                if close.error_code == CLOSE_UNKNOWN_PROTOCOL
                    || close.error_code == CLOSE_SERVERS_ONLY
                    || close.error_code == CLOSE_TOO_MANY_CONNECTIONS =>
            {
                TransportError::Unreachable {
                    addr,
                    reason: format!(
                        "the server refused the connection: {}",
                        String::from_utf8_lossy(&close.reason)
                    ),
                }
            }
            Failure::Open(error) | Failure::Lost(error) => TransportError::Closed {
                addr,
                reason: error.to_string(),
            },
            Failure::PeerShutdown => TransportError::Closed {
                addr,
                reason: "the peer shut down while handling the request".to_owned(),
            },
            Failure::Protocol(reason) => TransportError::Protocol(reason),
            Failure::Late => {
                TransportError::Protocol("a request frame did not arrive in time".to_owned())
            }
            Failure::Busy => TransportError::Refused { addr },
            Failure::NotStreamed => TransportError::Protocol(
                "the peer serves no stream calls on this protocol".to_owned(),
            ),
        }
    }
}

/// True when the connection ended with a TLS alert (QUIC crypto error codes 0x100-0x1ff),
/// e.g. the server refused our certificate right after our side finished the handshake.
fn is_tls_rejection(error: &ConnectionError) -> bool {
    let code = match error {
        ConnectionError::ConnectionClosed(close) => close.error_code,
        ConnectionError::TransportError(error) => error.code,
        _ => return false,
    };
    (0x100..0x200).contains(&u64::from(code))
}

/// The dialing side of a stream call in progress: the answers still owed, each with the time
/// by which it must come (or the error that stopped the requests).
struct StreamCall {
    client: RpcClient,
    connection: Connection,
    addr: SocketAddr,
    timeout: Duration,
    recv: RecvStream,
    pending: tokio::sync::mpsc::UnboundedReceiver<Result<tokio::time::Instant, TransportError>>,
    _writer: AbortOnDropHandle<()>,
}

impl StreamCall {
    /// The next answer; `None` once every request is answered and no more will come.
    async fn next_answer(&mut self) -> Option<Result<Vec<u8>, TransportError>> {
        let deadline = match self.pending.recv().await? {
            Ok(deadline) => deadline,
            Err(error) => return Some(Err(error)),
        };
        let answer = match tokio::time::timeout_at(deadline, read_frame(&mut self.recv)).await {
            Ok(Ok(answer)) => return Some(Ok(answer)),
            Ok(Err(failure)) => failure,
            Err(_) => {
                return Some(Err(TransportError::Timeout {
                    addr: self.addr,
                    after: self.timeout,
                }));
            }
        };
        if matches!(answer, Failure::Lost(_)) {
            self.client
                .forget(self.addr, Lane::Control, &self.connection)
                .await;
        }
        Some(Err(answer.into_error(self.addr)))
    }
}

/// Opens a stream call's stream: the empty frame that says so.
async fn open_stream_call(connection: &Connection) -> Result<(SendStream, RecvStream), Failure> {
    let (mut send, recv) = connection.open_bi().await.map_err(Failure::Open)?;
    write_frame(&mut send, Bytes::new()).await?;
    Ok((send, recv))
}

/// Sends a stream call's requests as they come, telling the reader by when each must be
/// answered; finishes the stream when they end, and stops at the first that cannot be sent.
async fn write_requests(
    mut send: SendStream,
    mut requests: Frames,
    pending: tokio::sync::mpsc::UnboundedSender<Result<tokio::time::Instant, TransportError>>,
    timeout: Duration,
    addr: SocketAddr,
) {
    while let Some(request) = requests.next().await {
        if let Err(error) = fits_a_frame(&request) {
            let _ = pending.send(Err(error));
            return;
        }
        let _ = pending.send(Ok(tokio::time::Instant::now() + timeout));
        if let Err(failure) = write_frame(&mut send, request.into()).await {
            let _ = pending.send(Err(failure.into_error(addr)));
            return;
        }
    }
    let _ = send.finish();
}

/// A request too large for a frame fails before anything is sent.
fn fits_a_frame(request: &[u8]) -> Result<(), TransportError> {
    if request.len() > MAX_FRAME_LEN {
        return Err(TransportError::Protocol(format!(
            "request of {} bytes exceeds the {MAX_FRAME_LEN}-byte frame limit",
            request.len()
        )));
    }
    Ok(())
}

/// One request/response exchange on the dialing side. The sending is boxed on its own and
/// freed before the answer is awaited: a blocking query holds this future while it waits, and
/// keeps only its receiving stream.
fn exchange(
    connection: &Connection,
    request: Bytes,
) -> impl Future<Output = Result<Vec<u8>, Failure>> + Send + '_ {
    let sent = Box::pin(send_request(connection, request));
    async move {
        let mut recv = sent.await?;
        read_frame(&mut recv).await
    }
}

/// Opens a stream on `connection` and sends `request` on it, finished; answers the stream its
/// reply comes on.
async fn send_request(connection: &Connection, request: Bytes) -> Result<RecvStream, Failure> {
    let (mut send, recv) = connection.open_bi().await.map_err(Failure::Open)?;
    write_frame(&mut send, request).await?;
    send.finish()
        .map_err(|_| Failure::Protocol("request stream closed before it was finished".into()))?;
    Ok(recv)
}

fn encode_header(len: usize) -> Result<[u8; HEADER_LEN], String> {
    if len > MAX_FRAME_LEN {
        return Err(format!(
            "frame of {len} bytes exceeds the {MAX_FRAME_LEN}-byte limit"
        ));
    }
    let len = u32::try_from(len).map_err(|_| format!("frame of {len} bytes is too large"))?;
    let mut header = [0; HEADER_LEN];
    header[0] = FRAME_VERSION;
    header[1..].copy_from_slice(&len.to_be_bytes());
    Ok(header)
}

/// The payload length announced by `header`, checked against the version and the limit
/// before anything is allocated.
fn decode_header(header: [u8; HEADER_LEN]) -> Result<usize, String> {
    let [version, len @ ..] = header;
    if version != FRAME_VERSION {
        return Err(format!(
            "unsupported frame version {version} (this node speaks version {FRAME_VERSION})"
        ));
    }
    let len = usize::try_from(u32::from_be_bytes(len)).unwrap_or(usize::MAX);
    if len > MAX_FRAME_LEN {
        return Err(format!(
            "frame of {len} bytes exceeds the {MAX_FRAME_LEN}-byte limit"
        ));
    }
    Ok(len)
}

/// Writes the header and the payload in one call, so they leave in one packet when they fit
/// (and the connection's task is woken once), without copying the payload.
async fn write_frame(send: &mut SendStream, payload: Bytes) -> Result<(), Failure> {
    let header = encode_header(payload.len()).map_err(Failure::Protocol)?;
    send.write_all_chunks(&mut [Bytes::copy_from_slice(&header), payload])
        .await
        .map_err(write_failure)
}

/// A response frame (the dialing side).
async fn read_frame(recv: &mut RecvStream) -> Result<Vec<u8>, Failure> {
    let len = read_header(recv)
        .await?
        .ok_or_else(|| Failure::Protocol("stream ended before a frame".to_owned()))?;
    read_payload(recv, len).await
}

/// The next frame's announced length, or `None` when the peer finished the stream between
/// frames.
async fn read_header(recv: &mut RecvStream) -> Result<Option<usize>, Failure> {
    let mut header = [0; HEADER_LEN];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(error) => return Err(read_failure(error)),
    }
    decode_header(header).map(Some).map_err(Failure::Protocol)
}

/// A payload of `len` bytes, in a buffer that grows as they arrive (at most doubling, never
/// past `len`): a peer that announces much and sends little costs what it sent.
async fn read_payload(recv: &mut RecvStream, len: usize) -> Result<Vec<u8>, Failure> {
    let mut payload = Vec::new();
    while payload.len() < len {
        let missing = len - payload.len();
        let chunk = match recv.read_chunk(missing, true).await {
            Ok(Some(chunk)) => chunk.bytes,
            Ok(None) => {
                return Err(Failure::Protocol(format!(
                    "stream ended after {} bytes, before the frame was complete",
                    HEADER_LEN + payload.len()
                )));
            }
            Err(error) => return Err(read_error(error)),
        };
        if payload.capacity() - payload.len() < chunk.len() {
            let grow = payload.capacity().max(chunk.len()).min(missing);
            payload.reserve_exact(grow);
        }
        payload.extend_from_slice(&chunk);
    }
    Ok(payload)
}

fn write_failure(error: quinn::WriteError) -> Failure {
    match error {
        quinn::WriteError::ConnectionLost(error) => Failure::Lost(error),
        quinn::WriteError::Stopped(code) if code == STREAM_BUSY => Failure::Busy,
        quinn::WriteError::Stopped(code) => Failure::Protocol(stream_code_reason(code)),
        other => Failure::Protocol(format!("writing the frame: {other}")),
    }
}

fn read_failure(error: quinn::ReadExactError) -> Failure {
    match error {
        quinn::ReadExactError::FinishedEarly(read) => Failure::Protocol(format!(
            "stream ended after {read} bytes, before the frame was complete"
        )),
        quinn::ReadExactError::ReadError(error) => read_error(error),
    }
}

fn read_error(error: quinn::ReadError) -> Failure {
    match error {
        quinn::ReadError::ConnectionLost(error) => Failure::Lost(error),
        quinn::ReadError::Reset(code) if code == STREAM_SHUTTING_DOWN => Failure::PeerShutdown,
        quinn::ReadError::Reset(code) if code == STREAM_BUSY => Failure::Busy,
        quinn::ReadError::Reset(code) if code == STREAM_NOT_STREAMED => Failure::NotStreamed,
        quinn::ReadError::Reset(code) => Failure::Protocol(stream_code_reason(code)),
        other => Failure::Protocol(format!("reading the frame: {other}")),
    }
}

/// What the peer meant by resetting or stopping a stream.
fn stream_code_reason(code: VarInt) -> String {
    if code == STREAM_BAD_REQUEST {
        "the peer rejected the request frame".to_owned()
    } else if code == STREAM_TOO_SLOW {
        "the request frame did not reach the peer by its deadline".to_owned()
    } else if code == STREAM_RESPONSE_TOO_LARGE {
        "the peer's response exceeds the frame limit".to_owned()
    } else {
        format!("the peer aborted the stream (code {code})")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::FutureExt as _;

    use super::*;
    use crate::tls::{ALPN_RAFT, ALPN_RPC, CertificateAuthority, Role};

    const TIMEOUT: Duration = Duration::from_secs(10);
    const LOCALHOST: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

    /// Answers `<role>:<request>` and counts calls.
    #[derive(Default)]
    struct Echo {
        calls: AtomicUsize,
    }

    impl RpcHandler for Echo {
        fn handle(&self, peer: &PeerIdentity, request: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut response = format!("{}:", peer.role).into_bytes();
            response.extend(request);
            async move { response }.boxed()
        }
    }

    struct TestServer {
        addr: SocketAddr,
        handler: Arc<Echo>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    }

    impl TestServer {
        fn start(bind: SocketAddr, tls: &TlsMaterial) -> TestServer {
            TestServer::try_start(bind, tls).unwrap()
        }

        fn try_start(bind: SocketAddr, tls: &TlsMaterial) -> Result<TestServer, EndpointError> {
            let endpoint = server_endpoint(bind, tls)?;
            let addr = endpoint.local_addr().unwrap();
            let handler = Arc::new(Echo::default());
            let shutdown = CancellationToken::new();
            let tasks = TaskTracker::new();
            serve(
                endpoint,
                tls.server_name(),
                both_protocols(handler.clone()),
                shutdown.clone(),
                tasks.clone(),
            );
            Ok(TestServer {
                addr,
                handler,
                shutdown,
                tasks,
            })
        }

        fn calls(&self) -> usize {
            self.handler.calls.load(Ordering::SeqCst)
        }

        async fn stop(self) {
            self.shutdown.cancel();
            self.tasks.close();
            tokio::time::timeout(TIMEOUT, self.tasks.wait())
                .await
                .expect("server tasks stop on shutdown");
        }
    }

    /// `handler` behind both ALPN protocols, raft's for servers only, as a server serves them.
    fn both_protocols(handler: Arc<dyn RpcHandler>) -> Vec<Protocol> {
        vec![
            Protocol {
                alpn: ALPN_RPC,
                servers_only: false,
                limits: RequestLimits::RPC,
                handler: Arc::clone(&handler),
            },
            Protocol {
                alpn: ALPN_RAFT,
                servers_only: true,
                limits: RequestLimits::RAFT,
                handler,
            },
        ]
    }

    fn client(tls: &TlsMaterial) -> RpcClient {
        RpcClient::new(client_endpoint(tls).unwrap(), tls.server_name())
    }

    fn raft_client(tls: &TlsMaterial) -> RpcClient {
        let config = tls.raft_client_config().unwrap();
        RpcClient::with_config(client_endpoint(tls).unwrap(), tls.server_name(), config)
    }

    /// A call that TLS refuses: the peer is unreachable to the caller.
    async fn assert_unreachable(from: &RpcClient, addr: SocketAddr) {
        let error = from.call(addr, b"x".to_vec(), TIMEOUT).await.unwrap_err();
        assert!(
            matches!(error, TransportError::Unreachable { .. }),
            "{error:?}"
        );
    }

    /// A server certificate and a client certificate from one fresh CA.
    fn cluster() -> (TlsMaterial, TlsMaterial) {
        let ca = CertificateAuthority::generate("vigil").unwrap();
        (
            ca.issue(Role::Server, "dc1", "vigil", None).unwrap(),
            ca.issue(Role::Client, "dc1", "vigil", None).unwrap(),
        )
    }

    /// [`cluster`] with a second client certificate: another peer.
    fn cluster_with_two_clients() -> (TlsMaterial, TlsMaterial, TlsMaterial) {
        let ca = CertificateAuthority::generate("vigil").unwrap();
        (
            ca.issue(Role::Server, "dc1", "vigil", None).unwrap(),
            ca.issue(Role::Client, "dc1", "vigil", None).unwrap(),
            ca.issue(Role::Client, "dc1", "vigil", None).unwrap(),
        )
    }

    #[tokio::test]
    async fn round_trip_reports_the_callers_role() {
        let (server_tls, client_tls) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);

        // A client agent is seen as a client...
        let agent = client(&client_tls);
        let response = agent.call(server.addr, b"ping".to_vec(), TIMEOUT).await;
        assert_eq!(response.unwrap(), b"client:ping");

        // ...a server dialing from its own endpoint as a server.
        let peer_endpoint = server_endpoint(LOCALHOST, &server_tls).unwrap();
        let peer_client = RpcClient::new(peer_endpoint, server_tls.server_name());
        let response = peer_client
            .call(server.addr, b"vote".to_vec(), TIMEOUT)
            .await;
        assert_eq!(response.unwrap(), b"server:vote");

        // An empty request is refused locally (an empty first frame opens a stream call), and
        // typed calls go through postcard.
        let response = agent.call(server.addr, Vec::new(), TIMEOUT).await;
        assert!(
            matches!(response, Err(TransportError::Protocol(_))),
            "{response:?}"
        );
        // The echo answers b"client:" + postcard("hello"), which decodes as a 7-byte array
        // followed by the string.
        let (role, text): ([u8; 7], String) = agent
            .call_typed(server.addr, &"hello", TIMEOUT)
            .await
            .unwrap();
        assert_eq!((&role, text.as_str()), (b"client:", "hello"));
        // Decoding the same answer as a bare string fails as a protocol error.
        let typed: Result<String, _> = agent.call_typed(server.addr, &"hello", TIMEOUT).await;
        assert!(
            matches!(typed, Err(TransportError::Protocol(_))),
            "{typed:?}"
        );
        assert_eq!(server.calls(), 4);

        server.stop().await;
    }

    #[tokio::test]
    async fn two_hundred_concurrent_calls_share_one_connection() {
        let (server_tls, client_tls) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let agent = client(&client_tls);

        let calls = (0..200u32).map(|i| {
            let agent = agent.clone();
            async move {
                let request = i.to_be_bytes().to_vec();
                let response = agent.call(server.addr, request.clone(), TIMEOUT).await;
                assert_eq!(response.unwrap()[b"client:".len()..], request[..]);
            }
        });
        futures::future::join_all(calls).await;

        assert_eq!(server.calls(), 200);
        assert_eq!(agent.endpoint().stats().outgoing_handshakes, 1);
        server.stop().await;
    }

    #[tokio::test]
    async fn disconnect_drops_the_cached_connection() {
        let (server_tls, client_tls) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let agent = client(&client_tls);
        assert!(
            agent
                .call(server.addr, b"a".to_vec(), TIMEOUT)
                .await
                .is_ok()
        );
        agent.disconnect(server.addr).await;
        assert!(
            agent
                .call(server.addr, b"b".to_vec(), TIMEOUT)
                .await
                .is_ok()
        );
        assert_eq!(agent.endpoint().stats().outgoing_handshakes, 2);
        server.stop().await;
    }

    #[tokio::test]
    async fn reconnects_after_the_server_restarts_on_the_same_port() {
        let (server_tls, client_tls) = cluster();
        let agent = client(&client_tls);

        // Phase 1: a working connection is cached.
        let first = TestServer::start(LOCALHOST, &server_tls);
        let addr = first.addr;
        assert!(agent.call(addr, b"a".to_vec(), TIMEOUT).await.is_ok());

        // Phase 2: the server stops (closing its connections) and a new one takes the port;
        // the next call notices the closed connection and redials.
        first.stop().await;
        let second = TestServer::start(addr, &server_tls);
        let response = agent.call(addr, b"b".to_vec(), TIMEOUT).await;
        assert_eq!(response.unwrap(), b"client:b");
        assert_eq!(second.calls(), 1);
        assert_eq!(agent.endpoint().stats().outgoing_handshakes, 2);
        second.stop().await;
    }

    #[tokio::test]
    async fn a_crashed_and_restarted_server_resets_the_stale_connection() {
        let (server_tls, client_tls) = cluster();
        let agent = client(&client_tls);

        // Phase 1: the server runs on its own runtime so it can vanish without a close frame.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let tls = server_tls.clone();
        let addr = runtime
            .spawn(async move { TestServer::start(LOCALHOST, &tls).addr })
            .await
            .unwrap();
        assert!(agent.call(addr, b"a".to_vec(), TIMEOUT).await.is_ok());

        // Phase 2: crash. No close frame is sent; the client still holds the old connection.
        runtime.shutdown_background();
        let second = {
            // The crashed runtime frees the socket in the background.
            let deadline = tokio::time::Instant::now() + TIMEOUT;
            loop {
                match TestServer::try_start(addr, &server_tls) {
                    Ok(server) => break server,
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => panic!("port {addr} never freed: {e}"),
                }
            }
        };

        // Phase 3: the restarted server (same key, so same reset key) resets the stale
        // connection, and the same call succeeds on a fresh one, long before the idle timeout.
        let started = tokio::time::Instant::now();
        let response = agent.call(addr, b"b".to_vec(), TIMEOUT).await;
        assert_eq!(response.unwrap(), b"client:b");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(second.calls(), 1);
        second.stop().await;
    }

    #[tokio::test]
    async fn a_client_certificate_from_another_ca_is_refused() {
        let (server_tls, _) = cluster();
        let (_, foreign_client) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);

        let intruder = client(&foreign_client);
        assert_unreachable(&intruder, server.addr).await;
        // The retry path does not change the answer, and the handler never ran.
        assert_unreachable(&intruder, server.addr).await;
        assert_eq!(server.calls(), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_server_from_another_ca_is_refused_by_the_client() {
        let (_, client_tls) = cluster();
        let (foreign_server, _) = cluster();
        let server = TestServer::start(LOCALHOST, &foreign_server);

        assert_unreachable(&client(&client_tls), server.addr).await;
        assert_eq!(server.calls(), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_client_certificate_cannot_pose_as_a_server() {
        // Same CA, but the listener holds a client certificate: it lacks server.dc1.vigil.
        let (_, client_tls) = cluster();
        let impostor = TestServer::start(LOCALHOST, &client_tls);
        assert_unreachable(&client(&client_tls), impostor.addr).await;
        assert_eq!(impostor.calls(), 0);
        impostor.stop().await;
    }

    #[tokio::test]
    async fn only_a_server_certificate_may_speak_raft() {
        let (server_tls, client_tls) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let response = raft_client(&server_tls)
            .call(server.addr, b"vote".to_vec(), TIMEOUT)
            .await
            .unwrap();
        assert_eq!(response, b"server:vote");

        // A client certificate is closed out before any request reaches the handler; the
        // same certificate still speaks the client protocol.
        let error = raft_client(&client_tls)
            .call(server.addr, b"vote".to_vec(), TIMEOUT)
            .await
            .unwrap_err();
        match &error {
            TransportError::Unreachable { reason, .. } => {
                assert!(reason.contains("needs a server certificate"), "{reason}");
            }
            other => panic!("a client spoke raft: {other:?}"),
        }
        assert_eq!(server.calls(), 1);
        let response = client(&client_tls)
            .call(server.addr, b"read".to_vec(), TIMEOUT)
            .await
            .unwrap();
        assert_eq!(response, b"client:read");
        server.stop().await;
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_or_times_out() {
        let (_, client_tls) = cluster();
        // Bind and drop to get a port with (very likely) nobody behind it.
        let addr = UdpSocket::bind(LOCALHOST).unwrap().local_addr().unwrap();
        let error = client(&client_tls)
            .call(addr, b"x".to_vec(), Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                TransportError::Unreachable { .. } | TransportError::Timeout { .. }
            ),
            "{error:?}"
        );
    }

    #[test]
    fn frame_headers_check_version_and_size() {
        let header = encode_header(5).unwrap();
        assert_eq!(header, [1, 0, 0, 0, 5]);
        assert_eq!(decode_header(header), Ok(5));

        let error = decode_header([2, 0, 0, 0, 5]).unwrap_err();
        assert!(error.contains("unsupported frame version 2"), "{error}");

        let too_big = u32::try_from(MAX_FRAME_LEN + 1).unwrap().to_be_bytes();
        let error = decode_header([1, too_big[0], too_big[1], too_big[2], too_big[3]]).unwrap_err();
        assert!(error.contains("exceeds"), "{error}");
        assert!(encode_header(MAX_FRAME_LEN + 1).is_err());
    }

    #[tokio::test]
    async fn a_frame_with_a_bad_version_is_rejected_before_the_handler() {
        let (server_tls, client_tls) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let endpoint = client_endpoint(&client_tls).unwrap();
        let connection = endpoint
            .connect(server.addr, client_tls.server_name())
            .unwrap()
            .await
            .unwrap();

        // Version 2 of a 3-byte payload: the server resets the stream.
        let (mut send, mut recv) = connection.open_bi().await.unwrap();
        send.write_all(&[2, 0, 0, 0, 3, b'a', b'b', b'c'])
            .await
            .unwrap();
        send.finish().unwrap();
        let failure = read_frame(&mut recv).await.unwrap_err();
        let error = failure.into_error(server.addr);
        assert_eq!(
            error,
            TransportError::Protocol("the peer rejected the request frame".to_owned())
        );

        // An oversized announcement is rejected the same way, before any allocation.
        let (mut send, mut recv) = connection.open_bi().await.unwrap();
        send.write_all(&[1, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
        let failure = read_frame(&mut recv).await.unwrap_err();
        assert!(matches!(failure, Failure::Protocol(_)), "{failure:?}");

        // The connection survives for well-formed requests.
        assert_eq!(server.calls(), 0);
        let agent = RpcClient::new(endpoint, client_tls.server_name());
        let response = agent.call(server.addr, b"ok".to_vec(), TIMEOUT).await;
        assert_eq!(response.unwrap(), b"client:ok");
        assert_eq!(server.calls(), 1);
        server.stop().await;
    }

    /// Answers a stream call's requests two at a time, once the second has come (or the call
    /// ended): a caller that waited for each answer before sending the next would get none.
    struct Pairs;

    impl RpcHandler for Pairs {
        fn handle(&self, _: &PeerIdentity, request: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
            async move { request }.boxed()
        }

        fn handle_stream(&self, _: &PeerIdentity, requests: Frames) -> Option<Frames> {
            Some(requests.chunks(2).flat_map(futures::stream::iter).boxed())
        }
    }

    /// A server on loopback whose protocols are both served by `handler`.
    fn serve_with(
        handler: Arc<dyn RpcHandler>,
        tls: &TlsMaterial,
    ) -> (SocketAddr, CancellationToken) {
        let endpoint = server_endpoint(LOCALHOST, tls).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        serve(
            endpoint,
            tls.server_name(),
            both_protocols(handler),
            shutdown.clone(),
            TaskTracker::new(),
        );
        (addr, shutdown)
    }

    async fn next_answer(answers: &mut Responses) -> Option<Result<Vec<u8>, TransportError>> {
        tokio::time::timeout(TIMEOUT, answers.next())
            .await
            .expect("an answer or the end in time")
    }

    #[tokio::test]
    async fn a_stream_call_sends_without_waiting_for_answers_and_answers_in_order() {
        let (server_tls, client_tls) = cluster();
        let (addr, shutdown) = serve_with(Arc::new(Pairs), &server_tls);
        let (requests, frames) = futures::channel::mpsc::unbounded::<Vec<u8>>();
        let mut answers = client(&client_tls)
            .stream(addr, frames.boxed(), TIMEOUT)
            .await
            .unwrap();
        for request in [b"a", b"b"] {
            requests.unbounded_send(request.to_vec()).unwrap();
        }
        assert_eq!(next_answer(&mut answers).await.unwrap().unwrap(), b"a");
        assert_eq!(next_answer(&mut answers).await.unwrap().unwrap(), b"b");
        // "c" alone is not answered until "d" is sent behind it, before any answer to "c".
        requests.unbounded_send(b"c".to_vec()).unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), answers.next())
                .await
                .is_err(),
            "c was answered on its own"
        );
        requests.unbounded_send(b"d".to_vec()).unwrap();
        assert_eq!(next_answer(&mut answers).await.unwrap().unwrap(), b"c");
        assert_eq!(next_answer(&mut answers).await.unwrap().unwrap(), b"d");
        // An empty request is an ordinary one inside a call; ending the requests answers the
        // last and ends the answers.
        requests.unbounded_send(Vec::new()).unwrap();
        drop(requests);
        assert_eq!(next_answer(&mut answers).await.unwrap().unwrap(), b"");
        assert!(next_answer(&mut answers).await.is_none());
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_stream_call_fails_when_unanswered_in_time_or_not_served() {
        let (server_tls, client_tls) = cluster();
        let agent = client(&client_tls);

        // One request that `Pairs` holds back for a partner that never comes.
        let (addr, shutdown) = serve_with(Arc::new(Pairs), &server_tls);
        let (requests, frames) = futures::channel::mpsc::unbounded::<Vec<u8>>();
        let patience = Duration::from_millis(300);
        let mut answers = agent.stream(addr, frames.boxed(), patience).await.unwrap();
        requests.unbounded_send(b"alone".to_vec()).unwrap();
        let answer = next_answer(&mut answers).await.unwrap();
        assert!(
            matches!(answer, Err(TransportError::Timeout { .. })),
            "{answer:?}"
        );
        assert!(
            next_answer(&mut answers).await.is_none(),
            "ends at the error"
        );
        shutdown.cancel();

        // A protocol without stream calls resets the stream.
        let (addr, shutdown) = serve_with(Arc::new(Echo::default()), &server_tls);
        let requests = futures::stream::iter([b"x".to_vec()]).boxed();
        let mut answers = agent.stream(addr, requests, TIMEOUT).await.unwrap();
        let answer = next_answer(&mut answers).await.unwrap();
        assert!(answer.is_err(), "{answer:?}");
        shutdown.cancel();
    }

    #[tokio::test]
    async fn oversized_requests_fail_locally() {
        let (_, client_tls) = cluster();
        let error = client(&client_tls)
            .call(LOCALHOST, vec![0; MAX_FRAME_LEN + 1], TIMEOUT)
            .await
            .unwrap_err();
        assert!(matches!(error, TransportError::Protocol(_)), "{error:?}");
    }

    /// A raw connection presenting `tls`, for writing frames by hand.
    async fn raw_connection(tls: &TlsMaterial, addr: SocketAddr) -> Connection {
        client_endpoint(tls)
            .unwrap()
            .connect(addr, tls.server_name())
            .unwrap()
            .await
            .unwrap()
    }

    /// Opens a stream and sends the header of a `len`-byte request and `sent` bytes of it. Past
    /// the stream's flow control window, that returns only once the server reads the frame.
    async fn half_sent(
        connection: &Connection,
        len: usize,
        sent: usize,
    ) -> (SendStream, RecvStream) {
        let (mut send, recv) = connection.open_bi().await.unwrap();
        send.write_all(&encode_header(len).unwrap()).await.unwrap();
        send.write_all(&vec![7; sent]).await.unwrap();
        (send, recv)
    }

    #[tokio::test]
    async fn a_frame_not_whole_by_its_deadline_is_refused_and_frees_its_budget() {
        let (server_tls, client_tls, other_tls) = cluster_with_two_clients();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let connection = raw_connection(&client_tls, server.addr).await;

        // Phase 1: four frames of the largest size any peer may send, each two thirds sent
        // (more than a stream's flow control window, so the server is reading each when the
        // sending returns), take the peer's whole budget; a fifth request from the same peer
        // is refused unread, while another peer is served.
        let mut stalled = Vec::new();
        for _ in 0..RequestLimits::RPC.in_flight / MAX_REQUEST_FRAME {
            let sent = MAX_REQUEST_FRAME * 2 / 3;
            stalled.push(half_sent(&connection, MAX_REQUEST_FRAME, sent).await);
        }
        let same_peer = client(&client_tls);
        let refused = same_peer.call(server.addr, b"more".to_vec(), TIMEOUT).await;
        assert_eq!(refused, Err(TransportError::Refused { addr: server.addr }));
        let answer = client(&other_tls)
            .call(server.addr, b"other".to_vec(), TIMEOUT)
            .await;
        assert_eq!(answer.unwrap(), b"client:other");
        assert_eq!(server.calls(), 1);

        // Phase 2: by their deadline the stalled frames are refused as too slow, which frees
        // the peer's budget.
        for (_, mut recv) in stalled {
            let failure = read_frame(&mut recv).await.unwrap_err();
            assert_eq!(
                failure.into_error(server.addr),
                TransportError::Protocol(
                    "the request frame did not reach the peer by its deadline".to_owned()
                )
            );
        }
        let answer = same_peer
            .call(server.addr, vec![1; MAX_REQUEST_FRAME], TIMEOUT)
            .await;
        assert_eq!(answer.unwrap().len(), b"client:".len() + MAX_REQUEST_FRAME);
        server.stop().await;
    }

    #[tokio::test]
    async fn large_frames_go_one_at_a_time() {
        let (server_tls, client_tls, other_tls) = cluster_with_two_clients();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let connection = raw_connection(&client_tls, server.addr).await;

        // Phase 1: a frame above the per-peer size, half sent (more than a stream's flow control
        // window, so the server is reading it), holds the large-frame slot; a whole one from
        // another peer is refused unread meanwhile.
        let large = 2 * MAX_REQUEST_FRAME;
        let (mut first, mut first_answer) = half_sent(&connection, large, large / 2).await;
        let other = client(&other_tls);
        let refused = other.call(server.addr, vec![2; large], TIMEOUT).await;
        assert_eq!(refused, Err(TransportError::Refused { addr: server.addr }));
        assert_eq!(server.calls(), 0);

        // Phase 2: once the first is whole it is answered in full, and the slot is free again.
        first.write_all(&vec![7; large - large / 2]).await.unwrap();
        first.finish().unwrap();
        let answer = read_frame(&mut first_answer).await.unwrap();
        assert_eq!(answer.len(), b"client:".len() + large);
        let answer = other.call(server.addr, vec![2; large], TIMEOUT).await;
        assert_eq!(answer.unwrap().len(), b"client:".len() + large);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_peer_has_a_bounded_number_of_connections() {
        let (server_tls, client_tls, other_tls) = cluster_with_two_clients();
        let server = TestServer::start(LOCALHOST, &server_tls);

        // Each RpcClient has its own connection; the same certificate from the same address is
        // one peer, which gets its cap and no more.
        let mut clients = Vec::new();
        for _ in 0..MAX_CONNECTIONS_PER_PEER {
            let agent = client(&client_tls);
            agent
                .call(server.addr, b"x".to_vec(), TIMEOUT)
                .await
                .unwrap();
            clients.push(agent);
        }
        let error = client(&client_tls)
            .call(server.addr, b"x".to_vec(), TIMEOUT)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, TransportError::Unreachable { reason, .. } if reason.contains("too many connections")),
            "{error:?}"
        );

        // Another certificate is another peer; a connection closed gives its place back.
        client(&other_tls)
            .call(server.addr, b"x".to_vec(), TIMEOUT)
            .await
            .unwrap();
        clients.pop().unwrap().disconnect(server.addr).await;
        eventually_ok(|| client(&client_tls), server.addr).await;
        server.stop().await;
    }

    /// Calls `addr` with a fresh client from `make` until one succeeds, within [`TIMEOUT`].
    async fn eventually_ok(make: impl Fn() -> RpcClient, addr: SocketAddr) {
        let deadline = Instant::now() + TIMEOUT;
        while make().call(addr, b"x".to_vec(), TIMEOUT).await.is_err() {
            assert!(Instant::now() < deadline, "no connection was given back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn shutdown_stops_in_flight_handlers_and_closes_connections() {
        /// Never answers; says when it has been called.
        struct Stuck(Arc<tokio::sync::Notify>);
        impl RpcHandler for Stuck {
            fn handle(&self, _: &PeerIdentity, _: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
                self.0.notify_one();
                futures::future::pending().boxed()
            }
        }
        let (server_tls, client_tls) = cluster();
        let endpoint = server_endpoint(LOCALHOST, &server_tls).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        let called = Arc::new(tokio::sync::Notify::new());
        serve(
            endpoint,
            server_tls.server_name(),
            both_protocols(Arc::new(Stuck(called.clone()))),
            shutdown.clone(),
            tasks.clone(),
        );

        // A call blocks in the handler until the server shuts down; then it fails promptly.
        let agent = client(&client_tls);
        let call = tokio::spawn(async move { agent.call(addr, b"x".to_vec(), TIMEOUT).await });
        tokio::time::timeout(TIMEOUT, called.notified())
            .await
            .unwrap();
        shutdown.cancel();
        tasks.close();
        tokio::time::timeout(TIMEOUT, tasks.wait()).await.unwrap();
        let error = call.await.unwrap().unwrap_err();
        assert!(matches!(error, TransportError::Closed { .. }), "{error:?}");
    }

    /// Holds a request `hold` until released (counting those dropped unanswered), answers
    /// anything else at once; serves the client protocol's blocking calls on one shared
    /// stream, counting such streams.
    #[derive(Clone, Default)]
    struct Held(Arc<HeldState>);

    struct HeldState {
        calls: AtomicUsize,
        streams: AtomicUsize,
        dropped: AtomicUsize,
        release: Semaphore,
    }

    impl Default for HeldState {
        fn default() -> HeldState {
            HeldState {
                calls: AtomicUsize::new(0),
                streams: AtomicUsize::new(0),
                dropped: AtomicUsize::new(0),
                release: Semaphore::new(0),
            }
        }
    }

    struct Unanswered(Arc<HeldState>);

    impl Drop for Unanswered {
        fn drop(&mut self) {
            self.0.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl RpcHandler for Held {
        fn handle(&self, _: &PeerIdentity, request: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
            let state = Arc::clone(&self.0);
            state.calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if request == b"hold" {
                    let unanswered = Unanswered(Arc::clone(&state));
                    state.release.acquire().await.unwrap().forget();
                    std::mem::forget(unanswered);
                }
                request
            }
            .boxed()
        }

        fn multiplexes(&self) -> bool {
            self.0.streams.fetch_add(1, Ordering::SeqCst);
            true
        }
    }

    /// Polls `done` until it holds, within [`TIMEOUT`].
    async fn eventually(done: impl Fn() -> bool) {
        tokio::time::timeout(TIMEOUT, async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("in time");
    }

    #[tokio::test]
    async fn blocking_calls_share_one_stream_and_each_is_answered_when_ready() {
        let (server_tls, client_tls) = cluster();
        let held = Held::default();
        let (addr, shutdown) = serve_with(Arc::new(held.clone()), &server_tls);
        let agent = client(&client_tls);
        let waiting: Vec<_> = (0..50)
            .map(|_| {
                let agent = agent.clone();
                tokio::spawn(
                    async move { agent.call_blocking(addr, b"hold".to_vec(), TIMEOUT).await },
                )
            })
            .collect();
        eventually(|| held.0.calls.load(Ordering::SeqCst) == 50).await;
        // Answered while fifty wait before it on the same stream.
        let now = agent.call_blocking(addr, b"now".to_vec(), TIMEOUT).await;
        assert_eq!(now.unwrap(), b"now");
        assert_eq!(held.0.streams.load(Ordering::SeqCst), 1);
        held.0.release.add_permits(50);
        for call in waiting {
            assert_eq!(call.await.unwrap().unwrap(), b"hold");
        }
        assert_eq!(held.0.streams.load(Ordering::SeqCst), 1);
        assert_eq!(held.0.dropped.load(Ordering::SeqCst), 0);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_blocking_call_that_leaves_drops_its_handlers_future_and_the_stream_goes_on() {
        let (server_tls, client_tls) = cluster();
        let held = Held::default();
        let (addr, shutdown) = serve_with(Arc::new(held.clone()), &server_tls);
        let agent = client(&client_tls);
        let leaving = {
            let agent = agent.clone();
            tokio::spawn(async move { agent.call_blocking(addr, b"hold".to_vec(), TIMEOUT).await })
        };
        eventually(|| held.0.calls.load(Ordering::SeqCst) == 1).await;
        leaving.abort();
        eventually(|| held.0.dropped.load(Ordering::SeqCst) == 1).await;
        // A call that times out leaves too.
        let late = agent
            .call_blocking(addr, b"hold".to_vec(), Duration::from_millis(100))
            .await;
        assert!(
            matches!(late, Err(TransportError::Timeout { .. })),
            "{late:?}"
        );
        eventually(|| held.0.dropped.load(Ordering::SeqCst) == 2).await;
        let now = agent.call_blocking(addr, b"now".to_vec(), TIMEOUT).await;
        assert_eq!(now.unwrap(), b"now");
        assert_eq!(held.0.streams.load(Ordering::SeqCst), 1);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn when_the_shared_stream_ends_its_calls_fail_and_the_next_call_opens_another() {
        let (server_tls, client_tls) = cluster();
        let held = Held::default();
        let endpoint = server_endpoint(LOCALHOST, &server_tls).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let (shutdown, tasks) = (CancellationToken::new(), TaskTracker::new());
        serve(
            endpoint,
            server_tls.server_name(),
            both_protocols(Arc::new(held.clone())),
            shutdown.clone(),
            tasks.clone(),
        );
        let agent = client(&client_tls);
        let hold = |agent: &RpcClient| {
            let agent = agent.clone();
            tokio::spawn(async move { agent.call_blocking(addr, b"hold".to_vec(), TIMEOUT).await })
        };

        // Disconnected on purpose: the calls fail at once, the next one opens a new stream.
        let calls = [hold(&agent), hold(&agent)];
        eventually(|| held.0.calls.load(Ordering::SeqCst) == 2).await;
        agent.disconnect(addr).await;
        for call in calls {
            let error = call.await.unwrap().unwrap_err();
            assert!(matches!(error, TransportError::Closed { .. }), "{error:?}");
        }
        eventually(|| held.0.dropped.load(Ordering::SeqCst) == 2).await;
        let now = agent.call_blocking(addr, b"now".to_vec(), TIMEOUT).await;
        assert_eq!(now.unwrap(), b"now");
        assert_eq!(held.0.streams.load(Ordering::SeqCst), 2);

        // The server shuts down: the calls waiting on it fail promptly, not at their timeout.
        let calls = [hold(&agent), hold(&agent)];
        eventually(|| held.0.calls.load(Ordering::SeqCst) == 5).await;
        shutdown.cancel();
        tasks.close();
        tokio::time::timeout(TIMEOUT, tasks.wait()).await.unwrap();
        for call in calls {
            let error = tokio::time::timeout(TIMEOUT, call)
                .await
                .unwrap()
                .unwrap()
                .unwrap_err();
            assert!(matches!(error, TransportError::Closed { .. }), "{error:?}");
        }
    }

    /// Blocking calls queued behind the opening of a stream to a server that cannot be reached
    /// take that opening's failure, rather than each trying (and timing out) in turn.
    #[tokio::test]
    async fn calls_queued_behind_a_failed_opening_take_its_failure() {
        let (_, client_tls) = cluster();
        let agent = client(&client_tls);
        // A port nothing listens on: the dial times out (QUIC does not hear the refusal).
        let addr = UdpSocket::bind(LOCALHOST).unwrap().local_addr().unwrap();
        let started = Instant::now();
        let calls =
            (0..20).map(|_| agent.call_blocking(addr, b"x".to_vec(), Duration::from_secs(30)));
        for call in futures::future::join_all(calls).await {
            assert!(call.is_err(), "{call:?}");
        }
        let took = started.elapsed();
        assert!(
            took < 2 * FRAME_DEADLINE,
            "{took:?}: the calls tried one after another"
        );
    }

    /// A peer that takes the shared stream, answers its opening ping, then says nothing more
    /// (paused, or cut off without the connection closing): the calls waiting on it fail
    /// within a couple of seconds (a ping unanswered), not at their timeout.
    #[tokio::test]
    async fn a_peer_gone_silent_fails_the_calls_waiting_on_it_in_seconds() {
        let (server_tls, client_tls) = cluster();
        let endpoint = server_endpoint(LOCALHOST, &server_tls).unwrap();
        let addr = endpoint.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let connection = endpoint.accept().await.unwrap().await.unwrap();
            let (mut send, mut recv) = connection.accept_bi().await.unwrap();
            assert_eq!(read_frame(&mut recv).await.unwrap(), b"", "a stream call");
            let ping = read_frame(&mut recv).await.unwrap();
            let mut answer = ping.clone();
            answer[0] = 0;
            write_frame(&mut send, answer.into()).await.unwrap();
            // The call's ask, then nothing: not even the pings are answered.
            loop {
                read_frame(&mut recv).await.unwrap();
            }
        });
        let agent = client(&client_tls);
        let started = Instant::now();
        let call = agent
            .call_blocking(addr, b"x".to_vec(), Duration::from_secs(60))
            .await;
        assert!(
            matches!(call, Err(TransportError::Closed { .. })),
            "{call:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        silent.abort();
    }

    #[tokio::test]
    async fn a_peer_without_a_shared_stream_takes_each_blocking_call_on_a_stream_of_its_own() {
        let (server_tls, client_tls) = cluster();
        let server = TestServer::start(LOCALHOST, &server_tls);
        let agent = client(&client_tls);
        for request in [b"a", b"b"] {
            let answer = agent
                .call_blocking(server.addr, request.to_vec(), TIMEOUT)
                .await;
            assert_eq!(answer.unwrap(), [b"client:".as_slice(), request].concat());
        }
        assert_eq!(server.calls(), 2);
        server.stop().await;
    }
}

#[cfg(test)]
#[path = "transport_fuzz.rs"]
mod fuzz;
