//! The tile every x86 kernel runs, written once over [`Simd`]: a group (or
//! panel) of weight rows x `A` activation rows, block after block, each
//! output with [`crate::dot::block_term`]'s operations in its order.

use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};

use super::simd::Simd;
use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::{E2M1, E2M1_BIAS, Format, Min, QK, QuantType, Sub};

/// How far ahead of the current block a decode tile prefetches its quants:
/// a row group's weights are one sequential run, read once a call, and the
/// hardware prefetcher stops at every 4 KiB page while a block computes.
const PREFETCH: usize = 4096;

/// Q8_0's code: its quants are signed.
const Q8_0: u8 = QuantType::Q8_0 as u8;

/// MXFP4's e2m1 values biased to unsigned bytes (0..=24), by code: the
/// table its codes are looked up in, the bias taken back as an offset.
const E2M1_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (E2M1[i] as i32 + E2M1_BIAS) as u8;
        i += 1;
    }
    t
};

/// How many `maddubs` results (pairs of products) an i16 lane may sum:
/// each is at most `2 * umax * 127`.
const fn chunk(t: u8) -> usize {
    let f = QuantType::from_code(t).format();
    if t == Q8_0 {
        return 1;
    }
    let fits = 32767 / (2 * 127 * f.umax() as usize);
    let most = if f.halves() { 4 } else { 8 };
    if fits < most { fits } else { most }
}

/// A 32-block's 8 registers of unsigned quants from its plane registers at
/// `q` (`stride` bytes apart): register `u` is the low plane's register
/// `u % lo` shifted by `lo * (u / lo)` and masked, ORed with the high
/// plane's bits moved above them (see `Format::bits`).
///
/// # Safety
/// The block's `lo + hi` registers are readable.
#[inline(always)]
unsafe fn unpack<V: Simd>(q: *const u8, stride: usize, lo: u32, hi: u32) -> [V::I; 8] {
    // Plain loops, no closures: a closure is compiled without the entry
    // point's target features, and the intrinsics in it would not inline.
    let mut out = [unsafe { V::splat32(0) }; 8];
    for u in 0..8u32 {
        // SAFETY: every register read is one of the block's.
        unsafe {
            let low = V::load(q.add((u % lo) as usize * stride));
            let mut v = if lo == 8 {
                low
            } else {
                let at = lo * (u / lo);
                let s = if at == 0 { low } else { V::srl16(low, at) };
                V::and(s, V::splat8(((1u32 << lo) - 1) as u8))
            };
            if hi > 0 {
                let high = V::load(q.add((lo + u % hi) as usize * stride));
                let at = hi * (u / hi);
                let s = if at < lo {
                    V::sll16(high, lo - at)
                } else if at > lo {
                    V::srl16(high, at - lo)
                } else {
                    high
                };
                v = V::or_and(v, s, V::splat8((((1u32 << hi) - 1) << lo) as u8));
            }
            out[u as usize] = v;
        }
    }
    out
}

/// A block's weight-side factors, shared by every activation row of a tile.
#[derive(Clone, Copy)]
struct Scales<V: Simd> {
    /// f16 `d` of the block or super-block.
    d: V::F,
    /// f16 `m` / `dmin`, else zero.
    m: V::F,
    /// Whole-block (Per32) or low-half sub-scale, i32 lanes.
    sa: V::I,
    /// High-half sub-scale, i32 lanes.
    sb: V::I,
    /// Per16: the signed scale pairs; Per16Min: the minimum pairs (i16).
    pairs: V::I,
    /// Per32: `dmin * mn`.
    fm: V::F,
}

/// Pointers to the activation's per-block arrays.
#[derive(Clone, Copy)]
struct ActBlocks {
    d: *const f32,
    s: *const f32,
    isum: *const i32,
    isum16: *const u8,
    dsum: *const f32,
}

