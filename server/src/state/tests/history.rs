//! The lock history: what the apply of each op records, the causes of involuntary losses, the
//! bounds, and snapshots.

use vigil_shared::history::{Cause, Event, LockEvent, LockHistory, LockKind};
use vigil_shared::lock::{LockMode, LockOp};

use super::super::history::{History, Limits};
use super::*;

fn history(sm: &StateMachine, name: &str, kind: LockKind) -> Vec<LockEvent> {
    sm.history().events(name, kind).cloned().collect()
}

fn events(sm: &StateMachine, name: &str, kind: LockKind) -> Vec<(String, Event)> {
    history(sm, name, kind)
        .into_iter()
        .map(|e| (e.session, e.event))
        .collect()
}

fn last(sm: &StateMachine, key: &str) -> Option<Event> {
    events(sm, key, LockKind::Key).pop().map(|(_, e)| e)
}

fn named(id: &str, name: &str) -> Session {
    Session {
        name: name.to_owned(),
        ..session(id, N1)
    }
}

fn granted(token: u64, name: &str, mode: LockMode, waited_ms: Option<u64>) -> Event {
    Event::Granted {
        node: N1.to_owned(),
        session_name: name.to_owned(),
        token,
        mode,
        waited_ms,
    }
}

fn enqueue(name: &str, session: &str, request: u64) -> Op {
    Op::Lock(LockOp::Enqueue {
        name: name.to_owned(),
        session: session.to_owned(),
        mode: LockMode::Exclusive,
        limit: 1,
        try_only: false,
        request,
    })
}

#[test]
fn a_keys_history_has_its_grants_releases_and_each_cause_of_a_loss() {
    let mut sm = world();
    create_session(&mut sm, 3, named(S1, "web-3"));
    write(&mut sm, 4, op::lock("k", "a", S1));
    write(&mut sm, 5, op::set("k", "rewritten by its holder"));
    write(&mut sm, 6, op::unlock("k", "", S1));
    write(&mut sm, 7, op::lock("k", "", S1));
    // The node fails: serfHealth goes critical.
    register_check(&mut sm, 8, check(N1, SERF_HEALTH, HealthStatus::Critical));
    let recorded = history(&sm, "k", LockKind::Key);
    assert!(recorded.iter().all(|e| e.at_ms == T0));
    let indexes: Vec<u64> = recorded.iter().map(|e| e.index).collect();
    assert_eq!(indexes, [4, 6, 7, 8, 8]);
    let node_failed = Cause::CheckCritical {
        node: N1.to_owned(),
        check_id: SERF_HEALTH.to_owned(),
    };
    assert_eq!(
        events(&sm, "k", LockKind::Key),
        [
            (
                S1.to_owned(),
                granted(1, "web-3", LockMode::Exclusive, None)
            ),
            (S1.to_owned(), Event::Released),
            (
                S1.to_owned(),
                granted(2, "web-3", LockMode::Exclusive, None)
            ),
            (S1.to_owned(), Event::Lost { cause: node_failed }),
            (
                S1.to_owned(),
                Event::LockDelay {
                    until_ms: T0 + 15_000
                }
            ),
        ]
    );

    // Destroyed, TTL lapsed, a service check critical, a check deregistered, the node
    // deregistered, and a key deleted while held, each on its own key.
    register_check(&mut sm, 9, check(N1, SERF_HEALTH, HealthStatus::Passing));
    register_check(&mut sm, 10, check(N1, "disk", HealthStatus::Passing));
    register_check(&mut sm, 11, check(N1, "mem", HealthStatus::Passing));
    let bound = |id: &str, check: &str| Session {
        node_checks: strings(&[SERF_HEALTH, check]),
        lock_delay_ns: 0,
        ..session(id, N1)
    };
    let no_delay = |id: &str| Session {
        lock_delay_ns: 0,
        ..session(id, N1)
    };
    create_session(&mut sm, 12, no_delay(S1));
    create_session(&mut sm, 13, no_delay(S2));
    create_session(&mut sm, 14, bound(S3, "disk"));
    create_session(&mut sm, 15, bound(S4, "mem"));
    write(&mut sm, 16, op::lock("destroyed", "", S1));
    write(&mut sm, 17, op::lock("expired", "", S2));
    write(&mut sm, 18, op::lock("critical", "", S3));
    write(&mut sm, 19, op::lock("deregistered", "", S4));
    destroy_at(&mut sm, 20, T0, S1);
    let expire = Op::ExpireSession { id: S2.to_owned() };
    assert_eq!(apply(&mut sm, 21, expire).0, Response::Done);
    register_check(&mut sm, 22, check(N1, "disk", HealthStatus::Critical));
    let deregister = Op::DeregisterCheck {
        node: N1.to_owned(),
        check_id: "mem".to_owned(),
    };
    assert_eq!(apply(&mut sm, 23, deregister).0, Response::Done);
    assert_eq!(
        last(&sm, "destroyed"),
        Some(Event::Lost {
            cause: Cause::Destroyed
        })
    );
    assert_eq!(
        last(&sm, "expired"),
        Some(Event::Lost {
            cause: Cause::TtlExpired
        })
    );
    assert_eq!(
        last(&sm, "critical"),
        Some(Event::Lost {
            cause: Cause::CheckCritical {
                node: N1.to_owned(),
                check_id: "disk".to_owned()
            }
        })
    );
    assert_eq!(
        last(&sm, "deregistered"),
        Some(Event::Lost {
            cause: Cause::CheckDeregistered {
                node: N1.to_owned(),
                check_id: "mem".to_owned()
            }
        })
    );

    create_session(&mut sm, 24, no_delay(S1));
    write(&mut sm, 25, op::lock("deleted", "", S1));
    write(&mut sm, 26, op::delete("deleted"));
    assert_eq!(last(&sm, "deleted"), Some(Event::Deleted));
    write(&mut sm, 27, op::lock("node", "", S1));
    let gone = Op::DeregisterNode {
        name: N1.to_owned(),
    };
    assert_eq!(apply(&mut sm, 28, gone).0, Response::Done);
    assert_eq!(
        last(&sm, "node"),
        Some(Event::Lost {
            cause: Cause::NodeDeregistered {
                node: N1.to_owned()
            }
        })
    );
    // A plain key never held has no history.
    write(&mut sm, 29, op::set("plain", "v"));
    assert!(history(&sm, "plain", LockKind::Key).is_empty());
}

