//! Blocking-query wakeups. A waiter registers interest in a key, a prefix or a table before it
//! reads, then sleeps on its own channel. A write to key K wakes only the waiters on K itself
//! and on prefixes of K (found by walking K's prefixes), never everyone.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use vigil_shared::rpc::{QueryOptions, QueryResult, ServerError};

use crate::state::reads::Found;
use crate::state::{Effects, Interest};

/// The waiters on one key, prefix or table: most often one, kept without a table of its own
/// (a blocking query on a key nobody else watches is the common case, thousands at once).
#[derive(Default)]
enum Waiters {
    #[default]
    None,
    One(u64, oneshot::Sender<()>),
    /// Boxed: a table of waiters keyed by what they wait on holds one of these per key, most
    /// of them `One`.
    #[expect(
        clippy::box_collection,
        reason = "the table's header, not its entries, is what every key would hold"
    )]
    Many(Box<HashMap<u64, oneshot::Sender<()>>>),
}

impl Waiters {
    fn insert(&mut self, id: u64, tx: oneshot::Sender<()>) {
        match std::mem::take(self) {
            Waiters::None => *self = Waiters::One(id, tx),
            Waiters::One(first, first_tx) => {
                *self = Waiters::Many(Box::new(HashMap::from([(first, first_tx), (id, tx)])));
            }
            Waiters::Many(mut many) => {
                many.insert(id, tx);
                *self = Waiters::Many(many);
            }
        }
    }

    /// Takes waiter `id` out; whether none is left.
    fn remove(&mut self, id: u64) -> bool {
        match self {
            Waiters::One(one, _) if *one == id => *self = Waiters::None,
            Waiters::Many(many) => {
                many.remove(&id);
            }
            Waiters::None | Waiters::One(..) => {}
        }
        self.is_empty()
    }

    fn is_empty(&self) -> bool {
        match self {
            Waiters::None => true,
            Waiters::One(..) => false,
            Waiters::Many(many) => many.is_empty(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Waiters::None => 0,
            Waiters::One(..) => 1,
            Waiters::Many(many) => many.len(),
        }
    }
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    keys: HashMap<String, Waiters>,
    prefixes: HashMap<String, Waiters>,
    sessions: Waiters,
    catalog: Waiters,
    services: HashMap<String, Waiters>,
    queries: Waiters,
    acl: Waiters,
    lock_standings: HashMap<(String, String), Waiters>,
    lock_prefixes: HashMap<String, Waiters>,
}

impl Registry {
    /// The waiters on `interest`, made if there were none.
    fn slot(&mut self, interest: &Interest) -> Option<&mut Waiters> {
        match interest {
            Interest::Key(k) => Some(self.keys.entry(k.clone()).or_default()),
            Interest::Prefix(p) => Some(self.prefixes.entry(p.clone()).or_default()),
            Interest::Sessions => Some(&mut self.sessions),
            Interest::Catalog => Some(&mut self.catalog),
            Interest::Service(name) => Some(self.services.entry(name.clone()).or_default()),
            Interest::Queries => Some(&mut self.queries),
            Interest::Acl => Some(&mut self.acl),
            Interest::LockStanding { name, session } => Some(
                self.lock_standings
                    .entry((name.clone(), session.clone()))
                    .or_default(),
            ),
            Interest::Locks(prefix) => Some(self.lock_prefixes.entry(prefix.clone()).or_default()),
            Interest::None => None,
        }
    }

