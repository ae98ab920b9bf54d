use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom, Write as _};
use std::process::{Command as Process, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use openraft::EntryPayload;
use openraft::storage::RaftLogStorageExt as _;
use vigil_shared::kv::KvOp;
use vigil_shared::rpc::calls::ServerNode;
use vigil_shared::rpc::{Command, Op};

use super::*;
use crate::raft::Membership;

/// How long a test waits for the flush thread before it calls it stuck.
const PATIENCE: Duration = Duration::from_secs(30);

fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id::<TypeConfig>(term, 1, index)
}

/// A KV write whose value is `size` bytes.
fn put(term: u64, index: u64, size: usize) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Command {
            now_ms: 1_700_000_000_000 + index,
            op: Op::Kv(vec![KvOp::Set {
                key: format!("k{index}"),
                value: vec![index as u8; size],
                flags: index,
            }]),
        }),
    }
}

fn set(term: u64, index: u64) -> Entry {
    put(term, index, 16)
}

/// Blank, membership, then KV writes: the three payload kinds.
fn sample_log(upto: u64) -> Vec<Entry> {
    let membership = Membership::new(
        vec![BTreeSet::from([1])],
        BTreeMap::from([(
            1,
            ServerNode {
                name: "s1".into(),
                rpc_addr: "127.0.0.1:8300".into(),
            },
        )]),
    )
    .expect("a valid membership");
    let mut entries = vec![
        Entry {
            log_id: log_id(1, 1),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: log_id(1, 2),
            payload: EntryPayload::Membership(membership),
        },
    ];
    entries.extend((3..=upto).map(|i| set(2, i)));
    entries
}

fn open(dir: &tempfile::TempDir) -> LogStore {
    LogStore::open(dir.path()).expect("open")
}

/// A completion that reports to the returned receiver.
fn probe() -> (Done, tokio::sync::oneshot::Receiver<io::Result<()>>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (Done::Wait(tx), rx)
}

async fn wait_durable(flushed: tokio::sync::oneshot::Receiver<io::Result<()>>) {
    tokio::time::timeout(PATIENCE, flushed)
        .await
        .expect("the flush thread reported in time")
        .expect("the flush thread reported")
        .expect("the sync succeeded");
}

/// The chunk files of the log in `dir`, oldest first.
fn chunks(dir: &tempfile::TempDir) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path().join(LOG_DIR_NAME))
        .expect("read the log directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "LOCK"))
        .collect();
    files.sort();
    files
}

fn encoded_len(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|e| postcard::to_allocvec(&e.payload).expect("encode").len())
        .sum()
}

#[tokio::test]
async fn log_vote_and_committed_survive_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let vote = Vote::new_committed(2, 1);

    // Write a log, then shape it the way openraft does: purge a prefix, truncate a tail.
    {
        let mut store = open(&dir);
        store.blocking_append(sample_log(20)).await.expect("append");
        store.save_vote(&vote).await.expect("vote");
        store
            .save_committed(Some(log_id(2, 15)))
            .await
            .expect("committed");
        store.purge(log_id(1, 2)).await.expect("purge");
        store
            .truncate_after(Some(log_id(2, 17)))
            .await
            .expect("truncate");
    }

    // A reopened store answers exactly as the first one did before it was dropped.
    let mut store = open(&dir);
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
    assert_eq!(state.last_log_id, Some(log_id(2, 17)));
    assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
    assert_eq!(
        store.read_committed().await.expect("committed"),
        Some(log_id(2, 15))
    );
    let entries = store.try_get_log_entries(0..100).await.expect("entries");
    assert_eq!(entries, sample_log(17)[2..].to_vec());

    // The reader openraft gets sees appends made after it was handed out.
    let mut reader = store.get_log_reader().await;
    store.blocking_append([set(3, 18)]).await.expect("append");
    let tail = reader.try_get_log_entries(17..).await.expect("tail");
    assert_eq!(tail, vec![set(2, 17), set(3, 18)]);
}

