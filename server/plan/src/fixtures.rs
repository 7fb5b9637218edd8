//! Test views of a plan's pools by the names the tests of the earlier,
//! positional plan used: each reads one pool by its kind; and geometries
//! shared by several modules' tests.

use crate::{CacheKind, KvDtype, ModelGeometry, Plan, PoolPlan, SlidingWindow};

/// Gemma 4 31B's KV: 60 layers, 50 sliding over 1024 tokens with 16 KV
/// heads of 256, the other 10 global with 4 KV heads of 512 (its
/// `num_global_key_value_heads` and `global_head_dim`), bf16, a 256k
/// context; ~31 B parameters in bf16.
pub(crate) fn gemma4_31b() -> ModelGeometry {
    ModelGeometry {
        layers: 60,
        kv_heads: 16,
        head_dim: 256,
        full_kv_heads: 4,
        full_head_dim: 512,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 61_400_000_000,
        context_length: 262_144,
        sliding_windows: vec![SlidingWindow {
            window: 1024,
            layers: 50,
        }],
        ..ModelGeometry::default()
    }
}

/// Gemma 4 E4B's KV with its last `shared` of 42 layers reading an earlier
/// layer's KV (18 in the model): the sliding layers (window 512) among the
/// 24 that keep KV are 20, in a five-to-one pattern, the other 4 global;
/// every layer 2 KV heads of 256 here, bf16, a 128k context. With `shared`
/// 0 the 18 are counted as keeping KV of their own (as global layers, the
/// windows listing only the 20).
pub(crate) fn gemma4_e4b(shared: u64) -> ModelGeometry {
    ModelGeometry {
        layers: 42,
        kv_heads: 2,
        head_dim: 256,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 8_000_000_000,
        context_length: 131_072,
        sliding_windows: vec![SlidingWindow {
            window: 512,
            layers: 20,
        }],
        kv_shared_layers: shared,
        ..ModelGeometry::default()
    }
}

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
