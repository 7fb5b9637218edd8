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

/// `x` RMS-normed over its last dimension without a weight (Gemma 4's
/// value norm and router input), in f32: `x / sqrt(mean(x^2) + eps)`.
pub(crate) fn rms_unit(x: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let x = x.to_dtype(candle_core::DType::F32)?;
    let ms = (x.sqr()?.mean_keepdim(candle_core::D::Minus1)? + eps)?;
    Ok(x.broadcast_div(&ms.sqrt()?)?.to_dtype(dtype)?)
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
