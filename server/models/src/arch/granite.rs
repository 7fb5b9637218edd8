//! Granite 4.0-H (`GraniteMoeHybridForCausalLM`, llama.cpp's
//! `granitehybrid`): Mamba-2 and attention layers by `layer_types`, a
//! shared SwiGLU MLP after either mixer, attention without position
//! embeddings (NoPE) unless `position_embedding_type` is `rope`, and
//! Granite's multipliers (embeddings, residuals, attention scale, logits).
//! The dense-MLP variant (Granite-4.0-H-Micro's kind) and the mixtures of
//! experts (H-Tiny, H-Small: top-k of the router's logits, softmax over
//! those, the shared MLP beside the experts in every layer), from
//! safetensors and GGUF.

use super::mamba::{dt_limit, gguf_hybrid_shape, gguf_ssm};
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, gguf_moe, pre_norms, swiglu_layer, with_experts};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, FeedForward, LayerSpec, Mixer, ModelSpec, MoeSpec, RopeSpec, Routing, SsmSpec,
};

/// Granite 4.0-H.
pub(super) static GRANITE_HYBRID: Family = Family {
    name: "granitehybrid",
    gguf: &["granitehybrid"],
    hf: &["GraniteMoeHybridForCausalLM", "granitemoehybrid"],
    hf_tensors: &[
        ("ssm_in", "mamba.in_proj"),
        ("ssm_conv1d", "mamba.conv1d"),
        ("ssm_dt.bias", "mamba.dt_bias"),
        ("ssm_a_log", "mamba.A_log"),
        ("ssm_d", "mamba.D"),
        ("ssm_norm", "mamba.norm"),
        ("ssm_out", "mamba.out_proj"),
        // `[gate | up]` in one matrix.
        ("ffn_up", "shared_mlp.input_linear"),
        ("ffn_down", "shared_mlp.output_linear"),
        // With experts the same MLP is the shared expert (llama.cpp's
        // `_shexp`), and the experts' gate and up are one stacked tensor.
        ("ffn_up_shexp", "shared_mlp.input_linear"),
        ("ffn_down_shexp", "shared_mlp.output_linear"),
        ("ffn_gate_inp", "block_sparse_moe.router.layer"),
        (
            "ffn_gate_exps.weight",
            "block_sparse_moe.input_linear.weight",
        ),
        ("ffn_up_exps.weight", "block_sparse_moe.input_linear.weight"),
        (
            "ffn_down_exps.weight",
            "block_sparse_moe.output_linear.weight",
        ),
    ],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::StackedHalves,
    tied_default: false,
    // The converter permutes q and k for llama.cpp's RoPE layout.
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf: granite,
    from_gguf: granite_gguf,
};

/// The Mamba-2 mixer of a Granite config (`mamba_*` keys).
fn ssm(c: &HfConfig, hidden: usize) -> Result<SsmSpec> {
    let heads = c.usize("mamba_n_heads")?;
    let expand = c.usize_or("mamba_expand", 2)?;
    let inner = hidden.saturating_mul(expand);
    // `mamba_d_head` may be "auto": the inner width over the heads.
    let head_dim = match c.usize_opt("mamba_d_head") {
        Ok(Some(d)) => d,
        _ => inner / heads.max(1),
    };
    if heads.checked_mul(head_dim) != Some(inner) {
        return Err(Error::Config(format!(
            "config.json mamba_n_heads {heads} x mamba_d_head {head_dim} is not \
             hidden_size {hidden} x mamba_expand {expand}"
        )));
    }
    Ok(SsmSpec {
        heads,
        head_dim,
        state: c.usize("mamba_d_state")?,
        groups: c.usize_or("mamba_n_groups", 1)?,
        conv_kernel: c.usize_or("mamba_d_conv", 4)?,
        chunk: c.usize_or("mamba_chunk_size", 256)?,
        dt_limit: dt_limit(c)?,
        conv_bias: c.bool_or("mamba_conv_bias", true)?,
        proj_bias: c.bool_or("mamba_proj_bias", false)?,
    })
}

/// Which layers are Mamba-2: `layer_types` (`"mamba"` / `"attention"`, or
/// `"linear_attention"` / `"full_attention"`).
fn mamba_layers(c: &HfConfig, layers: usize) -> Result<Vec<bool>> {
    // The Hub's spelling, and transformers 5's when it saves.
    let kinds = (
        &["mamba", "linear_attention"][..],
        &["attention", "full_attention"][..],
    );
    c.recurrent_kinds(layers, kinds)?
        .ok_or_else(|| Error::Config("config.json has no layer_types".into()))
}

/// What a Granite 4.0-H's spec is built from, whichever file it came from.
struct Hybrid {
    shape: Shape,
    eps: f64,
    rope: RopeSpec,
    /// Attention without position embeddings.
    nope: bool,
    /// The attention scale (`attention_multiplier`).
    scale: f32,
    /// Which layers are Mamba-2.
    mamba: Vec<bool>,
    ssm: SsmSpec,
    /// Embedding, residual and logit multipliers, 1 where absent.
    multipliers: [f32; 3],
}

