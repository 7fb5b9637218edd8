//! The GGML block formats the kernels run, and the bytes a repacked matrix holds.

use crate::Error;

/// Weights per quantization block.
pub const QK: usize = 32;

/// Weight rows interleaved per group: one 256-bit register holds 4 bytes
/// of each of a group's rows, so its lanes are the group's rows.
pub(crate) const GROUP: usize = 8;

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

    /// Whether weights are 4-bit (two to a byte).
    pub(crate) fn is_q4(self) -> bool {
        matches!(self, Self::Q4_0 | Self::Q4_1)
    }

    /// Quant bytes of one block of a whole row group (`GROUP` rows) in the
    /// repacked layout: GGML's quant bytes, row after row.
    pub(crate) fn group_block_bytes(self) -> usize {
        GROUP * if self.is_q4() { QK / 2 } else { QK }
    }

    /// Exactly the bytes [`crate::QMatrix::new`] allocates for a `rows x cols`
    /// matrix of this format (the memory planner counts weights with it):
    /// GGML's size, with the rows rounded up to a whole group of 8.
    pub fn held_bytes(self, rows: usize, cols: usize) -> Result<usize, Error> {
        if cols == 0 || !cols.is_multiple_of(QK) {
            return Err(Error::BadCols { cols });
        }
        let nb = cols / QK;
        let scales = if self == Self::Q4_1 { 4 } else { 2 };
        rows.checked_next_multiple_of(GROUP)
            .and_then(|r| r.checked_mul(nb))
            .and_then(|n| n.checked_mul(self.group_block_bytes() / GROUP + scales))
            .ok_or(Error::Overflow("weight bytes"))
    }
}
