//! The KV cache's lower tiers (`--kv-offload`): host memory and disk, below
//! the device pool, holding prefix blocks by their chain hash.

mod disk_store;
mod index;
mod offload;
mod store;
#[cfg(test)]
mod tests;

pub(crate) use offload::Offload;
pub use offload::Tier;
#[cfg(test)]
pub(crate) use store::{BlockStore, HostStore, Miss};
