//! Gated DeltaNet (Qwen3-Next's and Qwen3.5's linear attention): its spec,
//! its weights and forward, the gated delta rule, and its loader.

mod delta;
pub mod forward;
pub(crate) mod load;
pub mod spec;

pub use forward::GdnWeights;
pub use spec::GdnSpec;
