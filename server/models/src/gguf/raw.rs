//! A GGUF tensor as read: its bytes as stored, and the row-level
//! operations that stay in the stored form (row sizes, llama.cpp's q/k
//! row order put back).

use candle_core::quantized::GgmlDType;

use crate::mxfp4;

/// A tensor as read from the file, before it is held.
pub(super) struct Raw {
    pub(super) name: String,
    /// The type `content` lists (an MXFP4 tensor's is Q5_0).
    pub(super) dtype: GgmlDType,
    pub(super) dims: Vec<usize>,
    pub(super) bytes: Vec<u8>,
    /// `bytes` are GGML MXFP4 blocks (17 bytes a block of 32).
    pub(super) mx: bool,
}

impl Raw {
    /// Bytes of a row of `cols` values as `bytes` hold them.
    pub(super) fn row_bytes(&self, cols: usize) -> usize {
        match self.mx {
            true => cols / mxfp4::BLOCK * mxfp4::GGML_BLOCK_BYTES,
            false => tensor_bytes(self.dtype, cols),
        }
    }
}

/// Bytes of `elems` values of the block type `dtype`.
pub(super) fn tensor_bytes(dtype: GgmlDType, elems: usize) -> usize {
    elems / dtype.block_size() * dtype.type_size()
}

/// llama.cpp's converter interleaves the two halves of each head's q/k rows
/// (for its RoPE); our RoPE is Hugging Face's half-split one, so put the rows
/// back: HF row `h*d + j*d/2 + i` is GGUF row `h*d + 2i + j`.
pub(super) fn unpermute_rows(raw: &mut Raw, heads: usize) {
    // A matrix of another rank is refused by the shape check that follows.
    let &[rows, cols] = raw.dims.as_slice() else {
        return;
    };
    let row_bytes = raw.row_bytes(cols);
    // Counts from a corrupt header: leave the rows as they are and let the
    // shape checks refuse the tensor.
    let fits = rows
        .checked_mul(row_bytes)
        .is_some_and(|n| n <= raw.bytes.len());
    if heads == 0 || !fits || heads.checked_mul(2).is_none_or(|h2| rows % h2 != 0) {
        return;
    }
    let d = rows / heads;
    let mut out = vec![0u8; raw.bytes.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..d / 2 {
                let dst = h * d + j * (d / 2) + i;
                let src = h * d + 2 * i + j;
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&raw.bytes[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    raw.bytes = out;
}
