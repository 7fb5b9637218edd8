//! Block dot-product tiles: up to 4 weight rows x 4 activation rows at once,
//! so each weight block is loaded and unpacked once per tile, and each
//! panel's scale products are computed once per tile row.

use crate::qact::QActs;
use crate::qmatrix::QMatrix;
use crate::quant_type::QK;

/// Results of one tile: `[weight row][activation row]`.
pub(crate) type Tile = [[f32; 4]; 4];

/// Blocks per panel: a SIMD tile computes this many blocks' scale products
/// up front (even, so panels start on a 4-bit block pair).
pub(crate) const PB: usize = 32;

/// One panel's scale products `d_w * d_x`, `[i * A + j][block - b0]`; a
/// task's scratch, so tiles do not clear it.
pub(crate) type Scales = [[f32; PB]; 16];

/// Receives one tile's results: weight rows `(m, rr)`, activation rows `(n, aa)`.
pub(crate) type Sink<'a> = dyn FnMut((usize, usize), (usize, usize), &Tile) + 'a;

/// Which instruction set computes the tiles (tests and benchmarks pick one;
/// everything else runs [`Kernel::detect`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable integer math, the reference.
    Scalar,
    /// AVX2 + FMA + F16C (checked at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 + FMA + F16C + AVX-VNNI: one `vpdpbusd` instead of `maddubs` + `madd`.
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// The AVX-VNNI path widened to AVX-512 (F, BW, VNNI): two blocks per op.
    /// Never AMX: the VMs we run on advertise it and fault on it.
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
                    && is_x86_feature_detected!("avx512vnni")
            }
        }
    }

    /// The fastest kernel this CPU supports (decided once per process).
    pub fn detect() -> Self {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| *Self::available().last().unwrap_or(&Self::Scalar))
    }

    /// The tile `(weight rows, activation rows)` this kernel runs for a task
    /// of `acts` activation rows: as many accumulators as the registers hold.
    pub(crate) fn tile_shape(self, acts: usize) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => (4, 4),
            _ if acts == 1 => (4, 1),
            _ => (2, 4),
        }
    }

    /// Every tile of weight rows `m0..m1` x activation rows `n0..n1`, in this
    /// kernel's tile shape, each handed to `sink`. The 256-bit kernels run
    /// the full tiles in one monomorphised loop (no per-tile dispatch); the
    /// remainders, and the other kernels, go tile by tile.
    pub(crate) fn tiles(
        self,
        w: &QMatrix,
        (m0, m1): (usize, usize),
        acts: &QActs,
        (n0, n1): (usize, usize),
        sink: &mut Sink<'_>,
    ) {
        // The SIMD loops read through raw pointers: these bounds make them sound.
        assert!(m0 <= m1 && m1 <= w.rows() && n0 <= n1 && n1 <= acts.batch());
        assert_eq!(acts.cols(), w.cols());
        let shape = self.tile_shape(n1 - n0);
        let mut sc: Scales = [[0f32; PB]; 16];
        let (fm, fa) = match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => x86::run::<false>(w, (m0, m1), acts, (n0, n1), shape, &mut sc, sink),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => x86::run::<true>(w, (m0, m1), acts, (n0, n1), shape, &mut sc, sink),
            _ => (m0, n0),
        };
        // What the full-tile loop left: the activation tail of its rows, then the row tail.
        if fm > m0 {
            self.each_tile(w, (m0, fm), acts, (fa, n1), shape, &mut sc, sink);
        }
        self.each_tile(w, (fm, m1), acts, (n0, n1), shape, &mut sc, sink);
    }

    /// [`Self::tiles`] one dispatched tile at a time.
    #[allow(clippy::too_many_arguments)]
    fn each_tile(
        self,
        w: &QMatrix,
        (m0, m1): (usize, usize),
        acts: &QActs,
        (n0, n1): (usize, usize),
        (tr, ta): (usize, usize),
        sc: &mut Scales,
        sink: &mut Sink<'_>,
    ) {
        let mut m = m0;
        while m < m1 {
            let rr = (m1 - m).min(tr);
            let mut n = n0;
            while n < n1 {
                let aa = (n1 - n).min(ta);
                let res = self.tile(w, (m, rr), acts, (n, aa), sc);
                sink((m, rr), (n, aa), &res);
                n += aa;
            }
            m += rr;
        }
    }

    /// Scaled block dots of weight rows `row..row+rr` against activation
    /// rows `n0..n0+aa`; `sc` is scratch.
    pub(crate) fn tile(
        self,
        w: &QMatrix,
        (row, rr): (usize, usize),
        acts: &QActs,
        (n0, aa): (usize, usize),
        sc: &mut Scales,
    ) -> Tile {
        // The SIMD paths read through raw pointers: these bounds make them sound.
        assert!((1..=4).contains(&rr) && (1..=4).contains(&aa));
        assert!(row + rr <= w.rows() && n0 + aa <= acts.batch() && acts.cols() == w.cols());
        match self {
            Self::Scalar => tile_scalar(w, row, rr, acts, n0, aa),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => x86::tile::<false>(w, row, rr, acts, n0, aa, sc),
            #[cfg(target_arch = "x86_64")]
            Self::AvxVnni => x86::tile::<true>(w, row, rr, acts, n0, aa, sc),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512Vnni => x86_512::tile(w, (row, rr), acts, (n0, aa), sc),
        }
    }
}

/// The reference: each block's integer dot, exact, then its scales.
fn tile_scalar(w: &QMatrix, row: usize, rr: usize, acts: &QActs, n0: usize, aa: usize) -> Tile {
    let nb = w.blocks_per_row();
    let mut res = [[0f32; 4]; 4];
    for (i, res_row) in res.iter_mut().enumerate().take(rr) {
        for (j, r) in res_row.iter_mut().enumerate().take(aa) {
            let mut acc = 0f32;
            for b in 0..nb {
                let xb = (n0 + j) * nb + b;
                let xq = &acts.qs[xb * QK..(xb + 1) * QK];
                let idot: i32 = (0..QK)
                    .map(|k| w.quant(row + i, b, k) * i32::from(xq[k]))
                    .sum();
                // Q4_0's offset (a whole multiple of d) exactly, in integers.
                let idot = idot + w.m_int * acts.isum[xb];
                let (d, m) = w.stored_scales(row + i, b);
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
