//! CPU kernels for the server's hot paths: quantized matmul over GGML block
//! formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K..Q6_K and
//! MXFP4), f16 matmul ([`HalfMatrix`]) and paged attention over an f32, f16
//! or bf16 KV cache.
//!
//! Weights are repacked at load into the layout the tiles read (see
//! [`QMatrix`]: 8 rows interleaved, so a register's lanes are 8 rows and a
//! block's scales are one vector); activations are quantised once per op
//! into a reusable [`QActs`], fused with the RMSNorm or SiLU-and-multiply
//! that produces them.
//!
//! Every kernel has a portable scalar path, and every SIMD path computes
//! each output with the scalar path's operations in its order, so all agree
//! bit for bit. On x86_64 the matmul picks at run time the fastest of
//! AVX2+FMA+F16C (`maddubs`), AVX-VNNI (256-bit `vpdpbusd`) and AVX-512
//! VNNI (512-bit `vpdpbusd`; never AMX); the tests check each one the CPU
//! supports against the scalar path. Work is spread over rayon's global pool.

mod attention;
mod dot;
#[cfg(test)]
mod fixtures;
mod gelu;
mod ggml_block;
mod half_matrix;
mod layout;
mod matmul;
mod qact;
mod qmatrix;
mod quant_type;
#[cfg(test)]
mod test_util;

pub use attention::{
    AttnGeometry, AttnParams, AttnSeq, KvElem, paged_attention, paged_attention_with_sinks,
};
pub use dot::Kernel;
pub use gelu::{erf, gelu_erf_in_place};
pub use half_matrix::HalfMatrix;
pub use matmul::MAX_PARTS;
pub use qact::QActs;
pub use qmatrix::QMatrix;
pub use quant_type::{QK, QK_K, QuantType};

/// Errors from kernel entry points: all are caller mistakes in shapes or tables.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The number of input features is not a positive multiple of the block size.
    #[error("cols must be a positive multiple of {multiple}, got {cols}")]
    BadCols {
        /// The rejected column count.
        cols: usize,
        /// The block length it must be a multiple of (32, or 256 for K-quants).
        multiple: usize,
    },
    /// A buffer has the wrong number of elements (or bytes).
    #[error("{what}: expected length {expected}, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// The length the shapes imply.
        expected: usize,
        /// The length passed in.
        got: usize,
    },
    /// A row index is past the end of the matrix.
    #[error("row {row} out of range for a matrix of {rows} rows")]
    RowOutOfRange {
        /// The requested row.
        row: usize,
        /// The matrix's row count.
        rows: usize,
    },
    /// The attention geometry is inconsistent.
    #[error("invalid attention geometry: {0}")]
    Geometry(&'static str),
    /// A sequence's block table is too short for its positions.
    #[error("sequence {seq}: positions up to {last_pos} need {need} blocks, table has {have}")]
    BlockTable {
        /// Index of the sequence in the call.
        seq: usize,
        /// Its last query position.
        last_pos: usize,
        /// Blocks those positions need.
        need: usize,
        /// Blocks in its table.
        have: usize,
    },
    /// A block id is past the end of the KV cache.
    #[error("sequence {seq}: block id {block} out of range, cache has {num_blocks} blocks")]
    BlockId {
        /// Index of the sequence in the call.
        seq: usize,
        /// The offending block id.
        block: u32,
        /// Blocks in the cache.
        num_blocks: usize,
    },
    /// The chosen kernel needs instructions this CPU lacks.
    #[error("kernel {0:?} is not supported by this CPU")]
    Unsupported(Kernel),
    /// Sizes overflow `usize`.
    #[error("size overflow: {0}")]
    Overflow(&'static str),
}

/// Checks a row read: `row` below `rows`, `out` exactly `cols` long.
pub(crate) fn check_row(row: usize, rows: usize, out: usize, cols: usize) -> Result<(), Error> {
    if row >= rows {
        return Err(Error::RowOutOfRange { row, rows });
    }
    if out != cols {
        return Err(Error::Length {
            what: "row output",
            expected: cols,
            got: out,
        });
    }
    Ok(())
}
