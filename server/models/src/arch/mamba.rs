//! Mamba-2 (`Mamba2ForCausalLM`, llama.cpp's `mamba2`): every layer a
//! pre-normed Mamba-2 mixer and nothing else, no attention and no MLP.

use serde_json::Value as Json;

use super::{Family, HfExperts, Shape, pre_norms};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{FeedForward, InputSpec, LayerSpec, Mixer, ModelSpec, SsmSpec};

/// llama.cpp's names of a Mamba-2 layer's tensors, and the Hugging Face
/// names under a recurrent layer's prefix (`ssm_a_log` is ours: the
/// checkpoint's `A_log`, which llama.cpp stores as `ssm_a = -exp(A_log)`).
const SSM_TENSORS: [(&str, &str); 8] = [
    ("ssm_in", "mixer.in_proj"),
    ("ssm_conv1d", "mixer.conv1d"),
    ("ssm_dt.bias", "mixer.dt_bias"),
    ("ssm_a_log", "mixer.A_log"),
    ("ssm_d", "mixer.D"),
    ("ssm_norm", "mixer.norm"),
    ("ssm_out", "mixer.out_proj"),
    ("attn_norm", "norm"),
];

/// Mamba-2.
pub(super) static MAMBA2: Family = Family {
    name: "mamba2",
    gguf: &["mamba2"],
    hf: &["Mamba2ForCausalLM", "mamba2"],
    hf_tensors: &[
        ("token_embd.weight", "embeddings.weight"),
        ("output_norm.weight", "norm_f.weight"),
        SSM_TENSORS[0],
        SSM_TENSORS[1],
        SSM_TENSORS[2],
        SSM_TENSORS[3],
        SSM_TENSORS[4],
        SSM_TENSORS[5],
        SSM_TENSORS[6],
        SSM_TENSORS[7],
    ],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: false,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: mamba2,
    from_gguf: mamba2_gguf,
};

/// A recurrent model has no trained length: positions are bounded by the
/// server's `--max-model-len`, and this where a file names none.
pub(super) const RECURRENT_CONTEXT: usize = 1 << 18;

/// The scan's block length where a GGUF file (which does not record it)
/// or a config leaves it out: Mamba-2's own default.
const DEFAULT_CHUNK: usize = 256;

/// `time_step_limit`: two numbers, an infinite one possibly written as
/// transformers writes it (`{"__float__": "Infinity"}`) or as a string.
pub(super) fn dt_limit(c: &HfConfig) -> Result<(f32, f32)> {
    let Some(v) = c.get("time_step_limit") else {
        return Ok((0.0, f32::INFINITY));
    };
    let bad = || {
        Error::Config(format!(
            "config.json time_step_limit = {v} is not two numbers"
        ))
    };
    let num = |x: &Json| -> Option<f32> {
        match x {
            Json::Number(n) => n.as_f64().map(|f| f as f32),
            Json::String(s) => s.parse().ok(),
            Json::Object(o) => o.get("__float__")?.as_str()?.parse().ok(),
            _ => None,
        }
    };
    match v.as_array().map(Vec::as_slice) {
        Some([lo, hi]) => Ok((num(lo).ok_or_else(bad)?, num(hi).ok_or_else(bad)?)),
        _ => Err(bad()),
    }
}

/// The Mamba-2 mixer of a `config.json` (Mamba-2's key names).
pub(super) fn hf_ssm(c: &HfConfig, hidden: usize) -> Result<SsmSpec> {
    let heads = c.usize("num_heads")?;
    let head_dim = c.usize("head_dim")?;
    let expand = c.usize_or("expand", 2)?;
    if hidden.checked_mul(expand) != heads.checked_mul(head_dim) {
        return Err(Error::Config(format!(
            "config.json hidden_size {hidden} x expand {expand} is not num_heads {heads} x head_dim {head_dim}"
        )));
    }
    Ok(SsmSpec {
        heads,
        head_dim,
        state: c.usize("state_size")?,
        groups: c.usize_or("n_groups", 1)?,
        conv_kernel: c.usize_or("conv_kernel", 4)?,
        chunk: c.usize_or("chunk_size", DEFAULT_CHUNK)?,
        dt_limit: dt_limit(c)?,
        conv_bias: c.bool_or("use_conv_bias", true)?,
        proj_bias: c.bool_or("use_bias", false)?,
    })
}

