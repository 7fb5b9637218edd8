//! f16 weight matrices (GGUF's `F16`) times f32 activations: held at half
//! of f32's bytes and widened in registers (F16C), so a matmul that reads
//! its weights once per token (a short query, a decode step) moves half
//! the bytes, and a batch runs at the FMA rate.
//!
//! Activations stay f32 (llama.cpp rounds them to f16 first). Each output
//! is one FMA chain over the columns in order from zero, on every kernel,
//! so the scalar, AVX2 and AVX-512 paths agree bit for bit and a row's
//! result never depends on its batch.

use half::f16;
use rayon::prelude::*;

use crate::{Error, Kernel};

/// Weight rows held side by side per column: two 512-bit registers (four
/// 256-bit ones) of f32 once widened.
pub(crate) const BLOCK: usize = 32;

/// Most activation rows one tile multiplies (the AVX-512 tile's; AVX2 and
/// the scalar path take [`NARROW`]).
pub(crate) const WIDE: usize = 12;

/// Activation rows per tile on 256-bit registers (and the scalar path).
pub(crate) const NARROW: usize = 6;

/// Batches this short multiply [`BLOCKS`] weight blocks a tile: one
/// block's two FMA chains an activation are too few to hide their latency.
pub(crate) const FEW: usize = 2;

/// Weight blocks a tile multiplies at once for a batch of [`FEW`] or fewer.
pub(crate) const BLOCKS: usize = 4;

/// Tiles of activation rows per task: their packed rows stay in L2 while
/// the task's weight blocks pass.
const TILES_PER_TASK: usize = 4;

/// One tile's results: `[block * activations + activation][row in block]`.
pub(crate) type HalfTile = [[f32; BLOCK]];

/// An f16 weight matrix, `rows` output features by `cols` input features.
///
/// Held as `[block][col][row in block]`: the 32 rows of a block side by side
/// for each column (the last block padded with zero rows), so one column's
/// weights for 32 rows are one 64-byte load, multiplied by one activation
/// broadcast.
#[derive(Debug, Clone)]
pub struct HalfMatrix {
    rows: usize,
    cols: usize,
    data: Vec<f16>,
}

impl HalfMatrix {
    /// A `rows x cols` matrix from its little-endian f16 bytes, row-major
    /// (GGUF's `F16` tensor data), checking their length.
    pub fn new(rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, Error> {
        if rows == 0 || cols == 0 {
            return Err(Error::BadCols { cols, multiple: 1 });
        }
        Self::held_bytes_for(rows, cols)?;
        let expected = rows * cols * 2;
        if bytes.len() != expected {
            return Err(Error::Length {
                what: "f16 weight data",
                expected,
                got: bytes.len(),
            });
        }
        let mut data = vec![f16::ZERO; rows.div_ceil(BLOCK) * BLOCK * cols];
        data.par_chunks_mut(BLOCK * cols)
            .zip(bytes.par_chunks(BLOCK * cols * 2))
            .for_each(|(block, src)| {
                for (r, row) in src.chunks_exact(cols * 2).enumerate() {
                    for (c, v) in row.chunks_exact(2).enumerate() {
                        block[c * BLOCK + r] = f16::from_bits(u16::from_le_bytes([v[0], v[1]]));
                    }
                }
            });
        Ok(Self { rows, cols, data })
    }

    /// Bytes a `rows x cols` matrix holds (rows padded to whole blocks).
    pub fn held_bytes_for(rows: usize, cols: usize) -> Result<usize, Error> {
        rows.div_ceil(BLOCK)
            .checked_mul(BLOCK * 2)
            .and_then(|n| n.checked_mul(cols))
            .ok_or(Error::Overflow("f16 weight bytes"))
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn held_bytes(&self) -> usize {
        self.data.len() * 2
    }

    /// Row `row` widened to f32 into `out` (`cols` long).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), Error> {
        crate::check_row(row, self.rows, out.len(), self.cols)?;
        let block = self.block(row / BLOCK);
        for (c, o) in out.iter_mut().enumerate() {
            *o = block[c * BLOCK + row % BLOCK].to_f32();
        }
        Ok(())
    }

    /// `out[n*rows + m] = sum_k x[n*cols + k] * W[m][k]` for `n in 0..batch`.
    pub fn matmul(&self, x: &[f32], batch: usize, out: &mut [f32]) -> Result<(), Error> {
        self.matmul_with(Kernel::detect(), x, batch, out)
    }

    /// [`Self::matmul`] on a chosen kernel (one of [`Kernel::available`]).
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        batch: usize,
        out: &mut [f32],
    ) -> Result<(), Error> {
        if !kernel.supported() {
            return Err(Error::Unsupported(kernel));
        }
        let len = |what, per: usize, got| {
            let expected = batch.checked_mul(per).ok_or(Error::Overflow(what))?;
            match expected == got {
                true => Ok(()),
                false => Err(Error::Length {
                    what,
                    expected,
                    got,
                }),
            }
        };
        len("matmul input", self.cols, x.len())?;
        len("matmul output", self.rows, out.len())?;
        if batch == 0 {
            return Ok(());
        }
        let width = tile_width(kernel);
        let xt = pack_acts(x, self.cols, width);
        let out = Out(out.as_mut_ptr());
        let (blocks, tiles) = (self.rows.div_ceil(BLOCK), batch.div_ceil(width));
        let per = blocks_per_task(blocks, batch);
        let (nb, nt) = (blocks.div_ceil(per), tiles.div_ceil(TILES_PER_TASK));
        let task = |t: usize| {
            let b0 = (t % nb) * per;
            let t0 = (t / nb) * TILES_PER_TASK;
            let run = Run {
                kernel,
                w: self,
                xt: &xt,
                batch,
                width,
            };
            let (b1, step) = (
                (b0 + per).min(blocks),
                if batch <= FEW { BLOCKS } else { 1 },
            );
            for b in (b0..b1).step_by(step) {
                for tile in t0..(t0 + TILES_PER_TASK).min(tiles) {
                    // SAFETY: this task alone writes blocks `b0..b1` x tiles `t0..`.
                    unsafe { run.tile((b, step.min(b1 - b)), tile, &out) };
                }
            }
        };
        if nb * nt == 1 {
            task(0);
        } else {
            (0..nb * nt).into_par_iter().for_each(task);
        }
        Ok(())
    }