#[tokio::test]
async fn empty_and_fully_purged_logs() {
    let dir = tempfile::tempdir().expect("tempdir");

    // A new file: nothing at all.
    let mut store = open(&dir);
    let state = store.get_log_state().await.expect("log state");
    assert_eq!((state.last_purged_log_id, state.last_log_id), (None, None));
    assert_eq!(store.read_vote().await.expect("vote"), None);
    assert_eq!(store.read_committed().await.expect("committed"), None);

    // Everything purged: the last log id falls back to the last purged one.
    store.blocking_append(sample_log(5)).await.expect("append");
    store.purge(log_id(2, 5)).await.expect("purge");
    drop(store);
    let mut store = open(&dir);
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 5)));
    assert_eq!(state.last_log_id, Some(log_id(2, 5)));

    // Empty and inverted ranges read nothing instead of failing.
    store.blocking_append([set(2, 6)]).await.expect("append");
    assert!(
        store
            .try_get_log_entries(6..6)
            .await
            .expect("empty")
            .is_empty()
    );
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = 7..6;
    assert!(
        store
            .try_get_log_entries(inverted)
            .await
            .expect("inverted")
            .is_empty()
    );
    assert_eq!(
        store.try_get_log_entries(6..=6).await.expect("one").len(),
        1
    );
}

#[tokio::test]
async fn appended_entries_are_readable_as_soon_as_append_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    store.blocking_append(sample_log(3)).await.expect("append");
    let mut reader = store.get_log_reader().await;

    // Readable at once, whether or not the sync has happened yet.
    let (done, flushed) = probe();
    store
        .append_then([set(2, 4), set(2, 5)], done)
        .expect("append");
    assert_eq!(
        reader.try_get_log_entries(4..).await.expect("read"),
        vec![set(2, 4), set(2, 5)]
    );
    assert_eq!(
        reader.limited_get_log_entries(1, 6).await.expect("read"),
        sample_log(5)
    );
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_log_id, Some(log_id(2, 5)));
    wait_durable(flushed).await;
}

#[tokio::test]
async fn flushes_report_in_order_and_a_vote_waits_for_everything_before_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);

    // Appends, a truncation and a re-append, none waited for; each completion records its
    // batch's first index in the order it is called.
    let (reports, reported) = std::sync::mpsc::channel();
    let batches = [
        vec![set(1, 1), set(1, 2), set(1, 3)],
        vec![set(1, 4), set(1, 5), set(1, 6)],
        vec![set(1, 7), set(1, 8), set(1, 9)],
        vec![set(2, 8)],
    ];
    let mut waits = Vec::new();
    for (n, batch) in batches.into_iter().enumerate() {
        if n == 3 {
            store
                .truncate_after(Some(log_id(1, 7)))
                .await
                .expect("truncate");
        }
        let first = batch[0].log_id.index;
        let reports = reports.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (done, flushed) = probe();
        tokio::spawn(async move {
            let result = flushed.await.expect("reported");
            reports.send((first, result.is_ok())).expect("report");
            let _ = tx.send(());
        });
        waits.push(rx);
        store.append_then(batch, done).expect("append");
    }
    store
        .save_committed(Some(log_id(1, 7)))
        .await
        .expect("committed");

    // A vote saved after them returns only once its sync is durable, and so theirs too.
    store
        .save_vote(&Vote::new_committed(2, 1))
        .await
        .expect("vote");
    for wait in waits {
        wait.await.expect("reported");
    }
    assert_eq!(
        reported.try_iter().collect::<Vec<_>>(),
        vec![(1, true), (4, true), (7, true), (8, true)]
    );

    // What a reopened store holds is what openraft was told is durable.
    drop(store);
    let mut store = open(&dir);
    let expected: Vec<Entry> = (1..=7).map(|i| set(1, i)).chain([set(2, 8)]).collect();
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
    assert_eq!(
        store.read_vote().await.expect("vote"),
        Some(Vote::new_committed(2, 1))
    );
}

