//! Granite 4.0-H (`GraniteMoeHybridForCausalLM`, llama.cpp's
//! `granitehybrid`): Mamba-2 and attention layers by `layer_types`, a
//! shared SwiGLU MLP after either mixer, attention without position
//! embeddings (NoPE) unless `position_embedding_type` is `rope`, and
//! Granite's multipliers (embeddings, residuals, attention scale, logits).
//! The dense-MLP variant (Granite-4.0-H-Micro's kind); its mixture of
//! experts is refused by name.

use super::mamba::dt_limit;
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, pre_norms, swiglu_layer};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Activation, FeedForward, LayerSpec, Mixer, ModelSpec, SsmSpec};

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
    ],
    gguf_tensors: &[],
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
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
    let Some(v) = c.get("layer_types") else {
        return Err(Error::Config("config.json has no layer_types".into()));
    };
    let bad = || {
        Error::Config(format!(
            "config.json layer_types = {v} is not mamba/attention"
        ))
    };
    let list = v.as_array().ok_or_else(bad)?;
    if list.len() != layers {
        return Err(Error::Config(format!(
            "config.json layer_types has {} entries for {layers} layers",
            list.len()
        )));
    }
    list.iter()
        .map(|t| match t.as_str() {
            // The Hub's spelling, and transformers 5's when it saves.
            Some("mamba" | "linear_attention") => Ok(true),
            Some("attention" | "full_attention") => Ok(false),
            _ => Err(bad()),
        })
        .collect()
}

fn granite(c: &HfConfig) -> Result<ModelSpec> {
    if c.usize_or("num_local_experts", 0)? > 0 {
        return Err(Error::Config(
            "Granite 4.0-H with a mixture of experts (num_local_experts > 0) is not \
             supported yet; its dense-MLP variants (H-Micro) are"
                .into(),
        ));
    }
    let mut shape = Shape::hf(c, &[])?;
    shape.intermediate = c.usize("shared_intermediate_size")?;
    let rope = hf_rope(
        c,
        None,
        ("rope_theta", Some("rope_scaling")),
        10_000.0,
        shape.head_dim,
    )?;
    let nope = c.str_opt("position_embedding_type") != Some("rope");
    let scale = c.f64_opt("attention_multiplier")?.unwrap_or(1.0) as f32;
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let kinds = mamba_layers(c, shape.layers)?;
    let ssm = ssm(c, shape.hidden)?;
    let mut spec = shape.spec(
        "granitehybrid",
        pre_norms(eps),
        vec![rope],
        |i| match kinds[i] {
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
    let multiplier = |key: &str| -> Result<Option<f32>> {
        Ok(c.f64_opt(key)?.map(|m| m as f32).filter(|&m| m != 1.0))
    };
    spec.embed_scale = multiplier("embedding_multiplier")?;
    spec.residual_scale = multiplier("residual_multiplier")?;
    spec.logit_scale = multiplier("logits_scaling")?.map(|s| 1.0 / s);
    spec.qkv_bias = c.bool_or("attention_bias", false)?;
    Ok(spec)
}

/// Granite 4.0-H's GGUF is not read yet (its safetensors are).
fn granite_gguf(_: &Metadata<'_>) -> Result<ModelSpec> {
    Err(Error::Config(
        "a granitehybrid GGUF is not supported yet: serve its safetensors".into(),
    ))
}
