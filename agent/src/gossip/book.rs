//! The member list as this node reports it: foca's notifications plus leave notices folded into
//! one row per gossip address, in Serf's states (Alive, Leaving, Left, Failed). Invariants: only
//! members of our datacenter are ever recorded; a row never goes back to an older generation; a
//! down member is Left exactly when a leave notice for that address and generation was seen
//! (before or after the `MemberDown`), Failed otherwise. Pure and clock-free: callers pass `now`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use foca::OwnedNotification;
use vigil_shared::catalog::{MemberState, MemberStatus};

use super::identity::Member;
use super::leave::LeaveNotice;

#[derive(Debug, Clone)]
struct Row {
    id: Member,
    state: MemberState,
    /// When the row last changed state; down rows are reaped some time after it.
    since: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Intent {
    notice: LeaveNotice,
    since: Duration,
}

/// Why a force-leave was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForceLeaveRefusal {
    Unknown,
    NotFailed(MemberState),
}

#[derive(Debug)]
pub struct MemberBook {
    datacenter: String,
    /// Keyed like foca (by gossip address); a BTreeMap so iteration order is deterministic.
    rows: BTreeMap<SocketAddr, Row>,
    /// Newest leave notice per address, kept even before (or without) a matching row because
    /// the notice and the `MemberDown` may arrive in either order.
    intents: BTreeMap<SocketAddr, Intent>,
    changed: bool,
}

impl MemberBook {
    pub fn new(datacenter: impl Into<String>) -> MemberBook {
        MemberBook {
            datacenter: datacenter.into(),
            rows: BTreeMap::new(),
            intents: BTreeMap::new(),
            changed: false,
        }
    }

    fn ours(&self, id: &Member) -> bool {
        *id.datacenter == *self.datacenter
    }

    fn intent_for(&self, id: &Member) -> Option<LeaveNotice> {
        self.intents
            .get(&id.addr)
            .map(|i| i.notice)
            .filter(|n| n.generation == id.generation)
    }

    fn set(&mut self, id: Member, state: MemberState, now: Duration) {
        let row = Row {
            id,
            state,
            since: now,
        };
        match self.rows.get(&row.id.addr) {
            Some(old) if old.id == row.id && old.state == row.state => {}
            _ => {
                self.rows.insert(row.id.addr, row);
                self.changed = true;
            }
        }
    }

    /// Folds one foca notification in. Notifications about ourselves never reach here as rows
    /// (foca does not report its own identity as a member).
    pub fn apply(&mut self, notification: &OwnedNotification<Member>, now: Duration) {
        match notification {
            OwnedNotification::MemberUp(id) => {
                if !self.ours(id) || self.is_stale(id) {
                    return;
                }
                // A node that restarted on another port: its old down row is history.
                let moved: Vec<SocketAddr> = self
                    .rows
                    .values()
                    .filter(|r| r.id.name == id.name && r.id.addr != id.addr)
                    .filter(|r| matches!(r.state, MemberState::Left | MemberState::Failed))
                    .map(|r| r.id.addr)
                    .collect();
                for addr in moved {
                    self.rows.remove(&addr);
                    self.changed = true;
                }
                let state = match self.intent_for(id) {
                    Some(n) if !n.forced => MemberState::Leaving,
                    _ => MemberState::Alive,
                };
                self.set(id.clone(), state, now);
            }
            OwnedNotification::MemberDown(id) => {
                if !self.ours(id) || self.is_stale(id) {
                    return;
                }
                let state = if self.intent_for(id).is_some() {
                    MemberState::Left
                } else {
                    MemberState::Failed
                };
                self.set(id.clone(), state, now);
            }
            OwnedNotification::Rename(_old, new) => {
                // Same address, newer identity; the state follows with MemberUp/MemberDown when
                // it changes, so only the identity is swapped here.
                if !self.ours(new) || self.is_stale(new) {
                    return;
                }
                if let Some(row) = self.rows.get(&new.addr) {
                    let state = row.state;
                    self.set(new.clone(), state, now);
                }
            }
            _ => {}
        }
    }

    /// Whether `id` is older than what the row for its address already holds.
    fn is_stale(&self, id: &Member) -> bool {
        self.rows
            .get(&id.addr)
            .is_some_and(|row| row.id.generation > id.generation)
    }

