//! The bridge between openraft and the [`StateMachine`]: applies committed entries, wakes the
//! blocking queries they concern, tells the leader duties about sessions, and builds and
//! installs snapshots (the whole state machine as postcard).
//!
//! The state machine lives in memory. A server set also keeps its latest snapshot on disk
//! (`<dir>/snapshot.bin`, replaced atomically); [`StateStore::open`] loads it on restart and
//! openraft then replays the committed log after it, so snapshot + log recover the full state.
//! Invariants: a snapshot is durable before openraft hears of it (openraft purges the log up to
//! it); the file never goes back to an older snapshot; the state and the raft position
//! (`last_applied`, membership) always change together under the state lock. Snapshot data
//! (as stored and as sent to followers) ends in a CRC-32 of the encoded state, and the file in
//! one of everything before it: a changed byte is refused on load and on InstallSnapshot
//! instead of being served. The file is readable by its owner only (0600). A snapshot write that
//! fails on a storage error that passes by itself (out of file descriptors, space, quota or
//! memory) is tried again, with a warning and `vigil.storage.retry`, until it succeeds or the
//! server stops, instead of stopping raft: the log is intact, and only snapshots (and the log's
//! purge behind them) wait.

use std::fs::{self, File};
use std::io::{self, Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, RaftSnapshotBuilder};
use openraft_legacy::network_v1::SnapshotReceiverFactory;
use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use vigil_shared::rpc::Response;

use super::{LogId, Snapshot, SnapshotData, SnapshotMeta as Meta, StoredMembership, TypeConfig};
use crate::state::{Effects, StateMachine};
use crate::telemetry::InvalidationCause;
use crate::watch::Watches;

/// What leader duties need to hear about applied commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    Created {
        id: String,
        ttl: String,
    },
    /// Invalidated, and why (a TTL expiry shows as a destroy: the leader's timers know it).
    Destroyed {
        id: String,
        cause: InvalidationCause,
    },
    /// A native lock has waiters that may be granted once its lock-delay ends at `until_ms`.
    LockDelay {
        name: String,
        until_ms: u64,
    },
}

/// State shared between the raft state machine and the readers of it.
pub struct SharedState {
    state: RwLock<StateMachine>,
    pub watches: Arc<Watches>,
    events: mpsc::UnboundedSender<SessionEvent>,
}

impl SharedState {
    pub fn new(events: mpsc::UnboundedSender<SessionEvent>) -> Arc<SharedState> {
        Arc::new(SharedState {
            state: RwLock::new(StateMachine::default()),
            watches: Arc::new(Watches::default()),
            events,
        })
    }

    /// Read access to the state machine. Never hold it across an `.await`.
    pub fn read(&self) -> RwLockReadGuard<'_, StateMachine> {
        self.state.read()
    }

    fn publish(&self, fx: &Effects, cause: InvalidationCause) {
        self.watches.notify(fx);
        for (name, ms) in &fx.lock_holds {
            crate::telemetry::lock_held(name, *ms);
        }
        for (name, ms) in &fx.lock_waits {
            crate::telemetry::lock_waited(name, *ms);
        }
        if !fx.locks.changed.is_empty() {
            let state = self.read();
            for name in &fx.locks.changed {
                let waiters = state.locks().get(name).map_or(0, |l| l.waiters.len());
                crate::telemetry::lock_waiters(name, waiters);
            }
        }
        for (id, ttl) in &fx.ttl_sessions_created {
            // The leader-duty task lives as long as the server; a closed channel means shutdown.
            let _ = self.events.send(SessionEvent::Created {
                id: id.clone(),
                ttl: ttl.clone(),
            });
        }
        for id in &fx.sessions_destroyed {
            let _ = self.events.send(SessionEvent::Destroyed {
                id: id.clone(),
                cause,
            });
        }
        for (name, until_ms) in &fx.locks.delays {
            let _ = self.events.send(SessionEvent::LockDelay {
                name: name.clone(),
                until_ms: *until_ms,
            });
        }
    }
}

