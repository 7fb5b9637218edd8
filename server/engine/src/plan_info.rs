//! The capacity plan a server runs with, as its metrics export it.

use ferrox_core::Pool;
use ferrox_plan::CacheKind;

/// What the server planned at start, exported once through
/// [`crate::Metrics::set_plan`] (`vllm:cache_config_info` and the
/// `ferrox_plan_*` gauges), where the operator reads it back.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanInfo {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Every pool the server runs with, by kind.
    pub pools: Vec<Pool>,
    /// The dtype the KV cache is held in (`f16`, `bf16`, `f32`).
    pub kv_dtype: String,
    /// Fraction of the memory figure the plan may use.
    pub memory_utilization: f64,
    /// Whether the prefix cache is on.
    pub prefix_caching: bool,
    /// Bytes of the weights as held on the device.
    pub weight_bytes: u64,
    /// Bytes of one KV block.
    pub kv_block_bytes: u64,
    /// The memory figure the plan was made from.
    pub memory_bytes: u64,
    /// Where that figure came from (`kv-blocks`, `kv-cache-memory`, a
    /// device or cgroup reading).
    pub memory_source: String,
    /// Most sequences at once.
    pub max_seqs: usize,
    /// Longest sequence, prompt plus output.
    pub max_model_len: usize,
}

impl PlanInfo {
    /// Blocks of the pool of `kind` (0 when the model has none).
    pub fn blocks(&self, kind: CacheKind) -> usize {
        let pool = self.pools.iter().find(|p| p.kind == kind);
        pool.map_or(0, |p| p.blocks)
    }
}
