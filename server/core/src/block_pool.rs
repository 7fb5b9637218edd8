//! The KV block pool: a fixed number of blocks, handed out as leases that give
//! their blocks back when dropped, so a block can leave a sequence in exactly
//! one way.

use std::sync::{Arc, Mutex, PoisonError};

use crate::Error;

#[derive(Debug)]
struct Inner {
    free: Vec<u32>,
    total: usize,
}

/// A fixed pool of KV blocks. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    inner: Arc<Mutex<Inner>>,
}

impl BlockPool {
    /// A pool of `total` blocks, ids `0..total`.
    pub fn new(total: usize) -> Self {
        // Reversed so `pop` hands out low ids first: easier to read in logs.
        let free = (0..total as u32).rev().collect();
        BlockPool {
            inner: Arc::new(Mutex::new(Inner { free, total })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The pool's state is a free list that every operation leaves whole,
        // so a panic elsewhere while holding the lock cannot corrupt it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `n` blocks, or fails without taking any.
    pub fn allocate(&self, n: usize) -> Result<BlockLease, Error> {
        let mut inner = self.lock();
        if n > inner.free.len() {
            return Err(Error::PoolExhausted {
                asked: n,
                free: inner.free.len(),
                total: inner.total,
            });
        }
        let at = inner.free.len() - n;
        let blocks = inner.free.split_off(at);
        Ok(BlockLease {
            blocks,
            pool: Arc::clone(&self.inner),
        })
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.lock().total
    }

    /// Blocks not leased.
    pub fn free(&self) -> usize {
        self.lock().free.len()
    }

    /// Blocks leased.
    pub fn used(&self) -> usize {
        let inner = self.lock();
        inner.total - inner.free.len()
    }
}

/// Blocks held by one sequence; returned to the pool on drop.
#[derive(Debug)]
pub struct BlockLease {
    blocks: Vec<u32>,
    pool: Arc<Mutex<Inner>>,
}

impl BlockLease {
    /// The block table: block `i` holds the sequence's tokens
    /// `i * block_size .. (i + 1) * block_size`.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Number of blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when no blocks are held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

impl Drop for BlockLease {
    fn drop(&mut self) {
        let mut inner = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        inner.free.append(&mut self.blocks);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn blocks_come_back_on_drop() {
        let pool = BlockPool::new(10);
        let a = pool.allocate(4).unwrap();
        let b = pool.allocate(6).unwrap();
        assert_eq!((pool.used(), pool.free()), (10, 0));
        drop(a);
        assert_eq!((pool.used(), pool.free()), (6, 4));
        drop(b);
        assert_eq!((pool.used(), pool.free(), pool.total()), (0, 10, 10));
    }

    #[test]
    fn exhaustion_is_an_error_and_takes_nothing() {
        let pool = BlockPool::new(5);
        let _held = pool.allocate(3).unwrap();
        let err = pool.allocate(3).unwrap_err();
        assert!(matches!(
            err,
            Error::PoolExhausted {
                asked: 3,
                free: 2,
                total: 5
            }
        ));
        assert_eq!(pool.free(), 2);
        assert!(pool.allocate(2).is_ok());
    }

    #[test]
    fn never_over_committed_and_ids_are_unique() {
        let pool = BlockPool::new(64);
        let mut leases = Vec::new();
        let mut step = 0usize;
        // A deterministic churn of allocations and releases.
        for round in 0..200 {
            let n = (round * 7) % 9 + 1;
            match pool.allocate(n) {
                Ok(lease) => leases.push(lease),
                Err(_) => {
                    step = (step + 3) % leases.len().max(1);
                    if !leases.is_empty() {
                        leases.swap_remove(step);
                    }
                }
            }
            let held: Vec<u32> = leases.iter().flat_map(|l| l.blocks().to_vec()).collect();
            let unique: HashSet<u32> = held.iter().copied().collect();
            assert_eq!(unique.len(), held.len(), "a block leased twice");
            assert!(held.len() <= 64);
            assert_eq!(pool.used(), held.len());
        }
        leases.clear();
        assert_eq!(pool.free(), 64);
    }
}
