//! Batches: many ops in one raft entry.

use super::*;

/// A batch applies its ops in order at the entry's index, answers each, and reports what all
/// of them changed; a refused op refuses only itself.
#[test]
fn a_batch_applies_every_op_in_order_at_one_index() {
    let mut sm = world();
    let set = |key: &str, value: &str| {
        Op::Kv(vec![KvOp::Set {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
            flags: 0,
        }])
    };
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
    assert_eq!(get(&sm, "a"), Some(entry("a", "2", 7, 7)));
    assert_eq!(get(&sm, "b"), Some(entry("b", "3", 7, 7)));
    assert_eq!(fx.kv_keys, strings(&["a", "a", "b"]));
}