/// A 32-block's sub-scales at `s` (`step` bytes between a panel's fields).
///
/// # Safety
/// The format's sub-scale bytes for the block are readable at `s`.
#[inline(always)]
unsafe fn sub_scales<V: Simd>(sub: Sub, s: *const u8, step: usize, d: V::F, m: V::F) -> Scales<V> {
    // SAFETY: the caller's guarantee.
    unsafe {
        let zero = V::splat32(0);
        let (sa, sb, pairs, fm) = match sub {
            Sub::None => (zero, zero, zero, V::fzero()),
            Sub::Per32 => {
                let mn = V::cvt(V::u8_to_i32(s.add(step)));
                (V::u8_to_i32(s), zero, zero, V::mul(m, mn))
            }
            Sub::Per16 => {
                let p = V::i8_to_i16(s);
                (
                    V::sra32(V::sll32(p, 16), 16),
                    V::sra32(p, 16),
                    p,
                    V::fzero(),
                )
            }
            Sub::Per16Min => {
                let r = V::u8_to_i16(s);
                let sc = V::and(r, V::splat32(0x000F_000F));
                let lo = V::and(sc, V::splat32(0xFFFF));
                (lo, V::srl32(sc, 16), V::srl16(r, 4), V::fzero())
            }
        };
        Scales {
            d,
            m,
            sa,
            sb,
            pairs,
            fm,
        }
    }
}

/// [`crate::dot::block_term`] for a vector of rows: the block's integer
/// dots `s` (whole in `s[0]`, or per half) against activation block `xb`,
/// added to `acc` with the same operations in the same order.
///
/// # Safety
/// Activation block `xb` exists.
#[inline(always)]
unsafe fn block_term<V: Simd>(
    f: Format,
    offset: i32,
    acc: V::F,
    [s0, s1]: [V::I; 2],
    w: &Scales<V>,
    x: ActBlocks,
    xb: usize,
) -> V::F {
    // SAFETY: the caller's guarantee.
    unsafe {
        let dd = V::mul(w.d, V::fsplat(x.d.add(xb)));
        match f.sub {
            Sub::None => {
                let i = if offset == 0 {
                    s0
                } else {
                    V::add32(s0, V::splat32(offset * *x.isum.add(xb)))
                };
                let a = V::fma(V::cvt(i), dd, acc);
                if f.min == Min::Block {
                    V::fma(w.m, V::fsplat(x.s.add(xb)), a)
                } else {
                    a
                }
            }
            Sub::Per32 => {
                let a = V::fma(V::cvt(V::mul32(w.sa, s0)), dd, acc);
                V::fnma(w.fm, V::fsplat(x.dsum.add(xb)), a)
            }
            Sub::Per16 => {
                let i = V::add32(V::mul32(w.sa, s0), V::mul32(w.sb, s1));
                let o = V::madd16(w.pairs, V::bcast32(x.isum16.add(4 * xb)));
                // offset = -2^k: subtract the scaled half sums.
                let i = V::sub32(i, V::sll32(o, (-offset).trailing_zeros()));
                V::fma(V::cvt(i), dd, acc)
            }
            Sub::Per16Min => {
                let i = V::add32(V::mul32(w.sa, s0), V::mul32(w.sb, s1));
                let a = V::fma(V::cvt(i), dd, acc);
                let m = V::madd16(w.pairs, V::bcast32(x.isum16.add(4 * xb)));
                V::fnma(V::cvt(m), V::mul(w.m, V::fsplat(x.d.add(xb))), a)
            }
        }
    }
}

