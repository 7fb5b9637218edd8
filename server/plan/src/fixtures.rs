//! Test views of a plan's pools by the names the tests of the earlier,
//! positional plan used: each reads one pool by its kind.

use crate::{CacheKind, Plan, PoolPlan};

/// One pool's numbers, read by kind.
pub(crate) trait Pools {
    /// The full-attention pool's blocks (0 without one).
    fn kv_blocks(&self) -> u64;
    /// Bytes of one block of the full-attention pool.
    fn block_bytes(&self) -> u64;
    /// Bytes of K and V a token takes in the full-attention pool.
    fn kv_bytes_per_token(&self) -> u64;
    /// The window pools, smallest window first.
    fn windows(&self) -> Vec<PoolPlan>;
    /// Blocks of each window pool, smallest window first.
    fn window_blocks(&self) -> Vec<u64>;
    /// The state slots (0 without recurrent layers).
    fn state_slots(&self) -> u64;
    /// Bytes of one state slot.
    fn state_bytes_per_seq(&self) -> u64;
}

impl Pools for Plan {
    fn kv_blocks(&self) -> u64 {
        self.blocks(CacheKind::Full)
    }

    fn block_bytes(&self) -> u64 {
        self.pool(CacheKind::Full).map_or(0, |p| p.block_bytes)
    }

    fn kv_bytes_per_token(&self) -> u64 {
        self.block_bytes() / self.block_size.max(1)
    }

    fn windows(&self) -> Vec<PoolPlan> {
        let windows = self.pools.iter().filter(|p| p.kind.window().is_some());
        windows.copied().collect()
    }

    fn window_blocks(&self) -> Vec<u64> {
        self.windows().iter().map(|w| w.blocks).collect()
    }

    fn state_slots(&self) -> u64 {
        self.blocks(CacheKind::State)
    }

    fn state_bytes_per_seq(&self) -> u64 {
        self.pool(CacheKind::State).map_or(0, |p| p.block_bytes)
    }
}
