//! Attention over a step's own tokens, nothing cached: the mixer of an
//! encoder (bidirectional: every token sees its whole sequence, as BERT's)
//! and of a decoder run as a pooling model (causal, as Qwen3-Embedding's),
//! where a request is one forward and no KV outlives the step. Its weights
//! and their loader are attention's; its forward attends within each span.

pub mod forward;
pub mod spec;

pub use spec::EncoderSpec;
