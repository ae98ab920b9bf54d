//! [`Election`]: leader election on one key with the [`Lock`] protocol (so Consul's
//! leader-election clients take part): `campaign` blocks until leader, `leader` reads the current
//! one, `observe` streams every change including "no leader", and resigning is releasing.

use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use vigil_shared::kv::KvEntry;
use vigil_shared::recipe::LOCK_FLAG_VALUE;

use super::held::{Held, MONITOR_RETRY};
use super::lock::{Lock, LockOptions};
use super::{Client, ClientError, ReadOpts, next_wait_index};

/// How long each observe read blocks on the server.
const OBSERVE_WAIT: Duration = Duration::from_secs(300);

/// The current leader: its value (the candidate's identity) and sequencer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub value: Vec<u8>,
    pub session: String,
    pub lock_index: u64,
}

impl Leader {
    fn from_entry(entry: Option<&KvEntry>) -> Option<Leader> {
        let entry = entry.filter(|e| e.flags == LOCK_FLAG_VALUE)?;
        Some(Leader {
            value: entry.value.clone(),
            session: entry.session.clone()?,
            lock_index: entry.lock_index,
        })
    }
}

/// One election, identified by its key; `opts.value` is this candidate's identity.
#[derive(Clone)]
pub struct Election {
    client: Client,
    lock: Lock,
}

impl Election {
    pub fn new(client: &Client, opts: LockOptions) -> Result<Election, ClientError> {
        Ok(Election {
            client: client.clone(),
            lock: Lock::new(client, opts)?,
        })
    }

    pub fn key(&self) -> &str {
        self.lock.key()
    }

    /// Blocks until this candidate is leader. `Held::release` resigns; `Held::lost` says when
    /// leadership ended.
    pub async fn campaign(&self) -> Result<Held, ClientError> {
        self.lock.acquire().await
    }

    /// The current leader, if any.
    pub async fn leader(&self) -> Result<Option<Leader>, ClientError> {
        let (entry, _) = self
            .client
            .kv_get(self.key(), ReadOpts::default().consistent())
            .await?;
        Ok(Leader::from_entry(entry.as_ref()))
    }

    /// The leader now, then every change: `Ok(None)` is "no leader". A failed read is yielded as
    /// `Err` and retried after a second.
    pub fn observe(&self) -> BoxStream<'static, Result<Option<Leader>, ClientError>> {
        struct State {
            client: Client,
            key: String,
            index: u64,
            last: Option<Option<Leader>>,
            failed: bool,
        }
        let state = State {
            client: self.client.clone(),
            key: self.key().to_owned(),
            index: 0,
            last: None,
            failed: false,
        };
        stream::unfold(state, |mut s| async move {
            loop {
                if s.failed {
                    tokio::time::sleep(MONITOR_RETRY).await;
                    s.failed = false;
                }
                let opts = ReadOpts::blocking(s.index, OBSERVE_WAIT);
                match s.client.kv_get(&s.key, opts).await {
                    Ok((entry, meta)) => {
                        s.index = next_wait_index(s.index, meta.index);
                        let leader = Leader::from_entry(entry.as_ref());
                        if s.last.as_ref() != Some(&leader) {
                            s.last = Some(leader.clone());
                            return Some((Ok(leader), s));
                        }
                    }
                    Err(e) => {
                        s.index = 0;
                        s.failed = true;
                        return Some((Err(e), s));
                    }
                }
            }
        })
        .boxed()
    }
}
