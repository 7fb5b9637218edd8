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
//! From GGUF as llama.cpp's converter writes it (`gemma4`).

use serde_json::Value as Json;

use super::rope::{hf_rope, num};
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

/// What both formats say of a Gemma 4 model.
struct Parts {
    shape: Shape,
    /// Whether each layer slides.
    slides: Vec<bool>,
    /// The full layers' heads.
    full: HeadShape,
    /// The full layers' values are their keys' projection (safetensors'
    /// `attention_k_eq_v`; a GGUF says it by having no v projection).
    k_eq_v: bool,
    window: usize,
    /// Layers at the end reading earlier layers' KV.
    shared: usize,
    /// (full layers', sliding layers') RoPE.
    ropes: (RopeSpec, RopeSpec),
    eps: f64,
    final_softcap: Option<f32>,
    /// The experts beside each MLP, where it has them.
    experts: Option<MoeSpec>,
    /// Each layer's MLP width, where they differ.
    ffn_widths: Vec<usize>,
    per_layer_input: Option<PerLayerInput>,
}

/// The model both readers describe.
fn build(p: Parts) -> Result<ModelSpec> {
    let sources = kv_sources(&p.slides, p.shared)?;
    let act = Activation::GeluTanh;
    let ffn = match p.experts {
        Some(m) => FeedForward::DenseAndMoe(m),
        None => FeedForward::Gated(act),
    };
    let (global, local) = p.ropes;
    let mut spec = p
        .shape
        .spec("gemma4", norms(p.eps), vec![global, local], |i| {
            let full_layer = !p.slides[i];
            let kv = KvLayout {
                shape: full_layer.then_some(p.full),
                values_from_keys: p.k_eq_v && full_layer,
                v_norm: true,
                shared_from: sources[i],
            };
            layer(p.slides[i].then_some(p.window), kv, ffn)
        });
    spec.embed_scale = Some((spec.hidden as f64).sqrt() as f32);
    spec.final_softcap = p.final_softcap;
    spec.layer_out_scale = true;
    spec.ffn_widths = p.ffn_widths;
    spec.per_layer_input = p.per_layer_input;
    Ok(spec)
}

/// From llama.cpp's GGUF: the sliding layers' heads as the model's
/// (`key_length_swa`), the full layers' by `key_length` and the per-layer
/// `head_count_kv`; the full layers' RoPE divisors are the file's
/// `rope_freqs` (read by the GGUF loader), values from keys where a full
/// layer has no `attn_v` (also the loader's).
fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let layers = super::checked_layers(m.usize("block_count")?)?;
    let slides = m
        .bools_opt("attention.sliding_window_pattern")?
        .filter(|l| l.len() == layers)
        .ok_or_else(|| {
            Error::Config("gemma4.attention.sliding_window_pattern: one entry a layer".into())
        })?;
    let kv = m
        .per_layer_opt("attention.head_count_kv", layers)?
        .ok_or_else(|| Error::Config("gemma4.attention.head_count_kv is missing".into()))?;
    let ffn = m
        .per_layer_opt("feed_forward_length", layers)?
        .ok_or_else(|| Error::Config("gemma4.feed_forward_length is missing".into()))?;
    let head_of = |full: bool| {
        kv.iter()
            .zip(&slides)
            .find(|(_, s)| **s != full)
            .map(|(&k, _)| k)
    };
    let full_dim = m.usize("attention.key_length")?;
    let swa_dim = m.usize_opt("attention.key_length_swa")?.unwrap_or(full_dim);
    let shape = Shape {
        hidden: m.usize("embedding_length")?,
        intermediate: ffn[0],
        layers,
        heads: m.usize("attention.head_count")?,
        kv_heads: head_of(false).or(head_of(true)).unwrap_or(1),
        head_dim: swa_dim,
        vocab: m.vocab()?,
        context: m.usize("context_length")?,
    };
    let full = HeadShape {
        kv_heads: head_of(true).unwrap_or(shape.kv_heads),
        head_dim: full_dim,
    };
    let rope = |base: &str, dims: &str, head: usize| -> Result<RopeSpec> {
        Ok(RopeSpec {
            theta: m.f32_opt(base)?.unwrap_or(10_000.0),
            rotary_dim: m.usize_opt(dims)?.unwrap_or(head),
            scaling: RopeScaling::None,
        })
    };
    let ropes = (
        rope("rope.freq_base", "rope.dimension_count", full_dim)?,
        rope("rope.freq_base_swa", "rope.dimension_count_swa", swa_dim)?,
    );
    let experts = gguf_moe(m, &shape, Activation::GeluTanh)?;
    let width = m
        .usize_opt("embedding_length_per_layer_input")?
        .unwrap_or(0);
    let vocab = shape.vocab;
    build(Parts {
        shape,
        slides,
        full,
        k_eq_v: false,
        window: m.usize("attention.sliding_window")?,
        shared: m.usize_opt("attention.shared_kv_layers")?.unwrap_or(0),
        ropes,
        eps: f64::from(
            m.f32_opt("attention.layer_norm_rms_epsilon")?
                .unwrap_or(1e-6),
        ),
        final_softcap: m.f32_opt("final_logit_softcapping")?.filter(|&c| c > 0.0),
        experts,
        ffn_widths: match ffn.iter().all(|&f| f == ffn[0]) {
            true => Vec::new(),
            false => ffn,
        },
        per_layer_input: (width > 0).then_some(PerLayerInput {
            width,
            vocab,
            activation: Activation::GeluTanh,
        }),
    })
}

