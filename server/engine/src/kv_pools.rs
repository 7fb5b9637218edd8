//! The worker's KV pools, one per group of layers: the KV pool of the
//! full-attention layers and a window pool per sliding window, in the order
//! the model lists them. A request reserves in all of them or in none.
//!
//! A pool per group, not vLLM's one pool shared by every group: a group's
//! cache holds its own layers only, sized by its own block count, so a
//! window pool's memory is its layers' times the few blocks a sequence keeps
//! there, with no padding of groups to equal layer counts; the plan sizes
//! each pool from the memory, and the block pool, its leases and their one
//! release stay as they are. The price: the split between pools is fixed at
//! start, by the typical request the plan counts.

use ferrox_core::{BlockHash, BlockLease, BlockPool, PoolSpec, PoolStats, Reservation};

/// Every pool of the model's cache, and its recurrent state slots: a pool
/// of one-block leases, one a sequence (the third cap beside sequences and
/// blocks), given back with the row's other leases.
pub(crate) struct KvPools {
    pools: Vec<(PoolSpec, BlockPool)>,
    /// The first pool, or an empty one for a model without KV (every layer
    /// recurrent): the prefix cache's and its events'.
    first: BlockPool,
    state: Option<BlockPool>,
}

/// A row's reservation: one lease per KV pool, and its state slot.
pub(crate) struct Reserved {
    pub leases: Vec<BlockLease>,
    pub state: Option<BlockLease>,
}

impl KvPools {
    /// Pools of `specs`' sizes; the first logs the hashes it caches and
    /// evicts, as pool `epoch` (the prefix cache runs only where the first
    /// pool is the only one).
    pub fn new(specs: &[PoolSpec], state_slots: Option<usize>, epoch: u64) -> Self {
        let pools = specs
            .iter()
            .enumerate()
            .map(|(i, &spec)| {
                let pool = if i == 0 {
                    // Two events a block life (stored, evicted), and room for
                    // a reader's poll interval; one further behind gets the
                    // held set.
                    BlockPool::with_event_log(spec.blocks, 2 * spec.blocks + 1024, epoch)
                } else {
                    BlockPool::new(spec.blocks)
                };
                (spec, pool)
            })
            .collect::<Vec<_>>();
        let first = match pools.first() {
            Some((_, p)) => p.clone(),
            None => BlockPool::with_event_log(0, 1024, epoch),
        };
        KvPools {
            pools,
            first,
            state: state_slots.map(BlockPool::new),
        }
    }

    /// The first pool (the KV pool when the model has full-attention layers).
    pub fn first(&self) -> &BlockPool {
        &self.first
    }

    /// The state slots' pool (slots reserved and total), for a model with
    /// recurrent layers.
    pub fn state_stats(&self) -> Option<PoolStats> {
        self.state.as_ref().map(BlockPool::stats)
    }

    /// Reserves `blocks[i]` blocks in pool `i`. A full-attention pool pins
    /// the cached run of `hashes` (at most `max_cached`) and draws `now`
    /// blocks at once; a window pool draws as its window moves; a model
    /// with recurrent layers takes a state slot. All or nothing: on failure
    /// the leases taken so far go back, and the error names the pool that
    /// could not cover its share (the state slots: one past the last pool).
    pub fn reserve(
        &self,
        hashes: &[BlockHash],
        max_cached: usize,
        now: usize,
        blocks: &[usize],
    ) -> Result<Reserved, usize> {
        let mut leases = Vec::with_capacity(self.pools.len());
        for (i, (spec, pool)) in self.pools.iter().enumerate() {
            let total = blocks.get(i).copied().ok_or(i)?;
            let ask = match spec.window {
                None => Reservation {
                    hashes,
                    max_cached,
                    now,
                    total,
                },
                Some(_) => Reservation {
                    total,
                    ..Reservation::default()
                },
            };
            leases.push(pool.reserve(&ask).map_err(|_| i)?);
        }
        let state = match &self.state {
            Some(p) => Some(p.allocate(1).map_err(|_| self.pools.len())?),
            None => None,
        };
        Ok(Reserved { leases, state })
    }

    /// Blocks reserved, over every pool (state slots not counted).
    pub fn used(&self) -> usize {
        self.pools.iter().map(|(_, p)| p.used()).sum()
    }

    /// Each pool and where its blocks are.
    pub fn stats(&self) -> Vec<(PoolSpec, PoolStats)> {
        self.pools.iter().map(|(s, p)| (*s, p.stats())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_takes_every_pool_or_none() {
        let specs = [
            PoolSpec {
                window: None,
                blocks: 8,
            },
            PoolSpec {
                window: Some(8),
                blocks: 4,
            },
        ];
        let pools = KvPools::new(&specs, None, 1);
        let a = pools.reserve(&[], 0, 2, &[5, 3]).unwrap().leases;
        // The KV pool draws the prompt's blocks now; the window pool none yet.
        assert_eq!(
            (a[0].len(), a[0].capacity(), a[1].len(), a[1].capacity()),
            (2, 5, 0, 3)
        );
        assert_eq!(pools.used(), 8);
        // The KV pool has room for 3 more, the window pool for 1: refused by
        // the window pool, and the KV pool's share goes back.
        assert_eq!(pools.reserve(&[], 0, 1, &[3, 2]).err(), Some(1));
        assert_eq!(pools.used(), 8);
        let b = pools.reserve(&[], 0, 1, &[3, 1]).unwrap().leases;
        assert_eq!(pools.used(), 12);
        drop((a, b));
        let s = pools.stats();
        assert_eq!((s[0].1.reserved, s[1].1.reserved), (0, 0));
    }

    #[test]
    fn a_recurrent_model_takes_one_slot_a_row_and_gives_it_back_with_its_blocks() {
        let specs = [PoolSpec {
            window: None,
            blocks: 8,
        }];
        let pools = KvPools::new(&specs, Some(2), 1);
        let a = pools.reserve(&[], 0, 1, &[2]).unwrap();
        let b = pools.reserve(&[], 0, 1, &[2]).unwrap();
        assert_eq!(pools.state_stats().unwrap().reserved, 2);
        // No slot left: refused by the slots (one past the KV pool), and
        // the KV share goes back.
        assert_eq!(pools.reserve(&[], 0, 1, &[2]).err(), Some(1));
        assert_eq!(pools.used(), 4);
        drop(a);
        assert_eq!(pools.state_stats().unwrap().reserved, 1);
        let c = pools.reserve(&[], 0, 1, &[2]).unwrap();
        assert_eq!(c.state.as_ref().map(BlockLease::len), Some(1));
        drop((b, c));
        assert_eq!(pools.state_stats().unwrap().reserved, 0);
        assert_eq!(pools.used(), 0);
        // Every layer recurrent: no KV pool, only slots.
        let only = KvPools::new(&[], Some(1), 1);
        let r = only.reserve(&[], 0, 3, &[]).unwrap();
        assert!(r.leases.is_empty() && r.state.is_some());
        assert!(only.reserve(&[], 0, 3, &[]).is_err());
    }
}
