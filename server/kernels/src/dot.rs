//! Block dot-product tiles: up to 2 weight rows x 4 activation rows at once,
//! so each weight block is loaded and unpacked once per tile.

use crate::qact::QActs;
use crate::qmatrix::{QK, QMatrix, QuantType};

/// Results of one tile: `[weight row][activation row]`.
pub(crate) type Tile = [[f32; 4]; 2];

/// Which implementation computes the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Portable integer math, the reference.
    Scalar,
    /// AVX2 + FMA + F16C (checked at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 + FMA + F16C + AVX-VNNI: one `vpdpbusd` instead of `maddubs` + `madd`.
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// The AVX-VNNI path widened to AVX-512 (F, BW, VNNI): two blocks per op.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Kernel {
    /// The fastest kernel this CPU supports.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Self::Avx512Vnni;
            }
            if is_x86_feature_detected!("avxvnni") {
                return Self::AvxVnni;
            }
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
        assert!(rr <= 2 && aa <= 4 && (row + rr) * nb <= w.dm.len());
        assert!((n0 + aa) * nb <= acts.d.len() && acts.dt.len() == acts.d.len() + 4);
        assert!(acts.st.len() == acts.dt.len());
        match self {
            Self::Scalar => tile_scalar(w, row, rr, acts, n0, aa),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => x86::tile::<false>(w, row, rr, acts, n0, aa),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => x86::tile::<true>(w, row, rr, acts, n0, aa),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => x86_512::tile(w, row, rr, acts, n0, aa),
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
                        .map(|(&a, &b)| i32::from(a) * i32::from(b))
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
                // Q4_0/Q8_0 offsets (whole multiples of d) exactly, in integers.
                let idot = idot + w.m_int * acts.isum[xb];
                let (d, m) = w.stored_scales(wb);
                acc += d * acts.d[xb] * idot as f32;
                // Q4_1's stored offset: m * sum(x) = m * d_x * sum(q_x).
                acc += m * acts.s[xb];
            }
            *r = acc;
        }
    }
    res
}

#[cfg(target_arch = "x86_64")]
#[path = "dot_x86.rs"]
mod x86;
#[cfg(target_arch = "x86_64")]
#[path = "dot_x86_512.rs"]
mod x86_512;
