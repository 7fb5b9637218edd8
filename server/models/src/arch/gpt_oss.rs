//! gpt-oss: every layer a mixture of experts (top-k of the router's logits,
//! softmax over those, biases on the router and every expert, clamped
//! SwiGLU), biased attention with a learned sink per head, sliding-window
//! (128) and full layers alternating, YaRN.

use super::llama::plain_gguf;
use super::rope::{gguf_yarn, hf_rope};
use super::{Family, HfExperts, Shape, pre_norms, sliding_pattern, swiglu_layer, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::Result;
use crate::spec::{Activation, Mixer, ModelSpec, MoeSpec, RopeScaling, Routing};

/// gpt-oss.
pub(super) static GPT_OSS: Family = Family {
    name: "gpt-oss",
    gguf: &["gpt-oss"],
    hf: &["GptOssForCausalLM", "gpt_oss"],
    // Whole names: gate and up interleaved in one stacked tensor.
    hf_tensors: &[
        ("attn_sinks.weight", "self_attn.sinks"),
        ("ffn_gate_inp", "mlp.router"),
        ("ffn_gate_exps.weight", "mlp.experts.gate_up_proj"),
        ("ffn_up_exps.weight", "mlp.experts.gate_up_proj"),
        ("ffn_down_exps.weight", "mlp.experts.down_proj"),
        ("ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias"),
        ("ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias"),
        ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
    ],
    // llama.cpp names the pre-MLP norm `post_attention_norm`.
    gguf_tensors: &[("ffn_norm", "post_attention_norm")],
    hf_layers: "layers",
    hf_experts: HfExperts::StackedInterleaved,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: hf,
    from_gguf: gguf,
};

/// The clamped SwiGLU's constants where a config names none.
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;
/// The window where a file names none.
const WINDOW: usize = 128;

/// Layer `i` slides where the pattern says (even layers by default).
fn layers(spec: &mut ModelSpec, window: usize, slides: &[bool], moe: MoeSpec) {
    let scale = 1.0 / (spec.head_dim as f32).sqrt();
    for (i, l) in spec.layers.iter_mut().enumerate() {
        *l = swiglu_layer(
            slides.get(i).copied().unwrap_or(false).then_some(window),
            scale,
            false,
        );
        if let Mixer::Attention(a) = &mut l.mixer {
            a.sinks = true;
        }
    }
    with_experts(spec, Some(moe), |_| true);
    spec.qkv_bias = true;
}

fn hf(c: &HfConfig) -> Result<ModelSpec> {
    let shape = Shape::hf(c, &[("head_dim", 64)])?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        150_000.0,
        shape.head_dim,
    )?;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-5);
    let mut spec = shape.spec("gpt-oss", pre_norms(eps), vec![rope], |_| {
        swiglu_layer(None, 1.0, false)
    });
    let alpha = c.f64_opt("swiglu_alpha")?.map_or(ALPHA, |a| a as f32);
    let limit = c.f64_opt("swiglu_limit")?.map_or(LIMIT, |l| l as f32);
    let moe = MoeSpec {
        experts: c.usize("num_local_experts")?,
        top_k: match c.usize_opt("num_experts_per_tok")? {
            Some(k) => k,
            None => c.usize("experts_per_token")?,
        },
        intermediate: shape.intermediate,
        activation: Activation::SwigluOai { alpha, limit },
        routing: Routing::TopKSoftmax,
        biases: true,
        shared: None,
        shared_gated: false,
        gated: true,
    };
    let window = c.usize_opt("sliding_window")?.unwrap_or(WINDOW);
    let slides = sliding_pattern(c, shape.layers, |i| i % 2 == 0)?;
    layers(&mut spec, window, &slides, moe);
    Ok(spec)
}

fn gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let mut spec = plain_gguf(m, &shape, "gpt-oss")?;
    // As trained (transformers' `truncate: false`).
    spec.ropes[0].scaling = match gguf_yarn(m, false)? {
        Some(yarn) => yarn.scaling(spec.ropes[0].theta, spec.ropes[0].rotary_dim),
        None => RopeScaling::None,
    };
    let moe = MoeSpec {
        experts: m.usize("expert_count")?,
        top_k: m.usize("expert_used_count")?,
        intermediate: m
            .usize_opt("expert_feed_forward_length")?
            .unwrap_or(shape.intermediate),
        // llama.cpp's constants too.
        activation: Activation::SwigluOai {
            alpha: ALPHA,
            limit: LIMIT,
        },
        routing: Routing::TopKSoftmax,
        biases: true,
        shared: None,
        shared_gated: false,
        gated: true,
    };
    let window = m
        .usize_opt("attention.sliding_window")?
        .filter(|&w| w > 0)
        .unwrap_or(WINDOW);
    // The file's pattern, else llama.cpp's for gpt-oss: even layers slide.
    let slides = match m.bools_opt("attention.sliding_window_pattern")? {
        Some(p) => p,
        None => (0..shape.layers).map(|i| i % 2 == 0).collect(),
    };
    layers(&mut spec, window, &slides, moe);
    Ok(spec)
}
