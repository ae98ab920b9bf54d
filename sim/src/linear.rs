//! Linearizability of one register, checked the way Wing and Gong, Lowe and Porcupine do: a
//! depth-first search for an order of the operations that respects real time (an operation
//! that returned before another was called comes first) and the register's rules, memoizing
//! (operations linearized, value) pairs already explored so the search stays fast on
//! thousands of operations. An operation whose outcome is unknown (it timed out, its
//! connection dropped, the server answered "may or may not have been applied") is open-ended:
//! it may take effect at any point after its call, or never (it is placed last).
//!
//! The register holds a value or nothing. Writes and compare-and-set carry unique values, so a
//! cas by `ModifyIndex` is a cas on the value read with that index.

use std::collections::HashSet;
use std::fmt;

/// What an operation asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Input {
    Read,
    Write(String),
    /// Set `new` if the register holds `expected` (`None`: if it is empty).
    Cas {
        expected: Option<String>,
        new: String,
    },
}

/// What an operation was answered; `None` in [`Op::output`] when the answer is unknown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Output {
    /// A read's value (`None`: the key did not exist).
    Value(Option<String>),
    Written,
    /// Whether a cas was applied.
    Applied(bool),
}

/// One operation of one client, with its call and return times (ns on one monotonic clock);
/// `ret: None` and `output: None` for one whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub client: usize,
    pub input: Input,
    pub output: Option<Output>,
    pub call: u64,
    pub ret: Option<u64>,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: u64| ns as f64 / 1e6;
        let ret = self
            .ret
            .map_or("never".to_owned(), |r| format!("{:.3} ms", ms(r)));
        let output = match &self.output {
            None => "unknown".to_owned(),
            Some(Output::Value(v)) => format!("{v:?}"),
            Some(Output::Written) => "ok".to_owned(),
            Some(Output::Applied(a)) => format!("{a}"),
        };
        write!(
            f,
            "client {} {:?} -> {output} [{:.3} ms .. {ret}]",
            self.client,
            self.input,
            ms(self.call)
        )
    }
}

/// The register's rule: the state after `input` answered `output` in state `state`, or
/// `None` if that answer is impossible there.
fn step(state: &Option<String>, input: &Input, output: Option<&Output>) -> Option<Option<String>> {
    match (input, output) {
        (Input::Read, Some(Output::Value(v))) => (v == state).then(|| state.clone()),
        // A read whose answer is unknown says nothing.
        (Input::Read, None) => Some(state.clone()),
        (Input::Write(v), Some(Output::Written) | None) => Some(Some(v.clone())),
        (Input::Cas { expected, new }, Some(Output::Applied(true))) => {
            (expected == state).then(|| Some(new.clone()))
        }
        (Input::Cas { expected, .. }, Some(Output::Applied(false))) => {
            (expected != state).then(|| state.clone())
        }
        // Unknown: it applied if it could have, at the point it is placed.
        (Input::Cas { expected, new }, None) => Some(if expected == state {
            Some(new.clone())
        } else {
            state.clone()
        }),
        _ => None,
    }
}

/// Why a history is not linearizable: the operations no order could place, with the longest
/// prefix the search found before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// The longest linearized prefix found (in order), and the register's value after it.
    pub prefix: Vec<Op>,
    pub value: Option<String>,
    /// The operations that had returned, or were running, where that prefix got stuck.
    pub stuck: Vec<Op>,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "no linear order: after {} operations the register holds {:?}; the last of them:",
            self.prefix.len(),
            self.value
        )?;
        for op in self.prefix.iter().rev().take(5).rev() {
            writeln!(f, "      {op}")?;
        }
        writeln!(f, "    and none of these can come next:")?;
        for op in &self.stuck {
            writeln!(f, "      {op}")?;
        }
        Ok(())
    }
}

/// An entry of the search's list: an operation's call or its return.
#[derive(Debug, Clone, Copy)]
struct Entry {
    op: usize,
    call: bool,
    prev: usize,
    next: usize,
}

/// The list of calls and returns in time order, with removal and re-insertion of an
/// operation's pair (Knuth's dancing links). Node 0 is the head; `NONE` ends the list.
struct Links {
    entries: Vec<Entry>,
    /// For each operation, the indexes of its call and return entries.
    of: Vec<(usize, usize)>,
}

const NONE: usize = usize::MAX;