    /// Block `b`'s weights, `[col][row in block]`.
    fn block(&self, b: usize) -> &[f16] {
        &self.data[b * BLOCK * self.cols..(b + 1) * BLOCK * self.cols]
    }
}

/// The output buffer, shared by tasks that write disjoint cells.
struct Out(*mut f32);

// SAFETY: every task writes its own (row block x activation tile) cells, and
// the buffer outlives the parallel call.
unsafe impl Sync for Out {}

/// One matmul call's inputs, as a task sees them.
struct Run<'a> {
    kernel: Kernel,
    w: &'a HalfMatrix,
    xt: &'a [f32],
    batch: usize,
    width: usize,
}

impl Run<'_> {
    /// Multiplies weight blocks `b..b + nb` by activation tile `tile` into `out`.
    ///
    /// # Safety
    /// No other thread writes these cells; `out` holds `batch * rows`.
    unsafe fn tile(&self, (b, nb): (usize, usize), tile: usize, out: &Out) {
        let (cols, rows) = (self.w.cols, self.w.rows);
        let n0 = tile * self.width;
        let aa = (self.batch - n0).min(self.width);
        let x = &self.xt[n0 * cols..(n0 + aa) * cols];
        let mut res = [[0f32; BLOCK]; WIDE];
        let w = &self.w.data[b * BLOCK * cols..(b + nb) * BLOCK * cols];
        tile_on(self.kernel, w, x, aa, &mut res[..nb * aa]);
        for (i, r) in res.iter().enumerate().take(nb * aa) {
            let (m0, a) = ((b + i / aa) * BLOCK, i % aa);
            let live = (rows - m0).min(BLOCK);
            // SAFETY: cells `(n0 + a, m0..m0 + live)` lie inside `out` and
            // belong to this task.
            unsafe {
                let dst = out.0.add((n0 + a) * rows + m0);
                std::ptr::copy_nonoverlapping(r.as_ptr(), dst, live);
            }
        }
    }
}

/// One tile on `kernel` over the blocks `w` holds (more than one only for
/// [`FEW`] activations): `res[blk * aa + a][r] = sum_k x[k*aa + a] *
/// w[blk][k][r]`.
fn tile_on(kernel: Kernel, w: &[f16], x: &[f32], aa: usize, res: &mut HalfTile) {
    match kernel {
        Kernel::Scalar => tile_scalar(w, x, aa, res),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul_with` checked the kernel is supported (AVX-512F
        // with the VNNI kernel; AVX2, FMA and F16C with every x86 one); `w`
        // holds whole blocks of `cols` columns, `x` `cols` of `aa`, `res`
        // a row per block and activation.
        Kernel::Avx512Vnni => unsafe { x86::tile_avx512(w, x, aa, res) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::AvxVnni => unsafe { x86::tile_avx2(w, x, aa, res) },
    }
}

/// The portable tile: the same FMA chains the SIMD tiles compute.
fn tile_scalar(w: &[f16], x: &[f32], aa: usize, res: &mut HalfTile) {
    for (i, out) in res.iter_mut().enumerate() {
        let block = &w[(i / aa) * BLOCK * (x.len() / aa)..];
        for (r, o) in out.iter_mut().enumerate() {
            let mut acc = 0f32;
            for (k, &v) in x.iter().skip(i % aa).step_by(aa).enumerate() {
                acc = v.mul_add(block[k * BLOCK + r].to_f32(), acc);
            }
            *o = acc;
        }
    }
}

/// Activation rows per tile on `kernel`.
fn tile_width(kernel: Kernel) -> usize {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Vnni => WIDE,
        _ => NARROW,
    }
}

/// `x` (`[batch][cols]`) as tiles of `width` rows, each column-major
/// (`[col][row in tile]`, the last tile as many rows as are left), so a
/// tile's activations for one column are adjacent.
fn pack_acts(x: &[f32], cols: usize, width: usize) -> Vec<f32> {
    let mut xt = vec![0f32; x.len()];
    xt.par_chunks_mut(width * cols)
        .zip(x.par_chunks(width * cols))
        .for_each(|(dst, src)| {
            let aa = src.len() / cols;
            for (a, row) in src.chunks_exact(cols).enumerate() {
                for (k, &v) in row.iter().enumerate() {
                    dst[k * aa + a] = v;
                }
            }
        });
    xt
}

/// Weight blocks per task: enough tasks to keep every thread busy, even at
/// batch 1.
fn blocks_per_task(blocks: usize, batch: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let max = if batch >= 2 * WIDE { 2 } else { 4 };
    blocks.div_ceil(threads * 4).clamp(1, max)
}

#[cfg(target_arch = "x86_64")]
#[path = "half_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "half_matrix_tests.rs"]
mod tests;
