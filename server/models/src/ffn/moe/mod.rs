//! Mixture-of-experts layers: a layer's kind and weights, the router's
//! choice for each token (pure, and a token's choice depends on its own
//! logits only), a step's dispatch (each chosen expert with the tokens that
//! chose it, so each is read once a step whatever the batch), a count of
//! the reads, the loader and the op-by-op forward.

pub mod dispatch;
pub(crate) mod forward;
pub(crate) mod load;
pub mod reads;
pub mod route;
pub mod spec;
pub mod weights;

pub use dispatch::Dispatch;
pub(crate) use forward::forward;
pub use reads::ExpertReads;
pub use route::route;
pub use spec::{MAX_EXPERTS, MoeSpec, Routing};
pub use weights::MoeWeights;

#[cfg(test)]
mod tests;
