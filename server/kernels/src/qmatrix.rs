//! Quantized weight matrices, repacked at load from GGML blocks into the
//! layout the tiles read.

use half::f16;

use crate::Error;
use crate::quant_type::{QK, QuantType};

/// A quantized weight matrix, `rows` output features by `cols` input features.
///
/// Repacked on construction, once, for the tiles: the f16 scales `d` (and
/// Q4_1's minima `m`) of a row are contiguous, so a tile converts eight
/// blocks' scales with one instruction; 4-bit quants are stored as 32-byte
/// block pairs (byte `t` holds weight `t` of block `2p` in its low nibble and
/// of block `2p + 1` in its high nibble), so one load and two masks give two
/// whole blocks in activation order; 8-bit quants keep GGML's signed bytes.
/// Values: Q4_0 `d * (u - 8)`, Q4_1 `d * u + m`, Q8_0 `d * q`. The bytes
/// held are [`QuantType::held_bytes`].
#[derive(Debug, Clone)]
pub struct QMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    /// f16 bits of each block's scale, `[row][block]`.
    pub(crate) d: Vec<u16>,
    /// f16 bits of each block's minimum (Q4_1 only, else empty), `[row][block]`.
    pub(crate) m: Vec<u16>,
    /// Quants, `row_stride` bytes a row.
    pub(crate) qs: Vec<u8>,
    /// Integer offset every quant carries (Q4_0's -8), applied exactly to
    /// the block dots in integers.
    pub(crate) m_int: i32,
}

impl QMatrix {
    /// Builds a matrix from raw GGML block bytes, checking their length.
    pub fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, Error> {
        ty.held_bytes(rows, cols)?;
        let nb = cols / QK;
        let expected = rows
            .checked_mul(nb)
            .and_then(|n| n.checked_mul(ty.block_bytes()))
            .ok_or(Error::Overflow("weight bytes"))?;
        if data.len() != expected {
            return Err(Error::Length {
                what: "weight data",
                expected,
                got: data.len(),
            });
        }
        let stride = ty.row_quant_bytes(nb);
        let mut d = Vec::with_capacity(rows * nb);
        let mut m = Vec::with_capacity(if ty == QuantType::Q4_1 { rows * nb } else { 0 });
        let mut qs = vec![0u8; rows * stride];
        let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        for (i, blk) in data.chunks_exact(ty.block_bytes()).enumerate() {
            let (row, b) = (i / nb, i % nb);
            d.push(u16_at(blk, 0));
            let dst = &mut qs[row * stride..(row + 1) * stride];
            match ty {
                QuantType::Q4_0 | QuantType::Q4_1 => {
                    let q = if ty == QuantType::Q4_1 {
                        m.push(u16_at(blk, 2));
                        &blk[4..20]
                    } else {
                        &blk[2..18]
                    };
                    let (pair, shift) = (&mut dst[(b / 2) * 32..(b / 2 + 1) * 32], 4 * (b % 2));
                    for (k, &byte) in q.iter().enumerate() {
                        pair[k] |= (byte & 0x0F) << shift;
                        pair[k + 16] |= (byte >> 4) << shift;
                    }
                }
                QuantType::Q8_0 => dst[b * QK..(b + 1) * QK].copy_from_slice(&blk[2..34]),
            }
        }
        Ok(Self {
            ty,
            rows,
            cols,
            d,
            m,
            qs,
            m_int: if ty == QuantType::Q4_0 { -8 } else { 0 },
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

    /// Bytes the weights occupy (equals [`QuantType::held_bytes`]).
    pub fn held_bytes(&self) -> usize {
        self.d.capacity() * 2 + self.m.capacity() * 2 + self.qs.capacity()
    }

    /// Blocks per row.
    pub(crate) fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Quant bytes per row.
    pub(crate) fn row_stride(&self) -> usize {
        self.ty.row_quant_bytes(self.blocks_per_row())
    }

    /// Weight `k` of block `b` of row `row` as its stored integer: the
    /// nibble `u` for 4-bit formats, the signed `q` for Q8_0.
    pub(crate) fn quant(&self, row: usize, b: usize, k: usize) -> i32 {
        let base = row * self.row_stride();
        if self.ty.is_q4() {
            let byte = self.qs[base + (b / 2) * 32 + k];
            i32::from(if b.is_multiple_of(2) {
                byte & 0x0F
            } else {
                byte >> 4
            })
        } else {
            i32::from(self.qs[base + b * QK + k] as i8)
        }
    }

    /// `(d, m)` of block `b` of row `row` as f32 (`m` is Q4_1's stored minimum, else 0).
    pub(crate) fn stored_scales(&self, row: usize, b: usize) -> (f32, f32) {
        let i = row * self.blocks_per_row() + b;
        let m = self.m.get(i).map_or(0.0, |&m| f16::from_bits(m).to_f32());
        (f16::from_bits(self.d[i]).to_f32(), m)
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
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let (d, m) = self.stored_scales(row, b);
            for (k, v) in o.iter_mut().enumerate() {
                let q = self.quant(row, b, k) + self.m_int;
                // Exactly GGML's `d * q` (Q4_0, Q8_0) and `d * u + m` (Q4_1).
                *v = if self.ty == QuantType::Q4_1 {
                    d * q as f32 + m
                } else {
                    d * q as f32
                };
            }
        }
    }
}

#[cfg(test)]
#[path = "qmatrix_tests.rs"]
mod tests;
