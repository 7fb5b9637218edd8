//! Real configs (as on the Hugging Face Hub, vision and long factor lists
//! cut) read into descriptions.

use serde_json::json;

use super::from_hf;
use crate::spec::{Activation, FeedForward, Mixer, ModelSpec, RopeScaling};

/// A small Llama-shaped `config.json` of 8 layers, plus `extra` keys
/// (each with its leading comma): the families' own unit tests.
pub(super) fn eight_layers(extra: &str) -> crate::config::HfConfig {
    let text = format!(
        r#"{{"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 8, "vocab_size": 100,
            "max_position_embeddings": 256 {extra}}}"#
    );
    crate::config::HfConfig::parse(&text).unwrap()
}

fn read(config: serde_json::Value) -> ModelSpec {
    from_hf(&config.to_string()).unwrap().1
}

fn windows(s: &ModelSpec) -> Vec<Option<usize>> {
    s.layers
        .iter()
        .map(|l| l.attention().unwrap().window)
        .collect()
}

#[test]
fn llama_3_1_scales_its_rope_and_mistral_slides() {
    let llama = read(
        json!({"architectures":["LlamaForCausalLM"],"hidden_size":4096,
        "intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,
        "num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":131072,
        "rope_theta":500000.0,"rms_norm_eps":1e-5,"rope_scaling":{"factor":8.0,
        "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192,
        "rope_type":"llama3"}}),
    );
    assert_eq!(
        (llama.family, llama.head_dim, llama.kv_dim()),
        ("llama", 128, 1024)
    );
    let RopeScaling::Divisors(d) = &llama.ropes[0].scaling else {
        panic!("{:?}", llama.ropes[0]);
    };
    assert_eq!((d.len(), d[0]), (64, 1.0));
    assert!((d[63] - 8.0).abs() < 1e-4, "{}", d[63]);
    assert!(d.windows(2).all(|w| w[0] <= w[1] + 1e-6));
    assert_eq!(llama.kv_groups().len(), 1);

    let mistral = read(
        json!({"architectures":["MistralForCausalLM"],"hidden_size":4096,
        "intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,
        "num_key_value_heads":8,"vocab_size":32000,"max_position_embeddings":32768,
        "rope_theta":10000.0,"sliding_window":4096}),
    );
    assert_eq!(windows(&mistral), vec![Some(4096); 32]);
    let groups = mistral.kv_groups();
    assert_eq!(
        (groups.len(), groups[0].window, groups[0].layers.len()),
        (1, Some(4096), 32)
    );
}

#[test]
fn qwen3_has_qk_norms_its_own_head_dim_and_no_biases() {
    let q = read(
        json!({"architectures":["Qwen3ForCausalLM"],"hidden_size":4096,
        "intermediate_size":12288,"num_hidden_layers":36,"num_attention_heads":32,
        "num_key_value_heads":8,"head_dim":128,"vocab_size":151936,
        "max_position_embeddings":40960,"rope_theta":1000000.0,"rms_norm_eps":1e-6,
        "use_sliding_window":false,"sliding_window":null,"max_window_layers":36,
        "tie_word_embeddings":false}),
    );
    assert_eq!((q.family, q.head_dim, q.q_dim()), ("qwen3", 128, 4096));
    assert!(q.layers.iter().all(|l| l.attention().unwrap().qk_norm));
    assert!(!q.qkv_bias);
    assert_eq!(q.ropes[0].theta, 1e6);
    // Qwen2 with its window switched on slides from max_window_layers on.
    let q2 = read(
        json!({"architectures":["Qwen2ForCausalLM"],"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":4,"num_attention_heads":4,
        "num_key_value_heads":2,"vocab_size":100,"max_position_embeddings":256,
        "use_sliding_window":true,"sliding_window":16,"max_window_layers":2}),
    );
    assert_eq!(windows(&q2), [None, None, Some(16), Some(16)]);
    assert!(q2.qkv_bias && !q2.layers[0].attention().unwrap().qk_norm);
}

