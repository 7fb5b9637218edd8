//! The KV block pool: a fixed number of blocks, handed out as leases that give
//! their blocks back when dropped, so a block can leave a sequence in exactly
//! one way.
//!
//! With the prefix cache, a lease's full blocks are registered under their
//! chain hash once computed; when the lease ends they stay cached, unpinned,
//! and the next lease whose prompt starts with them pins (shares) them instead
//! of computing them. Unpinned cached blocks count as free and are evicted
//! least recently used first when a lease needs a block; a pinned block is
//! never evicted. A lease reserves at creation every block it may ever need
//! (less the cached ones it pins) and draws them as its sequence grows, so a
//! sequence never finds the pool empty halfway through.
//!
//! A lease of a windowed group (sliding-window layers) gives back the blocks
//! its window has left ([`BlockLease::release_before`]), through the same
//! release as its drop: the table keeps its shape (position `p` is still in
//! entry `p / block_size`) with [`RELEASED`] in the entries given back, and the
//! reservation keeps its size, so a block given back can be drawn again by
//! the same lease as the window moves on, never by another.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use crate::Error;
use crate::block_hash::BlockHash;
use crate::kv_events::{KvEventLog, KvEventsPage};

/// A block-table entry whose block was given back (outside its window).
pub const RELEASED: u32 = u32::MAX;

/// The state of one block.
#[derive(Debug, Clone, Default)]
struct Block {
    /// Leases holding it.
    refs: u32,
    /// The hash it is cached under, if it is.
    hash: Option<BlockHash>,
    /// Whether it holds tokens (written by its lease, or cached).
    written: bool,
    /// Its place in the eviction order while cached and unpinned.
    stamp: u64,
}

#[derive(Debug)]
struct Inner {
    blocks: Vec<Block>,
    /// Blocks holding nothing and cached under no hash.
    free: Vec<u32>,
    /// Cached, unpinned blocks by stamp: the first is evicted first.
    lru: BTreeMap<u64, u32>,
    next_stamp: u64,
    /// Cached blocks by hash, pinned or not.
    index: HashMap<BlockHash, u32>,
    /// Blocks held by at least one lease.
    held: usize,
    /// Held blocks that are cached.
    pinned: usize,
    /// Held blocks that hold tokens.
    filled: usize,
    /// Blocks promised to leases and not drawn yet. Always at most
    /// `free.len() + lru.len()`: a draw never fails.
    owed: usize,
    /// Hashes cached and evicted, for routers; `None`: not kept.
    events: Option<KvEventLog>,
}

/// What a new sequence asks of the pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reservation<'a> {
    /// Chain hashes of the prompt's full blocks (empty without the cache).
    pub hashes: &'a [BlockHash],
    /// Most leading blocks it may take from the cache.
    pub max_cached: usize,
    /// Blocks it needs at once (its prompt's).
    pub now: usize,
    /// Blocks it may ever need; the rest of them are drawn as it grows.
    pub total: usize,
}

/// Where the pool's blocks are, for the gauges. `reserved + cached + free`
/// is `total`; a new lease may take `cached + free`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Held or promised by live leases: what admission counts as used.
    pub reserved: usize,
    /// Reserved blocks held now (the rest are promised and not drawn, or
    /// given back by a window and promised again).
    pub held: usize,
    /// Reserved blocks that are cached, shared by every lease holding them.
    pub pinned: usize,
    /// Reserved blocks that hold tokens.
    pub filled: usize,
    /// Cached, unpinned, not promised to a lease: free but evictable.
    pub cached: usize,
    /// Neither reserved nor cached.
    pub free: usize,
}

/// A fixed pool of KV blocks. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    inner: Arc<Mutex<Inner>>,
}

fn lock(inner: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    // Every operation leaves the state whole before it can panic, so a
    // panic elsewhere while holding the lock cannot corrupt it.
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// Blocks a new lease may take: free and unpinned cached, less what
    /// live leases are owed.
    fn available(&self) -> usize {
        (self.free.len() + self.lru.len()).saturating_sub(self.owed)
    }

    /// The longest run of cached blocks that prefixes `hashes`.
    fn cached_run(&self, hashes: &[BlockHash]) -> Vec<u32> {
        hashes
            .iter()
            .map_while(|h| self.index.get(h).copied())
            .collect()
    }

    /// Holds one more reference to cached block `b`.
    fn pin(&mut self, b: u32) {
        let block = &mut self.blocks[b as usize];
        if block.refs == 0 {
            self.lru.remove(&block.stamp);
            self.held += 1;
            self.pinned += 1;
            self.filled += 1;
        }
        block.refs += 1;
    }

    /// A block for a lease: a free one, else the least recently used cached
    /// one, evicted. `None` only if the pool has neither.
    fn take(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                if let Some(h) = self.blocks[b as usize].hash.take() {
                    self.index.remove(&h);
                    if let Some(log) = &mut self.events {
                        log.record(false, h);
                    }
                }
                b
            }
        };
        self.blocks[b as usize] = Block {
            refs: 1,
            ..Block::default()
        };
        self.held += 1;
        Some(b)
    }

    /// Drops one reference to `b`; at the last, a cached block becomes the
    /// most recently used unpinned one and any other block becomes free.
    fn release(&mut self, b: u32) {
        let block = &mut self.blocks[b as usize];
        block.refs = block.refs.saturating_sub(1);
        if block.refs > 0 {
            return;
        }
        self.held -= 1;
        if block.written {
            self.filled -= 1;
        }
        if block.hash.is_some() {
            self.pinned -= 1;
            block.stamp = self.next_stamp;
            self.next_stamp += 1;
            self.lru.insert(block.stamp, b);
        } else {
            block.written = false;
            self.free.push(b);
        }
    }
}

