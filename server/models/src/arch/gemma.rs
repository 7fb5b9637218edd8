//! Gemma 2 and Gemma 3 (text; and the language model of a multimodal
//! `gemma3` checkpoint): GeGLU, RMSNorms before and after attention and
//! MLP with `(1 + w)` weights, embeddings scaled by `sqrt(hidden)`, the
//! query scaled by `query_pre_attn_scalar`, sliding layers in a pattern.
//! Gemma 2 soft-caps attention scores and logits; Gemma 3 has q/k norms and
//! a RoPE of its own for local layers. EmbeddingGemma is Gemma 3 with
//! bidirectional attention (`use_bidirectional_attention`; llama.cpp's
//! `gemma-embedding`): its layers are the encoder kind, a sliding layer
//! seeing half its window each way.

use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, sliding_pattern};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, EncoderSpec, FeedForward, KvLayout, LayerSpec, Mixer, ModelSpec,
    Norms, RopeScaling, RopeSpec,
};

/// Gemma's layer tensors, where they differ from the Llama layout.
const TENSORS: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

/// Gemma 2.
pub(super) static GEMMA2: Family = Family {
    name: "gemma2",
    gguf: &["gemma2"],
    hf: &["Gemma2ForCausalLM", "gemma2"],
    hf_tensors: TENSORS,
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| hf(c, &G2),
    from_gguf: |m| gguf(m, &G2),
};

/// Gemma 3 (text).
pub(super) static GEMMA3: Family = Family {
    name: "gemma3",
    gguf: &["gemma3", EMBEDDING_GGUF],
    hf: &[
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "gemma3_text",
        "gemma3",
    ],
    hf_tensors: TENSORS,
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: |c| hf(c, &G3),
    from_gguf: |m| gguf(m, &G3),
};

/// llama.cpp's architecture of EmbeddingGemma: Gemma 3, bidirectional.
const EMBEDDING_GGUF: &str = "gemma-embedding";

/// What tells the two generations apart.
struct Generation {
    name: &'static str,
    /// One layer in `pattern` is full attention, the last of each run.
    pattern: usize,
    /// q/k RMSNorm, and a RoPE of their own for local layers.
    qk_norm: bool,
    /// RoPE bases where the config names none: (global, local).
    thetas: (f32, f32),
    /// llama.cpp's layer count of the 27B, whose query scale is
    /// `hidden / heads` (GGUF carries no `query_pre_attn_scalar`).
    layers_27b: usize,
    /// Defaults of keys a config may leave out (transformers' config class).
    defaults: &'static [(&'static str, usize)],
    /// Default attention and final soft-caps.
    caps: (Option<f64>, Option<f64>),
    /// The window llama.cpp assumes where a GGUF names none.
    gguf_window: Option<usize>,
}

const G2: Generation = Generation {
    name: "gemma2",
    pattern: 2,
    qk_norm: false,
    thetas: (10_000.0, 10_000.0),
    layers_27b: 46,
    defaults: &[
        ("head_dim", 256),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 4),
        ("max_position_embeddings", 8192),
        ("vocab_size", 256_000),
    ],
    caps: (Some(50.0), Some(30.0)),
    gguf_window: Some(4096),
};

const G3: Generation = Generation {
    name: "gemma3",
    pattern: 6,
    qk_norm: true,
    thetas: (1_000_000.0, 10_000.0),
    layers_27b: 62,
    defaults: &[
        ("head_dim", 256),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 4),
        ("max_position_embeddings", 131_072),
        ("vocab_size", 262_208),
    ],
    caps: (None, None),
    gguf_window: None,
};

/// Index of the local (sliding) layers' RoPE in [`ModelSpec::ropes`].
const LOCAL: usize = 1;

/// How a layer's tokens see each other.
#[derive(Clone, Copy)]
struct Sight {
    /// The config's sliding window, on a sliding layer.
    window: Option<usize>,
    /// Every token sees both ways (EmbeddingGemma): an encoder layer.
    bidirectional: bool,
}

fn layer(sight: Sight, scale: f32, softcap: Option<f32>, qk_norm: bool) -> LayerSpec {
    let attention = AttentionSpec {
        window: sight.window,
        chunk: None,
        rope: if sight.window.is_some() { LOCAL } else { 0 },
        scale,
        softcap,
        qk_norm,
        qk_norm_whole: false,
        qk_norm_weightless: false,
        sinks: false,
        nope: false,
        gated: false,
        temperature: None,
        kv: KvLayout::default(),
    };
    let mixer = match sight.bidirectional {
        // transformers halves a bidirectional config's window (and
        // llama.cpp's symmetric one sees `window / 2` each way): a key
        // within `window / 2` positions of the query, either side, is seen,
        // which an encoder window `w` says as distances below `w`.
        true => Mixer::Encoder(EncoderSpec {
            attention: AttentionSpec {
                window: sight.window.map(|w| w / 2 + 1),
                ..attention
            },
            causal: false,
        }),
        false => Mixer::Attention(attention),
    };
    LayerSpec {
        mixer,
        ffn: FeedForward::Gated(Activation::GeluTanh),
    }
}

