//! Batches (many ops in one raft entry) and the op index: from protocol level 2 on every op gets
//! an index of its own, strictly increasing, also inside a batch and across restores.

use super::*;

fn set(key: &str, value: &str) -> Op {
    Op::Kv(vec![KvOp::Set {
        key: key.to_owned(),
        value: value.as_bytes().to_vec(),
        flags: 0,
    }])
}

/// A batch applies its ops in order, answers each, and reports what all of them changed; a
/// refused op refuses only itself. Each op gets its own index, even a refused one.
#[test]
fn a_batch_applies_every_op_in_order_each_at_its_own_index() {
    let mut sm = world();
    let batch = Op::Batch(vec![
        set("a", "1"),
        Op::CreateSession(session(S1, "no-such-node")),
        set("a", "2"),
        set("b", "3"),
    ]);
    let (response, fx) = apply(&mut sm, 7, batch);
    let Response::Batch(responses) = response else {
        panic!("a batch answers with a batch, got {response:?}");
    };
    assert_eq!(responses.len(), 4);
    assert_eq!(responses[1], Response::Rejected(ApplyError::MissingNode));
    assert_eq!(get(&sm, "a"), Some(entry("a", "2", 7, 9)));
    assert_eq!(get(&sm, "b"), Some(entry("b", "3", 10, 10)));
    assert_eq!(fx.kv_keys, strings(&["a", "a", "b"]));
    assert_eq!(sm.index(), 10);

    // The next entry's op goes above the batch's, however low its raft index.
    write(&mut sm, 8, op::set("c", "4"));
    assert_eq!(get(&sm, "c"), Some(entry("c", "4", 11, 11)));
    // And once the raft index passes the ops' indexes, it is the raft index again.
    write(&mut sm, 20, op::set("d", "5"));
    assert_eq!(get(&sm, "d"), Some(entry("d", "5", 20, 20)));
}

/// 64 writers batched into one entry: 64 distinct CreateIndexes (what the etcd-style queue
/// over Consul's KV needs to order contenders).
#[test]
fn concurrent_creates_in_one_entry_never_share_an_index() {
    let mut sm = world();
    let batch = Op::Batch((0..64).map(|i| set(&format!("q/{i:02}"), "x")).collect());
    apply(&mut sm, 5, batch);
    let (entries, _) = list(&sm, "q/");
    let mut indexes: Vec<u64> = entries.iter().map(|e| e.create_index).collect();
    indexes.dedup();
    assert_eq!(indexes.len(), 64, "{indexes:?}");
    assert!(
        indexes.windows(2).all(|w| w[0] < w[1]),
        "in the batch's order"
    );
}

/// Below protocol level 2 (a cluster still running servers of the first release) every op of
/// an entry takes the entry's index, as that release applies it.
#[test]
fn below_level_2_a_batch_shares_the_entrys_index() {
    let mut sm = world_at(1);
    apply(&mut sm, 7, Op::Batch(vec![set("a", "1"), set("b", "2")]));
    assert_eq!(get(&sm, "a"), Some(entry("a", "1", 7, 7)));
    assert_eq!(get(&sm, "b"), Some(entry("b", "2", 7, 7)));

    // The leader raises the level; the next batch's ops get their own indexes.
    assert_eq!(
        apply(&mut sm, 8, Op::SetProtocol { level: 2 }).0,
        Response::Done
    );
    assert_eq!(sm.protocol(), 2);
    apply(&mut sm, 9, Op::Batch(vec![set("c", "1"), set("d", "2")]));
    assert_eq!(get(&sm, "c"), Some(entry("c", "1", 9, 9)));
    assert_eq!(get(&sm, "d"), Some(entry("d", "2", 10, 10)));

    // The level never goes back.
    apply(&mut sm, 11, Op::SetProtocol { level: 1 });
    assert_eq!(sm.protocol(), 2);
}

/// A restore takes the archive's tables but never an index below the current one: every read
/// answers at least the restore's index, and the next op goes above it.
#[test]
fn a_restore_never_takes_an_index_back() {
    let mut sm = world();
    write(&mut sm, 3, op::set("a", "old"));
    let archive = sm.encode().expect("encode");
    for i in 0..5 {
        write(&mut sm, 10 + i, op::set("a", "newer"));
    }
    let before = key_index(&sm, "a");
    let (response, _) = apply(&mut sm, 20, Op::RestoreSnapshot { state: archive });
    assert_eq!(response, Response::Done);
    assert_eq!(get(&sm, "a"), Some(entry("a", "old", 3, 3)));
    assert!(key_index(&sm, "a") >= 20 && key_index(&sm, "a") > before);
    assert_eq!(list_index(&sm, "nothing-here/"), 20);
    assert!(sm.index() >= 20);
    write(&mut sm, 15, op::set("b", "after"));
    assert_eq!(get(&sm, "b").map(|e| e.create_index), Some(21));
}