    /// Records a leave notice and reclassifies the member it names.
    pub fn leave_notice(&mut self, notice: LeaveNotice, now: Duration) {
        let newer = self
            .intents
            .get(&notice.addr)
            .is_none_or(|i| i.notice.generation < notice.generation);
        if newer {
            self.intents
                .insert(notice.addr, Intent { notice, since: now });
        }
        let Some(row) = self.rows.get(&notice.addr) else {
            return;
        };
        if row.id.generation != notice.generation {
            return;
        }
        let next = match row.state {
            MemberState::Failed => MemberState::Left,
            MemberState::Alive if !notice.forced => MemberState::Leaving,
            other => other,
        };
        let id = row.id.clone();
        self.set(id, next, now);
    }

    /// Moves a Failed member named `name` to Left and returns the notice to spread. Already
    /// Left is fine (idempotent); a live member is refused.
    pub fn force_leave(
        &mut self,
        name: &str,
        now: Duration,
    ) -> Result<LeaveNotice, ForceLeaveRefusal> {
        // Prefer a failed row when an old and a new address share the name.
        let row = self
            .rows
            .values()
            .filter(|r| &*r.id.name == name)
            .min_by_key(|r| match r.state {
                MemberState::Failed => 0,
                MemberState::Left => 1,
                _ => 2,
            })
            .ok_or(ForceLeaveRefusal::Unknown)?;
        match row.state {
            MemberState::Failed | MemberState::Left => {
                let notice = LeaveNotice {
                    addr: row.id.addr,
                    generation: row.id.generation,
                    forced: true,
                };
                self.leave_notice(notice, now);
                Ok(notice)
            }
            other => Err(ForceLeaveRefusal::NotFailed(other)),
        }
    }

    /// Forgets down rows (and orphan notices) older than `after`.
    pub fn reap(&mut self, now: Duration, after: Duration) {
        let expired = |since: Duration| since.saturating_add(after) <= now;
        let before = self.rows.len();
        self.rows.retain(|_, r| {
            matches!(r.state, MemberState::Alive | MemberState::Leaving) || !expired(r.since)
        });
        if self.rows.len() != before {
            self.changed = true;
        }
        let rows = &self.rows;
        self.intents
            .retain(|addr, i| rows.contains_key(addr) || !expired(i.since));
    }

    /// The member list with `me` in `my_state`, sorted by name then address.
    pub fn snapshot(&self, me: &Member, my_state: MemberState) -> Vec<MemberStatus> {
        let mut list: Vec<MemberStatus> = std::iter::once(me.status(my_state))
            .chain(self.rows.values().map(|r| r.id.status(r.state)))
            .collect();
        list.sort_by(|a, b| (&a.name, a.gossip_addr).cmp(&(&b.name, b.gossip_addr)));
        list
    }

