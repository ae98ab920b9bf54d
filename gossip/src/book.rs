//! The member list as this node reports it: foca's notifications plus leave notices folded into
//! one row per gossip address, in Serf's states (Alive, Leaving, Left, Failed). Invariants: only
//! members of our datacenter are ever recorded; a row never goes back to an older generation; a
//! down member is Left exactly when a leave notice for that address and generation was seen
//! (before or after the `MemberDown`), Failed otherwise. Pure and clock-free: callers pass `now`.
//!
//! Node names are unique in what the book reports: foca keys members by address, so two
//! processes started with the same `--node` are two foca members, but [`MemberBook::snapshot`]
//! reports one row per name, the name's *holder* ([`MemberBook::refresh`] decides). A live member
//! keeps its name against a newcomer at another address (Serf refuses the newcomer the same way),
//! and while a name has a live holder, down rows of that name elsewhere are not reported: a
//! member that took a live node's name and then left or crashed must never make the leader
//! deregister or fail the live node. A holder that goes down keeps the name for the profile's
//! reclaim time (memberlist's `DeadNodeReclaimTime`) before a newcomer may take it, so the leader
//! sees the failure or the leave (and invalidates the old process's sessions) even when the node
//! was restarted at another address before anyone noticed the crash.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
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
    /// The member held its node name while live (see [`MemberBook::refresh`]): a member refused
    /// for taking a live node's name never speaks for that name, even once both are down.
    held: bool,
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
    /// The gossip address holding each node name (ours included), as of the last
    /// [`MemberBook::refresh`].
    holders: BTreeMap<Arc<str>, SocketAddr>,
    /// How long a holder that went down keeps its name against a newcomer.
    reclaim_after: Duration,
    /// When the next such grace ends (the holders must be recomputed then).
    next_reclaim: Option<Duration>,
    changed: bool,
}

