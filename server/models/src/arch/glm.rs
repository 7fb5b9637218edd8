//! GLM-4.5 / 4.6 (`glm4_moe`; llama.cpp's `glm4moe`): the first
//! `first_k_dense_replace` layers dense, the rest routed experts behind a
//! sigmoid router with a correction bias and group-limited top-k, scaled
//! by `routed_scaling_factor`, plus an ungated shared expert; q/k/v biases,
//! optional per-head q/k norms, a partial rotary (half of each head).

use super::llama::plain_gguf;
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, pre_norms, swiglu_layer, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::Result;
use crate::spec::{ModelSpec, MoeSpec, Routing};

/// GLM-4.5's checkpoints' expert tensors.
const TENSORS: [(&str, &str); 8] = [
    ("ffn_gate_inp", "mlp.gate"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn_gate_exps", "mlp.experts.{e}.gate_proj"),
    ("ffn_up_exps", "mlp.experts.{e}.up_proj"),
    ("ffn_down_exps", "mlp.experts.{e}.down_proj"),
    ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
    ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
];

/// GLM-4.5 and 4.6 (and GLM-4.5-Air).
pub(super) static GLM4_MOE: Family = Family {
    name: "glm4moe",
    gguf: &["glm4moe"],
    hf: &["Glm4MoeForCausalLM", "glm4_moe"],
    hf_tensors: &TENSORS,
    hf_layers: "layers",
    // llama.cpp names the feed-forward's input norm as gpt-oss's.
    gguf_tensors: &[("ffn_norm", "post_attention_norm")],
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[])?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-5);
    let (scale, qk_norm) = (shape.plain_scale(), c.bool_or("use_qk_norm", false)?);
    let mut spec = shape.spec("glm4moe", pre_norms(eps), vec![rope], |_| {
        swiglu_layer(None, scale, qk_norm)
    });
    spec.qkv_bias = c.bool_or("attention_bias", false)?;
    let experts = match c.usize_opt("n_routed_experts")? {
        Some(n) => n,
        None => c.usize("num_local_experts")?,
    };
    let inter = c.usize("moe_intermediate_size")?;
    let routing = Routing::SigmoidGroups {
        groups: c.usize_or("n_group", 1)?,
        topk_groups: c.usize_or("topk_group", 1)?,
        normalize: c.bool_or("norm_topk_prob", true)?,
        scale: c.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32,
    };
    let sizes = (experts, c.usize("num_experts_per_tok")?, inter);
    let moe = MoeSpec::silu_with_shared(sizes, routing, c.usize_or("n_shared_experts", 1)?);
    let dense = c.usize_or("first_k_dense_replace", 1)?;
    with_experts(&mut spec, Some(moe), |i| i >= dense);
    Ok(spec)
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let mut shape = Shape::gguf(m)?;
    // The multi-token-prediction layers follow the trunk's; they are not
    // run.
    shape.layers -= m
        .usize_opt("nextn_predict_layers")?
        .unwrap_or(0)
        .min(shape.layers);
    // q/k norms: where the file has them (the loader's rule).
    let mut spec = plain_gguf(m, &shape, "glm4moe")?;
    spec.qkv_bias = true;
    let inter = m.usize("expert_feed_forward_length")?;
    let routing = Routing::SigmoidGroups {
        groups: m.usize_opt("expert_group_count")?.unwrap_or(1),
        topk_groups: m.usize_opt("expert_group_used_count")?.unwrap_or(1),
        normalize: m.bool_opt("expert_weights_norm")?.unwrap_or(true),
        scale: m.f32_opt("expert_weights_scale")?.unwrap_or(1.0),
    };
    let sizes = (
        m.usize("expert_count")?,
        m.usize("expert_used_count")?,
        inter,
    );
    let shared = m.usize_opt("expert_shared_count")?.unwrap_or(1);
    let moe = MoeSpec::silu_with_shared(sizes, routing, shared);
    let dense = m.usize_opt("leading_dense_block_count")?.unwrap_or(1);
    with_experts(&mut spec, Some(moe), |i| i >= dense);
    Ok(spec)
}
