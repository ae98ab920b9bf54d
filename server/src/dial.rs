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
) -> Result<Result<C::Reply, ServerError>, TransportError> {
    let response = rpc
        .call_typed_as::<RpcRequest, RpcResponse>(kind, addr, request.request(), timeout)
        .await?;
    Ok(reply::<C>(response))
}
