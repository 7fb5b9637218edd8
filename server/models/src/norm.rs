//! A norm of the residual stream as the model's kind says: RMSNorm, or
//! LayerNorm with its bias (BERT's); and the loader of such a norm.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::spec::{ModelSpec, Norms};
use crate::weights::source::{WeightSource, norm as norm_weight};

/// `x` normed by weight `w` and, for a LayerNorm, bias `b`.
pub(crate) fn apply(x: &Tensor, w: &Tensor, b: Option<&Tensor>, norms: &Norms) -> Result<Tensor> {
    let eps = norms.eps as f32;
    if !norms.layer_norm {
        return Ok(candle_nn::ops::rms_norm(x, w, eps)?);
    }
    let zeros;
    let b = match b {
        Some(b) => b,
        None => {
            zeros = w.zeros_like()?;
            &zeros
        }
    };
    Ok(candle_nn::ops::layer_norm(x, w, b, eps)?)
}

/// The norm `name` (a `.weight`) of width `len`: its weight, with the
/// family's offset, and for a LayerNorm its `.bias` where stored.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    name: &str,
    len: usize,
    device: &Device,
) -> Result<(Tensor, Option<Tensor>)> {
    let w = norm_weight(src, spec, name, len, device)?;
    let bias = name.replace(".weight", ".bias");
    let b = match spec.norms.layer_norm && src.has(&bias) {
        true => Some(src.vector(&bias, len, device)?),
        false => None,
    };
    Ok((w, b))
}
