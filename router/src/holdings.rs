//! What one endpoint holds, as the router knows it: the hashes its server
//! reported stored (from its KV event pages) and, until the server reports
//! them, the chains the router itself just sent there, so a burst of
//! requests with one new prefix lands on one endpoint rather than spreading
//! before the first of them is cached.

use std::collections::{HashMap, HashSet};

use ferrox_core::{BlockHash, KvEventsPage};

/// One endpoint's held blocks. `D` is the clock of the expectations.
#[derive(Debug, Clone, Default)]
pub struct Holdings<D> {
    epoch: u64,
    cursor: u64,
    stored: HashSet<BlockHash>,
    /// Sent there, not reported yet: expected until the instant.
    expected: HashMap<BlockHash, D>,
}

impl<D: Ord + Copy> Holdings<D> {
    /// Nothing known.
    pub fn new() -> Self {
        Holdings {
            epoch: 0,
            cursor: 0,
            stored: HashSet::new(),
            expected: HashMap::new(),
        }
    }

    /// Where to read the server's log on from: (cursor, epoch).
    pub fn cursor(&self) -> (u64, u64) {
        (self.cursor, self.epoch)
    }

    /// Applies one page of the server's log.
    pub fn apply(&mut self, page: &KvEventsPage) {
        if page.reset {
            self.stored.clear();
        }
        for h in &page.evicted {
            self.stored.remove(h);
            self.expected.remove(h);
        }
        for h in &page.stored {
            self.stored.insert(*h);
            self.expected.remove(h);
        }
        self.epoch = page.epoch;
        self.cursor = page.cursor;
    }

    /// Expects `chain` to be held until `until` (the request was sent here).
    pub fn expect(&mut self, chain: &[BlockHash], until: D) {
        for h in chain {
            if !self.stored.contains(h) {
                self.expected.insert(*h, until);
            }
        }
    }

    /// Drops the expectations due at or before `now`.
    pub fn prune(&mut self, now: D) {
        self.expected.retain(|_, until| *until > now);
    }

    /// How many leading blocks of `chain` are held (reported, or expected
    /// past `now`).
    pub fn held_run(&self, chain: &[BlockHash], now: D) -> usize {
        chain.iter().take_while(|h| self.holds(h, now)).count()
    }

    /// Whether `h` is held (reported, or expected past `now`).
    pub fn holds(&self, h: &BlockHash, now: D) -> bool {
        self.stored.contains(h) || self.expected.get(h).is_some_and(|u| *u > now)
    }

    /// Hashes reported held.
    pub fn len(&self) -> usize {
        self.stored.len()
    }

    /// True when none is reported held.
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_core::BlockHasher;

    fn chain(tokens: &[u32]) -> Vec<BlockHash> {
        BlockHasher::new("m", 2).chain(tokens)
    }

    fn page(cursor: u64, reset: bool, stored: &[BlockHash], evicted: &[BlockHash]) -> KvEventsPage {
        KvEventsPage {
            epoch: 9,
            cursor,
            reset,
            stored: stored.to_vec(),
            evicted: evicted.to_vec(),
        }
    }

    #[test]
    fn reported_blocks_count_as_a_leading_run() {
        let c = chain(&[1, 2, 3, 4, 5, 6]);
        let mut h: Holdings<u64> = Holdings::new();
        assert_eq!(h.held_run(&c, 0), 0);
        h.apply(&page(2, true, &c[..2], &[]));
        assert_eq!((h.held_run(&c, 0), h.cursor(), h.len()), (2, (2, 9), 2));
        // The first block evicted: nothing leads any more.
        h.apply(&page(3, false, &[], &c[..1]));
        assert_eq!(h.held_run(&c, 0), 0);
        // A reset replaces what was known.
        h.apply(&page(5, true, &c[2..], &[]));
        assert_eq!((h.held_run(&c, 0), h.len()), (0, 1));
        assert_eq!(h.held_run(&c[2..], 0), 1);
    }

    #[test]
    fn expectations_count_until_reported_or_due() {
        let c = chain(&[1, 2, 3, 4]);
        let mut h: Holdings<u64> = Holdings::new();
        h.expect(&c, 10);
        assert_eq!(h.held_run(&c, 5), 2);
        assert_eq!(h.held_run(&c, 10), 0, "due at 10");
        // Reported: held whatever the clock says.
        h.apply(&page(1, false, &c[..1], &[]));
        h.prune(20);
        assert_eq!(h.held_run(&c, 20), 1);
        assert!(!h.is_empty());
    }
}