fn norms(eps: f64, offset: f32) -> Norms {
    Norms {
        eps,
        layer_norm: false,
        after_residual: false,
        offset,
        pre: true,
        post_attention: true,
        post_ffn: true,
    }
}

/// The finishing touches both formats share.
fn finish(mut spec: ModelSpec, final_softcap: Option<f32>) -> ModelSpec {
    spec.embed_scale = Some((spec.hidden as f64).sqrt() as f32);
    spec.final_softcap = final_softcap;
    spec
}

fn hf(c: &HfConfig, g: &Generation) -> Result<ModelSpec> {
    let shape = Shape::hf(c, g.defaults)?;
    // transformers' defaults where a key is absent; `null` is no cap.
    let cap = |key: &str, default: Option<f64>| -> Result<Option<f32>> {
        let v = if c.has(key) { c.f64_opt(key)? } else { default };
        Ok(v.map(|x| x as f32))
    };
    let attn_cap = cap("attn_logit_softcapping", g.caps.0)?;
    let final_cap = cap("final_logit_softcapping", g.caps.1)?;
    let window = c.usize_or("sliding_window", 4096)?;
    let scalar = c.f64_opt("query_pre_attn_scalar")?.unwrap_or(256.0);
    let scale = scalar.powf(-0.5) as f32;
    let pattern = c.usize_or("sliding_window_pattern", g.pattern)?.max(1);
    let slides = sliding_pattern(c, shape.layers, |i| (i + 1) % pattern != 0)?;
    let (global_theta, local_theta) = g.thetas;
    let hd = shape.head_dim;
    let global = hf_rope(
        c,
        Some("full_attention"),
        ("rope_theta", Some("rope_scaling")),
        global_theta,
        hd,
    )?;
    let local = match g.qk_norm {
        true => hf_rope(
            c,
            Some("sliding_attention"),
            ("rope_local_base_freq", None),
            local_theta,
            hd,
        )?,
        false => global.clone(),
    };
    let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
    let bidirectional = c.bool_or("use_bidirectional_attention", false)?;
    let spec = shape.spec(g.name, norms(eps, 1.0), vec![global, local], |i| {
        let window = slides[i].then_some(window);
        let sight = Sight {
            window,
            bidirectional,
        };
        layer(sight, scale, attn_cap, g.qk_norm)
    });
    Ok(finish(spec, final_cap))
}

fn gguf(m: &Metadata<'_>, g: &Generation) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let window = m
        .usize_opt("attention.sliding_window")?
        .or(g.gguf_window)
        .filter(|&w| w > 0);
    let slides = match m.bools_opt("attention.sliding_window_pattern")? {
        Some(list) if list.len() != shape.layers => {
            return Err(Error::Config(format!(
                "{} sliding-window pattern entries for {} layers",
                list.len(),
                shape.layers
            )));
        }
        Some(list) => list,
        None => {
            let n = m
                .usize_opt("attention.sliding_window_pattern")?
                .unwrap_or(g.pattern)
                .max(1);
            (0..shape.layers).map(|i| i % n < n - 1).collect()
        }
    };
    let scalar = match shape.layers == g.layers_27b {
        true => shape.hidden / shape.heads.max(1),
        false => shape.head_dim,
    };
    let scale = (scalar as f64).powf(-0.5) as f32;
    let rotary_dim = m
        .usize_opt("rope.dimension_count")?
        .unwrap_or(shape.head_dim);
    let scaling = match m.str_opt("rope.scaling.type")?.as_deref() {
        Some("linear") => match m.f32_opt("rope.scaling.factor")? {
            Some(f) if f > 0.0 && f != 1.0 => RopeScaling::Linear(f),
            _ => RopeScaling::None,
        },
        None | Some("none") => RopeScaling::None,
        Some(other) => {
            return Err(Error::Config(format!("{} rope scaling {other:?}", g.name)));
        }
    };
    let global = RopeSpec {
        theta: m.f32_opt("rope.freq_base")?.unwrap_or(10_000.0),
        rotary_dim,
        scaling,
    };
    let local = RopeSpec {
        theta: m.f32_opt("rope.freq_base_swa")?.unwrap_or(10_000.0),
        rotary_dim,
        scaling: RopeScaling::None,
    };
    let local = if g.qk_norm { local } else { global.clone() };
    let attn_cap = m.f32_opt("attn_logit_softcapping")?.filter(|&c| c > 0.0);
    let final_cap = m.f32_opt("final_logit_softcapping")?.filter(|&c| c > 0.0);
    let eps = m
        .f32_opt("attention.layer_norm_rms_epsilon")?
        .unwrap_or(1e-6);
    let bidirectional = m.arch == EMBEDDING_GGUF;
    // llama.cpp's converter already added Gemma's 1 to every norm weight.
    let spec = shape.spec(
        g.name,
        norms(f64::from(eps), 0.0),
        vec![global, local],
        |i| {
            let sight = Sight {
                window: window.filter(|_| slides[i]),
                bidirectional,
            };
            layer(sight, scale, attn_cap, g.qk_norm)
        },
    );
    Ok(finish(spec, final_cap))
}
