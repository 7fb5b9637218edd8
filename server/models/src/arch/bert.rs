//! BERT (bge, e5, all-MiniLM, ...): an encoder. Bidirectional attention
//! with biases and no RoPE, learned absolute positions and token types
//! added to the embeddings and LayerNormed, post-LN blocks, a plain GELU
//! MLP with biases, no final norm; pooled, never sampled.

use super::{Family, HfExperts, Shape};
use crate::config::{HfConfig, Metadata, md_usize};
use crate::error::{Error, Result};
use crate::spec::{
    Activation, AttentionSpec, EncoderSpec, FeedForward, InputSpec, KvLayout, LayerSpec, Mixer,
    ModelSpec, Norms,
};

/// BERT's tensors by Hugging Face name (XLM-RoBERTa's are the same).
const BERT_TENSORS: [(&str, &str); 13] = [
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
];

/// BERT.
pub(super) static BERT: Family = Family {
    name: "bert",
    gguf: &["bert"],
    hf: &[
        "BertModel",
        "BertForMaskedLM",
        "BertForSequenceClassification",
        "bert",
    ],
    hf_tensors: &BERT_TENSORS,
    gguf_tensors: &[
        ("attn_norm", "attn_output_norm"),
        ("ffn_norm", "layer_output_norm"),
    ],
    hf_layers: "encoder.layer",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf,
    from_gguf,
};

/// XLM-RoBERTa (bge-m3, multilingual-e5): BERT's layers and names, its
/// positions counted from `pad_token_id + 1`, one token type.
pub(super) static XLM_ROBERTA: Family = Family {
    name: "xlm-roberta",
    gguf: &[],
    hf: &[
        "XLMRobertaModel",
        "XLMRobertaForSequenceClassification",
        "xlm-roberta",
    ],
    hf_tensors: &BERT_TENSORS,
    gguf_tensors: &[],
    hf_layers: "encoder.layer",
    hf_experts: HfExperts::PerExpert,
    tied_default: true,
    gguf_permuted_qk: false,
    hf_rope_pairs: false,
    from_hf: xlmr_from_hf,
    from_gguf: xlmr_from_gguf,
};

/// An encoder layer (every encoder family's): attention within each
/// sequence, both directions, scaled by `scale`, rotated by the spec's
/// RoPE `rope` or by none (learned positions), seeing only the keys less
/// than `window` positions away either side where it has one; then `ffn`.
pub(super) fn encoder_layer(
    scale: f32,
    rope: Option<usize>,
    window: Option<usize>,
    ffn: FeedForward,
) -> LayerSpec {
    LayerSpec {
        mixer: Mixer::Encoder(EncoderSpec {
            attention: AttentionSpec {
                window,
                chunk: None,
                rope: rope.unwrap_or(0),
                scale,
                softcap: None,
                qk_norm: false,
                qk_norm_whole: false,
                qk_norm_weightless: false,
                sinks: false,
                nope: rope.is_none(),
                gated: false,
                temperature: None,
                kv: KvLayout::default(),
            },
            causal: false,
        }),
        ffn,
    }
}

/// LayerNorms of epsilon `eps`, after each residual add (BERT's post-LN)
/// or before each block (ModernBERT's pre-LN).
pub(super) fn layer_norms(eps: f64, after_residual: bool) -> Norms {
    Norms {
        eps,
        layer_norm: true,
        after_residual,
        offset: 0.0,
        pre: true,
        post_attention: false,
        post_ffn: false,
    }
}

/// The encoder `name` of `shape`, LayerNorm epsilon `eps`, `types` token
/// types, positions from `offset`.
fn encoder(
    name: &'static str,
    shape: Shape,
    (eps, types, offset): (f64, usize, usize),
    activation: Activation,
) -> ModelSpec {
    let scale = shape.plain_scale();
    let ffn = FeedForward::Plain(activation);
    let mut spec = shape.spec("bert", layer_norms(eps, true), Vec::new(), |_| {
        encoder_layer(scale, None, None, ffn)
    });
    spec.family = name;
    spec.qkv_bias = true;
    spec.final_norm = false;
    spec.input = InputSpec {
        positions: Some(offset),
        token_types: types,
        norm: true,
    };
    spec
}

fn from_hf(c: &HfConfig) -> Result<ModelSpec> {
    // Every head is a query and a KV head; BERT's configs name neither.
    let shape = Shape::hf(c, &[])?;
    let types = c.usize_or("type_vocab_size", 2)?;
    let eps = c.f64_opt("layer_norm_eps")?.unwrap_or(1e-12);
    Ok(encoder(
        "bert",
        shape,
        (eps, types, 0),
        Activation::from_hf("hidden_act", c.str_opt("hidden_act"))?,
    ))
}

