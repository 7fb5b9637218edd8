//! Phi-3 and Phi-4-mini: the Llama layout with q, k, v in one tensor and
//! gate, up in one, partial rotary (`partial_rotary_factor`) and LongRoPE
//! (`short_factor` / `long_factor` with its attention scaling).

use super::llama::plain_gguf;
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, pre_norms, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::Result;
use crate::spec::{ModelSpec, RopeScaling};

/// Phi-3 (Phi-3.5, Phi-4-mini: `Phi3ForCausalLM`).
pub(super) static PHI3: Family = Family {
    name: "phi3",
    gguf: &["phi3"],
    hf: &["Phi3ForCausalLM", "phi3"],
    // llama.cpp names the fused gate/up tensor `ffn_up` (twice the rows).
    hf_tensors: &[("ffn_up", "mlp.gate_up_proj")],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: hf,
    from_gguf: gguf,
};

fn hf(c: &HfConfig) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[])?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    // transformers applies the window on every layer (a window as long as
    // the context, as Phi-4-mini's, is none).
    let window = c.usize_opt("sliding_window")?;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-5);
    let scale = shape.plain_scale();
    Ok(shape.spec("phi3", pre_norms(eps), vec![rope], |_| {
        swiglu_layer(window, scale, false)
    }))
}

fn gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    // LongRoPE's factors are tensors: see `longrope`.
    plain_gguf(m, &Shape::gguf(m)?, "phi3")
}

/// LongRoPE from a GGUF's `rope_factors_short` / `rope_factors_long`
/// tensors and its metadata (the pre-training length, the attention factor).
pub(crate) fn longrope(m: &Metadata<'_>, short: Vec<f32>, long: Vec<f32>) -> Result<RopeScaling> {
    Ok(RopeScaling::LongRope {
        short,
        long,
        original: match m.usize_opt("rope.scaling.original_context_length")? {
            Some(o) => o,
            None => m.usize("context_length")?,
        },
        attention: m.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0),
    })
}
