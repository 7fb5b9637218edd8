//! Qwen2 / Qwen2.5 (biases on q, k, v) and Qwen3 (per-head q/k RMSNorm,
//! `head_dim` independent of the width); both slide on layers from
//! `max_window_layers` on when `use_sliding_window` is set. Their MoE
//! generations: experts on every `decoder_sparse_step`-th layer but
//! `mlp_only_layers`, `norm_topk_prob`, and Qwen2-MoE's shared expert with
//! its sigmoid gate.

use super::llama::plain_gguf;
use super::rope::hf_rope;
use super::{
    Family, HfExperts, Shape, gguf_moe, pre_norms, sliding_pattern, swiglu_layer, with_experts,
};
use crate::config::{HfConfig, Metadata};
use crate::error::Result;
use crate::spec::{Activation, ModelSpec, MoeSpec, Routing};

/// Qwen2.
pub(super) static QWEN2: Family = Family {
    name: "qwen2",
    gguf: &["qwen2"],
    hf: &["Qwen2ForCausalLM", "qwen2"],
    hf_tensors: &[],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| qwen(c, "qwen2", false),
    from_gguf: |m| gguf(m, "qwen2", false),
};

/// Qwen3 (dense).
pub(super) static QWEN3: Family = Family {
    name: "qwen3",
    gguf: &["qwen3"],
    hf: &[
        "Qwen3ForCausalLM",
        "Qwen3ForSequenceClassification",
        "qwen3",
    ],
    hf_tensors: &[],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| qwen(c, "qwen3", true),
    from_gguf: |m| gguf(m, "qwen3", true),
};

/// Qwen MoE checkpoints' expert tensors.
pub(super) const MOE_TENSORS: [(&str, &str); 8] = [
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.experts.{e}.gate_proj"),
    ("ffn_up_exps", "mlp.experts.{e}.up_proj"),
    ("ffn_down_exps", "mlp.experts.{e}.down_proj"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
];

/// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B).
pub(super) static QWEN2MOE: Family = Family {
    name: "qwen2moe",
    gguf: &["qwen2moe"],
    hf: &["Qwen2MoeForCausalLM", "qwen2_moe"],
    hf_tensors: &MOE_TENSORS,
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| qwen_moe(c, "qwen2moe", false),
    from_gguf: |m| gguf_experts(m, "qwen2moe", false, false),
};

/// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B).
pub(super) static QWEN3MOE: Family = Family {
    name: "qwen3moe",
    gguf: &["qwen3moe"],
    hf: &["Qwen3MoeForCausalLM", "qwen3_moe"],
    hf_tensors: &MOE_TENSORS,
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| qwen_moe(c, "qwen3moe", true),
    // llama.cpp renormalises Qwen3-MoE's chosen experts (every release
    // sets `norm_topk_prob`); Qwen2-MoE's not.
    from_gguf: |m| gguf_experts(m, "qwen3moe", true, true),
};

/// A Qwen MoE model from `config.json`.
fn qwen_moe(c: &HfConfig, family: &'static str, qk_norm: bool) -> Result<ModelSpec> {
    let mut spec = qwen(c, family, qk_norm)?;
    let normalize = c.bool_or("norm_topk_prob", false)?;
    with_hf_experts(c, &mut spec, normalize)?;
    Ok(spec)
}

/// A Qwen MoE config's experts on layer `i` of `spec` when `i` is not in
/// `mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`, the chosen
/// experts' weights renormalised where `normalize`.
pub(super) fn with_hf_experts(c: &HfConfig, spec: &mut ModelSpec, normalize: bool) -> Result<()> {
    let moe = MoeSpec {
        // transformers 5 writes `num_local_experts`; the Hub's have `num_experts`.
        experts: match c.usize_opt("num_experts")? {
            Some(n) => n,
            None => c.usize("num_local_experts")?,
        },
        top_k: c.usize("num_experts_per_tok")?,
        intermediate: c.usize("moe_intermediate_size")?,
        activation: Activation::Silu,
        routing: Routing::SoftmaxTopK { normalize },
        biases: false,
        shared: c
            .usize_opt("shared_expert_intermediate_size")?
            .filter(|&n| n > 0),
        shared_gated: true,
        gated: true,
    };
    let step = c.usize_or("decoder_sparse_step", 1)?.max(1);
    let dense = c.usizes("mlp_only_layers")?;
    with_experts(spec, Some(moe), |i| {
        !dense.contains(&i) && (i + 1).is_multiple_of(step)
    });
    Ok(())
}

/// A Qwen MoE model from GGUF (the loader makes a layer without a router
/// dense).
fn gguf_experts(
    m: &Metadata<'_>,
    family: &'static str,
    qk_norm: bool,
    normalize: bool,
) -> Result<ModelSpec> {
    let mut spec = gguf(m, family, qk_norm)?;
    let shape = Shape::gguf(m)?;
    let routing = Routing::SoftmaxTopK { normalize };
    let moe = gguf_moe(m, &shape, Activation::Silu, routing, false)?;
    with_experts(&mut spec, moe, |_| true);
    Ok(spec)
}

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