#[tokio::test]
async fn truncate_and_purge_hide_entries_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    store.blocking_append(sample_log(6)).await.expect("append");
    let mut reader = store.get_log_reader().await;

    // Entries durable (5, 6) and maybe not yet (7..=9) disappear at once.
    let (done, queued) = probe();
    store
        .append_then([set(2, 7), set(2, 8), set(2, 9)], done)
        .expect("append");
    store
        .truncate_after(Some(log_id(2, 4)))
        .await
        .expect("truncate");
    assert_eq!(
        reader.try_get_log_entries(..).await.expect("read"),
        sample_log(4)
    );
    assert_eq!(
        reader.limited_get_log_entries(1, 10).await.expect("read"),
        sample_log(4)
    );
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_log_id, Some(log_id(2, 4)));

    // A new entry at a truncated index replaces the stale one.
    let (done, replaced) = probe();
    store.append_then([set(3, 5)], done).expect("append");
    let mut expected = sample_log(4);
    expected.push(set(3, 5));
    assert_eq!(
        reader.try_get_log_entries(..).await.expect("read"),
        expected
    );

    // A purge hides the prefix at once too.
    store.purge(log_id(1, 2)).await.expect("purge");
    assert_eq!(
        reader.try_get_log_entries(..).await.expect("read"),
        expected[2..]
    );
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));

    // Durable, a reopened store agrees with what readers saw.
    wait_durable(queued).await;
    wait_durable(replaced).await;
    drop((reader, store));
    let mut store = open(&dir);
    assert_eq!(
        store.try_get_log_entries(..).await.expect("read"),
        expected[2..]
    );
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
    assert_eq!(state.last_log_id, Some(log_id(3, 5)));
}

/// Entries `[from, from + count)` of `log`, as a limited read must return them.
fn expect_read(got: &[Entry], log: &[Entry], from: u64, count: usize) {
    assert_eq!(got.len(), count, "entries read from {from}");
    assert_eq!(got, &log[from as usize - 1..][..count]);
    if count > 1 {
        assert!(encoded_len(got) <= MAX_APPEND_BYTES, "read from {from}");
    }
}

/// Three of these fit in one AppendEntries, four do not; the eleventh is over budget alone.
fn budget_log() -> Vec<Entry> {
    let mut log: Vec<Entry> = (1..=10)
        .map(|i| put(1, i, MAX_APPEND_BYTES * 3 / 10))
        .collect();
    log.push(put(1, 11, 2 * MAX_APPEND_BYTES));
    log.extend((12..=13).map(|i| set(1, i)));
    log
}

async fn read_within_budget(reader: &mut LogReader, log: &[Entry]) {
    for (from, count) in [(1, 3), (4, 3), (9, 2), (10, 1), (11, 1)] {
        let got = reader
            .limited_get_log_entries(from, 12)
            .await
            .expect("read");
        expect_read(&got, log, from, count);
    }
    assert_eq!(
        reader.try_get_log_entries(1..12).await.expect("read"),
        log[..11]
    );
}

#[tokio::test]
async fn limited_reads_stay_within_the_byte_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut reader = store.get_log_reader().await;
    let log = budget_log();

    // From the cache, as soon as the append returns.
    let (done, flushed) = probe();
    store.append_then(log[..11].to_vec(), done).expect("append");
    read_within_budget(&mut reader, &log).await;
    wait_durable(flushed).await;

    // From the file, after a reopen.
    drop((reader, store));
    let mut store = open(&dir);
    let mut reader = store.get_log_reader().await;
    read_within_budget(&mut reader, &log).await;

    // A small tail behind them: one read answers both.
    store
        .blocking_append(log[11..].to_vec())
        .await
        .expect("append");
    read_within_budget(&mut reader, &log).await;
    let got = reader.limited_get_log_entries(10, 14).await.expect("read");
    expect_read(&got, &log, 10, 1);
    let got = reader.limited_get_log_entries(11, 14).await.expect("read");
    expect_read(&got, &log, 11, 1);
    let got = reader.limited_get_log_entries(12, 14).await.expect("read");
    expect_read(&got, &log, 12, 2);
}

