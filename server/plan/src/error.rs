//! The one error type of this crate.

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// One full-length sequence does not fit in the memory given.
    #[error(
        "insufficient memory: {memory_bytes} bytes x {utilization} utilization = {usable_bytes} usable; \
         weights take {weight_bytes}, activations, runtime and adapters {reserve_bytes}, leaving {available_bytes} \
         for KV, but one {max_model_len}-token sequence needs {kv_per_seq_bytes} bytes of KV"
    )]
    InsufficientMemory {
        /// Bytes of weights.
        weight_bytes: u64,
        /// KV bytes one full-length sequence needs (whole blocks).
        kv_per_seq_bytes: u64,
        /// Bytes left for KV after weights and reserves (0 if none).
        available_bytes: u64,
        /// Activation reserve, runtime overhead and adapters.
        reserve_bytes: u64,
        /// `memory * utilization`.
        usable_bytes: u64,
        /// The utilization applied.
        utilization: f64,
        /// Memory given.
        memory_bytes: u64,
        /// Sequence length planned for.
        max_model_len: u64,
    },
    /// A pool of a given size cannot hold one full-length sequence.
    #[error(
        "a pool of {kv_blocks} blocks of {block_size} tokens holds {pool_tokens} tokens, \
         less than one {max_model_len}-token sequence"
    )]
    PoolTooSmall {
        /// Blocks in the pool.
        kv_blocks: u64,
        /// Tokens per block.
        block_size: u64,
        /// `kv_blocks * block_size`.
        pool_tokens: u64,
        /// Sequence length planned for.
        max_model_len: u64,
    },
    /// A window pool of a given size cannot hold what one sequence reserves.
    #[error(
        "the window pool of the layers with a {window}-token window has {kv_blocks} blocks, \
         fewer than the {blocks_per_seq} one {max_model_len}-token sequence reserves there"
    )]
    WindowPoolTooSmall {
        /// The group's window.
        window: u64,
        /// Blocks in its pool.
        kv_blocks: u64,
        /// Blocks one sequence reserves there.
        blocks_per_seq: u64,
        /// Sequence length planned for.
        max_model_len: u64,
    },
    /// A pool of a given size does not fit in the memory there is.
    #[error(
        "the plan needs {total_bytes} bytes (weights {weight_bytes} + KV {kv_bytes} + activations, \
         runtime and adapters {reserve_bytes}), more than the {memory_bytes} bytes there are"
    )]
    OverMemory {
        /// Everything the plan counts.
        total_bytes: u64,
        /// Bytes of weights.
        weight_bytes: u64,
        /// Bytes of the KV pool.
        kv_bytes: u64,
        /// Activation reserve, runtime overhead and adapters.
        reserve_bytes: u64,
        /// Memory there is.
        memory_bytes: u64,
    },
    /// A pool size was given for a pool the model does not have.
    #[error("a size was given for {asked}, but this model's pools are: {pools}")]
    NoSuchPool {
        /// The pool (or the flag) given.
        asked: String,
        /// The model's pools, by kind.
        pools: String,
    },
    /// An input is out of range.
    #[error("invalid plan input: {0}")]
    Invalid(String),
    /// `--speculative-config` asks for what this server does not serve, or
    /// is out of range.
    #[error("invalid --speculative-config: {0}")]
    SpeculativeConfig(String),
}
