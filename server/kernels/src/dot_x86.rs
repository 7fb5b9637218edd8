//! x86_64 256-bit tiles: AVX2 + FMA (`maddubs` + `madd`), and the same with
//! AVX-VNNI's fused u8 x i8 dot. Also the panel scale products that the
//! AVX-512 tile shares.

use std::arch::x86_64::*;

use super::{PB, Scales, Sink, Tile};
use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::{QK, QuantType};

/// Format codes for the const generics.
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q8_0: u8 = 2;

pub(super) fn code(ty: QuantType) -> u8 {
    match ty {
        QuantType::Q4_0 => Q4_0,
        QuantType::Q4_1 => Q4_1,
        QuantType::Q8_0 => Q8_0,
    }
}

/// Dispatches the runtime tile shape and format to a monomorphised kernel.
pub(super) fn tile<const VNNI: bool>(
    w: &QMatrix,
    row: usize,
    rr: usize,
    acts: &QActs,
    n0: usize,
    aa: usize,
    sc: &mut Scales,
) -> Tile {
    macro_rules! go {
        ($r:literal, $a:literal) => {
            // SAFETY: `Kernel::detect` chose these paths only with the CPU
            // features present, and `Kernel::tile` checked the operand bounds.
            unsafe {
                match (VNNI, code(w.quant_type())) {
                    (true, Q4_0) => tile_vnni::<Q4_0, $r, $a>(w, row, acts, n0, sc),
                    (true, Q4_1) => tile_vnni::<Q4_1, $r, $a>(w, row, acts, n0, sc),
                    (true, _) => tile_vnni::<Q8_0, $r, $a>(w, row, acts, n0, sc),
                    (false, Q4_0) => tile_avx2::<Q4_0, $r, $a>(w, row, acts, n0, sc),
                    (false, Q4_1) => tile_avx2::<Q4_1, $r, $a>(w, row, acts, n0, sc),
                    (false, _) => tile_avx2::<Q8_0, $r, $a>(w, row, acts, n0, sc),
                }
            }
        };
    }
    match (rr, aa) {
        (4, 4) => go!(4, 4),
        (4, 3) => go!(4, 3),
        (4, 2) => go!(4, 2),
        (4, 1) => go!(4, 1),
        (3, 4) => go!(3, 4),
        (3, 3) => go!(3, 3),
        (3, 2) => go!(3, 2),
        (3, 1) => go!(3, 1),
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

/// Runs the full `tr x ta` tiles of rows `m0..m1` x activations `n0..n1`
/// in one monomorphised loop; returns the ends it covered (rows `m0..fm` x
/// activations `n0..fa`), the rest being the caller's.
pub(super) fn run<const VNNI: bool>(
    w: &QMatrix,
    rows: (usize, usize),
    acts: &QActs,
    batch: (usize, usize),
    (tr, ta): (usize, usize),
    sc: &mut Scales,
    sink: &mut Sink<'_>,
) -> (usize, usize) {
    macro_rules! go {
        ($r:literal, $a:literal) => {
            // SAFETY: `Kernel::detect` chose these paths only with the CPU
            // features present, and `Kernel::tiles` checked the bounds.
            unsafe {
                match (VNNI, code(w.quant_type())) {
                    (true, Q4_0) => run_vnni::<Q4_0, $r, $a>(w, rows, acts, batch, sc, sink),
                    (true, Q4_1) => run_vnni::<Q4_1, $r, $a>(w, rows, acts, batch, sc, sink),
                    (true, _) => run_vnni::<Q8_0, $r, $a>(w, rows, acts, batch, sc, sink),
                    (false, Q4_0) => run_avx2::<Q4_0, $r, $a>(w, rows, acts, batch, sc, sink),
                    (false, Q4_1) => run_avx2::<Q4_1, $r, $a>(w, rows, acts, batch, sc, sink),
                    (false, _) => run_avx2::<Q8_0, $r, $a>(w, rows, acts, batch, sc, sink),
                }
            }
        };
    }
    match (tr, ta) {
        (4, 1) => go!(4, 1),
        (2, 4) => go!(2, 4),
        _ => (rows.0, batch.0),
    }
}

/// Eight f16 values `base[at..at+k]` as f32 (lanes past `k` zero).
///
/// A short group (a row's last blocks) is read as the 8 values ending at
/// `at + k` and moved down a lane permute, so it costs a load, not a
/// loop; only when fewer than 8 values precede its end (a first row
/// shorter than 8 blocks) does it go element by element.
///
/// # Safety
/// F16C present; `base[at..at+k]` readable.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8_f16(base: *const u16, at: usize, k: usize) -> __m256 {
    // SAFETY: the caller guarantees `base[at..at+k]`; the shifted load
    // reads `base[at+k-8..at+k]`, inside the same allocation when `at + k >= 8`.
    unsafe {
        if k >= 8 {
            _mm256_cvtph_ps(_mm_loadu_si128(base.add(at).cast()))
        } else if at + k >= 8 {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(base.add(at + k - 8).cast()));
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let moved = _mm256_permutevar8x32_ps(
                v,
                _mm256_add_epi32(lanes, _mm256_set1_epi32(8 - k as i32)),
            );
            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), lanes);
            _mm256_and_ps(moved, _mm256_castsi256_ps(keep))
        } else {
            let mut t = [0f32; 8];
            for (q, o) in t.iter_mut().enumerate().take(k) {
                let h = i32::from(*base.add(at + q));
                *o = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
            }
            _mm256_loadu_ps(t.as_ptr())
        }
    }
}

