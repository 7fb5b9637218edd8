//! Sizing: the plan from the device or the flags, by pool kind.

use std::time::Duration;

use ferrox_models::{Format, KvGroup, ModelInfo};
use ferrox_plan::{Footprint, Footprints};

use super::*;

/// The full-attention pool's blocks of a sizing.
fn kv_blocks(s: &Sizing) -> usize {
    s.engine.pool(CacheKind::Full).map_or(0, |p| p.blocks)
}

/// 2 layers, 1 KV head of 4: 32 bytes of f16 KV a token, 512 a block.
fn info() -> ModelInfo {
    let fp = |weight_bytes| Footprint {
        weight_bytes,
        kv_dtype: KvDtype::F16,
        kv_bytes_per_token: 32,
    };
    ModelInfo {
        architecture: "llama".into(),
        format: Format::Gguf,
        facts: ferrox_plan::ModelGeometry {
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            kv_dtype: KvDtype::F16,
            weight_bytes: 1000,
            context_length: 256,
            ..ferrox_plan::ModelGeometry::default()
        },
        kv_groups: vec![KvGroup {
            window: None,
            layers: vec![0, 1],
        }],
        devices: Footprints {
            cpu: fp(1000),
            cuda: fp(500),
        },
        model_half: KvDtype::Bf16,
    }
}

/// `--kv-blocks n`.
fn blocks(n: u64) -> KvSizing {
    KvSizing::Pools(ferrox_plan::PoolSizes {
        kv_blocks: Some(n),
        ..ferrox_plan::PoolSizes::default()
    })
}

fn serve_config(kv: KvSizing, max_model_len: Option<usize>) -> ServeConfig {
    ServeConfig {
        model: "m.gguf".into(),
        host: "127.0.0.1".into(),
        port: 0,
        served_model_name: "m".into(),
        max_seqs: Some(4),
        kv,
        device: ferrox_models::device::DeviceChoice::Cpu,
        kv_dtype: None,
        attention: Default::default(),
        memory_utilization: 0.5,
        block_size: 16,
        prefill_chunk: 64,
        task: None,
        pooling: None,
        matryoshka: None,
        max_batch_tokens: 256,
        max_queue: 8,
        max_model_len,
        threads: None,
        drain_timeout: Duration::from_secs(1),
        decode_log_interval: 10,
        max_body: 1 << 20,
        http: crate::load::config::HttpConfig::default(),
        prefix_caching: true,
        speculative: None,
        draft_model: None,
        kv_offload: Vec::new(),
        default_max_tokens: 1024,
        tool_call_parser: crate::tools::parser::ParserChoice::Auto,
        reasoning_parser: crate::reasoning::choice::ReasoningChoice::Auto,
        lora: None,
        fetch: ferrox_fetch::FetchConfig {
            cache_dir: "/nonexistent".into(),
            hf_token: None,
            hf_endpoint: None,
        },
    }
}

fn memory(bytes: u64) -> DeviceMemory {
    DeviceMemory {
        bytes,
        source: MemorySource::CgroupV2,
    }
}

const OVERHEAD: u64 = 32 << 20;

#[test]
fn sizes_the_pool_from_the_device_or_the_flags() {
    // The activation reserve: (64 + 4) tokens x 2 k/v projections x 4 dims x 4 bytes.
    let act = 68 * 8 * 4;
    let base = 1000 + act + OVERHEAD;
    let gib = 1u64 << 30;
    let cases = [
        // Half of 1 GiB, less weights and reserves, in 512-byte blocks.
        (
            KvSizing::Device,
            None,
            gib,
            Some(((gib / 2 - base) / 512, 256, "memory-budget")),
        ),
        (KvSizing::Device, None, 2 * base, None),
        (blocks(16), None, gib, Some((16, 256, "kv-blocks"))),
        (blocks(15), None, gib, None),
        (blocks(8), Some(128), gib, Some((8, 128, "kv-blocks"))),
        // Explicit pools are checked against all the memory (no utilization).
        (
            blocks(16),
            None,
            base + 16 * 512,
            Some((16, 256, "kv-blocks")),
        ),
        (blocks(16), None, base + 16 * 512 - 1, None),
        (
            KvSizing::Memory(20 * 512 + 5),
            None,
            gib,
            Some((20, 256, "kv-cache-memory")),
        ),
        (KvSizing::Memory(512), None, gib, None),
    ];
    for (kv, len, mem, want) in cases {
        let got = size(
            &info(),
            DeviceKind::Cpu,
            memory(mem),
            None,
            &serve_config(kv.clone(), len),
        );
        let got = got.ok().map(|s| {
            assert_eq!(s.plan.activation_reserve_bytes, act);
            (kv_blocks(&s) as u64, s.engine.max_model_len, s.sized_by)
        });
        assert_eq!(got, want, "{kv:?} {len:?} {mem}");
    }
    // A profiled reserve replaces the estimate: 10 blocks' worth more
    // activations leave 10 blocks fewer.
    let cfg = serve_config(KvSizing::Device, None);
    let measured = act + 10 * 512;
    let s = size(&info(), DeviceKind::Cpu, memory(gib), Some(measured), &cfg).unwrap();
    assert_eq!(s.plan.activation_reserve_bytes, measured);
    assert_eq!(kv_blocks(&s) as u64, (gib / 2 - base) / 512 - 10);
}

