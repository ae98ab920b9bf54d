//! A server's raft log on a simulated disk: what raft-log keeps (`vigil_server::raft::log_store`)
//! with the same contract, in memory, with syncs the simulation times and a crash that loses
//! every record no sync covered.
//!
//! Every change (an append, the vote, the committed id, a truncation) is one record appended to
//! the disk's list, as raft-log appends one record to its chunk file; the log openraft reads is
//! the replay of the records. One sync task per running server makes everything recorded so
//! far durable after a drawn latency (group commit) and only then calls the `IOFlushed` of each
//! append it covered; `save_vote` waits for a sync. A crash keeps the durable records only, and
//! a restarted server replays them. While the disk is full, a sync fails, and raft stops on the
//! error as it does on a real one.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::RaftLogReader;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use vigil_server::raft::{Entry, LogId, TypeConfig, Vote};

use crate::world::{Plant, World};

/// One change to the log, as written.
#[derive(Clone)]
enum Record {
    Append(Box<Entry>),
    /// Everything from this index on is gone.
    Truncate(u64),
    Vote(Vote),
    Committed(LogId),
}

/// A server's disk: survives its crashes.
#[derive(Default)]
pub struct Disk {
    records: Vec<Record>,
    /// How many of `records` a sync has made durable.
    durable: usize,
    /// Counts the server's runs: a write of an earlier run (after its crash) goes nowhere.
    run: u64,
    /// Syncs fail while set (a full disk).
    full: bool,
}

impl Disk {
    /// The server crashed: what no sync covered is lost, and the old run's writes go nowhere.
    pub fn crash(&mut self) {
        self.records.truncate(self.durable);
        self.run += 1;
    }

    /// How many times the server started on this disk.
    pub fn runs(&self) -> u64 {
        self.run
    }

    pub fn set_full(&mut self, full: bool) {
        self.full = full;
    }
}

/// What the log holds, as replayed from the records.
#[derive(Default)]
struct View {
    entries: BTreeMap<u64, Entry>,
    vote: Option<Vote>,
    committed: Option<LogId>,
}

impl View {
    fn replay(records: &[Record]) -> View {
        let mut view = View::default();
        for record in records {
            view.apply(record);
        }
        view
    }

    fn apply(&mut self, record: &Record) {
        match record {
            Record::Append(entry) => {
                self.entries.insert(entry.log_id.index, (**entry).clone());
            }
            Record::Truncate(from) => {
                self.entries.split_off(from);
            }
            Record::Vote(vote) => self.vote = Some(*vote),
            Record::Committed(id) => self.committed = Some(*id),
        }
    }
}

/// Who waits for a sync.
enum Waiter {
    Flushed(IOFlushed<TypeConfig>),
    Vote(oneshot::Sender<io::Result<()>>),
}

impl Waiter {
    fn done(self, result: io::Result<()>) {
        match self {
            Waiter::Flushed(flushed) => flushed.io_completed(result),
            Waiter::Vote(tx) => {
                let _ = tx.send(result);
            }
        }
    }
}

/// The log store of one run of a server.
pub struct SimLog {
    node: u64,
    run: u64,
    disk: Arc<Mutex<Disk>>,
    view: Arc<Mutex<View>>,
    world: Arc<World>,
    /// To the sync task: a record count to make durable, and who waits for it.
    syncs: mpsc::UnboundedSender<(usize, Waiter)>,
}

#[derive(Clone)]
pub struct SimLogReader {
    view: Arc<Mutex<View>>,
}

impl SimLog {
    /// Opens the log of a (re)started server: the durable records replayed. Spawns its sync
    /// task, which ends with the run (when this store and its clones are dropped).
    pub fn open(node: u64, disk: Arc<Mutex<Disk>>, world: Arc<World>) -> SimLog {
        let (run, view) = {
            let d = disk.lock();
            (d.run, View::replay(&d.records[..d.durable]))
        };
        let (syncs, pending) = mpsc::unbounded_channel();
        tokio::spawn(sync_loop(
            node,
            run,
            Arc::clone(&disk),
            Arc::clone(&world),
            pending,
        ));
        SimLog {
            node,
            run,
            disk,
            view: Arc::new(Mutex::new(view)),
            world,
            syncs,
        }
    }

