//! Turns per key, first come first served: the acquires of one key a leader decides (one at a
//! time, so a refused one is answered without a raft entry), and the acquires an agent keeps
//! waiting on one key (only the first asks its servers). A key is in the table while someone
//! holds or waits for its turn.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OwnedMutexGuard;

/// The keys being taken turns on, each with its queue.
#[derive(Default)]
pub struct KeyTurns {
    keys: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A turn on a key, from the moment its holder queues for it; the next in the queue goes when
/// it is dropped, and the key leaves the table with its last turn (one whose holder gave up
/// waiting for it included).
pub struct KeyTurn<'a> {
    turns: &'a KeyTurns,
    key: String,
    queue: Option<Arc<tokio::sync::Mutex<()>>>,
    turn: Option<OwnedMutexGuard<()>>,
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        drop(self.turn.take());
        let Some(queue) = self.queue.take() else {
            return;
        };
        // New turns clone the queue under the table's lock: counted here, under it too.
        let mut keys = self.turns.keys.lock();
        drop(queue);
        if keys
            .get(&self.key)
            .is_some_and(|queue| Arc::strong_count(queue) == 1)
        {
            keys.remove(&self.key);
        }
    }
}

impl KeyTurns {
    /// Waits for the turns on `key` queued before this one to end.
    pub async fn turn(&self, key: &str) -> KeyTurn<'_> {
        let queue = Arc::clone(self.keys.lock().entry(key.to_owned()).or_default());
        let mut turn = KeyTurn {
            turns: self,
            key: key.to_owned(),
            queue: Some(Arc::clone(&queue)),
            turn: None,
        };
        turn.turn = Some(queue.lock_owned().await);
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_leaves_the_table_with_its_last_turn_even_one_given_up() {
        let turns = KeyTurns::default();
        let first = turns.turn("k").await;
        // A second queues; its turn comes, and its holder goes away before it takes it (the
        // first saw it waiting, so left the key in the table for it).
        let mut second = Box::pin(turns.turn("k"));
        assert!(futures::poll!(&mut second).is_pending());
        drop(first);
        drop(second);
        assert!(turns.keys.lock().is_empty(), "the key stayed in the table");

        // Two that both get their turn, one after the other.
        let first = turns.turn("k").await;
        let second = async { turns.turn("k").await };
        let (_, second) = tokio::join!(async { drop(first) }, second);
        assert_eq!(turns.keys.lock().len(), 1);
        drop(second);
        assert!(turns.keys.lock().is_empty());
    }

    #[tokio::test]
    async fn turns_come_in_the_order_they_were_asked_for() {
        let turns = KeyTurns::default();
        let first = turns.turn("k").await;
        let order = Mutex::new(Vec::new());
        let waiter = |n: u32| {
            let (turns, order) = (&turns, &order);
            async move {
                let _turn = turns.turn("k").await;
                order.lock().push(n);
            }
        };
        let (mut a, mut b, mut c) = (
            Box::pin(waiter(1)),
            Box::pin(waiter(2)),
            Box::pin(waiter(3)),
        );
        for queued in [&mut a, &mut b, &mut c] {
            assert!(futures::poll!(queued).is_pending());
        }
        drop(first);
        tokio::join!(c, b, a);
        assert_eq!(*order.lock(), [1, 2, 3]);
    }
}
