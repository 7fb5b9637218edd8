use super::*;

const GIB: u64 = 1 << 30;

fn smollm2_135m() -> ModelGeometry {
    ModelGeometry {
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        kv_dtype: KvDtype::F32,
        weight_bytes: 100_000_000,
        context_length: 8192,
    }
}

fn llama_8b() -> ModelGeometry {
    ModelGeometry {
        layers: 32,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype: KvDtype::F16,
        weight_bytes: 16_060_522_496,
        context_length: 131_072,
    }
}

fn llama_70b() -> ModelGeometry {
    ModelGeometry {
        layers: 80,
        kv_heads: 8,
        head_dim: 128,
        kv_dtype: KvDtype::F16,
        weight_bytes: 141_107_412_992,
        context_length: 131_072,
    }
}

#[test]
fn kv_bytes_per_token_follows_the_formula() {
    let cases = [
        (smollm2_135m(), 2 * 30 * 3 * 64 * 4),
        (llama_8b(), 128 * 1024),
        (llama_70b(), 320 * 1024),
    ];
    for (g, want) in cases {
        assert_eq!(g.kv_bytes_per_token(), want, "{g:?}");
    }
}

#[test]
fn plans_for_real_models() {
    struct Case {
        name: &'static str,
        geometry: ModelGeometry,
        config: PlanConfig,
        kv_blocks: u64,
        max_seqs: u64,
    }
    let cases = [
        Case {
            // CPU pod with 2 GiB: floor((2 GiB * 0.9 - 100 MB - 768 MiB) / (16 * 46080)).
            name: "smollm2-135m on a 2 GiB CPU pod",
            geometry: smollm2_135m(),
            config: PlanConfig {
                memory_bytes: 2 * GIB,
                max_model_len: Some(2048),
                ..PlanConfig::default()
            },
            kv_blocks: 1393,
            max_seqs: 10,
        },
        Case {
            name: "llama-3.1-8b on one 80 GiB GPU, full context",
            geometry: llama_8b(),
            config: PlanConfig {
                memory_bytes: 80 * GIB,
                ..PlanConfig::default()
            },
            kv_blocks: 28_821,
            max_seqs: 3,
        },
        Case {
            name: "llama-3.1-8b on one 80 GiB GPU, 8k context, typical 2k",
            geometry: llama_8b(),
            config: PlanConfig {
                memory_bytes: 80 * GIB,
                max_model_len: Some(8192),
                typical_seq_len: Some(2048),
                ..PlanConfig::default()
            },
            kv_blocks: 28_821,
            max_seqs: 225,
        },
        Case {
            name: "70b across 4 x 80 GiB, capped",
            geometry: llama_70b(),
            config: PlanConfig {
                memory_bytes: 4 * 80 * GIB,
                max_model_len: Some(8192),
                max_seqs_cap: Some(64),
                ..PlanConfig::default()
            },
            kv_blocks: 31_914,
            max_seqs: 62,
        },
    ];
    for c in cases {
        let p = plan(&c.geometry, &c.config).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(p.kv_blocks, c.kv_blocks, "{}", c.name);
        assert_eq!(p.max_seqs, c.max_seqs, "{}", c.name);
        assert_eq!(p.kv_budget_bytes, p.kv_blocks * p.block_bytes, "{}", c.name);
        // One full-length sequence always fits in an accepted plan.
        assert!(
            p.kv_blocks >= blocks_for(p.max_model_len, p.block_size),
            "{}",
            c.name
        );
    }
}

#[test]
fn seventy_b_on_one_24_gib_gpu_is_refused_with_numbers() {
    let config = PlanConfig {
        memory_bytes: 24 * GIB,
        ..PlanConfig::default()
    };
    let err = plan(&llama_70b(), &config).unwrap_err();
    match &err {
        PlanError::InsufficientMemory {
            weight_bytes,
            kv_per_seq_bytes,
            available_bytes,
            ..
        } => {
            assert_eq!(*weight_bytes, 141_107_412_992);
            assert_eq!(*kv_per_seq_bytes, 131_072 * 320 * 1024);
            assert_eq!(*available_bytes, 0);
        }
        other => panic!("wrong error {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("141107412992"), "{msg}");
    assert!(msg.contains("insufficient memory"), "{msg}");
}

#[test]
fn too_few_blocks_for_one_sequence_is_refused() {
    let config = PlanConfig {
        max_model_len: Some(1024),
        ..PlanConfig::default()
    };
    assert!(matches!(
        plan_for_blocks(&smollm2_135m(), &config, 63),
        Err(PlanError::InsufficientMemory { .. })
    ));
    let ok = plan_for_blocks(&smollm2_135m(), &config, 64).unwrap();
    assert_eq!((ok.kv_blocks, ok.max_seqs), (64, 1));
}

#[test]
fn invalid_inputs_are_named() {
    let g = smollm2_135m();
    let cases: [(PlanConfig, &str); 4] = [
        (
            PlanConfig {
                utilization: 0.0,
                ..PlanConfig::default()
            },
            "memoryUtilization",
        ),
        (
            PlanConfig {
                utilization: 1.5,
                ..PlanConfig::default()
            },
            "memoryUtilization",
        ),
        (
            PlanConfig {
                block_size: 0,
                ..PlanConfig::default()
            },
            "blockSize",
        ),
        (
            PlanConfig {
                max_model_len: Some(9000),
                ..PlanConfig::default()
            },
            "exceeds",
        ),
    ];
    for (config, needle) in cases {
        let err = plan(
            &g,
            &PlanConfig {
                memory_bytes: 8 * GIB,
                ..config
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains(needle), "{err} lacks {needle}");
    }
}

#[test]
fn blocks_round_up() {
    for (tokens, bs, want) in [
        (0, 16, 0),
        (1, 16, 1),
        (16, 16, 1),
        (17, 16, 2),
        (100, 1, 100),
    ] {
        assert_eq!(blocks_for(tokens, bs), want);
    }
}
