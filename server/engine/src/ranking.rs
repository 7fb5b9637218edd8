//! Ranking a vocabulary-wide row without sorting all of it: the argmax, the
//! k best, and the candidates one draw picks from. A row is 50k-150k
//! logits and every decoding row ranks one per step, so each of these is
//! one or two passes over the row; only the few best are ever sorted.
//!
//! Order is (value descending, id ascending), a total order: every result is
//! the same set, in the same order, whatever the selection algorithm does
//! with ties.

use std::cmp::Ordering;

use crate::params::SamplingParams;

/// Up to this many, the k best are kept in a sorted list while scanning;
/// beyond it, selected from the whole row.
const SCAN_K: usize = 64;

/// (id, value), best first.
fn best_first(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The lowest id holding the largest value; NaN never counts as largest.
pub fn argmax(row: &[f32]) -> u32 {
    // Lane maxima first (this loop vectorises), then the first position
    // holding the maximum.
    const LANES: usize = 8;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            if x > *m {
                *m = x;
            }
        }
    }
    let max = max_of(lanes.iter().chain(tail).copied());
    // Whole chunks are tested without branching (this vectorises too).
    let chunk = row
        .chunks(LANES)
        .position(|c| c.iter().fold(false, |hit, &x| hit | (x == max)))
        .unwrap_or(0);
    let rest = &row[(chunk * LANES).min(row.len())..];
    let lane = rest.iter().position(|&x| x == max).unwrap_or(0);
    (chunk * LANES + lane) as u32
}

/// The largest value, ignoring NaN; -inf for none.
fn max_of(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
}