#[tokio::test]
async fn every_flushed_entry_survives_drop_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);

    // Fifty appends in flight at once, each reported durable.
    let mut flushes = Vec::new();
    for n in 0..50u64 {
        let (done, flushed) = probe();
        store
            .append_then([set(1, 2 * n + 1), set(1, 2 * n + 2)], done)
            .expect("append");
        flushes.push(flushed);
    }
    store
        .save_committed(Some(log_id(1, 90)))
        .await
        .expect("committed");
    for flushed in flushes {
        wait_durable(flushed).await;
    }

    // An append still queued when the store is dropped is synced before the flush thread ends.
    let (done, last) = probe();
    store.append_then([set(1, 101)], done).expect("append");
    drop(store);
    wait_durable(last).await;

    let mut store = open(&dir);
    let expected: Vec<Entry> = (1..=101).map(|i| set(1, i)).collect();
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
    assert_eq!(
        store.read_committed().await.expect("committed"),
        Some(log_id(1, 90))
    );
}

#[tokio::test]
async fn second_open_of_the_same_log_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = open(&dir);
    match LogStore::open(dir.path()) {
        Err(LogStoreError::AlreadyOpen { path }) => {
            assert_eq!(path, dir.path().join(LOG_DIR_NAME))
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a second open of a locked log succeeded"),
    }
}

#[tokio::test]
async fn a_newer_format_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Stamp the log as if a future build wrote it.
    {
        let store = open(&dir);
        let mut log = store.log.lock();
        let stamp = Stamp {
            format: FORMAT_VERSION + 1,
        };
        log.save_user_data(Some(Stored(stamp))).expect("stamp");
        log.flush(true, None).expect("flush");
    }

    match LogStore::open(dir.path()) {
        Err(LogStoreError::UnsupportedFormat { found, .. }) => {
            assert_eq!(found, FORMAT_VERSION + 1)
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a newer format was accepted"),
    }
}

#[tokio::test]
async fn an_older_builds_log_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(OLD_LOG_FILE_NAME), b"redb").expect("an old log");
    match LogStore::open(dir.path()) {
        Err(e @ LogStoreError::OldLog { .. }) => {
            assert!(e.to_string().contains("raft.redb"), "{e}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("an old log was ignored"),
    }
}

#[tokio::test]
async fn a_corrupt_log_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut store = open(&dir);
        store
            .blocking_append(sample_log(200))
            .await
            .expect("append");
    }

    // Flip a byte of entry 100's value in the middle of the log, as a failing disk might.
    let chunk = chunks(&dir).pop().expect("a chunk file");
    let bytes = std::fs::read(&chunk).expect("read the chunk");
    let at = bytes
        .windows(16)
        .position(|w| w == [100u8; 16])
        .expect("entry 100's value");
    let mut file = OpenOptions::new().write(true).open(&chunk).expect("open");
    file.seek(SeekFrom::Start(at as u64 + 3)).expect("seek");
    file.write_all(&[0xA5]).expect("flip");
    file.sync_all().expect("sync");

    match LogStore::open(dir.path()) {
        Err(LogStoreError::Corrupt { path, .. }) => assert_eq!(path, dir.path().join(LOG_DIR_NAME)),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a corrupt log was accepted"),
    }
}

#[tokio::test]
async fn the_log_directory_is_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log_dir = dir.path().join(LOG_DIR_NAME);
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };

    // A new directory is created 0700, whatever the umask allows.
    drop(open(&dir));
    assert_eq!(mode(&log_dir), 0o700);

    // One left readable to others is narrowed when opened.
    std::fs::set_permissions(&log_dir, Permissions::from_mode(0o755)).expect("chmod");
    drop(open(&dir));
    assert_eq!(mode(&log_dir), 0o700);
}

/// Where [`kill9_child`] keeps its log; set only in that child process.
const KILL9_DIR: &str = "VIGIL_TEST_RAFT_LOG_KILL9_DIR";

/// Run in a child process by [`acknowledged_appends_survive_kill_9`]: appends without end,
/// several appends in flight at a time, and prints `acked N` once entry N is reported durable.
#[tokio::test]
#[ignore = "the child process of acknowledged_appends_survive_kill_9"]
async fn kill9_child() {
    let dir = std::env::var_os(KILL9_DIR).expect("run by acknowledged_appends_survive_kill_9");
    let mut store = LogStore::open(Path::new(&dir)).expect("open");
    let state = store.get_log_state().await.expect("log state");
    let mut next = state.last_log_id.map_or(1, |id| id.index + 1);
    loop {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut tx = Some(tx);
        for n in 0..8 {
            let last = next + 2;
            let round_done = if n == 7 { tx.take() } else { None };
            let (done, flushed) = probe();
            tokio::spawn(async move {
                flushed.await.expect("reported").expect("durable");
                println!("acked {last}");
                if let Some(tx) = round_done {
                    let _ = tx.send(());
                }
            });
            store
                .append_then((next..=last).map(|i| set(2, i)), done)
                .expect("append");
            next = last + 1;
        }
        store
            .save_committed(Some(log_id(2, next - 1)))
            .await
            .expect("committed");
        rx.await.expect("round flushed");
    }
}

