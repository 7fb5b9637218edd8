//! Mixtures of experts on one 24 GiB, 80 GiB and 141 GB GPU: every expert is
//! resident, so the weights are all of them as held; what a token reads (the
//! active parameters) decides speed, not memory. Weights as the server holds
//! them on a GPU (`ferrox-models`' holding.rs): matrices in the checkpoint's
//! bf16, norms, biases, sinks and routers in f32, and gpt-oss's MXFP4
//! experts widened to bf16 (no CUDA kernel reads MXFP4 yet; one would hold
//! gpt-oss-20b in 13.8 GB and -120b in 65.2 GB).

use crate::fixtures::Pools;
use crate::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The GPUs: an RTX 4090 / L4 class card, an A100 / H100, an H200 (its
/// `nvidia.com/gpu.memory` label: 143,771 MiB).
const GPUS: [(&str, u64); 3] = [
    ("24 GiB", 24 * GIB),
    ("80 GiB", 80 * GIB),
    ("H200", 143_771 * MIB),
];

/// Qwen3-30B-A3B (config.json): 48 layers, 4 KV heads of 128, a
/// 40,960-token context, no windows. Parameters: per layer q 2048 x 4096,
/// k and v 2048 x 512, o 4096 x 2048 (18,874,368), q/k norms 2 x 128, two
/// norms of 2048, the router 128 x 2048 (262,144) and 128 experts of 3 x
/// 2048 x 768 (603,979,776); untied embedding and head 2 x 151,936 x 2048
/// and the final norm: 30,532,122,624. A token runs 8 experts:
/// 3,353,032,704 (Qwen's "A3B").
fn qwen3_30b_a3b() -> ModelGeometry {
    ModelGeometry {
        layers: 48,
        kv_heads: 4,
        head_dim: 128,
        kv_dtype: KvDtype::Bf16,
        weight_bytes: 61_089_832_960,
        context_length: 40_960,
        params: 30_532_122_624,
        active_params: 3_353_032_704,
        ..ModelGeometry::default()
    }
}

/// gpt-oss as released (config.json): 8 KV heads of 64, a 131,072-token
/// context, `sliding_window` 128 on every other layer. Per layer:
/// attention with biases q 2880 x 4096, k and v 2880 x 512, o 4096 x 2880,
/// 64 sinks, two norms; a router 2880 x experts with its bias; each expert
/// gate/up 2880 x 5760 and down 2880 x 2880 with biases; embedding and head
/// 201,088 x 2880 untied.
fn gpt_oss(layers: u64, params: u64, active_params: u64, weight_bytes: u64) -> ModelGeometry {
    ModelGeometry {
        layers,
        kv_heads: 8,
        head_dim: 64,
        kv_dtype: KvDtype::Bf16,
        weight_bytes,
        context_length: 131_072,
        sliding_windows: vec![SlidingWindow {
            window: 128,
            layers: layers / 2,
        }],
        params,
        active_params,
        ..ModelGeometry::default()
    }
}

/// 24 layers of 32 experts, 4 a token: 20,914,757,184 parameters;
/// 4,187,440,704 active (OpenAI's 3.6 B leaves out the 579 M of the
/// embedding table).
fn gpt_oss_20b() -> ModelGeometry {
    gpt_oss(24, 20_914_757_184, 4_187_440_704, 41_847_879_936)
}

/// 36 layers of 128 experts, 4 a token: 116,829,156,672 parameters;
/// 5,711,982,912 active.
fn gpt_oss_120b() -> ModelGeometry {
    gpt_oss(36, 116_829_156_672, 5_711_982_912, 233_765_491_968)
}

/// A GPU plan as in the dense table: 90% of `memory`, 1 GiB of
/// activations, CUDA's 768 MiB runtime, blocks of 16, typical 2048 tokens.
fn gpu(memory_bytes: u64) -> PlanConfig {
    PlanConfig {
        memory_bytes,
        activation_reserve_bytes: Some(GIB),
        max_seqs_cap: Some(256),
        typical_seq_len: Some(DEFAULT_TYPICAL_SEQ_LEN),
        ..PlanConfig::for_device(DeviceKind::Cuda)
    }
}

#[test]
fn the_parameters_and_bytes_add_up_from_the_configs() {
    // Qwen3-30B-A3B: per layer matrices, f32 vectors (norms) and router.
    let (h, f) = (2048u64, 768u64);
    let (attn, vectors, router) = (2 * h * 4096 + 2 * h * 512, 2 * h + 256, 128 * h);
    let (one, outer) = (3 * h * f, 2 * 151_936 * h);
    let q3 = qwen3_30b_a3b();
    let layer = attn + vectors + router;
    assert_eq!(q3.params, 48 * (layer + 128 * one) + outer + h);
    assert_eq!(q3.active_params, 48 * (layer + 8 * one) + outer + h);
    let matrices = 48 * (attn + 128 * one) + outer;
    assert_eq!(q3.weight_bytes, 2 * matrices + 4 * (q3.params - matrices));
    // gpt-oss: attention matrices; biases, sinks, norms (f32); experts.
    let h = 2880u64;
    let attn = h * 4096 + 2 * h * 512 + 4096 * h;
    let vectors = 4096 + 2 * 512 + h + 64 + 2 * h;
    let (expert, expert_bias) = (h * 2 * h + h * h, 2 * h + h);
    let outer = 2 * 201_088 * h;
    for (g, experts) in [(gpt_oss_20b(), 32), (gpt_oss_120b(), 128)] {
        let routed = |k: u64| k * (expert + expert_bias);
        let layer = attn + vectors + experts * h + experts;
        assert_eq!(g.params, g.layers * (layer + routed(experts)) + outer + h);
        assert_eq!(g.active_params, g.layers * (layer + routed(4)) + outer + h);
        let matrices = g.layers * (attn + experts * expert) + outer;
        assert_eq!(g.weight_bytes, 2 * matrices + 4 * (g.params - matrices));
    }
}

#[test]
fn mixtures_of_experts_on_one_gpu() {
    // (model, GPU, Some((KV pool blocks, window pool blocks, max_seqs)) or
    // None: refused).
    type Want = Option<(u64, &'static [u64], u64)>;
    let cases: [(&str, ModelGeometry, usize, Want); 9] = [
        // 56.9 GiB of weights pass 90% of 24 GiB: refused.
        ("qwen3-30b-a3b", qwen3_30b_a3b(), 0, None),
        // B = 77,309,411,328 - 61,089,832,960 - 1 GiB - 768 MiB =
        // 14,340,530,176; 48 x 1024 bytes x 16 = 1,572,864 a block: 9117
        // blocks; 128 a typical sequence: 71.
        ("qwen3-30b-a3b", qwen3_30b_a3b(), 1, Some((9117, &[], 71))),
        // B = 72,711,032,012: 46,228 blocks, 361 sequences, capped at 256.
        (
            "qwen3-30b-a3b",
            qwen3_30b_a3b(),
            2,
            Some((46_228, &[], 256)),
        ),
        // 39.0 GiB of weights: refused on 24 GiB.
        ("gpt-oss-20b", gpt_oss_20b(), 0, None),
        // 12 full layers and 12 windowed, 2048 bytes a layer-token: 393,216
        // a block in either pool. A typical sequence takes 128 full blocks
        // and ceil((128 + 511) / 16) + 1 = 41 window blocks; the window pool
        // is capped at what 256 sequences hold (256 x 41 = 10,496). On 80
        // GiB B = 33,582,483,200 = 85,404 blocks: 74,908 full.
        (
            "gpt-oss-20b",
            gpt_oss_20b(),
            1,
            Some((74_908, &[10_496], 256)),
        ),
        (
            "gpt-oss-20b",
            gpt_oss_20b(),
            2,
            Some((223_351, &[10_496], 256)),
        ),
        // 217.7 GiB of weights: more than one GPU of any of these.
        ("gpt-oss-120b", gpt_oss_120b(), 0, None),
        ("gpt-oss-120b", gpt_oss_120b(), 1, None),
        ("gpt-oss-120b", gpt_oss_120b(), 2, None),
    ];
    for (name, g, gpu_at, want) in cases {
        let (gpu_name, memory) = GPUS[gpu_at];
        let what = format!("{name} on {gpu_name}");
        let got = plan(&g, &gpu(memory));
        let Some((kv, windows, seqs)) = want else {
            let e = got.expect_err(&what);
            // Refused with the numbers: the weights, all experts counted.
            let msg = e.to_string();
            assert!(
                matches!(e, PlanError::InsufficientMemory { .. }),
                "{what}: {e}"
            );
            assert!(msg.contains(&g.weight_bytes.to_string()), "{what}: {msg}");
            continue;
        };
        let p = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        let windows = windows.to_vec();
        assert_eq!(
            (p.kv_blocks(), p.window_blocks(), p.max_seqs),
            (kv, windows, seqs),
            "{what}"
        );
        assert_eq!(
            (p.params, p.active_params),
            (g.params, g.active_params),
            "{what}"
        );
        assert!(p.total_bytes() <= memory, "{what}");
    }
}
