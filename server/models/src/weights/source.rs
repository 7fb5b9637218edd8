//! Where weights come from: what a source (GGUF or safetensors) reads, the
//! checks of what it read, and a norm weight as the family holds it.

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};
use crate::linear::Embedding;
use crate::projection::Projection;
use crate::spec::ModelSpec;

/// Where weights come from.
pub trait WeightSource {
    /// Whether the tensor exists.
    fn has(&self, name: &str) -> bool;
    /// A 1-D f32 tensor (norm weights, biases) of length `len`.
    fn vector(&mut self, name: &str, len: usize, device: &Device) -> Result<Tensor>;
    /// A small f32 tensor of `shape` (a convolution's weights); unit
    /// dimensions of the stored one are ignored (`[c, 1, k]` reads as `[c, k]`).
    fn small(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor>;
    /// Matrices `[out_i, cols]` that read the same input, fused where possible.
    fn projection(
        &mut self,
        parts: &[(&str, usize)],
        cols: usize,
        device: &Device,
    ) -> Result<Projection>;
    /// A router `[rows, cols]`, as f32 whatever it is stored as (see
    /// [`crate::holding::Role::Router`]).
    fn router(&mut self, name: &str, rows: usize, cols: usize, device: &Device) -> Result<Tensor>;
    /// Each of `experts` experts' matrices `[out_i, cols]` from the stacked
    /// tensors `parts` (`[experts, out_i, cols]`, GGUF names), one
    /// projection an expert, fused where possible.
    fn experts(
        &mut self,
        parts: &[(&str, usize)],
        experts: usize,
        cols: usize,
        device: &Device,
    ) -> Result<Vec<Projection>>;
    /// Each expert's bias `[len]` from the stacked tensor `name`
    /// (`[experts, len]`).
    fn expert_vectors(
        &mut self,
        name: &str,
        experts: usize,
        len: usize,
        device: &Device,
    ) -> Result<Vec<Tensor>>;
    /// The embedding table `[vocab, hidden]`.
    fn embedding(
        &mut self,
        name: &str,
        vocab: usize,
        hidden: usize,
        device: &Device,
    ) -> Result<Embedding>;
}

/// Checks a weight's shape against the one the architecture wants.
pub fn check_shape(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    if got != want {
        return Err(Error::BadShape {
            name: name.to_string(),
            got: got.to_vec(),
            want: want.to_vec(),
        });
    }
    Ok(())
}

/// Checks a small tensor's shape against `want`, unit dimensions dropped.
pub fn check_small(name: &str, got: &[usize], want: &[usize]) -> Result<()> {
    let strip = |d: &[usize]| d.iter().copied().filter(|&n| n != 1).collect::<Vec<_>>();
    match strip(got) == strip(want) {
        true => Ok(()),
        false => check_shape(name, got, want),
    }
}

/// Checks a vector's shape: `[len]`, or a one-row matrix `[1, len]` (a
/// gate some converters write as a matrix).
pub fn check_vector(name: &str, got: &[usize], len: usize) -> Result<()> {
    match got {
        [1, n] if *n == len => Ok(()),
        _ => check_shape(name, got, &[len]),
    }
}

/// A norm weight with the family's offset added (Gemma's `1 + w`).
pub(crate) fn norm(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    name: &str,
    len: usize,
    device: &Device,
) -> Result<Tensor> {
    let w = src.vector(name, len, device)?;
    if spec.norms.offset == 0.0 {
        return Ok(w);
    }
    Ok((w + f64::from(spec.norms.offset))?)
}