    /// Takes waiter `id` on `interest` out, and the waiters' entry with it when it was the
    /// last.
    fn unregister(&mut self, interest: &Interest, id: u64) {
        fn from_map<K, Q>(map: &mut HashMap<K, Waiters>, key: &Q, id: u64)
        where
            K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
            Q: std::hash::Hash + Eq + ?Sized,
        {
            if map.get_mut(key).is_some_and(|waiters| waiters.remove(id)) {
                map.remove(key);
            }
        }
        match interest {
            Interest::Key(k) => from_map(&mut self.keys, k.as_str(), id),
            Interest::Prefix(p) => from_map(&mut self.prefixes, p.as_str(), id),
            Interest::Service(name) => from_map(&mut self.services, name.as_str(), id),
            Interest::LockStanding { name, session } => {
                from_map(
                    &mut self.lock_standings,
                    &(name.clone(), session.clone()),
                    id,
                );
            }
            Interest::Locks(prefix) => from_map(&mut self.lock_prefixes, prefix.as_str(), id),
            Interest::Sessions => {
                self.sessions.remove(id);
            }
            Interest::Catalog => {
                self.catalog.remove(id);
            }
            Interest::Queries => {
                self.queries.remove(id);
            }
            Interest::Acl => {
                self.acl.remove(id);
            }
            Interest::None => {}
        }
    }
}

/// Wakes the waiters in `slots` on every prefix of `name` (itself included).
fn wake_prefixes(slots: &mut HashMap<String, Waiters>, name: &str) {
    if slots.is_empty() {
        return;
    }
    for (at, _) in name
        .char_indices()
        .chain(std::iter::once((name.len(), ' ')))
    {
        if let Some(w) = slots.remove(&name[..at]) {
            wake_all(w);
        }
    }
}

fn wake_all(waiters: Waiters) {
    // A receiver that went away has nothing left to wake.
    match waiters {
        Waiters::None => {}
        Waiters::One(_, tx) => {
            let _ = tx.send(());
        }
        Waiters::Many(many) => {
            for (_, tx) in *many {
                let _ = tx.send(());
            }
        }
    }
}

/// The set of blocked readers on one server.
#[derive(Default)]
pub struct Watches {
    inner: Mutex<Registry>,
}

/// A registered waiter; unregisters itself when dropped. It borrows what it waits on: a
/// waiting read holds its interest once.
pub struct WatchGuard<'a> {
    id: u64,
    interest: &'a Interest,
    watches: &'a Watches,
    rx: Option<oneshot::Receiver<()>>,
}

impl WatchGuard<'_> {
    /// Resolves when a relevant write is applied (or at once for `Interest::None`, never).
    pub async fn fired(&mut self) {
        match self.rx.as_mut() {
            Some(rx) => {
                // A dropped sender also means "look again".
                let _ = rx.await;
                self.rx = None;
            }
            None => std::future::pending().await,
        }
    }
}

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        self.watches.lock().unregister(self.interest, self.id);
    }
}

impl Watches {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Registry> {
        // The registry holds no invariants a panicking holder could break.
        self.inner.lock()
    }

    /// Registers interest; register *before* reading state so no write can slip between.
    pub fn register<'a>(&'a self, interest: &'a Interest) -> WatchGuard<'a> {
        let mut reg = self.lock();
        reg.next_id += 1;
        let id = reg.next_id;
        let rx = reg.slot(interest).map(|waiters| {
            let (tx, rx) = oneshot::channel();
            waiters.insert(id, tx);
            rx
        });
        drop(reg);
        WatchGuard {
            id,
            interest,
            watches: self,
            rx,
        }
    }

    /// Wakes the waiters that an applied command's effects concern.
    pub fn notify(&self, fx: &Effects) {
        if fx.kv_keys.is_empty()
            && !fx.sessions_changed
            && !fx.catalog_changed
            && !fx.queries_changed
            && !fx.acl_changed
            && fx.locks.changed.is_empty()
        {
            return;
        }
        let mut reg = self.lock();
        for key in &fx.kv_keys {
            if let Some(w) = reg.keys.remove(key.as_str()) {
                wake_all(w);
            }
            wake_prefixes(&mut reg.prefixes, key);
            wake_prefixes(&mut reg.lock_prefixes, key);
        }
        for name in &fx.locks.changed {
            wake_prefixes(&mut reg.lock_prefixes, name);
        }
        for (name, session) in &fx.locks.standings {
            let key = (name.clone(), session.to_ascii_lowercase());
            if let Some(w) = reg.lock_standings.remove(&key) {
                wake_all(w);
            }
        }
        if fx.sessions_changed {
            wake_all(std::mem::take(&mut reg.sessions));
        }
        if fx.catalog_changed {
            wake_all(std::mem::take(&mut reg.catalog));
        }
        for name in &fx.services_changed {
            if let Some(w) = reg.services.remove(name) {
                wake_all(w);
            }
        }
        if fx.queries_changed {
            wake_all(std::mem::take(&mut reg.queries));
        }
        if fx.acl_changed {
            wake_all(std::mem::take(&mut reg.acl));
        }
    }