#[test]
fn acknowledged_appends_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut last_acked = 0;
    // Three crashes, each after a different number of acknowledgements, so the kill lands at
    // different points of a commit; each round continues the log the last one left.
    for round in 1..=3u64 {
        let mut child = Process::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "raft::log_store::tests::kill9_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(KILL9_DIR, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().expect("stdout");
        let (lines, acks) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("acked ").and_then(|n| n.parse().ok())
                    && lines.send(n).is_err()
                {
                    break;
                }
            }
        });
        let target = last_acked + 97 * round;
        let deadline = Instant::now() + PATIENCE;
        while last_acked < target {
            let left = deadline.saturating_duration_since(Instant::now());
            match acks.recv_timeout(left) {
                Ok(n) => last_acked = last_acked.max(n),
                Err(e) => {
                    let _ = child.kill();
                    panic!("round {round}: the child stopped acknowledging at {last_acked}: {e}");
                }
            }
        }
        child.kill().expect("kill -9");
        child.wait().expect("reap");

        // Every entry acknowledged before the kill is there, and the log has no hole.
        runtime.block_on(async {
            let mut store = open(&dir);
            let entries = store.try_get_log_entries(..).await.expect("read");
            assert!(
                entries.len() as u64 >= last_acked,
                "round {round}: {} entries, {last_acked} acknowledged",
                entries.len()
            );
            let expected: Vec<Entry> = (1..=entries.len() as u64).map(|i| set(2, i)).collect();
            assert_eq!(entries, expected, "round {round}");
        });
    }
}

/// The bytes the log keeps, pinned: a change to openraft's or Vigil's encodings (a reordered
/// variant, a new field) would make an existing log unreadable, so it must show up here and bump
/// [`FORMAT_VERSION`].
#[test]
fn record_encodings_keep_their_bytes() {
    fn bytes(value: &impl Encode) -> Vec<u8> {
        let mut out = Vec::new();
        value.encode(&mut out).expect("encode");
        out
    }
    let payload = |p: &openraft::type_config::alias::EntryPayloadOf<TypeConfig>| {
        bytes(&Payload(postcard::to_allocvec(p).expect("encode").into()))
    };
    let entries = sample_log(3);
    assert_eq!(FORMAT_VERSION, 2);
    assert_eq!(bytes(&Stored(log_id(2, 3))), [0, 0, 0, 3, 2, 1, 3]);
    assert_eq!(
        bytes(&Stored(Vote::new_committed(2, 1))),
        [0, 0, 0, 3, 2, 1, 1]
    );
    assert_eq!(bytes(&Stored(Stamp { format: 2 })), [0, 0, 0, 1, 2]);
    assert_eq!(payload(&entries[0].payload), [0, 0, 0, 1, 0]);
    assert_eq!(
        payload(&entries[1].payload),
        [
            0, 0, 0, 24, 2, 1, 1, 1, 1, 1, 2, b's', b'1', 14, b'1', b'2', b'7', b'.', b'0', b'.',
            b'0', b'.', b'1', b':', b'8', b'3', b'0', b'0'
        ]
    );
    // Length, EntryPayload::Normal, now_ms; Op::Kv with one KvOp::Set of "k3" to 16 bytes of
    // 3, flags 3.
    let mut normal = vec![0, 0, 0, 31, 1, 131, 208, 149, 255, 188, 49];
    normal.extend([0, 1, 0, 2, b'k', b'3', 16]);
    normal.extend([3; 16]);
    normal.push(3);
    assert_eq!(payload(&entries[2].payload), normal);
}