impl BlockPool {
    /// A pool of `total` blocks, ids `0..total`.
    pub fn new(total: usize) -> Self {
        Self::build(total, None)
    }

    /// A pool of `total` blocks that logs what it caches and evicts (at
    /// most `log_capacity` events kept), as pool `epoch`.
    pub fn with_event_log(total: usize, log_capacity: usize, epoch: u64) -> Self {
        Self::build(total, Some(KvEventLog::new(log_capacity, epoch)))
    }

    /// The cached hashes changed since `since` for a reader of pool
    /// `epoch` (see [`KvEventLog::page`]); an empty page when no log is kept.
    pub fn kv_events(&self, since: u64, epoch: u64) -> KvEventsPage {
        let inner = lock(&self.inner);
        match &inner.events {
            Some(log) => log.page(since, epoch, || inner.index.keys().copied().collect()),
            None => KvEventsPage::default(),
        }
    }

    fn build(total: usize, events: Option<KvEventLog>) -> Self {
        // Reversed so `pop` hands out low ids first: easier to read in logs.
        let free = (0..total as u32).rev().collect();
        BlockPool {
            inner: Arc::new(Mutex::new(Inner {
                blocks: vec![Block::default(); total],
                free,
                lru: BTreeMap::new(),
                next_stamp: 0,
                index: HashMap::new(),
                held: 0,
                pinned: 0,
                filled: 0,
                owed: 0,
                events,
            })),
        }
    }

    /// Takes `n` blocks now, none from the cache, or fails taking none.
    pub fn allocate(&self, n: usize) -> Result<BlockLease, Error> {
        self.reserve(&Reservation {
            now: n,
            total: n,
            ..Reservation::default()
        })
    }

    /// Pins the longest cached run of `r.hashes` (at most `r.max_cached`),
    /// takes the rest of `r.now` blocks and promises the rest of `r.total`;
    /// or, if the pool cannot cover `r.total` less the pinned blocks, fails
    /// taking nothing.
    pub fn reserve(&self, r: &Reservation<'_>) -> Result<BlockLease, Error> {
        let mut inner = lock(&self.inner);
        let max_cached = r.max_cached.min(r.hashes.len()).min(r.now);
        let hits = inner.cached_run(&r.hashes[..max_cached]);
        let total = r.total.max(r.now);
        let need = total - hits.len();
        // Pinning an unpinned hit takes it out of what others may evict.
        let unpinned = hits
            .iter()
            .filter(|&&b| inner.blocks[b as usize].refs == 0)
            .count();
        if need + unpinned > inner.available() {
            return Err(Error::PoolExhausted {
                asked: need,
                free: inner.available().saturating_sub(unpinned),
                total: inner.blocks.len(),
            });
        }
        for &b in &hits {
            inner.pin(b);
        }
        let mut blocks = hits;
        let cached = blocks.len();
        while blocks.len() < r.now {
            // Covered by the check above.
            let Some(b) = inner.take() else { break };
            blocks.push(b);
        }
        let owed = total - blocks.len();
        inner.owed += owed;
        Ok(BlockLease {
            released: 0,
            committed: cached,
            written: cached,
            cached,
            blocks,
            owed,
            pool: Arc::clone(&self.inner),
        })
    }

    /// How many leading blocks of `hashes` are cached now.
    pub fn cached_prefix(&self, hashes: &[BlockHash]) -> usize {
        lock(&self.inner).cached_run(hashes).len()
    }

    /// Where the blocks are.
    pub fn stats(&self) -> PoolStats {
        let inner = lock(&self.inner);
        // What leases are owed comes from free blocks first, then cached.
        let free = inner.free.len();
        PoolStats {
            total: inner.blocks.len(),
            reserved: inner.held + inner.owed,
            held: inner.held,
            pinned: inner.pinned,
            filled: inner.filled,
            cached: inner
                .lru
                .len()
                .saturating_sub(inner.owed.saturating_sub(free)),
            free: free.saturating_sub(inner.owed),
        }
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        lock(&self.inner).blocks.len()
    }

    /// Blocks a new lease may take: free, or cached and unpinned.
    pub fn free(&self) -> usize {
        lock(&self.inner).available()
    }

    /// Blocks reserved by live leases.
    pub fn used(&self) -> usize {
        let inner = lock(&self.inner);
        inner.held + inner.owed
    }
}

