//! etcd's client-side lock recipe, as its Go `clientv3/concurrency` package (3.4) implements it,
//! over the `etcd-client` crate: a [`Session`] is a lease kept alive every TTL/3, and
//! [`Mutex`] is `concurrency.Mutex` — each contender puts `<prefix>/<lease in hex>` with its
//! lease; the owner is the key with the smallest create revision; a waiter watches the key just
//! before its own (the last one created before it) until it is deleted. Every RPC goes through
//! [`Counters`], so a workload can report requests sent (and watch wakeups) per acquisition.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::task::JoinHandle;

/// Requests sent and watch responses carrying events, summed over every user of a clone.
#[derive(Debug, Default)]
pub struct Counters {
    requests: AtomicU64,
    wakeups: AtomicU64,
}

impl Counters {
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }
}

/// A lease kept alive in the background (`concurrency.Session`). Dropping it stops the
/// keep-alives without revoking, as a crashed client would.
pub struct Session {
    lease: i64,
    keepalive: JoinHandle<()>,
}

impl Session {
    pub async fn new(client: &Client, ttl: Duration, counters: &Arc<Counters>) -> Result<Session> {
        let mut client = client.clone();
        let ttl_secs = i64::try_from(ttl.as_secs())?;
        counters.request();
        let lease = client.lease_grant(ttl_secs, None).await?.id();
        counters.request();
        let (mut keeper, mut responses) = client.lease_keep_alive(lease).await?;
        let counters = counters.clone();
        let keepalive = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                counters.request();
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                if !matches!(responses.message().await, Ok(Some(_))) {
                    return;
                }
            }
        });
        Ok(Session { lease, keepalive })
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// `concurrency.Mutex` on a prefix, for one session.
pub struct Mutex {
    client: Client,
    /// `<prefix>/`.
    prefix: String,
    /// `<prefix>/<lease in hex>`.
    key: String,
    lease: i64,
    counters: Arc<Counters>,
}

impl Mutex {
    pub fn new(
        client: &Client,
        prefix: &str,
        session: &Session,
        counters: &Arc<Counters>,
    ) -> Mutex {
        let prefix = format!("{prefix}/");
        Mutex {
            client: client.clone(),
            key: format!("{prefix}{:x}", session.lease()),
            prefix,
            lease: session.lease(),
            counters: counters.clone(),
        }
    }

    /// `Mutex.Lock`: queue up (one transaction that also reads the owner, so the uncontended
    /// path is a single RPC), then wait for every earlier contender's key to go. Returns the
    /// create revision of the contender's key, the holder's fencing token (larger than any
    /// earlier holder's: each holder's key is created after the one before it was).
    pub async fn lock(&mut self) -> Result<i64> {
        let first_created = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    self.key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                TxnOp::get(self.prefix.as_str(), Some(first_created.clone())),
            ])
            .or_else([
                TxnOp::get(self.key.as_str(), None),
                TxnOp::get(self.prefix.as_str(), Some(first_created)),
            ]);
        self.counters.request();
        let resp = self.client.txn(txn).await?;
        let header_rev = resp.header().context("txn header")?.revision();
        let ranges: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(get) => Some(get),
                _ => None,
            })
            .collect();
        let my_rev = if resp.succeeded() {
            header_rev
        } else {
            ranges
                .first()
                .and_then(|r| r.kvs().first())
                .context("own key missing")?
                .create_revision()
        };
        let owner = ranges.last().context("owner range")?.kvs();
        if owner.is_empty() || owner[0].create_revision() == my_rev {
            return Ok(my_rev);
        }
        self.wait_deletes(my_rev - 1).await?;
        // The session may have expired while waiting: the key must still be there.
        self.counters.request();
        if self
            .client
            .get(self.key.as_str(), None)
            .await?
            .kvs()
            .is_empty()
        {
            bail!("session expired while waiting for {}", self.key);
        }
        Ok(my_rev)
    }

    /// `Mutex.Unlock`.
    pub async fn unlock(&mut self) -> Result<()> {
        self.counters.request();
        self.client.delete(self.key.as_str(), None).await?;
        Ok(())
    }

    /// `waitDeletes`: until no key on the prefix was created at or before `max_create_rev`.
    async fn wait_deletes(&mut self, max_create_rev: i64) -> Result<()> {
        let last_created = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_max_create_revision(max_create_rev);
        loop {
            self.counters.request();
            let resp = self
                .client
                .get(self.prefix.as_str(), Some(last_created.clone()))
                .await?;
            let Some(last) = resp.kvs().first() else {
                return Ok(());
            };
            let rev = resp.header().context("get header")?.revision();
            let key = last.key().to_vec();
            self.wait_delete(key, rev).await?;
        }
    }

    /// `waitDelete`: watch `key` from revision `rev` until a delete event.
    async fn wait_delete(&mut self, key: Vec<u8>, rev: i64) -> Result<()> {
        self.counters.request();
        let mut stream = self
            .client
            .watch(key, Some(WatchOptions::new().with_start_revision(rev)))
            .await?;
        while let Some(resp) = stream.message().await? {
            if resp.events().is_empty() {
                continue;
            }
            self.counters.wakeups.fetch_add(1, Ordering::Relaxed);
            if resp
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                return Ok(());
            }
        }
        bail!("watch stream closed while waiting")
    }
}
