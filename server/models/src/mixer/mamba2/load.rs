//! A Mamba-2 mixer's weights from any source, by GGUF names.

use candle_core::{Device, Tensor};

use super::forward::Mamba2Weights;
use super::spec::SsmSpec;
use crate::error::Result;
use crate::projection::single;
use crate::weights::source::WeightSource;

/// Layer `i`'s Mamba-2 mixer (llama.cpp's `ssm_*` names), for a model of
/// width `hidden`. A_log is stored as such in safetensors, as
/// `A = -exp(A_log)` (`ssm_a`) in GGUF.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    s: &SsmSpec,
    (i, hidden): (usize, usize),
    device: &Device,
) -> Result<Mamba2Weights> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let (inner, conv_dim, heads) = (s.inner(), s.conv_dim(), s.heads);
    let opt = |src: &mut dyn WeightSource, on: bool, name: &str, len: usize| {
        on.then(|| src.vector(&n(name), len, device)).transpose()
    };
    // llama.cpp stores A and D as `[heads, 1]`.
    let per_head = |src: &mut dyn WeightSource, name: &str| -> Result<Tensor> {
        Ok(src.small(&n(name), &[heads], device)?.reshape(heads)?)
    };
    let a = match src.has(&n("ssm_a")) {
        true => per_head(src, "ssm_a")?,
        false => per_head(src, "ssm_a_log")?.exp()?.neg()?,
    };
    let in_proj = src.projection(&[(&n("ssm_in.weight"), s.in_proj())], hidden, device)?;
    let out_proj = src.projection(&[(&n("ssm_out.weight"), hidden)], inner, device)?;
    Ok(Mamba2Weights {
        in_proj: single(in_proj),
        in_bias: opt(src, s.proj_bias, "ssm_in.bias", s.in_proj())?,
        conv: src.small(&n("ssm_conv1d.weight"), &[conv_dim, s.conv_kernel], device)?,
        conv_bias: opt(src, s.conv_bias, "ssm_conv1d.bias", conv_dim)?,
        dt_bias: per_head(src, "ssm_dt.bias")?,
        a,
        d: per_head(src, "ssm_d")?,
        norm: gated_norm(src, &n("ssm_norm.weight"), (inner, s.groups), device)?,
        out_proj: single(out_proj),
        out_bias: opt(src, s.proj_bias, "ssm_out.bias", hidden)?,
    })
}

/// A gated norm's weight, `[inner]` (llama.cpp stores it per group,
/// `[groups, inner / groups]`).
fn gated_norm(
    src: &mut dyn WeightSource,
    name: &str,
    (inner, groups): (usize, usize),
    device: &Device,
) -> Result<Tensor> {
    let w = match src.small(name, &[groups, inner / groups.max(1)], device) {
        Ok(w) => w,
        Err(_) => src.small(name, &[inner], device)?,
    };
    Ok(w.reshape(inner)?)
}
