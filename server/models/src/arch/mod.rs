//! The model families, as data: each one's names (GGUF architecture,
//! `config.json` architectures and model types), its tensor names, and how
//! its settings map to the one [`ModelSpec`] the shared decoder runs (as
//! llama.cpp's `llama-arch.cpp` does with tables). One small file a family
//! group; no family has a decoder of its own.

mod bert;
mod deepseek;
mod gemma;
mod gemma4;
mod glm;
mod gpt_oss;
mod granite;
mod lfm2;
mod llama;
mod llama4;
mod mamba;
mod ministral;
mod modern_bert;
mod nemotron;
mod nomic_bert;
mod olmo;
pub(crate) mod phi3;
mod qwen;
mod qwen35;
mod rope;
mod smollm3;

use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, FeedForward, InputSpec, KvLayout, LayerSpec, Mixer, ModelSpec,
    MoeSpec, Norms, RopeSpec, Routing,
};

/// How a checkpoint stores a layer's experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfExperts {
    /// One 2-D matrix per expert and projection, `{e}` in the tensor
    /// table's names (Mixtral, Qwen MoE).
    PerExpert,
    /// 3-D tensors `[experts, in, out]` applied as `x @ W`, gate and up
    /// interleaved column by column in one (gpt-oss's `gate_up_proj`).
    StackedInterleaved,
    /// 3-D tensors `[experts, out, in]` applied as `x @ W^T`, gate rows
    /// then up rows in one (Granite's `input_linear`).
    StackedHalves,
    /// 3-D tensors `[experts, in, out]` applied as `x @ W`, gate columns
    /// then up columns in one (Llama 4's `gate_up_proj`).
    StackedHalvesInOut,
}

/// One family: its names, its tensor names, its settings' mapping.
#[derive(Debug)]
pub struct Family {
    /// llama.cpp's architecture name (the one `inspect` reports).
    pub name: &'static str,
    /// `general.architecture` values read as this family.
    pub gguf: &'static [&'static str],
    /// `config.json` `architectures` entries and `model_type`s.
    pub hf: &'static [&'static str],
    /// Tensors whose Hugging Face name is not the common one: (GGUF name,
    /// Hugging Face name under the layer's prefix; for a whole GGUF name
    /// outside the layers, `token_embd.weight`, under the model's prefix).
    pub hf_tensors: &'static [(&'static str, &'static str)],
    /// Tensors whose GGUF name is not the common one: (common name, this
    /// family's), a layer tensor's part (gpt-oss's pre-MLP norm is
    /// `post_attention_norm`) or a whole name outside the layers (LFM2's
    /// final norm is `token_embd_norm.weight`).
    pub gguf_tensors: &'static [(&'static str, &'static str)],
    /// Where a checkpoint's layers live under the model's prefix, each
    /// `{hf_layers}.{i}.` (`layers`; BERT's `encoder.layer`).
    pub hf_layers: &'static str,
    /// How its checkpoints store a layer's experts.
    pub hf_experts: HfExperts,
    /// `tie_word_embeddings` where `config.json` leaves it out (transformers'
    /// default for the family).
    pub tied_default: bool,
    /// llama.cpp's converter interleaved each head's q/k rows for its RoPE
    /// (the Llama layout); the loader puts them back.
    pub gguf_permuted_qk: bool,
    /// Its checkpoints' RoPE rotates adjacent pairs of each head (Llama 4's
    /// complex RoPE): the loader regroups q/k rows into halves, as it
    /// does a permuted GGUF's, for the half-split RoPE.
    pub hf_rope_pairs: bool,
    /// The description from `config.json`.
    pub from_hf: fn(&HfConfig) -> Result<ModelSpec>,
    /// The description from GGUF metadata (tensors the loader reads in).
    pub from_gguf: fn(&Metadata<'_>) -> Result<ModelSpec>,
}

/// Every family, in lookup order.
const FAMILIES: &[&Family] = &[
    &llama::LLAMA,
    &llama::MISTRAL,
    &llama::MIXTRAL,
    &qwen::QWEN2,
    &qwen::QWEN3,
    &qwen::QWEN2MOE,
    &qwen::QWEN3MOE,
    &gemma::GEMMA2,
    &gemma::GEMMA3,
    &gemma4::GEMMA4,
    &phi3::PHI3,
    &gpt_oss::GPT_OSS,
    &mamba::MAMBA2,
    &granite::GRANITE_HYBRID,
    &qwen35::QWEN35,
    &qwen35::QWEN3NEXT,
    &qwen35::QWEN35MOE,
    &smollm3::SMOLLM3,
    &glm::GLM4_MOE,
    &deepseek::DEEPSEEK2,
    &olmo::OLMO2,
    &ministral::MINISTRAL3,
    &llama4::LLAMA4,
    &lfm2::LFM2,
    &nemotron::NEMOTRON_H,
    &bert::BERT,
    &bert::XLM_ROBERTA,
    &nomic_bert::NOMIC_BERT,
    &modern_bert::MODERN_BERT,
];