    /// Wakes every waiter (after a snapshot install replaced the whole state).
    pub fn wake_everyone(&self) {
        let mut reg = self.lock();
        for (_, w) in reg.keys.drain() {
            wake_all(w);
        }
        for (_, w) in reg.prefixes.drain() {
            wake_all(w);
        }
        for (_, w) in reg.services.drain() {
            wake_all(w);
        }
        for (_, w) in reg.lock_standings.drain() {
            wake_all(w);
        }
        for (_, w) in reg.lock_prefixes.drain() {
            wake_all(w);
        }
        wake_all(std::mem::take(&mut reg.sessions));
        wake_all(std::mem::take(&mut reg.catalog));
        wake_all(std::mem::take(&mut reg.queries));
        wake_all(std::mem::take(&mut reg.acl));
    }

    /// Number of registered waiters (leak checks in tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        let reg = self.lock();
        reg.keys.values().map(Waiters::len).sum::<usize>()
            + reg.prefixes.values().map(Waiters::len).sum::<usize>()
            + reg.services.values().map(Waiters::len).sum::<usize>()
            + reg.lock_standings.values().map(Waiters::len).sum::<usize>()
            + reg.lock_prefixes.values().map(Waiters::len).sum::<usize>()
            + reg.sessions.len()
            + reg.catalog.len()
            + reg.queries.len()
            + reg.acl.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Answers a read with `read` (one look at the state: what it found), blocking while the
/// index found is not above `opts.min_index`, for `opts.wait_ms` at most or until `stop`: its
/// [`first_look`], then, if it waits, [`Waiting::wait`]. The in-memory test double blocks
/// here; the server takes the two steps itself, the first one boxed, so a waiting read holds no
/// more than its [`Waiting`].
pub async fn blocking_read<P>(
    watches: &Arc<Watches>,
    opts: QueryOptions,
    read: impl Fn() -> Found<QueryResult>,
    admit: impl FnOnce(&Found<QueryResult>) -> Result<P, ServerError>,
    stop: &CancellationToken,
) -> Result<(QueryResult, u64), ServerError> {
    // The answer is not kept in a variable that lives across the wait (it is a few hundred
    // bytes).
    let waiting = match first_look(opts, &read, admit)? {
        Look::Answer(output, index) => return Ok((output, index)),
        Look::Wait(waiting) => waiting,
    };
    Ok(waiting.wait(watches, read, stop).await)
}

/// What a blocking read found on its first look: its answer, or that it waits.
#[expect(
    clippy::large_enum_variant,
    reason = "taken apart at once; boxing it would cost every read an allocation"
)]
pub enum Look<P> {
    Answer(QueryResult, u64),
    Wait(Waiting<P>),
}

/// A blocking read that found nothing new: what wakes it, the index it waits to pass and by
/// when, and what `admit` returned (a slot), held until it is answered. The read itself is its
/// caller's, who looks again with it ([`Waiting::wait`]).
pub struct Waiting<P> {
    interest: Interest,
    min_index: u64,
    deadline: Instant,
    _admitted: P,
}

/// The first look of a read with `read`: its answer unless it has an index, something to wait
/// on (the interest the read names), found nothing above the index and has time left to wait
/// (`opts.wait_ms`, counted from now). A read that waits does so only once `admit` lets it: it
/// is asked here, and what it returns is held until the read is answered.
pub fn first_look<P>(
    opts: QueryOptions,
    read: impl Fn() -> Found<QueryResult>,
    admit: impl FnOnce(&Found<QueryResult>) -> Result<P, ServerError>,
) -> Result<Look<P>, ServerError> {
    let deadline = Instant::now() + Duration::from_millis(opts.wait_ms);
    let first = read();
    if opts.min_index == 0
        || first.interest == Interest::None
        || first.index > opts.min_index
        || Instant::now() >= deadline
    {
        return Ok(Look::Answer(first.output, first.index));
    }
    let admitted = admit(&first)?;
    Ok(Look::Wait(Waiting {
        interest: first.interest,
        min_index: opts.min_index,
        deadline,
        _admitted: admitted,
    }))
}

