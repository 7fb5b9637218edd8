//! NomicBERT (nomic-embed-text v1 and v1.5): BERT's post-LN encoder with
//! RoPE in place of learned positions, q/k/v fused in one `Wqkv`, a SwiGLU
//! MLP (`fc11` up, `fc12` gate, `fc2` down) and no biases but the
//! LayerNorms'. Its checkpoints keep nomic's own names and config keys
//! (`n_embd`, `rotary_emb_base`, ...), which llama.cpp's converter reads too.

use super::bert::{encoder_layer, layer_norms};
use super::{Family, HfExperts, Shape, checked_layers};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{Activation, FeedForward, InputSpec, ModelSpec, RopeScaling, RopeSpec};

/// NomicBERT.
pub(super) static NOMIC_BERT: Family = Family {
    name: "nomic-bert",
    gguf: &["nomic-bert"],
    hf: &[
        "NomicBertModel",
        "NomicBertForSequenceClassification",
        "nomic_bert",
    ],
    hf_tensors: &[
        ("token_embd.weight", "embeddings.word_embeddings.weight"),
        (
            "token_types.weight",
            "embeddings.token_type_embeddings.weight",
        ),
        ("token_embd_norm.weight", "emb_ln.weight"),
        ("token_embd_norm.bias", "emb_ln.bias"),
        ("attn_qkv", "attn.Wqkv"),
        ("attn_output", "attn.out_proj"),
        // Post-LN, as BERT: the norm after the attention's residual add,
        // and the one after the MLP's.
        ("attn_norm", "norm1"),
        ("ffn_up", "mlp.fc11"),
        ("ffn_gate", "mlp.fc12"),
        ("ffn_down", "mlp.fc2"),
        ("ffn_norm", "norm2"),
    ],
    gguf_tensors: &[
        ("attn_norm", "attn_output_norm"),
        ("ffn_norm", "layer_output_norm"),
    ],
    hf_layers: "encoder.layers",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// The one layout served: nomic's v1/v1.5 (`config.json` key, the value
/// it must have). The others change the graph (a pre-norm block, biases,
/// interleaved or partial rotation, the v2 experts) and are refused by
/// name rather than run wrong.
const REQUIRED: [(&str, &str); 8] = [
    ("activation_function", "\"swiglu\""),
    ("prenorm", "false"),
    ("qkv_proj_bias", "false"),
    ("mlp_fc1_bias", "false"),
    ("mlp_fc2_bias", "false"),
    ("rotary_emb_fraction", "1.0"),
    ("rotary_emb_interleaved", "false"),
    ("causal", "false"),
];

/// Keys whose presence with a value (not `null`) changes the graph.
const UNSERVED: [&str; 3] = [
    "rotary_scaling_factor",
    "rotary_emb_scale_base",
    "moe_every_n_layers",
];

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    for (key, want) in REQUIRED {
        if let Some(v) = c.get(key) {
            let ok = match v.as_f64() {
                Some(x) => want.parse::<f64>().is_ok_and(|w| w == x),
                None => serde_json::from_str::<serde_json::Value>(want).is_ok_and(|w| w == *v),
            };
            if !ok {
                return Err(Error::Config(format!(
                    "NomicBERT's {key} = {v} is not served (only {want})"
                )));
            }
        }
    }
    for key in UNSERVED {
        match c.get(key) {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Number(n)) if n.as_f64() == Some(0.0) => {}
            Some(v) => {
                return Err(Error::Config(format!(
                    "NomicBERT's {key} = {v} is not served"
                )));
            }
        }
    }
    let hidden = c.usize("n_embd")?;
    let heads = c.usize("n_head")?;
    let shape = Shape {
        hidden,
        intermediate: c.usize("n_inner")?,
        layers: checked_layers(c.usize("n_layer")?)?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads.max(1),
        vocab: c.usize("vocab_size")?,
        // v1.5 says 8192 positions (what it extrapolates to with scaling
        // it does not ship) but was trained for `max_trained_positions`,
        // what llama.cpp's converter serves too.
        context: match c.usize_opt("max_trained_positions")? {
            Some(n) => n,
            None => c.usize("n_positions")?,
        },
    };
    let eps = c.f64_opt("layer_norm_epsilon")?.unwrap_or(1e-12);
    let theta = c.f64_opt("rotary_emb_base")?.unwrap_or(10_000.0) as f32;
    let types = c.usize_or("type_vocab_size", 2)?;
    Ok(nomic(shape, (eps, types), theta))
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let eps = f64::from(m.f32_opt("attention.layer_norm_epsilon")?.unwrap_or(1e-12));
    let theta = m.plain_rope(shape.head_dim)?.theta;
    // llama.cpp writes no type count; nomic's checkpoints have BERT's two.
    Ok(nomic(shape, (eps, 2), theta))
}

