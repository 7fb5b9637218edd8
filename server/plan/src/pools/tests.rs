//! The window-aware plan on real models' geometry, with the arithmetic.

use crate::fixtures::Pools;
use crate::*;

const GIB: u64 = 1 << 30;

/// A bf16 geometry: (layers, KV heads, head dim, context, windows, weights).
/// Weights are the text model's parameters x 2 bytes, rounded.
fn bf16(
    layers: u64,
    kv_heads: u64,
    head_dim: u64,
    context_length: u64,
    windows: &[(u64, u64)],
    weight_bytes: u64,
) -> ModelGeometry {
    ModelGeometry {
        layers,
        kv_heads,
        head_dim,
        kv_dtype: KvDtype::Bf16,
        weight_bytes,
        context_length,
        sliding_windows: windows
            .iter()
            .map(|&(window, layers)| SlidingWindow { window, layers })
            .collect(),
        ..ModelGeometry::default()
    }
}

// config.json figures. Gemma 3: `sliding_window` 1024, every sixth layer
// global (`sliding_window_pattern` 6): 34 layers = 29 sliding + 5 global,
// 48 = 40 + 8, 62 = 52 + 10.
fn gemma3_4b() -> ModelGeometry {
    bf16(34, 4, 256, 131_072, &[(1024, 29)], 7_760_000_000)
}
fn gemma3_12b() -> ModelGeometry {
    bf16(48, 8, 256, 131_072, &[(1024, 40)], 23_540_000_000)
}
fn gemma3_27b() -> ModelGeometry {
    bf16(62, 16, 128, 131_072, &[(1024, 52)], 54_030_000_000)
}
/// `sliding_window` null, `use_sliding_window` false.
fn qwen3_8b() -> ModelGeometry {
    bf16(36, 8, 128, 40_960, &[], 16_380_000_000)
}
/// `sliding_window` 262,144: longer than its context, so full attention.
fn phi4_mini() -> ModelGeometry {
    bf16(32, 8, 128, 131_072, &[(262_144, 32)], 7_680_000_000)
}
/// Every layer windowed: `sliding_window` 4096 in a 32k context.
fn mistral_7b_v01() -> ModelGeometry {
    bf16(32, 8, 128, 32_768, &[(4096, 32)], 14_480_000_000)
}
fn llama31_8b() -> ModelGeometry {
    bf16(32, 8, 128, 131_072, &[], 16_060_522_496)
}

/// A GPU plan: 90% of `gib`, 1 GiB of activations, CUDA's 768 MiB runtime,
/// blocks of 16, chunks of 512, at most 256 sequences, typical 2048 tokens.
fn gpu(gib: u64, max_model_len: Option<u64>) -> PlanConfig {
    PlanConfig {
        memory_bytes: gib * GIB,
        activation_reserve_bytes: Some(GIB),
        max_model_len,
        max_seqs_cap: Some(256),
        typical_seq_len: Some(DEFAULT_TYPICAL_SEQ_LEN),
        ..PlanConfig::for_device(DeviceKind::Cuda)
    }
}

/// KV budget `B` = floor(gib * 0.9 GiB) - weights - 1 GiB - 768 MiB.
fn budget(gib: u64, weights: u64) -> u64 {
    (gib * GIB * 9 / 10) - weights - GIB - (768 << 20)
}

