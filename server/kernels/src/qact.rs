//! Activation rows quantised to 8-bit blocks (GGML's Q8 scheme), reused
//! across calls, and optionally fused with the op that produces them
//! (RMSNorm, SiLU-and-multiply), so the f32 activations never hit memory.

use half::f16;
use rayon::prelude::*;

use crate::Error;
use crate::quant_type::QK;

/// Activations as blocks of 32 i8 with per-block scales. Buffers are kept
/// between calls: quantising into a reused `QActs` allocates nothing once it
/// has held the largest shape.
#[derive(Debug, Default, Clone)]
pub struct QActs {
    batch: usize,
    cols: usize,
    /// Quantised values: `batch` rows of [`Self::stride`] bytes, the
    /// `cols` values then zeros.
    pub(crate) qs: Vec<i8>,
    /// Per-block scale `max|x| / 127`, rounded through f16, `[row][block]`.
    pub(crate) d: Vec<f32>,
    /// Per-block `d * sum(q)` rounded through f16: the factor Q4_1's stored
    /// offset multiplies.
    pub(crate) s: Vec<f32>,
    /// Per-block `sum(q)` as an integer: Q4_0's and Q8_0's offsets are whole
    /// multiples of `d`, so they are applied exactly in integer space (in
    /// floats the offset and the unsigned dot would cancel catastrophically).
    pub(crate) isum: Vec<i32>,
    /// Per-block `[sum(q[0..16]), sum(q[16..32])]`: the 16-weight sub-blocks
    /// of Q6_K/Q3_K/Q2_K take their offsets and minima per half.
    pub(crate) isum16: Vec<[i16; 2]>,
    /// Per-block `sum(q) * d` in f32, exact (`|sum| < 2^12` times an f16's
    /// 11-bit significand fits f32's 24): the factor Q4_K/Q5_K's minima multiply.
    pub(crate) dsum: Vec<f32>,
    /// Per-row factor of the fused producer (RMSNorm's `1 / rms`).
    row_aux: Vec<f32>,
}

impl QActs {
    /// An empty set; the first quantisation sizes it.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rows held.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Row length.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes from one quantised row to the next: `cols`, plus a cache
    /// line where `cols` is an even number of lines. A tile reads the same
    /// columns of up to 16 rows together; at a stride of 2^k bytes those
    /// lines would all fall in one L1 set, more than its ways.
    pub(crate) fn stride(&self) -> usize {
        row_stride(self.cols)
    }

    /// Quantises `batch` rows `x` (row length a positive multiple of 32).
    pub fn quantize(&mut self, x: &[f32], batch: usize) -> Result<(), Error> {
        let cols = row_len(x.len(), batch)?;
        self.fill(batch, cols, |n, b, out| {
            out.copy_from_slice(&x[n * cols + b * QK..n * cols + (b + 1) * QK]);
        });
        Ok(())
    }

    /// Quantises `rms_norm(x) * weight` row by row, as candle's `rms_norm`
    /// computes it (`x / sqrt(mean(x^2) + eps) * weight`).
    pub fn quantize_rms_norm(
        &mut self,
        x: &[f32],
        batch: usize,
        weight: &[f32],
        eps: f32,
    ) -> Result<(), Error> {
        let cols = row_len(x.len(), batch)?;
        if weight.len() != cols {
            return Err(Error::Length {
                what: "norm weight",
                expected: cols,
                got: weight.len(),
            });
        }
        let mut aux = std::mem::take(&mut self.row_aux);
        aux.clear();
        aux.extend(x.chunks_exact(cols).map(|r| {
            let sum2: f32 = r.iter().map(|&v| v * v).sum();
            (sum2 / cols as f32 + eps).sqrt()
        }));
        self.fill(batch, cols, |n, b, out| {
            let at = n * cols + b * QK;
            let (xs, ws) = (&x[at..at + QK], &weight[b * QK..(b + 1) * QK]);
            for ((o, &v), &w) in out.iter_mut().zip(xs).zip(ws) {
                *o = v / aux[n] * w;
            }
        });
        self.row_aux = aux;
        Ok(())
    }

    /// Quantises `silu(gate) * up` (each `batch` rows), as candle's
    /// `silu(gate) * up` computes it.
    pub fn quantize_silu_mul(
        &mut self,
        gate: &[f32],
        up: &[f32],
        batch: usize,
    ) -> Result<(), Error> {
        let cols = row_len(gate.len(), batch)?;
        if up.len() != gate.len() {
            return Err(Error::Length {
                what: "up projection",
                expected: gate.len(),
                got: up.len(),
            });
        }
        self.fill(batch, cols, |n, b, out| {
            let at = n * cols + b * QK;
            for ((o, &g), &u) in out.iter_mut().zip(&gate[at..at + QK]).zip(&up[at..at + QK]) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        });
        Ok(())
    }