/// The snapshot file's name inside the snapshot directory.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot.bin";
/// Written, fsynced, then renamed over [`SNAPSHOT_FILE_NAME`]; a leftover one is ignored.
const SNAPSHOT_TMP_NAME: &str = "snapshot.bin.tmp";
/// First byte of the snapshot file: the layout of what follows, the format of its state
/// ([`StateMachine::format`]). Bump when [`SnapshotFile`] or the encoding of [`StateMachine`]
/// changes incompatibly. Version 2 added the checksums and the KV table's LockIndex floor,
/// version 3 (the first release's) the native lock table and autopilot's settings, version 4
/// the op index, the protocol level, the latest restore's index and the lock queue's request
/// identities. Versions 3 and 4 are read; a state below protocol level 2 is written in version
/// 3, so a server rolled back to the first release reads its file. An older file is refused
/// (the server is then rebuilt from its peers: remove its data directory and let it rejoin).
pub(crate) const SNAPSHOT_FORMAT: u8 = crate::state::format::FORMAT;
/// The oldest snapshot file version read: the first release's.
const OLDEST_SNAPSHOT_FORMAT: u8 = crate::state::format::FIRST_RELEASE_FORMAT;
/// Bytes of a CRC-32 trailer (little endian).
const CRC_LEN: usize = 4;
/// The first pause before writing a snapshot again after a passing storage error; it doubles
/// up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why the snapshot directory could not be used at startup.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotStoreError {
    #[error("cannot read snapshot directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "snapshot {path} is corrupt (restore it from another server or remove the data directory and rejoin): {source}"
    )]
    Corrupt {
        path: PathBuf,
        #[source]
        source: postcard::Error,
    },
    #[error(
        "snapshot {path} has format version {found}; this build reads versions {OLDEST_SNAPSHOT_FORMAT} to {SNAPSHOT_FORMAT}"
    )]
    UnsupportedFormat { path: PathBuf, found: u8 },
    #[error(
        "snapshot {path} fails its checksum: it was changed or damaged on disk (restore it from another server or remove the data directory and rejoin)"
    )]
    Checksum { path: PathBuf },
}

/// Why snapshot data could not be turned back into a state machine.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotDataError {
    #[error("snapshot data fails its checksum")]
    Checksum,
    #[error("snapshot data does not decode: {0}")]
    Decode(#[from] postcard::Error),
}

/// `bytes` followed by their CRC-32.
fn with_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// The bytes before a CRC-32 trailer, if the trailer matches them.
fn checked(bytes: &[u8]) -> Option<&[u8]> {
    let split = bytes.len().checked_sub(CRC_LEN)?;
    let (body, crc) = bytes.split_at(split);
    (crc32fast::hash(body).to_le_bytes() == crc).then_some(body)
}

/// Snapshot data for `state`: its postcard encoding, then, while a restore is being staged,
/// the staged restore's (a snapshot taken between a restore's parts must carry them, or a
/// server that loads it would refuse the parts still to come), and a CRC-32 trailer.
fn seal(state: &StateMachine) -> Result<Vec<u8>, postcard::Error> {
    let mut bytes = state.encode()?;
    if let Some(staged) = state.staged_restore() {
        bytes = postcard::to_extend(staged, bytes)?;
    }
    Ok(with_crc(bytes))
}

/// The state machine in snapshot data made by [`seal`], checksum verified.
fn unseal(data: &[u8]) -> Result<StateMachine, SnapshotDataError> {
    let body = checked(data).ok_or(SnapshotDataError::Checksum)?;
    let (mut state, rest) = StateMachine::decode_prefix(body)?;
    if !rest.is_empty() {
        state.set_staged_restore(Some(postcard::from_bytes(rest)?));
    }
    Ok(state)
}

/// What `snapshot.bin` holds after its format byte (postcard); the same layout in versions 3
/// and 4, whose `data` differ.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    /// The format byte: the format of the state in `data`. Not encoded.
    #[serde(skip)]
    format: u8,
    /// Unused since openraft 0.10 dropped snapshot ids (it numbered them); written as 0 so the
    /// file keeps its layout and older files still read.
    seq: u64,
    meta: Meta,
    /// Postcard of the [`StateMachine`], exactly as sent to followers.
    data: Vec<u8>,
}