impl Links {
    fn new(ops: &[Op]) -> Links {
        // (time, is a return, op): at one instant calls come before returns, which reads two
        // operations touching in time as concurrent (the lenient reading).
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * ops.len());
        for (i, op) in ops.iter().enumerate() {
            events.push((op.call, false, i));
            events.push((op.ret.unwrap_or(u64::MAX), true, i));
        }
        events.sort_unstable();
        let mut entries = vec![Entry {
            op: NONE,
            call: false,
            prev: NONE,
            next: NONE,
        }];
        let mut of = vec![(0, 0); ops.len()];
        for (_, is_return, op) in events {
            let at = entries.len();
            let prev = at - 1;
            entries[prev].next = at;
            entries.push(Entry {
                op,
                call: !is_return,
                prev,
                next: NONE,
            });
            if is_return {
                of[op].1 = at;
            } else {
                of[op].0 = at;
            }
        }
        Links { entries, of }
    }

    fn first(&self) -> usize {
        self.entries[0].next
    }

    fn unlink(&mut self, at: usize) {
        let Entry { prev, next, .. } = self.entries[at];
        self.entries[prev].next = next;
        if next != NONE {
            self.entries[next].prev = prev;
        }
    }

    fn relink(&mut self, at: usize) {
        let Entry { prev, next, .. } = self.entries[at];
        self.entries[prev].next = at;
        if next != NONE {
            self.entries[next].prev = at;
        }
    }

    /// Takes operation `op` (its call and return) out of the list.
    fn lift(&mut self, op: usize) {
        let (call, ret) = self.of[op];
        self.unlink(call);
        self.unlink(ret);
    }

    /// Puts operation `op` back, in the reverse order of [`Links::lift`].
    fn unlift(&mut self, op: usize) {
        let (call, ret) = self.of[op];
        self.relink(ret);
        self.relink(call);
    }
}

/// Checks that `ops` (one register's whole history, from an empty register) is linearizable.
pub fn check(ops: &[Op]) -> Result<(), Anomaly> {
    let mut links = Links::new(ops);
    let words = ops.len().div_ceil(64);
    let mut done = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, Option<String>)> = HashSet::new();
    let mut stack: Vec<(usize, Option<String>)> = Vec::new();
    let mut state: Option<String> = None;
    let mut best: (Vec<usize>, Option<String>) = (Vec::new(), None);
    let mut at = links.first();
    while links.first() != NONE {
        let entry = links.entries[at];
        if entry.call {
            let op = &ops[entry.op];
            if let Some(next) = step(&state, &op.input, op.output.as_ref()) {
                let mut after = done.clone();
                after[entry.op / 64] |= 1 << (entry.op % 64);
                if seen.insert((after.clone(), next.clone())) {
                    stack.push((entry.op, std::mem::replace(&mut state, next)));
                    done = after;
                    links.lift(entry.op);
                    at = links.first();
                    if stack.len() > best.0.len() {
                        best = (stack.iter().map(|(op, _)| *op).collect(), state.clone());
                    }
                    continue;
                }
            }
            at = entry.next;
        } else {
            // A return whose call is not linearized yet: undo the last choice and try the
            // operation after it instead.
            let Some((op, before)) = stack.pop() else {
                return Err(anomaly(ops, best));
            };
            state = before;
            done[op / 64] &= !(1 << (op % 64));
            links.unlift(op);
            at = links.entries[links.of[op].0].next;
        }
    }
    Ok(())
}

