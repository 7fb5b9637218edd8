//! AVX-512 VNNI tile: two blocks per 512-bit `vpdpbusd` (a 4-bit pair is one
//! 32-byte load), otherwise the 256-bit tiles' math: unsigned weights, integer
//! offsets, the panel's scale products.

use std::arch::x86_64::*;

use super::x86::{Q4_0, Q4_1, Q8_0, code, hsum, panel_scales};
use super::{Scales, Tile};
use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::QK;

/// Dispatches the runtime tile shape and format to a monomorphised kernel.
pub(super) fn tile(
    w: &QMatrix,
    (row, rr): (usize, usize),
    acts: &QActs,
    (n0, aa): (usize, usize),
    sc: &mut Scales,
) -> Tile {
    macro_rules! go {
        ($r:literal, $a:literal) => {
            // SAFETY: `Kernel::detect` chose this path only with the CPU
            // features present, and `Kernel::tile` checked the operand bounds.
            unsafe {
                match code(w.quant_type()) {
                    Q4_0 => tile_n::<Q4_0, $r, $a>(w, row, acts, n0, sc),
                    Q4_1 => tile_n::<Q4_1, $r, $a>(w, row, acts, n0, sc),
                    _ => tile_n::<Q8_0, $r, $a>(w, row, acts, n0, sc),
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

/// Blocks `blk` and, if `two`, `blk + 1` of one weight row as 64 unsigned
/// bytes in activation order (the upper half contributes nothing otherwise).
///
/// # Safety
/// AVX-512 F/BW present; the blocks are inside the row at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn load_pair<const T: u8>(p: *const u8, two: bool) -> __m512i {
    // SAFETY: the caller keeps the loaded blocks inside the matrix; the
    // masked load reads only the first block.
    unsafe {
        if T == Q8_0 {
            let z = if two {
                _mm512_loadu_si512(p.cast())
            } else {
                _mm512_maskz_loadu_epi8(u64::from(u32::MAX), p.cast())
            };
            // Signed q to unsigned q + 128; the tile subtracts 128 * sum(q_x).
            _mm512_xor_si512(z, _mm512_set1_epi8(-128))
        } else {
            // A pair's 32 bytes: low nibbles block `blk`, high nibbles
            // `blk + 1` (zero when it does not exist).
            let v = _mm256_loadu_si256(p.cast());
            let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4));
            _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
        }
    }
}

/// R weight rows x A activation rows, two blocks per step.
///
/// # Safety
/// AVX-512 F/BW/VNNI, AVX2, FMA and F16C present; `Kernel::tile` checked bounds.
// Index loops over the const-size register tiles read clearer than zips.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile_n<const T: u8, const R: usize, const A: usize>(
    w: &QMatrix,
    row: usize,
    acts: &QActs,
    n0: usize,
    sc: &mut Scales,
) -> Tile {
    let (nb, stride) = (w.blocks_per_row(), w.row_stride());
    let m_int = if T == Q8_0 { -128 } else { w.m_int };
    // Lanes 0-7 take scale 0 (block b), lanes 8-15 scale 1 (block b + 1).
    let idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    let mut acc = [[_mm512_setzero_ps(); A]; R];
    let mut off = [[_mm256_setzero_ps(); A]; R];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(super::PB);
        // SAFETY: blocks `b0..b0+n` are inside both operands.
        unsafe { panel_scales::<R, A>(w, row, acts, n0, (b0, n), sc, &mut off) };
        let mut b = 0;
        while b < n {
            let (blk, two) = (b0 + b, b + 1 < n);
            // SAFETY: blocks `blk` (and `blk + 1` when `two`) are inside both
            // operands; `b + 1 < PB` because PB is even; the masked loads
            // read only block `blk`.
            unsafe {
                let mut wq = [_mm512_setzero_si512(); R];
                for i in 0..R {
                    let at = if T == Q8_0 { blk * QK } else { blk * 16 };
                    wq[i] = load_pair::<T>(w.qs.as_ptr().add((row + i) * stride + at), two);
                }
                for j in 0..A {
                    let xb = (n0 + j) * nb + blk;
                    let px = acts.qs.as_ptr().add(xb * QK);
                    let x = if two {
                        _mm512_loadu_si512(px.cast())
                    } else {
                        _mm512_maskz_loadu_epi8(u64::from(u32::MAX), px.cast())
                    };
                    // Offsets exact in integers: lane 0 for block b, lane 8 for b + 1.
                    // Built in registers: a stack array read back as a vector
                    // stalls on store forwarding in this innermost loop.
                    let corr = if m_int == 0 {
                        _mm512_setzero_si512()
                    } else {
                        let c0 = _mm512_maskz_set1_epi32(0x0001, m_int * acts.isum[xb]);
                        if two {
                            _mm512_mask_set1_epi32(c0, 0x0100, m_int * acts.isum[xb + 1])
                        } else {
                            c0
                        }
                    };
                    for i in 0..R {
                        let d = _mm512_dpbusd_epi32(corr, wq[i], x);
                        let pair = _mm_load_sd(sc[i * A + j].as_ptr().add(b).cast());
                        let s =
                            _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(pair)));
                        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[i][j]);
                    }
                }
            }
            b += 2;
        }
        b0 += n;
    }
    let mut res = [[0f32; 4]; 4];
    for i in 0..R {
        for j in 0..A {
            let o = if T == Q4_1 { hsum(off[i][j]) } else { 0.0 };
            res[i][j] = _mm512_reduce_add_ps(acc[i][j]) + o;
        }
    }
    res
}