#[test]
fn with_no_flags_free_memory_is_fitted_and_a_limit_is_the_budget() {
    // 256 tokens a sequence is 16 blocks; 16 on CPU (no --max-seqs) x 16
    // + 25% = 320 blocks, in 4 GiB of MemAvailable.
    let gib = 1u64 << 30;
    let no_cap = ServeConfig {
        max_seqs: None,
        ..serve_config(KvSizing::Device, None)
    };
    let at = |bytes, source| DeviceMemory { bytes, source };
    for (source, device, want_fit) in [
        (MemorySource::MemInfo, DeviceKind::Cpu, true),
        (MemorySource::CgroupV2, DeviceKind::Cpu, false),
        (MemorySource::Cuda, DeviceKind::Cuda, false),
    ] {
        let s = size(&info(), device, at(4 * gib, source), None, &no_cap).unwrap();
        let (blocks, rule) = (kv_blocks(&s) as u64, s.sized_by);
        if want_fit {
            assert_eq!((blocks, rule, s.engine.max_seqs), (320, "max-seqs-fit", 16));
        } else {
            // The whole budget: half of 4 GiB in 512-byte blocks, less
            // reserves (32 MiB on CPU, 768 MiB on GPU).
            assert!(
                blocks > (2 * gib - (800 << 20)) / 512,
                "{source:?} {blocks}"
            );
            assert_eq!(rule, "memory-budget", "{source:?}");
            // The plan's figure: 16 (CPU) or 256 (GPU) sequences at most.
            let cap = device.default_max_seqs() as usize;
            assert_eq!(s.engine.max_seqs, cap, "{source:?}");
        }
        assert_eq!(s.info(&no_cap).pools, s.engine.pools);
        assert_eq!(s.info(&no_cap).max_seqs, s.engine.max_seqs);
    }
    // Little MemAvailable: utilization bounds the fit.
    let small = size(
        &info(),
        DeviceKind::Cpu,
        at((64 << 20) + 200_000, MemorySource::MemInfo),
        None,
        &no_cap,
    )
    .unwrap();
    assert_eq!(small.sized_by, "memory-budget");
    assert!(kv_blocks(&small) < 320);
    // A given --max-seqs is what the fit counts and what the engine runs.
    let four = serve_config(KvSizing::Device, None);
    let s = size(
        &info(),
        DeviceKind::Cpu,
        at(4 * gib, MemorySource::MemInfo),
        None,
        &four,
    )
    .unwrap();
    assert_eq!((kv_blocks(&s), s.engine.max_seqs), (80, 4));
}

#[test]
fn the_device_decides_weights_and_kv_dtype() {
    let cfg = serve_config(blocks(16), None);
    let cpu = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &cfg).unwrap();
    let gpu = size(&info(), DeviceKind::Cuda, memory(1 << 30), None, &cfg).unwrap();
    assert_eq!((cpu.kv_dtype, cpu.plan.weight_bytes), (KvDtype::F16, 1000));
    assert_eq!((gpu.kv_dtype, gpu.plan.weight_bytes), (KvDtype::Bf16, 500));
    let f32 = ServeConfig {
        kv_dtype: Some(KvDtype::F32),
        ..cfg
    };
    let wide = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &f32).unwrap();
    let block = |s: &Sizing| s.plan.pool(CacheKind::Full).unwrap().block_bytes;
    assert_eq!(block(&wide), 2 * block(&cpu));
}

#[test]
fn a_refusal_names_every_number_and_what_to_change() {
    let cfg = serve_config(KvSizing::Device, None);
    let err = size(&info(), DeviceKind::Cpu, memory(60 << 20), None, &cfg)
        .unwrap_err()
        .to_string();
    for part in [
        "62914560 bytes (cgroup-v2)",
        "KV in f16",
        "256 tokens a sequence",
        "weights take 1000",
        "one 256-token sequence needs 8192 bytes of KV",
        "Try a smaller --max-model-len, a higher --memory-utilization, or more memory",
    ] {
        assert!(err.contains(part), "{err} lacks {part}");
    }
    let wide = ServeConfig {
        kv: blocks(1 << 40),
        kv_dtype: Some(KvDtype::F32),
        ..cfg
    };
    let err = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &wide)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--kv-dtype f16, smaller --pool sizes"),
        "{err}"
    );
}

