use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use openraft::storage::RaftLogStorageExt as _;
use openraft::{EntryPayload, Membership};
use redb::WriteTransaction;
use vigil_shared::kv::KvOp;
use vigil_shared::rpc::{Command, Op};

use super::*;
use crate::rpc::ServerNode;

/// How long a test waits for the writer before it calls it stuck.
const PATIENCE: Duration = Duration::from_secs(30);

fn log_id(term: u64, index: u64) -> LogId {
    openraft::testing::log_id(term, 1, index)
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
    );
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

fn open(dir: &tempfile::TempDir) -> RedbLogStore {
    RedbLogStore::open(dir.path().join(LOG_FILE_NAME)).expect("open")
}

/// A completion that reports to the returned receiver.
fn probe() -> (OnDurable, mpsc::Receiver<io::Result<()>>) {
    let (tx, rx) = mpsc::channel();
    let done: OnDurable = Box::new(move |result| {
        let _ = tx.send(result);
    });
    (done, rx)
}

fn wait_durable(flushed: &mpsc::Receiver<io::Result<()>>) {
    flushed
        .recv_timeout(PATIENCE)
        .expect("the writer reported")
        .expect("the commit succeeded");
}

/// Holds redb's single write transaction, so the writer cannot commit until it is dropped.
fn stall(store: &RedbLogStore) -> WriteTransaction {
    store.shared.db.begin_write().expect("stall the writer")
}

/// The log ids the file itself holds, overlay aside.
fn in_file(store: &RedbLogStore) -> Vec<LogId> {
    let tx = store.shared.db.begin_read().expect("read");
    let table = tx.open_table(LOGS).expect("table");
    table
        .iter()
        .expect("iter")
        .map(|item| {
            decode_entry(item.expect("item").1.value())
                .expect("decode")
                .log_id
        })
        .collect()
}

fn ids(entries: &[Entry]) -> Vec<LogId> {
    entries.iter().map(|e| e.log_id).collect()
}

fn encoded_len(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|e| postcard::to_allocvec(e).expect("encode").len())
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
        store.truncate(log_id(2, 18)).await.expect("truncate");
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
async fn appended_entries_are_readable_before_they_are_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    store.blocking_append(sample_log(3)).await.expect("append");
    let mut reader = store.get_log_reader().await;

    // With the writer held up, an append returns and is readable, but is not reported durable.
    let stalled = stall(&store);
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
    assert!(matches!(flushed.try_recv(), Err(mpsc::TryRecvError::Empty)));
    assert_eq!(in_file(&store), ids(&sample_log(3)));

    // Once the writer may commit, the entries are in the file and reported durable.
    drop(stalled);
    wait_durable(&flushed);
    assert_eq!(in_file(&store), ids(&sample_log(5)));
    assert_eq!(
        reader.try_get_log_entries(..).await.expect("read"),
        sample_log(5)
    );
}

