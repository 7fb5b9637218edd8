//! Each ranking against the obvious algorithm (sort the whole row), on rows
//! with ties, masked entries and NaN.

use super::*;

/// A row of `n` values from a small set (many ties), some masked.
fn row(n: usize, seed: u64, masked_every: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if masked_every > 0 && i % masked_every == 0 {
                f32::NEG_INFINITY
            } else {
                (x % 97) as f32 / 8.0 - 6.0
            }
        })
        .collect()
}

/// The kept candidates as (id, weight) pairs, in their order.
fn listed(c: Candidates) -> Vec<(u32, f32)> {
    match c {
        Candidates::Dense(w) => pairs(&w).filter(|c| c.1 > 0.0).collect(),
        Candidates::Sparse(c) => c,
    }
}

fn sorted(row: &[f32]) -> Vec<(u32, f32)> {
    let mut all: Vec<(u32, f32)> = pairs(row).collect();
    all.sort_by(best_first);
    all
}

#[test]
fn argmax_is_the_lowest_id_of_the_largest_and_never_nan() {
    let nan = f32::NAN;
    let inf = f32::NEG_INFINITY;
    // (row, argmax)
    let cases: Vec<(Vec<f32>, u32)> = vec![
        (vec![], 0),
        (vec![1.0, 3.0, 3.0], 1),
        (vec![inf, inf], 0),
        (vec![nan, 1.0, nan, 2.0, 2.0], 3),
        (vec![nan, nan], 0),
        // The maximum in the tail past the last full 8 lanes, and in lanes.
        ((0..19).map(|i| i as f32).collect(), 18),
        ((0..19).map(|i| -(i as f32)).collect(), 0),
        ((0..24).map(|i| (i % 8) as f32).collect(), 7),
    ];
    for (r, want) in cases {
        assert_eq!(argmax(&r), want, "{r:?}");
    }
    for seed in 0..20 {
        let r = row(1000 + seed as usize, seed, 3);
        assert_eq!(argmax(&r), sorted(&r)[0].0);
    }
}

#[test]
fn sum_counts_every_value_tail_included() {
    for n in [0, 1, 7, 8, 9, 17, 1000] {
        // Small integers: every order of addition gives the exact sum.
        let values: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
        let want: f32 = values.iter().sum();
        assert_eq!(sum(&values), want, "{n}");
    }
}

#[test]
fn weight_sum_is_the_sum_of_the_weights() {
    for n in [0, 5, 8, 13, 1000] {
        let r = row(n, 9, 3);
        let weights: Vec<f32> = r.iter().map(|&x| weight(x - 2.0)).collect();
        assert_eq!(weight_sum(&r, 2.0), sum(&weights), "{n}");
    }
}

#[test]
fn top_k_is_the_head_of_the_sorted_row() {
    for seed in 0..10 {
        let mut r = row(700, seed, 5);
        r[17] = f32::NAN;
        let all = sorted(&r);
        for k in [0, 1, 2, 5, SCAN_K, SCAN_K + 1, 300, 700, 5000] {
            let want: Vec<(u32, f32)> = all.iter().copied().take(k).collect();
            let got = top_k(&r, k);
            assert_eq!(got.len(), want.len(), "k {k}");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.0 == w.0 && g.1.total_cmp(&w.1).is_eq(),
                    "k {k}: {g:?} {w:?}"
                );
            }
        }
    }
}

/// The candidates as the previous sampler found them: the whole row
/// sorted, truncated to top-k, normalised, min-p against the best, then
/// the nucleus walked in order. One change: top-p 1 keeps every token (the
/// previous walk cut the tail once rounding took the sum to 1).
fn reference(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f32)> {
    let mut cand: Vec<(u32, f32)> = pairs(logits)
        .filter(|c| c.1 > f32::NEG_INFINITY)
        .map(|(i, l)| (i, l / p.temperature))
        .collect();
    cand.sort_by(best_first);
    if p.top_k > 0 {
        cand.truncate(p.top_k);
    }
    let max = cand[0].1;
    let weights: Vec<f32> = cand.iter().map(|c| weight(c.1 - max)).collect();
    let total: f32 = weights.iter().sum();
    let mut keep = weights.iter().take_while(|&&w| w >= p.min_p).count();
    let mut mass = 0.0;
    let walked = if p.top_p < 1.0 { keep } else { 0 };
    for (i, w) in weights[..walked].iter().enumerate() {
        mass += w / total;
        if mass >= p.top_p {
            keep = i + 1;
            break;
        }
    }
    cand.iter()
        .zip(&weights)
        .take(keep)
        .map(|(c, &w)| (c.0, w))
        .collect()
}

/// Where two cuts of one best-first list differ, both must lie at the
/// nucleus's edge: the shorter already holds `top_p` (within rounding, as
/// the two sum the normaliser in different orders) and the tokens between
/// them hold next to nothing (ties and tails).
fn cuts_agree_within_rounding(
    got: &[(u32, f32)],
    want: &[(u32, f32)],
    all: &[(u32, f32)],
    top_p: f32,
) -> bool {
    let total: f32 = all.iter().map(|c| c.1).sum();
    let mass = |c: &[(u32, f32)]| c.iter().map(|c| c.1 / total).sum::<f32>();
    let (short, long) = if got.len() < want.len() {
        (got, want)
    } else {
        (want, got)
    };
    (mass(short) - top_p).abs() < 1e-4 && mass(long) - mass(short) < 1e-4
}

