//! Gemma 4: each pool at its own heads, and no KV for the layers that
//! read an earlier layer's.

use super::*;

/// Gemma 4 31B: the `full` pool's blocks at the global layers' 4 x 512,
/// the `window:1024` pool's at the sliding layers' 16 x 256.
#[test]
fn a_gemma4_31b_plan_sizes_each_pool_at_its_own_shape() {
    use crate::fixtures::gemma4_31b;
    let g = gemma4_31b();
    let config = PlanConfig {
        memory_bytes: 141 * GIB,
        ..PlanConfig::for_device(DeviceKind::Cuda)
    };
    let p = plan(&g, &config).unwrap();
    let pools: Vec<(CacheKind, u64, u64)> = p
        .pools
        .iter()
        .map(|p| (p.kind, p.layers, p.block_bytes))
        .collect();
    assert_eq!(
        pools,
        [
            (CacheKind::Full, 10, 16 * 10 * 2 * 4 * 512 * 2),
            (CacheKind::Window(1024), 50, 16 * 50 * 2 * 16 * 256 * 2),
        ]
    );
    assert_eq!(
        p.kv_budget_bytes,
        p.pools
            .iter()
            .map(|p| p.blocks * p.block_bytes)
            .sum::<u64>()
    );
    assert_eq!(g.kv_bytes_per_token(), 10 * 8192 + 50 * 16_384);
    // Counted at one shape for every layer (16 x 256: the old plan), the
    // global layers' blocks would be twice as large, the pool half as long.
    let one_shape = ModelGeometry {
        full_kv_heads: 0,
        full_head_dim: 0,
        ..g.clone()
    };
    let q = plan(&one_shape, &config).unwrap();
    assert_eq!(q.block_bytes(), 2 * p.block_bytes());
    assert!(p.kv_blocks() > q.kv_blocks(), "{p:?} {q:?}");
}

/// Gemma 4 E4B: of its 42 layers only the 24 that produce KV are counted;
/// the 18 that read an earlier layer's keep nothing.
#[test]
fn a_gemma4_e4b_plan_counts_only_the_layers_that_produce_kv() {
    use crate::fixtures::gemma4_e4b;
    let (shared, unshared) = (gemma4_e4b(18), gemma4_e4b(0));
    // 2 x 2 heads x 256 x 2 bytes = 2048 a token a layer.
    assert_eq!(shared.kv_bytes_per_token(), 24 * 2048);
    assert_eq!(unshared.kv_bytes_per_token(), 42 * 2048);
    let config = PlanConfig {
        memory_bytes: 24 * GIB,
        ..PlanConfig::for_device(DeviceKind::Cuda)
    };
    let layers = |p: &Plan| -> Vec<(CacheKind, u64)> {
        p.pools.iter().map(|p| (p.kind, p.layers)).collect()
    };
    let (s, u) = (
        plan(&shared, &config).unwrap(),
        plan(&unshared, &config).unwrap(),
    );
    assert_eq!(
        layers(&s),
        [(CacheKind::Full, 4), (CacheKind::Window(512), 20)]
    );
    assert_eq!(
        layers(&u),
        [(CacheKind::Full, 22), (CacheKind::Window(512), 20)]
    );
    assert_eq!(s.block_bytes(), 16 * 4 * 2048);
    assert_eq!(u.block_bytes(), 16 * 22 * 2048);
    assert_eq!(s.windows()[0].block_bytes, u.windows()[0].block_bytes);
    // The same memory holds more whole-context sequences, and as many
    // typical ones as the cap allows.
    let whole = |p: &Plan| p.kv_blocks() / p.pool(CacheKind::Full).unwrap().blocks_per_seq;
    assert!(whole(&s) > 5 * whole(&u), "{s:?} {u:?}");
    assert!(s.max_seqs >= u.max_seqs);
}

#[test]
fn a_geometry_without_the_new_kinds_is_written_as_before() {
    // As an older server's inspect (and every CRD before) writes it.
    let written = r#"{"layers":34,"kvHeads":4,"headDim":256,"kvDtype":"bf16","weightBytes":7760000000,"contextLength":131072,"heads":8,"vocabSize":262208,"slidingWindows":[{"window":1024,"layers":29}],"kvLatentDim":0}"#;
    let g: ModelGeometry = serde_json::from_str(written).unwrap();
    assert_eq!(
        (g.full_kv_heads, g.full_head_dim, g.kv_shared_layers),
        (0, 0, 0)
    );
    let back = serde_json::to_string(&g).unwrap();
    // Absent counts stay absent (the zero latent dim included).
    assert_eq!(back, written.replace(r#","kvLatentDim":0"#, ""));
    assert_eq!(serde_json::from_str::<ModelGeometry>(&back).unwrap(), g);
    // Given, each is written under its name and read back.
    let cases = [
        (crate::fixtures::gemma4_31b(), "fullKvHeads", 4),
        (crate::fixtures::gemma4_31b(), "fullHeadDim", 512),
        (crate::fixtures::gemma4_e4b(18), "kvSharedLayers", 18),
    ];
    for (g, field, want) in cases {
        let json = serde_json::to_value(&g).unwrap();
        assert_eq!(json[field], want, "{field}");
        assert_eq!(serde_json::from_value::<ModelGeometry>(json).unwrap(), g);
    }
    let json = serde_json::to_value(crate::fixtures::gemma4_e4b(18)).unwrap();
    assert!(json.get("fullKvHeads").is_none() && json.get("fullHeadDim").is_none());
}

#[test]
fn shared_kv_and_full_shapes_out_of_range_are_refused_by_name() {
    use crate::fixtures::{gemma4_31b, gemma4_e4b};
    let cases = [
        (
            ModelGeometry {
                kv_shared_layers: 42,
                sliding_windows: Vec::new(),
                ..gemma4_e4b(0)
            },
            "kvSharedLayers (42) must be fewer than the 42 attention layers",
        ),
        (
            ModelGeometry {
                recurrent_layers: 30,
                state_bytes_per_seq: 1,
                sliding_windows: Vec::new(),
                ..gemma4_e4b(12)
            },
            "kvSharedLayers (12) must be fewer than the 12 attention layers",
        ),
        (
            // The shared sliding layers listed among the windows too.
            ModelGeometry {
                sliding_windows: vec![SlidingWindow {
                    window: 512,
                    layers: 35,
                }],
                ..gemma4_e4b(18)
            },
            "slidingWindows (35 layers) and kvSharedLayers (18)",
        ),
        (
            ModelGeometry {
                kv_latent_dim: 576,
                full_kv_heads: 0,
                ..gemma4_31b()
            },
            "kvLatentDim caches one latent vector a layer, not per-head K and V: fullHeadDim must",
        ),
        (
            ModelGeometry {
                kv_latent_dim: 576,
                ..gemma4_31b()
            },
            "fullKvHeads and fullHeadDim must be absent",
        ),
    ];
    for (g, want) in cases {
        let err = plan(&g, &PlanConfig::default()).unwrap_err();
        assert!(matches!(err, PlanError::Invalid(_)), "{err}");
        assert!(err.to_string().contains(want), "{err}");
    }
    // At the edge: one layer keeps what the other 41 share.
    let one = ModelGeometry {
        kv_shared_layers: 41,
        sliding_windows: Vec::new(),
        ..gemma4_e4b(0)
    };
    assert_eq!(one.cache_groups().len(), 1);
    assert_eq!(one.kv_bytes_per_token(), 2048);
}
