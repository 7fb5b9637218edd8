//! Causal self-attention over the paged KV cache: its spec, its weights,
//! their loader, its forward, and the paged-attention op (CPU kernel, CUDA
//! kernel, gather reference).

pub mod paged;
pub mod spec;

pub use paged::AttentionBackend;
