//! x86_64 tiles: AVX2 (`maddubs`), AVX-VNNI and AVX-512 VNNI (`vpdpbusd`
//! on 256 and 512 bits), one generic tile (`tile.rs`) over each vector type.

mod simd;
mod tile;
mod ymm;
mod zmm;

use self::simd::Simd;
use self::tile::tile;
use self::ymm::Ymm;
use self::zmm::Zmm;
use super::{ACTS, Kernel, Sink, Tile};
use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::{GROUP, QuantType};

/// Rows of a whole panel: a group's step between its fields in one.
const PANEL: usize = 2 * GROUP;

/// Every tile of groups `g0..g1` x activations `n0..n1` to `sink`, on
/// `kernel` (not the scalar one) monomorphised for the matrix's format.
pub(super) fn run(
    kernel: Kernel,
    w: &QMatrix,
    groups: (usize, usize),
    acts: &QActs,
    batch: (usize, usize),
    sink: &mut Sink<'_>,
) {
    macro_rules! per_type {
        ($run:ident) => {
            match w.quant_type() {
                QuantType::Q4_0 => $run::<{ QuantType::Q4_0 as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q4_1 => $run::<{ QuantType::Q4_1 as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q5_0 => $run::<{ QuantType::Q5_0 as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q5_1 => $run::<{ QuantType::Q5_1 as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q8_0 => $run::<{ QuantType::Q8_0 as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q2_K => $run::<{ QuantType::Q2_K as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q3_K => $run::<{ QuantType::Q3_K as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q4_K => $run::<{ QuantType::Q4_K as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q5_K => $run::<{ QuantType::Q5_K as u8 }>(w, groups, acts, batch, sink),
                QuantType::Q6_K => $run::<{ QuantType::Q6_K as u8 }>(w, groups, acts, batch, sink),
                QuantType::MXFP4 => {
                    $run::<{ QuantType::MXFP4 as u8 }>(w, groups, acts, batch, sink)
                }
            }
        };
    }
    // SAFETY: `Kernel::tiles` runs a kernel only once `supported()` said the
    // CPU has its features, and checked the bounds.
    unsafe {
        match kernel {
            Kernel::Avx2 => per_type!(run_avx2),
            Kernel::AvxVnni => per_type!(run_vnni),
            Kernel::Avx512Vnni => per_type!(run_avx512),
            Kernel::Scalar => unreachable!("the scalar tiles run in dot.rs"),
        }
    }
}

/// Whether `batch` activation rows run in tiles of up to [`ACTS`], each
/// block unpacked once for them all and each row's dots taken in turn
/// (out-of-order execution overlaps the rows), rather than in fixed tiles
/// of 8, 4, 2, 1 that interleave their rows register by register: past 8
/// rows the interleaved sums would spill, and a second pass over the
/// group's weights would unpack every block again.
fn wide_tiles(batch: usize) -> bool {
    batch > GROUP
}

/// Defines a `#[target_feature]` entry point: every intrinsic of the tiles
/// inlined into it compiles with its features.
macro_rules! entry {
    ($name:ident, $features:literal, $wide:ty, $narrow:ty) => {
        /// # Safety
        /// The CPU has the features; `Kernel::tiles` checked the bounds.
        #[target_feature(enable = $features)]
        unsafe fn $name<const T: u8>(
            w: &QMatrix,
            (g0, g1): (usize, usize),
            acts: &QActs,
            batch: (usize, usize),
            sink: &mut Sink<'_>,
        ) {
            let mut g = g0;
            while g < g1 {
                // A whole panel at once where the vector holds 16 rows.
                if <$wide>::LANES == 16 && g % 2 == 0 && g + 1 < g1 {
                    // SAFETY: groups `g`, `g + 1` (one panel) exist.
                    unsafe {
                        if wide_tiles(batch.1 - batch.0) {
                            acts_loop::<$wide, T, ACTS>(w, g, acts, batch, sink)
                        } else {
                            acts_loop::<$wide, T, 8>(w, g, acts, batch, sink)
                        }
                    };
                    g += 2;
                } else {
                    // SAFETY: group `g` exists.
                    unsafe {
                        if wide_tiles(batch.1 - batch.0) {
                            acts_loop::<$narrow, T, ACTS>(w, g, acts, batch, sink)
                        } else {
                            acts_loop::<$narrow, T, 4>(w, g, acts, batch, sink)
                        }
                    };
                    g += 1;
                }
            }
        }
    };
}

entry!(run_avx2, "avx2,fma,f16c", Ymm<false>, Ymm<false>);
entry!(run_vnni, "avx2,fma,f16c,avxvnni", Ymm<true>, Ymm<true>);
entry!(
    run_avx512,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    Zmm<true>,
    Zmm<false>
);

/// Group `g` (its panel when `V` is 16 rows wide) against activation rows
/// `n0..n1`. With `A > 8`: tiles of up to `A` rows, each block unpacked
/// once for all of them (decode-sized batches); else tiles of `A`, then
/// the rest in tiles of 4, 2, 1. A lone last group (half a panel's step)
/// is rare: it runs 1-wide tiles. The first tile over the group prefetches
/// its quants (later ones find them in cache), and so do the narrow tiles,
/// whose compute is too short to hide DRAM's latency.
///
/// # Safety
/// As [`tile`].
#[inline(always)]
unsafe fn acts_loop<V: Simd, const T: u8, const A: usize>(
    w: &QMatrix,
    g: usize,
    acts: &QActs,
    (n0, n1): (usize, usize),
    sink: &mut Sink<'_>,
) {
    let mut n = n0;
    // SAFETY (each tile): activation rows `n..n+width` are below `n1`, and
    // the step is the group's.
    if w.layout().step(g) == GROUP {
        while n < n1 {
            let res = unsafe { tile::<V, T, 1, GROUP>(w, g, acts, (n, 1), true) };
            emit::<V, 1>(g, (n, 1), &res, sink);
            n += 1;
        }
        return;
    }
    if A > 8 {
        while n < n1 {
            let aa = (n1 - n).min(A);
            let res = unsafe { tile::<V, T, A, PANEL>(w, g, acts, (n, aa), n == n0) };
            emit::<V, A>(g, (n, aa), &res, sink);
            n += aa;
        }
        return;
    }
    while n1 - n >= A {
        let res = unsafe { tile::<V, T, A, PANEL>(w, g, acts, (n, A), n == n0) };
        emit::<V, A>(g, (n, A), &res, sink);
        n += A;
    }
    if A > 4 && n1 - n >= 4 {
        let res = unsafe { tile::<V, T, 4, PANEL>(w, g, acts, (n, 4), n == n0) };
        emit::<V, 4>(g, (n, 4), &res, sink);
        n += 4;
    }
    if n1 - n >= 2 {
        let res = unsafe { tile::<V, T, 2, PANEL>(w, g, acts, (n, 2), true) };
        emit::<V, 2>(g, (n, 2), &res, sink);
        n += 2;
    }
    if n1 - n >= 1 {
        let res = unsafe { tile::<V, T, 1, PANEL>(w, g, acts, (n, 1), true) };
        emit::<V, 1>(g, (n, 1), &res, sink);
    }
}

/// Hands a tile's `aa` rows of results to `sink`, one group of 8 weight
/// rows at a time.
#[inline(always)]
fn emit<V: Simd, const A: usize>(
    g: usize,
    (n, aa): (usize, usize),
    res: &[[f32; 16]; A],
    sink: &mut Sink<'_>,
) {
    for half in 0..V::LANES / GROUP {
        let mut t: Tile = [[0f32; GROUP]; ACTS];
        for (dst, src) in t.iter_mut().zip(&res[..aa]) {
            dst.copy_from_slice(&src[half * GROUP..(half + 1) * GROUP]);
        }
        sink(g + half, (n, aa), &t);
    }
}
