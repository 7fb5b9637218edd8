//! The decided numbers: a pool per cache group, by kind, and the bytes of
//! every other part.

use serde::{Deserialize, Serialize};

use crate::CacheKind;

/// One pool of a plan: the blocks of one cache group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolPlan {
    /// The kind, which names the pool (`full`, `window:1024`, `state`).
    pub kind: CacheKind,
    /// Layers the pool serves.
    pub layers: u64,
    /// Bytes of one block (a state pool's block is one sequence's slot).
    pub block_bytes: u64,
    /// The most blocks one `max_model_len` sequence holds here.
    pub blocks_per_seq: u64,
    /// Blocks in the pool.
    pub blocks: u64,
}

impl PoolPlan {
    /// Bytes of the whole pool.
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.block_bytes)
    }
}

/// The decided numbers, with the bytes of every part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// One pool per cache group, in [`CacheKind`] order.
    pub pools: Vec<PoolPlan>,
    /// Tokens per block.
    pub block_size: u64,
    /// Concurrent sequences the server admits: typical sequences every pool
    /// holds at once.
    pub max_seqs: u64,
    /// Bytes of weights.
    pub weight_bytes: u64,
    /// Bytes of every pool together.
    pub kv_budget_bytes: u64,
    /// Bytes held back for one step's activations.
    pub activation_reserve_bytes: u64,
    /// Bytes held back for the runtime.
    pub overhead_bytes: u64,
    /// Bytes held for LoRA adapters.
    #[serde(default)]
    pub adapter_bytes: u64,
    /// Bytes of a draft model's weights and KV pool (0 without).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub draft_bytes: u64,
    /// Longest sequence served.
    pub max_model_len: u64,
    /// The model's parameters, every expert counted (as in the geometry).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub params: u64,
    /// Parameters one token runs through (as in the geometry).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub active_params: u64,
}

/// Whether a count is absent (serialised as nothing).
fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Plan {
    /// Everything the plan counts: weights + KV + activations + overhead
    /// + adapters + a draft model's weights and KV.
    pub fn total_bytes(&self) -> u64 {
        self.weight_bytes
            .saturating_add(self.kv_budget_bytes)
            .saturating_add(self.activation_reserve_bytes)
            .saturating_add(self.overhead_bytes)
            .saturating_add(self.adapter_bytes)
            .saturating_add(self.draft_bytes)
    }

    /// The pool of `kind`, if the model has one.
    pub fn pool(&self, kind: CacheKind) -> Option<&PoolPlan> {
        self.pools.iter().find(|p| p.kind == kind)
    }

    /// Blocks of the pool of `kind` (0 when the model has none).
    pub fn blocks(&self, kind: CacheKind) -> u64 {
        self.pool(kind).map_or(0, |p| p.blocks)
    }

    /// Every pool's size, by kind: what the server's `--pool` flags say.
    pub fn sizes(&self) -> Vec<(CacheKind, u64)> {
        self.pools.iter().map(|p| (p.kind, p.blocks)).collect()
    }
}