#[test]
fn candidates_are_the_sorted_rows_filters_without_the_sort() {
    let p = |temperature, top_k, top_p, min_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..SamplingParams::default()
    };
    let cases = [
        p(1.0, 0, 1.0, 0.0),
        p(0.7, 0, 0.9, 0.0),
        p(0.7, 0, 0.999, 0.0),
        p(1.3, 40, 1.0, 0.0),
        p(1.0, 40, 0.5, 0.0),
        p(1.0, 0, 1.0, 0.2),
        p(0.5, 100, 0.95, 0.05),
        p(2.0, 0, 0.3, 0.0),
        p(1.0, 1, 1.0, 0.0),
    ];
    for params in &cases {
        for seed in 0..8 {
            let r = row(5000, seed, 7);
            let mut got = listed(candidates(&r, params));
            let mut want = reference(&r, params);
            if params.top_k == 0 && params.top_p >= 1.0 {
                // Id order there; the reference's is best first.
                want.sort_by_key(|c| c.0);
            }
            if got.len() != want.len() {
                let all = reference(
                    &r,
                    &SamplingParams {
                        top_p: 1.0,
                        ..params.clone()
                    },
                );
                assert!(
                    cuts_agree_within_rounding(&got, &want, &all, params.top_p),
                    "{params:?} seed {seed}: {} against {}",
                    got.len(),
                    want.len()
                );
            }
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.0, w.0, "{params:?} seed {seed}");
                assert_eq!(g.1.to_bits(), w.1.to_bits(), "{params:?} seed {seed}");
            }
            let n = got.len();
            got.sort_by_key(|c| c.0);
            got.dedup_by_key(|c| c.0);
            assert_eq!(got.len(), n, "no candidate twice");
        }
    }
}

#[test]
fn weight_is_exp_within_one_ulp_and_zero_below_the_normal_range() {
    let ulp = |x: f32| f32::from_bits(x.to_bits() + 1) - x;
    let mut worst = 0.0f32;
    for i in 0..=870_000 {
        let x = -(i as f32) * 1e-4;
        let (got, want) = (weight(x), x.exp());
        worst = worst.max((got - want).abs() / ulp(want));
    }
    assert!(worst <= 1.0, "{worst} ulp");
    assert_eq!(weight(0.0), 1.0, "the best token weighs exactly 1");
    for x in [-87.5, -100.0, -1e30, f32::NEG_INFINITY, f32::NAN] {
        assert_eq!(weight(x), 0.0, "{x}");
    }
}

#[test]
fn a_row_with_nothing_finite_gives_its_argmax() {
    let params = SamplingParams::default();
    let inf = f32::NEG_INFINITY;
    assert_eq!(
        listed(candidates(&[inf, inf, inf], &params)),
        vec![(0, 1.0)]
    );
    assert_eq!(
        listed(candidates(&[f32::NAN, inf], &params)),
        vec![(1, 1.0)]
    );
    // Masked tokens never come back through top-k or top-p.
    let one = [inf, 2.0, inf];
    for params in [
        SamplingParams {
            top_k: 3,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 0.5,
            ..SamplingParams::default()
        },
    ] {
        assert_eq!(listed(candidates(&one, &params)), vec![(1, 1.0)]);
    }
}

#[test]
fn temperature_and_min_p_alone_gather_nothing() {
    let r = row(600, 3, 4);
    let dense = |params: &SamplingParams| matches!(candidates(&r, params), Candidates::Dense(_));
    let p = SamplingParams::default();
    assert!(
        dense(&p)
            && dense(&SamplingParams {
                min_p: 0.1,
                ..p.clone()
            })
    );
    assert!(!dense(&SamplingParams {
        top_p: 0.9,
        ..p.clone()
    }));
    assert!(!dense(&SamplingParams { top_k: 5, ..p }));
}

#[test]
fn pick_draws_each_candidate_in_proportion_to_its_weight() {
    // Dense (with zeros, past a 256-id chunk) and sparse, over a fine grid
    // of u: each id is picked for the share of the grid its weight holds.
    let mut weights = vec![0.0f32; 700];
    for (id, w) in [(3, 1.0), (255, 0.5), (256, 2.0), (600, 0.25), (699, 0.25)] {
        weights[id] = w;
    }
    let kept: Vec<(u32, f32)> = pairs(&weights).filter(|c| c.1 > 0.0).collect();
    let total: f32 = kept.iter().map(|c| c.1).sum();
    let grid = 40_000;
    for c in [
        Candidates::Dense(weights.clone()),
        Candidates::Sparse(kept.clone()),
    ] {
        let mut counts = std::collections::BTreeMap::new();
        for i in 0..grid {
            let u = (i as f32 + 0.5) / grid as f32;
            *counts.entry(c.pick(u)).or_insert(0) += 1;
        }
        assert_eq!(
            counts.keys().copied().collect::<Vec<_>>(),
            kept.iter().map(|k| k.0).collect::<Vec<_>>()
        );
        for &(id, w) in &kept {
            let share = f64::from(counts[&id]) / f64::from(grid);
            assert!((share - f64::from(w / total)).abs() < 1e-3, "{id}: {share}");
        }
        assert_eq!(c.pick(0.0), 3);
        assert_eq!(c.pick(0.999_999_9), 699);
    }
}
