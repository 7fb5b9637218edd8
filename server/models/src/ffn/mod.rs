//! The feed-forward kinds of a decoder layer, each owning its spec, its
//! weights, their loader and their forward.

pub mod activation;
pub mod dense_and_moe;
pub mod mlp;
pub mod moe;

pub use activation::Activation;
pub use mlp::Mlp;
