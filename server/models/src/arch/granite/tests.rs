//! Granite 4.0-H's mixtures of experts read into descriptions.

use serde_json::json;

use crate::arch::from_hf;
use crate::spec::{Activation, FeedForward, MoeSpec, Routing};

/// Granite-4.0-H-Tiny's config (its shape), the layers cut to four.
fn h_tiny() -> serde_json::Value {
    json!({
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "hidden_size": 1536, "intermediate_size": 512, "shared_intermediate_size": 1024,
        "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4,
        "vocab_size": 100352, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "num_local_experts": 64, "num_experts_per_tok": 6, "position_embedding_type": "nope",
        "layer_types": ["mamba", "mamba", "attention", "mamba"],
        "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125, "logits_scaling": 6.0
    })
}

#[test]
fn granite_4_h_tiny_has_experts_beside_its_shared_mlp_in_every_layer() {
    let (family, g) = from_hf(&h_tiny().to_string()).unwrap();
    assert_eq!(family.name, "granitehybrid");
    let want = MoeSpec {
        experts: 64,
        top_k: 6,
        intermediate: 512,
        activation: Activation::Silu,
        // transformers: the top six logits, softmax over those.
        routing: Routing::TopKSoftmax,
        biases: false,
        // The shared MLP, added as it is (no gate of its own).
        shared: Some(1024),
        shared_gated: false,
        gated: true,
    };
    for l in &g.layers {
        assert_eq!(l.ffn, FeedForward::Moe(want));
    }
    assert_eq!(g.kv_groups()[0].layers, [2]);
    assert_eq!(g.recurrent_layers(), [0, 1, 3]);
    // 64 experts of gate, up and down each 1536 x 512 a layer; six run.
    let (all, active) = g.expert_params();
    assert_eq!(
        (all, active),
        (4 * 64 * 3 * 1536 * 512, 4 * 6 * 3 * 1536 * 512)
    );
}

#[test]
fn granite_4_h_without_experts_keeps_its_dense_mlp() {
    let mut c = h_tiny();
    c["num_local_experts"] = json!(0);
    let g = from_hf(&c.to_string()).unwrap().1;
    assert!(
        g.layers
            .iter()
            .all(|l| l.ffn == FeedForward::Gated(Activation::Silu))
    );
    assert_eq!(g.intermediate, 1024);
}

#[test]
fn granite_4_h_experts_without_a_top_k_are_refused_by_the_key() {
    let mut c = h_tiny();
    c.as_object_mut().unwrap().remove("num_experts_per_tok");
    let err = from_hf(&c.to_string()).unwrap_err().to_string();
    assert!(err.contains("num_experts_per_tok"), "{err}");
}