impl Hybrid {
    fn spec(self) -> ModelSpec {
        let (nope, scale, ssm) = (self.nope, self.scale, self.ssm);
        let mut spec = self.shape.spec(
            "granitehybrid",
            pre_norms(self.eps),
            vec![self.rope],
            |i| match self.mamba[i] {
                true => LayerSpec {
                    mixer: Mixer::Mamba2(ssm),
                    ffn: FeedForward::Gated(Activation::Silu),
                },
                false => {
                    let mut l = swiglu_layer(None, scale, false);
                    if let Mixer::Attention(a) = &mut l.mixer {
                        a.nope = nope;
                    }
                    l
                }
            },
        );
        // 0 is llama.cpp's "absent", 1 changes nothing.
        let [embed, residual, logits] = self
            .multipliers
            .map(|m| Some(m).filter(|&m| m != 1.0 && m != 0.0));
        spec.embed_scale = embed;
        spec.residual_scale = residual;
        spec.logit_scale = logits.map(|s| 1.0 / s);
        spec
    }
}

/// The experts of a Granite 4.0-H config (`num_local_experts` > 0),
/// the shared MLP of `shared` width beside them, added ungated.
fn hf_experts(c: &HfConfig, shared: usize) -> Result<Option<MoeSpec>> {
    let experts = c.usize_or("num_local_experts", 0)?;
    if experts == 0 {
        return Ok(None);
    }
    Ok(Some(MoeSpec {
        experts,
        top_k: c.usize("num_experts_per_tok")?,
        intermediate: c.usize("intermediate_size")?,
        activation: Activation::Silu,
        routing: Routing::TopKSoftmax,
        biases: false,
        shared: Some(shared),
        shared_gated: false,
        gated: true,
    }))
}

fn granite(c: &HfConfig) -> Result<ModelSpec> {
    let mut shape = Shape::hf(c, &[])?;
    shape.intermediate = c.usize("shared_intermediate_size")?;
    let moe = hf_experts(c, shape.intermediate)?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    let multiplier = |key: &str| -> Result<f32> { Ok(c.f64_opt(key)?.map_or(1.0, |m| m as f32)) };
    let mut spec = Hybrid {
        eps: c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
        rope,
        nope: c.str_opt("position_embedding_type") != Some("rope"),
        scale: c.f64_opt("attention_multiplier")?.unwrap_or(1.0) as f32,
        mamba: mamba_layers(c, shape.layers)?,
        ssm: ssm(c, shape.hidden)?,
        multipliers: [
            multiplier("embedding_multiplier")?,
            multiplier("residual_multiplier")?,
            multiplier("logits_scaling")?,
        ],
        shape,
    }
    .spec();
    spec.qkv_bias = c.bool_or("attention_bias", false)?;
    with_experts(&mut spec, moe, |_| true);
    Ok(spec)
}

/// llama.cpp's `granitehybrid`: the layer kinds from the per-layer KV head
/// counts (0 for a Mamba-2 layer), NoPE where `rope.scaling.finetuned` is
/// false (its converter's switch), the multipliers as `*_scale` keys; the
/// experts where `expert_count` says, each `feed_forward_length` wide.
fn granite_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let intermediate = match m.usize_opt("expert_shared_feed_forward_length")? {
        Some(n) => n,
        None => m.usize("feed_forward_length")?,
    };
    let (shape, mamba) = gguf_hybrid_shape(m, intermediate)?;
    let rope = m.plain_rope(shape.head_dim)?;
    let scale = |key: &str| -> Result<f32> { Ok(m.f32_opt(key)?.unwrap_or(1.0)) };
    let experts = Shape {
        intermediate: m.usize("feed_forward_length")?,
        ..shape
    };
    let moe =
        gguf_moe(m, &experts, Activation::Silu, Routing::TopKSoftmax, false)?.map(|moe| MoeSpec {
            // The converter writes the shared MLP's width, and no gate for it.
            shared: Some(shape.intermediate),
            shared_gated: false,
            gated: true,
            ..moe
        });
    let mut spec = Hybrid {
        eps: m
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .map_or(1e-6, f64::from),
        rope,
        nope: m.bool_opt("rope.scaling.finetuned")? == Some(false),
        scale: m
            .f32_opt("attention.scale")?
            .filter(|&s| s != 0.0)
            .unwrap_or(shape.plain_scale()),
        mamba,
        ssm: gguf_ssm(m)?,
        multipliers: [
            scale("embedding_scale")?,
            scale("residual_scale")?,
            scale("logit_scale")?,
        ],
        shape,
    }
    .spec();
    with_experts(&mut spec, moe, |_| true);
    Ok(spec)
}

#[cfg(test)]
mod tests;
