//! LFM2 (`Lfm2ForCausalLM`, llama.cpp's `lfm2`): short-convolution layers
//! and attention layers by `layer_types` (or `full_attn_idxs`), attention
//! with per-head q/k RMSNorms, a SwiGLU feed-forward after either mixer
//! whose width transformers adjusts from `block_ff_dim`, tied embeddings,
//! and the final norm named `embedding_norm` (llama.cpp's
//! `token_embd_norm`).

use super::mamba::gguf_hybrid_shape;
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, pre_norms, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Activation, FeedForward, LayerSpec, Mixer, ModelSpec, RopeSpec, ShortConvSpec};

/// LFM2.
pub(super) static LFM2: Family = Family {
    name: "lfm2",
    gguf: &["lfm2"],
    hf: &["Lfm2ForCausalLM", "LFM2ForCausalLM", "lfm2"],
    hf_tensors: &[
        ("output_norm.weight", "embedding_norm.weight"),
        ("attn_norm", "operator_norm"),
        ("attn_output", "self_attn.out_proj"),
        ("attn_q_norm", "self_attn.q_layernorm"),
        ("attn_k_norm", "self_attn.k_layernorm"),
        ("ffn_norm", "ffn_norm"),
        ("ffn_gate", "feed_forward.w1"),
        ("ffn_up", "feed_forward.w3"),
        ("ffn_down", "feed_forward.w2"),
        ("shortconv.in_proj", "conv.in_proj"),
        ("shortconv.conv", "conv.conv"),
        ("shortconv.out_proj", "conv.out_proj"),
    ],
    // llama.cpp names the final norm after the embeddings (its converter
    // maps `model.embedding_norm` so, though it is applied last).
    gguf_tensors: &[("output_norm.weight", "token_embd_norm.weight")],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    // LFM2's converter is the plain text model's: q and k as stored.
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: lfm2,
    from_gguf: lfm2_gguf,
};

/// transformers' `rope_theta` default for LFM2.
const DEFAULT_THETA: f32 = 1_000_000.0;

/// What an LFM2 spec is built from, whichever file it came from.
struct Hybrid {
    shape: Shape,
    eps: f64,
    rope: RopeSpec,
    /// Which layers are short convolutions.
    conv: Vec<bool>,
    short_conv: ShortConvSpec,
}

impl Hybrid {
    fn spec(self) -> ModelSpec {
        let scale = self.shape.plain_scale();
        let short_conv = self.short_conv;
        self.shape.spec(
            "lfm2",
            pre_norms(self.eps),
            vec![self.rope],
            |i| match self.conv[i] {
                true => LayerSpec {
                    mixer: Mixer::ShortConv(short_conv),
                    ffn: FeedForward::Gated(Activation::Silu),
                },
                false => swiglu_layer(None, scale, true),
            },
        )
    }
}

/// The feed-forward width transformers builds (`Lfm2MLP`): with
/// `block_auto_adjust_ff_dim`, two thirds of `ff`, times
/// `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`.
fn ff_width(c: &HfConfig, ff: usize) -> Result<usize> {
    if !c.bool_or("block_auto_adjust_ff_dim", true)? {
        return Ok(ff);
    }
    let mut width = 2 * ff / 3;
    // A `null` multiplier skips the rounding too, as transformers does.
    let multiplier = "block_ffn_dim_multiplier";
    if c.has(multiplier) && c.get(multiplier).is_none() {
        return Ok(width);
    }
    let multiplier = c.f64_opt(multiplier)?.unwrap_or(1.0);
    width = (multiplier * width as f64) as usize;
    let multiple = c.usize_or("block_multiple_of", 256)?.max(1);
    Ok(width.div_ceil(multiple) * multiple)
}

/// Which layers are short convolutions: `layer_types` (`conv` /
/// `full_attention`), else every layer not in `full_attn_idxs` (every layer
/// attention where neither is given, transformers' default).
fn conv_layers(c: &HfConfig, layers: usize) -> Result<Vec<bool>> {
    let kinds = (&["conv"][..], &["full_attention", "attention"][..]);
    if let Some(kinds) = c.recurrent_kinds(layers, kinds)? {
        return Ok(kinds);
    }
    // transformers saves an unused list as `null`.
    if c.get("full_attn_idxs").is_none() {
        return Ok(vec![false; layers]);
    }
    let attends = c.usizes("full_attn_idxs")?;
    if let Some(&i) = attends.iter().find(|&&i| i >= layers) {
        return Err(Error::Config(format!(
            "config.json full_attn_idxs names layer {i} of {layers}"
        )));
    }
    Ok((0..layers).map(|i| !attends.contains(&i)).collect())
}

fn lfm2(c: &HfConfig) -> Result<ModelSpec> {
    // `intermediate_size` is transformers' name for `block_ff_dim`, which
    // the Hub's configs carry (and transformers prefers).
    let ff = match c.usize_opt("block_ff_dim")? {
        Some(n) => n,
        None => c.usize("intermediate_size")?,
    };
    let mut shape = Shape::hf(
        c,
        &[
            ("intermediate_size", 0),
            ("max_position_embeddings", 128_000),
        ],
    )?;
    shape.intermediate = ff_width(c, ff)?;
    let eps = match c.f64_opt("norm_eps")? {
        Some(e) => e,
        None => c.f64_opt("block_norm_eps")?.unwrap_or(1e-5),
    };
    Ok(Hybrid {
        eps,
        rope: hf_rope(c, None, ("rope_theta", None), DEFAULT_THETA, shape.head_dim)?,
        conv: conv_layers(c, shape.layers)?,
        short_conv: ShortConvSpec {
            channels: shape.hidden,
            kernel: c.usize_or("conv_L_cache", 3)?,
            bias: c.bool_or("conv_bias", false)?,
        },
        shape,
    }
    .spec())
}

/// llama.cpp's `lfm2`: the layer kinds from the per-layer KV head counts
/// (0 for a convolution layer), the kernel from `shortconv.l_cache`, the
/// feed-forward width as adjusted by its converter.
fn lfm2_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let (shape, conv) = gguf_hybrid_shape(m, m.usize("feed_forward_length")?)?;
    Ok(Hybrid {
        eps: m
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .map_or(1e-5, f64::from),
        rope: m.plain_rope(shape.head_dim)?,
        conv,
        short_conv: ShortConvSpec {
            channels: shape.hidden,
            kernel: m.usize("shortconv.l_cache")?,
            bias: false,
        },
        shape,
    }
    .spec())
}

#[cfg(test)]
mod tests;
