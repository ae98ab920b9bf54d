//! The state changes an agent asks for, each a type implementing [`Write`] with the answer it
//! gets: the one place a [`Response`] is taken apart. A change the state machine may refuse
//! answers `Result<_, ApplyError>`; one it always applies answers its value alone, and a
//! refusal of it is an answer of the wrong kind.

use crate::kv::{KvOp, TxnOutcome};
use crate::lock::{LockHold, LockMode, LockOp, LockOutcome};
use crate::query::PreparedQuery;
use crate::session::Session;
use crate::txn::{CatalogTxnOutcome, TxnOp};

use super::{AclOp, ApplyError, Op, Registration, Request, Response, Write};

/// `Done`, the answer of a change that only succeeds.
fn done(response: Response) -> Result<(), Response> {
    match response {
        Response::Done => Ok(()),
        other => Err(other),
    }
}

/// A refusal as the caller's `Err`, anything else as `answer` takes it.
fn or_rejected<T>(
    response: Response,
    answer: impl FnOnce(Response) -> Result<T, Response>,
) -> Result<Result<T, ApplyError>, Response> {
    match response {
        Response::Rejected(e) => Ok(Err(e)),
        other => answer(other).map(Ok),
    }
}

/// Declares writes that are the `Op` variant of the same name, with the same fields, and what
/// each answers: `done` (`()`), `refusable` (`Result<(), ApplyError>`), or `custom` (its
/// [`Write`] is written out below).
macro_rules! writes {
    ($($(#[$doc:meta])* $name:ident $fields:tt answers $answer:ident;)*) => {
        $(writes!(@one $(#[$doc])* $name $fields $answer);)*
    };
    (@one $(#[$doc:meta])* $name:ident { $($field:ident: $ty:ty),* } $answer:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            $(pub $field: $ty),*
        }

        impl From<$name> for Op {
            fn from($name { $($field),* }: $name) -> Op {
                Op::$name { $($field),* }
            }
        }

        writes!(@answer $name $answer);
    };
    (@one $(#[$doc:meta])* $name:ident ($ty:ty) $answer:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name(pub $ty);

        impl From<$name> for Op {
            fn from($name(value): $name) -> Op {
                Op::$name(value)
            }
        }

        writes!(@answer $name $answer);
    };
    (@answer $name:ident done) => {
        impl Write for $name {}

        impl Request for $name {
            type Answer = Response;
            type Output = ();

            fn output(response: Response) -> Result<(), Response> {
                done(response)
            }
        }
    };
    (@answer $name:ident refusable) => {
        impl Write for $name {}

        impl Request for $name {
            type Answer = Response;
            type Output = Result<(), ApplyError>;

            fn output(response: Response) -> Result<Self::Output, Response> {
                or_rejected(response, done)
            }
        }
    };
    (@answer $name:ident custom) => {};
}

writes! {
    /// KV ops applied atomically (a single-key write is a one-op transaction); a failed op
    /// rolls the transaction back, which the outcome says.
    Kv(Vec<KvOp>) answers custom;
    /// Creates a session (its ID chosen by the caller); answers the ID.
    CreateSession(Session) answers custom;
    /// Destroys (invalidates) a session, whether or not it exists.
    DestroySession { id: String } answers done;
    /// Registers or updates a node.
    RegisterNode { name: String, address: String } answers done;
    /// Removes a check, whether or not it exists.
    DeregisterCheck { node: String, check_id: String } answers done;
    /// Removes a service and its checks, whether or not it exists.
    DeregisterService { node: String, service_id: String } answers done;
    /// Removes a node, its checks and its sessions, whether or not it exists.
    DeregisterNode { name: String } answers done;
    /// Deletes a prepared query; refused when there is none.
    DeleteQuery { id: String } answers refusable;
    /// A change to the ACL tables.
    Acl(AclOp) answers refusable;
    /// A transaction with catalog ops, all or nothing; the outcome says which.
    Txn(Vec<TxnOp>) answers custom;
}

/// A node, optionally one service, and checks, all or nothing. It goes as the first release's
/// [`Op::CatalogRegister`] when its service has no tagged addresses (so a cluster with servers
/// of that release takes it), else as [`Op::CatalogRegisterFull`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogRegister(pub Registration);

impl From<CatalogRegister> for Op {
    fn from(CatalogRegister(registration): CatalogRegister) -> Op {
        if registration
            .service
            .as_ref()
            .is_some_and(|s| !s.tagged_addresses.is_empty())
        {
            Op::CatalogRegisterFull(registration)
        } else {
            Op::CatalogRegister(registration)
        }
    }
}

impl Write for CatalogRegister {}

impl Request for CatalogRegister {
    type Answer = Response;
    type Output = Result<(), ApplyError>;

    fn output(response: Response) -> Result<Self::Output, Response> {
        or_rejected(response, done)
    }
}

/// Creates a prepared query, or with `update` replaces an existing one. It goes as the first
/// release's [`Op::SetQuery`] when it has no `IgnoreCheckIDs`, else as [`Op::SetQueryFull`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetQuery {
    pub query: PreparedQuery,
    pub update: bool,
}

impl From<SetQuery> for Op {
    fn from(SetQuery { query, update }: SetQuery) -> Op {
        if query.service.ignore_check_ids.is_empty() {
            Op::SetQuery { query, update }
        } else {
            Op::SetQueryFull { query, update }
        }
    }
}

impl Write for SetQuery {}

impl Request for SetQuery {
    type Answer = Response;
    type Output = Result<(), ApplyError>;

    fn output(response: Response) -> Result<Self::Output, Response> {
        or_rejected(response, done)
    }
}

impl Write for Txn {}

impl Request for Txn {
    type Answer = Response;
    type Output = CatalogTxnOutcome;

    fn output(response: Response) -> Result<CatalogTxnOutcome, Response> {
        match response {
            Response::CatalogTxn(outcome) => Ok(outcome),
            other => Err(other),
        }
    }
}

impl Write for Kv {}

impl Request for Kv {
    type Answer = Response;
    type Output = TxnOutcome;

    fn output(response: Response) -> Result<TxnOutcome, Response> {
        match response {
            Response::Txn(outcome) => Ok(outcome),
            other => Err(other),
        }
    }
}

impl Write for CreateSession {}

impl Request for CreateSession {
    type Answer = Response;
    type Output = Result<String, ApplyError>;

    fn output(response: Response) -> Result<Self::Output, Response> {
        or_rejected(response, |response| match response {
            Response::SessionCreated { id } => Ok(id),
            other => Err(other),
        })
    }
}

/// A session takes a native lock or joins its queue on behalf of one request
/// ([`LockOp::Enqueue`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockEnqueue {
    pub name: String,
    pub session: String,
    pub mode: LockMode,
    pub limit: u32,
    pub try_only: bool,
    /// The request's identity: only it can leave the place it claims ([`LockLeave`]).
    pub request: u64,
}

/// What an enqueue did. The mode is the one the session holds or waits for, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The session holds the lock with this fencing token.
    Held { token: u64, mode: LockMode },
    /// The session waits at `position` (1: next in line) since raft index `index`.
    Queued {
        position: u64,
        index: u64,
        mode: LockMode,
    },
    /// A try-acquire found the lock taken, or in its lock-delay for `lock_delay_ms` more.
    Busy { lock_delay_ms: u64 },
}

impl From<LockEnqueue> for Op {
    fn from(enqueue: LockEnqueue) -> Op {
        let LockEnqueue {
            name,
            session,
            mode,
            limit,
            try_only,
            request,
        } = enqueue;
        Op::Lock(LockOp::Enqueue {
            name,
            session,
            mode,
            limit,
            try_only,
            request,
        })
    }
}

impl Write for LockEnqueue {}

impl Request for LockEnqueue {
    type Answer = Response;
    type Output = Result<Acquired, ApplyError>;

    fn output(response: Response) -> Result<Self::Output, Response> {
        or_rejected(response, |response| match response {
            Response::Lock(LockOutcome::Granted { token, mode }) => {
                Ok(Acquired::Held { token, mode })
            }
            Response::Lock(LockOutcome::Waiting {
                position,
                index,
                mode,
            }) => Ok(Acquired::Queued {
                position,
                index,
                mode,
            }),
            Response::Lock(LockOutcome::Busy { lock_delay_ms }) => {
                Ok(Acquired::Busy { lock_delay_ms })
            }
            other => Err(other),
        })
    }
}

/// One request gives up its place in a native lock's queue ([`LockOp::Leave`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockLeave {
    pub name: String,
    pub session: String,
    pub request: u64,
}

/// What a leave did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// The request's place in the queue is given up.
    Left,
    /// Nothing changed; the session's standing as stored.
    Stayed(LockHold),
}

impl From<LockLeave> for Op {
    fn from(
        LockLeave {
            name,
            session,
            request,
        }: LockLeave,
    ) -> Op {
        Op::Lock(LockOp::Leave {
            name,
            session,
            request,
        })
    }
}

impl Write for LockLeave {}

impl Request for LockLeave {
    type Answer = Response;
    type Output = Result<Leave, ApplyError>;

    fn output(response: Response) -> Result<Self::Output, Response> {
        or_rejected(response, |response| match response {
            Response::Lock(LockOutcome::Left) => Ok(Leave::Left),
            Response::Lock(LockOutcome::Stayed(hold)) => Ok(Leave::Stayed(hold)),
            other => Err(other),
        })
    }
}

/// A session releases a native lock or leaves its queue ([`LockOp::Release`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRelease {
    pub name: String,
    pub session: String,
}