#[test]
fn embedding_gemma_attends_both_ways_within_half_its_window() {
    let g = read(
        json!({"architectures":["Gemma3TextModel"],"model_type":"gemma3_text",
        "hidden_size":768,"intermediate_size":1152,"num_hidden_layers":24,
        "num_attention_heads":3,"num_key_value_heads":1,"head_dim":256,
        "sliding_window":512,"use_bidirectional_attention":true}),
    );
    assert_eq!(g.family, "gemma3");
    assert!(!g.keeps_cache(), "an encoder: nothing cached");
    let seen: Vec<_> = (g.layers.iter())
        .map(|l| match &l.mixer {
            Mixer::Encoder(e) if !e.causal => e.attention.window,
            other => panic!("{other:?}"),
        })
        .collect();
    // transformers' `sliding_window // 2 + 1`: 256 positions each way.
    assert_eq!((seen[0], seen[5]), (Some(257), None));
    // Run pooled, it stays bidirectional.
    let pooled = g.pooled();
    assert!(matches!(&pooled.layers[0].mixer, Mixer::Encoder(e) if !e.causal));
}

#[test]
fn gemma_3_4b_reads_its_text_config_with_the_class_defaults() {
    let g = read(json!({"architectures":["Gemma3ForConditionalGeneration"],
        "model_type":"gemma3","torch_dtype":"bfloat16","text_config":{"hidden_size":2560,
        "intermediate_size":10240,"model_type":"gemma3_text","num_hidden_layers":34,
        "rope_scaling":{"factor":8.0,"rope_type":"linear"},"sliding_window":1024},
        "vision_config":{"hidden_size":1152}}));
    assert_eq!(g.family, "gemma3");
    assert_eq!(
        (g.heads, g.kv_heads, g.head_dim, g.vocab),
        (8, 4, 256, 262_208)
    );
    let w = windows(&g);
    assert_eq!(
        w.iter().filter(|w| w.is_none()).count(),
        5,
        "34 layers, one in 6 global"
    );
    assert_eq!((w[4], w[5], w[11]), (Some(1024), None, None));
    let (global, local) = (&g.ropes[0], &g.ropes[1]);
    assert_eq!(
        (global.theta, &global.scaling),
        (1e6, &RopeScaling::Linear(8.0))
    );
    assert_eq!((local.theta, &local.scaling), (1e4, &RopeScaling::None));
    assert_eq!(g.layers[0].attention().unwrap().rope, 1);
    assert_eq!(g.layers[5].attention().unwrap().rope, 0);
    assert_eq!(g.layers[0].attention().unwrap().scale, 1.0 / 16.0);
    assert!(
        g.layers[0].attention().unwrap().qk_norm
            && g.layers[0].attention().unwrap().softcap.is_none()
    );
    assert_eq!(g.embed_scale, Some((2560f64).sqrt() as f32));
    assert_eq!(
        (g.norms.offset, g.norms.post_attention, g.norms.post_ffn),
        (1.0, true, true)
    );
    assert_eq!(g.final_softcap, None);
    assert_eq!(g.layers[0].ffn, FeedForward::Gated(Activation::GeluTanh));
    let groups = g.kv_groups();
    assert_eq!(
        groups
            .iter()
            .map(|g| (g.window, g.layers.len()))
            .collect::<Vec<_>>(),
        [(None, 5), (Some(1024), 29)]
    );
}

#[test]
fn gemma_2_soft_caps_and_alternates() {
    let g = read(
        json!({"architectures":["Gemma2ForCausalLM"],"hidden_size":3584,
        "intermediate_size":14336,"num_hidden_layers":42,"num_attention_heads":16,
        "num_key_value_heads":8,"head_dim":256,"query_pre_attn_scalar":224,
        "sliding_window":4096,"attn_logit_softcapping":50.0,"final_logit_softcapping":30.0,
        "vocab_size":256000,"max_position_embeddings":8192}),
    );
    assert_eq!(&windows(&g)[..3], [Some(4096), None, Some(4096)]);
    let a = g.layers[0].attention().unwrap();
    assert_eq!(
        (a.softcap, a.scale),
        (Some(50.0), (224f64).powf(-0.5) as f32)
    );
    assert_eq!(g.final_softcap, Some(30.0));
    // `null` turns a cap off; leaving it out keeps the class default.
    let off = read(
        json!({"architectures":["Gemma2ForCausalLM"],"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"head_dim":16,
        "vocab_size":100,"max_position_embeddings":256,"final_logit_softcapping":null}),
    );
    assert_eq!(
        (
            off.final_softcap,
            off.layers[0].attention().unwrap().softcap
        ),
        (None, Some(50.0))
    );
}