impl<P> Waiting<P> {
    /// Waits until a write concerning the read (on `watches`) moves its index above the one it
    /// waits to pass, the deadline, or `stop`, and answers what `read` then finds. Consul's
    /// rule for a result that is missing: still missing after it was missing, it blocks on,
    /// rather than waking for unrelated index movement.
    #[expect(
        clippy::manual_async_fn,
        reason = "an `async fn` would keep its arguments twice"
    )]
    pub fn wait<'a>(
        self,
        watches: &'a Arc<Watches>,
        read: impl Fn() -> Found<QueryResult> + 'a,
        stop: &'a CancellationToken,
    ) -> impl Future<Output = (QueryResult, u64)> + 'a
    where
        P: 'a,
    {
        async move {
            // All of it is kept until the read is answered, its slot (`_admitted`) with it:
            // the block captures `self` whole, not the fields it reads.
            let waiting = &self;
            let expiry = tokio::time::sleep_until(waiting.deadline);
            tokio::pin!(expiry);
            let mut min_index = waiting.min_index;
            let mut was_missing = false;
            loop {
                // Registered before the read, so no write can slip between the two.
                let mut guard = watches.register(&waiting.interest);
                if let Some(answer) =
                    look_again(&read, &mut min_index, &mut was_missing, waiting.deadline)
                {
                    return answer;
                }
                tokio::select! {
                    _ = guard.fired() => {}
                    () = &mut expiry => {}
                    _ = stop.cancelled() => {
                        let found = read();
                        return (found.output, found.index);
                    }
                }
            }
        }
    }
}

