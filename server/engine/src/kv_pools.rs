//! The worker's pools, one per kind of cache the model keeps, each a
//! [`BlockPool`] managed by its kind's rule: the full-attention pool pins a
//! cached prefix and draws a prompt's blocks at once, a window pool draws as
//! its window moves (and gives back what it leaves, in `row_kv.rs`), a state
//! pool hands each sequence one slot. A request reserves in all of them or
//! in none.
//!
//! A pool per group, not vLLM's one pool shared by every group: a group's
//! cache holds its own layers only, sized by its own block count, so a
//! window pool's memory is its layers' times the few blocks a sequence keeps
//! there, with no padding of groups to equal layer counts; the plan sizes
//! each pool from the memory, and the block pool, its leases and their one
//! release stay as they are. The price: the split between pools is fixed at
//! start, by the typical request the plan counts.

use ferrox_core::{BlockHash, BlockLease, BlockPool, Pool, PoolStats, Reservation};
use ferrox_plan::CacheKind;

/// Every pool of the model's cache, by kind.
pub(crate) struct KvPools {
    pools: Vec<(CacheKind, BlockPool)>,
    /// The full-attention pool, or an empty one for a model without: the
    /// prefix cache's and its events'.
    full: BlockPool,
}

/// What a row reserves: one lease per pool, by kind.
pub(crate) type Leases = Vec<(CacheKind, BlockLease)>;

impl KvPools {
    /// Pools of `pools`' kinds and sizes; the full-attention pool logs the
    /// hashes it caches and evicts, as pool `epoch`.
    pub fn new(pools: &[Pool], epoch: u64) -> Self {
        // Two events a block life (stored, evicted), and room for a reader's
        // poll interval; one further behind gets the held set.
        let logged = |blocks: usize| BlockPool::with_event_log(blocks, 2 * blocks + 1024, epoch);
        let pools: Vec<(CacheKind, BlockPool)> = pools
            .iter()
            .map(|p| {
                let pool = match p.kind {
                    CacheKind::Full => logged(p.blocks),
                    CacheKind::Window(_) | CacheKind::State => BlockPool::new(p.blocks),
                };
                (p.kind, pool)
            })
            .collect();
        let full = pools
            .iter()
            .find(|(k, _)| *k == CacheKind::Full)
            .map_or_else(|| logged(0), |(_, p)| p.clone());
        KvPools { pools, full }
    }

    /// The full-attention pool (an empty one for a model without).
    pub fn full(&self) -> &BlockPool {
        &self.full
    }

    /// Reserves `need` blocks in each pool, by kind. The full-attention pool
    /// pins the cached run of `hashes` (at most `max_cached`) and draws `now`
    /// blocks at once; a window pool draws as its window moves; a state pool
    /// gives the row its slot now. All or nothing: on failure the leases
    /// taken so far go back, and the error names the pool that could not
    /// cover its share.
    pub fn reserve(
        &self,
        hashes: &[BlockHash],
        max_cached: usize,
        now: usize,
        need: &[(CacheKind, usize)],
    ) -> Result<Leases, CacheKind> {
        let mut leases = Vec::with_capacity(self.pools.len());
        for (kind, pool) in &self.pools {
            let total = need
                .iter()
                .find(|(k, _)| k == kind)
                .map(|&(_, n)| n)
                .ok_or(*kind)?;
            let ask = match kind {
                CacheKind::Full => Reservation {
                    hashes,
                    max_cached,
                    now,
                    total,
                },
                CacheKind::Window(_) => Reservation {
                    total,
                    ..Reservation::default()
                },
                CacheKind::State => Reservation {
                    now: total,
                    total,
                    ..Reservation::default()
                },
            };
            leases.push((*kind, pool.reserve(&ask).map_err(|_| *kind)?));
        }
        Ok(leases)
    }

    /// Blocks reserved in the pools that hold tokens (state slots not
    /// counted).
    pub fn used(&self) -> usize {
        let holding = self.pools.iter().filter(|(k, _)| k.holds_tokens());
        holding.map(|(_, p)| p.used()).sum()
    }