#[test]
fn phi_4_mini_rotates_part_of_each_head_with_longrope() {
    let factors: Vec<f64> = (0..48).map(|i| 1.0 + f64::from(i) * 0.5).collect();
    let p = read(
        json!({"architectures":["Phi3ForCausalLM"],"hidden_size":3072,
        "intermediate_size":8192,"num_hidden_layers":32,"num_attention_heads":24,
        "num_key_value_heads":8,"vocab_size":200064,"max_position_embeddings":131072,
        "original_max_position_embeddings":4096,"partial_rotary_factor":0.75,
        "rope_theta":10000.0,"rope_scaling":{"type":"longrope","long_factor":factors,
        "short_factor":factors},"sliding_window":262144,"tie_word_embeddings":true}),
    );
    assert_eq!((p.head_dim, p.ropes[0].rotary_dim), (128, 96));
    let RopeScaling::LongRope {
        short,
        original,
        attention,
        ..
    } = &p.ropes[0].scaling
    else {
        panic!("{:?}", p.ropes[0].scaling);
    };
    assert_eq!((short.len(), *original), (48, 4096));
    let want = (1.0 + (32f64).ln() / (4096f64).ln()).sqrt() as f32;
    assert!((attention - want).abs() < 1e-6, "{attention} vs {want}");
    assert_eq!(
        windows(&p),
        vec![None; 32],
        "a window past the context is none"
    );
}

#[test]
fn transformers_5_rope_parameters_read_like_rope_scaling() {
    let g = read(
        json!({"architectures":["Gemma3ForCausalLM"],"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":6,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":32,"vocab_size":100,"max_position_embeddings":256,
        "sliding_window":8,"layer_types":["sliding_attention","full_attention","sliding_attention",
        "sliding_attention","full_attention","sliding_attention"],
        "rope_parameters":{"full_attention":{"rope_type":"linear","factor":2.0,
        "rope_theta":50000.0},"sliding_attention":{"rope_type":"default","rope_theta":1000.0}}}),
    );
    assert_eq!(
        windows(&g),
        [Some(8), None, Some(8), Some(8), None, Some(8)]
    );
    assert_eq!(
        (g.ropes[0].theta, &g.ropes[0].scaling),
        (50000.0, &RopeScaling::Linear(2.0))
    );
    assert_eq!(g.ropes[1].theta, 1000.0);
    let l = read(
        json!({"architectures":["LlamaForCausalLM"],"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "vocab_size":100,"max_position_embeddings":256,
        "rope_parameters":{"rope_type":"default","rope_theta":20000.0}}),
    );
    assert_eq!(
        (l.ropes[0].theta, &l.ropes[0].scaling),
        (20000.0, &RopeScaling::None)
    );
}