/// Weight rows of group `g` (with `V::LANES == 16`, of its whole panel)
/// against activation rows `n0..n0+aa` (`aa <= A`; the callers of the
/// small tiles pass `A` itself, a constant, so their loops unroll):
/// `[activation][lane]`, rows from `aa` on zero. `STEP` is the group's
/// `Layout::step` (16 in a whole panel, 8 alone), a constant so every
/// offset folds into an address. With `prefetch` the tile asks for its
/// quants a page ahead: the first pass over a group reads them from DRAM.
///
/// # Safety
/// The CPU has `V`'s features; group `g` (its panel when wide) and the
/// activation rows exist, `1 <= aa <= A`, `STEP == w.layout().step(g)`,
/// and `acts.cols() == w.cols()`.
// Index loops over the const-size register tiles read clearer than zips.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub(super) unsafe fn tile<V: Simd, const T: u8, const A: usize, const STEP: usize>(
    w: &QMatrix,
    g: usize,
    acts: &QActs,
    (n0, aa): (usize, usize),
    prefetch: bool,
) -> [[f32; 16]; A] {
    let f = const { QuantType::from_code(T).format() };
    let signed = T == Q8_0 && !V::XOR_SIGNED;
    let offset = if T == Q8_0 && V::XOR_SIGNED {
        -128
    } else if f.mx {
        -E2M1_BIAS
    } else {
        f.offset
    };
    let (lay, nb, regs, step) = (w.layout(), w.blocks_per_row(), f.regs(), STEP);
    let units = nb / f.bpu;
    debug_assert_eq!(step, lay.step(g));
    debug_assert!(1 <= aa && aa <= A);
    // SAFETY (all pointer arithmetic below): offsets of group `g`'s own
    // elements in each array, and of activation rows `n0..n0+aa`; arrays a
    // format lacks are never read.
    unsafe {
        let qp = w.qs.as_ptr().add(4 * lay.index(g, 0, nb, 0, regs));
        let dp = w.d.as_ptr().wrapping_add(lay.index(g, 0, units, 0, 1));
        let ep = w.e.as_ptr().wrapping_add(lay.index(g, 0, units, 0, 1));
        let table = V::table16(E2M1_BIASED.as_ptr());
        let mp = w.m.as_ptr().wrapping_add(lay.index(g, 0, units, 0, 1));
        let sp = w.sc.as_ptr().wrapping_add(match f.sub {
            Sub::Per32 => lay.index(g, 0, nb, 0, 2),
            _ => 2 * lay.index(g, 0, nb, 0, 1),
        });
        let xq0 = acts.qs.as_ptr().add(n0 * acts.stride());
        let x = ActBlocks {
            d: acts.d.as_ptr(),
            s: acts.s.as_ptr(),
            isum: acts.isum.as_ptr(),
            isum16: acts.isum16.as_ptr().cast(),
            dsum: acts.dsum.as_ptr(),
        };
        let mut acc = [V::fzero(); A];
        for unit in 0..units {
            let d = if f.mx {
                V::e8m0s(ep.add(unit * step))
            } else {
                V::f16s(dp.add(unit * step))
            };
            let m = if f.min == Min::None {
                V::fzero()
            } else {
                V::f16s(mp.add(unit * step))
            };
            for b in unit * f.bpu..(unit + 1) * f.bpu {
                let qb = qp.add(4 * b * regs * step);
                if prefetch {
                    // One line per register of a panel's block (64 bytes).
                    for k in 0..regs {
                        _mm_prefetch::<_MM_HINT_T0>(
                            qb.wrapping_add(k * 4 * step + PREFETCH).cast(),
                        );
                    }
                }
                let raw = unpack::<V>(qb, 4 * step, f.lo, f.hi);
                let mut wu = raw;
                if f.mx {
                    for r in &mut wu {
                        *r = V::lut(*r, table);
                    }
                }
                if T == Q8_0 {
                    for r in &mut wu {
                        *r = if V::XOR_SIGNED {
                            V::xor(*r, V::splat8(0x80))
                        } else {
                            V::abs8(*r)
                        };
                    }
                }
                let scales = sub_scales::<V>(f.sub, sp.wrapping_add(2 * b * step), step, d, m);
                let (xb, stride) = (xq0.add(QK * b), acts.stride());
                if V::DOT4 && A > 1 && A <= 8 && aa == A {
                    // Register by register across the activation rows: `A`
                    // independent chains a half (integer sums: any order).
                    let mut s = [[V::splat32(0); A]; 2];
                    for u in 0..8 {
                        for j in 0..A {
                            let xj = xb.add(j * stride + 4 * u);
                            s[u / 4][j] = V::dot4(s[u / 4][j], wu[u], xj);
                        }
                    }
                    for j in 0..A {
                        let s = if f.halves() {
                            [s[0][j], s[1][j]]
                        } else {
                            [V::add32(s[0][j], s[1][j]), s[1][j]]
                        };
                        acc[j] = block_term(f, offset, acc[j], s, &scales, x, (n0 + j) * nb + b);
                    }
                } else {
                    // Row by row (wide tiles, or no one-instruction dot):
                    // out-of-order execution overlaps the rows' chains.
                    for j in 0..aa {
                        let s =
                            V::dots(&wu, &raw, xb.add(j * stride), f.halves(), chunk(T), signed);
                        acc[j] = block_term(f, offset, acc[j], s, &scales, x, (n0 + j) * nb + b);
                    }
                }
            }
        }
        let mut res = [[0f32; 16]; A];
        for j in 0..aa {
            V::store(res[j].as_mut_ptr(), acc[j]);
        }
        res
    }
}