/// The sum of `values`, in 8 lanes (so it vectorises), then across them.
pub fn sum(values: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut lanes = [0.0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for chunk in chunks {
        for (s, &x) in lanes.iter_mut().zip(chunk) {
            *s += x;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The sum of `weight(x - shift)` over `row`, in 8 lanes, without
/// materialising the weights.
pub fn weight_sum(row: &[f32], shift: f32) -> f32 {
    const LANES: usize = 8;
    let mut lanes = [0.0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&x| weight(x - shift)).sum();
    for chunk in chunks {
        for (s, &x) in lanes.iter_mut().zip(chunk) {
            *s += weight(x - shift);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The `k` best (id, value) pairs of `row`, best first.
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    if k > SCAN_K {
        let mut all: Vec<(u32, f32)> = pairs(row).collect();
        keep_best(&mut all, k);
        return all;
    }
    // A sorted list of the best so far; most values lose to its last entry
    // with one comparison.
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for pair in pairs(row) {
        if best.len() == k && best_first(&pair, &best[k - 1]) != Ordering::Less {
            continue;
        }
        let at = best.partition_point(|b| best_first(b, &pair) == Ordering::Less);
        best.insert(at, pair);
        best.truncate(k);
    }
    best
}

fn pairs(row: &[f32]) -> impl Iterator<Item = (u32, f32)> + '_ {
    row.iter().enumerate().map(|(i, &x)| (i as u32, x))
}

/// Keeps the `k` best of `v`, best first.
fn keep_best(v: &mut Vec<(u32, f32)>, k: usize) {
    if k < v.len() {
        v.select_nth_unstable_by(k - 1, best_first);
        v.truncate(k);
    }
    v.sort_unstable_by(best_first);
}

/// What one draw picks from, each weight proportional to the token's
/// probability at `temperature` (> 0) after top-k, min-p and top-p: the
/// model's distribution restricted to the kept tokens. Tokens at negative
/// infinity (masked) or NaN weigh 0 and are never picked.
#[derive(Debug, Clone, PartialEq)]
pub enum Candidates {
    /// Every token's weight, by id (temperature and min-p only, the common
    /// case): nothing is gathered or sorted.
    Dense(Vec<f32>),
    /// The kept (id, weight) pairs, best first (top-k or top-p).
    Sparse(Vec<(u32, f32)>),
}

impl Candidates {
    /// The candidate at fraction `u` (in [0, 1)) of the kept mass, walking
    /// the candidates in their order (a dense row 256 ids at a time).
    pub fn pick(&self, u: f32) -> u32 {
        match self {
            Candidates::Sparse(cand) => {
                let mut r = u * cand.iter().map(|c| c.1).sum::<f32>();
                for &(id, w) in cand {
                    if r < w {
                        return id;
                    }
                    r -= w;
                }
                cand.last().map_or(0, |c| c.0)
            }
            Candidates::Dense(weights) => {
                const CHUNK: usize = 256;
                let mut r = u * sum(weights);
                for (k, chunk) in weights.chunks(CHUNK).enumerate() {
                    let s = sum(chunk);
                    if r >= s {
                        r -= s;
                        continue;
                    }
                    for (i, &w) in chunk.iter().enumerate() {
                        if r < w {
                            return (k * CHUNK + i) as u32;
                        }
                        r -= w;
                    }
                }
                // Rounding ran past the end: the last token with weight.
                weights
                    .iter()
                    .rposition(|&w| w > 0.0)
                    .map_or(0, |i| i as u32)
            }
        }
    }
}

/// The candidates of `logits` under `p`'s temperature, top-k, min-p and
/// top-p; a row with nothing left gives its argmax alone.
pub fn candidates(logits: &[f32], p: &SamplingParams) -> Candidates {
    let t = p.temperature;
    if p.top_k > 0 {
        let best = top_k(logits, p.top_k);
        let scaled_max = max_of(best.iter().map(|c| c.1)) / t;
        let cand: Vec<(u32, f32)> = best
            .into_iter()
            .map(|(i, l)| (i, weight(l / t - scaled_max)))
            .collect();
        let total = cand.iter().map(|c| c.1).sum();
        return sparse(cand, total, p, logits);
    }
    // The whole row: one vectorised pass for the weights.
    let scaled_max = max_of(logits.iter().copied()) / t;
    let mut weights: Vec<f32> = logits.iter().map(|&l| weight(l / t - scaled_max)).collect();
    let total = sum(&weights);
    if p.top_p >= 1.0 {
        // The best weight is exp(0) = 1, so min-p's floor is min_p itself.
        for w in &mut weights {
            if *w < p.min_p {
                *w = 0.0;
            }
        }
        return if weights.iter().any(|&w| w > 0.0) {
            Candidates::Dense(weights)
        } else {
            Candidates::Sparse(vec![(argmax(logits), 1.0)])
        };
    }
    // Exact: the tokens lighter than this hold less than 1 - top_p of the
    // mass together, so the heavier ones fill the nucleus first.
    let light = (1.0 - p.top_p) * total / weights.len() as f32;
    let cand = pairs(&weights)
        .filter(|c| c.1 > 0.0 && c.1 >= light)
        .collect();
    sparse(cand, total, p, logits)
}

/// min-p, then top-p, over gathered candidates whose weights sum to
/// `total` before either.
fn sparse(mut cand: Vec<(u32, f32)>, total: f32, p: &SamplingParams, logits: &[f32]) -> Candidates {
    cand.retain(|c| c.1 > 0.0 && c.1 >= p.min_p);
    if p.top_p < 1.0 {
        nucleus(&mut cand, total, p.top_p);
    }
    if cand.is_empty() {
        cand.push((argmax(logits), 1.0));
    }
    Candidates::Sparse(cand)
}

/// exp(x) for x <= 0, within one ulp of libm's (tested), and 0 where that
/// is below f32's normal range (masked tokens at -inf, and NaN, included).
/// Plain arithmetic (no libm call, no branch), so a loop of it vectorises.
pub fn weight(x: f32) -> f32 {
    // exp(x) = 2^n * exp(r): n = x / ln 2 rounded to nearest (the shifter
    // constant's addition rounds), r = x - n ln 2 in two parts, exp(r) by
    // Cephes' expf polynomial.
    const SHIFTER: f32 = 12_582_912.0; // 1.5 * 2^23
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let alive = x >= -87.0; // false for NaN; exp(-87) is f32's smallest normal order
    let x = if alive { x } else { 0.0 };
    let shifted = x * std::f32::consts::LOG2_E + SHIFTER;
    let n = shifted - SHIFTER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let z = r * r;
    let poly =
        (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
            + 1.666_666_5e-1)
            * r
            + 0.5)
            * z
            + r
            + 1.0;
    // n is an integer in [-126, 0]: the low bits of `shifted` hold it.
    let n_bits = shifted.to_bits().wrapping_sub(SHIFTER.to_bits());
    let pow2 = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if alive { poly * pow2 } else { 0.0 }
}

/// Cuts `cand` to the fewest best entries whose probabilities (weight over
/// `total`) reach `top_p`, best first: the best 64 are selected and sorted,
/// then 8 times as many, until they hold the mass (a peaked distribution
/// needs one round).
fn nucleus(cand: &mut Vec<(u32, f32)>, total: f32, top_p: f32) {
    let n = cand.len();
    let mut k = SCAN_K.min(n);
    loop {
        if k < n {
            cand.select_nth_unstable_by(k - 1, best_first);
        }
        cand[..k].sort_unstable_by(best_first);
        let mut sum = 0.0;
        let reached = cand[..k].iter().position(|c| {
            sum += c.1 / total;
            sum >= top_p
        });
        if let Some(i) = reached {
            cand.truncate(i + 1);
            return;
        }
        if k == n {
            return;
        }
        k = k.saturating_mul(8).min(n);
    }
}

#[cfg(test)]
mod tests;