/// The NomicBERT of `shape`: LayerNorm epsilon `eps`, `types` token types,
/// RoPE base `theta` over whole heads.
fn nomic(shape: Shape, (eps, types): (f64, usize), theta: f32) -> ModelSpec {
    let rope = RopeSpec {
        theta,
        rotary_dim: shape.head_dim,
        scaling: RopeScaling::None,
    };
    let scale = shape.plain_scale();
    let ffn = FeedForward::Gated(Activation::Silu);
    let mut spec = shape.spec("nomic-bert", layer_norms(eps, true), vec![rope], |_| {
        encoder_layer(scale, Some(0), None, ffn)
    });
    spec.final_norm = false;
    // No learned positions (RoPE places tokens); BERT's segments and its
    // LayerNorm of the embeddings.
    spec.input = InputSpec {
        positions: None,
        token_types: types,
        norm: true,
    };
    spec
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::spec::{Activation, FeedForward, Mixer};

    fn v15() -> serde_json::Value {
        json!({"architectures":["NomicBertModel"],"model_type":"nomic_bert",
        "activation_function":"swiglu","n_embd":768,"n_head":12,"n_inner":3072,"n_layer":12,
        "n_positions":8192,"max_trained_positions":2048,"vocab_size":30528,
        "layer_norm_epsilon":1e-12,"rotary_emb_base":1000,"rotary_emb_fraction":1.0,
        "rotary_emb_interleaved":false,"rotary_emb_scale_base":null,"rotary_scaling_factor":null,
        "prenorm":false,"qkv_proj_bias":false,"mlp_fc1_bias":false,"mlp_fc2_bias":false,
        "causal":false,"type_vocab_size":2})
    }

    #[test]
    fn nomic_embed_v15_reads_as_a_rotary_swiglu_encoder() {
        let (family, spec) = super::super::from_hf(&v15().to_string()).unwrap();
        assert_eq!(family.name, "nomic-bert");
        assert_eq!(
            (spec.layers.len(), spec.head_dim, spec.context),
            (12, 64, 2048)
        );
        assert_eq!(spec.ropes[0].theta, 1000.0);
        assert!(!spec.keeps_cache() && !spec.final_norm && !spec.qkv_bias);
        assert!(spec.norms.layer_norm && spec.norms.after_residual);
        assert_eq!((spec.input.positions, spec.input.token_types), (None, 2));
        for l in &spec.layers {
            let Mixer::Encoder(e) = &l.mixer else {
                panic!("{:?}", l.mixer)
            };
            assert!(!e.causal && !e.attention.nope && e.attention.window.is_none());
            assert_eq!(l.ffn, FeedForward::Gated(Activation::Silu));
        }
    }

    #[test]
    fn other_nomic_layouts_are_refused_by_name() {
        for (key, value) in [
            ("prenorm", json!(true)),
            ("qkv_proj_bias", json!(true)),
            ("activation_function", json!("gelu")),
            ("rotary_emb_fraction", json!(0.5)),
            ("rotary_scaling_factor", json!(2.0)),
            ("moe_every_n_layers", json!(2)),
        ] {
            let mut c = v15();
            c[key] = value;
            let err = super::super::from_hf(&c.to_string()).unwrap_err();
            assert!(err.to_string().contains(key), "{key}: {err}");
        }
    }
}
