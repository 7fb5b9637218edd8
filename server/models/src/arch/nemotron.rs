//! Nemotron-H (`NemotronHForCausalLM`, llama.cpp's `nemotron_h`): Mamba-2,
//! attention and MLP as separate layers, each its one pre-norm and a
//! residual add, by `hybrid_override_pattern` (`M` Mamba-2, `*` attention,
//! `-` MLP); attention without position embeddings; the MLP plain, up then
//! squared ReLU then down. Nemotron 3's mixture-of-experts layers (`E`,
//! llama.cpp's `nemotron_h_moe`): plain squared-ReLU experts (no gate)
//! behind a sigmoid router with a correction bias, scaled, plus a plain
//! shared expert; Nemotron 3 Super's latent experts (`moe_latent_size`)
//! are refused by name.

use serde_json::Value as Json;

use super::mamba::{dt_limit, gguf_hybrid_shape, gguf_ssm};
use super::{Family, HfExperts, Shape, pre_norms, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, FeedForward, LayerSpec, Mixer, ModelSpec, MoeSpec, Routing, SsmSpec,
};

/// Nemotron-H.
pub(super) static NEMOTRON_H: Family = Family {
    name: "nemotron_h",
    gguf: &["nemotron_h", "nemotron_h_moe"],
    hf: &["NemotronHForCausalLM", "nemotron_h"],
    // Every layer's one module is its `mixer`, its one norm `norm`.
    hf_tensors: &[
        ("token_embd.weight", "embeddings.weight"),
        ("output_norm.weight", "norm_f.weight"),
        ("attn_norm", "norm"),
        ("ssm_in", "mixer.in_proj"),
        ("ssm_conv1d", "mixer.conv1d"),
        ("ssm_dt.bias", "mixer.dt_bias"),
        ("ssm_a_log", "mixer.A_log"),
        ("ssm_d", "mixer.D"),
        ("ssm_norm", "mixer.norm"),
        ("ssm_out", "mixer.out_proj"),
        ("attn_q", "mixer.q_proj"),
        ("attn_k", "mixer.k_proj"),
        ("attn_v", "mixer.v_proj"),
        ("attn_output", "mixer.o_proj"),
        ("ffn_up", "mixer.up_proj"),
        ("ffn_down", "mixer.down_proj"),
        ("ffn_gate_inp", "mixer.gate"),
        ("exp_probs_b.bias", "mixer.gate.e_score_correction_bias"),
        ("ffn_up_exps", "mixer.experts.{e}.up_proj"),
        ("ffn_down_exps", "mixer.experts.{e}.down_proj"),
        ("ffn_up_shexp", "mixer.shared_experts.up_proj"),
        ("ffn_down_shexp", "mixer.shared_experts.down_proj"),
    ],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    // The converter permutes q and k as Granite's does (no rotation reads
    // it, but the loader puts the rows back all the same).
    gguf_permuted_qk: true,
    hf_rope_pairs: false,
    from_hf: nemotron_h,
    from_gguf: nemotron_h_gguf,
};

/// One layer's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mamba,
    Attention,
    Mlp,
    Experts,
}

/// The layer kinds of a pattern string (the Hub's `M*-`).
fn pattern_kinds(pattern: &str) -> Result<Vec<Kind>> {
    pattern
        .chars()
        .map(|c| match c {
            'M' => Ok(Kind::Mamba),
            '*' => Ok(Kind::Attention),
            '-' => Ok(Kind::Mlp),
            'E' => Ok(Kind::Experts),
            other => Err(Error::Config(format!(
                "config.json hybrid_override_pattern has {other:?} (M, *, -, E)"
            ))),
        })
        .collect()
}

/// The layer kinds of a config: `hybrid_override_pattern` (the Hub's), or
/// the list transformers 5 writes (`layers_block_type`).
fn hf_kinds(c: &HfConfig) -> Result<Vec<Kind>> {
    if let Some(p) = c.str_opt("hybrid_override_pattern") {
        return pattern_kinds(p);
    }
    let Some(Json::Array(list)) = c.get("layers_block_type") else {
        return Err(Error::Config(
            "config.json has neither hybrid_override_pattern nor layers_block_type".into(),
        ));
    };
    let letter = |t: &Json| match t.as_str() {
        Some("mamba" | "linear_attention") => Ok('M'),
        Some("attention" | "full_attention") => Ok('*'),
        Some("mlp") => Ok('-'),
        Some("moe") => Ok('E'),
        _ => Err(Error::Config(format!(
            "config.json layers_block_type has {t} (linear_attention, full_attention, mlp, moe)"
        ))),
    };
    pattern_kinds(&list.iter().map(letter).collect::<Result<String>>()?)
}

