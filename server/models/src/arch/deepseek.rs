//! DeepSeek-V2 and V3 (`deepseek_v2`, `deepseek_v3`; Kimi K2 is the
//! latter; llama.cpp's `deepseek2` for both): multi-head latent attention
//! in every layer, the first `first_k_dense_replace` layers dense, the rest
//! routed experts plus ungated shared ones. V3's router is GLM-4.5's
//! (sigmoid, correction bias, group-limited top-k, scaled); V2's a softmax,
//! greedy or group-limited by the best score of a group, scaled, not
//! renormalised (as transformers computes it).
//!
//! The model's `kv_heads` is 1 and its `head_dim` the latent's width: the
//! one vector a token caches, as the paged store and the plan count it.

use serde_json::Value as Json;

use super::rope::{gguf_yarn, hf_rope};
use super::{Family, HfExperts, Shape, pre_norms, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, FeedForward, KvLayout, LatentSpec, LayerSpec, Mixer, ModelSpec,
    MoeSpec, Routing,
};

/// DeepSeek's checkpoints' latent attention and expert tensors.
const TENSORS: [(&str, &str); 14] = [
    ("attn_q_a", "self_attn.q_a_proj"),
    ("attn_q_a_norm", "self_attn.q_a_layernorm"),
    ("attn_q_b", "self_attn.q_b_proj"),
    ("attn_kv_a_mqa", "self_attn.kv_a_proj_with_mqa"),
    ("attn_kv_a_norm", "self_attn.kv_a_layernorm"),
    ("attn_kv_b", "self_attn.kv_b_proj"),
    ("ffn_gate_inp", "mlp.gate"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn_gate_exps", "mlp.experts.{e}.gate_proj"),
    ("ffn_up_exps", "mlp.experts.{e}.up_proj"),
    ("ffn_down_exps", "mlp.experts.{e}.down_proj"),
    ("ffn_gate_shexp", "mlp.shared_experts.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_experts.up_proj"),
    ("ffn_down_shexp", "mlp.shared_experts.down_proj"),
];

/// DeepSeek-V2, V2.5, V3, V3.x, R1 and the models built on V3 (Kimi K2).
pub(super) static DEEPSEEK2: Family = Family {
    name: "deepseek2",
    gguf: &["deepseek2"],
    hf: &[
        "DeepseekV3ForCausalLM",
        "DeepseekV2ForCausalLM",
        "deepseek_v3",
        "deepseek_v2",
        "kimi_k2",
    ],
    hf_tensors: &TENSORS,
    hf_layers: "layers",
    gguf_tensors: &[],
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// Latent attention's shared settings: RoPE 0, `scale`, nothing else.
fn attention(scale: f32) -> AttentionSpec {
    AttentionSpec {
        window: None,
        chunk: None,
        rope: 0,
        scale,
        softcap: None,
        qk_norm: false,
        qk_norm_whole: false,
        qk_norm_weightless: false,
        sinks: false,
        nope: false,
        gated: false,
        temperature: None,
        kv: KvLayout::default(),
    }
}

/// A latent layer of `latent`'s widths scoring by `scale`, a SwiGLU
/// feed-forward until experts replace it.
fn layer(latent: &LatentSpec, scale: f32) -> LayerSpec {
    LayerSpec {
        mixer: Mixer::Latent(LatentSpec {
            attention: attention(scale),
            ..latent.clone()
        }),
        ffn: FeedForward::Gated(Activation::Silu),
    }
}

/// The latent widths a config names (attention settings left default).
fn hf_latent(c: &HfConfig, v3: bool) -> Result<LatentSpec> {
    Ok(LatentSpec {
        attention: attention(1.0),
        q_rank: c.usize_opt("q_lora_rank")?,
        kv_rank: c.usize("kv_lora_rank")?,
        nope_dim: c.usize("qk_nope_head_dim")?,
        rope_dim: c.usize("qk_rope_head_dim")?,
        v_dim: c.usize("v_head_dim")?,
        // V2 always rotates adjacent pairs; V3 unless told otherwise.
        interleaved: !v3 || c.bool_or("rope_interleave", true)?,
    })
}

/// transformers' softmax scale: `qk_dim^-1/2`, times `m(mscale_all_dim)^2`
/// under a non-default RoPE with that key (`m(x) = 0.1 x ln(factor) + 1`).
fn hf_scale(c: &HfConfig, qk_dim: usize) -> Result<f32> {
    let base = 1.0 / (qk_dim as f64).sqrt();
    let params = c.get("rope_parameters").or_else(|| c.get("rope_scaling"));
    let Some(Json::Object(p)) = params else {
        return Ok(base as f32);
    };
    let kind = (p.get("rope_type").or_else(|| p.get("type"))).and_then(Json::as_str);
    let all = p
        .get("mscale_all_dim")
        .and_then(Json::as_f64)
        .unwrap_or(0.0);
    let factor = p.get("factor").and_then(Json::as_f64).unwrap_or(1.0);
    if matches!(kind, None | Some("default")) || all == 0.0 {
        return Ok(base as f32);
    }
    let m = if factor <= 1.0 {
        1.0
    } else {
        0.1 * all * factor.ln() + 1.0
    };
    Ok((base * m * m) as f32)
}

/// transformers' router of each version: V3's sigmoid with groups; V2's
/// softmax, grouped only under `group_limited_greedy`.
fn hf_routing(c: &HfConfig, v3: bool) -> Result<Routing> {
    let scale = c.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32;
    let (groups, topk_groups) = (c.usize_or("n_group", 1)?, c.usize_or("topk_group", 1)?);
    Ok(match v3 {
        true => Routing::SigmoidGroups {
            groups,
            topk_groups,
            normalize: c.bool_or("norm_topk_prob", true)?,
            scale,
        },
        // transformers' V2 router groups only under group_limited_greedy.
        false => match c.str_opt("topk_method") {
            Some("group_limited_greedy") => Routing::SoftmaxGroups {
                groups,
                topk_groups,
                scale,
            },
            _ => Routing::SoftmaxGroups {
                groups: 1,
                topk_groups: 1,
                scale,
            },
        },
    })
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    let names = c.family_names();
    let v3 = names.iter().any(|n| {
        matches!(
            n.as_str(),
            "DeepseekV3ForCausalLM" | "deepseek_v3" | "kimi_k2"
        )
    });
    let latent = hf_latent(c, v3)?;
    let mut shape = Shape::hf(c, &[])?;
    // The cache is one vector a token: a single "head" of its width.
    (shape.kv_heads, shape.head_dim) = (1, latent.width());
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        latent.rope_dim,
    )?;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let one = layer(&latent, hf_scale(c, latent.qk_dim())?);
    let mut spec = shape.spec("deepseek2", pre_norms(eps), vec![rope], |_| one.clone());
    let Some(experts) = c.usize_opt("n_routed_experts")? else {
        return Ok(spec);
    };
    let routing = hf_routing(c, v3)?;
    let inter = c.usize("moe_intermediate_size")?;
    let sizes = (experts, c.usize("num_experts_per_tok")?, inter);
    let moe = MoeSpec::silu_with_shared(sizes, routing, c.usize_or("n_shared_experts", 0)?);
    let dense = c.usize_or("first_k_dense_replace", 0)?;
    let every = c.usize_or("moe_layer_freq", 1)?.max(1);
    with_experts(&mut spec, Some(moe), |i| i >= dense && i % every == 0);
    Ok(spec)
}

/// The latent widths GGUF metadata names: the current converter's
/// (`key_length` the latent's width, `key_length_mla` a head's query) or an
/// older one's (`key_length` a head's query).
fn gguf_latent(m: &Metadata<'_>) -> Result<LatentSpec> {
    let kv_rank = m.usize("attention.kv_lora_rank")?;
    let rope_dim = m.usize("rope.dimension_count")?;
    let (qk, v) = match m.usize_opt("attention.key_length_mla")? {
        Some(qk) => (qk, m.usize("attention.value_length_mla")?),
        None => (
            m.usize("attention.key_length")?,
            m.usize("attention.value_length")?,
        ),
    };
    let nope_dim = qk.checked_sub(rope_dim).ok_or_else(|| {
        Error::Config(format!("a query head of {qk} with {rope_dim} rotary dims"))
    })?;
    Ok(LatentSpec {
        attention: attention(1.0),
        q_rank: m.usize_opt("attention.q_lora_rank")?.filter(|&r| r > 0),
        kv_rank,
        nope_dim,
        rope_dim,
        v_dim: v,
        // llama.cpp rotates DeepSeek's adjacent pairs (its NORM RoPE).
        interleaved: true,
    })
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let latent = gguf_latent(m)?;
    let mut shape = Shape::gguf(m)?;
    (shape.kv_heads, shape.head_dim) = (1, latent.width());
    // Multi-token-prediction layers follow the trunk's; they are not run.
    let nextn = m.usize_opt("nextn_predict_layers")?.unwrap_or(0);
    shape.layers -= nextn.min(shape.layers);
    let mut rope = m.plain_rope(latent.rope_dim)?;
    let mut scale = 1.0 / (latent.qk_dim() as f64).sqrt();
    if let Some(mut y) = gguf_yarn(m, true)? {
        // llama.cpp's deepseek2: cos and sin unscaled; the softmax scaled
        // by (1 + yarn_log_multiplier ln(factor))^2 (the converter writes
        // 0.1 mscale_all_dim there).
        let log_mul = y.mscale.map_or(0.0, |(_, l)| l);
        y.attention = Some(1.0);
        rope.scaling = y.scaling(rope.theta, rope.rotary_dim);
        let mul = 1.0 + log_mul * y.factor.max(1.0).ln();
        scale *= mul * mul;
    }
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-6);
    let one = layer(&latent, scale as f32);
    let mut spec = shape.spec("deepseek2", pre_norms(f64::from(eps)), vec![rope], |_| {
        one.clone()
    });
    let Some(experts) = m.usize_opt("expert_count")?.filter(|&n| n > 0) else {
        return Ok(spec);
    };
    let scale = m.f32_opt("expert_weights_scale")?.unwrap_or(1.0);
    let groups = m.usize_opt("expert_group_count")?.unwrap_or(1).max(1);
    let topk_groups = m.usize_opt("expert_group_used_count")?.unwrap_or(1).max(1);
    // llama.cpp's gating function 2 is the sigmoid; absent or 1, softmax.
    let routing = match m.usize_opt("expert_gating_func")? {
        Some(2) => Routing::SigmoidGroups {
            groups,
            topk_groups,
            normalize: m.bool_opt("expert_weights_norm")?.unwrap_or(false),
            scale,
        },
        _ => Routing::SoftmaxGroups {
            groups,
            topk_groups,
            scale,
        },
    };
    let inter = m.usize("expert_feed_forward_length")?;
    let sizes = (experts, m.usize("expert_used_count")?, inter);
    let shared = m.usize_opt("expert_shared_count")?.unwrap_or(0);
    let moe = MoeSpec::silu_with_shared(sizes, routing, shared);
    let dense = m.usize_opt("leading_dense_block_count")?.unwrap_or(0);
    with_experts(&mut spec, Some(moe), |i| i >= dense);
    Ok(spec)
}
