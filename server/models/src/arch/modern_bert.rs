//! ModernBERT (gte-modernbert, ModernBERT-base/large): a pre-LN encoder
//! with bias-free LayerNorms (the embeddings', each block's, a final one),
//! q/k/v fused in `Wqkv`, a GeGLU MLP with gate and up fused in `Wi`, and
//! RoPE; every `global_attn_every_n_layers`-th layer (from the first)
//! attends globally, the rest within `local_attention / 2` positions either
//! side, each kind with its own RoPE base. The first layer has no norm
//! before its attention: its input is the embeddings' norm already.

use super::bert::{encoder_layer, layer_norms};
use super::rope::hf_rope;
use super::{Family, HfExperts, Shape, sliding_pattern};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Activation, FeedForward, InputSpec, ModelSpec, RopeSpec};

/// ModernBERT.
pub(super) static MODERN_BERT: Family = Family {
    name: "modern-bert",
    gguf: &["modern-bert"],
    hf: &[
        "ModernBertModel",
        "ModernBertForMaskedLM",
        "ModernBertForSequenceClassification",
        "modernbert",
    ],
    hf_tensors: &[
        ("token_embd.weight", "embeddings.tok_embeddings.weight"),
        ("token_embd_norm.weight", "embeddings.norm.weight"),
        ("token_embd_norm.bias", "embeddings.norm.bias"),
        ("output_norm.weight", "final_norm.weight"),
        ("output_norm.bias", "final_norm.bias"),
        ("attn_norm", "attn_norm"),
        ("attn_qkv", "attn.Wqkv"),
        ("attn_output", "attn.Wo"),
        ("ffn_norm", "mlp_norm"),
        // Gate then up in one matrix, as llama.cpp's `ffn_up` (2 x n_ff).
        ("ffn_up", "mlp.Wi"),
        ("ffn_down", "mlp.Wo"),
    ],
    gguf_tensors: &[],
    hf_layers: "layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// Index of the local layers' RoPE in [`ModelSpec::ropes`].
const LOCAL: usize = 1;

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    for key in ["attention_bias", "mlp_bias"] {
        if c.bool_or(key, false)? {
            return Err(Error::Config(format!(
                "ModernBERT with {key} = true is not served"
            )));
        }
    }
    let shape = Shape::hf(c, &[])?;
    let every = c.usize_or("global_attn_every_n_layers", 3)?.max(1);
    let slides = sliding_pattern(c, shape.layers, |i| i % every != 0)?;
    let width = c.usize_or("local_attention", 128)?;
    let hd = shape.head_dim;
    let global = hf_rope(
        c,
        Some("full_attention"),
        ("global_rope_theta", None),
        160_000.0,
        hd,
    )?;
    let local = hf_rope(
        c,
        Some("sliding_attention"),
        ("local_rope_theta", None),
        10_000.0,
        hd,
    )?;
    let eps = c.f64_opt("norm_eps")?.unwrap_or(1e-5);
    let act = Activation::from_hf("hidden_activation", c.str_opt("hidden_activation"))?;
    Ok(modern(shape, eps, (global, local), (width, &slides), act))
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    // llama.cpp records the whole local width, and the pattern as "one
    // global layer in every n, the first global" (its dense-first SWA).
    let width = m.usize_opt("attention.sliding_window")?.unwrap_or(128);
    let every = m
        .usize_opt("attention.sliding_window_pattern")?
        .unwrap_or(3)
        .max(1);
    let slides: Vec<bool> = (0..shape.layers).map(|i| i % every != 0).collect();
    let global = m.plain_rope(shape.head_dim)?;
    let local = RopeSpec {
        theta: m.f32_opt("rope.freq_base_swa")?.unwrap_or(10_000.0),
        ..global.clone()
    };
    let eps = f64::from(m.f32_opt("attention.layer_norm_epsilon")?.unwrap_or(1e-5));
    let act = Activation::from_hf("hidden_act", m.str_opt("hidden_act")?.as_deref())?;
    Ok(modern(shape, eps, (global, local), (width, &slides), act))
}