/// The Mamba-2 mixer of a Nemotron-H config.
fn hf_ssm(c: &HfConfig) -> Result<SsmSpec> {
    if let Some(act) = c.str_opt("mamba_hidden_act").filter(|&a| a != "silu") {
        return Err(Error::Config(format!(
            "config.json mamba_hidden_act {act:?} is not served (silu)"
        )));
    }
    Ok(SsmSpec {
        heads: c.usize("mamba_num_heads")?,
        head_dim: c.usize("mamba_head_dim")?,
        state: c.usize("ssm_state_size")?,
        groups: c.usize_or("n_groups", 1)?,
        conv_kernel: c.usize_or("conv_kernel", 4)?,
        chunk: c.usize_or("chunk_size", 128)?,
        dt_limit: dt_limit(c)?,
        conv_bias: c.bool_or("use_conv_bias", true)?,
        proj_bias: c.bool_or("use_bias", false)?,
    })
}

/// What a Nemotron-H model's layers share: their norm's epsilon, the
/// Mamba-2 mixer, the MLP's activation, and the experts where it has them.
struct Layers {
    eps: f64,
    ssm: SsmSpec,
    act: Activation,
    moe: Option<MoeSpec>,
}

/// The model of `shape` whose layer `i` is of `kinds[i]`.
fn spec(shape: Shape, kinds: &[Kind], l: Layers) -> Result<ModelSpec> {
    if kinds.contains(&Kind::Experts) && l.moe.is_none() {
        return Err(Error::Config(
            "Nemotron-H: `E` layers without the experts' settings (n_routed_experts)".into(),
        ));
    }
    let Layers { eps, ssm, act, moe } = l;
    let scale = shape.plain_scale();
    Ok(shape.spec("nemotron_h", pre_norms(eps), Vec::new(), |i| {
        match kinds[i] {
            Kind::Mamba => LayerSpec {
                mixer: Mixer::Mamba2(ssm),
                ffn: FeedForward::None,
            },
            Kind::Attention => {
                let mut mixer = swiglu_layer(None, scale, false).mixer;
                if let Mixer::Attention(a) = &mut mixer {
                    a.nope = true;
                }
                LayerSpec {
                    mixer,
                    ffn: FeedForward::None,
                }
            }
            Kind::Mlp => LayerSpec {
                mixer: Mixer::None,
                ffn: FeedForward::Plain(act),
            },
            Kind::Experts => LayerSpec {
                mixer: Mixer::None,
                ffn: moe.map_or(FeedForward::None, FeedForward::Moe),
            },
        }
    }))
}

/// Nemotron 3's experts: plain (ungated) with the MLP's activation, a
/// sigmoid router with a correction bias over groups, scaled, and a plain
/// shared expert.
fn experts(
    (experts, top_k, intermediate): (usize, usize, usize),
    routing: Routing,
    shared: usize,
    activation: Activation,
) -> MoeSpec {
    MoeSpec {
        experts,
        top_k,
        intermediate,
        activation,
        routing,
        biases: false,
        shared: Some(shared).filter(|&n| n > 0),
        shared_gated: false,
        gated: false,
    }
}

/// The experts of a config with `n_routed_experts`; a latent projection
/// around them (Nemotron 3 Super) is refused by name.
fn hf_moe(c: &HfConfig, act: Activation) -> Result<Option<MoeSpec>> {
    let Some(n) = c.usize_opt("n_routed_experts")? else {
        return Ok(None);
    };
    if c.usize_opt("moe_latent_size")?.is_some() {
        return Err(Error::Config(
            "config.json moe_latent_size: Nemotron 3's latent experts are not served".into(),
        ));
    }
    let routing = Routing::SigmoidGroups {
        groups: c.usize_or("n_group", 1)?,
        topk_groups: c.usize_or("topk_group", 1)?,
        normalize: c.bool_or("norm_topk_prob", true)?,
        scale: c.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32,
    };
    // One shared expert of this width, whatever `n_shared_experts` says
    // (transformers' and llama.cpp's reading).
    let shared = c.usize_or("moe_shared_expert_intermediate_size", 0)?;
    let sizes = (
        n,
        c.usize("num_experts_per_tok")?,
        c.usize("moe_intermediate_size")?,
    );
    Ok(Some(experts(sizes, routing, shared, act)))
}

