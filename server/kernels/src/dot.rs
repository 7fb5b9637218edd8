//! Block dot-product tiles over the row-interleaved layout: a group of 8
//! weight rows (the lanes of a register; 16 on 512-bit kernels) x up to 16
//! activation rows, so each weight block is loaded and unpacked once per
//! tile, and a block's scales multiply 8 rows' integer dots with one vector op.
//!
//! The arithmetic is defined once, by [`block_term`]: per 32-block, exact
//! integer dots, integer sub-block scales, offsets and minima applied in
//! integers, then the float scales in one fixed order. Every kernel computes
//! each output cell with exactly those operations, block after block, so
//! they agree bit for bit and a row's result never depends on its batch.

use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::{E2M1, GROUP, Min, QK, QuantType, Sub};

/// Most activation rows per tile.
pub(crate) const ACTS: usize = 16;

/// Results of one tile: `[activation row][row in group]`.
pub(crate) type Tile = [[f32; GROUP]; ACTS];

/// Receives one tile's results: row group `g`, activation rows `(n, aa)`.
pub(crate) type Sink<'a> = dyn FnMut(usize, (usize, usize), &Tile) + 'a;

/// Which instruction set computes the tiles (tests and benchmarks pick one;
/// everything else runs [`Kernel::detect`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable integer math, the reference.
    Scalar,
    /// AVX2 + FMA + F16C (checked at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 + FMA + F16C + AVX-VNNI: one `vpdpbusd` instead of `maddubs` +
    /// `add`. (Never AMX: the VMs we run on advertise it and fault on it.)
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX-512 F/BW/VL + AVX512-VNNI: 512-bit `vpdpbusd`, 16 weight rows a
    /// register.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Kernel {
    /// Every kernel this CPU can run, the scalar reference first, the
    /// fastest last.
    pub fn available() -> Vec<Self> {
        let all = [
            Self::Scalar,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2,
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni,
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni,
        ];
        all.into_iter().filter(|k| k.supported()).collect()
    }

    /// Whether this CPU can run the kernel.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        match self {
            Self::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => avx2,
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => {
                avx2 && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
        }
    }

    /// The fastest kernel this CPU supports (decided once per process).
    pub fn detect() -> Self {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| *Self::available().last().unwrap_or(&Self::Scalar))
    }

    /// Every tile of row groups `g0..g1` x activation rows `n0..n1`, each
    /// handed to `sink`: a group's (or a panel's) activation tiles one after
    /// another, so its weights stay in L1 while they pass.
    pub(crate) fn tiles(
        self,
        w: &QMatrix,
        (g0, g1): (usize, usize),
        acts: &QActs,
        (n0, n1): (usize, usize),
        sink: &mut Sink<'_>,
    ) {
        // The SIMD loops read through raw pointers: these bounds make them sound.
        assert!(g0 <= g1 && g1 <= w.groups() && n0 <= n1 && n1 <= acts.batch());
        assert_eq!(acts.cols(), w.cols());
        match self {
            Self::Scalar => {
                for g in g0..g1 {
                    let mut n = n0;
                    while n < n1 {
                        let aa = (n1 - n).min(ACTS);
                        sink(g, (n, aa), &tile_scalar(w, g, acts, (n, aa)));
                        n += aa;
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 | Self::AvxVnni | Self::Avx512Vnni => {
                x86::run(self, w, (g0, g1), acts, (n0, n1), sink)
            }
        }
    }
}

/// The scales one weight row brings to a 32-block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WeightScales {
    /// The block's (or super-block's) f16 scale `d`.
    pub d: f32,
    /// Its f16 minimum (Q4_1/Q5_1's `m`, the K-quants' `dmin`), else 0.
    pub m: f32,
    /// The two sub-scale bytes.
    pub sub: [u8; 2],
}

/// One 32-block's contribution to an output cell, added to `acc`: THE
/// definition every kernel computes.
///
/// `dot[h]` is the exact integer dot of the stored quants with the
/// activation's over weights `16h..16h+16`; `xb` indexes the activation
/// block in `acts`. Integer parts are exact (every `I` and `M` below stays
/// under 2^24, so also exact as f32); then at most two fused multiply-adds,
/// each rounding once, scale term first:
/// - legacy: `I = dot + offset * sum(x)`; `acc += I * (d * d_x)`; Q4_1/Q5_1
///   then `acc += m * s_x` (`s_x`: the f16-rounded `d_x * sum(x)`); MXFP4
///   likewise, its dot over the codes' doubled e2m1 values and `d` its
///   e8m0 scale `2^(e - 128)`;
/// - Q4_K/Q5_K: `I = sc * dot`; `acc += I * (d * d_x)`, then
///   `acc -= (dmin * mn) * (d_x * sum(x))`;
/// - Q6_K/Q3_K: `I = sum_h sc_h * (dot_h + offset * sum_h(x))`; `acc += I * (d * d_x)`;
/// - Q2_K: `I = sum_h sc_h * dot_h`, `M = sum_h mn_h * sum_h(x)`;
///   `acc += I * (d * d_x)`, then `acc -= M * (dmin * d_x)`.
///
/// (`d * d_x`, `dmin * mn`, `d_x * sum(x)` and `dmin * d_x` are exact in
/// f32, so each product inside an fma is the exact real term; MXFP4's
/// `d * d_x`, a power of two times an f16, is exact wherever f32 holds it.)
pub(crate) fn block_term(
    ty: QuantType,
    acc: f32,
    dot: [i32; 2],
    w: WeightScales,
    acts: &QActs,
    xb: usize,
) -> f32 {
    let f = ty.format();
    let dx = acts.d[xb];
    let half = acts.isum16[xb].map(i32::from);
    match f.sub {
        Sub::None => {
            let i = dot[0] + dot[1] + f.offset * acts.isum[xb];
            let acc = (i as f32).mul_add(w.d * dx, acc);
            if f.min == Min::Block {
                w.m.mul_add(acts.s[xb], acc)
            } else {
                acc
            }
        }
        Sub::Per32 => {
            let i = i32::from(w.sub[0]) * (dot[0] + dot[1]);
            let acc = (i as f32).mul_add(w.d * dx, acc);
            (-(w.m * f32::from(w.sub[1]))).mul_add(acts.dsum[xb], acc)
        }
        Sub::Per16 => {
            let sc = w.sub.map(|s| i32::from(s as i8));
            let i = sc[0] * (dot[0] + f.offset * half[0]) + sc[1] * (dot[1] + f.offset * half[1]);
            (i as f32).mul_add(w.d * dx, acc)
        }
        Sub::Per16Min => {
            let (sc, mn) = (
                w.sub.map(|s| i32::from(s & 0xF)),
                w.sub.map(|s| i32::from(s >> 4)),
            );
            let i = sc[0] * dot[0] + sc[1] * dot[1];
            let m = mn[0] * half[0] + mn[1] * half[1];
            let acc = (i as f32).mul_add(w.d * dx, acc);
            (m as f32).mul_add(-(w.m * dx), acc)
        }
    }
}

/// The reference tile: each block's integer dots, exact, then
/// [`block_term`], block after block.
// Rows index the transposed result: a range reads clearer than a zip.
#[allow(clippy::needless_range_loop)]
fn tile_scalar(w: &QMatrix, g: usize, acts: &QActs, (n0, aa): (usize, usize)) -> Tile {
    let nb = w.blocks_per_row();
    let ty = w.quant_type();
    let mut res = [[0f32; GROUP]; ACTS];
    for r in 0..GROUP {
        let row = g * GROUP + r;
        let mut acc = [0f32; ACTS];
        for b in 0..nb {
            let q = w.block_quants(row, b).map(|u| match ty {
                QuantType::Q8_0 => i32::from(u as i8),
                QuantType::MXFP4 => i32::from(E2M1[usize::from(u)]),
                _ => i32::from(u),
            });
            let (d, m) = w.unit_scales(row, b);
            let ws = WeightScales {
                d,
                m,
                sub: w.block_sub(row, b),
            };
            for (j, a) in acc.iter_mut().enumerate().take(aa) {
                let xb = (n0 + j) * nb + b;
                let at = (n0 + j) * acts.stride() + b * QK;
                let xq = &acts.qs[at..at + QK];
                let half = |h: usize| -> i32 {
                    (16 * h..16 * h + 16).map(|k| q[k] * i32::from(xq[k])).sum()
                };
                *a = block_term(w.quant_type(), *a, [half(0), half(1)], ws, acts, xb);
            }
        }
        for (j, &a) in acc.iter().enumerate() {
            res[j][r] = a;
        }
    }
    res
}

#[cfg(target_arch = "x86_64")]
mod x86;
