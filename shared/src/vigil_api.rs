//! Vigil's own HTTP contract: the JSON bodies the `/v1/vigil/*` endpoints answer, for the agent
//! that writes them and the clients and CLI that read them. Plain serde types.

use serde::{Deserialize, Serialize};

use crate::catalog::SERF_HEALTH;
use crate::history::{Cause, Event, LockEvent, LockHistory, LockKind};
use crate::lock::{LockMode, LockStanding};
use crate::session::Session;

/// Why an acquire answers without the lock (`Reason` in [`AcquireReply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotAcquired {
    /// A try found the lock taken.
    Held,
    /// A try found the lock in its lock-delay.
    LockDelay,
    /// The request's wait ended first: the session is still in the queue, and asking again
    /// resumes the wait (HTTP 202).
    Queued,
    /// The request's `timeout` passed: the session left the queue.
    Timeout,
    /// The session left the queue meanwhile (released, or invalidated).
    Removed,
}

/// The answer to an acquire, `PUT /v1/vigil/lock/<name>?session=S`, for the agent that writes it
/// and the clients that read it. The mode is the one the session holds or waits for, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AcquireReply {
    pub lock: String,
    pub session: String,
    pub mode: LockMode,
    pub acquired: bool,
    /// The fencing token, when acquired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Still waiting in the queue (the request's wait ended first); never with `acquired`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<NotAcquired>,
    /// The place in the queue while queued (1: next in line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// With reason `lock-delay`: how long it has left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_remaining_ms: Option<u64>,
}

/// `GET /v1/vigil/lock/<name>?session=S`: where S stands on the lock: `Held` with its `Token`,
/// or waiting at `Position` (1: next in line), or neither (`Held` false alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StandingReply {
    pub held: bool,
    /// The fencing token, while held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The place in the queue, while waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
}

impl StandingReply {
    pub fn from_standing(standing: &LockStanding) -> StandingReply {
        let (held, token, position) = match *standing {
            LockStanding::Held { token, .. } => (true, Some(token), None),
            LockStanding::Queued { position } => (false, None, Some(position)),
            LockStanding::Absent => (false, None, None),
        };
        StandingReply {
            held,
            token,
            position,
        }
    }
}

/// `GET /v1/vigil/sequencer`: `{"Valid":true}` while the sequencer (or native lock token) is
/// current, else `{"Valid":false,"Reason":…}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SequencerReply {
    pub valid: bool,
    /// Why it is not valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl SequencerReply {
    pub fn from_verdict(verdict: Result<(), String>) -> SequencerReply {
        SequencerReply {
            valid: verdict.is_ok(),
            reason: verdict.err(),
        }
    }
}

/// A session as the lock reports name it: its ID, and its name and node while it exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRef {
    #[serde(rename = "Session")]
    pub id: String,
    /// `null` once the session is gone.
    #[serde(rename = "SessionName")]
    pub name: Option<String>,
    #[serde(rename = "Node")]
    pub node: Option<String>,
}

impl SessionRef {
    /// `id`, named by `session` while it exists.
    pub fn new(id: &str, session: Option<&Session>) -> SessionRef {
        SessionRef {
            id: id.to_owned(),
            name: session.map(|s| s.name.clone()),
            node: session.map(|s| s.node.clone()),
        }
    }
}

/// A native lock, as `GET /v1/vigil/lock/<name>` answers it and `/v1/vigil/locks` lists it in
/// `Queues`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LockReport {
    pub name: String,
    pub limit: u32,
    /// Token of the latest grant (0: never granted).
    pub token: u64,
    pub grants: u64,
    pub lock_delay_remaining_ms: u64,
    pub holders: Vec<LockHolderReport>,
    /// In grant order: the front is next.
    pub waiters: Vec<LockWaiterReport>,
    pub create_index: u64,
    pub modify_index: u64,
}

/// One holder of a native lock. Times since are measured on the answering agent's clock
/// against the leader's clock of the grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LockHolderReport {
    #[serde(flatten)]
    pub session: SessionRef,
    pub mode: LockMode,
    pub token: u64,
    /// RFC 3339, UTC, to the millisecond.
    pub held_since: String,
    pub held_for_ms: u64,
}

/// One waiter in a native lock's queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LockWaiterReport {
    #[serde(flatten)]
    pub session: SessionRef,
    pub mode: LockMode,
    /// 1: next in line.
    pub position: u64,
    /// RFC 3339, UTC, to the millisecond.
    pub waiting_since: String,
    pub waiting_for_ms: u64,
}

