//! The shape of a Llama-family decoder, from GGUF metadata or `config.json`.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use ferrox_plan::KvDtype;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The architectures this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM, TinyLlama, ...
    Llama,
    /// Mistral (Llama layout; its sliding window on every layer).
    Mistral,
    /// Qwen2 / Qwen2.5 (biases on q, k, v).
    Qwen2,
}

impl Arch {
    /// Parses a GGUF `general.architecture` or an HF `architectures` entry.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "llama" | "LlamaForCausalLM" => Ok(Arch::Llama),
            "mistral" | "MistralForCausalLM" => Ok(Arch::Mistral),
            "qwen2" | "Qwen2ForCausalLM" => Ok(Arch::Qwen2),
            other => Err(Error::UnknownArchitecture(other.to_string())),
        }
    }

    /// The GGUF name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
        }
    }

    /// Whether q, k and v projections carry biases.
    pub fn qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2)
    }
}

/// The most decoder layers a model may claim (the largest have a few hundred).
pub const MAX_LAYERS: usize = 1 << 16;

/// Everything the decoder needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Residual width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab: usize,
    /// Trained context length.
    pub context: usize,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// Per-frequency divisors of RoPE's inverse frequencies (Llama 3.1's
    /// long-context scaling), `head_dim / 2` of them; `None` for plain RoPE.
    pub rope_freq_factors: Option<Vec<f32>>,
    /// Mistral's sliding window, applied to every layer (`None`: full
    /// attention). Provisional: the families' layer description replaces it.
    pub sliding_window: Option<usize>,
}

