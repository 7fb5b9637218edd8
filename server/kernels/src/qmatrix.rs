//! Quantized weight matrices in GGML block formats and their batched matmul.

use half::f16;
use rayon::prelude::*;

use crate::Error;
use crate::dot::Kernel;
use crate::qact::QActs;

/// Weights per quantization block.
pub const QK: usize = 32;

/// GGML block formats supported by [`QMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// f16 scale, 32 x 4-bit weights offset by 8.
    Q4_0,
    /// f16 scale, f16 minimum, 32 x 4-bit weights.
    Q4_1,
    /// f16 scale, 32 x i8 weights.
    Q8_0,
}

impl QuantType {
    /// Bytes of one GGML block of 32 weights.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }

    /// Bytes a [`QMatrix`] of `elems` weights holds in memory once repacked
    /// (the capacity plan counts these, not the GGML file's bytes).
    pub fn held_bytes(self, elems: usize) -> usize {
        elems / QK * (std::mem::size_of::<u32>() + self.quant_bytes())
    }

    /// Bytes of quants per block once the scales are split off.
    fn quant_bytes(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 => 16,
            Self::Q8_0 => 32,
        }
    }
}

/// A quantized weight matrix, `rows` output features by `cols` input features.
///
/// The GGML blocks are repacked on construction into a scale array (f16 `d`
/// and `m` per block, as GGML stores them, so batch-1 memory traffic stays at
/// GGML's size) and a quant array of aligned-size runs. Every format is stored
/// as unsigned quants `u` with `value = d * u + m`: Q4_0 has `m = -8 d`, and
/// Q8_0's i8 `q` is kept as `u = q + 128` with `m = -128 d`, so all three share
/// one unsigned-dot kernel.
#[derive(Debug, Clone)]
pub struct QMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    /// Per block: f16 bits of `d` (low half) and of Q4_1's `m` (high half, else 0).
    pub(crate) dm: Vec<u32>,
    /// Offset in units of `d`: `m = m_stored + m_per_d * d` (-8, 0 or -128).
    pub(crate) m_per_d: f32,
    /// `m_per_d` as the integer the kernels add to each block dot.
    pub(crate) m_int: i32,
    /// Per-block unsigned quants: 16 nibble bytes (Q4) or 32 bytes `q + 128` (Q8).
    pub(crate) qs: Vec<u8>,
}

impl QMatrix {
    /// Builds a matrix from raw GGML block bytes, checking their length.
    pub fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, Error> {
        if cols == 0 || !cols.is_multiple_of(QK) {
            return Err(Error::BadCols { cols });
        }
        let nblocks = rows
            .checked_mul(cols / QK)
            .ok_or(Error::Overflow("rows * cols"))?;
        let expected = nblocks
            .checked_mul(ty.block_bytes())
            .ok_or(Error::Overflow("weight bytes"))?;
        if data.len() != expected {
            return Err(Error::Length {
                what: "weight data",
                expected,
                got: data.len(),
            });
        }
        let mut dm = Vec::with_capacity(nblocks);
        let mut qs = Vec::with_capacity(nblocks * ty.quant_bytes());
        let u16_at = |b: &[u8], i: usize| u32::from(u16::from_le_bytes([b[i], b[i + 1]]));
        for blk in data.chunks_exact(ty.block_bytes()) {
            match ty {
                QuantType::Q4_0 => {
                    dm.push(u16_at(blk, 0));
                    qs.extend_from_slice(&blk[2..18]);
                }
                QuantType::Q4_1 => {
                    dm.push(u16_at(blk, 0) | (u16_at(blk, 2) << 16));
                    qs.extend_from_slice(&blk[4..20]);
                }
                QuantType::Q8_0 => {
                    dm.push(u16_at(blk, 0));
                    // Flipping the sign bit maps i8 q to the u8 q + 128.
                    qs.extend(blk[2..34].iter().map(|&b| b ^ 0x80));
                }
            }
        }
        let m_per_d = match ty {
            QuantType::Q4_0 => -8.0,
            QuantType::Q4_1 => 0.0,
            QuantType::Q8_0 => -128.0,
        };
        Ok(Self {
            ty,
            rows,
            cols,
            dm,
            m_per_d,
            m_int: m_per_d as i32,
            qs,
        })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The block format.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }

    /// Bytes of weights this matrix holds.
    pub fn held_bytes(&self) -> usize {
        self.dm.len() * std::mem::size_of::<u32>() + self.qs.len()
    }

    /// Blocks per row.
    pub(crate) fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// `(d, m_stored)` of block `blk` as f32: the stored offset only (Q4_1's
    /// `m`; 0 for the others), without the `m_per_d * d` part.
    pub(crate) fn stored_scales(&self, blk: usize) -> (f32, f32) {
        let dm = self.dm[blk];
        (
            f16::from_bits(dm as u16).to_f32(),
            f16::from_bits((dm >> 16) as u16).to_f32(),
        )
    }