/// `GET /v1/vigil/locks?prefix=P`: what is locked under `P`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct LocksReport {
    pub prefix: String,
    /// Keys held by a session that are not semaphore or fair-mutex contenders.
    pub locks: Vec<HeldKey>,
    pub semaphores: Vec<SemaphoreReport>,
    pub fair_queues: Vec<FairQueue>,
    /// Native locks.
    pub queues: Vec<LockReport>,
}

/// What a held key is: an `api.Lock` key (its flag) or any other key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyKind {
    Lock,
    Key,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Lock => "lock",
            KeyKind::Key => "key",
        }
    }
}

/// A key held by a session. No acquisition time is recorded, so held-since is the key's
/// `ModifyIndex`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HeldKey {
    pub key: String,
    pub kind: KeyKind,
    #[serde(flatten)]
    pub session: SessionRef,
    pub lock_index: u64,
    pub held_since_index: u64,
}

/// A KV semaphore (`<prefix>/.lock` with the semaphore flag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SemaphoreReport {
    pub prefix: String,
    pub key: String,
    /// `null` when the lock key's value does not decode.
    pub limit: Option<i64>,
    /// Live holders, pruned as the Go client prunes.
    pub holders: Vec<SemaphoreContender>,
    /// In `CreateIndex` order.
    pub waiting: Vec<SemaphoreContender>,
}

/// A semaphore's holder or waiter; its contender key's fields are `null` when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SemaphoreContender {
    #[serde(flatten)]
    pub session: SessionRef,
    pub key: Option<String>,
    pub lock_index: Option<u64>,
    pub create_index: Option<u64>,
}

/// A fair mutex's live contenders under one prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct FairQueue {
    pub prefix: String,
    /// In `CreateIndex` order: the first is the owner.
    pub queue: Vec<FairContender>,
}

/// One fair-mutex contender key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct FairContender {
    pub key: String,
    #[serde(flatten)]
    pub session: SessionRef,
    pub lock_index: u64,
    pub create_index: u64,
}

/// Golden texts: each type's exact JSON, as the agent writes it and the clients read it, so a
/// renamed, reordered or newly omitted field fails here before it changes the wire.
/// `GET /v1/vigil/history/<name>` (and `?prefix`): one lock's recorded events, oldest first.
/// A KV key and a native lock of the same name are two histories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HistoryReport {
    pub name: String,
    pub kind: HistoryKind,
    pub events: Vec<HistoryEvent>,
}

/// `"key"`: a KV key acquired with a session; `"queue"`: a native lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryKind {
    Key,
    Queue,
}

/// What happened (`Event` of a [`HistoryEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HistoryEventKind {
    Granted,
    Released,
    /// The holder's session was invalidated: `Cause` says why.
    Lost,
    /// No grant until `Until`.
    LockDelay,
    LockDelayEnded,
    /// A waiter left a native lock's queue: its request gave up (no `Cause`), or its session
    /// was invalidated (`Cause`).
    GaveUp,
    /// The key was deleted while held.
    Deleted,
}

/// Why a session was invalidated (`Cause` of a [`HistoryEvent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HistoryCause {
    Destroyed,
    /// Its TTL lapsed.
    TtlExpired,
    /// Its node failed: `serfHealth` went critical.
    NodeFailed,
    /// Another check it is bound to went critical (`CheckID`).
    CheckCritical,
    CheckDeregistered,
    NodeDeregistered,
}

/// One event: the raft index of the op that caused it and the leader's wall clock of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HistoryEvent {
    pub index: u64,
    /// RFC 3339, UTC, to the millisecond.
    pub time: String,
    /// Milliseconds since the epoch.
    pub time_ms: u64,
    pub event: HistoryEventKind,
    /// The session it happened to (none for `lock-delay-ended`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_name: Option<String>,
    /// The holder's node (`granted`), or the node the cause names (`lost`, `gave-up`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A key's LockIndex or a native lock's fencing token (`granted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LockMode>,
    /// How long it waited in a native lock's queue (`granted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<HistoryCause>,
    /// The check of a `check-critical` or `check-deregistered` cause.
    #[serde(default, rename = "CheckID", skip_serializing_if = "Option::is_none")]
    pub check_id: Option<String>,
    /// The end of a `lock-delay`, RFC 3339 and in milliseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