impl ModelConfig {
    /// Checks the numbers are usable, so the forward pass cannot index out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if [
            self.hidden,
            self.intermediate,
            self.layers,
            self.heads,
            self.kv_heads,
        ]
        .contains(&0)
            || self.head_dim == 0
            || self.vocab == 0
            || self.context == 0
        {
            return bad(format!("zero dimension in {self:?}"));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "heads {} not a multiple of kv heads {}",
                self.heads, self.kv_heads
            ));
        }
        // Per-layer tables (KV groups, `inspect`'s layer kinds) are made from
        // this count before any weight is read: bound it.
        if self.layers > MAX_LAYERS {
            return bad(format!(
                "{} layers, more than the {MAX_LAYERS} any model has",
                self.layers
            ));
        }
        if self.sliding_window == Some(0) {
            return bad("sliding_window is 0".into());
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dim {} is odd", self.head_dim));
        }
        Ok(())
    }

    /// Width of one token's K (or V) across heads.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// From GGUF metadata.
    pub fn from_gguf(md: &HashMap<String, Value>) -> Result<Self> {
        let arch_name = md_string(md, "general.architecture")?;
        let arch = Arch::parse(&arch_name)?;
        let p = |key: &str| format!("{arch_name}.{key}");
        let hidden = md_usize(md, &p("embedding_length"))?;
        let heads = md_usize(md, &p("attention.head_count"))?;
        let kv_heads = md_usize(md, &p("attention.head_count_kv")).unwrap_or(heads);
        let head_dim = md_usize(md, &p("attention.key_length"))
            .or_else(|_| md_usize(md, &p("rope.dimension_count")))
            .unwrap_or(hidden / heads.max(1));
        let vocab = match md_usize(md, &p("vocab_size")) {
            Ok(v) => v,
            Err(_) => match md.get("tokenizer.ggml.tokens") {
                Some(Value::Array(a)) => a.len(),
                _ => {
                    return Err(Error::Config(
                        "no vocab_size and no tokenizer.ggml.tokens".into(),
                    ));
                }
            },
        };
        let config = ModelConfig {
            arch,
            hidden,
            intermediate: md_usize(md, &p("feed_forward_length"))?,
            layers: md_usize(md, &p("block_count"))?,
            heads,
            kv_heads,
            head_dim,
            vocab,
            context: md_usize(md, &p("context_length"))?,
            rope_theta: md_f32(md, &p("rope.freq_base")).unwrap_or(10_000.0),
            rms_eps: md_f32(md, &p("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5) as f64,
            // In GGUF these are a tensor (`rope_freqs.weight`): the source reads it.
            rope_freq_factors: None,
            sliding_window: match arch {
                Arch::Mistral => md_usize(md, &p("attention.sliding_window")).ok(),
                _ => None,
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let hf = HfConfig::parse(text)?;
        let arch_name = hf
            .architectures
            .first()
            .cloned()
            .or(hf.model_type.clone())
            .ok_or_else(|| Error::Config("config.json has no architectures".into()))?;
        let heads = hf.num_attention_heads;
        let config = ModelConfig {
            arch: Arch::parse(&arch_name).or_else(|e| match hf.model_type.as_deref() {
                Some(t) => Arch::parse(t),
                None => Err(e),
            })?,
            hidden: hf.hidden_size,
            intermediate: hf.intermediate_size,
            layers: hf.num_hidden_layers,
            heads,
            kv_heads: hf.num_key_value_heads.unwrap_or(heads),
            head_dim: hf.head_dim.unwrap_or(hf.hidden_size / heads.max(1)),
            vocab: hf.vocab_size,
            context: hf.max_position_embeddings,
            rope_theta: hf.rope_theta.unwrap_or(10_000.0),
            rms_eps: hf.rms_norm_eps.unwrap_or(1e-5),
            rope_freq_factors: None,
            sliding_window: None,
        };
        let mut config = config;
        if config.arch == Arch::Mistral {
            config.sliding_window = hf.sliding_window;
        }
        if let Some(scaling) = &hf.rope_scaling {
            config.rope_freq_factors = rope_scaling_factors(&config, scaling)?;
        }
        config.validate()?;
        Ok(config)
    }
}

/// The fields of `config.json` we read.
#[derive(Debug, Deserialize)]
pub(crate) struct HfConfig {
    #[serde(default)]
    architectures: Vec<String>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: usize,
    rope_theta: Option<f32>,
    rms_norm_eps: Option<f64>,
    #[serde(default)]
    pub(crate) tie_word_embeddings: bool,
    rope_scaling: Option<RopeScaling>,
    /// Mistral's window (`null` in configs without one).
    sliding_window: Option<usize>,
    /// The dtype the weights were saved in (`dtype` in newer transformers).
    #[serde(alias = "dtype")]
    torch_dtype: Option<String>,
}

impl HfConfig {
    /// The half type a GPU computes this model in: bf16 for bf16 weights,
    /// else f16 (vLLM's choice for f16 and f32 checkpoints too).
    pub(crate) fn half_dtype(&self) -> KvDtype {
        match self.torch_dtype.as_deref() {
            Some("bfloat16" | "bf16") => KvDtype::Bf16,
            _ => KvDtype::F16,
        }
    }
}

/// `rope_scaling` of `config.json`; only Llama 3's kind changes the frequencies.
#[derive(Debug, Deserialize)]
struct RopeScaling {
    #[serde(alias = "type")]
    rope_type: String,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<f32>,
}

/// Llama 3's per-frequency divisors: high frequencies kept, low ones divided
/// by `factor`, a smooth blend between (as Hugging Face computes them).
fn rope_scaling_factors(c: &ModelConfig, s: &RopeScaling) -> Result<Option<Vec<f32>>> {
    if s.rope_type != "llama3" {
        return match s.rope_type.as_str() {
            "default" => Ok(None),
            other => Err(Error::Config(format!(
                "rope_scaling type {other:?} is not supported"
            ))),
        };
    }
    let missing = || {
        Error::Config("rope_scaling llama3 needs factor, low/high_freq_factor and original_max_position_embeddings".into())
    };
    let factor = s.factor.ok_or_else(missing)?;
    let (low, high) = (
        s.low_freq_factor.ok_or_else(missing)?,
        s.high_freq_factor.ok_or_else(missing)?,
    );
    let old = s.original_max_position_embeddings.ok_or_else(missing)?;
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    let half = c.head_dim / 2;
    let factors = (0..half)
        .map(|i| {
            let inv_freq = 1.0 / c.rope_theta.powf(2.0 * i as f32 / c.head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / inv_freq;
            let scaled = if wavelen < high_wavelen {
                inv_freq
            } else if wavelen > low_wavelen {
                inv_freq / factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
            };
            inv_freq / scaled
        })
        .collect();
    Ok(Some(factors))
}

impl HfConfig {
    pub(crate) fn parse(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::Config(format!("config.json: {e}")))
    }
}

pub(crate) fn md_string(md: &HashMap<String, Value>, key: &str) -> Result<String> {
    match md.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(Error::Config(format!(
            "{key} is {:?}, not a string",
            v.value_type()
        ))),
        None => Err(Error::Config(format!("missing metadata {key}"))),
    }
}

pub(crate) fn md_usize(md: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = md
        .get(key)
        .ok_or_else(|| Error::Config(format!("missing metadata {key}")))?;
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I8(x) if *x >= 0 => *x as u64,
        Value::I16(x) if *x >= 0 => *x as u64,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        other => {
            return Err(Error::Config(format!(
                "{key} is {other:?}, not a non-negative integer"
            )));
        }
    };
    usize::try_from(n).map_err(|_| Error::Config(format!("{key} = {n} is too large")))
}

pub(crate) fn md_f32(md: &HashMap<String, Value>, key: &str) -> Result<f32> {
    match md.get(key) {
        Some(Value::F32(x)) => Ok(*x),
        Some(Value::F64(x)) => Ok(*x as f32),
        Some(v) => Err(Error::Config(format!(
            "{key} is {:?}, not a float",
            v.value_type()
        ))),
        None => Err(Error::Config(format!("missing metadata {key}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_config_parses_llama_and_qwen2() {
        let llama = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,
            "max_position_embeddings":256,"rope_theta":10000.0,"rms_norm_eps":1e-5}"#;
        let c = ModelConfig::from_hf_json(llama).unwrap();
        assert_eq!((c.arch, c.head_dim, c.kv_dim()), (Arch::Llama, 16, 32));
        let qwen = llama.replace("LlamaForCausalLM", "Qwen2ForCausalLM");
        assert_eq!(ModelConfig::from_hf_json(&qwen).unwrap().arch, Arch::Qwen2);
    }

    #[test]
    fn llama3_rope_scaling_keeps_high_and_divides_low_frequencies() {
        let text = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":4096,"intermediate_size":14336,
            "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
            "max_position_embeddings":131072,"rope_theta":500000.0,
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192,"rope_type":"llama3"}}"#;
        let c = ModelConfig::from_hf_json(text).unwrap();
        let f = c.rope_freq_factors.unwrap();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0, "the highest frequency is kept");
        assert!(
            (f[63] - 8.0).abs() < 1e-4,
            "the lowest is divided by the factor: {}",
            f[63]
        );
        assert!(f.windows(2).all(|w| w[0] <= w[1] + 1e-6), "monotone: {f:?}");
        assert!(
            f.iter().any(|&x| x > 1.01 && x < 7.99),
            "a smooth band between"
        );
        let plain = text.replace("\"llama3\"", "\"default\"");
        assert_eq!(
            ModelConfig::from_hf_json(&plain).unwrap().rope_freq_factors,
            None
        );
        let yarn = text.replace("\"llama3\"", "\"yarn\"");
        assert!(
            ModelConfig::from_hf_json(&yarn)
                .unwrap_err()
                .to_string()
                .contains("yarn")
        );
    }

    #[test]
    fn unknown_architecture_and_bad_shapes_are_errors() {
        let base = r#"{"architectures":["GPTNeoXForCausalLM"],"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":256}"#;
        let err = ModelConfig::from_hf_json(base).unwrap_err().to_string();
        assert!(err.contains("GPTNeoXForCausalLM"), "{err}");
        let bad = base
            .replace("GPTNeoXForCausalLM", "LlamaForCausalLM")
            .replace(
                "\"num_attention_heads\":4",
                "\"num_attention_heads\":4,\"num_key_value_heads\":3",
            );
        let err = ModelConfig::from_hf_json(&bad).unwrap_err().to_string();
        assert!(err.contains("kv heads"), "{err}");
        assert!(ModelConfig::from_hf_json("{").is_err());
    }
}
