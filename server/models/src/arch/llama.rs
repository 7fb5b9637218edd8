//! Llama 2/3 (SmolLM, TinyLlama, ...), Mistral and Mixtral: pre-norm
//! SwiGLU layers, one RoPE; Mistral's `sliding_window` on every layer;
//! Mixtral's experts (top-2 of 8, softmax over the chosen), which llama.cpp
//! writes as a `llama` GGUF with `expert_count`.

use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, gguf_moe, pre_norms, swiglu_layer, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::Result;
use crate::spec::{Activation, ModelSpec, MoeSpec, Routing};

/// Llama.
pub(super) static LLAMA: Family = Family {
    name: "llama",
    gguf: &["llama"],
    hf: &["LlamaForCausalLM", "llama"],
    hf_tensors: &[],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf: |c| llama_like(c, "llama"),
    from_gguf: |m| gguf(m, "llama"),
};

/// Mistral (llama.cpp writes its GGUF as `llama`; older files say `mistral`).
pub(super) static MISTRAL: Family = Family {
    name: "mistral",
    gguf: &["mistral"],
    hf: &["MistralForCausalLM", "mistral"],
    hf_tensors: &[],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf: |c| llama_like(c, "mistral"),
    from_gguf: |m| gguf(m, "mistral"),
};

/// Mixtral (its GGUF reads as `llama`).
pub(super) static MIXTRAL: Family = Family {
    name: "mixtral",
    gguf: &[],
    hf: &["MixtralForCausalLM", "mixtral"],
    hf_tensors: &[
        ("ffn_gate_inp", "block_sparse_moe.gate"),
        ("ffn_gate_exps", "block_sparse_moe.experts.{e}.w1"),
        ("ffn_up_exps", "block_sparse_moe.experts.{e}.w3"),
        ("ffn_down_exps", "block_sparse_moe.experts.{e}.w2"),
    ],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf: mixtral,
    from_gguf: |m| gguf(m, "llama"),
};

/// Mixtral's routing: softmax over the experts, the chosen renormalised.
const MIXTRAL_ROUTING: Routing = Routing::SoftmaxTopK { normalize: true };

fn mixtral(c: &HfConfig) -> Result<ModelSpec> {
    let mut spec = llama_like(c, "mixtral")?;
    let moe = MoeSpec {
        experts: c.usize("num_local_experts")?,
        top_k: c.usize("num_experts_per_tok")?,
        intermediate: spec.intermediate,
        activation: Activation::Silu,
        routing: MIXTRAL_ROUTING,
        biases: false,
        shared: None,
        shared_gated: false,
        gated: true,
    };
    with_experts(&mut spec, Some(moe), |_| true);
    Ok(spec)
}

/// A Llama-layout model from `config.json`: every layer slides when the
/// config sets `sliding_window` (Mistral v0.1; `null` in later ones).
pub(super) fn llama_like(c: &HfConfig, family: &'static str) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[])?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    let window = c.usize_opt("sliding_window")?;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-5);
    let scale = shape.plain_scale();
    Ok(shape.spec(family, pre_norms(eps), vec![rope], |_| {
        swiglu_layer(window, scale, false)
    }))
}

/// A Llama-layout model from GGUF (Llama 3.1's divisors are a tensor the
/// loader adds; a window where the file names one).
pub(super) fn gguf(m: &Metadata<'_>, family: &'static str) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let mut spec = plain_gguf(m, &shape, family)?;
    let moe = gguf_moe(m, &shape, Activation::Silu, MIXTRAL_ROUTING, false)?;
    with_experts(&mut spec, moe, |_| true);
    Ok(spec)
}

/// Pre-norm SwiGLU layers, every one with the file's sliding window where
/// it names one, one RoPE of the file's base and dimension count (the shared
/// part of every Llama-layout GGUF).
pub(super) fn plain_gguf(
    m: &Metadata<'_>,
    shape: &Shape,
    family: &'static str,
) -> Result<ModelSpec> {
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-5);
    let rope = m.plain_rope(shape.head_dim)?;
    let window = m.usize_opt("attention.sliding_window")?.filter(|&w| w > 0);
    let scale = shape.plain_scale();
    Ok(
        shape.spec(family, pre_norms(f64::from(eps)), vec![rope], |_| {
            swiglu_layer(window, scale, false)
        }),
    )
}