#[test]
fn unknown_families_and_bad_settings_are_named() {
    let base = json!({"architectures":["GPTNeoXForCausalLM"],"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "vocab_size":100,"max_position_embeddings":256});
    let err = from_hf(&base.to_string()).unwrap_err().to_string();
    assert!(
        err.contains("GPTNeoXForCausalLM") && err.contains("gemma3"),
        "{err}"
    );
    let cases = [
        (json!({"num_key_value_heads":3}), "kv heads"),
        (
            json!({"rope_scaling":{"rope_type":"yarn","factor":4.0}}),
            "yarn",
        ),
        (
            json!({"use_sliding_window":true,"sliding_window":8,"layer_types":["full_attention"]}),
            "layer_types",
        ),
        (
            json!({"rope_scaling":{"rope_type":"longrope","short_factor":[1.0],
            "long_factor":[1.0],"original_max_position_embeddings":64}}),
            "short_factor",
        ),
        (json!({"hidden_size":"wide"}), "hidden_size"),
        (
            json!({"num_hidden_layers": 4_000_000_000u64}),
            "layers is past",
        ),
    ];
    for (patch, want) in cases {
        let mut c = base.clone();
        c["architectures"] = json!(["Qwen2ForCausalLM"]);
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        let err = from_hf(&c.to_string()).unwrap_err().to_string();
        assert!(err.contains(want), "{want}: {err}");
    }
}

#[test]
fn an_unknown_architecture_lists_every_family_of_the_table() {
    let err = super::Family::by_gguf("gptneox").unwrap_err().to_string();
    let want = "unsupported architecture \"gptneox\" (supported: llama, mistral, mixtral, \
        qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, gemma4, phi3, gpt-oss, mamba2, granitehybrid, \
        qwen35, qwen3next, qwen35moe, smollm3, glm4moe, deepseek2, olmo2, mistral3, llama4, lfm2, nemotron_h, bert, \
        xlm-roberta, nomic-bert, modern-bert)";
    assert_eq!(err, want);
    let names: Vec<&str> = super::FAMILIES.iter().map(|f| f.name).collect();
    assert_eq!(super::SUPPORTED.to_vec(), names);
}

#[test]
fn the_mixtures_people_deploy_read_as_the_plan_counts_them() {
    use crate::spec::{MoeSpec, Routing};
    let q = read(
        json!({"architectures":["Qwen3MoeForCausalLM"],"attention_bias":false,
        "decoder_sparse_step":1,"head_dim":128,"hidden_size":2048,"intermediate_size":6144,
        "max_position_embeddings":40960,"max_window_layers":48,"mlp_only_layers":[],
        "model_type":"qwen3_moe","moe_intermediate_size":768,"norm_topk_prob":true,
        "num_attention_heads":32,"num_experts":128,"num_experts_per_tok":8,
        "num_hidden_layers":48,"num_key_value_heads":4,"rms_norm_eps":1e-06,
        "rope_scaling":null,"rope_theta":1000000.0,"sliding_window":null,
        "tie_word_embeddings":false,"use_sliding_window":false,"vocab_size":151936}),
    );
    let want = MoeSpec {
        experts: 128,
        top_k: 8,
        intermediate: 768,
        activation: Activation::Silu,
        routing: Routing::SoftmaxTopK { normalize: true },
        biases: false,
        shared: None,
        // Qwen's kind: a shared expert, where there is one, is gated.
        shared_gated: true,
        gated: true,
    };
    assert!(q.layers.iter().all(|l| l.moe() == Some(&want)));
    // ferrox-plan's table: 30,532,122,624 parameters, 3,353,032,704 active.
    let (all, active) = q.expert_params();
    assert_eq!(all - active, 30_532_122_624 - 3_353_032_704);
    assert!(q.sliding_windows().is_empty());

    let kinds: Vec<&str> = (0..24)
        .map(|i| ["sliding_attention", "full_attention"][i % 2])
        .collect();
    let g = read(
        json!({"architectures":["GptOssForCausalLM"],"attention_bias":true,
        "experts_per_token":4,"head_dim":64,"hidden_size":2880,"intermediate_size":2880,
        "layer_types":kinds,"max_position_embeddings":131072,"model_type":"gpt_oss",
        "num_attention_heads":64,"num_experts_per_tok":4,"num_hidden_layers":24,
        "num_key_value_heads":8,"num_local_experts":32,"rms_norm_eps":1e-05,
        "rope_scaling":{"beta_fast":32.0,"beta_slow":1.0,"factor":32.0,
        "original_max_position_embeddings":4096,"rope_type":"yarn","truncate":false},
        "rope_theta":150000,"sliding_window":128,"swiglu_limit":7.0,
        "tie_word_embeddings":false,"vocab_size":201088}),
    );
    let alternate: Vec<Option<usize>> = (0..24).map(|i| (i % 2 == 0).then_some(128)).collect();
    assert_eq!(windows(&g), alternate);
    assert!(g.qkv_bias && g.layers.iter().all(|l| l.attention().unwrap().sinks));
    let m = g.layers[0].moe().unwrap();
    assert_eq!((m.experts, m.top_k, m.intermediate), (32, 4, 2880));
    assert_eq!((m.routing, m.biases), (Routing::TopKSoftmax, true));
    assert_eq!(
        m.activation,
        Activation::SwigluOai {
            alpha: 1.702,
            limit: 7.0
        }
    );
    let RopeScaling::Yarn {
        divisors,
        attention,
    } = &g.ropes[0].scaling
    else {
        panic!("{:?}", g.ropes[0]);
    };
    // 0.1 ln 32 + 1; the fastest rotations kept, the slowest divided by 32.
    assert!((attention - 1.346_574).abs() < 1e-5, "{attention}");
    assert_eq!(divisors[0], 1.0);
    assert!((divisors[31] - 32.0).abs() < 1e-3, "{}", divisors[31]);
    // ferrox-plan's table: 20,914,757,184 parameters, 4,187,440,704 active.
    let (all, active) = g.expert_params();
    assert_eq!(all - active, 20_914_757_184 - 4_187_440_704);
    let sw = g.sliding_windows();
    assert_eq!((sw.len(), sw[0].window, sw[0].layers), (1, 128, 12));
}

#[test]
fn granite_4_h_mixes_mamba_and_nope_attention_with_its_multipliers() {
    // Granite-4.0-H-Micro's config, its layers cut to four.
    let config = json!({
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "hidden_size": 2048, "intermediate_size": 8192, "shared_intermediate_size": 8192,
        "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 100352, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "num_local_experts": 0, "position_embedding_type": "nope",
        "layer_types": ["mamba", "attention", "mamba", "mamba"],
        "mamba_n_heads": 64, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.0078125, "logits_scaling": 8.0
    });
    let g = read(config);
    let kinds: Vec<bool> = g.layers.iter().map(|l| l.ssm().is_some()).collect();
    assert_eq!(kinds, [true, false, true, true]);
    let a = g.layers[1].attention().unwrap();
    assert!(a.nope && a.scale == 0.0078125);
    assert_eq!(g.layers[0].ffn, FeedForward::Gated(Activation::Silu));
    assert_eq!(g.intermediate, 8192);
    assert_eq!(
        (g.embed_scale, g.residual_scale, g.logit_scale),
        (Some(12.0), Some(0.22), Some(0.125))
    );
    let s = g.layers[0].ssm().unwrap();
    assert_eq!((s.heads, s.head_dim, s.state, s.groups), (64, 64, 128, 1));
    // Only the attention layer keeps KV; each Mamba layer a state of
    // 3 * (4096 + 256) + 64 * 64 * 128 f32 values.
    assert_eq!(g.kv_groups()[0].layers, [1]);
    assert_eq!(g.state_bytes(), 3 * 4 * (3 * 4352 + 64 * 64 * 128));
}

#[test]
fn qwen3_5_mixes_gated_delta_net_and_gated_attention() {
    // Qwen3.5-9B's multimodal config (vision cut), its layers cut to eight.
    let config = json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": 4096, "intermediate_size": 12288,
            "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
            "head_dim": 256, "vocab_size": 248320, "max_position_embeddings": 262144,
            "rms_norm_eps": 1e-6, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}
        },
        "vision_config": {"hidden_size": 1152}
    });
    let s = read(config.clone());
    assert_eq!(s.family, "qwen35");
    let linear: Vec<bool> = s.layers.iter().map(|l| l.gdn().is_some()).collect();
    assert_eq!(linear, [true, true, true, false, true, true, true, false]);
    let a = s.layers[3].attention().unwrap();
    assert!(a.gated && a.qk_norm && !a.nope);
    assert_eq!((s.ropes[0].rotary_dim, s.ropes[0].theta), (64, 1e7));
    assert_eq!(s.norms.offset, 1.0, "(1 + w) norms");
    let g = s.layers[0].gdn().unwrap();
    assert_eq!(
        (g.key_heads, g.value_heads, g.key_dim, g.value_dim),
        (16, 32, 128, 128)
    );
    // KV for the two attention layers only; each DeltaNet layer a state of
    // 3 * (2 * 2048 + 4096) + 32 * 128 * 128 f32 values.
    assert_eq!(s.kv_groups()[0].layers, [3, 7]);
    assert_eq!(s.recurrent_layers(), [0, 1, 2, 4, 5, 6]);
    assert_eq!(s.state_bytes(), 6 * 4 * (3 * 8192 + 32 * 128 * 128));
    let bad = |key: &str, value: serde_json::Value| {
        let mut c = config.clone();
        c["text_config"][key] = value;
        from_hf(&c.to_string()).unwrap_err().to_string()
    };
    let err = bad("linear_num_value_heads", json!(24));
    assert!(
        err.contains("24 linear-attention value heads not a multiple of 16"),
        "{err}"
    );
    let err = bad("linear_key_head_dim", json!(0));
    assert!(err.contains("unusable dimensions"), "{err}");
    let err = bad("full_attention_interval", json!(0));
    assert!(err.contains("full_attention_interval"), "{err}");
    let err = bad("layer_types", json!(["linear_attention", "mamba"]));
    assert!(err.contains("layer_types"), "{err}");
    let err = bad("attention_bias", json!(true));
    assert!(err.contains("attention_bias"), "{err}");
}

