//! The arithmetic of paged attention's inner loops: plain loops written so
//! they vectorise, each with one order of operations that every SIMD build
//! of the kernel keeps (the tests check the bits).

/// `o += sum_t w[t] * v[t]` (rows of `o.len()`), row after row, each element
/// `o + w * v` as one `axpy` per row computes it, with `o` held in
/// registers 64 elements at a time instead of loaded and stored per row.
#[inline(always)]
pub(super) fn weighted_sum(o: &mut [f32], w: &[f32], v: &[f32]) {
    const CHUNK: usize = 64;
    let hd = o.len();
    let mut c = 0;
    while c + CHUNK <= hd {
        let mut acc = [0f32; CHUNK];
        acc.copy_from_slice(&o[c..c + CHUNK]);
        for (t, &wt) in w.iter().enumerate() {
            let vt = &v[t * hd + c..t * hd + c + CHUNK];
            for (a, &x) in acc.iter_mut().zip(vt) {
                *a += wt * x;
            }
        }
        o[c..c + CHUNK].copy_from_slice(&acc);
        c += CHUNK;
    }
    for (t, &wt) in w.iter().enumerate() {
        axpy(&mut o[c..], wt, &v[t * hd + c..(t + 1) * hd]);
    }
}

/// In-place numerically stable softmax.
#[inline(always)]
pub(super) fn softmax(s: &mut [f32]) {
    let max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for v in s.iter_mut() {
        *v = exp_nonpositive(*v - max);
    }
    let inv = 1.0 / s.iter().sum::<f32>();
    for v in s.iter_mut() {
        *v *= inv;
    }
}

/// [`softmax`] with one more logit, `sink`, that takes its share and is
/// dropped (with `sink` at minus infinity: [`softmax`], to the bit).
#[inline(always)]
pub(super) fn softmax_with_sink(s: &mut [f32], sink: f32) {
    let max = s.iter().fold(sink, |a, &b| a.max(b));
    for v in s.iter_mut() {
        *v = exp_nonpositive(*v - max);
    }
    let inv = 1.0 / (s.iter().sum::<f32>() + exp_nonpositive(sink - max));
    for v in s.iter_mut() {
        *v *= inv;
    }
}

/// `e^x` for `x <= 0` (softmax after max subtraction), relative error < 1e-6;
/// `x < -87` gives ~0. Plain arithmetic, so loops over it vectorise, unlike libm's.
#[inline(always)]
pub(super) fn exp_nonpositive(x: f32) -> f32 {
    // e^x = 2^n * e^f with n = round(x log2(e)) and f = x - n ln2, |f| <= ln2/2.
    // ln2 is split in two (Cody-Waite) so `n * LN2_HI` is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let f = x - n * LN2_HI - n * LN2_LO;
    // e^f by its Taylor series to degree 6: truncation < 2e-7 for |f| <= ln2/2.
    let p = 1.0
        + f * (1.0
            + f * (0.5 + f * (1.0 / 6.0 + f * (1.0 / 24.0 + f * (1.0 / 120.0 + f / 720.0)))));
    // n >= -126, so the exponent field n + 127 is a normal number's.
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Dot product with eight independent accumulators so it vectorises.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `o += w * v`.
#[inline(always)]
pub(super) fn axpy(o: &mut [f32], w: f32, v: &[f32]) {
    for (o, &v) in o.iter_mut().zip(v) {
        *o += w * v;
    }
}