impl HistoryReport {
    /// The report of a recorded history; `time` writes a wall clock (ms) as RFC 3339.
    pub fn new(history: &LockHistory, time: &dyn Fn(u64) -> String) -> HistoryReport {
        HistoryReport {
            name: history.name.clone(),
            kind: match history.kind {
                LockKind::Key => HistoryKind::Key,
                LockKind::Queue => HistoryKind::Queue,
            },
            events: history
                .events
                .iter()
                .map(|e| HistoryEvent::new(e, time))
                .collect(),
        }
    }
}

impl HistoryEvent {
    pub fn new(recorded: &LockEvent, time: &dyn Fn(u64) -> String) -> HistoryEvent {
        let mut event = HistoryEvent {
            index: recorded.index,
            time: time(recorded.at_ms),
            time_ms: recorded.at_ms,
            event: HistoryEventKind::Released,
            session: recorded.session.clone(),
            session_name: None,
            node: None,
            token: None,
            mode: None,
            waited_ms: None,
            cause: None,
            check_id: None,
            until: None,
            until_ms: None,
        };
        match &recorded.event {
            Event::Granted {
                node,
                session_name,
                token,
                mode,
                waited_ms,
            } => {
                event.event = HistoryEventKind::Granted;
                event.session_name = Some(session_name.clone());
                event.node = Some(node.clone());
                event.token = Some(*token);
                event.mode = Some(*mode);
                event.waited_ms = *waited_ms;
            }
            Event::Released => {}
            Event::Lost { cause } => {
                event.event = HistoryEventKind::Lost;
                event.set_cause(cause);
            }
            Event::LockDelay { until_ms } => {
                event.event = HistoryEventKind::LockDelay;
                event.until = Some(time(*until_ms));
                event.until_ms = Some(*until_ms);
            }
            Event::LockDelayEnded => event.event = HistoryEventKind::LockDelayEnded,
            Event::GaveUp { cause } => {
                event.event = HistoryEventKind::GaveUp;
                if let Some(cause) = cause {
                    event.set_cause(cause);
                }
            }
            Event::Deleted => event.event = HistoryEventKind::Deleted,
        }
        event
    }

    fn set_cause(&mut self, cause: &Cause) {
        let (kind, node, check) = match cause {
            Cause::Destroyed => (HistoryCause::Destroyed, None, None),
            Cause::TtlExpired => (HistoryCause::TtlExpired, None, None),
            Cause::CheckCritical { node, check_id } if check_id == SERF_HEALTH => {
                (HistoryCause::NodeFailed, Some(node), Some(check_id))
            }
            Cause::CheckCritical { node, check_id } => {
                (HistoryCause::CheckCritical, Some(node), Some(check_id))
            }
            Cause::CheckDeregistered { node, check_id } => {
                (HistoryCause::CheckDeregistered, Some(node), Some(check_id))
            }
            Cause::NodeDeregistered { node } => (HistoryCause::NodeDeregistered, Some(node), None),
        };
        self.cause = Some(kind);
        self.node = node.cloned();
        self.check_id = check.cloned();
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;

    use super::*;

    /// `value` serializes to exactly `text`, and `text` reads back as `value`.
    fn golden<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T, text: &str) {
        assert_eq!(serde_json::to_string(&value).unwrap(), text);
        assert_eq!(serde_json::from_str::<T>(text).unwrap(), value);
    }

    fn session(id: &str, name: Option<&str>, node: Option<&str>) -> SessionRef {
        SessionRef {
            id: id.to_owned(),
            name: name.map(str::to_owned),
            node: node.map(str::to_owned),
        }
    }

    fn acquire(reason: Option<NotAcquired>) -> AcquireReply {
        AcquireReply {
            lock: "jobs".to_owned(),
            session: "s1".to_owned(),
            mode: LockMode::Exclusive,
            acquired: false,
            token: None,
            queued: false,
            reason,
            position: None,
            lock_delay_remaining_ms: None,
        }
    }

    #[test]
    fn acquire_reply() {
        golden(
            AcquireReply {
                acquired: true,
                token: Some(7),
                ..acquire(None)
            },
            r#"{"Lock":"jobs","Session":"s1","Mode":"exclusive","Acquired":true,"Token":7}"#,
        );
        golden(
            AcquireReply {
                mode: LockMode::Shared,
                queued: true,
                position: Some(2),
                ..acquire(Some(NotAcquired::Queued))
            },
            r#"{"Lock":"jobs","Session":"s1","Mode":"shared","Acquired":false,"Queued":true,"Reason":"queued","Position":2}"#,
        );
        golden(
            AcquireReply {
                lock_delay_remaining_ms: Some(1500),
                ..acquire(Some(NotAcquired::LockDelay))
            },
            r#"{"Lock":"jobs","Session":"s1","Mode":"exclusive","Acquired":false,"Reason":"lock-delay","LockDelayRemainingMs":1500}"#,
        );
        for (reason, text) in [
            (NotAcquired::Held, "held"),
            (NotAcquired::Timeout, "timeout"),
            (NotAcquired::Removed, "removed"),
        ] {
            golden(
                acquire(Some(reason)),
                &format!(
                    r#"{{"Lock":"jobs","Session":"s1","Mode":"exclusive","Acquired":false,"Reason":"{text}"}}"#
                ),
            );
        }
    }

