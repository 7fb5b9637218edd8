use super::*;
use crate::fixtures::Pools;

const GIB: u64 = 1 << 30;

pub(crate) fn smollm2_135m() -> ModelGeometry {
    ModelGeometry {
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        kv_dtype: KvDtype::F32,
        weight_bytes: 100_000_000,
        context_length: 8192,
        ..ModelGeometry::default()
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
        ..ModelGeometry::default()
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
        ..ModelGeometry::default()
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
        // The figures above use the fixed 512 MiB + 256 MiB reserves.
        let config = PlanConfig {
            activation_reserve_bytes: Some(512 << 20),
            overhead_bytes: 256 << 20,
            ..c.config
        };
        let p = plan(&c.geometry, &config).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(p.kv_blocks(), c.kv_blocks, "{}", c.name);
        assert_eq!(p.max_seqs, c.max_seqs, "{}", c.name);
        assert_eq!(
            p.kv_budget_bytes,
            p.kv_blocks() * p.block_bytes(),
            "{}",
            c.name
        );
        // One full-length sequence always fits in an accepted plan.
        assert!(
            p.kv_blocks() >= blocks_for(p.max_model_len, p.block_size),
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
    let err = plan_for_blocks(&smollm2_135m(), &config, 63).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a pool of 63 blocks of 16 tokens holds 1008 tokens, less than one 1024-token sequence"
    );
    let ok = plan_for_blocks(&smollm2_135m(), &config, 64).unwrap();
    assert_eq!((ok.kv_blocks(), ok.max_seqs), (64, 1));
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

#[test]
fn refusal_names_every_number() {
    let config = PlanConfig {
        memory_bytes: 24 * GIB,
        activation_reserve_bytes: Some(1000),
        overhead_bytes: 24,
        ..PlanConfig::default()
    };
    let msg = plan(&llama_70b(), &config).unwrap_err().to_string();
    for part in [
        "25769803776 bytes x 0.9 utilization = 23192823398 usable",
        "weights take 141107412992",
        "activations, runtime and adapters 1024",
        "leaving 0 for KV",
        "one 131072-token sequence needs 42949672960 bytes of KV",
    ] {
        assert!(msg.contains(part), "{msg} lacks {part}");
    }
}

#[test]
fn explicit_blocks_must_fit_the_memory_there_is() {
    let g = smollm2_135m();
    let base = PlanConfig {
        max_model_len: Some(1024),
        activation_reserve_bytes: Some(1 << 20),
        overhead_bytes: 1 << 20,
        ..PlanConfig::default()
    };
    let p = plan_for_blocks(&g, &base, 100).unwrap();
    assert_eq!(p.total_bytes(), 100_000_000 + 100 * 16 * 46_080 + (2 << 20));
    let exact = PlanConfig {
        memory_bytes: p.total_bytes(),
        ..base.clone()
    };
    assert_eq!(plan_for_blocks(&g, &exact, 100), Ok(p.clone()));
    let short = PlanConfig {
        memory_bytes: p.total_bytes() - 1,
        ..base
    };
    let msg = plan_for_blocks(&g, &short, 100).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("the plan needs {} bytes", p.total_bytes())),
        "{msg}"
    );
    assert!(msg.contains("KV 73728000"), "{msg}");
}

#[test]
fn estimated_reserve_follows_the_step_shape() {
    let g = ModelGeometry {
        heads: 32,
        hidden_size: 4096,
        intermediate_size: 14_336,
        vocab_size: 128_256,
        ..llama_8b()
    };
    let config = PlanConfig {
        memory_bytes: 80 * GIB,
        max_seqs_cap: Some(64),
        ..PlanConfig::for_device(DeviceKind::Cuda)
    };
    // 576 tokens x (4*4096 + 3*14336 + 48*128) x 2 bytes + 2 x 64 rows x vocab x 4.
    let want = 576 * 65_536 * 2 + 2 * 64 * 128_256 * 4;
    assert_eq!(config.activation_reserve(&g), want);
    let p = plan(&g, &config).unwrap();
    assert_eq!(p.activation_reserve_bytes, want);
    assert_eq!(p.overhead_bytes, DeviceKind::Cuda.runtime_overhead_bytes());
    let usable = (80.0 * GIB as f64 * 0.9).floor() as u64;
    let left = usable - g.weight_bytes - want - p.overhead_bytes;
    assert_eq!(p.kv_blocks(), left / (16 * 128 * 1024));
    assert!(p.total_bytes() <= usable);
    // Speculating, each row's drafts are logit rows too, at most the
    // chunk's budget: 64 rows x 5 drafts = 320 more; x 16 is capped at 512.
    for (k, more) in [(5, 320), (16, 512)] {
        let spec = PlanConfig {
            speculative_tokens: k,
            ..config.clone()
        };
        assert_eq!(
            spec.activation_reserve(&g),
            want + 2 * more * 128_256 * 4,
            "{k}"
        );
    }
    // A CPU plan computes activations in f32.
    let cpu = PlanConfig::for_device(DeviceKind::Cpu);
    assert_eq!(cpu.activation_elem_bytes, 4);
    assert_eq!(
        PlanConfig {
            activation_reserve_bytes: Some(7),
            ..cpu
        }
        .activation_reserve(&g),
        7
    );
}