/// A model of `layers` Mamba-2 layers of width `hidden`.
fn ssm_only(hidden: usize, layers: usize, vocab: usize, eps: f64, ssm: SsmSpec) -> ModelSpec {
    ModelSpec {
        family: "mamba2",
        hidden,
        intermediate: 0,
        heads: 0,
        kv_heads: 0,
        head_dim: 0,
        vocab,
        context: RECURRENT_CONTEXT,
        layers: (0..layers)
            .map(|_| LayerSpec {
                mixer: Mixer::Mamba2(ssm),
                ffn: FeedForward::None,
            })
            .collect(),
        norms: pre_norms(eps),
        ropes: Vec::new(),
        embed_scale: None,
        final_softcap: None,
        qkv_bias: false,
        residual_scale: None,
        logit_scale: None,
        input: InputSpec::default(),
        final_norm: true,
        ffn_widths: Vec::new(),
        per_layer_input: None,
        layer_out_scale: false,
    }
}

fn mamba2(c: &HfConfig) -> Result<ModelSpec> {
    let hidden = c.usize("hidden_size")?;
    let layers = super::checked_layers(c.usize("num_hidden_layers")?)?;
    let eps = c.f64_opt("layer_norm_epsilon")?.unwrap_or(1e-5);
    let ssm = hf_ssm(c, hidden)?;
    Ok(ssm_only(hidden, layers, c.usize("vocab_size")?, eps, ssm))
}

/// A hybrid's GGUF shape (llama.cpp's `granitehybrid`, `lfm2`): the
/// layer kinds from the per-layer KV head counts, 0 for a recurrent layer
/// (returned `true`), every attention layer with the same count; the
/// feed-forward `intermediate` as the family reads it.
pub(super) fn gguf_hybrid_shape(
    m: &Metadata<'_>,
    intermediate: usize,
) -> Result<(Shape, Vec<bool>)> {
    let layers = super::checked_layers(m.usize("block_count")?)?;
    let kv = m
        .per_layer_opt("attention.head_count_kv", layers)?
        .ok_or_else(|| {
            Error::Config(format!(
                "missing metadata {}.attention.head_count_kv",
                m.arch
            ))
        })?;
    let (hidden, heads) = (
        m.usize("embedding_length")?,
        m.usize("attention.head_count")?,
    );
    let kv_heads = kv.iter().copied().find(|&n| n > 0).unwrap_or(heads);
    if kv.iter().any(|&n| n != 0 && n != kv_heads) {
        return Err(Error::Config(format!(
            "{}.attention.head_count_kv {kv:?}: attention layers of different KV head counts",
            m.arch
        )));
    }
    let shape = Shape {
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads,
        head_dim: m
            .usize_opt("attention.key_length")?
            .unwrap_or(hidden / heads.max(1)),
        vocab: m.vocab()?,
        context: m.usize_opt("context_length")?.unwrap_or(RECURRENT_CONTEXT),
    }
    .checked()?;
    Ok((shape, kv.iter().map(|&n| n == 0).collect()))
}

/// The Mamba-2 mixer of GGUF metadata (llama.cpp's `ssm.*` keys; the time
/// step rank is the head count).
pub(super) fn gguf_ssm(m: &Metadata<'_>) -> Result<SsmSpec> {
    let inner = m.usize("ssm.inner_size")?;
    let heads = m.usize("ssm.time_step_rank")?;
    if heads == 0 || !inner.is_multiple_of(heads) {
        return Err(Error::Config(format!(
            "ssm.inner_size {inner} is not a multiple of {heads} heads"
        )));
    }
    Ok(SsmSpec {
        heads,
        head_dim: inner / heads,
        state: m.usize("ssm.state_size")?,
        groups: m.usize_opt("ssm.group_count")?.unwrap_or(1),
        conv_kernel: m.usize("ssm.conv_kernel")?,
        chunk: DEFAULT_CHUNK,
        dt_limit: (0.0, f32::INFINITY),
        conv_bias: true,
        proj_bias: false,
    })
}

fn mamba2_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let hidden = m.usize("embedding_length")?;
    let layers = super::checked_layers(m.usize("block_count")?)?;
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .map_or(1e-5, f64::from);
    let mut spec = ssm_only(hidden, layers, m.vocab()?, eps, gguf_ssm(m)?);
    if let Some(n) = m.usize_opt("context_length")?.filter(|&n| n > 0) {
        spec.context = n;
    }
    Ok(spec)
}
