//! Block dot-product tiles: up to 2 weight rows x 4 activation rows at once,
//! so each weight block is loaded and unpacked once per tile.

use crate::qact::QActs;
use crate::qmatrix::{QK, QMatrix, QuantType};

/// Results of one tile: `[weight row][activation row]`, without the Q4 offset term.
pub(crate) type Tile = [[f32; 4]; 2];

/// Which implementation computes the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Portable integer math, the reference.
    Scalar,
    /// AVX2 + FMA (checked at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernel {
    /// The fastest kernel this CPU supports.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Self::Avx2;
        }
        Self::Scalar
    }

    /// Scaled block dots of weight rows `row..row+rr` against activation rows `n0..n0+aa`.
    ///
    /// Callers keep `rr <= 2`, `aa <= 4`, and both ranges inside the operands.
    pub(crate) fn tile(
        self,
        w: &QMatrix,
        row: usize,
        rr: usize,
        acts: &QActs,
        n0: usize,
        aa: usize,
    ) -> Tile {
        let nb = w.blocks_per_row();
        // The SIMD path reads through raw pointers: these bounds make it sound.
        assert!(rr <= 2 && aa <= 4 && (row + rr) * nb <= w.d.len());
        assert!((n0 + aa) * nb <= acts.d.len());
        match self {
            Self::Scalar => tile_scalar(w, row, rr, acts, n0, aa),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => avx2::tile(w, row, rr, acts, n0, aa),
        }
    }
}

fn tile_scalar(w: &QMatrix, row: usize, rr: usize, acts: &QActs, n0: usize, aa: usize) -> Tile {
    let nb = w.blocks_per_row();
    let mut res = [[0f32; 4]; 2];
    for (i, res_row) in res.iter_mut().enumerate().take(rr) {
        for (j, r) in res_row.iter_mut().enumerate().take(aa) {
            let mut acc = 0f32;
            for b in 0..nb {
                let wb = (row + i) * nb + b;
                let xb = (n0 + j) * nb + b;
                let xq = &acts.qs[xb * QK..(xb + 1) * QK];
                let idot = if w.quant_type() == QuantType::Q8_0 {
                    let q = &w.qs[wb * QK..(wb + 1) * QK];
                    q.iter()
                        .zip(xq)
                        .map(|(&a, &b)| i32::from(a as i8) * i32::from(b))
                        .sum()
                } else {
                    let q = &w.qs[wb * 16..(wb + 1) * 16];
                    let (xl, xh) = xq.split_at(16);
                    q.iter()
                        .zip(xl.iter().zip(xh))
                        .map(|(&q, (&l, &h))| {
                            i32::from(q & 0x0F) * i32::from(l) + i32::from(q >> 4) * i32::from(h)
                        })
                        .sum::<i32>()
                };
                acc += w.d[wb] * acts.d[xb] * idot as f32;
            }
            *r = acc;
        }
    }
    res
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::Tile;
    use crate::qact::QActs;
    use crate::qmatrix::{QK, QMatrix, QuantType};

    /// Dispatches the runtime tile shape to a monomorphised kernel.
    pub(super) fn tile(
        w: &QMatrix,
        row: usize,
        rr: usize,
        acts: &QActs,
        n0: usize,
        aa: usize,
    ) -> Tile {
        let q8 = w.quant_type() == QuantType::Q8_0;
        macro_rules! go {
            ($r:literal, $a:literal) => {
                // SAFETY: `Kernel::detect` chose this path only with AVX2 and FMA
                // present, and `Kernel::tile` checked the operand bounds.
                unsafe {
                    if q8 {
                        tile_n::<true, $r, $a>(w, row, acts, n0)
                    } else {
                        tile_n::<false, $r, $a>(w, row, acts, n0)
                    }
                }
            };
        }
        match (rr, aa) {
            (2, 4) => go!(2, 4),
            (2, 3) => go!(2, 3),
            (2, 2) => go!(2, 2),
            (2, 1) => go!(2, 1),
            (1, 4) => go!(1, 4),
            (1, 3) => go!(1, 3),
            (1, 2) => go!(1, 2),
            _ => go!(1, 1),
        }
    }

    /// Loads weight block `wb` as 32 bytes in activation order: unsigned
    /// nibbles for Q4, raw i8 for Q8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_weights<const Q8: bool>(w: &QMatrix, wb: usize) -> __m256i {
        // SAFETY: the caller keeps `wb` inside the matrix.
        unsafe {
            if Q8 {
                _mm256_loadu_si256(w.qs.as_ptr().add(wb * QK).cast())
            } else {
                let p = _mm_loadu_si128(w.qs.as_ptr().add(wb * 16).cast());
                let both = _mm256_set_m128i(_mm_srli_epi16(p, 4), p);
                _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
            }
        }
    }

    /// R weight rows x A activation rows; accumulates 8 f32 lanes per pair.
    // Index loops over the const-size register tiles read clearer than zips.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_n<const Q8: bool, const R: usize, const A: usize>(
        w: &QMatrix,
        row: usize,
        acts: &QActs,
        n0: usize,
    ) -> Tile {
        let nb = w.blocks_per_row();
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); A]; R];
        for b in 0..nb {
            let mut wq = [_mm256_setzero_si256(); R];
            let mut dw = [_mm256_setzero_ps(); R];
            for i in 0..R {
                let wb = (row + i) * nb + b;
                // SAFETY: `Kernel::tile` checked `(row + R) * nb <= blocks`.
                unsafe {
                    wq[i] = load_weights::<Q8>(w, wb);
                    dw[i] = _mm256_set1_ps(*w.d.get_unchecked(wb));
                }
            }
            // maddubs needs an unsigned left operand: for signed Q8 use |w| and
            // move w's sign onto x.
            let wabs = if Q8 {
                wq.map(|v| _mm256_sign_epi8(v, v))
            } else {
                wq
            };
            for j in 0..A {
                let xb = (n0 + j) * nb + b;
                // SAFETY: `Kernel::tile` checked `(n0 + A) * nb <= blocks`.
                let (xq, dx) = unsafe {
                    (
                        _mm256_loadu_si256(acts.qs.as_ptr().add(xb * QK).cast()),
                        _mm256_set1_ps(*acts.d.get_unchecked(xb)),
                    )
                };
                for i in 0..R {
                    let x = if Q8 { _mm256_sign_epi8(xq, wq[i]) } else { xq };
                    let p16 = _mm256_maddubs_epi16(wabs[i], x);
                    let p32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                    acc[i][j] = _mm256_fmadd_ps(p32, _mm256_mul_ps(dw[i], dx), acc[i][j]);
                }
            }
        }
        let mut res = [[0f32; 4]; 2];
        for i in 0..R {
            for j in 0..A {
                res[i][j] = hsum(acc[i][j]);
            }
        }
        res
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}
