//! Linear layers and embeddings over whatever the weights are stored as.
//!
//! On CPU, the block types ferrox-kernels runs and GGUF's f16 matrices go
//! through its SIMD kernels, which load each weight block once for the
//! whole batch (candle's quantized matmul re-reads the weights per row, so
//! batching would not pay; its f32 matmul would hold f16 weights at twice
//! their bytes). Other quantized types use candle's `QMatMul`; float weights
//! use a dense matmul. Both of those work on any candle `Device`.

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use ferrox_kernels::{HalfMatrix, QMatrix};

use crate::error::{Error, Result};

/// A weight matrix `[out, in]` applied as `x @ W^T`.
#[derive(Debug, Clone)]
pub enum Linear {
    /// Block-quantized weights run by our SIMD kernels (CPU only).
    Packed(Arc<QMatrix>),
    /// f16 weights run by our SIMD kernels in f32 (CPU only).
    Half(Arc<HalfMatrix>),
    /// Quantized weights run by candle.
    Quant(QMatMul),
    /// Float weights `[out, in]`.
    Dense(Tensor),
}

impl Linear {
    /// `x`: `(tokens, in)` -> `(tokens, out)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Packed(w) => Ok(x.contiguous()?.apply_op1_no_bwd(&KernelMatmul(&**w))?),
            Linear::Half(w) => Ok(x.contiguous()?.apply_op1_no_bwd(&KernelMatmul(&**w))?),
            Linear::Quant(w) => Ok(x.apply(w)?),
            // Half weights (a GPU's): the matmul in their dtype, the
            // residual stream kept in the caller's.
            Linear::Dense(w) if w.dtype() != x.dtype() => Ok(x
                .to_dtype(w.dtype())?
                .matmul(&w.t()?)?
                .to_dtype(x.dtype())?),
            Linear::Dense(w) => Ok(x.matmul(&w.t()?)?),
        }
    }

    /// Bytes of weights held.
    pub fn held_bytes(&self) -> u64 {
        match self {
            Linear::Packed(w) => w.held_bytes() as u64,
            Linear::Half(w) => w.held_bytes() as u64,
            Linear::Quant(QMatMul::QTensor(q)) => q.storage_size_in_bytes() as u64,
            Linear::Quant(QMatMul::Tensor(t)) | Linear::Quant(QMatMul::TensorF16(t)) => {
                tensor_bytes(t)
            }
            Linear::Dense(w) => tensor_bytes(w),
        }
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        match self {
            Linear::Packed(w) => w.rows(),
            Linear::Half(w) => w.rows(),
            Linear::Quant(QMatMul::QTensor(q)) => q.shape().dims()[0],
            Linear::Quant(QMatMul::Tensor(t)) | Linear::Quant(QMatMul::TensorF16(t)) => t.dims()[0],
            Linear::Dense(w) => w.dims()[0],
        }
    }
}

/// Bytes a tensor's elements take.
pub fn tensor_bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

/// What a ferrox-kernels matmul returns.
type KernelResult = std::result::Result<(), ferrox_kernels::Error>;

/// A weight matrix ferrox-kernels multiplies on CPU.
trait KernelMatrix {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    fn matmul(&self, x: &[f32], batch: usize, out: &mut [f32]) -> KernelResult;
}

/// Both matrix types by their own (inherent) methods.
macro_rules! kernel_matrix {
    ($($t:ty),*) => {$(
        impl KernelMatrix for $t {
            fn rows(&self) -> usize {
                <$t>::rows(self)
            }
            fn cols(&self) -> usize {
                <$t>::cols(self)
            }
            fn matmul(&self, x: &[f32], batch: usize, out: &mut [f32]) -> KernelResult {
                <$t>::matmul(self, x, batch, out)
            }
        }
    )*};
}

kernel_matrix!(QMatrix, HalfMatrix);

/// `x @ W^T` through ferrox-kernels, as a candle op so it composes with the
/// rest of the graph.
struct KernelMatmul<'a, M>(&'a M);

impl<M: KernelMatrix> CustomOp1 for KernelMatmul<'_, M> {
    fn name(&self) -> &'static str {
        "ferrox-kernel-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let w = self.0;
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("kernel matmul needs f32 input");
        };
        let (tokens, cols) = layout.shape().dims2()?;
        if cols != w.cols() {
            candle_core::bail!(
                "kernel matmul: input width {cols}, weight expects {}",
                w.cols()
            );
        }
        let x = match layout.contiguous_offsets() {
            Some((start, end)) => &data[start..end],
            None => candle_core::bail!("kernel matmul needs a contiguous input"),
        };
        let mut out = vec![0f32; tokens * w.rows()];
        w.matmul(x, tokens, &mut out)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok((CpuStorage::F32(out), Shape::from((tokens, w.rows()))))
    }
}

/// The token embedding table `[vocab, hidden]`.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// Block-quantized rows, dequantized on lookup (CPU only).
    Packed(Arc<QMatrix>),
    /// Float rows.
    Dense(Tensor),
}

impl Embedding {
    /// Rows of the table.
    pub fn vocab(&self) -> usize {
        match self {
            Embedding::Packed(w) => w.rows(),
            Embedding::Dense(t) => t.dims()[0],
        }
    }

    /// Looks up `ids`: `(tokens, hidden)`. Every id must be below `vocab()`.
    pub fn forward(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab()) {
            return Err(Error::Input(format!(
                "token id {bad} outside vocabulary of {}",
                self.vocab()
            )));
        }
        match self {
            Embedding::Packed(w) => {
                let hidden = w.cols();
                let mut out = vec![0f32; ids.len() * hidden];
                for (row, &id) in out.chunks_exact_mut(hidden).zip(ids) {
                    w.dequantize_row(id as usize, row)?;
                }
                Ok(Tensor::from_vec(out, (ids.len(), hidden), device)?)
            }
            Embedding::Dense(t) => {
                let ids = Tensor::new(ids, device)?;
                Ok(t.embedding(&ids)?.to_dtype(DType::F32)?)
            }
        }
    }

    /// Bytes of the table held.
    pub fn held_bytes(&self) -> u64 {
        match self {
            Embedding::Packed(w) => w.held_bytes() as u64,
            Embedding::Dense(t) => tensor_bytes(t),
        }
    }

    /// The same table as an output projection (tied embeddings).
    pub fn as_linear(&self) -> Linear {
        match self {
            Embedding::Packed(w) => Linear::Packed(w.clone()),
            Embedding::Dense(t) => Linear::Dense(t.clone()),
        }
    }
}