    /// Records `record` (if this run is still the disk's) and applies it to the view; returns
    /// the record count a sync must reach to cover it.
    fn write(&self, record: Record) -> io::Result<usize> {
        let mut disk = self.disk.lock();
        if disk.run != self.run {
            return Err(io::Error::other("the server crashed"));
        }
        self.view.lock().apply(&record);
        disk.records.push(record);
        Ok(disk.records.len())
    }

    fn reader(&self) -> SimLogReader {
        SimLogReader {
            view: Arc::clone(&self.view),
        }
    }
}

/// Makes records durable in order: waits for something to sync, sleeps a drawn latency, then
/// covers everything recorded by then and answers everyone who waited for it.
async fn sync_loop(
    node: u64,
    run: u64,
    disk: Arc<Mutex<Disk>>,
    world: Arc<World>,
    mut pending: mpsc::UnboundedReceiver<(usize, Waiter)>,
) {
    let mut waiting: Vec<(usize, Waiter)> = Vec::new();
    while let Some(first) = pending.recv().await {
        waiting.push(first);
        tokio::time::sleep(world.fsync_latency(node)).await;
        while let Ok(more) = pending.try_recv() {
            waiting.push(more);
        }
        let result = {
            let mut d = disk.lock();
            if d.run != run {
                return;
            }
            if d.full {
                Err(io::Error::other("no space left on device (simulated)"))
            } else {
                d.durable = d.records.len();
                Ok(d.durable)
            }
        };
        match result {
            Ok(durable) => {
                let (done, later): (Vec<_>, Vec<_>) =
                    waiting.drain(..).partition(|(upto, _)| *upto <= durable);
                waiting = later;
                for (_, waiter) in done {
                    waiter.done(Ok(()));
                }
            }
            Err(e) => {
                world.note(format!("node {node}: sync failed: {e}"));
                for (_, waiter) in waiting.drain(..) {
                    waiter.done(Err(io::Error::other(e.to_string())));
                }
            }
        }
    }
}

fn half_open(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl RaftLogReader<TypeConfig> for SimLogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        let view = self.view.lock();
        Ok(view
            .entries
            .range(half_open(&range))
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.view.lock().vote)
    }
}

impl RaftLogReader<TypeConfig> for SimLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> io::Result<Vec<Entry>> {
        self.reader().try_get_log_entries(range).await
    }

    async fn read_vote(&mut self) -> io::Result<Option<Vote>> {
        Ok(self.view.lock().vote)
    }
}

impl RaftLogStorage<TypeConfig> for SimLog {
    type LogReader = SimLogReader;

    async fn get_log_state(&mut self) -> io::Result<LogState<TypeConfig>> {
        let view = self.view.lock();
        Ok(LogState {
            last_purged_log_id: None,
            last_log_id: view.entries.values().next_back().map(|e| e.log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote) -> io::Result<()> {
        let upto = self.write(Record::Vote(*vote))?;
        let (tx, durable) = oneshot::channel();
        self.syncs
            .send((upto, Waiter::Vote(tx)))
            .map_err(|_| io::Error::other("the sync task stopped"))?;
        durable.await.map_err(io::Error::other)?
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let Some(committed) = committed else {
            return Ok(());
        };
        self.write(Record::Committed(committed))?;
        let view = self.view.lock();
        self.world
            .committed(self.node, &view.entries, committed.index);
        Ok(())
    }

    async fn read_committed(&mut self) -> io::Result<Option<LogId>> {
        Ok(self.view.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> io::Result<()>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut upto = 0;
        for entry in entries {
            self.world.appended(&entry);
            upto = self.write(Record::Append(Box::new(entry)))?;
        }
        if self.world.plant == Plant::LyingSync {
            // The planted bug: an append acknowledged before a sync holds it.
            callback.io_completed(Ok(()));
            return Ok(());
        }
        self.syncs
            .send((upto, Waiter::Flushed(callback)))
            .map_err(|_| io::Error::other("the sync task stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> io::Result<()> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        self.write(Record::Truncate(from)).map(drop)
    }

    async fn purge(&mut self, _log_id: LogId) -> io::Result<()> {
        // Purges follow snapshots, every 10,000 entries: no run gets that far.
        Ok(())
    }
}