/// Every family's name, in lookup order: what an unknown architecture's
/// error lists, read off the table so the two cannot differ.
pub const SUPPORTED: [&str; FAMILIES.len()] = {
    let mut names = [""; FAMILIES.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = FAMILIES[i].name;
        i += 1;
    }
    names
};

/// The error for an architecture no family serves.
fn unknown(name: &str) -> Error {
    Error::UnknownArchitecture {
        name: name.to_string(),
        supported: SUPPORTED.join(", "),
    }
}

/// Layer tensors named alike by the Llama-layout families: (GGUF name,
/// Hugging Face name under `model.layers.{i}.`).
const COMMON_TENSORS: [(&str, &str); 12] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_qkv", "self_attn.qkv_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

impl Family {
    /// The family of a GGUF `general.architecture`.
    pub fn by_gguf(name: &str) -> Result<&'static Family> {
        FAMILIES
            .iter()
            .copied()
            .find(|f| f.gguf.contains(&name))
            .ok_or_else(|| unknown(name))
    }

    /// The family a `config.json` names (its architectures, then model types).
    pub fn by_hf(c: &HfConfig) -> Result<&'static Family> {
        let names = c.family_names();
        names
            .iter()
            .find_map(|n| {
                FAMILIES
                    .iter()
                    .copied()
                    .find(|f| f.hf.contains(&n.as_str()))
            })
            .ok_or_else(|| match names.first() {
                Some(n) => unknown(n),
                None => Error::Config("config.json has no architectures or model_type".into()),
            })
    }

    /// The Hugging Face name of a tensor outside the layers (its whole GGUF
    /// name), where the family names it otherwise than the common one.
    pub fn hf_global(&self, gguf: &str) -> Option<&'static str> {
        self.hf_tensors
            .iter()
            .find(|(g, _)| *g == gguf)
            .map(|(_, h)| *h)
    }

    /// The Hugging Face name of the layer tensor part `gguf` (`attn_q`),
    /// without the layer prefix.
    pub fn hf_tensor(&self, gguf: &str) -> Option<&'static str> {
        self.hf_tensors
            .iter()
            .chain(&COMMON_TENSORS)
            .find(|(g, _)| *g == gguf)
            .map(|(_, h)| *h)
    }
}

/// The description of a `config.json` model.
pub fn from_hf(text: &str) -> Result<(&'static Family, ModelSpec)> {
    let c = HfConfig::parse(text)?;
    let family = Family::by_hf(&c)?;
    Ok((family, (family.from_hf)(&c)?.finish()?))
}

/// The sizes every family has.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context: usize,
}

/// More decoder layers than any model has (Llama 3.1 405B has 126): a count
/// past it is a corrupt file's, refused before anything is sized by it.
const MAX_LAYERS: usize = 4096;

/// `layers`, unless past any model's count.
pub(crate) fn checked_layers(layers: usize) -> Result<usize> {
    if layers > MAX_LAYERS {
        return Err(Error::Config(format!(
            "{layers} layers is past any model's ({MAX_LAYERS})"
        )));
    }
    Ok(layers)
}

impl Shape {
    fn checked(self) -> Result<Self> {
        checked_layers(self.layers)?;
        Ok(self)
    }

    /// From `config.json`, with the family's defaults for absent keys.
    pub(crate) fn hf(c: &HfConfig, defaults: &[(&str, usize)]) -> Result<Self> {
        let get = |key: &str| match defaults.iter().find(|(k, _)| *k == key) {
            Some(&(_, d)) => c.usize_or(key, d),
            None => c.usize(key),
        };
        let (hidden, heads) = (get("hidden_size")?, get("num_attention_heads")?);
        Shape {
            hidden,
            intermediate: get("intermediate_size")?,
            layers: get("num_hidden_layers")?,
            heads,
            kv_heads: match c.usize_opt("num_key_value_heads")? {
                Some(n) => n,
                None => get("num_key_value_heads").unwrap_or(heads),
            },
            head_dim: match c.usize_opt("head_dim")? {
                Some(d) => d,
                None => get("head_dim").unwrap_or(hidden / heads.max(1)),
            },
            vocab: get("vocab_size")?,
            context: get("max_position_embeddings")?,
        }
        .checked()
    }

