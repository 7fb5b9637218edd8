//! The one error type of this crate.

/// Errors from the core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pool has fewer free blocks than asked for.
    #[error("KV pool exhausted: asked for {asked} blocks, {free} of {total} free")]
    PoolExhausted {
        /// Blocks asked for.
        asked: usize,
        /// Blocks free.
        free: usize,
        /// Blocks in the pool.
        total: usize,
    },
    /// A model forward pass failed.
    #[error("forward pass failed: {0}")]
    Forward(String),
}