fn nemotron_h(c: &HfConfig) -> Result<ModelSpec> {
    let kinds = hf_kinds(c)?;
    // The Hub's configs name the attention head width `attention_head_dim`.
    let head_dim = match c.usize_opt("attention_head_dim")? {
        Some(d) => d,
        None => c.usize("head_dim")?,
    };
    // The pattern's length is the layer count (transformers' rule).
    let shape = Shape {
        layers: kinds.len(),
        head_dim,
        ..Shape::hf(c, &[("num_hidden_layers", kinds.len())])?
    };
    let act = c.str_opt("mlp_hidden_act").unwrap_or("relu2");
    let act = Activation::from_hf("mlp_hidden_act", Some(act))?;
    let layers = Layers {
        eps: c.f64_opt("layer_norm_epsilon")?.unwrap_or(1e-5),
        ssm: hf_ssm(c)?,
        act,
        moe: hf_moe(c, act)?,
    };
    spec(shape, &kinds, layers)
}

/// llama.cpp's `nemotron_h` and `nemotron_h_moe`: a layer with KV heads
/// attends, one with a feed-forward width is an MLP (experts where the
/// file has `expert_count`), one with neither is Mamba-2 (as its loader
/// reads them).
fn nemotron_h_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let layers = super::checked_layers(m.usize("block_count")?)?;
    let ff = m
        .per_layer_opt("feed_forward_length", layers)?
        .unwrap_or_else(|| vec![0; layers]);
    let intermediate = ff.iter().copied().max().unwrap_or(0);
    if ff.iter().any(|&n| n != 0 && n != intermediate) {
        return Err(Error::Config(format!(
            "{}.feed_forward_length {ff:?}: MLP layers of different widths",
            m.arch
        )));
    }
    let moe = gguf_moe(m)?;
    let (shape, recurrent) = gguf_hybrid_shape(m, intermediate)?;
    let kinds: Vec<Kind> = (0..layers)
        .map(|i| match (recurrent[i], ff[i] > 0) {
            (_, true) if moe.is_some() => Kind::Experts,
            (_, true) => Kind::Mlp,
            (true, false) => Kind::Mamba,
            (false, false) => Kind::Attention,
        })
        .collect();
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .map_or(1e-5, f64::from);
    let layers = Layers {
        eps,
        ssm: gguf_ssm(m)?,
        act: Activation::Relu2,
        moe,
    };
    spec(shape, &kinds, layers)
}

/// The experts of a `nemotron_h_moe` file (its router the sigmoid, as
/// llama.cpp's graph fixes it); a latent projection around them is
/// refused by name.
fn gguf_moe(m: &Metadata<'_>) -> Result<Option<MoeSpec>> {
    let Some(n) = m.usize_opt("expert_count")?.filter(|&n| n > 0) else {
        return Ok(None);
    };
    if m.usize_opt("moe_latent_size")?.is_some_and(|n| n > 0) {
        return Err(Error::Config(format!(
            "{}.moe_latent_size: Nemotron 3's latent experts are not served",
            m.arch
        )));
    }
    let routing = Routing::SigmoidGroups {
        groups: m.usize_opt("expert_group_count")?.unwrap_or(1).max(1),
        topk_groups: m.usize_opt("expert_group_used_count")?.unwrap_or(1).max(1),
        normalize: m.bool_opt("expert_weights_norm")?.unwrap_or(true),
        scale: m.f32_opt("expert_weights_scale")?.unwrap_or(1.0),
    };
    let sizes = (
        n,
        m.usize("expert_used_count")?,
        m.usize("expert_feed_forward_length")?,
    );
    let shared = m
        .usize_opt("expert_shared_feed_forward_length")?
        .unwrap_or(0);
    Ok(Some(experts(sizes, routing, shared, Activation::Relu2)))
}

#[cfg(test)]
mod tests;
