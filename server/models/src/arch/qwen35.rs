//! Qwen3.5 (`Qwen3_5ForCausalLM`, and the language model of a multimodal
//! `Qwen3_5ForConditionalGeneration`; llama.cpp's `qwen35`) and Qwen3-Next
//! (`Qwen3NextForCausalLM`, `qwen3next`): Gated DeltaNet layers and gated
//! full-attention layers by `layer_types` (else every
//! `full_attention_interval`-th layer full), q/k RMSNorms, partial rotary,
//! and `(1 + w)` RMSNorms everywhere but the DeltaNet's own gated norm.
//! Qwen3.5 is dense; Qwen3.5-MoE (`Qwen3_5MoeForCausalLM`, `qwen35moe`) and
//! Qwen3-Next put Qwen2-MoE's experts with the sigmoid-gated shared expert
//! in every layer's feed-forward. Text positions are the same on every
//! axis of Qwen3.5's multimodal RoPE, which is then the plain one.

use super::llama::plain_gguf;
use super::qwen::{MOE_TENSORS, with_hf_experts};
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, gguf_moe, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, FeedForward, GdnSpec, KvLayout, LayerSpec, Mixer, ModelSpec, Norms,
    Routing,
};

/// A DeltaNet layer's tensors (GGUF name, name under the layer's prefix);
/// `ssm_a_log` is ours: the checkpoint's `A_log`, which llama.cpp stores
/// as `ssm_a = -exp(A_log)`.
const GDN_TENSORS: [(&str, &str); 11] = [
    ("attn_qkv", "linear_attn.in_proj_qkv"),
    ("attn_gate", "linear_attn.in_proj_z"),
    ("ssm_beta", "linear_attn.in_proj_b"),
    ("ssm_alpha", "linear_attn.in_proj_a"),
    ("ssm_in", "linear_attn.in_proj_qkvz"),
    ("ssm_ba", "linear_attn.in_proj_ba"),
    ("ssm_conv1d", "linear_attn.conv1d"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_a_log", "linear_attn.A_log"),
    ("ssm_norm", "linear_attn.norm"),
    ("ssm_out", "linear_attn.out_proj"),
];

/// llama.cpp names the pre-MLP norm `post_attention_norm`.
const GGUF_TENSORS: [(&str, &str); 1] = [("ffn_norm", "post_attention_norm")];

/// Qwen3.5 (dense).
pub(super) static QWEN35: Family = Family {
    name: "qwen35",
    gguf: &["qwen35"],
    hf: &[
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "qwen3_5_text",
        "qwen3_5",
    ],
    hf_tensors: &GDN_TENSORS,
    gguf_tensors: &GGUF_TENSORS,
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| hf(c, "qwen35"),
    // llama.cpp's converter orders Qwen3.5's value heads tiled.
    from_gguf: |m| gguf(m, "qwen35", true),
};

/// Qwen3.5's DeltaNet tensors, then Qwen2-MoE's experts.
const MOE_GDN_TENSORS: [(&str, &str); 19] = [
    GDN_TENSORS[0],
    GDN_TENSORS[1],
    GDN_TENSORS[2],
    GDN_TENSORS[3],
    GDN_TENSORS[4],
    GDN_TENSORS[5],
    GDN_TENSORS[6],
    GDN_TENSORS[7],
    GDN_TENSORS[8],
    GDN_TENSORS[9],
    GDN_TENSORS[10],
    MOE_TENSORS[0],
    MOE_TENSORS[1],
    MOE_TENSORS[2],
    MOE_TENSORS[3],
    MOE_TENSORS[4],
    MOE_TENSORS[5],
    MOE_TENSORS[6],
    MOE_TENSORS[7],
];

/// Qwen3.5-MoE (the checkpoints write the experts one by one, as
/// transformers 5 saves them back).
pub(super) static QWEN35MOE: Family = Family {
    name: "qwen35moe",
    gguf: &["qwen35moe"],
    hf: &[
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "qwen3_5_moe_text",
        "qwen3_5_moe",
    ],
    hf_tensors: &MOE_GDN_TENSORS,
    gguf_tensors: &GGUF_TENSORS,
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| hf(c, "qwen35moe"),
    from_gguf: |m| gguf(m, "qwen35moe", true),
};

/// Qwen3-Next.
pub(super) static QWEN3NEXT: Family = Family {
    name: "qwen3next",
    gguf: &["qwen3next"],
    hf: &["Qwen3NextForCausalLM", "qwen3_next"],
    hf_tensors: &MOE_GDN_TENSORS,
    gguf_tensors: &GGUF_TENSORS,
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| hf(c, "qwen3next"),
    from_gguf: |m| gguf(m, "qwen3next", false),
};

/// The block length of the delta rule (transformers' `chunk_size`).
const CHUNK: usize = 64;

/// transformers' `partial_rotary_factor` where a config names none.
const PARTIAL_ROTARY: f64 = 0.25;

/// Which layers are DeltaNet layers: `layer_types` (`linear_attention` /
/// `full_attention`), else all but every `full_attention_interval`-th.
fn linear_layers(c: &HfConfig, layers: usize) -> Result<Vec<bool>> {
    let kinds = (&["linear_attention"][..], &["full_attention"][..]);
    if let Some(kinds) = c.recurrent_kinds(layers, kinds)? {
        return Ok(kinds);
    }
    let every = c.usize_or("full_attention_interval", 4)?;
    if every == 0 {
        return Err(Error::Config(
            "config.json full_attention_interval is 0".into(),
        ));
    }
    Ok((0..layers)
        .map(|i| !(i + 1).is_multiple_of(every))
        .collect())
}

/// The DeltaNet mixer of a config (`linear_*` keys).
fn gdn(c: &HfConfig) -> Result<GdnSpec> {
    Ok(GdnSpec {
        key_heads: c.usize("linear_num_key_heads")?,
        value_heads: c.usize("linear_num_value_heads")?,
        key_dim: c.usize("linear_key_head_dim")?,
        value_dim: c.usize("linear_value_head_dim")?,
        conv_kernel: c.usize_or("linear_conv_kernel_dim", 4)?,
        chunk: CHUNK,
        tiled: false,
    })
}

/// Whether the config names a partial rotary factor (top level, or in
/// `rope_parameters` / `rope_scaling`).
fn names_partial(c: &HfConfig) -> bool {
    let inside = |key: &str| {
        c.get(key)
            .and_then(|p| p.get("partial_rotary_factor"))
            .is_some_and(|f| !f.is_null())
    };
    c.get("partial_rotary_factor").is_some() || inside("rope_parameters") || inside("rope_scaling")
}

fn hf(c: &HfConfig, family: &'static str) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[])?;
    if c.bool_or("attention_bias", false)? {
        return Err(Error::Config(format!(
            "{family} with attention_bias is not supported (no released model has it)"
        )));
    }
    let mut rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    if !names_partial(c) {
        if rope.scaling != crate::spec::RopeScaling::None {
            return Err(Error::Config(format!(
                "{family}: a RoPE scaling without partial_rotary_factor"
            )));
        }
        rope.rotary_dim = (shape.head_dim as f64 * PARTIAL_ROTARY) as usize;
    }
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let norms = Norms {
        eps,
        layer_norm: false,
        after_residual: false,
        offset: 1.0,
        pre: true,
        post_attention: false,
        post_ffn: false,
    };
    let kinds = linear_layers(c, shape.layers)?;
    let mixer = gdn(c)?;
    let scale = shape.plain_scale();
    let mut spec = shape.spec(family, norms, vec![rope], |i| layer(kinds[i], mixer, scale));
    if family != "qwen35" && c.usize_or("num_experts", 0)? > 0 {
        // Qwen3.5-MoE's router renormalises whatever `norm_topk_prob` says.
        let normalize = family == "qwen35moe" || c.bool_or("norm_topk_prob", false)?;
        with_hf_experts(c, &mut spec, normalize)?;
    }
    Ok(spec)
}

/// A DeltaNet layer (`linear`) or a gated attention layer, either with a
/// SwiGLU MLP (a mixture replaces it where the model has one).
fn layer(linear: bool, mixer: GdnSpec, scale: f32) -> LayerSpec {
    LayerSpec {
        mixer: match linear {
            true => Mixer::GatedDeltaNet(mixer),
            false => Mixer::Attention(AttentionSpec {
                window: None,
                chunk: None,
                rope: 0,
                scale,
                softcap: None,
                qk_norm: true,
                qk_norm_whole: false,
                qk_norm_weightless: false,
                sinks: false,
                nope: false,
                gated: true,
                temperature: None,
                kv: KvLayout::default(),
            }),
        },
        ffn: FeedForward::Gated(Activation::Silu),
    }
}

/// From GGUF metadata (llama.cpp's converter already added the norms' 1,
/// and counts any MTP layers after the decoder's in `block_count`).
fn gguf(m: &Metadata<'_>, family: &'static str, tiled: bool) -> Result<ModelSpec> {
    let mut shape = Shape::gguf(m)?;
    let mtp = m.usize_opt("nextn_predict_layers")?.unwrap_or(0);
    shape.layers = shape
        .layers
        .checked_sub(mtp)
        .ok_or_else(|| Error::Config(format!("{mtp} MTP layers of {} layers", shape.layers)))?;
    let mut spec = plain_gguf(m, &shape, family)?;
    let kinds = match m.bools_opt("attention.recurrent_layers")? {
        Some(v) if v.len() >= shape.layers => v[..shape.layers].to_vec(),
        Some(v) => {
            return Err(Error::Config(format!(
                "{family}.attention.recurrent_layers has {} entries for {} layers",
                v.len(),
                shape.layers
            )));
        }
        None => {
            let every = m.usize_opt("full_attention_interval")?.unwrap_or(4).max(1);
            (0..shape.layers)
                .map(|i| !(i + 1).is_multiple_of(every))
                .collect()
        }
    };
    let value_heads = m.usize("ssm.time_step_rank")?;
    let inner = m.usize("ssm.inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(Error::Config(format!(
            "ssm.inner_size {inner} is not a multiple of {value_heads} value heads"
        )));
    }
    let mixer = GdnSpec {
        key_heads: m.usize("ssm.group_count")?,
        value_heads,
        key_dim: m.usize("ssm.state_size")?,
        value_dim: inner / value_heads,
        conv_kernel: m.usize("ssm.conv_kernel")?,
        chunk: CHUNK,
        tiled,
    };
    let scale = shape.plain_scale();
    spec.layers = kinds.iter().map(|&l| layer(l, mixer, scale)).collect();
    let routing = Routing::SoftmaxTopK { normalize: true };
    let moe = gguf_moe(m, &shape, Activation::Silu, routing, false)?;
    with_experts(&mut spec, moe, |_| true);
    Ok(spec)
}