#[test]
fn kv_dtype_names_round_trip() {
    for d in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Fp8] {
        assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
        assert_eq!(d.to_string(), d.name());
        // JSON (the CRD, `inspect --json`) spells it as the flag does.
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{}\"", d.name()));
        assert_eq!(serde_json::from_str::<KvDtype>(&json).unwrap(), d);
    }
    assert!("f8".parse::<KvDtype>().unwrap_err().contains("f16"));
}

#[test]
fn unknown_counts_are_absent_on_the_wire_and_read_back_as_zero() {
    // The operator's CRD writes this form; an unknown count stays absent.
    let g = smollm2_135m();
    let json = serde_json::to_value(&g).unwrap();
    let mut fields: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "contextLength",
            "headDim",
            "kvDtype",
            "kvHeads",
            "layers",
            "weightBytes"
        ]
    );
    assert_eq!(serde_json::from_value::<ModelGeometry>(json).unwrap(), g);
}

#[test]
fn the_default_pool_fits_max_seqs_in_free_memory_and_takes_a_reserved_budget() {
    // SmolLM2-135M in f16 (23,040 bytes a token; 368,640 a block), 8,192
    // tokens a sequence (512 blocks), on CPU: the server's defaults.
    let geometry = ModelGeometry {
        kv_dtype: KvDtype::F16,
        ..smollm2_135m()
    };
    let at = |memory_bytes, utilization, cap: Option<u64>, typical| PlanConfig {
        memory_bytes,
        utilization,
        max_seqs_cap: cap,
        typical_seq_len: typical,
        ..PlanConfig::default()
    };
    let budget = |c: &PlanConfig| plan(&geometry, c).unwrap().kv_blocks();
    let cpu = DeviceKind::Cpu.default_max_seqs();
    // (readings, kind, config, want blocks or None = the whole budget, max_seqs, rule)
    let free_24g = at(24 * GIB, 0.9, Some(cpu), Some(DEFAULT_TYPICAL_SEQ_LEN));
    let free_2g = at(2 * GIB, 0.9, Some(cpu), None);
    let free_1_seq = at(24 * GIB, 0.9, Some(1), None);
    let cgroup_8g = at(8 * GIB, 0.9, Some(cpu), Some(DEFAULT_TYPICAL_SEQ_LEN));
    let cuda_free = PlanConfig {
        activation_elem_bytes: 2,
        overhead_bytes: DeviceKind::Cuda.runtime_overhead_bytes(),
        ..at(80 * GIB, 0.9, Some(256), Some(DEFAULT_TYPICAL_SEQ_LEN))
    };
    use MemoryKind::*;
    use SizingRule::*;
    let cases = [
        // meminfo: 16 x 512 blocks + 25% = 10,240, well under the budget.
        (
            "meminfo 24 GiB",
            &free_24g,
            Free,
            Some(10_240),
            16,
            MaxSeqsFit,
        ),
        // One sequence: 512 + 128.
        (
            "meminfo, 1 seq",
            &free_1_seq,
            Free,
            Some(640),
            1,
            MaxSeqsFit,
        ),
        // Little free memory: the utilization's budget is the bound.
        ("meminfo 2 GiB", &free_2g, Free, None, 9, MemoryBudget),
        // A cgroup v2 limit or a GPU's free memory: the whole budget.
        (
            "cgroup-v2 8 GiB",
            &cgroup_8g,
            Reserved,
            None,
            16,
            MemoryBudget,
        ),
        ("cuda 80 GiB", &cuda_free, Reserved, None, 256, MemoryBudget),
    ];
    for (name, config, kind, want, max_seqs, rule) in cases {
        let (p, got_rule) = plan_default(&geometry, config, kind).unwrap();
        let want = want.unwrap_or_else(|| budget(config));
        assert_eq!(
            (p.kv_blocks(), p.max_seqs, got_rule),
            (want, max_seqs, rule),
            "{name}"
        );
        assert!(p.kv_blocks() <= budget(config), "{name}: over the budget");
        assert_eq!(p.kv_budget_bytes, p.kv_blocks() * 368_640, "{name}");
    }
    // The fit is the budget's when the budget is smaller: never more than
    // utilization allows.
    assert!(budget(&free_2g) < 10_240);
    assert_eq!(SizingRule::MaxSeqsFit.name(), "max-seqs-fit");
    assert_eq!(SizingRule::MemoryBudget.name(), "memory-budget");
    // Too little memory for one sequence is refused either way.
    let tiny = at(100 << 20, 0.9, Some(cpu), None);
    for kind in [Free, Reserved] {
        let e = plan_default(&geometry, &tiny, kind).unwrap_err();
        assert!(matches!(e, PlanError::InsufficientMemory { .. }), "{e}");
    }
}

