//! The low-rank update's arithmetic on host rows of one adapter: the pair's
//! f16 weights are widened to f32 once per call (into scratch that stays in
//! cache), then rows go four at a time, so each weight loaded serves every
//! row of the block and the rows' sums are independent chains the CPU
//! overlaps. Multiply-adds in eight lanes, which the compiler keeps in
//! vector registers; fused where the target has FMA (elsewhere `mul_add`
//! would be a library call). A row's result never depends on the others.

use half::slice::HalfFloatSliceExt;

use super::LoraPair;

/// Rows per block.
pub(crate) const BLOCK: usize = 4;

/// What a block reuses: the widened weights and the rows' `A x`.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    a: Vec<f32>,
    b_t: Vec<f32>,
    t: Vec<f32>,
}

/// `a * b + c`, fused where the target has FMA.
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_feature = "fma")]
    {
        a.mul_add(b, c)
    }
    #[cfg(not(target_feature = "fma"))]
    {
        a * b + c
    }
}

/// `delta[k] = scale * B @ (A @ xs[k])` for the rows `xs`, `delta` holding
/// `xs.len()` rows of the pair's output width.
pub(crate) fn delta_rows(p: &LoraPair, xs: &[&[f32]], delta: &mut [f32], s: &mut Scratch) {
    s.a.resize(p.a().len(), 0.0);
    p.a().convert_to_f32_slice(&mut s.a);
    s.b_t.resize(p.b_t().len(), 0.0);
    p.b_t().convert_to_f32_slice(&mut s.b_t);
    let width = p.dims().0;
    for (xs, delta) in xs.chunks(BLOCK).zip(delta.chunks_mut(BLOCK * width)) {
        match xs {
            [a] => block::<1>(p, [a], delta, s),
            [a, b] => block::<2>(p, [a, b], delta, s),
            [a, b, c] => block::<3>(p, [a, b, c], delta, s),
            [a, b, c, d] => block::<4>(p, [a, b, c, d], delta, s),
            _ => {}
        }
    }
}

fn block<const N: usize>(p: &LoraPair, xs: [&[f32]; N], delta: &mut [f32], s: &mut Scratch) {
    let (rows, cols) = p.dims();
    let rank = p.rank();
    let Scratch { a, b_t, t } = s;
    // t[j * N + k] = scale * (A_j . x_k)
    t.clear();
    for a in a.chunks_exact(cols) {
        let d = dots(a, xs);
        t.extend(d.iter().map(|v| v * p.scale()));
    }
    let outs: [&mut [f32]; N] = split_rows(delta, rows);
    let whole = rows / 8 * 8;
    for c in (0..whole).step_by(8) {
        let mut acc = [[0f32; 8]; N];
        for (j, b) in b_t.chunks_exact(rows).enumerate().take(rank) {
            let b = &b[c..c + 8];
            for k in 0..N {
                let tj = t[j * N + k];
                for l in 0..8 {
                    acc[k][l] = madd(tj, b[l], acc[k][l]);
                }
            }
        }
        for k in 0..N {
            outs[k][c..c + 8].copy_from_slice(&acc[k]);
        }
    }
    for o in whole..rows {
        for k in 0..N {
            let b = b_t.chunks_exact(rows).map(|b| b[o]);
            outs[k][o] = b.enumerate().map(|(j, b)| t[j * N + k] * b).sum();
        }
    }
}

/// `[A . x_k]` for each row, the rows' sums in lock-step.
fn dots<const N: usize>(a: &[f32], xs: [&[f32]; N]) -> [f32; N] {
    let mut acc = [[0f32; 8]; N];
    let whole = a.len() / 8 * 8;
    for c in (0..whole).step_by(8) {
        let av = &a[c..c + 8];
        for k in 0..N {
            let xv = &xs[k][c..c + 8];
            for l in 0..8 {
                acc[k][l] = madd(av[l], xv[l], acc[k][l]);
            }
        }
    }
    let mut out = [0f32; N];
    for k in 0..N {
        let tail: f32 = a[whole..]
            .iter()
            .zip(&xs[k][whole..])
            .map(|(p, q)| p * q)
            .sum();
        out[k] = acc[k].iter().sum::<f32>() + tail;
    }
    out
}

/// The first `N` rows of `width` of `buf`, each its own slice.
fn split_rows<const N: usize>(buf: &mut [f32], width: usize) -> [&mut [f32]; N] {
    let mut rest = buf;
    std::array::from_fn(|_| {
        let (row, tail) = std::mem::take(&mut rest).split_at_mut(width);
        rest = tail;
        row
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scale * B @ (A @ x)`, the obvious way.
    fn reference(p: &LoraPair, x: &[f32]) -> Vec<f32> {
        let (rows, cols) = p.dims();
        let t: Vec<f32> = (0..p.rank())
            .map(|j| (0..cols).map(|c| p.a()[j * cols + c].to_f32() * x[c]).sum())
            .collect();
        (0..rows)
            .map(|o| {
                p.scale()
                    * (0..p.rank())
                        .map(|j| p.b_t()[j * rows + o].to_f32() * t[j])
                        .sum::<f32>()
            })
            .collect()
    }

    #[test]
    fn blocks_of_every_size_equal_the_reference_with_tails() {
        // Widths that are and are not multiples of 8.
        for (rank, rows, cols) in [(4, 16, 32), (3, 13, 21), (16, 40, 8), (1, 1, 1)] {
            let a: Vec<f32> = (0..rank * cols)
                .map(|i| ((i * 37) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..rows * rank)
                .map(|i| ((i * 11) % 13) as f32 / 13.0 - 0.5)
                .collect();
            let p = LoraPair::new(&a, &b, rank, rows, 1.5).unwrap();
            let xs: Vec<Vec<f32>> = (0..2 * BLOCK + 1)
                .map(|k| (0..cols).map(|i| ((i + 3 * k) % 7) as f32 - 3.0).collect())
                .collect();
            let mut t = Scratch::default();
            for n in 1..=2 * BLOCK + 1 {
                let rows_in: Vec<&[f32]> = xs[..n].iter().map(Vec::as_slice).collect();
                let mut delta = vec![9.0; n * rows];
                delta_rows(&p, &rows_in, &mut delta, &mut t);
                for (k, x) in xs[..n].iter().enumerate() {
                    let want = reference(&p, x);
                    let got = &delta[k * rows..(k + 1) * rows];
                    let diff = got
                        .iter()
                        .zip(&want)
                        .map(|(g, w)| (g - w).abs())
                        .fold(0.0, f32::max);
                    assert!(
                        diff < 1e-4,
                        "rank {rank} {rows}x{cols} block of {n}, row {k}: {diff}"
                    );
                }
            }
        }
    }
}