impl MemberBook {
    /// An empty book; [`MemberBook::refresh`] it before the first snapshot.
    pub fn new(datacenter: impl Into<String>, reclaim_after: Duration) -> MemberBook {
        MemberBook {
            datacenter: datacenter.into(),
            rows: BTreeMap::new(),
            intents: BTreeMap::new(),
            holders: BTreeMap::new(),
            reclaim_after,
            next_reclaim: None,
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

    fn set(&mut self, mut id: Member, state: MemberState, now: Duration) {
        // A copy relayed by a member of the first release lacks the protocol level: the same
        // identity keeps the highest level heard of it.
        if let Some(old) = self.rows.get(&id.addr).filter(|o| o.id == id) {
            id.protocol = id.protocol.max(old.id.protocol);
        }
        let mut row = Row {
            id,
            state,
            since: now,
            held: false,
        };
        match self.rows.get(&row.id.addr) {
            Some(old)
                if old.id == row.id
                    && old.id.protocol == row.id.protocol
                    && old.state == row.state => {}
            old => {
                // A renewed identity at the same address is the same process.
                row.held = old.is_some_and(|o| o.held && o.id.name == row.id.name);
                self.rows.insert(row.id.addr, row);
                self.changed = true;
            }
        }
    }

    /// Takes the protocol level `id` states for itself in a packet it sent us: foca notifies a
    /// member once per identity, and keeps the first copy it learned, which a member of the
    /// first release relaying it carries without the level. Without this a server upgraded
    /// while such members gossip stays at the first level in our list, and the leader never
    /// raises the cluster's.
    pub fn heard_from(&mut self, id: &Member) {
        if let Some(row) = self.rows.get_mut(&id.addr).filter(|row| row.id == *id)
            && row.id.protocol < id.protocol
        {
            row.id.protocol = id.protocol;
            self.changed = true;
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
                // Force-left while alive, it refuted and is back: it never left, so a later
                // failure is a failure.
                if self.intent_for(id).is_some_and(|n| n.forced) {
                    self.intents.remove(&id.addr);
                }
                // A node that restarted on another port: its old down row is history, once the
                // leader had time to see it go.
                let moved: Vec<SocketAddr> = self
                    .rows
                    .values()
                    .filter(|r| r.id.name == id.name && r.id.addr != id.addr)
                    .filter(|r| !is_live(r.state) && r.since + self.reclaim_after <= now)
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
        let newer = self.intents.get(&notice.addr).is_none_or(|i| {
            i.notice.generation < notice.generation
                || (i.notice.generation == notice.generation && notice.prune && !i.notice.prune)
        });
        if newer {
            self.intents
                .insert(notice.addr, Intent { notice, since: now });
            // A prune changes what is listed even when the state does not change.
            self.changed |= notice.prune;
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

    /// Moves a Failed member named `name` to Left (with `prune`, also no longer listed) and
    /// returns the notice to spread. Already Left is fine (idempotent); a live member is refused.
    pub fn force_leave(
        &mut self,
        name: &str,
        prune: bool,
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
                    prune,
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

    /// Decides who holds each node name, after the rows changed or when a holder's grace ends;
    /// call after every batch of changes. For each name: a holder that went down within the
    /// reclaim time keeps it; otherwise the oldest live claim, `me` included (the lowest
    /// generation: generations start at the process start time), and it is marked as having
    /// held it; otherwise, among down rows, one that held the name, the newest first.
    /// Addresses break ties, so members with the same rows pick the same holder.
    pub fn refresh(&mut self, me: &Member, now: Duration) {
        let due = self.holders.is_empty() || self.next_reclaim.is_some_and(|t| now >= t);
        if !self.changed && !due {
            return;
        }
        let mut by_name: BTreeMap<&Arc<str>, Vec<&Row>> = BTreeMap::new();
        by_name.insert(&me.name, Vec::new());
        for row in self.rows.values() {
            by_name.entry(&row.id.name).or_default().push(row);
        }
        let grace_end = |r: &Row| r.since.saturating_add(self.reclaim_after);
        let mut holders = BTreeMap::new();
        let mut newly_held = Vec::new();
        let mut next_reclaim: Option<Duration> = None;
        for (name, rows) in by_name {
            let departed = rows
                .iter()
                .filter(|r| r.held && !is_live(r.state) && now < grace_end(r))
                .max_by_key(|r| (r.since, r.id.generation, Reverse(r.id.addr)));
            let oldest_live = rows
                .iter()
                .filter(|r| is_live(r.state))
                .map(|r| (r.id.generation, r.id.addr))
                .chain((*name == me.name).then_some((me.generation, me.addr)))
                .min();
            let holder = if let Some(r) = departed {
                let end = grace_end(r);
                next_reclaim = Some(next_reclaim.map_or(end, |t| t.min(end)));
                r.id.addr
            } else if let Some((_, addr)) = oldest_live {
                if addr != me.addr {
                    newly_held.push(addr);
                }
                addr
            } else if let Some(r) = rows
                .iter()
                .max_by_key(|r| (r.held, r.id.generation, Reverse(r.id.addr)))
            {
                r.id.addr
            } else {
                continue;
            };
            holders.insert(Arc::clone(name), holder);
        }
        for addr in newly_held {
            if let Some(row) = self.rows.get_mut(&addr) {
                row.held = true;
            }
        }
        if holders != self.holders {
            self.holders = holders;
            self.changed = true;
        }
        self.next_reclaim = next_reclaim;
    }

    /// The member list with `me` in `my_state`: the holder of each name, sorted by name. A node
    /// whose name is held by another member is not in its own list either: it is not admitted.
    pub fn snapshot(&self, me: &Member, my_state: MemberState) -> Vec<MemberStatus> {
        self.holders
            .values()
            .filter_map(|addr| match self.rows.get(addr) {
                _ if *addr == me.addr => Some(me.status(my_state)),
                Some(row) => Some(MemberStatus {
                    pruned: row.state == MemberState::Left
                        && self.intent_for(&row.id).is_some_and(|n| n.prune),
                    ..row.id.status(row.state)
                }),
                None => None,
            })
            .collect()
    }

    /// A live member other than `id`, at another address, that claims `id`'s name.
    pub fn rival(&self, id: &Member) -> Option<&Member> {
        self.rows
            .values()
            .find(|r| r.id.name == id.name && r.id.addr != id.addr && is_live(r.state))
            .map(|r| &r.id)
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

    /// Whether the book has a row for `addr` (live, or down and not yet reaped).
    pub fn knows(&self, addr: &SocketAddr) -> bool {
        self.rows.contains_key(addr)
    }

    pub fn is_live(&self, addr: &SocketAddr) -> bool {
        self.rows.get(addr).is_some_and(|r| is_live(r.state))
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

fn is_live(state: MemberState) -> bool {
    matches!(state, MemberState::Alive | MemberState::Leaving)
}

/// Whether `a` started before `b` (two live members claiming one name): the lower generation,
/// then the lower address. The one that started first holds the name.
pub fn starts_before(a: &Member, b: &Member) -> bool {
    (a.generation, a.addr) < (b.generation, b.addr)
}

#[cfg(test)]
mod tests {
    use vigil_shared::catalog::MemberRole;

    use crate::identity::FIRST_PROTOCOL;

    use super::*;

    const T0: Duration = Duration::ZERO;
    const RECLAIM: Duration = Duration::from_secs(1);

    fn id(port: u16, generation: u64) -> Member {
        Member {
            name: format!("n{port}").into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            rpc_addr: SocketAddr::from(([127, 0, 0, 1], port + 1000)),
            role: MemberRole::Client,
            datacenter: "dc1".into(),
            generation,
            protocol: 2,
        }
    }

    fn notice(m: &Member, forced: bool) -> LeaveNotice {
        LeaveNotice {
            addr: m.addr,
            generation: m.generation,
            forced,
            prune: false,
        }
    }

    fn book_with(m: &Member) -> MemberBook {
        let mut book = MemberBook::new("dc1", RECLAIM);
        book.apply(&OwnedNotification::MemberUp(m.clone()), T0);
        book
    }

    /// Down without a leave notice is Failed; with one, before or after, it is Left.
    #[test]
    fn down_is_failed_unless_a_leave_notice_comes_before_or_after() {
        enum Step {
            Down,
            Notice,
        }
        use MemberState::{Alive, Failed, Leaving, Left};
        let cases: [&[(Step, MemberState)]; 3] = [
            &[(Step::Down, Failed)],
            &[(Step::Notice, Leaving), (Step::Down, Left)],
            &[(Step::Down, Failed), (Step::Notice, Left)],
        ];
        for steps in cases {
            let m = id(1, 1);
            let mut book = book_with(&m);
            assert_eq!(book.state_of(&m.addr), Some(Alive));
            for (step, then) in steps {
                match step {
                    Step::Down => book.apply(&OwnedNotification::MemberDown(m.clone()), T0),
                    Step::Notice => book.leave_notice(notice(&m, false), T0),
                }
                assert_eq!(book.state_of(&m.addr), Some(*then));
            }
        }
    }

    #[test]
    fn a_member_first_heard_of_through_the_first_release_takes_the_level_it_states_itself() {
        let me = id(9, 1);
        let upgraded = id(1, 5);
        let relayed = Member {
            protocol: FIRST_PROTOCOL,
            ..upgraded.clone()
        };
        let mut book = book_with(&relayed);
        book.refresh(&me, T0);
        book.take_changed();
        let level = |book: &MemberBook| {
            let rows = book.snapshot(&me, MemberState::Alive);
            rows.iter()
                .find(|m| m.name == *upgraded.name)
                .map(|m| m.protocol)
        };
        assert_eq!(level(&book), Some(u32::from(FIRST_PROTOCOL)));
        // Another process at that address (an older generation) says nothing of this one.
        book.heard_from(&Member {
            protocol: 7,
            ..id(1, 4)
        });
        assert!(!book.take_changed());
        book.heard_from(&upgraded);
        assert!(book.take_changed(), "the list is published again");
        assert_eq!(level(&book), Some(2));
        // A copy that lacks the level never takes it back.
        book.heard_from(&relayed);
        assert!(!book.take_changed());
        assert_eq!(level(&book), Some(2));
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
            book.force_leave("n1", false, T0),
            Err(ForceLeaveRefusal::NotFailed(MemberState::Alive))
        );
        assert_eq!(
            book.force_leave("nobody", false, T0),
            Err(ForceLeaveRefusal::Unknown)
        );
        book.apply(&OwnedNotification::MemberDown(m.clone()), T0);
        assert_eq!(book.force_leave("n1", false, T0), Ok(notice(&m, true)));
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
        let mut book = MemberBook::new("dc1", RECLAIM);
        book.apply(&OwnedNotification::MemberUp(foreign.clone()), T0);
        assert_eq!(book.state_of(&foreign.addr), None);
        assert!(!book.take_changed());
    }

    fn named(port: u16, generation: u64, name: &str) -> Member {
        Member {
            name: name.into(),
            ..id(port, generation)
        }
    }

    /// Folds a notification in at T0 the way the node does (then decides the name holders).
    fn fold(book: &mut MemberBook, me: &Member, n: OwnedNotification<Member>) {
        fold_at(book, me, n, T0);
    }

    fn fold_at(book: &mut MemberBook, me: &Member, n: OwnedNotification<Member>, now: Duration) {
        book.apply(&n, now);
        book.refresh(me, now);
    }

    /// A book, as `me` keeps it, that has seen `members` come up in that order.
    fn seen_up(me: &Member, members: &[&Member]) -> MemberBook {
        let mut book = MemberBook::new("dc1", RECLAIM);
        for &member in members {
            fold(&mut book, me, OwnedNotification::MemberUp(member.clone()));
        }
        book
    }

    /// The rows named `name` in `book`'s member list, as (address, state).
    fn rows_of(book: &MemberBook, me: &Member, name: &str) -> Vec<(SocketAddr, MemberState)> {
        book.snapshot(me, MemberState::Alive)
            .into_iter()
            .filter(|s| s.name == name)
            .map(|s| (s.gossip_addr, s.state))
            .collect()
    }

    #[test]
    fn a_live_member_keeps_its_name_against_a_newcomer_elsewhere() {
        let me = id(9, 1);
        let (real, impostor) = (named(1, 10, "c1"), named(2, 20, "c1"));
        let mut book = seen_up(&me, &[&real, &impostor]);
        assert_eq!(book.rival(&impostor).map(|m| m.addr), Some(real.addr));
        assert_eq!(rows_of(&book, &me, "c1"), [(real.addr, MemberState::Alive)]);

        // The impostor leaves (or crashes): nothing about it is reported while c1 lives.
        book.leave_notice(notice(&impostor, false), T0);
        fold(
            &mut book,
            &me,
            OwnedNotification::MemberDown(impostor.clone()),
        );
        assert_eq!(book.state_of(&impostor.addr), Some(MemberState::Left));
        assert_eq!(rows_of(&book, &me, "c1"), [(real.addr, MemberState::Alive)]);

        // Both down: the one that held the name speaks for it, not the newer impostor.
        fold(&mut book, &me, OwnedNotification::MemberDown(real.clone()));
        assert_eq!(
            rows_of(&book, &me, "c1"),
            [(real.addr, MemberState::Failed)]
        );
    }

    #[test]
    fn a_newcomer_with_a_taken_name_is_not_in_its_own_list() {
        let (real, me) = (named(1, 10, "c1"), named(2, 20, "c1"));
        let book = seen_up(&me, &[&real]);
        assert_eq!(rows_of(&book, &me, "c1"), [(real.addr, MemberState::Alive)]);
        // The other way round, the older node keeps its own name.
        let (me, newcomer) = (real, named(2, 20, "c1"));
        let book = seen_up(&me, &[&newcomer]);
        assert_eq!(rows_of(&book, &me, "c1"), [(me.addr, MemberState::Alive)]);
    }

    #[test]
    fn a_restart_elsewhere_takes_the_name_once_the_old_process_was_seen_down() {
        let me = id(9, 1);
        let (old, new) = (named(1, 10, "c1"), named(2, 20, "c1"));
        let mut book = seen_up(&me, &[&old, &new]);
        assert_eq!(rows_of(&book, &me, "c1"), [(old.addr, MemberState::Alive)]);

        // The old process is declared down: its name is reported Failed (so the leader
        // invalidates its sessions) for the reclaim time before the new process takes it.
        let down = |book: &mut MemberBook, member: &Member, at| {
            fold_at(book, &me, OwnedNotification::MemberDown(member.clone()), at);
        };
        let down_at = Duration::from_secs(3);
        down(&mut book, &old, down_at);
        assert_eq!(rows_of(&book, &me, "c1"), [(old.addr, MemberState::Failed)]);
        book.refresh(&me, down_at + RECLAIM - Duration::from_millis(1));
        assert_eq!(rows_of(&book, &me, "c1"), [(old.addr, MemberState::Failed)]);
        book.take_changed();
        book.refresh(&me, down_at + RECLAIM);
        assert!(book.take_changed(), "the handover is published");
        assert_eq!(rows_of(&book, &me, "c1"), [(new.addr, MemberState::Alive)]);

        // Both held the name in turn: once both are down, the newer one speaks for it.
        let later = down_at + RECLAIM * 10;
        down(&mut book, &new, later);
        assert_eq!(rows_of(&book, &me, "c1"), [(new.addr, MemberState::Failed)]);
        book.refresh(&me, later + RECLAIM);
        assert_eq!(rows_of(&book, &me, "c1"), [(new.addr, MemberState::Failed)]);
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
        book.apply(&OwnedNotification::MemberUp(moved.clone()), RECLAIM);
        assert_eq!(book.state_of(&m.addr), None);
        let me = id(9, 1);
        book.refresh(&me, RECLAIM);
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
