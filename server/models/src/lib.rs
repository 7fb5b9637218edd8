//! Llama-family decoders on candle, written for continuous batching: per-row
//! positions, a paged KV cache, chunked prefill with a causal mask, and logits
//! only where they are sampled.
//!
//! Weights load from GGUF files and Hugging Face safetensors directories. On
//! CPU the hot matmuls and attention run through ferrox-kernels; every other
//! op is candle's, so the decoder runs on any candle `Device`.

pub mod attention;
pub mod config;
pub mod device;
pub mod error;
mod fused;
pub mod gguf;
pub mod holding;
pub mod kv_cache;
pub mod kv_groups;
pub mod kv_store;
pub mod layer;
pub mod linear;
pub mod llama;
pub mod memory;
pub mod paged;
pub mod profile;
pub mod rope;
pub mod safetensors;
pub mod text;
pub mod weights;

pub use candle_core::Device;
pub use config::{Arch, ModelConfig};
pub use error::{Error, Result};
pub use llama::{Llama, Step};
pub use paged::PagedModel;
pub mod load;

pub use load::{Format, ModelInfo, Source};
pub use text::TextModel;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
