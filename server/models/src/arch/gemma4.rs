//! Gemma 4 (text; and the language model of a multimodal `gemma4`
//! checkpoint): Gemma 3's blocks (pre- and post-norms, GeGLU, scaled
//! embeddings, q/k norms, sliding layers by `layer_types`) with plain
//! `w` norms, unscaled attention (the q/k norms set the scale), values
//! normed without a weight, and:
//! - full layers with heads of their own (`global_head_dim`,
//!   `num_global_key_value_heads`; a saved config's `per_layer_config`),
//!   whose values are the keys' projection where `attention_k_eq_v`, and a
//!   RoPE turning only the first `partial_rotary_factor` of each head's
//!   frequencies ("proportional": the rest never turn);
//! - the last `num_kv_shared_layers` layers reading the KV of the last
//!   earlier layer of their kind, keeping none (and twice as wide an MLP
//!   where `use_double_wide_mlp`);
//! - per-layer input embeddings (`hidden_size_per_layer_input`);
//! - each layer's output scaled by its `layer_scalar`;
//! - the final logits soft-capped;
//! - where `enable_moe_block` (26B-A4B), experts beside every layer's MLP
//!   (`crate::ffn::dense_and_moe`): softmax over all, the top
//!   `top_k_experts` renormalised.
//!
//! GGUF files are refused by name.

use serde_json::Value as Json;

use super::{Family, HfExperts, Shape, sliding_pattern};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, FeedForward, HeadShape, KvLayout, LayerSpec, Mixer, ModelSpec,
    MoeSpec, Norms, PerLayerInput, RopeScaling, RopeSpec, Routing,
};

/// Gemma 4's tensors, where they differ from the Llama layout.
const TENSORS: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
    ("inp_gate", "per_layer_input_gate"),
    ("proj", "per_layer_projection"),
    ("post_norm", "post_per_layer_input_norm"),
    ("layer_output_scale.weight", "layer_scalar"),
    (
        "per_layer_token_embd.weight",
        "embed_tokens_per_layer.weight",
    ),
    (
        "per_layer_model_proj.weight",
        "per_layer_model_projection.weight",
    ),
    (
        "per_layer_proj_norm.weight",
        "per_layer_projection_norm.weight",
    ),
    ("pre_ffw_norm_2", "pre_feedforward_layernorm_2"),
    ("post_ffw_norm_1", "post_feedforward_layernorm_1"),
    ("post_ffw_norm_2", "post_feedforward_layernorm_2"),
    ("ffn_gate_inp", "router.proj"),
    ("ffn_gate_inp.scale", "router.scale"),
    ("ffn_down_exps.scale", "router.per_expert_scale"),
    // Gate rows, then up rows, in one stacked tensor.
    ("ffn_gate_exps.weight", "experts.gate_up_proj"),
    ("ffn_up_exps.weight", "experts.gate_up_proj"),
    ("ffn_down_exps.weight", "experts.down_proj"),
];

/// Gemma 4 (text).
pub(super) static GEMMA4: Family = Family {
    name: "gemma4",
    gguf: &["gemma4"],
    hf: &[
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "gemma4_text",
        "gemma4",
    ],
    hf_tensors: TENSORS,
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::StackedHalves,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: hf,
    from_gguf,
};

/// transformers' `Gemma4TextConfig` defaults of the keys a config may
/// leave out.
const DEFAULTS: &[(&str, usize)] = &[
    ("head_dim", 256),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("max_position_embeddings", 131_072),
    ("vocab_size", 262_144),
];

/// Index of the sliding layers' RoPE in [`ModelSpec::ropes`].
const LOCAL: usize = 1;

fn from_gguf(_: &Metadata<'_>) -> Result<ModelSpec> {
    Err(Error::Config(
        "Gemma 4 from GGUF is not served yet: serve its safetensors directory".into(),
    ))
}

