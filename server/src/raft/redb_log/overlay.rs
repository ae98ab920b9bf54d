//! What openraft has written to the raft log that the file may not hold yet: appended entries
//! waiting for their commit, truncations the writer has not committed, and the last purged log
//! id as openraft last set it. Readers see the log as this overlay laid over the file.
//!
//! Every change carries the sequence number of its request to the writer, and the writer
//! commits requests in that order. So while a change is here, the file holds only changes made
//! before it: the overlay is exact as long as a reader takes it and its file snapshot together,
//! and the writer forgets a change only after the commit that holds it.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::raft::LogId;

/// One appended entry the file may not hold yet.
struct Pending {
    log_id: LogId,
    /// The entry's postcard encoding: what readers decode and the writer stores.
    encoded: Bytes,
    /// The request that wrote it, so a commit forgets only what it wrote (a later append may
    /// have replaced it after a truncation).
    seq: u64,
}

/// The part of the log the file may lag behind on; see the module documentation.
pub(super) struct Overlay {
    /// By log index.
    entries: BTreeMap<u64, Pending>,
    /// Truncations not yet committed: (first removed index, sequence number). Everything the
    /// file holds predates all of them, so the file hides every index from the smallest on.
    truncations: Vec<(u64, u64)>,
    /// The file hides every index up to this one, whether or not its purge is committed yet.
    last_purged: Option<LogId>,
}

impl Overlay {
    /// An empty overlay over a file whose last purged log id is `last_purged`.
    pub(super) fn new(last_purged: Option<LogId>) -> Overlay {
        Overlay {
            entries: BTreeMap::new(),
            truncations: Vec::new(),
            last_purged,
        }
    }

    /// Adds entries appended by request `seq`; `entries` hold their log id and encoding.
    pub(super) fn append(&mut self, seq: u64, entries: &[(LogId, Bytes)]) {
        for (log_id, encoded) in entries {
            let pending = Pending {
                log_id: *log_id,
                encoded: encoded.clone(),
                seq,
            };
            self.entries.insert(log_id.index, pending);
        }
    }

    /// Removes every index from `from` on, by request `seq`.
    pub(super) fn truncate(&mut self, seq: u64, from: u64) {
        self.entries.split_off(&from);
        self.truncations.push((from, seq));
    }

    /// Removes every index up to `upto.index`.
    pub(super) fn purge(&mut self, upto: LogId) {
        self.entries = self.entries.split_off(&(upto.index + 1));
        self.last_purged = Some(upto);
    }

    /// The writer has committed every request up to `seq`: forget what the file now holds.
    pub(super) fn flushed(&mut self, seq: u64) {
        self.entries.retain(|_, pending| pending.seq > seq);
        self.truncations
            .retain(|&(_, truncated_by)| truncated_by > seq);
    }

    pub(super) fn last_purged(&self) -> Option<LogId> {
        self.last_purged
    }

    /// The last entry appended and still here.
    pub(super) fn last(&self) -> Option<LogId> {
        self.entries.values().next_back().map(|p| p.log_id)
    }

    /// The indexes `[start, end)` of the file that belong to the log: after the last purged
    /// index and before the first truncated one.
    pub(super) fn file_window(&self) -> (u64, u64) {
        let start = self.last_purged.map_or(0, |id| id.index + 1);
        let end = self
            .truncations
            .iter()
            .map(|&(from, _)| from)
            .min()
            .unwrap_or(u64::MAX);
        (start, end)
    }

    /// The encoded entries in `[start, end)`, in index order, stopping after the first whose
    /// size takes the total above `budget` (no read can return more than that).
    pub(super) fn encoded(&self, start: u64, end: u64, budget: usize) -> Vec<(u64, Bytes)> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut total = 0usize;
        for (&index, pending) in self.entries.range(start..end) {
            out.push((index, pending.encoded.clone()));
            total = total.saturating_add(pending.encoded.len());
            if total > budget {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, index: u64) -> LogId {
        openraft::testing::log_id(term, 1, index)
    }

    fn entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<(LogId, Bytes)> {
        indexes
            .map(|i| (id(term, i), Bytes::from(vec![term as u8; i as usize])))
            .collect()
    }

    fn indexes(overlay: &Overlay) -> Vec<u64> {
        overlay
            .encoded(0, u64::MAX, usize::MAX)
            .into_iter()
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn a_commit_forgets_only_what_it_wrote() {
        let mut overlay = Overlay::new(None);

        // Request 1 appends 1..=5, request 2 truncates from 4, request 3 appends a new 4..=6.
        overlay.append(1, &entries(1, 1..=5));
        overlay.truncate(2, 4);
        overlay.append(3, &entries(2, 4..=6));
        assert_eq!(indexes(&overlay), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(overlay.file_window(), (0, 4));
        assert_eq!(overlay.last(), Some(id(2, 6)));

        // Committing request 1 leaves the truncation hiding the file's stale 4 and 5.
        overlay.flushed(1);
        assert_eq!(indexes(&overlay), vec![4, 5, 6]);
        assert_eq!(overlay.file_window(), (0, 4));

        // Once the truncation and the new entries are committed, the file is the log.
        overlay.flushed(3);
        assert!(indexes(&overlay).is_empty());
        assert_eq!(overlay.file_window(), (0, u64::MAX));
        assert_eq!(overlay.last(), None);
    }

    #[test]
    fn the_smallest_pending_truncation_bounds_the_file() {
        let mut overlay = Overlay::new(None);
        overlay.truncate(1, 15);
        overlay.truncate(2, 20);
        overlay.truncate(3, 12);
        assert_eq!(overlay.file_window(), (0, 12));
        overlay.flushed(2);
        assert_eq!(overlay.file_window(), (0, 12));
        overlay.flushed(3);
        assert_eq!(overlay.file_window(), (0, u64::MAX));
    }

    #[test]
    fn a_purge_hides_the_prefix_at_once() {
        let mut overlay = Overlay::new(Some(id(1, 2)));
        assert_eq!(overlay.file_window(), (3, u64::MAX));
        overlay.append(1, &entries(1, 3..=8));
        overlay.purge(id(1, 5));
        assert_eq!(indexes(&overlay), vec![6, 7, 8]);
        assert_eq!(overlay.file_window(), (6, u64::MAX));
        assert_eq!(overlay.last_purged(), Some(id(1, 5)));
    }

    #[test]
    fn encoded_stops_after_the_entry_that_crosses_the_budget() {
        let mut overlay = Overlay::new(None);
        // Entry i is i bytes long.
        overlay.append(1, &entries(1, 1..=10));
        let picked: Vec<u64> = overlay
            .encoded(2, 9, 10)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        // 2 + 3 + 4 = 9, then 5 crosses 10: the reader decides whether it still fits.
        assert_eq!(picked, vec![2, 3, 4, 5]);
        assert!(overlay.encoded(5, 5, usize::MAX).is_empty());
    }
}