/// The anomaly for the longest prefix `best` found: the operations pending where it stopped
/// (every one called before the first return still in the list, that return's included).
fn anomaly(ops: &[Op], best: (Vec<usize>, Option<String>)) -> Anomaly {
    let (prefix, value) = best;
    let placed: HashSet<usize> = prefix.iter().copied().collect();
    let first_return = ops
        .iter()
        .enumerate()
        .filter(|(i, _)| !placed.contains(i))
        .filter_map(|(_, op)| op.ret)
        .min()
        .unwrap_or(u64::MAX);
    let mut stuck: Vec<Op> = ops
        .iter()
        .enumerate()
        .filter(|(i, op)| !placed.contains(i) && op.call <= first_return)
        .map(|(_, op)| op.clone())
        .collect();
    stuck.sort_by_key(|op| op.call);
    Anomaly {
        prefix: prefix.into_iter().map(|i| ops[i].clone()).collect(),
        value,
        stuck,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: usize, input: Input, output: Option<Output>, call: u64, ret: Option<u64>) -> Op {
        Op {
            client,
            input,
            output,
            call,
            ret,
        }
    }

    fn write(client: usize, v: &str, call: u64, ret: u64) -> Op {
        op(
            client,
            Input::Write(v.into()),
            Some(Output::Written),
            call,
            Some(ret),
        )
    }

    fn read(client: usize, v: Option<&str>, call: u64, ret: u64) -> Op {
        op(
            client,
            Input::Read,
            Some(Output::Value(v.map(str::to_owned))),
            call,
            Some(ret),
        )
    }

    #[test]
    fn sequential_and_concurrent_histories_pass() {
        // w(a) then r(a); a read concurrent with a write may see either value.
        let ops = [
            write(0, "a", 0, 10),
            read(1, Some("a"), 11, 20),
            write(0, "b", 21, 40),
            read(1, Some("a"), 22, 30),
            read(2, Some("b"), 25, 35),
            read(1, Some("b"), 41, 50),
        ];
        assert_eq!(check(&ops), Ok(()));
        assert_eq!(check(&[read(0, None, 0, 1)]), Ok(()));
    }

    #[test]
    fn a_stale_read_is_caught() {
        // b was written (and acknowledged) before the read began, which saw a.
        let ops = [
            write(0, "a", 0, 10),
            write(0, "b", 11, 20),
            read(1, Some("a"), 21, 30),
        ];
        let anomaly = check(&ops).expect_err("stale read");
        assert_eq!(anomaly.prefix.len(), 2);
        assert!(anomaly.stuck.iter().any(|o| o.input == Input::Read));
    }

    #[test]
    fn a_read_that_goes_back_in_time_is_caught() {
        // Two reads in a row (not overlapping) see b then a, while a is never written again.
        let ops = [
            write(0, "a", 0, 10),
            write(1, "b", 5, 100),
            read(2, Some("b"), 20, 30),
            read(2, Some("a"), 40, 50),
        ];
        assert!(check(&ops).is_err());
    }

    #[test]
    fn an_unknown_write_may_or_may_not_have_happened() {
        let maybe = op(0, Input::Write("x".into()), None, 5, None);
        // Seen by a later read: it happened.
        let seen = [
            write(1, "a", 0, 1),
            maybe.clone(),
            read(2, Some("x"), 50, 60),
        ];
        assert_eq!(check(&seen), Ok(()));
        // Never seen: it did not (or not yet).
        let unseen = [
            write(1, "a", 0, 1),
            maybe.clone(),
            read(2, Some("a"), 50, 60),
        ];
        assert_eq!(check(&unseen), Ok(()));
        // But once seen it cannot be unseen without a write in between.
        let flicker = [
            write(1, "a", 0, 1),
            maybe,
            read(2, Some("x"), 50, 60),
            read(2, Some("a"), 70, 80),
        ];
        assert!(check(&flicker).is_err());
    }

    #[test]
    fn cas_follows_the_register() {
        let cas = |client, expected: Option<&str>, new: &str, applied, call, ret| {
            op(
                client,
                Input::Cas {
                    expected: expected.map(str::to_owned),
                    new: new.into(),
                },
                Some(Output::Applied(applied)),
                call,
                Some(ret),
            )
        };
        let good = [
            cas(0, None, "a", true, 0, 10),
            cas(1, None, "b", false, 11, 20),
            cas(1, Some("a"), "c", true, 21, 30),
            read(2, Some("c"), 31, 40),
        ];
        assert_eq!(check(&good), Ok(()));
        // Two clients both succeed a cas from the same value, one after the other: lost update.
        let lost = [
            write(0, "a", 0, 10),
            cas(1, Some("a"), "b", true, 11, 20),
            cas(2, Some("a"), "c", true, 21, 30),
        ];
        assert!(check(&lost).is_err());
    }

    #[test]
    fn a_long_concurrent_history_passes() {
        // 4 clients, 2000 operations, heavy overlap: the memo keeps the search short.
        let mut ops = Vec::new();
        let mut value: Option<String> = None;
        for i in 0..2000u64 {
            let client = (i % 4) as usize;
            let call = i * 10;
            if i % 3 == 0 {
                let v = format!("v{i}");
                ops.push(write(client, &v, call, call + 35));
                value = Some(v);
            } else {
                ops.push(read(client, value.as_deref(), call + 36, call + 38));
            }
        }
        assert_eq!(check(&ops), Ok(()));
    }
}