    /// `(d, m)` of block `blk` as f32.
    pub(crate) fn scales(&self, blk: usize) -> (f32, f32) {
        let dm = self.dm[blk];
        let d = f16::from_bits(dm as u16).to_f32();
        let m = f16::from_bits((dm >> 16) as u16).to_f32();
        (
            d,
            if self.m_per_d == 0.0 {
                m
            } else {
                m + self.m_per_d * d
            },
        )
    }

    /// The whole matrix as f32, row-major `rows * cols`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (row, o) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_into(row, o);
        }
        out
    }

    /// Writes row `row` as f32 into `out` (length `cols`), e.g. an embedding lookup.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<(), Error> {
        if row >= self.rows {
            return Err(Error::RowOutOfRange {
                row,
                rows: self.rows,
            });
        }
        if out.len() != self.cols {
            return Err(Error::Length {
                what: "row output",
                expected: self.cols,
                got: out.len(),
            });
        }
        self.dequantize_into(row, out);
        Ok(())
    }

    fn dequantize_into(&self, row: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let blk = row * nb + b;
            let (d, m) = self.scales(blk);
            if self.ty == QuantType::Q8_0 {
                let q = &self.qs[blk * QK..(blk + 1) * QK];
                // Back to the signed value, so lookups are exactly GGML's `d * q`.
                for (v, &q) in o.iter_mut().zip(q) {
                    *v = d * f32::from((q ^ 0x80) as i8);
                }
            } else {
                let q = &self.qs[blk * 16..(blk + 1) * 16];
                let (lo, hi) = o.split_at_mut(16);
                for ((l, h), &q) in lo.iter_mut().zip(hi).zip(q) {
                    *l = d * f32::from(q & 0x0F) + m;
                    *h = d * f32::from(q >> 4) + m;
                }
            }
        }
    }

    /// `out[n*rows + m] = sum_k x[n*cols + k] * W[m][k]` for `n in 0..batch`.
    ///
    /// Activations are quantised to 8 bits per 32-block first (llama.cpp's
    /// method), so results carry ~1e-2 relative error against f32 math.
    pub fn matmul(&self, x: &[f32], batch: usize, out: &mut [f32]) -> Result<(), Error> {
        self.matmul_with(Kernel::detect(), x, batch, out)
    }

    pub(crate) fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        batch: usize,
        out: &mut [f32],
    ) -> Result<(), Error> {
        let x_len = batch
            .checked_mul(self.cols)
            .ok_or(Error::Overflow("batch * cols"))?;
        if x.len() != x_len {
            return Err(Error::Length {
                what: "matmul input",
                expected: x_len,
                got: x.len(),
            });
        }
        let out_len = batch
            .checked_mul(self.rows)
            .ok_or(Error::Overflow("batch * rows"))?;
        if out.len() != out_len {
            return Err(Error::Length {
                what: "matmul output",
                expected: out_len,
                got: out.len(),
            });
        }
        if out_len == 0 {
            return Ok(());
        }
        let acts = QActs::quantize(x, batch);
        let chunk = chunk_rows(self.rows, batch);
        if batch == 1 {
            out.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(c, o)| self.row_chunk(kernel, &acts, 1, c * chunk, o));
            return Ok(());
        }
        // Each task writes its rows batch-major ([batch][len]) into a scratch
        // buffer; copying contiguous runs back out is cheap, unlike a strided transpose.
        let mut tmp = vec![0f32; out_len];
        tmp.par_chunks_mut(chunk * batch)
            .enumerate()
            .for_each(|(c, o)| self.row_chunk(kernel, &acts, batch, c * chunk, o));
        let rows = self.rows;
        out.par_chunks_mut(rows).enumerate().for_each(|(n, o)| {
            for (c, src) in tmp.chunks(chunk * batch).enumerate() {
                let len = src.len() / batch;
                o[c * chunk..c * chunk + len].copy_from_slice(&src[n * len..(n + 1) * len]);
            }
        });
        Ok(())
    }

    /// Computes rows `m0..m0+len` for every batch row into `o`, laid out `[batch][len]`.
    fn row_chunk(&self, kernel: Kernel, acts: &QActs, batch: usize, m0: usize, o: &mut [f32]) {
        let len = o.len() / batch;
        let mut r = 0;
        while r < len {
            let rr = (len - r).min(2);
            let mut n = 0;
            while n < batch {
                let aa = (batch - n).min(4);
                let res = kernel.tile(self, m0 + r, rr, acts, n, aa);
                for (i, res_row) in res.iter().enumerate().take(rr) {
                    for (j, &v) in res_row.iter().enumerate().take(aa) {
                        o[(n + j) * len + r + i] = v;
                    }
                }
                n += aa;
            }
            r += rr;
        }
    }
}

/// Rows per rayon task: enough tasks to keep every thread busy (even at batch 1
/// on small matrices), few enough that scheduling stays cheap. Always even, so
/// the two-row tiles rarely hit a one-row tail.
fn chunk_rows(rows: usize, batch: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let max = if batch >= 16 { 32 } else { 64 };
    let c = rows.div_ceil(threads * 4).clamp(8, max);
    c + (c & 1)
}

#[cfg(test)]
#[path = "qmatrix_tests.rs"]
mod tests;
