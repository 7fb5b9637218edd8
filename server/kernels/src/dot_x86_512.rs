//! AVX-512 VNNI tile: two blocks per 512-bit `vpdpbusd`, otherwise the same
//! math as the 256-bit tiles (unsigned weights, offsets, per-block scales).

use std::arch::x86_64::*;

use super::Tile;
use super::x86::block_scales;
use crate::qact::QActs;
use crate::qmatrix::{QK, QMatrix, QuantType};

/// Dispatches the runtime tile shape to a monomorphised kernel.
pub(super) fn tile(w: &QMatrix, row: usize, rr: usize, acts: &QActs, n0: usize, aa: usize) -> Tile {
    let q8 = w.quant_type() == QuantType::Q8_0;
    macro_rules! go {
        ($r:literal, $a:literal) => {
            // SAFETY: `Kernel::detect` chose this path only with the CPU
            // features present, and `Kernel::tile` checked the operand bounds.
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

/// Weight blocks `wb` and, if `two`, `wb + 1` as 64 unsigned bytes (zeros
/// in the upper half otherwise), in activation order.
///
/// # Safety
/// AVX-512 F/BW present; the blocks are inside `w`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn load_weights2<const Q8: bool>(w: &QMatrix, wb: usize, two: bool) -> __m512i {
    // SAFETY: the caller keeps the loaded blocks inside the matrix; the
    // masked load reads only the first block.
    unsafe {
        if Q8 {
            let p = w.qs.as_ptr().add(wb * QK);
            if two {
                _mm512_loadu_si512(p.cast())
            } else {
                _mm512_maskz_loadu_epi8(u64::from(u32::MAX), p.cast())
            }
        } else {
            let p = w.qs.as_ptr().add(wb * 16);
            let y = if two {
                _mm256_loadu_si256(p.cast())
            } else {
                _mm256_zextsi128_si256(_mm_loadu_si128(p.cast()))
            };
            // 128-bit lanes [q_b, q_b, q_b1, q_b1]; high nibbles in lanes 1, 3.
            let z = _mm512_castsi256_si512(y);
            let z = _mm512_shuffle_i64x2::<0b01_01_00_00>(z, z);
            let z = _mm512_mask_blend_epi64(0b1100_1100, z, _mm512_srli_epi16::<4>(z));
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
unsafe fn tile_n<const Q8: bool, const R: usize, const A: usize>(
    w: &QMatrix,
    row: usize,
    acts: &QActs,
    n0: usize,
) -> Tile {
    let nb = w.blocks_per_row();
    // Lane pattern k: lanes 0-7 take product lane k (block b), 8-15 lane 8 + k (block b + 1).
    let idx: [__m512i; 8] = std::array::from_fn(|k| {
        _mm512_mask_blend_epi32(
            0xFF00,
            _mm512_set1_epi32(k as i32),
            _mm512_set1_epi32(8 + k as i32),
        )
    });
    let mut acc = [[_mm512_setzero_ps(); A]; R];
    let mut off = _mm256_setzero_ps();
    let mut b = 0;
    while b < nb {
        let two = b + 1 < nb;
        // SAFETY: blocks b (and b + 1 when `two`) are inside both operands.
        unsafe {
            let q41 = w.quant_type() == QuantType::Q4_1;
            let p0 = block_scales::<R>(w, acts, (row, n0, b), q41, &mut off);
            let p1 = if two {
                block_scales::<R>(w, acts, (row, n0, b + 1), q41, &mut off)
            } else {
                p0
            };
            let prod = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(p0)),
                _mm256_castps_pd(p1),
            ));
            let mut wq = [_mm512_setzero_si512(); R];
            for i in 0..R {
                wq[i] = load_weights2::<Q8>(w, (row + i) * nb + b, two);
            }
            for j in 0..A {
                let px = acts.qs.as_ptr().add(((n0 + j) * nb + b) * QK);
                let xq = if two {
                    _mm512_loadu_si512(px.cast())
                } else {
                    _mm512_maskz_loadu_epi8(u64::from(u32::MAX), px.cast())
                };
                // Q4_0/Q8_0 offsets, exact in integers: lane 0 for block b,
                // lane 8 for block b + 1.
                // Built in registers: a stack array read back as a vector
                // stalls on store forwarding in this innermost loop.
                let xb = (n0 + j) * nb + b;
                let corr = if w.m_int == 0 {
                    _mm512_setzero_si512()
                } else {
                    let c0 = _mm512_maskz_set1_epi32(0x0001, w.m_int * acts.isum[xb]);
                    if two {
                        _mm512_mask_set1_epi32(c0, 0x0100, w.m_int * acts.isum[xb + 1])
                    } else {
                        c0
                    }
                };
                for i in 0..R {
                    let d = _mm512_dpbusd_epi32(corr, wq[i], xq);
                    let scale = _mm512_permutexvar_ps(idx[4 * i + j], prod);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), scale, acc[i][j]);
                }
            }
        }
        b += 2;
    }
    let mut offs = [0f32; 8];
    // SAFETY: `offs` holds 8 f32.
    unsafe { _mm256_storeu_ps(offs.as_mut_ptr(), off) };
    let mut res = [[0f32; 4]; 2];
    for i in 0..R {
        for j in 0..A {
            res[i][j] = _mm512_reduce_add_ps(acc[i][j]) + offs[4 * i + j];
        }
    }
    res
}
