//! BERT (bge, e5, all-MiniLM, ...): an encoder. Bidirectional attention
//! with biases and no RoPE, learned absolute positions and token types
//! added to the embeddings and LayerNormed, post-LN blocks, a plain GELU
//! MLP with biases, no final norm; pooled, never sampled.

use super::{Family, HfExperts, Shape};
use crate::config::{HfConfig, Metadata};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, EncoderSpec, FeedForward, InputSpec, LayerSpec, Mixer, ModelSpec,
    Norms,
};

/// BERT.
pub(super) static BERT: Family = Family {
    name: "bert",
    gguf: &["bert"],
    hf: &["BertModel", "BertForMaskedLM", "bert"],
    hf_tensors: &[
        ("token_embd.weight", "embeddings.word_embeddings.weight"),
        (
            "position_embd.weight",
            "embeddings.position_embeddings.weight",
        ),
        (
            "token_types.weight",
            "embeddings.token_type_embeddings.weight",
        ),
        ("token_embd_norm.weight", "embeddings.LayerNorm.weight"),
        ("token_embd_norm.bias", "embeddings.LayerNorm.bias"),
        ("attn_q", "attention.self.query"),
        ("attn_k", "attention.self.key"),
        ("attn_v", "attention.self.value"),
        ("attn_output", "attention.output.dense"),
        // Post-LN: the norm after the attention's residual add, and the
        // one after the MLP's.
        ("attn_norm", "attention.output.LayerNorm"),
        ("ffn_up", "intermediate.dense"),
        ("ffn_down", "output.dense"),
        ("ffn_norm", "output.LayerNorm"),
    ],
    gguf_tensors: &[
        ("attn_norm", "attn_output_norm"),
        ("ffn_norm", "layer_output_norm"),
    ],
    hf_layers: "encoder.layer",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    from_hf,
    from_gguf,
};

/// One BERT layer: bidirectional attention, a plain MLP.
fn layer(scale: f32, activation: Activation) -> LayerSpec {
    LayerSpec {
        mixer: Mixer::Encoder(EncoderSpec {
            attention: AttentionSpec {
                window: None,
                rope: 0,
                scale,
                softcap: None,
                qk_norm: false,
                sinks: false,
                nope: true,
                gated: false,
            },
            causal: false,
        }),
        ffn: FeedForward::Plain(activation),
    }
}

/// The encoder of `shape`, LayerNorm epsilon `eps`, `types` token types.
fn encoder(shape: Shape, eps: f64, types: usize, activation: Activation) -> ModelSpec {
    let norms = Norms {
        eps,
        layer_norm: true,
        after_residual: true,
        offset: 0.0,
        post_attention: false,
        post_ffn: false,
    };
    let scale = shape.plain_scale();
    let mut spec = shape.spec("bert", norms, Vec::new(), |_| layer(scale, activation));
    spec.qkv_bias = true;
    spec.final_norm = false;
    spec.input = InputSpec {
        positions: Some(0),
        token_types: types,
        norm: true,
    };
    spec
}

/// BERT's `hidden_act`: `gelu` (exact), or the tanh approximation.
fn activation(name: Option<&str>) -> Result<Activation> {
    match name.unwrap_or("gelu") {
        "gelu" => Ok(Activation::Gelu),
        "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
        other => Err(Error::Config(format!(
            "BERT's hidden_act {other:?} is not served (gelu, gelu_new)"
        ))),
    }
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    // Every head is a query and a KV head; BERT's configs name neither.
    let shape = Shape::hf(c, &[])?;
    let types = c.usize_or("type_vocab_size", 2)?;
    let eps = c.f64_opt("layer_norm_eps")?.unwrap_or(1e-12);
    Ok(encoder(
        shape,
        eps,
        types,
        activation(c.str_opt("hidden_act"))?,
    ))
}

fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let eps = f64::from(m.f32_opt("attention.layer_norm_epsilon")?.unwrap_or(1e-12));
    // llama.cpp writes no type count; its converter keeps BERT's two rows.
    Ok(encoder(shape, eps, 2, Activation::Gelu))
}
