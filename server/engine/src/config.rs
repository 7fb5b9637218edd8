//! The worker's limits, decided once at start.

use ferrox_core::PoolSpec;

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
    /// Blocks of the KV pool (the full-attention layers); 0 when every layer
    /// has a sliding window and `windows` holds every pool.
    pub kv_blocks: usize,
    /// The window pools beside the KV pool, smallest window first.
    pub windows: Vec<WindowPool>,
    /// Recurrent state slots, one per running sequence of a model with
    /// recurrent layers (the third admission cap); `None` for a model
    /// without.
    pub state_slots: Option<usize>,
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_seqs: 16,
            max_queue: 256,
            prefill_chunk: 512,
            max_model_len: 2048,
            block_size: 16,
            kv_blocks: 2048,
            windows: Vec::new(),
            state_slots: None,
            decode_log_interval: 40,
            prefix_caching: true,
            cache_salt: String::new(),
            max_loras: 1,
        }
    }
}

/// One window pool: the blocks of the layers with one sliding window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPool {
    /// The window, in tokens.
    pub window: usize,
    /// Blocks in the pool.
    pub blocks: usize,
}

impl EngineConfig {
    /// The pools, in the order a model lists its KV groups: the KV pool (when
    /// the model has full-attention layers), then each window pool.
    pub fn pools(&self) -> Vec<PoolSpec> {
        // A model without attention (every layer recurrent) has no KV pool.
        let attends = self.windows.is_empty() && self.state_slots.is_none();
        let full = (self.kv_blocks > 0 || attends).then_some(PoolSpec {
            window: None,
            blocks: self.kv_blocks,
        });
        let windows = self.windows.iter().map(|w| PoolSpec {
            window: Some(w.window),
            blocks: w.blocks,
        });
        full.into_iter().chain(windows).collect()
    }

    /// This config with `pools` (a model's, in its order) as its KV pool
    /// and window pools.
    pub fn with_pools(self, pools: &[PoolSpec]) -> Self {
        let kv_blocks = pools
            .iter()
            .find(|p| p.window.is_none())
            .map_or(0, |p| p.blocks);
        let windows = pools
            .iter()
            .filter_map(|p| {
                p.window.map(|window| WindowPool {
                    window,
                    blocks: p.blocks,
                })
            })
            .collect();
        EngineConfig {
            kv_blocks,
            windows,
            ..self
        }
    }

    /// Whether the prefix cache runs: asked for, and the model has no
    /// sliding-window layers. A cached prefix would have to bring its
    /// window's blocks too, and a window pool gives blocks back as the window
    /// moves, so a model with windows runs without the cache (the server logs
    /// why; docs/operator.md).
    ///
    /// Likewise a model with recurrent layers: a cached prefix is usable only
    /// with the recurrent state at its end, which is not kept (no state
    /// checkpoints), so such a model runs without the cache.
    pub fn prefix_cache_on(&self) -> bool {
        self.prefix_caching && self.windows.is_empty() && self.state_slots.is_none()
    }

    /// This config with `slots` recurrent state slots (a model's
    /// [`ferrox_core::BatchModel::state_slots`]).
    pub fn with_state_slots(self, slots: Option<usize>) -> Self {
        EngineConfig {
            state_slots: slots,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_with_pools_are_inverses() {
        let full = |blocks| PoolSpec {
            window: None,
            blocks,
        };
        let window = |w, blocks| PoolSpec {
            window: Some(w),
            blocks,
        };
        for pools in [
            vec![full(32)],
            vec![full(32), window(8, 4)],
            vec![window(4096, 100)],
            vec![full(10), window(128, 3), window(512, 5)],
        ] {
            let c = EngineConfig::default().with_pools(&pools);
            assert_eq!(c.pools(), pools);
            assert_eq!(
                c.prefix_cache_on(),
                pools.len() == 1 && pools[0].window.is_none()
            );
            // Recurrent layers: no cache; no KV pool unless one is given.
            let r = c.clone().with_state_slots(Some(4));
            assert!(!r.prefix_cache_on());
            assert_eq!(r.pools(), pools.clone());
        }
        let none = EngineConfig::default()
            .with_pools(&[])
            .with_state_slots(Some(4));
        assert_eq!(none.pools(), []);
    }
}
