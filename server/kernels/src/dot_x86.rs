//! x86_64 256-bit tiles over the row-interleaved layout: AVX2 + FMA
//! (`maddubs`), and the same with AVX-VNNI's fused u8 x i8 dot.
//!
//! A block of a row group is 8 registers (Q4: 4 loads, each split into low
//! and high nibbles; Q8: 8 loads), register `u` holding weights `4u..4u+4`
//! of each of the 8 rows in its lanes; against the activation's same 4
//! bytes broadcast, `maddubs`/`vpdpbusd` leave each row's partial dot in its
//! own lane, so 8 such ops give the group's 8 block dots in one register.

use std::arch::x86_64::*;

use super::{ACTS, Sink, Tile};
use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::{GROUP, QK, QuantType};

/// Format codes for the const generics.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;

/// Every tile of groups `g0..g1` x activations `n0..n1` to `sink`, on the
/// kernel monomorphised for this format.
pub(super) fn run<const VNNI: bool>(
    w: &QMatrix,
    groups: (usize, usize),
    acts: &QActs,
    batch: (usize, usize),
    sink: &mut Sink<'_>,
) {
    // SAFETY: `Kernel::detect` chose these paths only with the CPU features
    // present, and `Kernel::tiles` checked the bounds.
    unsafe {
        match (VNNI, w.quant_type()) {
            (true, QuantType::Q4_0) => run_vnni::<Q4_0>(w, groups, acts, batch, sink),
            (true, QuantType::Q4_1) => run_vnni::<Q4_1>(w, groups, acts, batch, sink),
            (true, QuantType::Q8_0) => run_vnni::<Q8_0>(w, groups, acts, batch, sink),
            (false, QuantType::Q4_0) => run_avx2::<Q4_0>(w, groups, acts, batch, sink),
            (false, QuantType::Q4_1) => run_avx2::<Q4_1>(w, groups, acts, batch, sink),
            (false, QuantType::Q8_0) => run_avx2::<Q8_0>(w, groups, acts, batch, sink),
        }
    }
}

/// Eight i32 lanes of one block's dots (8 rows) via `maddubs`: Q4 sums the
/// eight i16 products in i16 (16 products of at most 15 * 127 fit), Q8 runs
/// `|w|` against `x` with `w`'s sign and widens each product pair.
///
/// # Safety
/// AVX2 present; `x` points at a block's 32 activation bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2<const T: u8>(wq: &[__m256i; 8], wraw: &[__m256i; 8], x: *const i8) -> __m256i {
    // SAFETY: `x..x+32` readable (the caller's guarantee).
    let xb = |u: usize| unsafe { _mm256_set1_epi32(x.add(4 * u).cast::<i32>().read_unaligned()) };
    let ones = _mm256_set1_epi16(1);
    if T == Q8_0 {
        let mut s = _mm256_setzero_si256();
        for (u, (&w, &raw)) in wq.iter().zip(wraw).enumerate() {
            let p = _mm256_maddubs_epi16(w, _mm256_sign_epi8(xb(u), raw));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
        }
        s
    } else {
        let mut s = _mm256_setzero_si256();
        for (u, &w) in wq.iter().enumerate() {
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w, xb(u)));
        }
        _mm256_madd_epi16(s, ones)
    }
}

/// The same dots with `vpdpbusd` (Q8 runs as `w + 128`; the caller adds
/// the exact correction).
///
/// # Safety
/// AVX-VNNI present; `x` points at a block's 32 activation bytes.
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn dot_vnni<const T: u8>(wq: &[__m256i; 8], _raw: &[__m256i; 8], x: *const i8) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for (u, &w) in wq.iter().enumerate() {
        // SAFETY: `x..x+32` readable (the caller's guarantee).
        let xb = unsafe { _mm256_set1_epi32(x.add(4 * u).cast::<i32>().read_unaligned()) };
        s = _mm256_dpbusd_avx_epi32(s, w, xb);
    }
    s
}

