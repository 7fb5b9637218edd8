//! Activation rows quantised to 8-bit blocks, once per matmul call.

use half::f16;
use rayon::prelude::*;

use crate::qmatrix::QK;

/// Activations as blocks of 32 i8 with one f32 scale per block.
pub(crate) struct QActs {
    /// Quantised values, `batch * cols`.
    pub(crate) qs: Vec<i8>,
    /// Per-block scale `max|x| / 127`.
    pub(crate) d: Vec<f32>,
    /// Per-block `d * sum(q)`, the factor Q4_1's stored offset multiplies.
    pub(crate) s: Vec<f32>,
    /// Per-block `sum(q)` as an integer: Q4_0's and Q8_0's offsets are whole
    /// multiples of `d`, so they are applied exactly in integer space (in
    /// floats the offset and the unsigned dot would cancel catastrophically).
    pub(crate) isum: Vec<i32>,
    /// `d` block-major (`[block][row]`) plus 4 zeros of padding, so SIMD tiles
    /// load the scales of 4 consecutive rows with one load.
    pub(crate) dt: Vec<f32>,
    /// `s` in the same block-major padded layout.
    pub(crate) st: Vec<f32>,
}

impl QActs {
    /// Quantises `batch` rows `x` (row length a multiple of 32) block by block.
    pub(crate) fn quantize(x: &[f32], batch: usize) -> Self {
        let nb = x.len() / QK;
        let (mut qs, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; nb], vec![0f32; nb]);
        let mut isum = vec![0i32; nb];
        // Rows in parallel once there are enough to pay for the hand-off.
        let rows = if batch >= 8 { batch } else { 1 };
        let (cols, nbr) = ((x.len() / rows).max(QK), (nb / rows).max(1));
        x.par_chunks(cols)
            .zip(qs.par_chunks_mut(cols))
            .zip(d.par_chunks_mut(nbr).zip(s.par_chunks_mut(nbr)))
            .zip(isum.par_chunks_mut(nbr))
            .for_each(|(((x, q), (d, s)), isum)| {
                let blocks = x.chunks_exact(QK).zip(q.chunks_exact_mut(QK));
                let sums = d.iter_mut().zip(s.iter_mut()).zip(isum.iter_mut());
                for ((x, q), ((d, s), isum)) in blocks.zip(sums) {
                    let (scale, sum) = quantize_block(x, q);
                    // Scales rounded through f16 as GGML's Q8_0/Q8_1 store
                    // them, so results match llama.cpp's on the same file.
                    *d = f16::from_f32(scale).to_f32();
                    *s = f16::from_f32(scale * sum as f32).to_f32();
                    *isum = sum;
                }
            });
        let (dt, st) = (block_major(&d, batch), block_major(&s, batch));
        Self {
            qs,
            d,
            s,
            isum,
            dt,
            st,
        }
    }
}

/// One block: returns `(d, sum(q))`. Written as lane-wise loops so the
/// compiler vectorises it.
fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let mut lanes = [0f32; 8];
    for c in x.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let amax = lanes.iter().fold(0f32, |a, &b| a.max(b));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (qv, &v) in q.iter_mut().zip(x) {
        // The clamp guards rounding at the edge; NaN casts to 0.
        *qv = (v * inv).round().clamp(-127.0, 127.0) as i8;
        sum += i32::from(*qv);
    }
    (d, sum)
}

/// `[row][block]` to `[block][row]`, plus 4 zeros of padding.
fn block_major(v: &[f32], batch: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len() + 4];
    let per_row = v.len() / batch.max(1);
    for (i, &x) in v.iter().enumerate() {
        t[(i % per_row) * batch + i / per_row] = x;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantizes_to_max_127_and_sums() {
        let mut x = vec![0f32; 32];
        x[0] = 2.54;
        x[1] = -1.3;
        x[2] = 0.009;
        let a = QActs::quantize(&x, 1);
        assert_eq!(a.qs[0], 127);
        assert_eq!(a.qs[1], -65);
        assert_eq!(a.qs[2], 0);
        // Scales as GGML stores them: rounded through f16.
        let f16r = |x: f32| f16::from_f32(x).to_f32();
        assert_eq!(a.d[0], f16r(0.02));
        assert_eq!(a.s[0], f16r(0.02 * 62.0));
        assert_eq!(a.isum[0], 62);
    }

    #[test]
    fn transposed_scales_are_block_major() {
        // Two rows of two blocks, block maxima 1, 2 (row 0) and 3, 4 (row 1).
        let x: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|&m| [m; 32])
            .collect();
        let a = QActs::quantize(&x, 2);
        let want =
            [1.0f32, 3.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0].map(|m| f16::from_f32(m / 127.0).to_f32());
        assert_eq!(a.dt, want);
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let a = QActs::quantize(&[0f32; 64], 2);
        assert_eq!(a.d, vec![0.0, 0.0]);
        assert!(a.qs.iter().all(|&q| q == 0));
    }
}