    /// Rows `rows` of `src`, in that order: the activations of the tokens
    /// one expert reads, quantised once for the whole step (a gathered row
    /// is, bit for bit, that row quantised alone).
    pub fn gather(&mut self, src: &QActs, rows: &[usize]) -> Result<(), Error> {
        if let Some(&row) = rows.iter().find(|&&r| r >= src.batch) {
            return Err(Error::RowOutOfRange {
                row,
                rows: src.batch,
            });
        }
        let (cols, nb) = (src.cols, src.cols / QK);
        (self.batch, self.cols) = (rows.len(), cols);
        self.qs.clear();
        self.d.clear();
        self.s.clear();
        self.isum.clear();
        self.isum16.clear();
        self.dsum.clear();
        for &r in rows {
            let b = r * nb..(r + 1) * nb;
            let at = r * src.stride();
            self.qs.extend_from_slice(&src.qs[at..at + src.stride()]);
            self.d.extend_from_slice(&src.d[b.clone()]);
            self.s.extend_from_slice(&src.s[b.clone()]);
            self.isum.extend_from_slice(&src.isum[b.clone()]);
            self.isum16.extend_from_slice(&src.isum16[b.clone()]);
            self.dsum.extend_from_slice(&src.dsum[b]);
        }
        Ok(())
    }

    /// Sizes the buffers for `batch x cols` (keeping their capacity) and
    /// quantises every block from the 32 values `block(row, b, out)` writes.
    fn fill(
        &mut self,
        batch: usize,
        cols: usize,
        block: impl Fn(usize, usize, &mut [f32; QK]) + Sync,
    ) {
        let nb = cols / QK;
        (self.batch, self.cols) = (batch, cols);
        let stride = row_stride(cols);
        self.qs.resize(batch * stride, 0);
        self.d.resize(batch * nb, 0.0);
        self.s.resize(batch * nb, 0.0);
        self.isum.resize(batch * nb, 0);
        self.isum16.resize(batch * nb, [0; 2]);
        self.dsum.resize(batch * nb, 0.0);
        let row = |n: usize, out: RowMut<'_>| {
            out.qs[cols..].fill(0);
            let mut vals = [0f32; QK];
            for b in 0..nb {
                block(n, b, &mut vals);
                let q = &mut out.qs[b * QK..(b + 1) * QK];
                let (scale, sum) = quantize_block(&vals, q);
                // Scales rounded through f16 as GGML's Q8_0/Q8_1 store
                // them, so results match llama.cpp's on the same file.
                let d = f16::from_f32(scale).to_f32();
                out.d[b] = d;
                out.s[b] = f16::from_f32(scale * sum as f32).to_f32();
                out.isum[b] = sum;
                let low: i32 = q[..QK / 2].iter().map(|&v| i32::from(v)).sum();
                // |sum of 16| <= 16 * 127 fits an i16.
                out.isum16[b] = [low as i16, (sum - low) as i16];
                out.dsum[b] = sum as f32 * d;
            }
        };
        let rows = self
            .qs
            .chunks_mut(stride)
            .zip(self.d.chunks_mut(nb))
            .zip(self.s.chunks_mut(nb))
            .zip(self.isum.chunks_mut(nb))
            .zip(self.isum16.chunks_mut(nb))
            .zip(self.dsum.chunks_mut(nb))
            .map(|(((((qs, d), s), isum), isum16), dsum)| RowMut {
                qs,
                d,
                s,
                isum,
                isum16,
                dsum,
            });
        // Rows in parallel once there are enough to pay for the hand-off.
        if batch >= 8 {
            rows.enumerate().par_bridge().for_each(|(n, r)| row(n, r));
        } else {
            for (n, r) in rows.enumerate() {
                row(n, r);
            }
        }
    }
}

/// One activation row's share of each buffer.
struct RowMut<'a> {
    qs: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    isum: &'a mut [i32],
    isum16: &'a mut [[i16; 2]],
    dsum: &'a mut [f32],
}

/// [`QActs::stride`] of rows of `cols` values.
fn row_stride(cols: usize) -> usize {
    if cols.is_multiple_of(128) {
        cols + 64
    } else {
        cols
    }
}

