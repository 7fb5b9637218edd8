//! Causal self-attention over the paged KV cache: its spec, its weights,
//! their loader, its forward, and the paged-attention op (CPU kernel, CUDA
//! kernel, gather reference).

pub mod forward;
pub(crate) mod load;
pub mod paged;
pub mod spec;
pub mod temperature;

pub use forward::AttentionWeights;
pub use paged::AttentionBackend;
pub use spec::AttentionSpec;
pub use temperature::QueryTemperature;
