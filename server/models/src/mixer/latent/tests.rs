//! Latent attention: the absorbed form over the paged cache equals the
//! expanded form (each head's K and V decompressed) on random inputs, on
//! both attention paths, across a prefill chunk and decode steps.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use ferrox_core::Pool;
use ferrox_plan::{CacheKind, KvDtype};

use super::forward::{LatentParts, LatentQuery, LatentWeights, expanded};
use super::spec::LatentSpec;
use crate::kv_store::KvStore;
use crate::linear::Linear;
use crate::mixer::attention::forward::AttentionStep;
use crate::mixer::attention::paged::Heads;
use crate::seq_span::SeqSpan;
use crate::spec::{AttentionSpec, KvGroup};

fn spec() -> LatentSpec {
    LatentSpec {
        attention: AttentionSpec {
            window: None,
            chunk: None,
            rope: 0,
            scale: 0.3,
            softcap: None,
            qk_norm: false,
            qk_norm_whole: false,
            qk_norm_weightless: false,
            sinks: false,
            nope: false,
            gated: false,
            temperature: None,
            kv: crate::spec::KvLayout::default(),
        },
        q_rank: None,
        kv_rank: 12,
        nope_dim: 6,
        rope_dim: 4,
        v_dim: 5,
        interleaved: true,
    }
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    // A fixed LCG: the same inputs every run, no RNG crate.
    let n: usize = shape.iter().product();
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

#[test]
fn absorbed_attention_over_the_latent_cache_equals_the_expanded_form() {
    let (m, heads, tokens) = (spec(), 3, 9);
    let dense = |r, c, s| Linear::Dense(randn(&[r, c], s));
    let w = LatentWeights {
        q: LatentQuery::Full(dense(1, 1, 0)),
        kv_a: dense(1, 1, 1),
        kv_norm: randn(&[m.kv_rank], 2),
        k_b: randn(&[heads, m.nope_dim, m.kv_rank], 3),
        v_b: randn(&[heads, m.v_dim, m.kv_rank], 4),
        o: dense(1, 1, 5),
    };
    let all = LatentParts {
        q_nope: randn(&[tokens, heads, m.nope_dim], 6),
        q_pe: randn(&[tokens, heads, m.rope_dim], 7),
        latent: randn(&[tokens, m.width()], 8),
    };
    let want = expanded(&m, &all, (&w.k_b, &w.v_b)).unwrap();
    for paged in [true, false] {
        let got = absorbed_in_steps(&w, &m, &all, paged);
        let diff = (got - &want).unwrap().abs().unwrap();
        let max = diff.flatten_all().unwrap().max(0).unwrap();
        let max = max.to_scalar::<f32>().unwrap();
        assert!(
            max < 1e-4,
            "paged {paged}: max |absorbed - expanded| = {max}"
        );
    }
    // The cache holds one vector of the latent's width a token, no V.
    let kv = KvStore::with_shape(
        &groups(),
        1,
        &pools(),
        (4, 16, false),
        KvDtype::F16,
        &Device::Cpu,
    )
    .unwrap();
    assert!(!kv.cache(0).has_values());
    assert_eq!(kv.bytes(), [(CacheKind::Full, 4 * 4 * 16 * 2)]);
    assert_eq!(kv.cache(0).block_bytes(), 4 * 16 * 2);
    // A block reads out and back (a lower KV tier's copy), K alone.
    let bytes: Vec<u8> = (0..4 * 16 * 2).map(|i| (i % 61) as u8).collect();
    kv.write_block(CacheKind::Full, 2, &bytes).unwrap();
    assert_eq!(kv.read_block(CacheKind::Full, 2).unwrap(), bytes);
    assert!(kv.write_block(CacheKind::Full, 1, &bytes[1..]).is_err());
}

/// The absorbed form over a fresh K-only cache, `all`'s tokens in a
/// 6-token chunk then decode steps (blocks out of order).
fn absorbed_in_steps(w: &LatentWeights, m: &LatentSpec, all: &LatentParts, paged: bool) -> Tensor {
    let heads = all.q_nope.dim(1).unwrap();
    let kv = KvStore::with_shape(
        &groups(),
        1,
        &pools(),
        (4, m.width(), false),
        KvDtype::F32,
        &Device::Cpu,
    )
    .unwrap();
    let mut got = Vec::new();
    for (start, n) in [(0, 6), (6, 1), (7, 1), (8, 1)] {
        let spans: Arc<[SeqSpan]> = Arc::from(vec![SeqSpan {
            tables: vec![vec![2, 0, 3]],
            start_pos: start,
            n_tokens: n,
            state: None,
        }]);
        let slot_index = kv.slot_indices(&spans, &Device::Cpu).unwrap();
        let step = AttentionStep {
            kv: &kv,
            spans: &spans,
            tables: &[None],
            rope_rows: &[],
            query_scales: &[],
            slot_index: &slot_index,
            heads: Heads {
                heads,
                kv_heads: 1,
                head_dim: m.width(),
            },
            eps: 1e-6,
            paged,
        };
        let part = |t: &Tensor| t.narrow(0, start, n).unwrap();
        let p = LatentParts {
            q_nope: part(&all.q_nope),
            q_pe: part(&all.q_pe),
            latent: part(&all.latent),
        };
        got.push(w.absorbed(m, &p, (0, &step)).unwrap());
    }
    Tensor::cat(&got, 0).unwrap()
}

fn groups() -> [KvGroup; 1] {
    [KvGroup {
        window: None,
        layers: vec![0],
    }]
}

fn pools() -> [Pool; 1] {
    [Pool {
        kind: CacheKind::Full,
        blocks: 4,
    }]
}

#[test]
fn interleaved_pairs_are_reordered_to_halves() {
    let x = Tensor::new(&[[[0f32, 1., 2., 3., 4., 5.]]], &Device::Cpu).unwrap();
    let y = super::forward::halves(&x).unwrap();
    assert_eq!(y.to_vec3::<f32>().unwrap(), [[[0., 2., 4., 1., 3., 5.]]]);
}