#[tokio::test]
async fn flushes_report_in_order_once_their_commit_holds_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);

    // Queue appends, a truncation and a re-append behind a held-up writer. Each completion
    // records, in the order it is called, what the file holds at its batch's first index.
    let stalled = stall(&store);
    let reports = Arc::new(Mutex::new(Vec::new()));
    let batches = [
        vec![set(1, 1), set(1, 2), set(1, 3)],
        vec![set(1, 4), set(1, 5), set(1, 6)],
        vec![set(1, 7), set(1, 8), set(1, 9)],
        vec![set(2, 8)],
    ];
    for (n, batch) in batches.into_iter().enumerate() {
        if n == 3 {
            store.truncate(log_id(1, 8)).await.expect("truncate");
        }
        let first = batch[0].log_id.index;
        let shared = Arc::clone(&store.shared);
        let reports = Arc::clone(&reports);
        let done: OnDurable = Box::new(move |result| {
            let tx = shared.db.begin_read().expect("read");
            let table = tx.open_table(LOGS).expect("table");
            let held = table
                .get(first)
                .expect("get")
                .map(|v| decode_entry(v.value()).expect("decode").log_id);
            reports.lock().push((first, result.is_ok(), held));
        });
        store.append_then(batch, done).expect("append");
    }
    store
        .save_committed(Some(log_id(1, 7)))
        .await
        .expect("committed");
    assert!(reports.lock().is_empty());

    // A vote saved after them returns only once its commit is durable, and so theirs too.
    drop(stalled);
    store
        .save_vote(&Vote::new_committed(2, 1))
        .await
        .expect("vote");
    assert_eq!(
        *reports.lock(),
        vec![
            (1, true, Some(log_id(1, 1))),
            (4, true, Some(log_id(1, 4))),
            (7, true, Some(log_id(1, 7))),
            (8, true, Some(log_id(2, 8))),
        ]
    );
    let expected: Vec<LogId> = (1..=7)
        .map(|i| log_id(1, i))
        .chain([log_id(2, 8)])
        .collect();
    assert_eq!(in_file(&store), expected);
}

#[tokio::test]
async fn truncate_and_purge_hide_entries_still_waiting_for_their_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    store.blocking_append(sample_log(6)).await.expect("append");
    let mut reader = store.get_log_reader().await;

    // Entries both in the file (5, 6) and still queued (7..=9) disappear at once.
    let stalled = stall(&store);
    let (done, queued) = probe();
    store
        .append_then([set(2, 7), set(2, 8), set(2, 9)], done)
        .expect("append");
    store.truncate(log_id(2, 5)).await.expect("truncate");
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

    // A new entry at a truncated index replaces the stale one the file still holds.
    let (done, replaced) = probe();
    store.append_then([set(3, 5)], done).expect("append");
    let mut expected = sample_log(4);
    expected.push(set(3, 5));
    assert_eq!(
        reader.try_get_log_entries(..).await.expect("read"),
        expected
    );
    assert_eq!(ids(&sample_log(6)), in_file(&store));

    // A purge hides the prefix at once too.
    store.purge(log_id(1, 2)).await.expect("purge");
    assert_eq!(
        reader.try_get_log_entries(..).await.expect("read"),
        expected[2..]
    );
    let state = store.get_log_state().await.expect("log state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));

    // Committed, the file agrees with what readers saw, and so does a reopened store.
    drop(stalled);
    wait_durable(&queued);
    wait_durable(&replaced);
    assert_eq!(in_file(&store), ids(&expected[2..]));
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

async fn read_within_budget(reader: &mut RedbLogReader, log: &[Entry]) {
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

    // Still queued: the overlay answers.
    let stalled = stall(&store);
    let (done, flushed) = probe();
    store.append_then(log[..11].to_vec(), done).expect("append");
    read_within_budget(&mut reader, &log).await;

    // Committed: the file answers.
    drop(stalled);
    wait_durable(&flushed);
    assert_eq!(in_file(&store).len(), 11);
    read_within_budget(&mut reader, &log).await;

    // A small tail queued behind the file: both answer one read.
    let stalled = stall(&store);
    let (done, flushed) = probe();
    store.append_then(log[11..].to_vec(), done).expect("append");
    read_within_budget(&mut reader, &log).await;
    let got = reader.limited_get_log_entries(10, 14).await.expect("read");
    expect_read(&got, &log, 10, 1);
    let got = reader.limited_get_log_entries(11, 14).await.expect("read");
    expect_read(&got, &log, 11, 1);
    let got = reader.limited_get_log_entries(12, 14).await.expect("read");
    expect_read(&got, &log, 12, 2);
    drop(stalled);
    wait_durable(&flushed);
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
    for flushed in &flushes {
        wait_durable(flushed);
    }

    // Appends still queued when the store is dropped are committed before it closes.
    let (done, last) = probe();
    store.append_then([set(1, 101)], done).expect("append");
    drop(store);
    wait_durable(&last);

    let mut store = open(&dir);
    let expected: Vec<Entry> = (1..=101).map(|i| set(1, i)).collect();
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
    assert_eq!(
        store.read_committed().await.expect("committed"),
        Some(log_id(1, 90))
    );
}

#[tokio::test]
async fn second_open_of_the_same_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(LOG_FILE_NAME);
    let _first = RedbLogStore::open(&path).expect("open");
    match RedbLogStore::open(&path) {
        Err(LogStoreError::AlreadyOpen { path: p }) => assert_eq!(p, path),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a second open of a locked log succeeded"),
    }
}