    #[test]
    fn standing_reply() {
        let golden_standing = |standing: LockStanding, text: &str| {
            golden(StandingReply::from_standing(&standing), text);
        };
        golden_standing(
            LockStanding::Held {
                token: 9,
                since_ms: 1,
            },
            r#"{"Held":true,"Token":9}"#,
        );
        golden_standing(
            LockStanding::Queued { position: 3 },
            r#"{"Held":false,"Position":3}"#,
        );
        golden_standing(LockStanding::Absent, r#"{"Held":false}"#);
    }

    #[test]
    fn sequencer_reply() {
        golden(SequencerReply::from_verdict(Ok(())), r#"{"Valid":true}"#);
        golden(
            SequencerReply::from_verdict(Err("lock-index is stale".to_owned())),
            r#"{"Valid":false,"Reason":"lock-index is stale"}"#,
        );
    }

    fn lock_report() -> LockReport {
        LockReport {
            name: "jobs".to_owned(),
            limit: 2,
            token: 12,
            grants: 5,
            lock_delay_remaining_ms: 0,
            holders: vec![LockHolderReport {
                session: session("s1", Some("worker"), Some("n1")),
                mode: LockMode::Exclusive,
                token: 12,
                held_since: "2026-11-28T04:00:00.000Z".to_owned(),
                held_for_ms: 250,
            }],
            waiters: vec![LockWaiterReport {
                session: session("s2", None, None),
                mode: LockMode::Shared,
                position: 1,
                waiting_since: "2026-11-28T04:00:00.100Z".to_owned(),
                waiting_for_ms: 150,
            }],
            create_index: 10,
            modify_index: 14,
        }
    }

    const LOCK_REPORT: &str = concat!(
        r#"{"Name":"jobs","Limit":2,"Token":12,"Grants":5,"LockDelayRemainingMs":0,"#,
        r#""Holders":[{"Session":"s1","SessionName":"worker","Node":"n1","Mode":"exclusive","#,
        r#""Token":12,"HeldSince":"2026-11-28T04:00:00.000Z","HeldForMs":250}],"#,
        r#""Waiters":[{"Session":"s2","SessionName":null,"Node":null,"Mode":"shared","#,
        r#""Position":1,"WaitingSince":"2026-11-28T04:00:00.100Z","WaitingForMs":150}],"#,
        r#""CreateIndex":10,"ModifyIndex":14}"#
    );

    #[test]
    fn lock_report_reply() {
        golden(lock_report(), LOCK_REPORT);
    }

    #[test]
    fn locks_report() {
        let report = LocksReport {
            prefix: "app".to_owned(),
            locks: vec![
                HeldKey {
                    key: "app/leader/.lock".to_owned(),
                    kind: KeyKind::Lock,
                    session: session("s3", Some("api"), Some("n2")),
                    lock_index: 1,
                    held_since_index: 3,
                },
                HeldKey {
                    key: "app/plain".to_owned(),
                    kind: KeyKind::Key,
                    session: session("gone", None, None),
                    lock_index: 2,
                    held_since_index: 4,
                },
            ],
            semaphores: vec![
                SemaphoreReport {
                    prefix: "app/sem".to_owned(),
                    key: "app/sem/.lock".to_owned(),
                    limit: Some(2),
                    holders: vec![SemaphoreContender {
                        session: session("h1", Some("a"), Some("n1")),
                        key: Some("app/sem/h1".to_owned()),
                        lock_index: Some(1),
                        create_index: Some(6),
                    }],
                    waiting: vec![SemaphoreContender {
                        session: session("h2", None, None),
                        key: None,
                        lock_index: None,
                        create_index: None,
                    }],
                },
                SemaphoreReport {
                    prefix: "app/bad".to_owned(),
                    key: "app/bad/.lock".to_owned(),
                    limit: None,
                    holders: Vec::new(),
                    waiting: Vec::new(),
                },
            ],
            fair_queues: vec![FairQueue {
                prefix: "app/fair".to_owned(),
                queue: vec![FairContender {
                    key: "app/fair/a".to_owned(),
                    session: session("fa", Some("f"), Some("n3")),
                    lock_index: 1,
                    create_index: 8,
                }],
            }],
            queues: vec![lock_report()],
        };
        let text = [
            r#"{"Prefix":"app","Locks":["#,
            r#"{"Key":"app/leader/.lock","Kind":"lock","Session":"s3","SessionName":"api","#,
            r#""Node":"n2","LockIndex":1,"HeldSinceIndex":3},"#,
            r#"{"Key":"app/plain","Kind":"key","Session":"gone","SessionName":null,"Node":null,"#,
            r#""LockIndex":2,"HeldSinceIndex":4}],"#,
            r#""Semaphores":[{"Prefix":"app/sem","Key":"app/sem/.lock","Limit":2,"#,
            r#""Holders":[{"Session":"h1","SessionName":"a","Node":"n1","Key":"app/sem/h1","#,
            r#""LockIndex":1,"CreateIndex":6}],"#,
            r#""Waiting":[{"Session":"h2","SessionName":null,"Node":null,"Key":null,"#,
            r#""LockIndex":null,"CreateIndex":null}]},"#,
            r#"{"Prefix":"app/bad","Key":"app/bad/.lock","Limit":null,"Holders":[],"Waiting":[]}],"#,
            r#""FairQueues":[{"Prefix":"app/fair","Queue":[{"Key":"app/fair/a","Session":"fa","#,
            r#""SessionName":"f","Node":"n3","LockIndex":1,"CreateIndex":8}]}],"#,
            r#""Queues":["#,
            LOCK_REPORT,
            "]}",
        ]
        .concat();
        golden(report, &text);
    }

    #[test]
    fn history_report() {
        let time = |ms: u64| format!("t{ms}");
        let at = |index: u64, session: &str, event: Event| LockEvent {
            index,
            at_ms: 1000 + index,
            session: session.to_owned(),
            event,
        };
        let history = LockHistory {
            name: "db".to_owned(),
            kind: LockKind::Queue,
            events: vec![
                at(
                    5,
                    "s1",
                    Event::Granted {
                        node: "web-3".to_owned(),
                        session_name: "worker".to_owned(),
                        token: 1042,
                        mode: LockMode::Exclusive,
                        waited_ms: Some(1800),
                    },
                ),
                at(
                    9,
                    "s1",
                    Event::Lost {
                        cause: Cause::CheckCritical {
                            node: "web-3".to_owned(),
                            check_id: "serfHealth".to_owned(),
                        },
                    },
                ),
                at(9, "s1", Event::LockDelay { until_ms: 16_009 }),
                at(12, "", Event::LockDelayEnded),
                at(
                    13,
                    "s2",
                    Event::GaveUp {
                        cause: Some(Cause::CheckCritical {
                            node: "web-4".to_owned(),
                            check_id: "disk".to_owned(),
                        }),
                    },
                ),
                at(14, "s3", Event::GaveUp { cause: None }),
                at(
                    15,
                    "s4",
                    Event::Lost {
                        cause: Cause::TtlExpired,
                    },
                ),
            ],
        };
        let report = HistoryReport::new(&history, &time);
        golden(
            report.clone(),
            concat!(
                r#"{"Name":"db","Kind":"queue","Events":["#,
                r#"{"Index":5,"Time":"t1005","TimeMs":1005,"Event":"granted","Session":"s1","SessionName":"worker","Node":"web-3","Token":1042,"Mode":"exclusive","WaitedMs":1800},"#,
                r#"{"Index":9,"Time":"t1009","TimeMs":1009,"Event":"lost","Session":"s1","Node":"web-3","Cause":"node-failed","CheckID":"serfHealth"},"#,
                r#"{"Index":9,"Time":"t1009","TimeMs":1009,"Event":"lock-delay","Session":"s1","Until":"t16009","UntilMs":16009},"#,
                r#"{"Index":12,"Time":"t1012","TimeMs":1012,"Event":"lock-delay-ended"},"#,
                r#"{"Index":13,"Time":"t1013","TimeMs":1013,"Event":"gave-up","Session":"s2","Node":"web-4","Cause":"check-critical","CheckID":"disk"},"#,
                r#"{"Index":14,"Time":"t1014","TimeMs":1014,"Event":"gave-up","Session":"s3"},"#,
                r#"{"Index":15,"Time":"t1015","TimeMs":1015,"Event":"lost","Session":"s4","Cause":"ttl-expired"}"#,
                r#"]}"#,
            ),
        );
    }
}