fn hf(c: &HfConfig) -> Result<ModelSpec> {
    let shape = Shape::hf(c, DEFAULTS)?;
    let layers = shape.layers;
    // transformers: six to a pattern, the last of each full; the last
    // layer always full.
    let mut slides = sliding_pattern(c, layers, |i| (i + 1) % 6 != 0)?;
    if let Some(last) = slides.last_mut() {
        *last = false;
    }
    let k_eq_v = c.bool_or("attention_k_eq_v", false)?;
    let full = full_heads(c, &shape, &slides, k_eq_v)?;
    let window = c.usize_or("sliding_window", 512)?;
    let shared = c.usize_or("num_kv_shared_layers", 0)?;
    let sources = kv_sources(&slides, shared)?;
    let local = local_rope(c, shape.head_dim)?;
    let global = global_rope(c, full.head_dim)?;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let act = Activation::GeluTanh;
    let ffn = match c.bool_or("enable_moe_block", false)? {
        true => FeedForward::DenseAndMoe(experts(c, act)?),
        false => FeedForward::Gated(act),
    };
    let mut spec = shape.spec("gemma4", norms(eps), vec![global, local], |i| {
        let full_layer = !slides[i];
        let kv = KvLayout {
            shape: full_layer.then_some(full),
            values_from_keys: k_eq_v && full_layer,
            v_norm: true,
            shared_from: sources[i],
        };
        layer(slides[i].then_some(window), kv, ffn)
    });
    spec.embed_scale = Some((spec.hidden as f64).sqrt() as f32);
    spec.final_softcap = c.f64_opt("final_logit_softcapping")?.map(|x| x as f32);
    spec.layer_out_scale = true;
    if c.bool_or("use_double_wide_mlp", false)? {
        let wide = |i: usize| match sources[i] {
            Some(_) => 2 * shape.intermediate,
            None => shape.intermediate,
        };
        spec.ffn_widths = (0..layers).map(wide).collect();
    }
    spec.per_layer_input = match c.usize_opt("hidden_size_per_layer_input")? {
        Some(width) if width > 0 => Some(PerLayerInput {
            width,
            vocab: c.usize_or("vocab_size_per_layer_input", 262_144)?,
            activation: act,
        }),
        _ => None,
    };
    Ok(spec)
}

/// The experts of `enable_moe_block`.
fn experts(c: &HfConfig, activation: Activation) -> Result<MoeSpec> {
    Ok(MoeSpec {
        experts: c.usize("num_experts")?,
        top_k: c.usize("top_k_experts")?,
        intermediate: c.usize("moe_intermediate_size")?,
        activation,
        routing: Routing::SoftmaxTopK { normalize: true },
        biases: false,
        shared: None,
        shared_gated: false,
        gated: true,
    })
}

fn layer(window: Option<usize>, kv: KvLayout, ffn: FeedForward) -> LayerSpec {
    LayerSpec {
        mixer: Mixer::Attention(AttentionSpec {
            window,
            chunk: None,
            rope: if window.is_some() { LOCAL } else { 0 },
            // The q/k norms set the scale.
            scale: 1.0,
            softcap: None,
            qk_norm: true,
            qk_norm_whole: false,
            qk_norm_weightless: false,
            sinks: false,
            nope: false,
            gated: false,
            temperature: None,
            kv,
        }),
        ffn,
    }
}

fn norms(eps: f64) -> Norms {
    Norms {
        eps,
        layer_norm: false,
        after_residual: false,
        // Gemma 4's norms multiply by `w`, not Gemma 3's `1 + w`.
        offset: 0.0,
        pre: true,
        post_attention: true,
        post_ffn: true,
    }
}

/// The full layers' heads: a saved config's `per_layer_config` (one
/// entry a full layer, all alike), else `global_head_dim` (512) and, where
/// the values are the keys', `num_global_key_value_heads`.
fn full_heads(c: &HfConfig, shape: &Shape, slides: &[bool], k_eq_v: bool) -> Result<HeadShape> {
    let model = HeadShape {
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
    };
    if let Some(Json::Object(per)) = c.get("per_layer_config") {
        let mut found: Option<HeadShape> = None;
        for i in (0..slides.len()).filter(|&i| !slides[i]) {
            let entry = per.get(&i.to_string()).and_then(Json::as_object);
            let get = |k: &str| entry.and_then(|e| e.get(k)).and_then(Json::as_u64);
            let h = HeadShape {
                kv_heads: get("num_key_value_heads").map_or(model.kv_heads, |n| n as usize),
                head_dim: get("head_dim").map_or(model.head_dim, |n| n as usize),
            };
            if found.is_some_and(|f| f != h) {
                return Err(Error::Config(format!(
                    "config.json per_layer_config: full layers of unlike heads ({h:?})"
                )));
            }
            found = Some(h);
        }
        return Ok(found.unwrap_or(model));
    }
    let kv_heads = match k_eq_v {
        true => c.usize_opt("num_global_key_value_heads")?,
        false => None,
    };
    Ok(HeadShape {
        kv_heads: kv_heads.unwrap_or(model.kv_heads),
        head_dim: c.usize_or("global_head_dim", 512)?,
    })
}