    /// From GGUF metadata.
    pub(crate) fn gguf(m: &Metadata<'_>) -> Result<Self> {
        let hidden = m.usize("embedding_length")?;
        let heads = m.usize("attention.head_count")?;
        let head_dim = match m.usize_opt("attention.key_length")? {
            Some(d) => d,
            None => hidden / heads.max(1),
        };
        Shape {
            hidden,
            intermediate: m.usize("feed_forward_length")?,
            layers: m.usize("block_count")?,
            heads,
            kv_heads: m.usize_opt("attention.head_count_kv")?.unwrap_or(heads),
            head_dim,
            vocab: m.vocab()?,
            context: m.usize("context_length")?,
        }
        .checked()
    }

    /// A model of this shape whose layer `i` is `layer(i)`.
    pub(crate) fn spec(
        &self,
        family: &'static str,
        norms: Norms,
        ropes: Vec<RopeSpec>,
        layer: impl Fn(usize) -> LayerSpec,
    ) -> ModelSpec {
        ModelSpec {
            family,
            hidden: self.hidden,
            intermediate: self.intermediate,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            vocab: self.vocab,
            context: self.context,
            // Not `with_capacity`: the count is the file's word.
            layers: (0..self.layers).map(layer).collect(),
            norms,
            ropes,
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

    /// `1/sqrt(head_dim)`, the usual attention scale.
    pub(crate) fn plain_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// Pre-norm RMSNorms only (every family but Gemma).
pub(crate) fn pre_norms(eps: f64) -> Norms {
    Norms {
        eps,
        layer_norm: false,
        after_residual: false,
        offset: 0.0,
        pre: true,
        post_attention: false,
        post_ffn: false,
    }
}

/// A SwiGLU layer attending with `window` and RoPE 0.
pub(crate) fn swiglu_layer(window: Option<usize>, scale: f32, qk_norm: bool) -> LayerSpec {
    LayerSpec {
        mixer: Mixer::Attention(AttentionSpec {
            window,
            chunk: None,
            rope: 0,
            scale,
            softcap: None,
            qk_norm,
            qk_norm_whole: false,
            qk_norm_weightless: false,
            sinks: false,
            nope: false,
            gated: false,
            temperature: None,
            kv: KvLayout::default(),
        }),
        ffn: FeedForward::Gated(Activation::Silu),
    }
}

/// Which layers slide, for a model with `layers` layers and a window:
/// `layer_types` when the config has it, else `default(i)`. A list of the
/// wrong length is an error.
pub(crate) fn sliding_pattern(
    c: &HfConfig,
    layers: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>> {
    match c.sliding_layers()? {
        Some(list) if list.len() != layers => Err(Error::Config(format!(
            "config.json layer_types has {} entries for {layers} layers",
            list.len()
        ))),
        Some(list) => Ok(list),
        None => Ok((0..layers).map(default).collect()),
    }
}

#[cfg(test)]
mod tests;

/// The experts a GGUF file's metadata describes, if any: `expert_count`,
/// `expert_used_count`, each `expert_feed_forward_length` wide (else
/// `feed_forward_length`), a shared expert where
/// `expert_shared_feed_forward_length` says; `expert_weights_norm`, where
/// given, overrides the family's renormalisation.
pub(crate) fn gguf_moe(
    m: &Metadata<'_>,
    shape: &Shape,
    activation: Activation,
    routing: Routing,
    biases: bool,
) -> Result<Option<MoeSpec>> {
    let Some(experts) = m.usize_opt("expert_count")?.filter(|&n| n > 0) else {
        return Ok(None);
    };
    let routing = match (routing, m.bool_opt("expert_weights_norm")?) {
        (Routing::SoftmaxTopK { .. }, Some(normalize)) => Routing::SoftmaxTopK { normalize },
        (r, _) => r,
    };
    Ok(Some(MoeSpec {
        experts,
        top_k: m.usize("expert_used_count")?,
        intermediate: m
            .usize_opt("expert_feed_forward_length")?
            .unwrap_or(shape.intermediate),
        activation,
        routing,
        biases,
        shared: m
            .usize_opt("expert_shared_feed_forward_length")?
            .filter(|&n| n > 0),
        shared_gated: true,
        gated: true,
    }))
}

/// `spec`'s layers with `moe`'s feed-forward where `is_moe(i)`.
pub(crate) fn with_experts(
    spec: &mut ModelSpec,
    moe: Option<MoeSpec>,
    is_moe: impl Fn(usize) -> bool,
) {
    if let Some(m) = moe {
        for (i, l) in spec.layers.iter_mut().enumerate() {
            if is_moe(i) {
                l.ffn = FeedForward::Moe(m);
            }
        }
    }
}