#[test]
fn the_plan_the_metrics_export_and_the_cache_switch() {
    // The memory figure is the device's, whichever flag sized the pool.
    for (kv, caching) in [
        (blocks(16), true),
        (KvSizing::Memory(20 * 512 + 5), false),
        (KvSizing::Device, true),
    ] {
        let cfg = ServeConfig {
            prefix_caching: caching,
            ..serve_config(kv.clone(), None)
        };
        let s = size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &cfg).unwrap();
        assert_eq!(s.engine.prefix_caching, caching);
        let want = PlanInfo {
            block_size: 16,
            pools: s.engine.pools.clone(),
            kv_dtype: "f16".into(),
            memory_utilization: 0.5,
            prefix_caching: caching,
            weight_bytes: 1000,
            kv_block_bytes: 512,
            memory_bytes: 1 << 30,
            memory_source: "cgroup-v2".into(),
            max_seqs: 4,
            max_model_len: 256,
        };
        assert_eq!(s.info(&cfg), want, "{kv:?}");
    }
    // The salt names the model and the KV dtype: another of either never
    // shares a cached block.
    let salt = |model: &str, kv_dtype| {
        let cfg = ServeConfig {
            model: model.into(),
            kv_dtype: Some(kv_dtype),
            ..serve_config(blocks(16), None)
        };
        size(&info(), DeviceKind::Cpu, memory(1 << 30), None, &cfg)
            .unwrap()
            .engine
            .cache_salt
    };
    let base = salt("a.gguf", KvDtype::F16);
    assert_eq!(base, salt("a.gguf", KvDtype::F16));
    assert_ne!(base, salt("b.gguf", KvDtype::F16));
    assert_ne!(base, salt("a.gguf", KvDtype::F32));
}

/// `info()` with one of its two layers behind a 16-token window.
fn windowed() -> ModelInfo {
    let base = info();
    ModelInfo {
        facts: ferrox_plan::ModelGeometry {
            sliding_windows: vec![ferrox_plan::SlidingWindow {
                window: 16,
                layers: 1,
            }],
            ..base.facts.clone()
        },
        kv_groups: vec![
            KvGroup {
                window: None,
                layers: vec![1],
            },
            KvGroup {
                window: Some(16),
                layers: vec![0],
            },
        ],
        ..base
    }
}

#[test]
fn a_windowed_model_gets_a_window_pool_beside_the_kv_pool() {
    // 16 bytes a layer-token in f16: blocks of 256 bytes in each pool.
    // A 256-token sequence takes 16 KV blocks and min(16, ceil((16 + 63)
    // / 16) + 1 = 6) window blocks.
    let cfg = serve_config(blocks(64), None);
    let s = size(&windowed(), DeviceKind::Cpu, memory(1 << 30), None, &cfg).unwrap();
    // The window pool holds as many typical sequences as the KV pool:
    // min(4 given, 64 / 16) = 4, at 6 blocks each.
    let pool = |kind, blocks| ferrox_core::Pool { kind, blocks };
    let want = [pool(CacheKind::Full, 64), pool(CacheKind::Window(16), 24)];
    assert_eq!(s.engine.pools, want);
    let info = s.info(&cfg);
    assert_eq!(info.pools, s.engine.pools);
    // No prefix cache with windows, and the metrics say so.
    assert!(!info.prefix_caching);
    // Both flags: the window pool as given, checked against one sequence.
    let both = ServeConfig {
        kv: KvSizing::Pools(ferrox_plan::PoolSizes {
            kv_blocks: Some(64),
            window_blocks: Some(vec![5]),
            ..ferrox_plan::PoolSizes::default()
        }),
        ..cfg.clone()
    };
    let err = size(&windowed(), DeviceKind::Cpu, memory(1 << 30), None, &both)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("16-token window has 5 blocks, fewer than the 6"),
        "{err}"
    );
    assert!(err.contains("smaller --pool sizes"), "{err}");
    // From the memory: both pools, split as the plan splits a budget.
    let device = serve_config(KvSizing::Device, None);
    let s = size(&windowed(), DeviceKind::Cpu, memory(1 << 30), None, &device).unwrap();
    let window = s.plan.pool(CacheKind::Window(16)).unwrap();
    assert!(kv_blocks(&s) >= 16 && window.blocks >= 6);
    assert_eq!(window.blocks_per_seq, 6);
}

#[test]
fn speculating_the_plan_counts_each_sequence_s_drafts_as_logit_rows() {
    // 100 tokens of vocabulary: a logit row is 2 x 100 x 4 bytes.
    let mut vocab = info();
    vocab.facts.vocab_size = 100;
    let at = memory(1 << 30);
    let off = serve_config(KvSizing::Device, None);
    let on = ServeConfig {
        speculative: Some(ferrox_plan::SpeculativeConfig::ngram(5, Some(2), Some(4)).unwrap()),
        ..serve_config(KvSizing::Device, None)
    };
    let plan = |cfg: &ServeConfig| size(&vocab, DeviceKind::Cpu, at, None, cfg).unwrap().plan;
    let (off, on) = (plan(&off), plan(&on));
    // 4 sequences x 5 drafts = 20 more rows (under the chunk's 64).
    assert_eq!(
        on.activation_reserve_bytes - off.activation_reserve_bytes,
        20 * 2 * 100 * 4
    );
    assert!(on.kv_budget_bytes < off.kv_budget_bytes);
}