#[test]
fn a_native_locks_history_has_waits_give_ups_losses_and_the_lock_delay() {
    let mut sm = world();
    create_session(&mut sm, 3, named(S1, "one"));
    create_session(&mut sm, 4, named(S2, "two"));
    create_session(&mut sm, 5, named(S3, "three"));
    apply_at(&mut sm, 6, T0, enqueue("q", S1, 1));
    apply_at(&mut sm, 7, T0 + 200, enqueue("q", S2, 2));
    apply_at(&mut sm, 8, T0 + 300, enqueue("q", S3, 3));
    // S3's request gives up; S1 releases after 2 s, and S2 is granted having waited 1.8 s.
    let leave = Op::Lock(LockOp::Leave {
        name: "q".into(),
        session: S3.into(),
        request: 3,
    });
    apply_at(&mut sm, 9, T0 + 1_000, leave);
    let release = Op::Lock(LockOp::Release {
        name: "q".into(),
        session: S1.into(),
    });
    let (_, fx) = apply_at(&mut sm, 10, T0 + 2_000, release);
    // For the metrics: S1 held it 2 s, S2 waited 1.8 s.
    assert_eq!(fx.lock_holds, [("q".to_owned(), 2_000)]);
    assert_eq!(fx.lock_waits, [("q".to_owned(), 1_800)]);
    // S3 waits again, then S2's session is destroyed: S2 loses the lock, a 15 s lock-delay is
    // armed, and S3 waits it out.
    apply_at(&mut sm, 11, T0 + 2_100, enqueue("q", S3, 4));
    destroy_at(&mut sm, 12, T0 + 3_000, S2);
    let wake = || Op::Lock(LockOp::Wake { name: "q".into() });
    apply_at(&mut sm, 13, T0 + 18_000, wake());
    apply_at(&mut sm, 14, T0 + 18_050, wake());
    let ex = LockMode::Exclusive;
    assert_eq!(
        events(&sm, "q", LockKind::Queue),
        [
            (S1.to_owned(), granted(6, "one", ex, Some(0))),
            (S3.to_owned(), Event::GaveUp { cause: None }),
            (S1.to_owned(), Event::Released),
            (S2.to_owned(), granted(10, "two", ex, Some(1_800))),
            (
                S2.to_owned(),
                Event::Lost {
                    cause: Cause::Destroyed
                }
            ),
            (
                S2.to_owned(),
                Event::LockDelay {
                    until_ms: T0 + 18_000
                }
            ),
            (String::new(), Event::LockDelayEnded),
            (S3.to_owned(), granted(13, "three", ex, Some(15_900))),
        ]
    );
    // A waiter whose session goes gives up with its cause.
    create_session(&mut sm, 15, named(S4, "four"));
    apply_at(&mut sm, 16, T0 + 19_000, enqueue("q", S4, 5));
    destroy_at(&mut sm, 17, T0 + 19_000, S4);
    assert_eq!(
        events(&sm, "q", LockKind::Queue).pop(),
        Some((
            S4.to_owned(),
            Event::GaveUp {
                cause: Some(Cause::Destroyed)
            }
        ))
    );
    // A key and a native lock of one name have a history each; a prefix reads both.
    write(&mut sm, 18, op::lock("q", "", S3));
    let (found, index) = sm.history().read("", true);
    let kinds: Vec<(&str, LockKind)> = found.iter().map(|h| (h.name.as_str(), h.kind)).collect();
    assert_eq!(kinds, [("q", LockKind::Key), ("q", LockKind::Queue)]);
    assert_eq!(index, 18);
}

