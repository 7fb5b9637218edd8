//! LFM2's short convolution: its spec, its weights and forward, and their
//! loader. A gated causal depthwise convolution of a few taps whose only
//! memory per sequence is its last inputs, a state slot like Mamba-2's
//! convolution state (and nothing else).

pub mod forward;
pub(crate) mod load;
pub mod spec;

pub use forward::ShortConvWeights;
pub use spec::ShortConvSpec;