/// Eight f32 values from `p` (only the first `k` read, the rest zero).
///
/// # Safety
/// AVX present; `p..p+k` readable.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load8_f32(p: *const f32, k: usize) -> __m256 {
    // SAFETY: the caller guarantees `k` readable elements; masked-off lanes
    // are not read.
    unsafe {
        if k >= 8 {
            _mm256_loadu_ps(p)
        } else {
            let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(k as i32), lanes);
            _mm256_maskload_ps(p, mask)
        }
    }
}

/// Scale products `d_w * d_x` of blocks `b0..b0+n` (`n <= PB`) for weight
/// rows `row..row+R` and activation rows `n0..n0+A` into `sc` (entries past
/// `n` in the last group of 8 are zero); for Q4_1 also adds the offset terms
/// `m_w * s_x` of those blocks to `off`, lane-wise.
///
/// # Safety
/// AVX2, FMA and F16C present; the rows and blocks are inside both operands.
// Index loops over the const-size register tiles read clearer than zips.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn panel_scales<const R: usize, const A: usize>(
    w: &QMatrix,
    row: usize,
    acts: &QActs,
    n0: usize,
    (b0, n): (usize, usize),
    sc: &mut Scales,
    off: &mut [[__m256; A]; R],
) {
    let nb = w.blocks_per_row();
    let q41 = !w.m.is_empty();
    let (wd, wm) = (w.d.as_ptr(), w.m.as_ptr());
    let mut b = 0;
    while b < n {
        let k = (n - b).min(8);
        // The activation rows' scales once per group, for every weight row.
        let mut dx = [_mm256_setzero_ps(); A];
        let mut sx = [_mm256_setzero_ps(); A];
        for j in 0..A {
            let xi = (n0 + j) * nb + b0 + b;
            // SAFETY: `k` blocks from `b0 + b` are inside activation row `n0 + j`.
            unsafe {
                dx[j] = load8_f32(acts.d.as_ptr().add(xi), k);
                if q41 {
                    sx[j] = load8_f32(acts.s.as_ptr().add(xi), k);
                }
            }
        }
        for i in 0..R {
            let wi = (row + i) * nb + b0 + b;
            // SAFETY: `k` blocks from `b0 + b` are inside row `row + i`;
            // `b + 8 <= PB` for the store.
            unsafe {
                let dw = load8_f16(wd, wi, k);
                for j in 0..A {
                    _mm256_storeu_ps(sc[i * A + j].as_mut_ptr().add(b), _mm256_mul_ps(dw, dx[j]));
                }
                if q41 {
                    let mw = load8_f16(wm, wi, k);
                    for j in 0..A {
                        off[i][j] = _mm256_fmadd_ps(mw, sx[j], off[i][j]);
                    }
                }
            }
        }
        b += 8;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// A block's integer offset correction `m_int * sum(q_x)` in lane 0.
///
/// # Safety
/// AVX2 present.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn corr_lane0(v: i32) -> __m256i {
    _mm256_zextsi128_si256(_mm_cvtsi32_si128(v))
}

/// Defines an R weight rows x A activation rows tile kernel for one feature
/// set; each weight block is loaded once and used against all A rows.
///
/// Without VNNI, Q8 runs signed (`maddubs` would saturate i16 on unsigned
/// `255 * 127 * 2`): `|w|` times `x` with `w`'s sign. With VNNI, Q8 runs as
/// `w + 128` (u8) and the offset `-128 * sum(q_x)` is added exactly in integers.
macro_rules! tile_kernel {
    ($name:ident, $run:ident, $features:literal, $vnni:literal, $dot:ident) => {
        /// The full `R x A` tiles of rows `m0..m1` x activations `n0..n1`,
        /// each to `sink`; returns the ends covered.
        ///
        /// # Safety
        /// The CPU has `$features`; `Kernel::tiles` checked the bounds.
        #[target_feature(enable = $features)]
        unsafe fn $run<const T: u8, const R: usize, const A: usize>(
            w: &QMatrix,
            (m0, m1): (usize, usize),
            acts: &QActs,
            (n0, n1): (usize, usize),
            sc: &mut Scales,
            sink: &mut Sink<'_>,
        ) -> (usize, usize) {
            let (fm, fa) = (m0 + (m1 - m0) / R * R, n0 + (n1 - n0) / A * A);
            let mut m = m0;
            while m < fm {
                let mut n = n0;
                while n < fa {
                    // SAFETY: rows `m..m+R` and activations `n..n+A` are
                    // inside both operands.
                    let res = unsafe { $name::<T, R, A>(w, m, acts, n, sc) };
                    sink((m, R), (n, A), &res);
                    n += A;
                }
                m += R;
            }
            (fm, fa)
        }

        /// # Safety
        /// The CPU has `$features`; `Kernel::tile` checked the bounds.
        // Index loops over the const-size register tiles read clearer than zips.
        #[allow(clippy::needless_range_loop)]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $name<const T: u8, const R: usize, const A: usize>(
            w: &QMatrix,
            row: usize,
            acts: &QActs,
            n0: usize,
            sc: &mut Scales,
        ) -> Tile {
            let (nb, stride) = (w.blocks_per_row(), w.row_stride());
            // The integer offset every quant carries, fixed by the format
            // (`QMatrix::m_int`; Q8 under VNNI runs as `q + 128`), so the
            // formats without one compile without the correction.
            let m_int: i32 = match T {
                Q4_0 => -8,
                Q8_0 if $vnni => -128,
                _ => 0,
            };
            debug_assert!(T == Q8_0 || m_int == w.m_int);
            // Row bases hoisted: the inner loop only adds block offsets.
            // SAFETY: `Kernel::tiles` checked rows `row..row+R` and
            // activation rows `n0..n0+A` exist.
            let wp: [*const u8; R] =
                std::array::from_fn(|i| unsafe { w.qs.as_ptr().add((row + i) * stride) });
            let xp: [*const i8; A] =
                std::array::from_fn(|j| unsafe { acts.qs.as_ptr().add((n0 + j) * nb * QK) });
            let xs: [*const i32; A] =
                std::array::from_fn(|j| unsafe { acts.isum.as_ptr().add((n0 + j) * nb) });
            let mut acc = [[_mm256_setzero_ps(); A]; R];
            let mut off = [[_mm256_setzero_ps(); A]; R];
            let nib = _mm256_set1_epi8(0x0F);
            // One block `blk` (panel slot `bl`) against every activation row:
            // `wq` the dot's unsigned operand (Q8 without VNNI: `|w|`, with
            // `raw` giving the signs).
            let block = |acc: &mut [[__m256; A]; R],
                         sc: &Scales,
                         wq: &[__m256i; R],
                         raw: &[__m256i; R],
                         blk: usize,
                         bl: usize| {
                for j in 0..A {
                    // SAFETY: block `blk` is inside activation row `n0 + j`.
                    let x = unsafe { _mm256_loadu_si256(xp[j].add(blk * QK).cast()) };
                    let corr = if m_int != 0 {
                        // SAFETY: as above; AVX2 is among this kernel's features.
                        unsafe { corr_lane0(m_int * *xs[j].add(blk)) }
                    } else {
                        _mm256_setzero_si256()
                    };
                    for i in 0..R {
                        let x = if T == Q8_0 && !$vnni {
                            _mm256_sign_epi8(x, raw[i])
                        } else {
                            x
                        };
                        let d = $dot(wq[i], x, corr, m_int != 0);
                        let s = _mm256_broadcast_ss(&sc[i * A + j][bl]);
                        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[i][j]);
                    }
                }
            };
            let mut b0 = 0;
            while b0 < nb {
                let n = (nb - b0).min(PB);
                // SAFETY: blocks `b0..b0+n` are inside both operands.
                unsafe { panel_scales::<R, A>(w, row, acts, n0, (b0, n), sc, &mut off) };
                let mut b = 0;
                while b < n {
                    let blk = b0 + b;
                    // A 4-bit pair (low nibbles block `blk`, high `blk + 1`)
                    // or one 8-bit block: raw bytes per row.
                    let at = if T == Q8_0 { blk * QK } else { blk * 16 };
                    // SAFETY: the pair or block at `at` is inside each row.
                    let raw: [__m256i; R] = std::array::from_fn(|i| unsafe {
                        _mm256_loadu_si256(wp[i].add(at).cast())
                    });
                    if T == Q8_0 {
                        let wq = raw.map(|r| {
                            if $vnni {
                                _mm256_xor_si256(r, _mm256_set1_epi8(-128))
                            } else {
                                _mm256_sign_epi8(r, r)
                            }
                        });
                        block(&mut acc, sc, &wq, &raw, blk, b);
                        b += 1;
                    } else {
                        let lo = raw.map(|r| _mm256_and_si256(r, nib));
                        block(&mut acc, sc, &lo, &raw, blk, b);
                        if b + 1 < n {
                            let hi = raw.map(|r| _mm256_and_si256(_mm256_srli_epi16(r, 4), nib));
                            block(&mut acc, sc, &hi, &raw, blk + 1, b + 1);
                        }
                        b += 2;
                    }
                }
                b0 += n;
            }
            let mut res = [[0f32; 4]; 4];
            for i in 0..R {
                for j in 0..A {
                    res[i][j] = hsum(acc[i][j]) + if T == Q4_1 { hsum(off[i][j]) } else { 0.0 };
                }
            }
            res
        }
    };
}

/// Eight i32 lanes of `sum(u8 a * i8 b)` (+ `corr`) via `maddubs` + `madd`;
/// no pair of products can saturate i16 because |a| <= 128 and |b| <= 127
/// (Q8 runs as `|w|` against signed `x`).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_avx2(a: __m256i, b: __m256i, corr: __m256i, with_corr: bool) -> __m256i {
    let d = _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
    if with_corr {
        _mm256_add_epi32(d, corr)
    } else {
        d
    }
}

/// The same sum in one `vpdpbusd`, accumulated onto `corr`.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn dot_vnni(a: __m256i, b: __m256i, corr: __m256i, _with_corr: bool) -> __m256i {
    _mm256_dpbusd_avx_epi32(corr, a, b)
}

tile_kernel!(tile_avx2, run_avx2, "avx2,fma,f16c", false, dot_avx2);
tile_kernel!(tile_vnni, run_vnni, "avx2,fma,f16c,avxvnni", true, dot_vnni);
