//! Gemma 4 configs shaped as the Hub's (E4B, 31B) read into descriptions:
//! the heads of the full layers, shared KV, the proportional RoPE, the
//! per-layer inputs; and what is refused.

use candle_core::Device;
use ferrox_core::Pool;
use ferrox_plan::{CacheKind, KvDtype};
use serde_json::{Value, json};

use crate::arch::from_hf;
use crate::kv_store::KvStore;
use crate::spec::{HeadShape, ModelSpec, RopeScaling};

/// Five sliding layers, then a full one, over `layers`.
fn pattern(layers: usize) -> Vec<&'static str> {
    (0..layers)
        .map(|i| match (i + 1) % 6 {
            0 => "full_attention",
            _ => "sliding_attention",
        })
        .collect()
}

/// Gemma 4 E4B's shape: 42 layers, the last 18 reading earlier layers'
/// KV, per-layer inputs 256 wide.
fn e4b() -> Value {
    json!({"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 42,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "global_head_dim": 512, "vocab_size": 262144, "max_position_embeddings": 131072,
        "sliding_window": 512, "layer_types": pattern(42), "num_kv_shared_layers": 18,
        "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144,
        "final_logit_softcapping": 30.0, "attention_k_eq_v": false,
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})
}

/// Gemma 4 31B's shape: 60 layers, full ones of 4 KV heads 512 wide whose
/// values are their keys' projection.
fn b31() -> Value {
    json!({"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
        "text_config": {"model_type": "gemma4_text", "hidden_size": 5376,
        "intermediate_size": 21504, "num_hidden_layers": 60, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 256, "global_head_dim": 512,
        "num_global_key_value_heads": 4, "attention_k_eq_v": true, "vocab_size": 262144,
        "max_position_embeddings": 262144, "sliding_window": 1024,
        "layer_types": pattern(60), "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 30.0}})
}

fn read(config: &Value) -> crate::Result<ModelSpec> {
    from_hf(&config.to_string()).map(|(_, s)| s)
}

#[test]
fn e4b_keeps_kv_in_its_first_24_layers_only() {
    let s = read(&e4b()).unwrap();
    assert_eq!(s.family, "gemma4");
    assert_eq!(s.kv_shared_layers(), 18);
    let groups = s.kv_groups();
    let kinds: Vec<(Option<usize>, usize)> =
        groups.iter().map(|g| (g.window, g.layers.len())).collect();
    // Of layers 0..24: 5, 11, 17 and 23 are full.
    assert_eq!(kinds, [(None, 4), (Some(512), 20)]);
    assert!(groups.iter().all(|g| g.layers.iter().all(|&l| l < 24)));
    assert_eq!(s.group_kv_dims(), [2 * 512, 2 * 256]);
    // Each shared layer reads the last earlier layer of its kind.
    let source = |i: usize| s.layers[i].attention().unwrap().kv.shared_from;
    assert_eq!(
        (source(23), source(24), source(29), source(41)),
        (None, Some(22), Some(23), Some(23))
    );
    // K and V of the producing layers alone.
    assert_eq!(s.kv_values_per_token(), 2 * (4 * 1024 + 20 * 512));
    // Only the rows whose logits are wanted run through layers 24 to 41.
    assert_eq!(s.kv_shared_tail(), Some(24));
    assert_eq!(read(&b31()).unwrap().kv_shared_tail(), None);
    let p = s.per_layer_input.unwrap();
    assert_eq!((p.width, p.vocab), (256, 262_144));
    assert!(s.layer_out_scale && s.ffn_widths.is_empty());
    assert_eq!(s.final_softcap, Some(30.0));
}

#[test]
fn b31_s_full_layers_have_heads_of_their_own_and_values_from_keys() {
    let s = read(&b31()).unwrap();
    let full = HeadShape {
        kv_heads: 4,
        head_dim: 512,
    };
    assert_eq!(s.full_head_shape(), Some(full));
    assert_eq!((s.kv_heads, s.head_dim, s.kv_shared_layers()), (16, 256, 0));
    assert_eq!(s.group_kv_dims(), [4 * 512, 16 * 256]);
    for (i, l) in s.layers.iter().enumerate() {
        let a = l.attention().unwrap();
        let is_full = (i + 1) % 6 == 0;
        assert_eq!(a.window.is_none(), is_full, "layer {i}");
        assert_eq!(a.kv.values_from_keys, is_full, "layer {i}");
        assert_eq!(a.kv.shape, is_full.then_some(full), "layer {i}");
        assert!(a.kv.v_norm && a.scale == 1.0 && a.qk_norm);
    }
    assert!(s.per_layer_input.is_none());
    // The full layers' RoPE: 64 of the 256 frequencies of a 512-wide head
    // turn, over the head's width; the rest stand still.
    let rope = &s.ropes[0];
    assert_eq!((rope.rotary_dim, rope.theta), (512, 1_000_000.0));
    let RopeScaling::Divisors(d) = &rope.scaling else {
        panic!("{rope:?}");
    };
    assert_eq!(d.len(), 256);
    assert!(d[..64].iter().all(|&x| x == 1.0) && d[64..].iter().all(|x| x.is_infinite()));
    assert_eq!((s.ropes[1].rotary_dim, s.ropes[1].theta), (256, 10_000.0));
}

#[test]
fn a_saved_config_s_per_layer_heads_read_as_the_original_keys() {
    let mut saved = b31();
    let text = saved["text_config"].as_object_mut().unwrap();
    text.remove("global_head_dim");
    text.remove("num_global_key_value_heads");
    let per: serde_json::Map<String, Value> = (0..60)
        .filter(|i| (i + 1) % 6 == 0)
        .map(|i| {
            (
                i.to_string(),
                json!({"head_dim": 512, "num_key_value_heads": 4}),
            )
        })
        .collect();
    text.insert("per_layer_config".into(), Value::Object(per));
    assert_eq!(read(&saved).unwrap(), read(&b31()).unwrap());
}

#[test]
fn what_gemma_4_cannot_be_is_refused_by_name() {
    let with = |key: &str, v: Value| {
        let mut c = e4b();
        c[key] = v;
        c
    };
    let cases = [
        (with("enable_moe_block", json!(true)), "num_experts"),
        // A window as long as the context never slides: its layers would
        // join the full layers, of another shape.
        (
            with("sliding_window", json!(131_072)),
            "heads of several shapes",
        ),
        (
            with("num_kv_shared_layers", json!(42)),
            "leaves none to keep KV",
        ),
        (
            with(
                "rope_parameters",
                json!({"full_attention": {"rope_type": "yarn"}}),
            ),
            "full-attention RoPE",
        ),
    ];
    for (config, want) in cases {
        let err = read(&config).unwrap_err().to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
    let family = crate::arch::Family::by_gguf("gemma4").unwrap();
    let mut md = std::collections::HashMap::new();
    md.insert(
        "gemma4.block_count".to_string(),
        candle_core::quantized::gguf_file::Value::U32(4),
    );
    let m = crate::config::Metadata {
        md: &md,
        arch: "gemma4",
    };
    let refused = (family.from_gguf)(&m).unwrap_err().to_string();
    assert!(refused.contains("sliding_window_pattern"), "{refused}");
}

#[test]
fn a_layer_may_read_only_an_earlier_layer_of_its_kind_that_keeps_kv() {
    let s = read(&e4b()).unwrap();
    for (layer, from, want) in [
        (30, 35, "not an earlier layer that keeps its own"),
        (30, 30, "not an earlier layer that keeps its own"),
        (30, 26, "not an earlier layer that keeps its own"),
        (30, 5, "of another kind"),
    ] {
        let mut bad = s.clone();
        let crate::spec::Mixer::Attention(a) = &mut bad.layers[layer].mixer else {
            unreachable!()
        };
        a.kv.shared_from = Some(from);
        let err = bad.finish().unwrap_err().to_string();
        assert!(err.contains(want), "{layer} <- {from}: {err}");
    }
}

#[test]
fn a_shared_kv_layer_allocates_nothing() {
    let s = read(&e4b()).unwrap();
    let groups = s.kv_groups();
    let pools = [
        Pool {
            kind: CacheKind::Full,
            blocks: 3,
        },
        Pool {
            kind: CacheKind::Window(512),
            blocks: 5,
        },
    ];
    let dims = s.group_kv_dims();
    let shape = (4, dims.as_slice(), true);
    let kv = KvStore::with_widths(&groups, 42, &pools, shape, KvDtype::F32, &Device::Cpu);
    let kv = kv.unwrap();
    // 4 full layers of 3 blocks of 4 tokens x 1024, 20 sliding of 5 x 512,
    // K and V, f32: nothing for the 18 that share.
    let want = 2 * 4 * (4 * 3 * 4 * 1024 + 20 * 5 * 4 * 512);
    let bytes: u64 = (0..kv.groups()).map(|g| kv.cache(g).bytes()).sum();
    assert_eq!(bytes, want as u64);
    assert!(kv.group_of(24).is_err() && kv.group_of(23).is_ok());
}