#[tokio::test]
async fn a_newer_format_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Stamp the file as if a future build wrote it.
    {
        let store = open(&dir);
        let tx = store.shared.db.begin_write().expect("write");
        tx.open_table(META)
            .expect("meta")
            .insert(KEY_FORMAT, [FORMAT_VERSION + 1].as_slice())
            .expect("stamp");
        tx.commit().expect("commit");
    }

    match RedbLogStore::open(dir.path().join(LOG_FILE_NAME)) {
        Err(LogStoreError::UnsupportedFormat { found, .. }) => {
            assert_eq!(found, FORMAT_VERSION + 1)
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a newer format was accepted"),
    }
}

#[tokio::test]
async fn a_corrupt_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(LOG_FILE_NAME);
    {
        let mut store = open(&dir);
        store
            .blocking_append(sample_log(200))
            .await
            .expect("append");
    }

    // Scribble over every page after the header, as a failing disk might.
    let len = std::fs::metadata(&path).expect("metadata").len();
    let mut file = OpenOptions::new().write(true).open(&path).expect("open");
    let mut offset = 4096;
    while offset < len {
        file.seek(SeekFrom::Start(offset + 64)).expect("seek");
        file.write_all(&[0xA5; 512]).expect("scribble");
        offset += 4096;
    }
    file.sync_all().expect("sync");

    match RedbLogStore::open(&path) {
        Err(LogStoreError::Corrupt { path: p, .. }) => assert_eq!(p, path),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a corrupt log was accepted"),
    }
}

#[tokio::test]
async fn the_log_file_is_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mode = |path: &Path| {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };

    // A new file is created 0600, whatever the umask allows.
    drop(open(&dir));
    assert_eq!(mode(&dir.path().join(LOG_FILE_NAME)), 0o600);

    // A file an older build left readable to others is narrowed when opened.
    let old = dir.path().join("old.redb");
    drop(RedbLogStore::open(&old).expect("open"));
    std::fs::set_permissions(&old, Permissions::from_mode(0o644)).expect("chmod");
    drop(RedbLogStore::open(&old).expect("reopen"));
    assert_eq!(mode(&old), 0o600);
}

/// Where [`kill9_child`] keeps its log; set only in that child process.
const KILL9_DIR: &str = "VIGIL_TEST_RAFT_LOG_KILL9_DIR";

/// Run in a child process by [`acknowledged_appends_survive_kill_9`]: appends without end,
/// several appends in flight at a time, and prints `acked N` once entry N is reported durable.
#[tokio::test]
#[ignore = "the child process of acknowledged_appends_survive_kill_9"]
async fn kill9_child() {
    let dir = std::env::var_os(KILL9_DIR).expect("run by acknowledged_appends_survive_kill_9");
    let mut store = RedbLogStore::open(Path::new(&dir).join(LOG_FILE_NAME)).expect("open");
    let state = store.get_log_state().await.expect("log state");
    let mut next = state.last_log_id.map_or(1, |id| id.index + 1);
    loop {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut tx = Some(tx);
        for n in 0..8 {
            let last = next + 2;
            let round_done = if n == 7 { tx.take() } else { None };
            let done: OnDurable = Box::new(move |result| {
                result.expect("durable");
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
                "raft::redb_log::tests::kill9_child",
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