fn xlmr_from_hf(c: &HfConfig) -> Result<ModelSpec> {
    let mut shape = Shape::hf(c, &[])?;
    // Position i of a text is row pad_token_id + 1 + i.
    let offset = c.usize_or("pad_token_id", 1)? + 1;
    shape.context = shape.context.checked_sub(offset).ok_or_else(|| {
        Error::Config(format!(
            "max_position_embeddings {} leaves no position past pad_token_id",
            shape.context
        ))
    })?;
    let types = c.usize_or("type_vocab_size", 1)?;
    let eps = c.f64_opt("layer_norm_eps")?.unwrap_or(1e-5);
    Ok(encoder(
        "xlm-roberta",
        shape,
        (eps, types, offset),
        Activation::from_hf("hidden_act", c.str_opt("hidden_act"))?,
    ))
}

fn xlmr_from_gguf(_: &Metadata<'_>) -> Result<ModelSpec> {
    Err(Error::Config(
        "XLM-RoBERTa from GGUF is read as `bert`, the architecture llama.cpp writes".into(),
    ))
}

/// BERT, and XLM-RoBERTa as llama.cpp's converter writes it: `bert` with
/// its position rows from `pad_token_id + 1` cut off (so positions count
/// from 0 here) and one token type.
fn from_gguf(m: &Metadata<'_>) -> Result<ModelSpec> {
    let shape = Shape::gguf(m)?;
    let eps = f64::from(m.f32_opt("attention.layer_norm_epsilon")?.unwrap_or(1e-12));
    // The type count is the vocabulary's; a file without one has BERT's two.
    const TYPES: &str = "tokenizer.ggml.token_type_count";
    let types = match m.md.contains_key(TYPES) {
        true => md_usize(m.md, TYPES)?,
        false => 2,
    };
    Ok(encoder("bert", shape, (eps, types, 0), Activation::Gelu))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::spec::{Activation, FeedForward, InputSpec, Mixer, ModelSpec};

    fn read(config: serde_json::Value) -> ModelSpec {
        super::super::from_hf(&config.to_string()).unwrap().1
    }

    #[test]
    fn bge_base_reads_as_an_encoder_that_keeps_no_cache() {
        let bge = read(
            json!({"architectures":["BertModel"],"hidden_size":768,"intermediate_size":3072,
            "num_hidden_layers":12,"num_attention_heads":12,"vocab_size":30522,
            "max_position_embeddings":512,"type_vocab_size":2,"hidden_act":"gelu",
            "layer_norm_eps":1e-12,"model_type":"bert"}),
        );
        assert_eq!(
            (bge.family, bge.layers.len(), bge.kv_heads, bge.head_dim),
            ("bert", 12, 12, 64)
        );
        assert!(!bge.keeps_cache() && bge.kv_groups().is_empty());
        assert!(bge.qkv_bias && !bge.final_norm);
        assert!(bge.norms.layer_norm && bge.norms.after_residual);
        let input = InputSpec {
            positions: Some(0),
            token_types: 2,
            norm: true,
        };
        assert_eq!(bge.input, input);
        for l in &bge.layers {
            let Mixer::Encoder(e) = &l.mixer else {
                panic!("{:?}", l.mixer)
            };
            assert!(!e.causal && e.attention.nope);
            assert_eq!(l.ffn, FeedForward::Plain(Activation::Gelu));
        }
        // A decoder pooled keeps no cache either: its attention is causal,
        // within each sequence.
        let qwen = read(
            json!({"architectures":["Qwen3ForCausalLM"],"hidden_size":1024,"intermediate_size":3072,
            "num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,
            "vocab_size":151669,"max_position_embeddings":32768,"rope_theta":1000000.0,
            "rms_norm_eps":1e-6,"tie_word_embeddings":true}),
        );
        assert!(qwen.keeps_cache());
        let pooled = qwen.pooled();
        assert!(!pooled.keeps_cache() && pooled.kv_groups().is_empty());
        assert!(
            matches!(&pooled.layers[0].mixer, Mixer::Encoder(e) if e.causal && !e.attention.nope)
        );
    }

    #[test]
    fn bge_m3_reads_as_bert_with_positions_past_the_padding() {
        let m3 = read(
            json!({"architectures":["XLMRobertaModel"],"hidden_size":1024,"intermediate_size":4096,
            "num_hidden_layers":24,"num_attention_heads":16,"vocab_size":250002,
            "max_position_embeddings":8194,"type_vocab_size":1,"hidden_act":"gelu",
            "layer_norm_eps":1e-5,"pad_token_id":1,"model_type":"xlm-roberta"}),
        );
        assert_eq!(
            (m3.family, m3.layers.len(), m3.context),
            ("xlm-roberta", 24, 8192)
        );
        assert_eq!(m3.input.positions, Some(2));
        assert_eq!(m3.input.token_types, 1);
        assert!(!m3.keeps_cache() && m3.norms.layer_norm);
        let cramped = super::super::from_hf(
            &json!({"architectures":["XLMRobertaModel"],"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":1,"num_attention_heads":4,"vocab_size":10,
            "max_position_embeddings":1,"pad_token_id":1})
            .to_string(),
        );
        assert!(cramped.is_err());
    }
}