#[test]
fn real_models_on_an_80_and_a_24_gib_gpu() {
    struct Case {
        name: &'static str,
        geometry: ModelGeometry,
        config: PlanConfig,
        /// Blocks of the KV pool, then of each window pool.
        pools: (u64, &'static [u64]),
        max_seqs: u64,
    }
    // Per layer and token: 2 x kv_heads x head_dim x 2 bytes. Gemma 3 4B:
    // 4096, so a block of 16 is 65,536 bytes a layer: 327,680 in the 5
    // global layers, 1,900,544 in the 29 sliding ones. A typical 2048-token
    // sequence takes 128 global blocks and min(128, ceil((1024 + 511) / 16)
    // + 1 = 97) window blocks: 128 x 327,680 + 97 x 1,900,544 = 226,295,808
    // bytes, where counting every layer as global takes 285,212,672.
    let cases = [
        Case {
            // B = 67,670,363,136. Proportional: window 67.67e9 x 97 / 226.3e9
            // = 29,005 blocks, capped at 256 x 97 = 24,832 (what 256
            // sequences can ever hold); the KV pool takes the rest:
            // (B - 24,832 x 1,900,544) / 327,680 = 62,487. max_seqs =
            // min(62,487 / 128, 24,832 / 97) = 256, the cap (237 if every
            // layer were counted global: B / 285,212,672).
            name: "gemma-3-4b, 80 GiB, full context",
            geometry: gemma3_4b(),
            config: gpu(80, None),
            pools: (62_487, &[24_832]),
            max_seqs: 256,
        },
        Case {
            // 2 x 8 x 256 x 2 = 8192 bytes a layer-token; blocks 1,048,576
            // (8 global) and 5,242,880 (40 sliding); a typical sequence
            // 128 x 1,048,576 + 97 x 5,242,880 = 642,777,088. B =
            // 51,890,363,136: window 51.89e9 x 97 / 642.8e9 = 7830, KV pool
            // (B - 7830 x 5,242,880) / 1,048,576 = 10,336; max_seqs =
            // min(80, 80) = 80 (64 counting every layer global).
            name: "gemma-3-12b, 80 GiB, full context",
            geometry: gemma3_12b(),
            config: gpu(80, None),
            pools: (10_336, &[7830]),
            max_seqs: 80,
        },
        Case {
            // 2 x 16 x 128 x 2 = 8192 a layer-token; blocks 1,310,720 (10
            // global), 6,815,744 (52 sliding). B = 21,400,363,136: the
            // proportional KV pool (6,421) is short of one 131,072-token
            // sequence (8192 blocks), so it takes 8192 and the window pool
            // the rest: (B - 8192 x 1,310,720) / 6,815,744 = 1564; max_seqs =
            // min(64, 16) = 16. Counting every layer global it could not
            // hold one full-length sequence (2633 blocks of 8192 needed).
            name: "gemma-3-27b, 80 GiB, full context",
            geometry: gemma3_27b(),
            config: gpu(80, None),
            pools: (8192, &[1564]),
            max_seqs: 16,
        },
        Case {
            // 36 x 4096 x 16 = 2,359,296 a block; B = 59,050,363,136 / that
            // = 25,028; / 128 = 195.
            name: "qwen3-8b, 80 GiB",
            geometry: qwen3_8b(),
            config: gpu(80, None),
            pools: (25_028, &[]),
            max_seqs: 195,
        },
        Case {
            // The 262,144 window never slides in 131,072 tokens: one pool of
            // 32 x 4096 x 16 = 2,097,152-byte blocks; 67,750,363,136 / that
            // = 32,305; / 128 = 252.
            name: "phi-4-mini, 80 GiB",
            geometry: phi4_mini(),
            config: gpu(80, None),
            pools: (32_305, &[]),
            max_seqs: 252,
        },
        Case {
            // No full-attention layer: no KV pool, one window pool of the
            // whole budget: 60,950,363,136 / 2,097,152 = 29,063; a typical
            // sequence reserves min(128, ceil(4607 / 16) + 1 = 289) = 128.
            name: "mistral-7b-v0.1, 80 GiB",
            geometry: mistral_7b_v01(),
            config: gpu(80, None),
            pools: (0, &[29_063]),
            max_seqs: 227,
        },
        Case {
            // 59,369,840,640 / 2,097,152 = 28,309; / 128 = 221.
            name: "llama-3.1-8b, 80 GiB",
            geometry: llama31_8b(),
            config: gpu(80, None),
            pools: (28_309, &[]),
            max_seqs: 221,
        },
        Case {
            // B = 13,553,775,206: proportional KV pool 7666 < 8192, so 8192,
            // and the window pool (B - 8192 x 327,680) / 1,900,544 = 5719;
            // max_seqs = min(64, 58) = 58. Counting every layer global, one
            // 131,072-token sequence (18.3 GB) would not fit at all.
            name: "gemma-3-4b, 24 GiB, full context",
            geometry: gemma3_4b(),
            config: gpu(24, None),
            pools: (8192, &[5719]),
            max_seqs: 58,
        },
        Case {
            // 4,933,775,206 / 2,359,296 = 2091; / 128 = 16.
            name: "qwen3-8b, 24 GiB, 32k",
            geometry: qwen3_8b(),
            config: gpu(24, Some(32_768)),
            pools: (2091, &[]),
            max_seqs: 16,
        },
        Case {
            name: "phi-4-mini, 24 GiB, 32k",
            geometry: phi4_mini(),
            config: gpu(24, Some(32_768)),
            pools: (6501, &[]),
            max_seqs: 50,
        },
        Case {
            // 6,833,775,206 / 2,097,152 = 3258; / 128 = 25.
            name: "mistral-7b-v0.1, 24 GiB",
            geometry: mistral_7b_v01(),
            config: gpu(24, None),
            pools: (0, &[3258]),
            max_seqs: 25,
        },
        Case {
            // 5,253,252,710 / 2,097,152 = 2504; / 128 = 19.
            name: "llama-3.1-8b, 24 GiB, 32k",
            geometry: llama31_8b(),
            config: gpu(24, Some(32_768)),
            pools: (2504, &[]),
            max_seqs: 19,
        },
    ];
    for c in cases {
        let p = plan(&c.geometry, &c.config).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let got = (p.kv_blocks(), p.window_blocks(), p.max_seqs);
        let want = (c.pools.0, c.pools.1.to_vec(), c.max_seqs);
        assert_eq!(got, want, "{}", c.name);
        let b = budget(c.config.memory_bytes / GIB, c.geometry.weight_bytes);
        assert!(p.kv_budget_bytes <= b, "{}: over the budget", c.name);
        let windows: u64 = p.windows().iter().map(|w| w.blocks * w.block_bytes).sum();
        assert_eq!(
            p.kv_budget_bytes,
            p.kv_blocks() * p.block_bytes() + windows,
            "{}",
            c.name
        );
    }
    // What does not fit is refused: Gemma 3 12B's and 27B's weights alone
    // pass 90% of 24 GiB; Llama 3.1 8B's full 131,072-token sequence needs
    // 16 GiB of KV beside 16 GB of weights.
    for (name, g) in [
        ("gemma-3-12b", gemma3_12b()),
        ("gemma-3-27b", gemma3_27b()),
        ("llama-3.1-8b", llama31_8b()),
    ] {
        let e = plan(&g, &gpu(24, None)).unwrap_err();
        assert!(
            matches!(e, PlanError::InsufficientMemory { .. }),
            "{name}: {e}"
        );
    }
}

#[test]
fn long_sequences_are_where_the_window_pays() {
    // Gemma 3 4B with 32k-token sequences on 80 GiB: a typical sequence
    // takes 2048 global blocks and still only 97 window blocks: 2048 x
    // 327,680 + 97 x 1,900,544 = 855,441,408 bytes, against 34 x 65,536 x
    // 2048 = 4,563,402,752 counting every layer global.
    let config = PlanConfig {
        typical_seq_len: Some(32_768),
        ..gpu(80, Some(32_768))
    };
    let p = plan(&gemma3_4b(), &config).unwrap();
    // Proportional: window 67.67e9 x 97 / 855.4e9 = 7673 blocks, KV pool
    // (B - 7673 x 1,900,544) / 327,680 = 162,010; min(162,010 / 2048,
    // 7673 / 97) = 79.
    assert_eq!(
        (p.kv_blocks(), p.window_blocks(), p.max_seqs),
        (162_010, vec![7673], 79)
    );
    let all_global = ModelGeometry {
        sliding_windows: Vec::new(),
        ..gemma3_4b()
    };
    let q = plan(&all_global, &config).unwrap();
    // 67,670,363,136 / 2,228,224 = 30,369 blocks; / 2048 = 14.
    assert_eq!(q.max_seqs, 14);
    assert!(p.max_seqs >= 5 * q.max_seqs);
    let w = &p.windows()[0];
    assert_eq!(
        (
            w.kind,
            w.layers,
            w.block_bytes / p.block_size,
            w.block_bytes,
            w.blocks_per_seq
        ),
        (CacheKind::Window(1024), 29, 29 * 4096, 1_900_544, 97)
    );
    assert_eq!(p.kv_bytes_per_token(), 5 * 4096);
}

#[test]
fn given_pools_are_checked_and_missing_ones_derived() {
    let config = PlanConfig {
        typical_seq_len: Some(2048),
        ..gpu(0, Some(8192))
    };
    let g = gemma3_4b();
    let sized = |kv: Option<u64>, windows: Option<Vec<u64>>| {
        let sizes = PoolSizes {
            kv_blocks: kv,
            window_blocks: windows,
            ..PoolSizes::default()
        };
        plan_for_pools(&g, &config, &sizes).map(|p| (p.kv_blocks(), p.window_blocks(), p.max_seqs))
    };
    // Both given: 1024 / 128 = 8 and 500 / 97 = 5 typical sequences: 5.
    assert_eq!(sized(Some(1024), Some(vec![500])), Ok((1024, vec![500], 5)));
    // The window pool derived from the KV pool's 8 sequences: 8 x 97.
    assert_eq!(sized(Some(1024), None), Ok((1024, vec![776], 8)));
    assert_eq!(
        plan_for_blocks(&g, &config, 1024).unwrap().window_blocks(),
        vec![776]
    );
    // The KV pool derived from the window's 5 sequences: 5 x 128 = 640
    // (more than one 8192-token sequence's 512).
    assert_eq!(sized(None, Some(vec![500])), Ok((640, vec![500], 5)));
    // Too small for one sequence, by pool.
    let e = sized(Some(511), Some(vec![500])).unwrap_err().to_string();
    assert!(e.contains("a pool of 511 blocks"), "{e}");
    let e = sized(Some(1024), Some(vec![96])).unwrap_err().to_string();
    assert!(
        e.contains("1024-token window has 96 blocks, fewer than the 97"),
        "{e}"
    );
    // Sizes for pools the model lacks.
    let e = sized(Some(1024), Some(vec![500, 500]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--window-blocks with 2 window pool sizes, but this model's pools are: full, window:1024"),
        "{e}"
    );
    // Every layer of Mistral 7B v0.1 slides: --kv-blocks sizes its one
    // window pool, as --pool window:4096= does.
    let m = mistral_7b_v01();
    let whole = PlanConfig {
        max_model_len: None,
        ..config.clone()
    };
    let by_alias = plan_for_blocks(&m, &whole, 300).unwrap();
    let by_kind = plan_for_pools(
        &m,
        &whole,
        &PoolSizes::of(&[(CacheKind::Window(4096), 300)]),
    );
    assert_eq!(by_alias.sizes(), [(CacheKind::Window(4096), 300)]);
    assert_eq!(Ok(by_alias), by_kind);
    // A budget in bytes is split as the memory's would be.
    let bytes = 1024 * 327_680 + 500 * 1_900_544;
    let p = plan_for_kv_bytes(&g, &config, bytes).unwrap();
    assert!(p.kv_budget_bytes <= bytes);
    assert!(p.kv_blocks() >= 512 && p.window_blocks()[0] >= 97);
}

#[test]
fn free_memory_fits_max_seqs_full_length_sequences_in_every_pool() {
    // On a host with plenty free: 16 x 8192-token sequences = 16 x 512
    // global blocks + 25% = 10,240, and 16 x 97 window blocks.
    let config = PlanConfig {
        memory_bytes: 64 * GIB,
        max_model_len: Some(8192),
        max_seqs_cap: Some(16),
        activation_reserve_bytes: Some(GIB),
        ..PlanConfig::default()
    };
    let (p, rule) = plan_default(&gemma3_4b(), &config, MemoryKind::Free).unwrap();
    assert_eq!(rule, SizingRule::MaxSeqsFit);
    assert_eq!(
        (p.kv_blocks(), p.window_blocks(), p.max_seqs),
        (10_240, vec![16 * 97], 16)
    );
}

#[test]
fn a_model_whose_every_layer_slides_keeps_no_more_window_than_max_seqs_use() {
    // Mistral 7B v0.1 on 80 GiB with at most 16 sequences: a sequence holds
    // at most ceil((4096 + 512 - 1) / 16) + 1 = 289 blocks however long it
    // runs, so the pool is 16 x 289 = 4624 blocks of 32 x 8 x 128 x 2 x 2 x
    // 16 = 2 MiB (9.7 GB), not the whole 67 GB budget: with no KV pool to
    // take the rest, it stays unused.
    let config = PlanConfig {
        max_seqs_cap: Some(16),
        ..gpu(80, None)
    };
    let p = plan(&mistral_7b_v01(), &config).unwrap();
    assert_eq!(
        (p.kv_blocks(), p.window_blocks(), p.max_seqs),
        (0, vec![4624], 16)
    );
    assert_eq!(p.kv_budget_bytes, 4624 * 2 * 1024 * 1024);
    assert!(p.kv_budget_bytes < budget(80, 14_480_000_000) / 6);
}