/// Blocks held by one sequence, and those still promised to it; all go back
/// on drop.
#[derive(Debug)]
pub struct BlockLease {
    blocks: Vec<u32>,
    /// Promised and not drawn yet.
    owed: usize,
    /// Leading blocks already offered to the cache.
    committed: usize,
    /// Leading blocks marked as holding tokens.
    written: usize,
    /// Leading entries given back ([`RELEASED`]).
    released: usize,
    /// Leading blocks that came from the cache.
    cached: usize,
    pool: Arc<Mutex<Inner>>,
}

impl BlockLease {
    /// The block table: block `i` holds the sequence's tokens
    /// `i * block_size .. (i + 1) * block_size`; entries given back are
    /// [`RELEASED`].
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Entries in the table, given back or not.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when the table is empty.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks held now: the table less the entries given back.
    pub fn held(&self) -> usize {
        self.blocks.len() - self.released
    }

    /// Gives back the blocks of entries `..n` not given back yet (a windowed
    /// group's blocks its window has left), through the pool's one release;
    /// they stay promised to this lease, so it may draw as many again. Their
    /// entries become [`RELEASED`].
    pub fn release_before(&mut self, n: usize) {
        let n = n.min(self.blocks.len());
        if n <= self.released {
            return;
        }
        let mut inner = lock(&self.pool);
        for entry in &mut self.blocks[self.released..n] {
            inner.release(*entry);
            *entry = RELEASED;
        }
        let given = n - self.released;
        inner.owed += given;
        self.owed += given;
        self.released = n;
    }

    /// Leading blocks taken from the cache at creation (already computed).
    pub fn cached_blocks(&self) -> usize {
        self.cached
    }

    /// Blocks held plus those still promised.
    pub fn capacity(&self) -> usize {
        self.blocks.len() + self.owed
    }

    /// Draws promised blocks until the table has `n` blocks; fails, drawing
    /// nothing, if that is more than the lease reserved.
    pub fn grow(&mut self, n: usize) -> Result<(), Error> {
        if n <= self.blocks.len() {
            return Ok(());
        }
        let extra = n - self.blocks.len();
        if extra > self.owed {
            return Err(Error::OverReservation {
                asked: n,
                reserved: self.capacity(),
            });
        }
        let mut inner = lock(&self.pool);
        for _ in 0..extra {
            let Some(b) = inner.take() else {
                // Unreachable while `owed <= free + lru` holds; say so
                // rather than hand out a short table.
                return Err(Error::OverReservation {
                    asked: n,
                    reserved: self.blocks.len(),
                });
            };
            inner.owed -= 1;
            self.owed -= 1;
            self.blocks.push(b);
        }
        Ok(())
    }

    /// Gives back the blocks drawn past the first `n` (those a step drew for
    /// draft tokens it then rejected), through the pool's one release; they
    /// stay promised to this lease, so it may draw as many again. A block
    /// marked as holding tokens, or offered to the cache, is never given
    /// back here.
    pub fn truncate(&mut self, n: usize) {
        let keep = n.max(self.written).max(self.committed).max(self.released);
        if keep >= self.blocks.len() {
            return;
        }
        let mut inner = lock(&self.pool);
        let given = self.blocks.len() - keep;
        // The tail first, as a drop gives them back.
        for b in self.blocks.drain(keep..).rev() {
            inner.release(b);
        }
        inner.owed += given;
        self.owed += given;
    }

    /// Records that the first `written` blocks hold tokens and that `full`
    /// are the chain hashes of the first `full.len()` blocks, which are full
    /// and computed: each not offered before is cached under its hash, unless
    /// another block already is (that one stays the cached copy).
    pub fn commit(&mut self, written: usize, full: &[BlockHash]) {
        let written = written.min(self.blocks.len());
        let full = &full[..full.len().min(written)];
        if written <= self.written && full.len() <= self.committed {
            return;
        }
        let mut inner = lock(&self.pool);
        let from = self.written.min(written).max(self.released);
        for &b in &self.blocks[from.min(written)..written] {
            let block = &mut inner.blocks[b as usize];
            if !block.written {
                block.written = true;
                inner.filled += 1;
            }
        }
        self.written = self.written.max(written);
        let fresh = full.iter().zip(&self.blocks).skip(self.committed);
        for (&h, &b) in fresh {
            if b == RELEASED
                || inner.index.contains_key(&h)
                || inner.blocks[b as usize].hash.is_some()
            {
                continue;
            }
            inner.index.insert(h, b);
            inner.blocks[b as usize].hash = Some(h);
            if let Some(log) = &mut inner.events {
                log.record(true, h);
            }
            inner.pinned += 1;
        }
        self.committed = self.committed.max(full.len());
    }
}

impl Drop for BlockLease {
    fn drop(&mut self) {
        let mut inner = lock(&self.pool);
        inner.owed -= self.owed;
        // The tail first, so it is evicted first: a cached block is of use
        // only while every block before it is cached too.
        for &b in self.blocks[self.released..].iter().rev() {
            inner.release(b);
        }
    }
}

#[cfg(test)]
mod tests;
