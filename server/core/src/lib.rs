//! Ferrox's core: the pieces of serving that need no tensor library.
//!
//! - [`block_pool`]: the KV block pool and the per-sequence lease that returns
//!   its blocks on drop.
//! - [`batch_model`]: the interface the batching worker drives a model through.

pub mod batch_model;
pub mod block_pool;
pub mod error;

pub use batch_model::{BatchModel, DecodeRow};
pub use block_pool::{BlockLease, BlockPool};
pub use error::Error;
