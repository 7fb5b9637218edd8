//! A short-convolution mixer's weights from any source, by llama.cpp's
//! names (`shortconv.in_proj`, `shortconv.conv`, `shortconv.out_proj`).

use candle_core::{Device, Tensor};

use super::forward::ShortConvWeights;
use super::spec::ShortConvSpec;
use crate::error::Result;
use crate::projection::single;
use crate::weights::source::WeightSource;

/// Layer `i`'s short convolution. Biases are read where the spec has them
/// or the file does (llama.cpp's `lfm2` metadata records no `conv_bias`).
pub(crate) fn load(
    src: &mut dyn WeightSource,
    s: &ShortConvSpec,
    i: usize,
    device: &Device,
) -> Result<ShortConvWeights> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let c = s.channels;
    let bias = |src: &mut dyn WeightSource, name: &str, len: usize| -> Result<Option<Tensor>> {
        let name = n(name);
        match s.bias || src.has(&name) {
            true => Ok(Some(src.vector(&name, len, device)?)),
            false => Ok(None),
        }
    };
    let in_proj = src.projection(&[(&n("shortconv.in_proj.weight"), s.in_proj())], c, device)?;
    let out_proj = src.projection(&[(&n("shortconv.out_proj.weight"), c)], c, device)?;
    Ok(ShortConvWeights {
        in_proj: single(in_proj),
        in_bias: bias(src, "shortconv.in_proj.bias", s.in_proj())?,
        // Checkpoints store `[c, 1, k]`, llama.cpp `[c, k]`: both read as `[c, k]`.
        conv: src.small(&n("shortconv.conv.weight"), &[c, s.kernel], device)?,
        conv_bias: bias(src, "shortconv.conv.bias", c)?,
        out_proj: single(out_proj),
        out_bias: bias(src, "shortconv.out_proj.bias", c)?,
    })
}