    /// Each pool, by kind, and where its blocks are.
    pub fn stats(&self) -> Vec<(CacheKind, PoolStats)> {
        self.pools.iter().map(|(k, p)| (*k, p.stats())).collect()
    }

    /// Where the blocks of the pool of `kind` are, if the model has one.
    pub fn stats_of(&self, kind: CacheKind) -> Option<PoolStats> {
        let pool = self.pools.iter().find(|(k, _)| *k == kind);
        pool.map(|(_, p)| p.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: CacheKind = CacheKind::Full;
    const WINDOW: CacheKind = CacheKind::Window(8);
    const STATE: CacheKind = CacheKind::State;

    fn pools(sizes: &[(CacheKind, usize)]) -> KvPools {
        let pools: Vec<Pool> = sizes
            .iter()
            .map(|&(kind, blocks)| Pool { kind, blocks })
            .collect();
        KvPools::new(&pools, 1)
    }

    fn lease(leases: &Leases, kind: CacheKind) -> &BlockLease {
        &leases.iter().find(|(k, _)| *k == kind).unwrap().1
    }

    #[test]
    fn a_reservation_takes_every_pool_or_none() {
        let pools = pools(&[(FULL, 8), (WINDOW, 4)]);
        // Asked for by kind, in any order.
        let a = pools.reserve(&[], 0, 2, &[(WINDOW, 3), (FULL, 5)]).unwrap();
        // The KV pool draws the prompt's blocks now; the window pool none yet.
        let (f, w) = (lease(&a, FULL), lease(&a, WINDOW));
        assert_eq!((f.len(), f.capacity(), w.len(), w.capacity()), (2, 5, 0, 3));
        assert_eq!(pools.used(), 8);
        // The KV pool has room for 3 more, the window pool for 1: refused by
        // the window pool, and the KV pool's share goes back.
        let refused = pools.reserve(&[], 0, 1, &[(FULL, 3), (WINDOW, 2)]);
        assert_eq!(refused.err(), Some(WINDOW));
        assert_eq!(pools.used(), 8);
        // A need that names no size for a pool is refused by that pool.
        assert_eq!(pools.reserve(&[], 0, 1, &[(FULL, 1)]).err(), Some(WINDOW));
        let b = pools.reserve(&[], 0, 1, &[(FULL, 3), (WINDOW, 1)]).unwrap();
        assert_eq!(pools.used(), 12);
        drop((a, b));
        let s = pools.stats();
        assert_eq!((s[0].1.reserved, s[1].1.reserved), (0, 0));
    }

    #[test]
    fn a_recurrent_model_takes_one_slot_a_row_and_gives_it_back_with_its_blocks() {
        let pools = pools(&[(FULL, 8), (STATE, 2)]);
        let need = [(FULL, 2), (STATE, 1)];
        let a = pools.reserve(&[], 0, 1, &need).unwrap();
        let b = pools.reserve(&[], 0, 1, &need).unwrap();
        assert_eq!(pools.stats_of(STATE).unwrap().reserved, 2);
        // No slot left: refused by the slots, and the KV share goes back.
        assert_eq!(pools.reserve(&[], 0, 1, &need).err(), Some(STATE));
        assert_eq!(pools.used(), 4);
        drop(a);
        assert_eq!(pools.stats_of(STATE).unwrap().reserved, 1);
        let c = pools.reserve(&[], 0, 1, &need).unwrap();
        assert_eq!(lease(&c, STATE).len(), 1);
        drop((b, c));
        assert_eq!(pools.stats_of(STATE).unwrap().reserved, 0);
        assert_eq!(pools.used(), 0);
        // Every layer recurrent: no KV pool, only slots.
        let only = self::pools(&[(STATE, 1)]);
        let r = only.reserve(&[], 0, 3, &[(STATE, 1)]).unwrap();
        assert_eq!(r.len(), 1);
        assert!(only.reserve(&[], 0, 3, &[(STATE, 1)]).is_err());
        assert_eq!(only.full().stats().total, 0);
    }
}
