//! What a pool holds, for a router: the blocks it stored under a hash and
//! evicted, as a bounded log read by cursor (vLLM's KV events, pulled
//! rather than pushed). A reader too far behind, or of another pool (a
//! restarted server), gets the whole held set instead.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::block_hash::BlockHash;

/// The bounded log of one pool's stored and evicted hashes.
#[derive(Debug)]
pub struct KvEventLog {
    /// Identifies the pool, so a cursor of another one is never applied.
    epoch: u64,
    capacity: usize,
    /// Sequence number of `events[0]`.
    first: u64,
    /// (stored, hash): true when cached under the hash, false when evicted.
    events: VecDeque<(bool, BlockHash)>,
}

/// One read of the log: the changes since a cursor, or the whole held set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KvEventsPage {
    /// The pool's identity; read on with it.
    pub epoch: u64,
    /// Read on from here.
    pub cursor: u64,
    /// True when `stored` is the whole held set (forget what was known).
    pub reset: bool,
    /// Hashes cached since the cursor and not evicted since.
    pub stored: Vec<BlockHash>,
    /// Hashes evicted since the cursor and not stored again since.
    pub evicted: Vec<BlockHash>,
}

impl KvEventLog {
    /// An empty log of at most `capacity` events (at least 1) for pool `epoch`.
    pub fn new(capacity: usize, epoch: u64) -> Self {
        KvEventLog {
            epoch,
            capacity: capacity.max(1),
            first: 0,
            events: VecDeque::new(),
        }
    }

    /// Records that `hash` was cached (`stored`) or evicted; the oldest
    /// event goes when the log is full.
    pub fn record(&mut self, stored: bool, hash: BlockHash) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.first += 1;
        }
        self.events.push_back((stored, hash));
    }

    /// The sequence number the next event will get.
    pub fn next(&self) -> u64 {
        self.first + self.events.len() as u64
    }

    /// The changes since `since` for a reader of pool `epoch`, each hash
    /// once with its last change; the whole set from `held` when the reader
    /// is of another pool, behind the oldest event kept, or ahead.
    pub fn page(
        &self,
        since: u64,
        epoch: u64,
        held: impl FnOnce() -> Vec<BlockHash>,
    ) -> KvEventsPage {
        let next = self.next();
        // A fresh reader (since 0) of a log that lost nothing reads deltas.
        let fresh = since == 0 && self.first == 0;
        if !fresh && (epoch != self.epoch || since < self.first || since > next) {
            let mut stored = held();
            stored.sort_unstable();
            return KvEventsPage {
                epoch: self.epoch,
                cursor: next,
                reset: true,
                stored,
                evicted: Vec::new(),
            };
        }
        let skip = usize::try_from(since - self.first).unwrap_or(usize::MAX);
        let mut last: HashMap<BlockHash, bool> = HashMap::new();
        for &(stored, h) in self.events.iter().skip(skip) {
            last.insert(h, stored);
        }
        let (mut stored, mut evicted): (Vec<_>, Vec<_>) = last.into_iter().partition(|(_, s)| *s);
        stored.sort_unstable();
        evicted.sort_unstable();
        KvEventsPage {
            epoch: self.epoch,
            cursor: next,
            reset: fresh,
            stored: stored.into_iter().map(|(h, _)| h).collect(),
            evicted: evicted.into_iter().map(|(h, _)| h).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockHasher;

    fn hashes(n: u32) -> Vec<BlockHash> {
        let h = BlockHasher::new("t", 1);
        (0..n).map(|i| h.next(None, [i])).collect()
    }

    #[test]
    fn deltas_keep_each_hash_last_change() {
        let h = hashes(3);
        let mut log = KvEventLog::new(16, 7);
        log.record(true, h[0]);
        log.record(true, h[1]);
        let p = log.page(0, 7, Vec::new);
        assert_eq!((p.cursor, p.reset), (2, true));
        assert_eq!(p.stored.len(), 2);
        // Evicted then stored again: stored; stored then evicted: evicted.
        log.record(false, h[0]);
        log.record(true, h[0]);
        log.record(true, h[2]);
        log.record(false, h[2]);
        let p = log.page(2, 7, Vec::new);
        assert_eq!(p.cursor, 6);
        assert!(!p.reset);
        assert_eq!((p.stored, p.evicted), (vec![h[0]], vec![h[2]]));
        // Caught up: nothing.
        let p = log.page(6, 7, Vec::new);
        assert_eq!((p.stored.len(), p.evicted.len(), p.reset), (0, 0, false));
    }

    #[test]
    fn a_lost_cursor_gets_the_whole_held_set() {
        let h = hashes(4);
        let mut log = KvEventLog::new(2, 1);
        for &x in &h {
            log.record(true, x);
        }
        let held = || vec![h[3], h[2]];
        // (since, epoch): behind the oldest kept, ahead, another pool's.
        for (since, epoch) in [(0, 1), (1, 1), (9, 1), (3, 2)] {
            let p = log.page(since, epoch, held);
            assert!(p.reset, "{since} {epoch}");
            assert_eq!(p.cursor, 4);
            let mut want = vec![h[2], h[3]];
            want.sort_unstable();
            assert_eq!(p.stored, want);
        }
        // The oldest kept is still a delta.
        let p = log.page(2, 1, held);
        assert!(!p.reset);
        assert_eq!(p.stored.len(), 2);
    }

    #[test]
    fn a_page_round_trips_through_json_with_hex_hashes() {
        let h = hashes(1);
        let p = KvEventsPage {
            epoch: 3,
            cursor: 1,
            reset: false,
            stored: h.clone(),
            evicted: vec![],
        };
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains(&h[0].to_string()), "{text}");
        assert_eq!(h[0].to_string().len(), 64);
        assert_eq!(serde_json::from_str::<KvEventsPage>(&text).unwrap(), p);
        let bad = text.replace(&h[0].to_string(), "zz");
        assert!(serde_json::from_str::<KvEventsPage>(&bad).is_err());
    }
}
