//! Multi-head latent attention (DeepSeek-V2/V3's MLA): each token caches
//! one compressed vector (the normed `kv_lora_rank` latent and the roped
//! shared key, `qk_rope_head_dim`) instead of K and V per head. Its spec,
//! its weights, their loader and its forward in the weight-absorbed form
//! over the paged cache (one "head" of the latent's width, K only).

pub mod forward;
pub(crate) mod load;
pub mod spec;

pub use forward::LatentWeights;
pub use spec::LatentSpec;

#[cfg(test)]
mod tests;