/// Each layer's KV source: the last `shared` layers read the last earlier
/// layer of their kind (sliding or full) that keeps its own.
fn kv_sources(slides: &[bool], shared: usize) -> Result<Vec<Option<usize>>> {
    let first = slides
        .len()
        .checked_sub(shared)
        .filter(|&f| f > 0)
        .ok_or_else(|| {
            Error::Config(format!(
                "num_kv_shared_layers {shared} of {} layers leaves none to keep KV",
                slides.len()
            ))
        })?;
    (0..slides.len())
        .map(|i| match i < first {
            true => Ok(None),
            false => match (0..first).rev().find(|&j| slides[j] == slides[i]) {
                Some(j) => Ok(Some(j)),
                None => Err(Error::Config(format!(
                    "layer {i} shares KV, but no earlier layer of its kind keeps any"
                ))),
            },
        })
        .collect()
}

/// The RoPE kind of `rope_parameters[kind]`: (theta, its object).
fn rope_params<'a>(c: &'a HfConfig, kind: &str) -> Option<&'a serde_json::Map<String, Json>> {
    c.get("rope_parameters")
        .and_then(|p| p.get(kind))
        .and_then(Json::as_object)
}

fn number(p: Option<&serde_json::Map<String, Json>>, key: &str) -> Result<Option<f64>> {
    match p.and_then(|p| p.get(key)) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::Config(format!("rope_parameters {key} = {v} is not a number"))),
    }
}

/// The sliding layers' plain RoPE (theta 10,000 by default).
fn local_rope(c: &HfConfig, head_dim: usize) -> Result<RopeSpec> {
    let p = rope_params(c, "sliding_attention");
    match p.and_then(|p| p.get("rope_type")).and_then(Json::as_str) {
        None | Some("default") => {}
        Some(other) => {
            return Err(Error::Config(format!("Gemma 4 sliding RoPE {other:?}")));
        }
    }
    Ok(RopeSpec {
        theta: number(p, "rope_theta")?.unwrap_or(10_000.0) as f32,
        rotary_dim: head_dim,
        scaling: RopeScaling::None,
    })
}

/// The full layers' proportional RoPE: the whole head rotates in halves,
/// but only its first `partial_rotary_factor` of frequencies (as if the
/// head were that wide, over the head's width) turn; the rest stand still
/// (a divisor of infinity). Theta 1,000,000 and a quarter by default.
fn global_rope(c: &HfConfig, head_dim: usize) -> Result<RopeSpec> {
    let p = rope_params(c, "full_attention");
    let kind = p.and_then(|p| p.get("rope_type")).and_then(Json::as_str);
    let (fraction, default_fraction) = match kind {
        None | Some("proportional") => (number(p, "partial_rotary_factor")?, 0.25),
        Some("default") => (None, 1.0),
        Some(other) => {
            return Err(Error::Config(format!(
                "Gemma 4 full-attention RoPE {other:?}"
            )));
        }
    };
    let fraction = fraction.unwrap_or(default_fraction);
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(Error::Config(format!("partial_rotary_factor {fraction}")));
    }
    let factor = number(p, "factor")?.unwrap_or(1.0) as f32;
    // transformers: `int(fraction * head_dim // 2)` frequencies turn.
    let turning = ((fraction * head_dim as f64) / 2.0).floor() as usize;
    let divisors = (0..head_dim / 2)
        .map(|i| if i < turning { factor } else { f32::INFINITY })
        .collect();
    Ok(RopeSpec {
        theta: number(p, "rope_theta")?.unwrap_or(1_000_000.0) as f32,
        rotary_dim: head_dim,
        scaling: RopeScaling::Divisors(divisors),
    })
}

#[cfg(test)]
#[path = "gemma4_tests.rs"]
mod tests;