#[test]
fn fit_blocks_adds_a_quarter_rounded_up() {
    for (seqs, len, block, want) in [
        (16, 8192, 16, 10_240),
        (1, 16, 16, 2),
        (3, 100, 16, 27), // 3 x 7 = 21, + 6
        (0, 16, 16, 2),   // at least one sequence
    ] {
        assert_eq!(fit_blocks(seqs, len, block), want, "{seqs} {len} {block}");
    }
}

/// DeepSeek-V3: 61 layers of latent attention, each caching 512 + 64 = 576
/// elements a token, against 128 heads x (192 + 128) of K and V had it
/// cached per head (40,960 a layer).
fn deepseek_v3(latent: bool) -> ModelGeometry {
    ModelGeometry {
        layers: 61,
        heads: 128,
        kv_heads: 128,
        head_dim: 160,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 8 * 80 * GIB,
        context_length: 131_072,
        kv_latent_dim: if latent { 576 } else { 0 },
        ..ModelGeometry::default()
    }
}

#[test]
fn latent_attention_is_planned_at_its_latent_width_in_the_full_pool() {
    let latent = deepseek_v3(true);
    // 61 x 576 x 2 bytes a token.
    assert_eq!(latent.kv_bytes_per_token(), 61 * 576 * 2);
    let groups = latent.cache_groups();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].kind(), CacheKind::Full);
    let spec = CacheSpec::Latent {
        width: 576,
        dtype: KvDtype::Bf16,
    };
    assert_eq!(groups[0].spec, spec);
    // Eight 141 GiB GPUs at 128k: the plan's pool counts the latent bytes
    // (to the byte; the aim is within 1%); planned per head, one 128k
    // sequence needs 610 GiB of KV and the model is refused.
    let config = PlanConfig {
        memory_bytes: 8 * 141 * GIB,
        max_seqs_cap: Some(256),
        ..PlanConfig::default()
    };
    let p = plan(&latent, &config).unwrap();
    assert_eq!(p.block_bytes(), p.block_size * 61 * 576 * 2);
    let refused = plan(&deepseek_v3(false), &config).unwrap_err();
    assert!(
        matches!(refused, PlanError::InsufficientMemory { .. }),
        "{refused}"
    );
    // At 16k both fit, and the same memory holds 40,960 / 576 (71x) as
    // many tokens latent.
    let short = |latent| ModelGeometry {
        context_length: 16_384,
        ..deepseek_v3(latent)
    };
    let (p, per_head) = (
        plan(&short(true), &config).unwrap(),
        plan(&short(false), &config).unwrap(),
    );
    assert_eq!(per_head.block_bytes(), p.block_size * 61 * 40_960 * 2);
    let ratio = p.kv_blocks() as f64 / per_head.kv_blocks() as f64;
    assert!((ratio / (40_960.0 / 576.0) - 1.0).abs() < 0.01, "{ratio}");
    // On the wire: a count, absent when zero.
    let json = serde_json::to_value(&latent).unwrap();
    assert_eq!(json["kvLatentDim"], 576);
    assert!(
        serde_json::to_value(deepseek_v3(false))
            .unwrap()
            .get("kvLatentDim")
            .is_none()
    );
}

mod gemma4;
