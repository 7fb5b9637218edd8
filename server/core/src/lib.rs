//! Ferrox's core: the pieces of serving that need no tensor library.
//!
//! - [`block_pool`]: the KV block pool and the per-sequence lease that returns
//!   its blocks on drop, with the prefix cache of full blocks;
//!   [`block_hash`]: the chained block hashes the cache is keyed by;
//!   [`kv_events`]: what the pool stored and evicted, for a router.
//! - [`batch_model`]: the interface the batching worker drives a model through;
//!   [`adapter`]: a LoRA adapter as a request carries it.
//! - [`tokenizer`], [`gguf_vocab`]: text to ids and back, from `tokenizer.json`
//!   or GGUF metadata; [`detokenizer`]: streaming text; [`chat_template`]: the
//!   model's Jinja template; [`end_of_generation`]: the model's end set.

pub mod adapter;
pub mod api_keys;
pub mod batch_model;
pub mod block_hash;
pub mod block_pool;
pub mod chat_template;
pub mod detokenizer;
pub mod end_of_generation;
pub mod error;
mod gguf_unigram;
pub mod gguf_vocab;
mod gguf_wordpiece;
pub mod kv_events;
pub mod pooling_model;
mod py_json;
pub mod token_bytes;
pub mod tokenizer;

pub use adapter::AdapterRef;
pub use api_keys::ApiKeys;
pub use batch_model::{BatchModel, DecodeRow, Pool, Table, Tables};
pub use block_hash::{BlockHash, BlockHasher};
pub use block_pool::{BlockLease, BlockPool, PoolStats, RELEASED, Reservation};
pub use chat_template::{ChatMessage, ChatTemplate, RenderOptions};
pub use detokenizer::Detokenizer;
pub use end_of_generation::EndOfGeneration;
pub use error::Error;
pub use gguf_vocab::GgufVocab;
pub use kv_events::{KvEventLog, KvEventsPage};
pub use pooling_model::PoolingModel;
pub use token_bytes::TokenBytes;
pub use tokenizer::{Tokenizer, TokenizerSpec};
