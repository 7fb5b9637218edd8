//! The worker's limits, decided once at start.

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
    /// KV blocks in the pool.
    pub kv_blocks: usize,
    /// Log a decode status line every this many steps; 0 disables.
    pub decode_log_interval: u64,
    /// Share the KV of cached full prompt blocks between requests.
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
            decode_log_interval: 40,
            prefix_caching: true,
            cache_salt: String::new(),
            max_loras: 1,
        }
    }
}