/// A GGUF's experts beside each MLP: softmax over all, the top
/// `expert_used_count` renormalised.
fn gguf_moe(m: &Metadata<'_>, shape: &Shape, activation: Activation) -> Result<Option<MoeSpec>> {
    let routing = Routing::SoftmaxTopK { normalize: true };
    let found = super::gguf_moe(m, shape, activation, routing, false)?;
    // llama.cpp's gating flag aside, Gemma 4's experts have no shared one.
    Ok(found.map(|e| MoeSpec {
        shared: None,
        shared_gated: false,
        ..e
    }))
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
    let shared = c.usize_or("num_kv_shared_layers", 0)?;
    let act = Activation::GeluTanh;
    let experts = match c.bool_or("enable_moe_block", false)? {
        true => Some(experts(c, act)?),
        false => None,
    };
    // The shared-KV layers' MLPs twice as wide where `use_double_wide_mlp`.
    let ffn_widths = match c.bool_or("use_double_wide_mlp", false)? {
        true => (0..layers)
            .map(|i| match i + shared >= layers {
                true => 2 * shape.intermediate,
                false => shape.intermediate,
            })
            .collect(),
        false => Vec::new(),
    };
    let per_layer_input = match c.usize_opt("hidden_size_per_layer_input")? {
        Some(width) if width > 0 => Some(PerLayerInput {
            width,
            vocab: c.usize_or("vocab_size_per_layer_input", 262_144)?,
            activation: act,
        }),
        _ => None,
    };
    // The sliding layers' RoPE is plain (theta 10,000 by default).
    let local = ("rope_theta", None);
    let local = hf_rope(
        c,
        Some("sliding_attention"),
        local,
        10_000.0,
        shape.head_dim,
    )?;
    let ropes = (global_rope(c, full.head_dim)?, local);
    build(Parts {
        shape,
        slides,
        full,
        k_eq_v,
        window: c.usize_or("sliding_window", 512)?,
        shared,
        ropes,
        eps: c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
        final_softcap: c.f64_opt("final_logit_softcapping")?.map(|x| x as f32),
        experts,
        ffn_widths,
        per_layer_input,
    })
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

/// `rope_parameters[kind]`, where the config has it.
fn rope_params<'a>(c: &'a HfConfig, kind: &str) -> Option<&'a serde_json::Map<String, Json>> {
    c.get("rope_parameters")
        .and_then(|p| p.get(kind))
        .and_then(Json::as_object)
}

/// The full layers' proportional RoPE: the whole head rotates in halves,
/// but only its first `partial_rotary_factor` of frequencies (as if the
/// head were that wide, over the head's width) turn; the rest stand still
/// (a divisor of infinity). Theta 1,000,000 and a quarter by default.
fn global_rope(c: &HfConfig, head_dim: usize) -> Result<RopeSpec> {
    let empty = serde_json::Map::new();
    let p = rope_params(c, "full_attention").unwrap_or(&empty);
    let kind = p.get("rope_type").and_then(Json::as_str);
    let (fraction, default_fraction) = match kind {
        None | Some("proportional") => (num(p, "partial_rotary_factor")?, 0.25),
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
    let factor = num(p, "factor")?.unwrap_or(1.0) as f32;
    // transformers: `int(fraction * head_dim // 2)` frequencies turn.
    let turning = ((fraction * head_dim as f64) / 2.0).floor() as usize;
    let divisors = (0..head_dim / 2)
        .map(|i| if i < turning { factor } else { f32::INFINITY })
        .collect();
    Ok(RopeSpec {
        theta: num(p, "rope_theta")?.unwrap_or(1_000_000.0) as f32,
        rotary_dim: head_dim,
        scaling: RopeScaling::Divisors(divisors),
    })
}

#[cfg(test)]
#[path = "gemma4_tests.rs"]
mod tests;