    /// Gossip addresses of live members (Alive or Leaving).
    pub fn live_addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.rows
            .values()
            .filter(|r| matches!(r.state, MemberState::Alive | MemberState::Leaving))
            .map(|r| r.id.addr)
    }

    /// Every gossip address we have a row for, live or down.
    pub fn known_addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.rows.keys().copied()
    }

    pub fn is_live(&self, addr: &SocketAddr) -> bool {
        self.rows
            .get(addr)
            .is_some_and(|r| matches!(r.state, MemberState::Alive | MemberState::Leaving))
    }

    /// The state of the member at `addr`, if we know it.
    #[cfg(test)]
    pub fn state_of(&self, addr: &SocketAddr) -> Option<MemberState> {
        self.rows.get(addr).map(|r| r.state)
    }

    /// Whether the list changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests {
    use vigil_shared::catalog::MemberRole;

    use super::*;

    const T0: Duration = Duration::ZERO;

    fn id(port: u16, generation: u64) -> Member {
        Member {
            name: format!("n{port}").into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            rpc_addr: SocketAddr::from(([127, 0, 0, 1], port + 1000)),
            role: MemberRole::Client,
            datacenter: "dc1".into(),
            generation,
        }
    }

    fn notice(m: &Member, forced: bool) -> LeaveNotice {
        LeaveNotice {
            addr: m.addr,
            generation: m.generation,
            forced,
        }
    }

    fn book_with(m: &Member) -> MemberBook {
        let mut book = MemberBook::new("dc1");
        book.apply(&OwnedNotification::MemberUp(m.clone()), T0);
        book
    }

    #[test]
    fn down_without_notice_is_failed() {
        let m = id(1, 1);
        let mut book = book_with(&m);
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Alive));
        book.apply(&OwnedNotification::MemberDown(m.clone()), T0);
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Failed));
    }

    #[test]
    fn notice_then_down_is_left() {
        let m = id(1, 1);
        let mut book = book_with(&m);
        book.leave_notice(notice(&m, false), T0);
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Leaving));
        book.apply(&OwnedNotification::MemberDown(m.clone()), T0);
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Left));
    }

    #[test]
    fn down_then_notice_is_left() {
        let m = id(1, 1);
        let mut book = book_with(&m);
        book.apply(&OwnedNotification::MemberDown(m.clone()), T0);
        book.leave_notice(notice(&m, false), T0);
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Left));
    }

    #[test]
    fn a_notice_for_an_older_generation_does_not_bury_a_restart() {
        let old = id(1, 1);
        let new = id(1, 2);
        let mut book = book_with(&old);
        book.apply(&OwnedNotification::Rename(old.clone(), new.clone()), T0);
        book.leave_notice(notice(&old, false), T0);
        assert_eq!(book.state_of(&new.addr), Some(MemberState::Alive));
        book.apply(&OwnedNotification::MemberDown(new.clone()), T0);
        assert_eq!(book.state_of(&new.addr), Some(MemberState::Failed));
        // And the old generation's MemberDown is stale once the new one is known.
        book.apply(&OwnedNotification::MemberUp(new.clone()), T0);
        book.apply(&OwnedNotification::MemberDown(old), T0);
        assert_eq!(book.state_of(&new.addr), Some(MemberState::Alive));
    }

    #[test]
    fn force_leave_only_moves_failed_members() {
        let m = id(1, 1);
        let mut book = book_with(&m);
        assert_eq!(
            book.force_leave("n1", T0),
            Err(ForceLeaveRefusal::NotFailed(MemberState::Alive))
        );
        assert_eq!(
            book.force_leave("nobody", T0),
            Err(ForceLeaveRefusal::Unknown)
        );
        book.apply(&OwnedNotification::MemberDown(m.clone()), T0);
        assert_eq!(book.force_leave("n1", T0), Ok(notice(&m, true)));
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Left));
        // A forced notice never makes a live member look like it is leaving.
        let live = id(2, 1);
        book.apply(&OwnedNotification::MemberUp(live.clone()), T0);
        book.leave_notice(notice(&live, true), T0);
        assert_eq!(book.state_of(&live.addr), Some(MemberState::Alive));
    }

    #[test]
    fn other_datacenters_are_ignored() {
        let mut foreign = id(1, 1);
        foreign.datacenter = "dc2".into();
        let mut book = MemberBook::new("dc1");
        book.apply(&OwnedNotification::MemberUp(foreign.clone()), T0);
        assert_eq!(book.state_of(&foreign.addr), None);
        assert!(!book.take_changed());
    }

    #[test]
    fn down_rows_are_reaped_and_restarts_elsewhere_replace_them() {
        let m = id(1, 1);
        let mut book = book_with(&m);
        book.apply(
            &OwnedNotification::MemberDown(m.clone()),
            Duration::from_secs(1),
        );
        book.reap(Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(book.state_of(&m.addr), Some(MemberState::Failed));
        book.reap(Duration::from_secs(11), Duration::from_secs(10));
        assert_eq!(book.state_of(&m.addr), None);

        let mut book = book_with(&m);
        book.apply(&OwnedNotification::MemberDown(m.clone()), T0);
        let mut moved = id(2, 5);
        moved.name = m.name.clone();
        book.apply(&OwnedNotification::MemberUp(moved.clone()), T0);
        assert_eq!(book.state_of(&m.addr), None);
        let me = id(9, 1);
        let names: Vec<_> = book
            .snapshot(&me, MemberState::Alive)
            .into_iter()
            .map(|s| (s.name, s.state))
            .collect();
        assert_eq!(
            names,
            [
                ("n1".to_string(), MemberState::Alive),
                ("n9".to_string(), MemberState::Alive)
            ]
        );
    }
}
