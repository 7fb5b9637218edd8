//! One decoder on candle for every family it serves (Llama, Mistral, Qwen2,
//! Qwen3, Gemma 2 and 3, Phi-3), written for continuous batching: per-row
//! positions, a paged KV cache, chunked prefill with a causal (and sliding)
//! mask, and logits only where they are sampled. A family is data
//! ([`arch`]): its names and settings mapped to one [`ModelSpec`].
//!
//! Weights load from GGUF files and Hugging Face safetensors directories. On
//! CPU the hot matmuls and attention run through ferrox-kernels; every other
//! op is candle's, so the decoder runs on any candle `Device`.

pub mod arch;
pub mod config;
pub mod decoder;
pub mod device;
pub mod embedder;
pub mod error;
pub mod ffn;
mod fused;
pub mod gguf;
mod gguf_header;
pub mod holding;
pub mod input;
pub mod kv_cache;
pub mod kv_store;
pub mod layer;
pub mod linear;
pub mod lora;
pub mod memory;
pub mod mixer;
pub mod mxfp4;
pub(crate) mod norm;
pub mod paged;
pub mod per_layer_input;
pub mod pooling;
pub mod profile;
pub mod projection;
pub mod rope;
pub mod safetensors;
pub mod seq_span;
pub mod spec;
pub mod state_store;
pub mod text;
mod warm_pool;
pub mod weights;

pub use candle_core::Device;
pub use decoder::{Decoder, Step};
pub use embedder::Embedder;
pub use error::{Error, Result};
pub use paged::PagedModel;
pub use spec::{KvGroup, ModelSpec};
pub use state_store::StateStore;
pub mod load;

pub use load::{Format, ModelInfo, Source};
pub use text::TextModel;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;
