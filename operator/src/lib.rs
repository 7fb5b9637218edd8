//! ferrox-operator: the `ModelDeployment` CRD, its capacity plan, the objects
//! it renders, the reconciler that applies them and the built-in autoscaler.
//!
//! Functional core, imperative shell: `plan`, `gpu_nodes`, `desired`,
//! `status`, `observed_plan`, `served_adapters`, `served_name`, `lora_plan`,
//! `autoscaling::decision`, `autoscaling::idle`,
//! `router::wake` and `render` are pure;
//! `reconcile`, `node_watch`, `autoscaling::run`, `lease`,
//! `autoscaling::scrape::scrape`, `autoscaling::waker`, `router::poll` and
//! `server` do I/O.

#![warn(missing_docs)]

pub mod autoscaling;
pub mod crd;
pub mod desired;
pub mod error;
pub mod geometry;
pub mod gpu_nodes;
pub mod kv_tiers;
pub mod lease;
pub mod lora_plan;
pub mod metrics;
pub mod node_watch;
pub mod observed_plan;
pub mod plan;
pub mod quantity;
pub mod reconcile;
pub mod render;
pub mod router;
pub mod served_adapters;
pub mod served_name;
pub mod server;
pub mod source;
pub mod status;
pub mod trigger_backoff;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod verifier;

pub use error::{Error, Result};