/// The ModernBERT of `shape`: LayerNorm epsilon `eps`, the global and the
/// local RoPE, local layers (`slides`) seeing `width / 2` positions either
/// side, a GLU of `act`.
fn modern(
    shape: Shape,
    eps: f64,
    (global, local): (RopeSpec, RopeSpec),
    (width, slides): (usize, &[bool]),
    act: Activation,
) -> ModelSpec {
    // transformers' mask: a key `distance <= local_attention / 2` away is
    // seen; an encoder window `w` sees distances below `w`.
    let window = width / 2 + 1;
    let scale = shape.plain_scale();
    let mut spec = shape.spec(
        "modern-bert",
        layer_norms(eps, false),
        vec![global, local],
        |i| match slides[i] {
            true => encoder_layer(scale, Some(LOCAL), Some(window), FeedForward::Gated(act)),
            false => encoder_layer(scale, Some(0), None, FeedForward::Gated(act)),
        },
    );
    spec.input = InputSpec {
        positions: None,
        token_types: 0,
        norm: true,
    };
    spec
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::spec::{Activation, FeedForward, Mixer};

    fn gte() -> serde_json::Value {
        json!({"architectures":["ModernBertModel"],"model_type":"modernbert",
        "hidden_size":768,"intermediate_size":1152,"num_hidden_layers":22,
        "num_attention_heads":12,"vocab_size":50368,"max_position_embeddings":8192,
        "global_attn_every_n_layers":3,"local_attention":128,"global_rope_theta":160000.0,
        "local_rope_theta":10000.0,"norm_eps":1e-5,"norm_bias":false,
        "hidden_activation":"gelu","attention_bias":false,"mlp_bias":false})
    }

    #[test]
    fn gte_modernbert_alternates_global_and_local_layers() {
        let (family, spec) = super::super::from_hf(&gte().to_string()).unwrap();
        assert_eq!(family.name, "modern-bert");
        assert!(!spec.keeps_cache() && spec.final_norm && !spec.norms.after_residual);
        assert_eq!(spec.input.token_types, 0);
        assert!(spec.input.norm && spec.input.positions.is_none());
        let thetas: Vec<f32> = spec.ropes.iter().map(|r| r.theta).collect();
        assert_eq!(thetas, [160_000.0, 10_000.0]);
        for (i, l) in spec.layers.iter().enumerate() {
            let Mixer::Encoder(e) = &l.mixer else {
                panic!("{:?}", l.mixer)
            };
            let global = i % 3 == 0;
            assert_eq!(e.attention.window, (!global).then_some(65), "layer {i}");
            assert_eq!(e.attention.rope, usize::from(!global), "layer {i}");
            assert!(!e.causal && !e.attention.nope);
            assert_eq!(l.ffn, FeedForward::Gated(Activation::Gelu));
            // Distance 64 is seen, 65 is not.
            assert_eq!((e.sees(0, 64), e.sees(65, 0)), (true, global));
        }
    }

    #[test]
    fn transformers_5_layer_types_and_rope_parameters_read_alike() {
        let mut c = gte();
        let obj = c.as_object_mut().unwrap();
        obj.remove("global_rope_theta");
        obj.remove("local_rope_theta");
        c["num_hidden_layers"] = json!(3);
        c["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention"]);
        c["rope_parameters"] = json!({
            "full_attention": {"rope_type": "default", "rope_theta": 160000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}});
        let (_, spec) = super::super::from_hf(&c.to_string()).unwrap();
        let windows: Vec<_> = spec
            .layers
            .iter()
            .map(|l| l.any_attention().unwrap().window)
            .collect();
        assert_eq!(windows, [None, Some(65), None]);
        assert_eq!(spec.ropes[1].theta, 20_000.0);
    }

    #[test]
    fn llama_cpp_metadata_reads_as_the_config_does() {
        use candle_core::quantized::gguf_file::Value;
        // What llama.cpp's converter writes for gte-modernbert.
        let md: std::collections::HashMap<String, Value> = [
            ("embedding_length", Value::U32(768)),
            ("feed_forward_length", Value::U32(1152)),
            ("block_count", Value::U32(22)),
            ("attention.head_count", Value::U32(12)),
            ("context_length", Value::U32(8192)),
            ("vocab_size", Value::U32(50368)),
            ("attention.sliding_window", Value::U32(128)),
            ("attention.sliding_window_pattern", Value::U32(3)),
            ("rope.freq_base", Value::F32(160_000.0)),
            ("rope.freq_base_swa", Value::F32(10_000.0)),
            ("attention.layer_norm_epsilon", Value::F32(1e-5)),
        ]
        .into_iter()
        .map(|(k, v)| (format!("modern-bert.{k}"), v))
        .collect();
        let m = crate::config::Metadata {
            md: &md,
            arch: "modern-bert",
        };
        let from_gguf = (super::MODERN_BERT.from_gguf)(&m).unwrap();
        let (_, from_hf) = super::super::from_hf(&gte().to_string()).unwrap();
        assert_eq!(from_gguf.layers, from_hf.layers);
        assert_eq!(from_gguf.ropes, from_hf.ropes);
        assert_eq!(from_gguf.input, from_hf.input);
    }

    #[test]
    fn unserved_modernbert_settings_are_refused_by_name() {
        for (key, value) in [
            ("attention_bias", json!(true)),
            ("mlp_bias", json!(true)),
            ("hidden_activation", json!("relu")),
        ] {
            let mut c = gte();
            c[key] = value;
            let err = super::super::from_hf(&c.to_string()).unwrap_err();
            assert!(err.to_string().contains(key), "{key}: {err}");
        }
    }
}
