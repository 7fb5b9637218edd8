//! Mamba-2's state-space mixer: its spec, its weights and forward, the SSD
//! scan, and the in-place decode step over the state store.

pub mod forward;
pub(crate) mod load;
mod scan;
pub mod spec;
pub(crate) mod step;

pub use forward::Mamba2Weights;
pub use spec::SsmSpec;
