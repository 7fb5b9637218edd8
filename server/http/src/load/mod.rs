//! The model side: configuration, loading and KV sizing, the text side, generate and inspect.

pub mod adapters;
pub mod config;
pub mod draft;
pub mod generate;
pub mod inspect;
pub mod model;
pub mod pair_prompt;
pub mod pooling;
pub mod sizing;
pub mod task;
pub mod text;