/// One more look of a waiting read: its answer if the index moved past `min_index` (or the
/// deadline passed). Not kept across the wait: a waiter holds its registration, not a copy of
/// the answer (a service's health, a prefix's entries), which is read again when it wakes.
fn look_again(
    read: impl Fn() -> Found<QueryResult>,
    min_index: &mut u64,
    was_missing: &mut bool,
    deadline: Instant,
) -> Option<(QueryResult, u64)> {
    let found = read();
    if found.missing && *was_missing {
        *min_index = (*min_index).max(found.index);
    }
    if found.index > *min_index || Instant::now() >= deadline {
        return Some((found.output, found.index));
    }
    *was_missing = found.missing;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touched(keys: &[&str]) -> Effects {
        Effects {
            kv_keys: keys.iter().map(|k| k.to_string()).collect(),
            ..Effects::default()
        }
    }

    fn has_fired(g: &mut WatchGuard<'_>) -> bool {
        g.rx.as_mut().is_some_and(|rx| rx.try_recv().is_ok())
    }

    #[test]
    fn a_write_wakes_only_its_key_and_prefixes() {
        let w = Arc::new(Watches::default());
        let interests = [
            Interest::Key("foo".into()),
            Interest::Prefix("fo".into()),
            Interest::Prefix(String::new()),
            Interest::Prefix("bar".into()),
            Interest::Sessions,
        ];
        let [
            mut exact_foo,
            mut prefix_fo,
            mut prefix_root,
            mut prefix_bar,
            mut sessions,
        ] = interests.each_ref().map(|interest| w.register(interest));

        // A write below foo must not wake a waiter on exactly foo (Consul issue 1626).
        w.notify(&touched(&["foo/bar"]));
        assert!(!has_fired(&mut exact_foo));
        assert!(has_fired(&mut prefix_fo));
        assert!(has_fired(&mut prefix_root));
        assert!(!has_fired(&mut prefix_bar));
        assert!(!has_fired(&mut sessions));

        // A write to foo itself does.
        w.notify(&touched(&["foo"]));
        assert!(has_fired(&mut exact_foo));
    }

    #[test]
    fn a_service_change_wakes_only_that_service() {
        let w = Arc::new(Watches::default());
        let interests = [
            Interest::Service("web".into()),
            Interest::Service("db".into()),
            Interest::Catalog,
            Interest::Queries,
        ];
        let [mut web, mut db, mut catalog, mut queries] =
            interests.each_ref().map(|interest| w.register(interest));

        w.notify(&Effects {
            catalog_changed: true,
            services_changed: vec!["web".into()],
            ..Effects::default()
        });
        assert!(has_fired(&mut web));
        assert!(!has_fired(&mut db));
        assert!(has_fired(&mut catalog));
        assert!(!has_fired(&mut queries));

        w.notify(&Effects {
            queries_changed: true,
            ..Effects::default()
        });
        assert!(has_fired(&mut queries));
        assert!(!has_fired(&mut db));
    }

    #[test]
    fn a_lock_standing_wakes_only_its_own_session_whatever_the_case_it_was_asked_in() {
        let w = Arc::new(Watches::default());
        let standing = |session: &str| {
            use crate::state::reads::StateRead as _;
            let read = vigil_shared::rpc::reads::LockStanding {
                name: "l".into(),
                session: session.into(),
            };
            read.read(&crate::state::StateMachine::default()).interest
        };
        let interests = [
            standing("5B0A-AA"),
            standing("5b0a-bb"),
            Interest::Locks("l".into()),
        ];
        let [mut mine, mut other, mut report] =
            interests.each_ref().map(|interest| w.register(interest));
        let mut fx = Effects::default();
        fx.locks.changed.push("l".into());
        fx.locks.standings.push(("l".into(), "5b0a-aa".into()));
        w.notify(&fx);
        assert!(has_fired(&mut mine));
        assert!(!has_fired(&mut other));
        assert!(has_fired(&mut report));
    }

    /// What `admit` returned (a server's blocking slot) is held for as long as the read waits,
    /// and given back once it is answered, or once its caller leaves.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_read_holds_what_admitted_it_until_it_is_answered() {
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

        let watches = Arc::new(Watches::default());
        let index = Arc::new(AtomicU64::new(5));
        let slots = Arc::new(AtomicUsize::new(0));
        struct Slot(Arc<AtomicUsize>);
        impl Drop for Slot {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let start = |stop: CancellationToken| {
            let (watches, index, slots) = (watches.clone(), index.clone(), slots.clone());
            tokio::spawn(async move {
                let opts = QueryOptions {
                    min_index: 5,
                    wait_ms: 60_000,
                    ..QueryOptions::default()
                };
                let read = || Found {
                    output: QueryResult::Keys(Vec::new()),
                    index: index.load(Ordering::SeqCst),
                    interest: Interest::Key("k".into()),
                    missing: false,
                };
                let admit = |_: &Found<QueryResult>| {
                    slots.fetch_add(1, Ordering::SeqCst);
                    Ok(Slot(slots.clone()))
                };
                blocking_read(&watches, opts, read, admit, &stop).await
            })
        };
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };

        let answered = start(CancellationToken::new());
        let abandoned = start(CancellationToken::new());
        settle().await;
        assert_eq!(
            slots.load(Ordering::SeqCst),
            2,
            "both wait, each in its slot"
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        settle().await;
        assert_eq!(slots.load(Ordering::SeqCst), 2, "still waiting, still held");

        abandoned.abort();
        let _ = abandoned.await;
        assert_eq!(
            slots.load(Ordering::SeqCst),
            1,
            "a caller that leaves gives its slot back"
        );

        index.store(6, Ordering::SeqCst);
        watches.notify(&touched(&["k"]));
        let (_, at) = answered.await.expect("join").expect("answered");
        assert_eq!(at, 6);
        assert_eq!(
            slots.load(Ordering::SeqCst),
            0,
            "an answered read gives its slot back"
        );
    }

    #[test]
    fn dropped_waiters_unregister() {
        let w = Arc::new(Watches::default());
        let (key, prefix) = (Interest::Key("a".into()), Interest::Prefix("a".into()));
        let g1 = w.register(&key);
        let g2 = w.register(&prefix);
        let g3 = w.register(&Interest::Catalog);
        assert_eq!(w.len(), 3);
        drop((g1, g2, g3));
        assert!(w.is_empty());
        assert!(w.lock().keys.is_empty() && w.lock().prefixes.is_empty());
    }

    /// A key's waiters are kept inline while there is one, in a table from the second on;
    /// each is woken, and each that leaves unregisters, in any order.
    #[test]
    fn one_waiter_or_many_on_a_key_each_wakes_and_each_unregisters() {
        let w = Arc::new(Watches::default());
        let key = Interest::Key("k".into());
        let mut first = w.register(&key);
        let mut second = w.register(&key);
        let third = w.register(&key);
        assert_eq!(w.len(), 3);
        drop(third);
        assert_eq!(w.len(), 2);
        w.notify(&touched(&["k"]));
        assert!(has_fired(&mut first) && has_fired(&mut second));
        drop((first, second));
        assert!(w.is_empty());

        let lone = w.register(&key);
        let other = w.register(&key);
        drop(lone);
        assert_eq!(w.len(), 1);
        drop(other);
        assert!(
            w.is_empty() && w.lock().keys.is_empty(),
            "the key's entry goes with its last waiter"
        );
        let mut again = w.register(&key);
        w.notify(&touched(&["k"]));
        assert!(has_fired(&mut again));
    }
}