/// What the released session had: the lock, a place in the queue, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    pub held: bool,
    pub queued: bool,
}

impl From<LockRelease> for Op {
    fn from(LockRelease { name, session }: LockRelease) -> Op {
        Op::Lock(LockOp::Release { name, session })
    }
}

impl Write for LockRelease {}

impl Request for LockRelease {
    type Answer = Response;
    type Output = Result<Released, ApplyError>;

    fn output(response: Response) -> Result<Self::Output, Response> {
        or_rejected(response, |response| match response {
            Response::Lock(LockOutcome::Released { held, queued }) => Ok(Released { held, queued }),
            other => Err(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_of_another_change_comes_back_whole() {
        let answer = Response::Txn(TxnOutcome::RolledBack(Vec::new()));
        assert_eq!(DestroySession::output(answer.clone()), Err(answer.clone()));
        assert_eq!(CatalogRegister::output(answer.clone()), Err(answer));
        let released = Response::Lock(LockOutcome::Released {
            held: true,
            queued: false,
        });
        assert_eq!(LockEnqueue::output(released.clone()), Err(released));
    }

    #[test]
    fn a_refusal_is_the_callers_error_only_where_the_change_can_be_refused() {
        let refused = Response::Rejected(ApplyError::MissingNode);
        assert_eq!(
            CatalogRegister::output(refused.clone()),
            Ok(Err(ApplyError::MissingNode))
        );
        assert_eq!(
            CreateSession::output(refused.clone()),
            Ok(Err(ApplyError::MissingNode))
        );
        assert_eq!(DeregisterNode::output(refused.clone()), Err(refused));
    }
}