#[test]
fn qwen3_next_has_experts_and_a_quarter_rotary_by_default() {
    // Qwen3-Next-80B-A3B's config, its layers cut to four.
    let mut config = json!({
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 4,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "vocab_size": 151936, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_theta": 10000000,
        "partial_rotary_factor": 0.25
    });
    let s = read(config.clone());
    assert_eq!(s.family, "qwen3next");
    let m = s.layers[0].moe().unwrap();
    assert_eq!((m.experts, m.top_k, m.shared), (512, 10, Some(512)));
    assert!(s.layers[3].attention().unwrap().gated);
    assert_eq!(s.ropes[0].rotary_dim, 64);
    config
        .as_object_mut()
        .unwrap()
        .remove("partial_rotary_factor");
    assert_eq!(
        read(config).ropes[0].rotary_dim,
        64,
        "transformers' default"
    );
}

/// GLM-4.5-Air's published config: a dense first layer, 128 routed experts
/// behind the sigmoid router, an ungated shared expert, half of each head
/// rotating, q/k/v biases.
#[test]
fn glm_4_5_air_reads_as_its_card_says() {
    let s = read(
        json!({"architectures":["Glm4MoeForCausalLM"],"attention_bias":true,"head_dim":128,
        "first_k_dense_replace":1,"hidden_size":4096,"intermediate_size":10944,
        "max_position_embeddings":131072,"model_type":"glm4_moe","moe_intermediate_size":1408,
        "n_group":1,"n_routed_experts":128,"n_shared_experts":1,"norm_topk_prob":true,
        "num_attention_heads":96,"num_experts_per_tok":8,"num_hidden_layers":46,
        "num_key_value_heads":8,"num_nextn_predict_layers":1,"partial_rotary_factor":0.5,
        "rms_norm_eps":1e-05,"rope_theta":1000000,"routed_scaling_factor":1.0,"topk_group":1,
        "tie_word_embeddings":false,"use_qk_norm":false,"vocab_size":151552}),
    );
    assert_eq!(s.layers.len(), 46);
    assert!(s.layers[0].moe().is_none(), "the first layer is dense");
    let m = s.layers[1].moe().unwrap();
    assert!(s.layers[1..].iter().all(|l| l.moe() == Some(m)));
    assert_eq!((m.experts, m.top_k, m.intermediate), (128, 8, 1408));
    assert_eq!((m.shared, m.shared_gated), (Some(1408), false));
    let groups = crate::spec::Routing::SigmoidGroups {
        groups: 1,
        topk_groups: 1,
        normalize: true,
        scale: 1.0,
    };
    assert_eq!(m.routing, groups);
    assert_eq!(s.ropes[0].rotary_dim, 64);
    assert!(s.qkv_bias && !s.layers[0].attention().unwrap().qk_norm);
    // 45 layers of 120 experts a token does not run, 3 x 4096 x 1408 each.
    let (all, active) = s.expert_params();
    assert_eq!(all - active, 45 * 120 * 3 * 4096 * 1408);
}
