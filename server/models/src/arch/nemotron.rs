//! Nemotron-H (`NemotronHForCausalLM`, llama.cpp's `nemotron_h`): Mamba-2,
//! attention and MLP as separate layers, each its one pre-norm and a
//! residual add, by `hybrid_override_pattern` (`M` Mamba-2, `*` attention,
//! `-` MLP); attention without position embeddings; the MLP plain, up then
//! squared ReLU then down. The mixture-of-experts layers (`E`, Nemotron 3)
//! are refused by name.

use serde_json::Value as Json;

use super::mamba::{dt_limit, gguf_hybrid_shape, gguf_ssm};
use super::{Family, HfExperts, Shape, pre_norms, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Activation, FeedForward, LayerSpec, Mixer, ModelSpec, SsmSpec};

/// Nemotron-H.
pub(super) static NEMOTRON_H: Family = Family {
    name: "nemotron_h",
    gguf: &["nemotron_h"],
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
    ],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    // The converter permutes q and k as Granite's does (no rotation reads
    // it, but the loader puts the rows back all the same).
    gguf_permuted_qk: true,
    from_hf: nemotron_h,
    from_gguf: nemotron_h_gguf,
};

/// One layer's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Mamba,
    Attention,
    Mlp,
}

/// The layer kinds of a pattern string (the Hub's `M*-`).
fn pattern_kinds(pattern: &str) -> Result<Vec<Kind>> {
    pattern
        .chars()
        .map(|c| match c {
            'M' => Ok(Kind::Mamba),
            '*' => Ok(Kind::Attention),
            '-' => Ok(Kind::Mlp),
            'E' => Err(Error::Config(
                "Nemotron-H's mixture-of-experts layers (`E`) are not supported yet".into(),
            )),
            other => Err(Error::Config(format!(
                "config.json hybrid_override_pattern has {other:?} (M, *, -)"
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
            "config.json layers_block_type has {t} (linear_attention, full_attention, mlp)"
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

/// The model of `shape` whose layer `i` is of `kinds[i]`.
fn spec(shape: Shape, kinds: &[Kind], eps: f64, ssm: SsmSpec, act: Activation) -> ModelSpec {
    let scale = shape.plain_scale();
    shape.spec("nemotron_h", pre_norms(eps), Vec::new(), |i| {
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
        }
    })
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
    let eps = c.f64_opt("layer_norm_epsilon")?.unwrap_or(1e-5);
    Ok(spec(shape, &kinds, eps, hf_ssm(c)?, act))
}

/// llama.cpp's `nemotron_h`: a layer with KV heads attends, one with a
/// feed-forward width is an MLP, one with neither is Mamba-2 (as its
/// loader reads them).
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
    let (shape, recurrent) = gguf_hybrid_shape(m, intermediate)?;
    let kinds: Vec<Kind> = (0..layers)
        .map(|i| match (recurrent[i], ff[i] > 0) {
            (_, true) => Kind::Mlp,
            (true, false) => Kind::Mamba,
            (false, false) => Kind::Attention,
        })
        .collect();
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .map_or(1e-5, f64::from);
    Ok(spec(shape, &kinds, eps, gguf_ssm(m)?, Activation::Relu2))
}

#[cfg(test)]
mod tests;
