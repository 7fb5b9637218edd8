//! LFM2's configs as the Hub has them read into descriptions.

use serde_json::json;

use crate::arch::from_hf;
use crate::spec::{FeedForward, Mixer, ModelSpec, ShortConvSpec};

/// LFM2-1.2B's published config (the original keys beside transformers').
fn lfm2_1_2b() -> serde_json::Value {
    json!({"architectures":["Lfm2ForCausalLM"],"block_auto_adjust_ff_dim":true,
    "block_dim":2048,"block_ff_dim":12288,"block_ffn_dim_multiplier":1.0,
    "block_multiple_of":256,"block_norm_eps":1e-05,"conv_L_cache":3,"conv_bias":false,
    "conv_dim":2048,"eos_token_id":7,"hidden_size":2048,"intermediate_size":12288,
    "layer_types":["conv","conv","full_attention","conv","conv","full_attention","conv",
        "conv","full_attention","conv","full_attention","conv","full_attention","conv",
        "full_attention","conv"],
    "max_position_embeddings":128000,"model_type":"lfm2","norm_eps":1e-05,
    "num_attention_heads":32,"num_heads":32,"num_hidden_layers":16,"num_key_value_heads":8,
    "rope_theta":1000000.0,"tie_embedding":true,"torch_dtype":"bfloat16","vocab_size":65536})
}

fn read(config: &serde_json::Value) -> ModelSpec {
    from_hf(&config.to_string()).unwrap().1
}

#[test]
fn lfm2_1_2b_reads_as_its_card_says() {
    let s = read(&lfm2_1_2b());
    assert_eq!(
        (s.family, s.hidden, s.head_dim, s.kv_heads),
        ("lfm2", 2048, 64, 8)
    );
    // 2/3 of 12288, already a multiple of 256: llama.cpp's 1.2B size.
    assert_eq!(s.intermediate, 8192);
    assert_eq!((s.norms.eps, s.ropes[0].theta), (1e-5, 1e6));
    let conv = ShortConvSpec {
        channels: 2048,
        kernel: 3,
        bias: false,
    };
    assert_eq!(s.layers[0].mixer, Mixer::ShortConv(conv));
    assert!(s.layers.iter().all(|l| l.ffn == s.layers[0].ffn));
    assert!(matches!(s.layers[0].ffn, FeedForward::Gated(_)));
    let a = s.layers[2].attention().unwrap();
    assert!(a.qk_norm && !a.qk_norm_whole && a.window.is_none());
    assert_eq!(s.kv_groups()[0].layers, [2, 5, 8, 10, 12, 14]);
    assert_eq!(s.recurrent_layers(), [0, 1, 3, 4, 6, 7, 9, 11, 13, 15]);
}

#[test]
fn a_convolution_layer_s_state_is_its_last_two_inputs() {
    // What the plan counts per sequence slot: ten convolution layers, each
    // the last (3 - 1) inputs of 2048 channels, in f32; no scan state.
    let s = read(&lfm2_1_2b());
    assert_eq!(s.layers[0].state_values(), Some((2 * 2048, 0)));
    assert_eq!(s.state_bytes(), 10 * 4 * 2 * 2048);
    assert_eq!(s.layers[0].scan_chunk(), None);
    assert!(s.keeps_cache());
}

#[test]
fn the_feed_forward_width_is_adjusted_as_transformers_does() {
    for (patch, want) in [
        // 2/3 of 1000 is 666, rounded up to 256: 768.
        (json!({"block_ff_dim": 1000}), 768),
        (
            json!({"block_ff_dim": 1000, "block_ffn_dim_multiplier": 1.5}),
            1024,
        ),
        // No multiplier: no rounding either (`Lfm2MLP`).
        (
            json!({"block_ff_dim": 1000, "block_ffn_dim_multiplier": null}),
            666,
        ),
        (
            json!({"block_ff_dim": 1000, "block_auto_adjust_ff_dim": false}),
            1000,
        ),
    ] {
        let mut c = lfm2_1_2b();
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        assert_eq!(read(&c).intermediate, want, "{patch}");
    }
    // transformers' own saving has only `intermediate_size`.
    let mut c = lfm2_1_2b();
    c.as_object_mut().unwrap().remove("block_ff_dim");
    c["intermediate_size"] = json!(1000);
    assert_eq!(read(&c).intermediate, 768);
}

#[test]
fn full_attn_idxs_names_the_attention_layers_without_layer_types() {
    let mut c = lfm2_1_2b();
    let o = c.as_object_mut().unwrap();
    o.remove("layer_types");
    o.insert("num_hidden_layers".into(), json!(4));
    o.insert("full_attn_idxs".into(), json!([1, 3]));
    let s = read(&c);
    assert_eq!(s.recurrent_layers(), [0, 2]);
    // None given (or `null`, as transformers saves it): every layer attends.
    c["full_attn_idxs"] = json!(null);
    assert!(read(&c).recurrent_layers().is_empty());
    c["full_attn_idxs"] = json!([4]);
    let err = from_hf(&c.to_string()).unwrap_err().to_string();
    assert!(err.contains("full_attn_idxs names layer 4 of 4"), "{err}");
}

#[test]
fn unusable_convolutions_and_layer_kinds_are_refused() {
    for (key, value, want) in [
        ("conv_L_cache", json!(1), "unusable dimensions"),
        ("layer_types", json!(["conv", "mamba"]), "layer_types"),
    ] {
        let mut c = lfm2_1_2b();
        c[key] = value;
        let err = from_hf(&c.to_string()).unwrap_err().to_string();
        assert!(err.contains(want), "{key}: {err}");
    }
}
