//! LoRA adapters: loading (PEFT's safetensors directories and llama.cpp's
//! GGUF LoRA files), checking them against the base model, and the batched
//! low-rank update one forward pass applies for rows of many adapters.
//!
//! # The hook
//!
//! The one decoder every family runs (`crate::decoder`) calls one
//! interface, [`LoraStep`], built once per step from the rows' adapters
//! (`None` when no row has one, so a step without adapters pays nothing).
//! After each targeted projection's base matmul, which stays one batched
//! call over every row, it calls
//!
//! - [`LoraStep::apply`]`(target, layer, x, out)` on host slices (the fused
//!   CPU path, `crate::fused`), `x` the projection's input rows and `out`
//!   its output rows, before anything else reads `out`; or
//! - [`LoraStep::add`]`(targets, layer, x, out)` on tensors (the op-by-op
//!   path, any device), where `out` is the concatenation of `targets`'
//!   outputs (`[q | k | v]`, `[gate | up]`).
//!
//! "Before anything else" is where the family's extras come after: q/k/v's
//! biases, q/k norms (Qwen3, Gemma 3) and RoPE; o's and down's post-norms
//! (Gemma); the MLP's activation (SiLU or GELU). So every family's seven
//! projections take adapters alike, as PEFT applies them inside each module.
//!
//! Either adds `scale * (x @ A^T) @ B^T` to the rows of each adapter's
//! group (the S-LoRA/Punica idea: rows grouped by adapter), so a row's
//! output never depends on which adapters its neighbours run.

mod adapter;
mod device;
mod gguf;
mod kernel;
mod peft;
mod step;
mod target;

pub use adapter::{LoraAdapter, LoraPair, LoraShapes};
pub use device::DeviceSlots;
pub use gguf::load_gguf;
pub use peft::load_peft;
pub(crate) use step::LoraHook;
pub use step::LoraStep;
pub use target::{Target, module_parts};

use std::path::Path;

use crate::error::{Error, Result};

/// Loads the adapter at `path` (a PEFT directory, or a GGUF LoRA file)
/// as `name`, checked against the base's `shapes`: every rank at most
/// `max_rank`, every matrix the base's shape.
pub fn load(name: &str, path: &Path, shapes: &LoraShapes, max_rank: usize) -> Result<LoraAdapter> {
    let adapter = if path.is_dir() {
        load_peft(name, path, shapes)?
    } else {
        load_gguf(name, path, shapes)?
    };
    adapter.check_rank(max_rank)?;
    Ok(adapter)
}

/// The refusal of adapter `name`, for `reason`.
pub(crate) fn refuse(name: &str, reason: impl Into<String>) -> Error {
    Error::Adapter {
        name: name.to_string(),
        reason: reason.into(),
    }
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