impl SnapshotFile {
    /// The format byte, the postcard of `self`, and a CRC-32 of both.
    fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut bytes = vec![self.format];
        postcard::to_io(self, &mut bytes)?;
        Ok(with_crc(bytes))
    }

    fn decode(path: &Path, bytes: &[u8]) -> Result<SnapshotFile, SnapshotStoreError> {
        let corrupt = |source| SnapshotStoreError::Corrupt {
            path: path.to_owned(),
            source,
        };
        let (format, body) = match bytes.first() {
            None => return Err(corrupt(postcard::Error::DeserializeUnexpectedEnd)),
            Some(&format @ OLDEST_SNAPSHOT_FORMAT..=SNAPSHOT_FORMAT) => {
                let checked = checked(bytes).ok_or_else(|| SnapshotStoreError::Checksum {
                    path: path.to_owned(),
                })?;
                (format, &checked[1..])
            }
            Some(&found) => {
                return Err(SnapshotStoreError::UnsupportedFormat {
                    path: path.to_owned(),
                    found,
                });
            }
        };
        let file = match postcard::take_from_bytes::<SnapshotFile>(body).map_err(corrupt)? {
            (file, []) => SnapshotFile { format, ..file },
            (_, _trailing) => return Err(corrupt(postcard::Error::DeserializeBadEncoding)),
        };
        Ok(file)
    }
}

/// Where a server set keeps its latest snapshot.
struct SnapshotDir {
    dir: PathBuf,
    /// `last_log_id` of the snapshot in the file (`None` also when there is none yet). Held
    /// while writing: writes are serialized, and a slow build never replaces a newer installed
    /// snapshot.
    on_disk: Mutex<Option<LogId>>,
}

impl SnapshotDir {
    /// Writes `file` durably unless a newer snapshot is already on disk. Blocking.
    fn persist(&self, file: &SnapshotFile) -> io::Result<()> {
        let mut on_disk = self.on_disk.lock();
        if file.meta.last_log_id < *on_disk {
            return Ok(());
        }
        let bytes = file.encode().map_err(io::Error::other)?;
        let tmp = self.dir.join(SNAPSHOT_TMP_NAME);
        let written = private_file(&tmp).and_then(|mut f| {
            f.write_all(&bytes)?;
            f.sync_all()
        });
        if let Err(e) = written {
            // What was written of it would only take the space a retry needs.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE_NAME))?;
        // The rename is durable only once the directory entry is.
        File::open(&self.dir)?.sync_all()?;
        *on_disk = file.meta.last_log_id;
        Ok(())
    }
}

/// Creates (or truncates) `path`, readable and writable by its owner only.
fn private_file(path: &Path) -> io::Result<File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    options.open(path)
}

#[derive(Clone)]
struct StoredSnapshot {
    meta: Meta,
    data: Vec<u8>,
}

#[derive(Default)]
struct RaftMeta {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshot: Option<StoredSnapshot>,
}

/// openraft's view of the state machine. Cloning shares everything.
#[derive(Clone)]
pub struct StateStore {
    shared: Arc<SharedState>,
    meta: Arc<Mutex<RaftMeta>>,
    /// `None` for `--dev`: snapshots then live only in memory.
    disk: Option<Arc<SnapshotDir>>,
    /// Cancelled when the server stops: a write waiting out a storage error gives up.
    stop: CancellationToken,
}

impl StateStore {
    /// A store whose snapshots live only in memory (`--dev`).
    pub fn new(shared: Arc<SharedState>) -> StateStore {
        StateStore {
            shared,
            meta: Arc::new(Mutex::new(RaftMeta::default())),
            disk: None,
            stop: CancellationToken::new(),
        }
    }

    /// A store that keeps its latest snapshot in `dir` (created if missing). If a snapshot is
    /// there, it is restored into `shared` (state, applied index) and becomes the current
    /// snapshot. Blocks while reading the file; call it once at startup.
    pub fn open(
        shared: Arc<SharedState>,
        dir: impl AsRef<Path>,
    ) -> Result<StateStore, SnapshotStoreError> {
        let dir = dir.as_ref();
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| SnapshotStoreError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(SNAPSHOT_FILE_NAME);
        let loaded = match fs::read(&path) {
            Ok(bytes) => Some(SnapshotFile::decode(&path, &bytes)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&path)(e)),
        };
        let mut meta = RaftMeta::default();
        if let Some(file) = loaded {
            let state = unseal(&file.data).map_err(|e| match e {
                SnapshotDataError::Checksum => SnapshotStoreError::Checksum { path: path.clone() },
                SnapshotDataError::Decode(source) => SnapshotStoreError::Corrupt {
                    path: path.clone(),
                    source,
                },
            })?;
            *shared.state.write() = state;
            meta = RaftMeta {
                last_applied: file.meta.last_log_id,
                membership: file.meta.last_membership.clone(),
                snapshot: Some(StoredSnapshot {
                    meta: file.meta,
                    data: file.data,
                }),
            };
        }
        let on_disk = meta.last_applied;
        Ok(StateStore {
            shared,
            meta: Arc::new(Mutex::new(meta)),
            disk: Some(Arc::new(SnapshotDir {
                dir: dir.to_owned(),
                on_disk: Mutex::new(on_disk),
            })),
            stop: CancellationToken::new(),
        })
    }

    /// The store, its snapshot writes giving up on `stop` (the server's shutdown) when they are
    /// waiting out a storage error.
    pub fn stopping_with(self, stop: CancellationToken) -> StateStore {
        StateStore { stop, ..self }
    }

    fn meta(&self) -> parking_lot::MutexGuard<'_, RaftMeta> {
        self.meta.lock()
    }

    /// Writes the snapshot to disk (if this store has a directory) on the blocking pool, and
    /// hands it back; a passing storage error is waited out ([`write_until_passed`]).
    async fn persist(&self, file: SnapshotFile) -> io::Result<SnapshotFile> {
        let Some(disk) = self.disk.clone() else {
            return Ok(file);
        };
        write_until_passed(&self.stop, file, |file| {
            let disk = Arc::clone(&disk);
            async move {
                tokio::task::spawn_blocking(move || {
                    let written = disk.persist(&file);
                    (file, written)
                })
                .await
                .map_err(io::Error::other)
            }
        })
        .await
    }
}