/// Defines the tile loop and tile for one feature set.
macro_rules! tile_kernel {
    ($run:ident, $tile:ident, $features:literal, $vnni:literal, $dot:ident) => {
        /// # Safety
        /// The CPU has `$features`; `Kernel::tiles` checked the bounds.
        #[target_feature(enable = $features)]
        unsafe fn $run<const T: u8>(
            w: &QMatrix,
            (g0, g1): (usize, usize),
            acts: &QActs,
            (n0, n1): (usize, usize),
            sink: &mut Sink<'_>,
        ) {
            let full = n0 + (n1 - n0) / ACTS * ACTS;
            for g in g0..g1 {
                let mut n = n0;
                // SAFETY (each call): group `g` and activations `n..n+A` are
                // inside both operands.
                while n < full {
                    sink(g, (n, ACTS), &unsafe { $tile::<T, ACTS>(w, g, acts, n) });
                    n += ACTS;
                }
                let res = match n1 - n {
                    0 => continue,
                    1 => unsafe { $tile::<T, 1>(w, g, acts, n) },
                    2 => unsafe { $tile::<T, 2>(w, g, acts, n) },
                    _ => unsafe { $tile::<T, 3>(w, g, acts, n) },
                };
                sink(g, (n, n1 - n), &res);
            }
        }

        /// Group `g` against activation rows `n0..n0+A`.
        ///
        /// # Safety
        /// The CPU has `$features`; the group and rows are inside both operands.
        // Index loops over the const-size register tiles read clearer than zips.
        #[allow(clippy::needless_range_loop)]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn $tile<const T: u8, const A: usize>(
            w: &QMatrix,
            g: usize,
            acts: &QActs,
            n0: usize,
        ) -> Tile {
            let nb = w.blocks_per_row();
            let gbb = if T == Q8_0 {
                GROUP * QK
            } else {
                GROUP * QK / 2
            };
            debug_assert_eq!(gbb, w.quant_type().group_block_bytes());
            // The integer offset every quant carries, fixed by the format
            // (Q8 under VNNI runs as `q + 128`).
            let m_int: i32 = match T {
                Q4_0 => -8,
                Q8_0 if $vnni => -128,
                _ => 0,
            };
            let first = g * nb;
            // SAFETY: `Kernel::tiles` checked group `g` and rows `n0..n0+A`
            // exist; every offset below stays inside them.
            let (wq, wd, wm) = unsafe {
                (
                    w.qs.as_ptr().add(first * gbb),
                    w.d.as_ptr().add(first * GROUP),
                    w.m.as_ptr().wrapping_add(first * GROUP),
                )
            };
            let at = |j: usize| (n0 + j) * nb;
            let xq: [*const i8; A] =
                std::array::from_fn(|j| unsafe { acts.qs.as_ptr().add(at(j) * QK) });
            let xd: [*const f32; A] =
                std::array::from_fn(|j| unsafe { acts.d.as_ptr().add(at(j)) });
            let xs: [*const f32; A] = std::array::from_fn(|j| acts.s.as_ptr().wrapping_add(at(j)));
            let xi: [*const i32; A] =
                std::array::from_fn(|j| unsafe { acts.isum.as_ptr().add(at(j)) });
            let nib = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); A];
            for b in 0..nb {
                // SAFETY: block `b` of group `g` and of each activation row.
                unsafe {
                    let blk = wq.add(b * gbb);
                    let load = |u: usize| _mm256_loadu_si256(blk.add(32 * u).cast());
                    let raw: [__m256i; 8] = if T == Q8_0 {
                        std::array::from_fn(load)
                    } else {
                        // Low nibbles are weights 4u.., high ones 16 + 4u...
                        std::array::from_fn(|u| {
                            let r = load(u % 4);
                            if u < 4 {
                                _mm256_and_si256(r, nib)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16(r, 4), nib)
                            }
                        })
                    };
                    let wu: [__m256i; 8] = if T != Q8_0 {
                        raw
                    } else if $vnni {
                        raw.map(|r| _mm256_xor_si256(r, _mm256_set1_epi8(-128)))
                    } else {
                        raw.map(|r| _mm256_sign_epi8(r, r))
                    };
                    let dw = _mm256_cvtph_ps(_mm_loadu_si128(wd.add(b * GROUP).cast()));
                    let mw = if T == Q4_1 {
                        _mm256_cvtph_ps(_mm_loadu_si128(wm.add(b * GROUP).cast()))
                    } else {
                        _mm256_setzero_ps()
                    };
                    for j in 0..A {
                        let mut d = $dot::<T>(&wu, &raw, xq[j].add(b * QK));
                        if m_int != 0 {
                            d = _mm256_add_epi32(d, _mm256_set1_epi32(m_int * *xi[j].add(b)));
                        }
                        let s = _mm256_mul_ps(dw, _mm256_set1_ps(*xd[j].add(b)));
                        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[j]);
                        if T == Q4_1 {
                            acc[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*xs[j].add(b)), acc[j]);
                        }
                    }
                }
            }
            let mut res = [[0f32; GROUP]; ACTS];
            for j in 0..A {
                // SAFETY: a row of `res` holds 8 f32.
                unsafe { _mm256_storeu_ps(res[j].as_mut_ptr(), acc[j]) };
            }
            res
        }
    };
}

tile_kernel!(run_avx2, tile_avx2, "avx2,fma,f16c", false, dot_avx2);
tile_kernel!(run_vnni, tile_vnni, "avx2,fma,f16c,avxvnni", true, dot_vnni);
