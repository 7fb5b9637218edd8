//! x86_64 tiles: AVX2 + FMA, and the same with AVX-VNNI's fused u8 x i8 dot.

use std::arch::x86_64::*;

use super::Tile;
use crate::qact::QActs;
use crate::qmatrix::{QK, QMatrix, QuantType};

/// Dispatches the runtime tile shape to a monomorphised kernel.
pub(super) fn tile<const VNNI: bool>(
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
            // SAFETY: `Kernel::detect` chose these paths only with the CPU
            // features present, and `Kernel::tile` checked the operand bounds.
            unsafe {
                match (VNNI, q8) {
                    (true, true) => tile_vnni::<true, $r, $a>(w, row, acts, n0),
                    (true, false) => tile_vnni::<false, $r, $a>(w, row, acts, n0),
                    (false, true) => tile_avx2::<true, $r, $a>(w, row, acts, n0),
                    (false, false) => tile_avx2::<false, $r, $a>(w, row, acts, n0),
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

/// Loads weight block `wb` as 32 unsigned bytes in activation order.
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

/// Eight i32 lanes of `sum(u8 a * i8 b)` via `maddubs` + `madd`; no pair of
/// products can saturate i16 because |a| <= 128 and |b| <= 127.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn dot_avx2(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// The same sum in one `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx2,fma,avxvnni")]
fn dot_vnni(a: __m256i, b: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Block `b` of weight rows `row..row+R`, ready for the dot products.
struct BlockCol<const R: usize> {
    /// Weights as the dot's left operand's sign source.
    wq: [__m256i; R],
    /// Weights as the dot's unsigned left operand.
    wabs: [__m256i; R],
    /// Scale products, lane `4i + j` = `dw_i * dx_j`.
    sc: [f32; 8],
}

/// Scale products of block `b` for R weight rows x 4 activation rows (lane
/// `4i + j` = `dw_i * dx_j`); with `offset`, also adds the offset terms
/// `m_i * s_j` (same lanes) to `off`.
///
/// # Safety
/// AVX2, FMA and F16C present; rows `row..row+R` inside `w`; `n0 + 4` inside
/// the padded block-major scales of `acts`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_scales<const R: usize>(
    w: &QMatrix,
    acts: &QActs,
    (row, n0, b): (usize, usize, usize),
    offset: bool,
    off: &mut __m256,
) -> __m256 {
    let nb = w.blocks_per_row();
    let batch = acts.d.len() / nb;
    // SAFETY: the caller's contract covers every index below.
    unsafe {
        let dm0 = *w.dm.get_unchecked(row * nb + b);
        let dm1 = *w.dm.get_unchecked((row + R - 1) * nb + b);
        // f16 [d0, m0, d1, m1] -> f32, then spread: lanes 0-3 row 0, 4-7 row 1.
        let v = _mm_cvtph_ps(_mm_set_epi32(0, 0, dm1 as i32, dm0 as i32));
        let v = _mm256_castps128_ps256(v);
        let dwv = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
        if offset {
            // Only Q4_1's stored m: the other formats' offsets are applied
            // exactly in integer space by the tiles.
            let mv = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
            let s = _mm_loadu_ps(acts.st.as_ptr().add(b * batch + n0));
            *off = _mm256_fmadd_ps(mv, _mm256_set_m128(s, s), *off);
        }
        let dx = _mm_loadu_ps(acts.dt.as_ptr().add(b * batch + n0));
        _mm256_mul_ps(dwv, _mm256_set_m128(dx, dx))
    }
}

/// Loads block `b` of R weight rows and, unless `signed`, adds its offset
/// terms `m_i * s_j` (lane `4i + j`) to `off`.
///
/// # Safety
/// As for [`block_scales`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_col<const Q8: bool, const R: usize>(
    w: &QMatrix,
    acts: &QActs,
    (row, n0, b): (usize, usize, usize),
    signed: bool,
    off: &mut __m256,
) -> BlockCol<R> {
    let nb = w.blocks_per_row();
    let mut wq = [_mm256_setzero_si256(); R];
    // SAFETY: the caller's contract covers every index below.
    unsafe {
        for (i, q) in wq.iter_mut().enumerate() {
            *q = load_weights::<Q8>(w, (row + i) * nb + b);
            if signed {
                *q = _mm256_xor_si256(*q, _mm256_set1_epi8(-128));
            }
        }
        // The tile broadcasts the products' lanes from memory, which uses
        // load ports rather than the vector ALUs.
        let mut sc = [0f32; 8];
        let q41 = w.quant_type() == QuantType::Q4_1;
        let prod = block_scales::<R>(w, acts, (row, n0, b), q41, off);
        _mm256_storeu_ps(sc.as_mut_ptr(), prod);
        // The u8 x i8 dot needs an unsigned left operand: for signed Q8
        // (maddubs path) use |w| and move w's sign onto x.
        let wabs = if signed {
            wq.map(|v| _mm256_sign_epi8(v, v))
        } else {
            wq
        };
        BlockCol { wq, wabs, sc }
    }
}

/// Horizontal sums of the accumulators plus the offset lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn finish<const R: usize, const A: usize>(acc: &[[__m256; A]; R], off: __m256) -> Tile {
    let mut offs = [0f32; 8];
    // SAFETY: `offs` holds 8 f32.
    unsafe { _mm256_storeu_ps(offs.as_mut_ptr(), off) };
    let mut res = [[0f32; 4]; 2];
    for (i, row) in acc.iter().enumerate() {
        for (j, &a) in row.iter().enumerate() {
            res[i][j] = hsum(a) + offs[4 * i + j];
        }
    }
    res
}

/// Defines an R weight rows x A activation rows tile kernel for one feature
/// set; each weight block is loaded once and used against all A rows.
///
/// `$signed_q8`: whether Q8 must go back to signed weights, because `maddubs`
/// saturates i16 on `255 * 127 * 2`; `vpdpbusd` sums in i32 and takes u8 as is.
macro_rules! tile_kernel {
    ($name:ident, $features:literal, $dot:ident, $signed_q8:literal) => {
        /// # Safety
        /// The CPU has `$features`; `Kernel::tile` checked the bounds.
        // Index loops over the const-size register tiles read clearer than zips.
        #[allow(clippy::needless_range_loop)]
        #[target_feature(enable = $features)]
        unsafe fn $name<const Q8: bool, const R: usize, const A: usize>(
            w: &QMatrix,
            row: usize,
            acts: &QActs,
            n0: usize,
        ) -> Tile {
            let nb = w.blocks_per_row();
            let signed = Q8 && $signed_q8;
            let mut acc = [[_mm256_setzero_ps(); A]; R];
            let mut off = _mm256_setzero_ps();
            for b in 0..nb {
                // SAFETY: forwarded from this function's contract.
                let col = unsafe { block_col::<Q8, R>(w, acts, (row, n0, b), signed, &mut off) };
                for j in 0..A {
                    let xb = (n0 + j) * nb + b;
                    // SAFETY: `Kernel::tile` checked `(n0 + A) * nb <= blocks`.
                    let xq = unsafe { _mm256_loadu_si256(acts.qs.as_ptr().add(xb * QK).cast()) };
                    // Unsigned weights carry an offset of m_int per unit:
                    // added to one lane of the integer dot, so it is exact.
                    let m_int = if signed { 0 } else { w.m_int };
                    let corr = _mm256_setr_epi32(m_int * acts.isum[xb], 0, 0, 0, 0, 0, 0, 0);
                    for i in 0..R {
                        let x = if signed {
                            _mm256_sign_epi8(xq, col.wq[i])
                        } else {
                            xq
                        };
                        let p = _mm256_cvtepi32_ps(_mm256_add_epi32($dot(col.wabs[i], x), corr));
                        let scale = _mm256_broadcast_ss(&col.sc[4 * i + j]);
                        acc[i][j] = _mm256_fmadd_ps(p, scale, acc[i][j]);
                    }
                }
            }
            finish(&acc, off)
        }
    };
}

tile_kernel!(tile_avx2, "avx2,fma,f16c", dot_avx2, true);
tile_kernel!(tile_vnni, "avx2,fma,f16c,avxvnni", dot_vnni, false);
