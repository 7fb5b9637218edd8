//! Quantized weight matrices, repacked at load from GGML blocks into the
//! layout the tiles read.

use half::f16;

use crate::Error;
use crate::quant_type::{GROUP, QK, QuantType};

/// A quantized weight matrix, `rows` output features by `cols` input features.
///
/// Repacked on construction, once, for the tiles: rows in groups of
/// [`GROUP`] (the last padded with zero rows), each block of a group stored
/// as its rows' f16 scales side by side (`d`, and Q4_1's minima `m`: one
/// conversion gives the 8 rows' scales as a vector) and its quants
/// interleaved 4 bytes a row: 4-bit blocks keep GGML's 16 bytes a row (byte
/// `j` holds weight `j` low and `j + 16` high), so group byte `32 t + 4 r + i`
/// is row `r`'s byte `4 t + i`; 8-bit blocks the same with GGML's 32 signed
/// bytes. A tile then gets a block's integer dots for 8 rows in the lanes of
/// one register, with no horizontal sums. Values: Q4_0 `d * (u - 8)`, Q4_1
/// `d * u + m`, Q8_0 `d * q`. The bytes held are [`QuantType::held_bytes`].
#[derive(Debug, Clone)]
pub struct QMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    /// f16 bits of each block's scale, `[group][block][row in group]`.
    pub(crate) d: Vec<u16>,
    /// f16 bits of each block's minimum (Q4_1 only, else empty), as `d`.
    pub(crate) m: Vec<u16>,
    /// Quants, `[group][block][QuantType::group_block_bytes]`.
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
        let slots = rows.next_multiple_of(GROUP) * nb;
        let mut d = vec![0u16; slots];
        let mut m = vec![0u16; if ty == QuantType::Q4_1 { slots } else { 0 }];
        let gbb = ty.group_block_bytes();
        let mut qs = vec![0u8; slots / GROUP * gbb];
        let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let quants = match ty {
            QuantType::Q4_0 => 2..18,
            QuantType::Q4_1 => 4..20,
            QuantType::Q8_0 => 2..34,
        };
        for (i, blk) in data.chunks_exact(ty.block_bytes()).enumerate() {
            let (row, b) = (i / nb, i % nb);
            let (g, r) = (row / GROUP, row % GROUP);
            let slot = (g * nb + b) * GROUP + r;
            d[slot] = u16_at(blk, 0);
            if ty == QuantType::Q4_1 {
                m[slot] = u16_at(blk, 2);
            }
            let dst = &mut qs[(g * nb + b) * gbb..(g * nb + b + 1) * gbb];
            for (t, four) in blk[quants.clone()].chunks_exact(4).enumerate() {
                let at = t * 4 * GROUP + 4 * r;
                dst[at..at + 4].copy_from_slice(four);
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

    /// Row groups, the last padded.
    pub(crate) fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Index of block `b` of row `row` in the scale arrays.
    fn slot(&self, row: usize, b: usize) -> usize {
        ((row / GROUP) * self.blocks_per_row() + b) * GROUP + row % GROUP
    }

    /// Weight `k` of block `b` of row `row` as its stored integer: the
    /// nibble `u` for 4-bit formats, the signed `q` for Q8_0.
    pub(crate) fn quant(&self, row: usize, b: usize, k: usize) -> i32 {
        let block = ((row / GROUP) * self.blocks_per_row() + b) * self.ty.group_block_bytes();
        let byte = |j: usize| self.qs[block + (j / 4) * 4 * GROUP + 4 * (row % GROUP) + j % 4];
        if self.ty.is_q4() {
            i32::from(if k < 16 {
                byte(k) & 0x0F
            } else {
                byte(k - 16) >> 4
            })
        } else {
            i32::from(byte(k) as i8)
        }
    }

    /// `(d, m)` of block `b` of row `row` as f32 (`m` is Q4_1's stored minimum, else 0).
    pub(crate) fn stored_scales(&self, row: usize, b: usize) -> (f32, f32) {
        let i = self.slot(row, b);
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
