//! Nemotron-H's configs as the Hub and transformers 5 write them read into
//! descriptions.

use serde_json::json;

use crate::arch::from_hf;
use crate::spec::{Activation, FeedForward, Mixer, MoeSpec, Routing};

/// Nemotron-H-8B's config (its keys and widths), the pattern cut to seven
/// layers.
fn h_8b() -> serde_json::Value {
    json!({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 7,
        "num_attention_heads": 32, "num_key_value_heads": 8, "attention_head_dim": 128,
        "hybrid_override_pattern": "M-M*-M-", "mamba_num_heads": 128, "mamba_head_dim": 64,
        "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
        "expand": 2, "mamba_hidden_act": "silu", "mlp_hidden_act": "relu2",
        "use_conv_bias": true, "use_bias": false, "layer_norm_epsilon": 1e-5,
        "vocab_size": 131072, "max_position_embeddings": 8192,
        "time_step_limit": [0.0, {"__float__": "Infinity"}], "tie_word_embeddings": false
    })
}

#[test]
fn nemotron_h_layers_are_mamba_attention_or_mlp_alone_by_its_pattern() {
    let (family, s) = from_hf(&h_8b().to_string()).unwrap();
    assert_eq!(family.name, "nemotron_h");
    let kinds: String = s
        .layers
        .iter()
        .map(|l| match (&l.mixer, l.ffn) {
            (Mixer::Mamba2(_), FeedForward::None) => 'M',
            (Mixer::Attention(a), FeedForward::None) if a.nope => '*',
            (Mixer::None, FeedForward::Plain(Activation::Relu2)) => '-',
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, "M-M*-M-");
    assert_eq!((s.head_dim, s.intermediate), (128, 21504));
    let m = s.layers[0].ssm().unwrap();
    assert_eq!((m.heads, m.head_dim, m.state, m.groups), (128, 64, 128, 8));
    // KV for the one attention layer, a state for each of the three Mamba
    // layers: 3 * (8192 + 2 * 8 * 128) conv values, 128 * 64 * 128 state.
    assert_eq!(s.kv_groups()[0].layers, [3]);
    assert_eq!(s.recurrent_layers(), [0, 2, 5]);
    assert_eq!(
        s.state_bytes(),
        3 * 4 * (3 * (8192 + 2048) + 128 * 64 * 128)
    );
}

#[test]
fn transformers_5_s_layer_list_reads_as_the_pattern_does() {
    let mut c = h_8b();
    let o = c.as_object_mut().unwrap();
    o.remove("hybrid_override_pattern");
    o.remove("num_hidden_layers");
    o.insert("head_dim".into(), json!(128));
    o.remove("attention_head_dim");
    let kinds = [
        "linear_attention",
        "mlp",
        "linear_attention",
        "full_attention",
        "mlp",
        "linear_attention",
        "mlp",
    ];
    o.insert("layers_block_type".into(), json!(kinds));
    let from_list = from_hf(&c.to_string()).unwrap().1;
    let from_pattern = from_hf(&h_8b().to_string()).unwrap().1;
    assert_eq!(from_list, from_pattern);
}

/// Nemotron-3-Nano-30B-A3B's config (its keys and widths), the pattern
/// cut to five layers.
fn nano() -> serde_json::Value {
    json!({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "hidden_size": 2688, "num_hidden_layers": 5, "num_attention_heads": 32,
        "num_key_value_heads": 2, "head_dim": 128, "hybrid_override_pattern": "MEM*E",
        "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
        "conv_kernel": 4, "chunk_size": 128, "expand": 2, "mamba_hidden_act": "silu",
        "mlp_hidden_act": "relu2", "intermediate_size": 1856, "n_routed_experts": 128,
        "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
        "moe_shared_expert_intermediate_size": 3712, "n_shared_experts": 1, "n_group": 1,
        "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
        "use_conv_bias": true, "use_bias": false, "layer_norm_epsilon": 1e-5,
        "vocab_size": 131072, "max_position_embeddings": 262144, "tie_word_embeddings": false
    })
}

#[test]
fn nemotron_3_s_expert_layers_are_plain_squared_relu_experts_behind_a_sigmoid_router() {
    let s = from_hf(&nano().to_string()).unwrap().1;
    let want = MoeSpec {
        experts: 128,
        top_k: 6,
        intermediate: 1856,
        activation: Activation::Relu2,
        routing: Routing::SigmoidGroups {
            groups: 1,
            topk_groups: 1,
            normalize: true,
            scale: 2.5,
        },
        biases: false,
        shared: Some(3712),
        shared_gated: false,
        gated: false,
    };
    let kinds: String = s
        .layers
        .iter()
        .map(|l| match (&l.mixer, l.ffn) {
            (Mixer::Mamba2(_), FeedForward::None) => 'M',
            (Mixer::Attention(a), FeedForward::None) if a.nope => '*',
            (Mixer::None, FeedForward::Moe(m)) if m == want => 'E',
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, "MEM*E");
    // An ungated expert is two matrices: up and down.
    let one = 2 * 2688 * 1856;
    assert_eq!(s.expert_params(), (2 * 128 * one, 2 * 6 * one));
    // Experts keep nothing between steps: KV for the one attention layer.
    assert_eq!(s.kv_groups()[0].layers, [3]);
    assert_eq!(s.mixer_layers(), 3);
}

#[test]
fn latent_experts_and_unknown_layer_letters_are_refused_by_name() {
    let mut latent = nano();
    latent["moe_latent_size"] = json!(1024);
    let mut letter = h_8b();
    letter["hybrid_override_pattern"] = json!("M-X*");
    for (c, says) in [(latent, "moe_latent_size"), (letter, "'X'")] {
        let err = from_hf(&c.to_string()).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
}
