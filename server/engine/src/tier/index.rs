//! What one lower tier holds, by block hash: least recently used first out
//! under the tier's size, and a log of what it stored and evicted for
//! routers (the device pool's [`KvEventLog`], per tier). Pure: the stores
//! do the I/O and tell the index what they did.

use std::collections::{BTreeMap, HashMap};

use ferrox_core::{BlockHash, KvEventLog, KvEventsPage};

/// The blocks of one tier, and their order of eviction.
#[derive(Debug)]
pub(crate) struct TierIndex {
    capacity: u64,
    used: u64,
    /// Hash → (stamp, bytes).
    entries: HashMap<BlockHash, (u64, u64)>,
    /// Stamp → hash: the first is evicted first.
    lru: BTreeMap<u64, BlockHash>,
    next_stamp: u64,
    events: KvEventLog,
}

impl TierIndex {
    /// An empty tier of `capacity` bytes whose log is pool `epoch`'s.
    pub fn new(capacity: u64, epoch: u64) -> Self {
        TierIndex {
            capacity,
            used: 0,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            next_stamp: 0,
            events: KvEventLog::new(8192, epoch),
        }
    }

    /// Records that the tier now holds `hash` in `bytes` bytes, the most
    /// recently used; returns the hashes evicted to make room, for the store
    /// to delete (`hash` itself when it alone is larger than the tier).
    pub fn insert(&mut self, hash: BlockHash, bytes: u64) -> Vec<BlockHash> {
        if bytes > self.capacity {
            return vec![hash];
        }
        if self.entries.contains_key(&hash) {
            self.touch(&hash);
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.used + bytes > self.capacity {
            let Some((_, old)) = self.lru.pop_first() else {
                break;
            };
            if let Some((_, b)) = self.entries.remove(&old) {
                self.used -= b;
            }
            self.events.record(false, old);
            evicted.push(old);
        }
        let stamp = self.stamp();
        self.entries.insert(hash, (stamp, bytes));
        self.lru.insert(stamp, hash);
        self.used += bytes;
        self.events.record(true, hash);
        evicted
    }

    /// Makes `hash` the most recently used, if held.
    pub fn touch(&mut self, hash: &BlockHash) {
        let stamp = self.stamp();
        if let Some(entry) = self.entries.get_mut(hash) {
            self.lru.remove(&entry.0);
            entry.0 = stamp;
            self.lru.insert(stamp, *hash);
        }
    }

    /// Forgets `hash` (its copy was found torn or corrupt, or is gone).
    pub fn remove(&mut self, hash: &BlockHash) {
        if let Some((stamp, bytes)) = self.entries.remove(hash) {
            self.lru.remove(&stamp);
            self.used -= bytes;
            self.events.record(false, *hash);
        }
    }

    /// Whether the tier holds `hash`.
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.entries.contains_key(hash)
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held, and the tier's size.
    pub fn bytes(&self) -> (u64, u64) {
        (self.used, self.capacity)
    }

    /// What the tier stored and evicted since `since`, for a reader of
    /// pool `epoch` (see [`KvEventLog::page`]).
    pub fn page(&self, since: u64, epoch: u64) -> KvEventsPage {
        let held = || self.entries.keys().copied().collect();
        self.events.page(since, epoch, held)
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> BlockHash {
        let mut s = format!("{i:02x}");
        s.push_str(&"0".repeat(62));
        s.parse().unwrap()
    }

    #[test]
    fn the_least_recently_used_go_first_under_the_size() {
        let mut t = TierIndex::new(30, 1);
        assert!(t.insert(h(1), 10).is_empty());
        assert!(t.insert(h(2), 10).is_empty());
        assert!(t.insert(h(3), 10).is_empty());
        // A use keeps 1; 2 is the oldest now.
        t.touch(&h(1));
        assert_eq!(t.insert(h(4), 10), [h(2)]);
        assert_eq!(t.insert(h(5), 20), [h(3), h(1)]);
        assert!(t.contains(&h(4)) && t.contains(&h(5)) && !t.contains(&h(1)));
        assert_eq!((t.blocks(), t.bytes()), (2, (30, 30)));
        // Larger than the tier: never held.
        assert_eq!(t.insert(h(6), 31), [h(6)]);
        assert!(!t.contains(&h(6)));
        // Held again: no copy counted twice.
        assert!(t.insert(h(4), 10).is_empty());
        assert_eq!(t.bytes().0, 30);
        t.remove(&h(4));
        assert_eq!((t.blocks(), t.bytes().0), (1, 20));
        // The router's view: a fresh reader gets every change, in the end
        // only the one block held.
        let page = t.page(0, 1);
        assert_eq!(page.stored, [h(5)]);
        let reset = t.page(0, 2);
        assert!(reset.reset);
        assert_eq!(reset.stored, [h(5)]);
    }
}
