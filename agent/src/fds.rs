//! The process's file descriptors: at start the soft `RLIMIT_NOFILE` is raised to the hard limit
//! (Go's runtime does the same for every Go program, Consul included), and the HTTP API may
//! hold what is left of it after a reserve for everything else a server needs descriptors for:
//! raft's log chunks and snapshot files, the RPC and gossip sockets, outgoing connections of
//! HTTP and TCP checks, script checks' pipes, and the runtime's own. So no number of HTTP
//! clients can make a snapshot or an accept fail with `EMFILE`.

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};

/// Descriptors kept back from HTTP connections: a quarter of the limit, within these bounds.
const RESERVE_MIN: u64 = 128;
const RESERVE_MAX: u64 = 4096;
/// HTTP connections allowed whatever the limit (a limit this small is a misconfiguration the
/// start-up log names).
const HTTP_MIN: usize = 16;
/// What an unlimited hard limit is raised to (Linux's default `nr_open`; no system takes more).
const UNLIMITED_TARGET: u64 = 1 << 20;

/// The descriptor limit as start left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit now in force.
    pub soft: u64,
    /// The soft limit before start raised it, if it did.
    pub raised_from: Option<u64>,
}

impl FdLimit {
    /// The open HTTP connections (plain and TLS together) the agent holds at most.
    pub fn http_connections(self) -> usize {
        let reserve = (self.soft / 4).clamp(RESERVE_MIN, RESERVE_MAX);
        usize::try_from(self.soft.saturating_sub(reserve))
            .unwrap_or(usize::MAX)
            .max(HTTP_MIN)
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; when the system refuses, or the limit
/// cannot be read, keeps what is there (and says so in the log).
pub fn raise_limit() -> FdLimit {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open file limit; assuming 1024");
            return FdLimit {
                soft: 1024,
                raised_from: None,
            };
        }
    };
    let target = if hard == RLIM_INFINITY {
        UNLIMITED_TARGET
    } else {
        hard
    };
    if soft >= target {
        return FdLimit {
            soft,
            raised_from: None,
        };
    }
    match setrlimit(Resource::RLIMIT_NOFILE, target, hard) {
        Ok(()) => FdLimit {
            soft: target,
            raised_from: Some(soft),
        },
        Err(e) => {
            tracing::warn!(soft, hard, error = %e, "cannot raise the open file limit");
            FdLimit {
                soft,
                raised_from: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_connections_leave_a_reserve() {
        let cap = |soft| {
            FdLimit {
                soft,
                raised_from: None,
            }
            .http_connections()
        };
        assert_eq!(cap(1024), 768);
        assert_eq!(cap(256), 128);
        assert_eq!(cap(100), HTTP_MIN);
        assert_eq!(cap(65_536), 65_536 - 4096);
    }
}
