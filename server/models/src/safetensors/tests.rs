//! A checkpoint's tensor names read as the GGUF names they stand for.

use super::{HfNames, PREFIXES};
use crate::arch::Family;

fn names(family: &str, prefix: &'static str, head: &'static str) -> HfNames {
    HfNames {
        family: Family::by_gguf(family).unwrap(),
        prefix,
        head,
    }
}

#[test]
fn names_translate_by_family_and_prefix() {
    let llama = names("llama", PREFIXES[0], "lm_head.weight");
    let gemma = names("gemma3", PREFIXES[2], "language_model.lm_head.weight");
    let phi = names("phi3", PREFIXES[0], "lm_head.weight");
    // A bare sentence-transformers BERT: no prefix, `encoder.layer`.
    let bert = names("bert", "", "lm_head.weight");
    for (n, gguf, hf) in [
        (&llama, "token_embd.weight", "model.embed_tokens.weight"),
        (
            &llama,
            "blk.3.attn_q.weight",
            "model.layers.3.self_attn.q_proj.weight",
        ),
        (
            &llama,
            "blk.0.attn_k.bias",
            "model.layers.0.self_attn.k_proj.bias",
        ),
        (
            &llama,
            "blk.11.ffn_down.weight",
            "model.layers.11.mlp.down_proj.weight",
        ),
        (
            &llama,
            "blk.2.ffn_norm.weight",
            "model.layers.2.post_attention_layernorm.weight",
        ),
        (
            &llama,
            "blk.2.attn_q_norm.weight",
            "model.layers.2.self_attn.q_norm.weight",
        ),
        (&llama, "output.weight", "lm_head.weight"),
        (
            &gemma,
            "output_norm.weight",
            "language_model.model.norm.weight",
        ),
        (
            &gemma,
            "blk.1.ffn_norm.weight",
            "language_model.model.layers.1.pre_feedforward_layernorm.weight",
        ),
        (
            &gemma,
            "blk.1.post_attention_norm.weight",
            "language_model.model.layers.1.post_attention_layernorm.weight",
        ),
        (
            &gemma,
            "blk.1.post_ffw_norm.weight",
            "language_model.model.layers.1.post_feedforward_layernorm.weight",
        ),
        (&gemma, "output.weight", "language_model.lm_head.weight"),
        (
            &phi,
            "blk.0.attn_qkv.weight",
            "model.layers.0.self_attn.qkv_proj.weight",
        ),
        (
            &phi,
            "blk.0.ffn_up.weight",
            "model.layers.0.mlp.gate_up_proj.weight",
        ),
        (
            &bert,
            "blk.0.attn_q.weight",
            "encoder.layer.0.attention.self.query.weight",
        ),
        (
            &bert,
            "blk.1.attn_norm.bias",
            "encoder.layer.1.attention.output.LayerNorm.bias",
        ),
        (
            &bert,
            "blk.1.ffn_norm.weight",
            "encoder.layer.1.output.LayerNorm.weight",
        ),
        (&bert, "token_embd_norm.bias", "embeddings.LayerNorm.bias"),
        (
            &bert,
            "position_embd.weight",
            "embeddings.position_embeddings.weight",
        ),
    ] {
        assert_eq!(n.hf(gguf), hf);
    }
    assert!(gemma.is_text("language_model.model.layers.0.mlp.up_proj.weight"));
    assert!(!gemma.is_text("vision_tower.vision_model.embeddings.patch_embedding.weight"));
}