/// The errno name of a storage error that passes by itself (descriptors closed, space or
/// memory freed), for which a snapshot write waits rather than stopping raft.
fn passing(error: &io::Error) -> Option<&'static str> {
    use nix::errno::Errno;
    match Errno::from_raw(error.raw_os_error()?) {
        Errno::EMFILE => Some("EMFILE"),
        Errno::ENFILE => Some("ENFILE"),
        Errno::ENOSPC => Some("ENOSPC"),
        Errno::EDQUOT => Some("EDQUOT"),
        Errno::ENOMEM => Some("ENOMEM"),
        _ => None,
    }
}

/// Runs `attempt` on `value` (which each attempt hands back) until it succeeds, fails with an
/// error that does not pass, or `stop` is cancelled while it waits; the pause between
/// attempts doubles from [`RETRY_MIN`] to [`RETRY_MAX`]. Each retry is logged and counted.
async fn write_until_passed<T, F, Fut>(
    stop: &CancellationToken,
    mut value: T,
    mut attempt: F,
) -> io::Result<T>
where
    F: FnMut(T) -> Fut,
    Fut: Future<Output = io::Result<(T, io::Result<()>)>>,
{
    let mut pause = RETRY_MIN;
    loop {
        let (back, written) = attempt(value).await?;
        value = back;
        let error = match written {
            Ok(()) => return Ok(value),
            Err(error) => error,
        };
        let Some(errno) = passing(&error) else {
            return Err(error);
        };
        tracing::warn!(%error, retry_in = ?pause, "writing the snapshot failed; trying again");
        crate::telemetry::storage_retry(errno);
        tokio::select! {
            () = stop.cancelled() => return Err(error),
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateStore {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> io::Result<Snapshot> {
        // openraft builds in its own task while entries keep being applied: read the state and
        // its raft position under the state lock so they match.
        let file = {
            let state = self.shared.read();
            let data = seal(&state).map_err(io::Error::other)?;
            let meta = self.meta();
            SnapshotFile {
                format: state.format(),
                seq: 0,
                meta: Meta {
                    last_log_id: meta.last_applied,
                    last_membership: meta.membership.clone(),
                },
                data,
            }
        };
        let file = self.persist(file).await?;
        {
            let mut meta = self.meta();
            // An install may have overtaken this build; keep the newer snapshot current.
            let newer = meta
                .snapshot
                .as_ref()
                .is_none_or(|s| s.meta.last_log_id <= file.meta.last_log_id);
            if newer {
                meta.snapshot = Some(StoredSnapshot {
                    meta: file.meta.clone(),
                    data: file.data.clone(),
                });
            }
        }
        Ok(Snapshot {
            meta: file.meta,
            snapshot: Cursor::new(file.data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> io::Result<(Option<LogId>, StoredMembership)> {
        let meta = self.meta();
        Ok((meta.last_applied, meta.membership.clone()))
    }

    /// Applies a run of committed entries under one state lock, then publishes their effects,
    /// and only then answers the proposers: a client that hears its answer and reads again
    /// sees the change and everything it woke.
    async fn apply<S>(&mut self, mut entries: S) -> io::Result<()>
    where
        S: Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send,
    {
        let mut batch = Vec::new();
        while let Some(item) = entries.next().await {
            batch.push(item?);
        }
        let mut answers = Vec::with_capacity(batch.len());
        let mut effects = Vec::new();
        {
            let mut state = self.shared.state.write();
            let mut meta = self.meta();
            for (entry, responder) in batch {
                meta.last_applied = Some(entry.log_id);
                let response = match entry.payload {
                    EntryPayload::Blank => Response::Done,
                    EntryPayload::Normal(cmd) => {
                        let cause = InvalidationCause::of(&cmd.op);
                        let (response, fx) = state.apply(entry.log_id.index, cmd);
                        effects.push((fx, cause));
                        response
                    }
                    EntryPayload::Membership(m) => {
                        meta.membership = StoredMembership::new(Some(entry.log_id), m);
                        Response::Done
                    }
                };
                answers.extend(responder.map(|r| (r, response)));
            }
        }
        for (fx, cause) in &effects {
            self.shared.publish(fx, *cause);
        }
        for (responder, response) in answers {
            responder.send(response);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &Meta, snapshot: SnapshotData) -> io::Result<()> {
        let data = snapshot.into_inner();
        let restored = unseal(&data).map_err(io::Error::other)?;
        // Durable first: once this returns, openraft may purge the log the snapshot covers.
        let file = self
            .persist(SnapshotFile {
                format: restored.format(),
                seq: 0,
                meta: meta.clone(),
                data,
            })
            .await?;
        {
            let mut state = self.shared.state.write();
            let mut m = self.meta();
            *state = restored;
            m.last_applied = meta.last_log_id;
            m.membership = meta.last_membership.clone();
            m.snapshot = Some(StoredSnapshot {
                meta: file.meta,
                data: file.data,
            });
        }
        // Everything may have changed: wake every waiter so each re-reads.
        self.shared.watches.wake_everyone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> io::Result<Option<Snapshot>> {
        Ok(self.meta().snapshot.clone().map(|s| Snapshot {
            meta: s.meta,
            snapshot: Cursor::new(s.data),
        }))
    }
}

/// A snapshot sent in chunks (openraft's v1 protocol) is gathered in memory.
impl SnapshotReceiverFactory<TypeConfig> for StateStore {
    type SnapshotReceiver = SnapshotData;

    async fn begin_receiving_snapshot(&mut self) -> io::Result<SnapshotData> {
        Ok(Cursor::new(Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use vigil_shared::kv::KvOp;
    use vigil_shared::rpc::calls::ServerNode;
    use vigil_shared::rpc::{Command, Op};

    use crate::raft::{Entry, Membership};

    use super::*;

    fn fresh_shared() -> Arc<SharedState> {
        // Session events are not under test; a closed channel is ignored by `publish`.
        let (events, _) = mpsc::unbounded_channel();
        SharedState::new(events)
    }

    /// Entries as openraft hands them to `apply`: committed, with nobody waiting for them.
    fn stream(
        entries: impl IntoIterator<Item = Entry>,
    ) -> impl Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send {
        let entries: Vec<_> = entries.into_iter().map(|e| Ok((e, None))).collect();
        futures::stream::iter(entries)
    }

    fn log_id(index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(1, 1, index)
    }

    #[test]
    fn snapshot_data_carries_a_restore_being_staged() {
        let mut state = StateMachine::default();
        state.apply(
            1,
            Command {
                now_ms: 1,
                op: Op::RestoreChunk {
                    id: "r".into(),
                    offset: 0,
                    bytes: vec![7; 100],
                    last: false,
                },
            },
        );
        assert!(state.staged_restore().is_some());
        assert_eq!(unseal(&seal(&state).expect("seal")).expect("unseal"), state);
        // Data without a staged restore is the state's encoding alone, as builds before
        // staging wrote.
        let plain = StateMachine::default();
        let old = with_crc(plain.encode().expect("encode"));
        assert_eq!(seal(&plain).expect("seal"), old);
        assert_eq!(unseal(&old).expect("unseal"), plain);
    }

    fn membership_entry(index: u64) -> Entry {
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Membership(
                Membership::new(
                    vec![BTreeSet::from([1])],
                    BTreeMap::from([(
                        1,
                        ServerNode {
                            name: "s1".into(),
                            rpc_addr: "127.0.0.1:8300".into(),
                        },
                    )]),
                )
                .expect("a valid membership"),
            ),
        }
    }

    fn set(index: u64, key: &str, value: &str) -> Entry {
        Entry {
            log_id: log_id(index),
            payload: EntryPayload::Normal(Command {
                now_ms: 1_700_000_000_000 + index,
                op: Op::Kv(vec![KvOp::Set {
                    key: key.to_owned(),
                    value: value.as_bytes().to_vec(),
                    flags: 0,
                }]),
            }),
        }
    }

    /// A membership entry at 1, then `k2..=k{upto}` written at their own indexes.
    fn sample_log(upto: u64) -> Vec<Entry> {
        let mut entries = vec![membership_entry(1)];
        entries.extend((2..=upto).map(|i| set(i, &format!("k{i}"), &format!("v{i}"))));
        entries
    }

    fn value(shared: &SharedState, key: &str) -> Option<Vec<u8>> {
        shared.read().kv().get(key).map(|e| e.value.clone())
    }

    #[tokio::test]
    async fn a_built_snapshot_is_restored_on_open() {
        let dir = tempfile::tempdir().expect("tempdir");

        // Apply six entries, snapshot, then apply more that only the log would hold.
        let (built, state_at_snapshot) = {
            let shared = fresh_shared();
            let mut store = StateStore::open(Arc::clone(&shared), dir.path()).expect("open");
            store.apply(stream(sample_log(6))).await.expect("apply");
            let built = store.build_snapshot().await.expect("build");
            let state_at_snapshot = shared.read().clone();
            store
                .apply(stream([set(7, "k7", "v7")]))
                .await
                .expect("apply");
            assert_eq!(value(&shared, "k7").as_deref(), Some(&b"v7"[..]));
            (built, state_at_snapshot)
        };
        assert_eq!(built.meta.last_log_id, Some(log_id(6)));
        assert!(dir.path().join(SNAPSHOT_FILE_NAME).exists());

        // A fresh process: the state, the raft position and the current snapshot come back.
        let shared = fresh_shared();
        let mut store = StateStore::open(Arc::clone(&shared), dir.path()).expect("reopen");
        assert_eq!(*shared.read(), state_at_snapshot);
        assert_eq!(value(&shared, "k6").as_deref(), Some(&b"v6"[..]));
        assert_eq!(
            value(&shared, "k7"),
            None,
            "k7 comes back from the log, not the snapshot"
        );
        let (applied, membership) = store.applied_state().await.expect("applied state");
        assert_eq!(applied, Some(log_id(6)));
        assert_eq!(membership, built.meta.last_membership);
        assert_eq!(membership.log_id(), &Some(log_id(1)));
        let current = store
            .get_current_snapshot()
            .await
            .expect("current snapshot")
            .expect("a snapshot was loaded");
        assert_eq!(current.meta, built.meta);
        assert_eq!(current.snapshot.into_inner(), built.snapshot.into_inner());

        // openraft replays the log after the snapshot; the next snapshot covers it.
        store
            .apply(stream([set(7, "k7", "v7")]))
            .await
            .expect("replay");
        assert_eq!(value(&shared, "k7").as_deref(), Some(&b"v7"[..]));
        let next = store.build_snapshot().await.expect("build");
        assert_eq!(next.meta.last_log_id, Some(log_id(7)));
    }

    #[tokio::test]
    async fn an_installed_snapshot_is_restored_on_open() {
        let leader_dir = tempfile::tempdir().expect("tempdir");
        let follower_dir = tempfile::tempdir().expect("tempdir");

        // The leader builds a snapshot; the follower installs it.
        let mut leader = StateStore::open(fresh_shared(), leader_dir.path()).expect("open");
        leader.apply(stream(sample_log(5))).await.expect("apply");
        let snapshot = leader.build_snapshot().await.expect("build");
        let follower_shared = fresh_shared();
        let mut follower =
            StateStore::open(Arc::clone(&follower_shared), follower_dir.path()).expect("open");
        follower
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .expect("install");
        assert_eq!(value(&follower_shared, "k5").as_deref(), Some(&b"v5"[..]));

        // A build that started before the install and finishes after it must not replace the
        // installed (newer) snapshot on disk.
        let stale = SnapshotFile {
            format: StateMachine::default().format(),
            seq: 1,
            meta: Meta {
                last_log_id: Some(log_id(3)),
                last_membership: StoredMembership::default(),
            },
            data: seal(&StateMachine::default()).expect("encode"),
        };
        follower.persist(stale).await.expect("stale persist");
        drop(follower);

        // The follower restarts from the installed snapshot.
        let shared = fresh_shared();
        let mut follower =
            StateStore::open(Arc::clone(&shared), follower_dir.path()).expect("reopen");
        assert_eq!(value(&shared, "k5").as_deref(), Some(&b"v5"[..]));
        let current = follower
            .get_current_snapshot()
            .await
            .expect("current snapshot")
            .expect("a snapshot was loaded");
        assert_eq!(current.meta, snapshot.meta);
        assert_eq!(
            follower.applied_state().await.expect("applied").0,
            Some(log_id(5))
        );
    }

    #[tokio::test]
    async fn a_crash_mid_write_leaves_a_loadable_directory() {
        // Crash before the first rename: only the temporary file exists.
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(SNAPSHOT_TMP_NAME), b"half a snap").expect("write tmp");
        let shared = fresh_shared();
        let mut store = StateStore::open(Arc::clone(&shared), dir.path()).expect("open");
        assert!(
            store
                .get_current_snapshot()
                .await
                .expect("current")
                .is_none()
        );
        assert_eq!(store.applied_state().await.expect("applied").0, None);
        assert_eq!(*shared.read(), StateMachine::default());

        // A snapshot written after that replaces the leftover.
        store.apply(stream(sample_log(4))).await.expect("apply");
        let built = store.build_snapshot().await.expect("build");
        assert!(!dir.path().join(SNAPSHOT_TMP_NAME).exists());
        drop(store);

        // Crash during a later write: the previous snapshot is still the one loaded.
        fs::write(dir.path().join(SNAPSHOT_TMP_NAME), [SNAPSHOT_FORMAT, 0xff]).expect("write tmp");
        let shared = fresh_shared();
        let mut store = StateStore::open(Arc::clone(&shared), dir.path()).expect("reopen");
        let current = store
            .get_current_snapshot()
            .await
            .expect("current")
            .expect("a snapshot was loaded");
        assert_eq!(current.meta, built.meta);
        assert_eq!(value(&shared, "k4").as_deref(), Some(&b"v4"[..]));
    }

    #[tokio::test]
    async fn a_damaged_or_newer_snapshot_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        let mut store = StateStore::open(fresh_shared(), dir.path()).expect("open");
        store.apply(stream(sample_log(3))).await.expect("apply");
        store.build_snapshot().await.expect("build");
        drop(store);
        let good = fs::read(&path).expect("read");

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(&path).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "the snapshot must be private");
        }

        // Truncated (a torn write the rename protocol should make impossible), one byte of a
        // value changed, trailing garbage: each fails the checksum.
        let mut changed = good.clone();
        let at = changed
            .windows(2)
            .position(|w| w == b"v2")
            .expect("a value in the snapshot");
        changed[at + 1] = b'X';
        let mut longer = good.clone();
        longer.push(0);
        for damaged in [&good[..good.len() / 2], &changed[..], &longer[..]] {
            fs::write(&path, damaged).expect("damage");
            assert!(matches!(
                StateStore::open(fresh_shared(), dir.path()),
                Err(SnapshotStoreError::Checksum { .. })
            ));
        }

        // Written by a newer build.
        let mut newer = good.clone();
        newer[0] = SNAPSHOT_FORMAT + 1;
        fs::write(&path, &newer).expect("restamp");
        assert!(matches!(
            StateStore::open(fresh_shared(), dir.path()),
            Err(SnapshotStoreError::UnsupportedFormat { found, .. }) if found == SNAPSHOT_FORMAT + 1
        ));

        // Empty.
        fs::write(&path, b"").expect("empty");
        assert!(matches!(
            StateStore::open(fresh_shared(), dir.path()),
            Err(SnapshotStoreError::Corrupt { .. })
        ));
    }

    /// Format 3 (the first release's) is written below protocol level 2, format 5 from it on;
    /// both load, and snapshot data in either installs.
    #[tokio::test]
    async fn the_file_format_follows_the_protocol_level_and_both_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        let shared = fresh_shared();
        let mut store = StateStore::open(Arc::clone(&shared), dir.path()).expect("open");
        store.apply(stream(sample_log(3))).await.expect("apply");
        let first = store.build_snapshot().await.expect("build");
        let first_data = first.snapshot.into_inner();
        assert_eq!(fs::read(&path).expect("read")[0], 3);
        let state_at_3 = shared.read().clone();
        let reopened = fresh_shared();
        StateStore::open(Arc::clone(&reopened), dir.path()).expect("reopen");
        assert_eq!(*reopened.read(), state_at_3);

        let raise = Entry {
            log_id: log_id(4),
            payload: EntryPayload::Normal(Command {
                now_ms: 2,
                op: Op::SetProtocol {
                    level: vigil_shared::PROTOCOL,
                },
            }),
        };
        store
            .apply(stream([raise, set(5, "k5", "v5")]))
            .await
            .expect("apply");
        let second = store.build_snapshot().await.expect("build");
        assert_eq!(
            fs::read(&path).expect("read")[0],
            crate::state::format::FORMAT
        );
        let reopened = fresh_shared();
        StateStore::open(Arc::clone(&reopened), dir.path()).expect("reopen");
        assert_eq!(*reopened.read(), *shared.read());
        assert_eq!(reopened.read().protocol(), vigil_shared::PROTOCOL);

        // A follower installs either (a first-release leader sends format 3).
        let follower_dir = tempfile::tempdir().expect("tempdir");
        let follower_shared = fresh_shared();
        let mut follower =
            StateStore::open(Arc::clone(&follower_shared), follower_dir.path()).expect("open");
        follower
            .install_snapshot(&first.meta, Cursor::new(first_data))
            .await
            .expect("install format 3");
        assert_eq!(*follower_shared.read(), state_at_3);
        assert_eq!(
            fs::read(follower_dir.path().join(SNAPSHOT_FILE_NAME)).expect("read")[0],
            3
        );
        follower
            .install_snapshot(&second.meta, second.snapshot)
            .await
            .expect("install format 4");
        assert_eq!(*follower_shared.read(), *shared.read());
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_write_waits_out_errors_that_pass_and_no_others() {
        use nix::errno::Errno;
        let os = |errno: Errno| io::Error::from_raw_os_error(errno as i32);
        // Each attempt takes the next outcome; the value travels through every attempt.
        let script = |outcomes: Vec<Option<Errno>>| {
            let mut outcomes = outcomes.into_iter();
            move |tries: u32| {
                let outcome = outcomes.next().expect("no more attempts expected");
                async move { Ok((tries + 1, outcome.map_or(Ok(()), |e| Err(os(e))))) }
            }
        };
        let stop = CancellationToken::new();

        // Out of descriptors, then of space: waited out (1 s, then 2 s), then written.
        let started = tokio::time::Instant::now();
        let outcomes = vec![Some(Errno::EMFILE), Some(Errno::ENOSPC), None];
        let tries = write_until_passed(&stop, 0, script(outcomes))
            .await
            .unwrap();
        assert_eq!(tries, 3);
        assert_eq!(started.elapsed(), RETRY_MIN * 3);

        // Anything else (a permission, a damaged disk) fails at once.
        for errno in [Errno::EACCES, Errno::EIO] {
            let error = write_until_passed(&stop, 0, script(vec![Some(errno)]))
                .await
                .unwrap_err();
            assert_eq!(error.raw_os_error(), Some(errno as i32));
        }

        // A server stopping gives up waiting.
        stop.cancel();
        let outcomes = vec![Some(Errno::EMFILE)];
        let error = write_until_passed(&stop, 0, script(outcomes))
            .await
            .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(Errno::EMFILE as i32));
    }

    #[tokio::test]
    async fn an_installed_snapshot_that_fails_its_checksum_is_refused() {
        let leader_dir = tempfile::tempdir().expect("tempdir");
        let mut leader = StateStore::open(fresh_shared(), leader_dir.path()).expect("open");
        leader.apply(stream(sample_log(3))).await.expect("apply");
        let snapshot = leader.build_snapshot().await.expect("build");
        let mut data = snapshot.snapshot.into_inner();
        let at = data.windows(2).position(|w| w == b"v2").expect("a value");
        data[at + 1] = b'X';

        let follower_dir = tempfile::tempdir().expect("tempdir");
        let shared = fresh_shared();
        let mut follower =
            StateStore::open(Arc::clone(&shared), follower_dir.path()).expect("open");
        assert!(
            follower
                .install_snapshot(&snapshot.meta, Cursor::new(data))
                .await
                .is_err()
        );
        assert_eq!(*shared.read(), StateMachine::default());
        assert!(!follower_dir.path().join(SNAPSHOT_FILE_NAME).exists());
    }
}
