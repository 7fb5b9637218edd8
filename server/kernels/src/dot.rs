//! Block dot-product tiles over the row-interleaved layout: one group of 8
//! weight rows (the lanes of a register) x up to 4 activation rows, so each
//! weight block is loaded and unpacked once per tile, and a block's scales
//! multiply 8 rows' integer dots with one vector op.
//!
//! Every kernel computes each output cell with the same operations in the
//! same order (exact integer block dots, then `acc = fma(dot, d_w * d_x,
//! acc)` and, for Q4_1, `acc = fma(m_w, s_x, acc)`, block after block), so
//! they agree bit for bit and a row's result never depends on its batch.

use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::{GROUP, QK};

/// Activation rows per tile.
pub(crate) const ACTS: usize = 4;

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
        }
    }

    /// The fastest kernel this CPU supports (decided once per process).
    pub fn detect() -> Self {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| *Self::available().last().unwrap_or(&Self::Scalar))
    }

    /// Every tile of row groups `g0..g1` x activation rows `n0..n1`, each
    /// handed to `sink`: a group's activation tiles one after another, so its
    /// weights stay in L1 while they pass.
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
            Self::Avx2 => x86::run::<false>(w, (g0, g1), acts, (n0, n1), sink),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => x86::run::<true>(w, (g0, g1), acts, (n0, n1), sink),
        }
    }
}

/// The reference: each block's integer dot, exact, then its scales, in the
/// order every kernel uses.
fn tile_scalar(w: &QMatrix, g: usize, acts: &QActs, (n0, aa): (usize, usize)) -> Tile {
    let nb = w.blocks_per_row();
    let q41 = !w.m.is_empty();
    let mut res = [[0f32; GROUP]; ACTS];
    for (j, res_act) in res.iter_mut().enumerate().take(aa) {
        for (r, cell) in res_act.iter_mut().enumerate() {
            let row = g * GROUP + r;
            let mut acc = 0f32;
            for b in 0..nb {
                let xb = (n0 + j) * nb + b;
                let xq = &acts.qs[xb * QK..(xb + 1) * QK];
                let idot: i32 = (0..QK).map(|k| w.quant(row, b, k) * i32::from(xq[k])).sum();
                // Q4_0's offset (a whole multiple of d) exactly, in integers.
                let idot = idot + w.m_int * acts.isum[xb];
                let (d, m) = w.stored_scales(row, b);
                acc = (idot as f32).mul_add(d * acts.d[xb], acc);
                if q41 {
                    // Q4_1's stored offset: m * sum(x) = m * d_x * sum(q_x).
                    acc = m.mul_add(acts.s[xb], acc);
                }
            }
            *cell = acc;
        }
    }
    res
}

#[cfg(target_arch = "x86_64")]
#[path = "dot_x86.rs"]
mod x86;
