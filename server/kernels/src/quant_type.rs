//! The GGML block formats the kernels run, and the bytes a repacked matrix holds.

use crate::Error;

/// Weights per quantization block.
pub const QK: usize = 32;

/// GGML block formats supported by [`crate::QMatrix`].
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

    /// Whether weights are 4-bit (stored two blocks to a 32-byte pair).
    pub(crate) fn is_q4(self) -> bool {
        matches!(self, Self::Q4_0 | Self::Q4_1)
    }

    /// Quant bytes of one row of `nb` blocks in the repacked layout: 4-bit
    /// rows are whole 32-byte block pairs (an odd last block is paired with
    /// zeros), 8-bit rows are 32 bytes a block.
    pub(crate) fn row_quant_bytes(self, nb: usize) -> usize {
        if self.is_q4() {
            nb.div_ceil(2) * 32
        } else {
            nb * QK
        }
    }

    /// Exactly the bytes [`crate::QMatrix::new`] allocates for a `rows x cols`
    /// matrix of this format (the memory planner counts weights with it).
    /// Equal to the GGML size whenever a row has an even number of blocks.
    pub fn held_bytes(self, rows: usize, cols: usize) -> Result<usize, Error> {
        if cols == 0 || !cols.is_multiple_of(QK) {
            return Err(Error::BadCols { cols });
        }
        let nb = cols / QK;
        let scales = if self == Self::Q4_1 { 4 } else { 2 };
        let per_row = self.row_quant_bytes(nb) + scales * nb;
        rows.checked_mul(per_row)
            .ok_or(Error::Overflow("weight bytes"))
    }
}