#[test]
fn below_protocol_level_2_nothing_is_recorded() {
    let mut sm = world_at(1);
    create_session(&mut sm, 3, session(S1, N1));
    write(&mut sm, 4, op::lock("k", "", S1));
    destroy_at(&mut sm, 5, T0, S1);
    assert!(sm.history().is_empty());
}

fn event(index: u64) -> LockEvent {
    LockEvent {
        index,
        at_ms: T0 + index,
        session: S1.to_owned(),
        event: Event::Released,
    }
}

#[test]
fn ten_thousand_grants_stay_within_the_bounds() {
    // Through the state machine, with the default bounds: 10,000 grants of one key (each
    // with its release) keep the last 100 events.
    let mut sm = world();
    create_session(&mut sm, 3, session(S1, N1));
    let mut index = 3;
    for _ in 0..10_000 {
        write(&mut sm, index + 1, op::lock("k", "", S1));
        write(&mut sm, index + 2, op::unlock("k", "", S1));
        index += 2;
    }
    let kept = history(&sm, "k", LockKind::Key);
    assert_eq!(kept.len(), super::super::history::DEFAULT_PER_LOCK);
    assert_eq!(kept.last().map(|e| e.index), Some(index));
    assert_eq!(kept.first().map(|e| e.index), Some(index - 99));
    assert_eq!(sm.history().len(), 100);

    // And the total: 10,000 events over 1,000 locks, 5 per lock, 300 in all.
    let limits = Limits {
        per_lock: 5,
        total: 300,
    };
    let mut h = History::default();
    for i in 0..10_000u64 {
        let name = format!("l/{}", i % 1_000);
        h.record_within(&name, LockKind::Key, event(i), limits);
        assert!(h.len() <= 300);
    }
    let (found, index) = h.read("l/", true);
    assert_eq!(found.iter().map(|l| l.events.len()).sum::<usize>(), 300);
    assert!(found.iter().all(|l| l.events.len() <= 5));
    assert_eq!(index, 9_999);
    // The newest 300 events are the ones kept.
    let mut kept: Vec<u64> = found
        .iter()
        .flat_map(|l| l.events.iter().map(|e| e.index))
        .collect();
    kept.sort_unstable();
    assert_eq!(kept, (9_700..10_000).collect::<Vec<u64>>());
    // One busy lock over its own bound, beside the others.
    for i in 10_000..10_100u64 {
        h.record_within("busy", LockKind::Queue, event(i), limits);
    }
    let (busy, _) = h.read("busy", false);
    let busy: Vec<u64> = busy[0].events.iter().map(|e| e.index).collect();
    assert_eq!(busy, [10_095, 10_096, 10_097, 10_098, 10_099]);
    assert_eq!(h.len(), 300);
}

#[test]
fn the_history_is_in_snapshots() {
    let mut sm = world();
    create_session(&mut sm, 3, named(S1, "web-3"));
    write(&mut sm, 4, op::lock("k", "", S1));
    apply_at(&mut sm, 5, T0, enqueue("q", S1, 1));
    destroy_at(&mut sm, 6, T0, S1);
    let bytes = sm.encode().expect("encode");
    let back = StateMachine::decode(&bytes).expect("decode");
    assert_eq!(back, sm);
    let (found, _) = back.history().read("", true);
    let expected: Vec<LockHistory> = sm.history().read("", true).0;
    assert_eq!(found, expected);
    assert_eq!(found.len(), 2);
    // Recording goes on after a restore from the snapshot, in order.
    let mut back = back;
    create_session(&mut back, 7, named(S2, "web-4"));
    // After the lock-delay S1's loss armed.
    committed(kv_at(&mut back, 8, T0 + 15_000, vec![op::lock("k", "", S2)]).0);
    let indexes: Vec<u64> = history(&back, "k", LockKind::Key)
        .iter()
        .map(|e| e.index)
        .collect();
    assert_eq!(indexes, [4, 6, 6, 8]);
}
