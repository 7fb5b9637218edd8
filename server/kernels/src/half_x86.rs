//! The f16 matrix's tiles on x86_64: a column's 32 weights widened by F16C
//! into two 512-bit (AVX-512) or, a half block at a time, two 256-bit
//! registers, times each activation broadcast, by FMA into one accumulator
//! per (activation, row lanes): the scalar tile's chains, in registers.

use std::arch::x86_64::*;

use half::f16;

use super::{BLOCK, HalfTile};

/// Columns ahead the weights are prefetched (64 bytes a column).
const AHEAD: usize = 16;

/// Expands to a `match` on the tile's activation count calling `$f::<A>`.
macro_rules! by_width {
    ($aa:expr, $f:ident, $args:tt, [$($n:literal)*]) => {
        match $aa {
            $($n => $f::<$n> $args,)*
            _ => unreachable!("a tile of {} activations", $aa),
        }
    };
}

/// A tile of up to 12 activations on AVX-512, over every block `w` holds
/// at once (several only for [`FEW`](super::FEW) activations).
///
/// # Safety
/// The CPU has AVX-512F; `w` holds whole blocks of `cols` columns, `x`
/// holds `cols * aa` activations, `1 <= aa <= 12`, `res` a row per block
/// and activation.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn tile_avx512(w: &[f16], x: &[f32], aa: usize, res: &mut HalfTile) {
    let (cols, nb) = (x.len() / aa, res.len() / aa);
    debug_assert_eq!(w.len(), nb * cols * BLOCK);
    let (w, x) = (w.as_ptr(), x.as_ptr());
    // SAFETY: as the caller guarantees.
    unsafe {
        match (aa, nb) {
            (1, 2) => zmm_tile::<1, 2>(w, x, cols, res),
            (1, 3) => zmm_tile::<1, 3>(w, x, cols, res),
            (1, 4) => zmm_tile::<1, 4>(w, x, cols, res),
            (2, 2) => zmm_tile::<2, 2>(w, x, cols, res),
            (2, 3) => zmm_tile::<2, 3>(w, x, cols, res),
            (2, 4) => zmm_tile::<2, 4>(w, x, cols, res),
            (_, 1) => by_width!(aa, zmm_one, (w, x, cols, res), [1 2 3 4 5 6 7 8 9 10 11 12]),
            _ => unreachable!("a tile of {aa} activations x {nb} blocks"),
        }
    }
}

/// A tile of up to 6 activations on AVX2, a block at a time, half a block
/// (16 rows) at a time.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` holds whole blocks of `cols`
/// columns, `x` holds `cols * aa` activations, `1 <= aa <= 6`, `res` a row
/// per block and activation.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_avx2(w: &[f16], x: &[f32], aa: usize, res: &mut HalfTile) {
    let cols = x.len() / aa;
    for (block, res) in w.chunks_exact(cols * BLOCK).zip(res.chunks_exact_mut(aa)) {
        for half in [0, BLOCK / 2] {
            // SAFETY: as the caller guarantees; `half + 16 <= BLOCK`.
            unsafe {
                let (w, x) = (block.as_ptr().add(half), x.as_ptr());
                by_width!(aa, ymm_tile, (w, x, cols, half, res), [1 2 3 4 5 6]);
            }
        }
    }
}

/// [`zmm_tile`] of one block.
///
/// # Safety
/// As [`zmm_tile`].
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn zmm_one<const A: usize>(w: *const f16, x: *const f32, cols: usize, res: &mut HalfTile) {
    // SAFETY: as the caller guarantees.
    unsafe { zmm_tile::<A, 1>(w, x, cols, res) }
}

/// `A` activations times `NB` consecutive blocks.
///
/// # Safety
/// AVX-512F; `w` holds `NB` blocks of `cols` columns, `x` `cols` of `A`,
/// `res` `NB * A` rows.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn zmm_tile<const A: usize, const NB: usize>(
    w: *const f16,
    x: *const f32,
    cols: usize,
    res: &mut HalfTile,
) {
    // SAFETY: every read is inside `w`/`x` as the caller guarantees; every
    // store inside `res`'s first `NB * A` rows of 32.
    unsafe {
        let mut acc = [[[_mm512_setzero_ps(); 2]; A]; NB];
        for k in 0..cols {
            let xk = x.add(k * A);
            for (blk, acc) in acc.iter_mut().enumerate() {
                let wk = w.add((blk * cols + k) * BLOCK);
                // A block's columns stream from DRAM (a short batch reads
                // each weight once): ask for them ahead of the FMAs.
                _mm_prefetch::<_MM_HINT_T0>(wk.wrapping_add(AHEAD * BLOCK).cast());
                let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(wk.cast()));
                let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(wk.add(16).cast()));
                for (a, acc) in acc.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*xk.add(a));
                    acc[0] = _mm512_fmadd_ps(w0, b, acc[0]);
                    acc[1] = _mm512_fmadd_ps(w1, b, acc[1]);
                }
            }
        }
        let rows = acc.iter().flatten();
        for (acc, out) in rows.zip(res.iter_mut()) {
            _mm512_storeu_ps(out.as_mut_ptr(), acc[0]);
            _mm512_storeu_ps(out.as_mut_ptr().add(16), acc[1]);
        }
    }
}

/// # Safety
/// AVX2, FMA, F16C; `w` (already offset by `half`) holds `cols` columns of
/// `BLOCK`, `x` `cols` of `A`; `half + 16 <= BLOCK`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn ymm_tile<const A: usize>(
    w: *const f16,
    x: *const f32,
    cols: usize,
    half: usize,
    res: &mut HalfTile,
) {
    // SAFETY: as `zmm_tile`, for rows `half..half + 16`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); 2]; A];
        for k in 0..cols {
            let wk = w.add(k * BLOCK);
            _mm_prefetch::<_MM_HINT_T0>(wk.wrapping_add(AHEAD * BLOCK).cast());
            let w0 = _mm256_cvtph_ps(_mm_loadu_si128(wk.cast()));
            let w1 = _mm256_cvtph_ps(_mm_loadu_si128(wk.add(8).cast()));
            let xk = x.add(k * A);
            for (a, acc) in acc.iter_mut().enumerate() {
                let b = _mm256_set1_ps(*xk.add(a));
                acc[0] = _mm256_fmadd_ps(w0, b, acc[0]);
                acc[1] = _mm256_fmadd_ps(w1, b, acc[1]);
            }
        }
        for (acc, out) in acc.iter().zip(res.iter_mut()) {
            _mm256_storeu_ps(out.as_mut_ptr().add(half), acc[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(half + 8), acc[1]);
        }
    }
}
