//! Qwen2 / Qwen2.5 (biases on q, k, v) and Qwen3 (per-head q/k RMSNorm,
//! `head_dim` independent of the width); both slide on layers from
//! `max_window_layers` on when `use_sliding_window` is set.

use super::llama::plain_gguf;
use super::rope::hf_rope;
use super::{Family, Shape, pre_norms, sliding_pattern, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::Result;
use crate::spec::ModelSpec;

/// Qwen2.
pub(super) static QWEN2: Family = Family {
    name: "qwen2",
    gguf: &["qwen2"],
    hf: &["Qwen2ForCausalLM", "qwen2"],
    hf_tensors: &[],
    tied_default: false,
    gguf_permuted_qk: false,
    from_hf: |c| qwen(c, "qwen2", false),
    from_gguf: |m| gguf(m, "qwen2", false),
};

/// Qwen3 (dense).
pub(super) static QWEN3: Family = Family {
    name: "qwen3",
    gguf: &["qwen3"],
    hf: &["Qwen3ForCausalLM", "qwen3"],
    hf_tensors: &[],
    tied_default: false,
    gguf_permuted_qk: false,
    from_hf: |c| qwen(c, "qwen3", true),
    from_gguf: |m| gguf(m, "qwen3", true),
};

fn qwen(c: &HfConfig, family: &'static str, qk_norm: bool) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[])?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    let window = match c.bool_or("use_sliding_window", false)? {
        true => c.usize_opt("sliding_window")?,
        false => None,
    };
    let from = c.usize_or("max_window_layers", 0)?;
    let slides = match window {
        Some(_) => sliding_pattern(c, shape.layers, |i| i >= from)?,
        None => vec![false; shape.layers],
    };
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let scale = shape.plain_scale();
    let mut spec = shape.spec(family, pre_norms(eps), vec![rope], |i| {
        swiglu_layer(window.filter(|_| slides[i]), scale, qk_norm)
    });
    spec.qkv_bias = !qk_norm;
    Ok(spec)
}

fn gguf(m: &Metadata<'_>, family: &'static str, qk_norm: bool) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let mut spec = plain_gguf(m, &shape, family)?;
    let scale = shape.plain_scale();
    spec.layers = (0..shape.layers)
        .map(|_| swiglu_layer(None, scale, qk_norm))
        .collect();
    spec.qkv_bias = !qk_norm;
    Ok(spec)
}