/// The row length of `len` values in `batch` rows, checked.
fn row_len(len: usize, batch: usize) -> Result<usize, Error> {
    let cols = len.checked_div(batch).unwrap_or(0);
    if batch == 0 || cols * batch != len || cols == 0 || !cols.is_multiple_of(QK) {
        return Err(Error::BadCols { cols, multiple: QK });
    }
    Ok(cols)
}

/// One block: returns `(d, sum(q))`. Written as lane-wise loops so the
/// compiler vectorises it.
fn quantize_block(x: &[f32; QK], q: &mut [i8]) -> (f32, i32) {
    let mut lanes = [0f32; 8];
    for c in x.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(c) {
            // As `m.max(|v|)` (NaN never wins), in a form that vectorises.
            let a = v.abs();
            if a > *m {
                *m = a;
            }
        }
    }
    let amax = lanes.iter().fold(0f32, |a, &b| a.max(b));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    // Round half away from zero (GGML's roundf) into i32 lanes first, then
    // narrow. A saturating `as` cast is a scalar instruction sequence per
    // value; the value here is already finite and in range, so the plain
    // conversion (one vector instruction for 8) is exact. The clamp guards
    // rounding at the edge; NaN becomes 0, as `as` made it.
    let mut wide = [0i32; QK];
    for (w, &v) in wide.iter_mut().zip(x) {
        let r = (v * inv).round().clamp(-127.0, 127.0);
        let r = if r.is_nan() { 0.0 } else { r };
        // SAFETY: `r` is finite and within [-127, 127], so it fits an i32.
        *w = unsafe { r.to_int_unchecked::<i32>() };
    }
    let mut sum = 0i32;
    for (qv, &w) in q.iter_mut().zip(&wide) {
        *qv = w as i8;
        sum += w;
    }
    (d, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quantized(x: &[f32], batch: usize) -> QActs {
        let mut a = QActs::new();
        a.quantize(x, batch).unwrap();
        a
    }

    #[test]
    fn quantizes_to_max_127_and_sums() {
        let mut x = vec![0f32; 32];
        x[0] = 2.54;
        x[1] = -1.3;
        x[2] = 0.009;
        let a = quantized(&x, 1);
        assert_eq!(a.qs[0], 127);
        assert_eq!(a.qs[1], -65);
        assert_eq!(a.qs[2], 0);
        // Scales as GGML stores them: rounded through f16.
        let f16r = |x: f32| f16::from_f32(x).to_f32();
        assert_eq!(a.d[0], f16r(0.02));
        assert_eq!(a.s[0], f16r(0.02 * 62.0));
        assert_eq!(a.isum[0], 62);
        assert_eq!(a.isum16[0], [62, 0]);
        assert_eq!(a.dsum[0], 62.0 * f16r(0.02));
    }

    #[test]
    fn rounding_is_half_away_from_zero_as_ggml_and_nan_is_zero() {
        // With 127 in the block, d = 1 and each value is rounded as it is:
        // ties, the floats either side of them, and NaN.
        let below = |v: f32| f32::from_bits(v.to_bits() - 1);
        let mut x = vec![127.0f32];
        for k in [0.5f32, 1.5, 2.5, 63.5, 126.5] {
            x.extend([k, -k, below(k), -below(k), f32::from_bits(k.to_bits() + 1)]);
        }
        x.extend([f32::NAN, -127.0, 0.0, -0.0]);
        x.resize(QK, 0.25);
        let a = quantized(&x, 1);
        assert_eq!(a.d[0], 1.0);
        let want: Vec<i8> = x
            .iter()
            .map(|&v| if v.is_nan() { 0 } else { v.round() as i8 })
            .collect();
        assert_eq!(a.qs, want);
        assert_eq!(&a.qs[1..6], &[1, -1, 0, 0, 1]);
        assert_eq!(a.isum[0], want.iter().map(|&q| i32::from(q)).sum::<i32>());
    }

    #[test]
    fn rows_an_even_number_of_lines_long_are_a_line_apart_padded_with_zeros() {
        // (cols, stride): 2^k-byte rows would put a tile's 16 rows' lines
        // in one L1 set; odd line counts and sub-line rows stay packed.
        for (cols, stride) in [(32, 32), (64, 64), (96, 96), (128, 192), (8192, 8256)] {
            let x: Vec<f32> = (0..3 * cols).map(|i| 1.0 + (i % 7) as f32).collect();
            let mut a = QActs::new();
            // A larger shape first: the pad of a reused buffer is zeroed too.
            a.quantize(&vec![5.0; 4 * (cols + 64)], 4).unwrap();
            a.quantize(&x, 3).unwrap();
            assert_eq!((a.stride(), a.qs.len()), (stride, 3 * stride), "{cols}");
            for row in a.qs.chunks(stride) {
                assert!(row[..cols].iter().all(|&q| q != 0), "{cols}");
                assert!(row[cols..].iter().all(|&q| q == 0), "{cols}");
            }
            let mut g = QActs::new();
            g.gather(&a, &[2, 0]).unwrap();
            assert_eq!(g.qs[..stride], a.qs[2 * stride..], "{cols}");
        }
    }

    #[test]
    fn zero_block_has_zero_scale() {
        let a = quantized(&[0f32; 64], 2);
        assert_eq!(a.d, vec![0.0, 0.0]);
        assert!(a.qs.iter().all(|&q| q == 0));
    }

    #[test]
    fn fused_producers_quantize_exactly_what_they_compute() {
        let (batch, cols) = (9, 96);
        let x: Vec<f32> = (0..batch * cols)
            .map(|i| (i * 7919 % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let weight: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32 / 64.0).collect();
        let eps = 1e-5;
        let normed: Vec<f32> = x
            .chunks(cols)
            .flat_map(|r| {
                let m = (r.iter().map(|v| v * v).sum::<f32>() / cols as f32 + eps).sqrt();
                r.iter().zip(&weight).map(move |(v, w)| v / m * w)
            })
            .collect();
        let up: Vec<f32> = x.iter().map(|v| v * 0.7 - 0.1).collect();
        let swiglu: Vec<f32> = x
            .iter()
            .zip(&up)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let mut a = QActs::new();
        a.quantize_rms_norm(&x, batch, &weight, eps).unwrap();
        let b = quantized(&normed, batch);
        assert_eq!(
            (a.qs, a.d, a.s, a.isum, a.isum16, a.dsum),
            (b.qs, b.d, b.s, b.isum, b.isum16, b.dsum)
        );
        // Reused across shapes: a smaller batch shrinks it, nothing stale left.
        let mut a = QActs::new();
        a.quantize(&x, batch).unwrap();
        a.quantize_silu_mul(&x[..2 * cols], &up[..2 * cols], 2)
            .unwrap();
        let b = quantized(&swiglu[..2 * cols], 2);
        assert_eq!((a.batch(), a.cols()), (2, cols));
        assert_eq!(
            (a.qs, a.d, a.s, a.isum, a.isum16, a.dsum),
            (b.qs, b.d, b.s, b.isum, b.isum16, b.dsum)
        );
    }

    #[test]
    fn gathered_rows_are_the_rows_quantised_alone() {
        let (batch, cols) = (5, 64);
        let x: Vec<f32> = (0..batch * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let all = quantized(&x, batch);
        let mut g = QActs::new();
        g.gather(&all, &[3, 0, 3]).unwrap();
        let mut want = Vec::new();
        for r in [3, 0, 3] {
            want.extend_from_slice(&x[r * cols..(r + 1) * cols]);
        }
        let w = quantized(&want, 3);
        assert_eq!((g.batch(), g.cols()), (3, cols));
        assert_eq!(
            (g.qs, g.d, g.s, g.isum, g.isum16, g.dsum),
            (w.qs, w.d, w.s, w.isum, w.isum16, w.dsum)
        );
        let mut g = QActs::new();
        assert_eq!(
            g.gather(&all, &[5]),
            Err(Error::RowOutOfRange { row: 5, rows: 5 })
        );
    }

    #[test]
    fn rejects_bad_shapes() {
        let mut a = QActs::new();
        assert_eq!(
            a.quantize(&[0.0; 31], 1),
            Err(Error::BadCols {
                cols: 31,
                multiple: QK
            })
        );
        assert_eq!(
            a.quantize(&[0.0; 64], 3),
            Err(Error::BadCols {
                cols: 21,
                multiple: QK
            })
        );
        assert_eq!(
            a.quantize(&[], 0),
            Err(Error::BadCols {
                cols: 0,
                multiple: QK
            })
        );
        let err = a.quantize_rms_norm(&[0.0; 64], 1, &[1.0; 32], 1e-5);
        assert!(matches!(
            err,
            Err(Error::Length {
                what: "norm weight",
                ..
            })
        ));
        let err = a.quantize_silu_mul(&[0.0; 64], &[0.0; 32], 1);
        assert!(matches!(
            err,
            Err(Error::Length {
                what: "up projection",
                ..
            })
        ));
    }
}
