//! The worker's limits, decided once at start.

use ferrox_core::Pool;
use ferrox_plan::{CacheKind, OffloadTier, SpeculativeConfig};

/// Limits of one engine; see the server's CLI for each one's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most rows prefilling or decoding at once.
    pub max_seqs: usize,
    /// Most requests waiting for admission.
    pub max_queue: usize,
    /// Most prompt tokens prefilled in one tick, shared round-robin by the
    /// prompts prefilling (each gets at most one chunk a tick).
    pub prefill_chunk: usize,
    /// Most tokens (prompt + max_tokens) one request may use.
    pub max_model_len: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The model's cache pools, by kind, in [`CacheKind`] order (the
    /// plan's): every pool a request reserves in. A state pool's blocks are
    /// its slots, one a running sequence (the third admission cap).
    pub pools: Vec<Pool>,
    /// Log a decode status line every this many steps; 0 disables.
    pub decode_log_interval: u64,
    /// Share the KV of cached full prompt blocks between requests (asked
    /// for; see [`EngineConfig::prefix_cache_on`]).
    pub prefix_caching: bool,
    /// Everything besides the tokens that decides what a block's KV holds
    /// (the model, the KV dtype): the root of every block hash chain.
    pub cache_salt: String,
    /// Most distinct LoRA adapters among the running rows (`--max-loras`).
    pub max_loras: usize,
    /// Speculative decoding (`--speculative-config`), where the model
    /// allows it ([`EngineConfig::speculation_off_reason`]).
    pub speculative: Option<SpeculativeConfig>,
    /// Most tokens in one pooling batch (`--max-batch-tokens`; a pooling
    /// model's forward, where `prefill_chunk` is a generating model's).
    pub max_batch_tokens: usize,
    /// The lower KV tiers prefix blocks are written through to
    /// (`--kv-offload`); they run with the prefix cache only.
    pub kv_offload: Vec<OffloadTier>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_seqs: 16,
            max_queue: 256,
            prefill_chunk: 512,
            max_model_len: 2048,
            block_size: 16,
            pools: vec![Pool {
                kind: CacheKind::Full,
                blocks: 2048,
            }],
            decode_log_interval: 40,
            prefix_caching: true,
            cache_salt: String::new(),
            max_loras: 1,
            speculative: None,
            max_batch_tokens: ferrox_plan::DEFAULT_MAX_BATCH_TOKENS as usize,
            kv_offload: Vec::new(),
        }
    }
}

impl EngineConfig {
    /// The plan's pools, by kind, as the engine holds them.
    pub fn plan_pools(plan: &ferrox_plan::Plan) -> Result<Vec<Pool>, std::num::TryFromIntError> {
        let pool = |p: &ferrox_plan::PoolPlan| {
            Ok(Pool {
                kind: p.kind,
                blocks: usize::try_from(p.blocks)?,
            })
        };
        plan.pools.iter().map(pool).collect()
    }

    /// The pool of `kind`, if the model has one.
    pub fn pool(&self, kind: CacheKind) -> Option<&Pool> {
        self.pools.iter().find(|p| p.kind == kind)
    }

    /// Whether the prefix cache runs: asked for, and every pool is full
    /// attention. A window pool gives blocks back as the window moves, so a
    /// cached prefix would have to bring its window's blocks too; a state
    /// pool's prefix is usable only with the state at its end, which is not
    /// kept (no checkpoints). Such models run without the cache (the server
    /// logs why: [`EngineConfig::prefix_cache_off_reason`]).
    pub fn prefix_cache_on(&self) -> bool {
        self.prefix_caching && self.prefix_cache_off_reason().is_none()
    }

    /// Why the model's pools keep no prefix cache, if they do not.
    pub fn prefix_cache_off_reason(&self) -> Option<&'static str> {
        let kinds = || self.pools.iter().map(|p| p.kind);
        if kinds().any(|k| k == CacheKind::State) {
            return Some(
                "the model has recurrent layers, and a cached prefix would need the \
                 recurrent state at its end, which is not kept",
            );
        }
        if kinds().any(|k| k.window().is_some()) {
            return Some(
                "the model has sliding-window layers, whose blocks leave their window \
                 pool as the window moves",
            );
        }
        (self.pool(CacheKind::Full).is_none()).then_some("the model keeps no KV cache")
    }

    /// Why the model's pools allow no speculative decoding, if they do not.
    /// A rejected draft token must leave no trace, and only a full-attention
    /// cache makes that free (its KV at rejected positions is overwritten
    /// before it is read): a recurrent state has folded the rejected tokens
    /// in (undoing that needs a checkpoint of the state each step, not
    /// kept), and a window pool's reclaim would have to run against the
    /// accepted length, not the verified one.
    pub fn speculation_off_reason(&self) -> Option<&'static str> {
        let kinds = || self.pools.iter().map(|p| p.kind);
        if kinds().any(|k| k == CacheKind::State) {
            return Some(
                "the model has recurrent layers, whose state would need a checkpoint \
                 before each verification to undo a rejected draft token",
            );
        }
        if kinds().any(|k| k.window().is_some()) {
            return Some(
                "the model has sliding-window layers, whose blocks leave their pool as \
                 the window moves over draft tokens that may be rejected",
            );
        }
        (self.pool(CacheKind::Full).is_none()).then_some("the model keeps no KV cache")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_cache_and_speculation_run_only_where_every_pool_is_full_attention() {
        let pool = |kind, blocks| Pool { kind, blocks };
        let full = pool(CacheKind::Full, 32);
        let window = pool(CacheKind::Window(8), 4);
        let state = pool(CacheKind::State, 4);
        for (pools, on) in [
            (vec![full], true),
            (vec![full, window], false),
            (vec![window], false),
            (vec![full, state], false),
            (vec![state], false),
            (vec![], false),
        ] {
            let c = EngineConfig {
                pools: pools.clone(),
                ..EngineConfig::default()
            };
            assert_eq!(c.prefix_cache_on(), on, "{pools:?}");
            assert_eq!(c.prefix_cache_off_reason().is_none(), on, "{pools:?}");
            // Speculation is allowed on the same pools: a rejected draft
            // token leaves no trace only in full attention.
            assert_eq!(c.speculation_off_reason().is_none(), on, "{pools:?}");
            let off = EngineConfig {
                prefix_caching: false,
                ..c
            };
            assert!(!off.prefix_cache_on());
        }
        let c = EngineConfig {
            pools: vec![full, window],
            ..EngineConfig::default()
        };
        assert_eq!(c.pool(CacheKind::Window(8)), Some(&window));
        assert_eq!(c.pool(CacheKind::State), None);
    }
}
