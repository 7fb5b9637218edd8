//! Experts stored as MXFP4 (gpt-oss as released: `{name}_blocks` `[experts,
//! rows, blocks, 16]` and `{name}_scales` `[experts, rows, blocks]`, rows
//! as a linear layer's, gate and up interleaved row by row): on CPU each
//! expert's matrices packed as MXFP4 for our kernels (GGML's block layout,
//! 17 bytes a block of 32, every scale held exactly), elsewhere widened to
//! the held dtype.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use ferrox_kernels::{QMatrix, QuantType};
use ferrox_plan::DeviceKind;

use super::SafetensorsSource;
use crate::error::{Error, Result};
use crate::holding::{self, Role};
use crate::linear::Linear;
use crate::mxfp4;
use crate::projection::Projection;

/// Bytes a stored MXFP4 tensor `name` of `shape` takes as held on `device`
/// (its scales are folded into its blocks'), or `None` for another tensor.
pub(super) fn held_bytes(name: &str, shape: &[usize], device: DeviceKind) -> Option<u64> {
    if name.ends_with("_scales") && shape.len() == 3 {
        return Some(0);
    }
    let [experts, rows, blocks, 16] = *shape else {
        return None;
    };
    if !name.ends_with("_blocks") {
        return None;
    }
    let cols = blocks.checked_mul(mxfp4::BLOCK)?;
    let one = match device {
        DeviceKind::Cpu => QuantType::MXFP4.held_bytes(rows, cols).ok()?,
        DeviceKind::Cuda => rows.checked_mul(cols)?.checked_mul(2)?,
    };
    one.checked_mul(experts).map(|b| b as u64)
}

/// Parameters a stored MXFP4 tensor holds (two a byte of its blocks; none
/// in its scales), or `None` for another tensor.
pub(super) fn params(name: &str, elems: usize) -> Option<u64> {
    match name {
        n if n.ends_with("_blocks") => Some(2 * elems as u64),
        n if n.ends_with("_scales") => Some(0),
        _ => None,
    }
}

impl SafetensorsSource {
    /// Each expert's projection of `parts` (GGUF names, rows each) from
    /// MXFP4 tensors, or `None` where the checkpoint stores them otherwise.
    pub(super) fn mxfp4_experts(
        &self,
        parts: &[(&str, usize)],
        experts: usize,
        cols: usize,
        device: &Device,
    ) -> Result<Option<Vec<Projection>>> {
        let hf: Vec<String> = parts.iter().map(|(p, _)| self.names.hf(p)).collect();
        if hf
            .iter()
            .any(|n| self.files.get(&format!("{n}_blocks")).is_err())
        {
            return Ok(None);
        }
        let mut stored = Vec::with_capacity(parts.len());
        for (&(gguf, rows), name) in parts.iter().zip(&hf) {
            let (blocks, scales) = (format!("{name}_blocks"), format!("{name}_scales"));
            let bad = |what: String| Error::Corrupt {
                path: blocks.clone(),
                message: what,
            };
            let b = self.files.get(&blocks).map_err(|e| bad(e.to_string()))?;
            let s = self.files.get(&scales).map_err(|e| bad(e.to_string()))?;
            // Gate and up share one tensor, rows interleaved.
            let column = self.interleaved_column(gguf);
            let all = rows * if column.is_some() { 2 } else { 1 };
            let per_row = cols / mxfp4::BLOCK;
            let want = [experts, all, per_row, mxfp4::BLOCK_BYTES];
            if b.shape() != want || s.shape() != &want[..3] || !cols.is_multiple_of(mxfp4::BLOCK) {
                return Err(bad(format!(
                    "MXFP4 blocks {:?} and scales {:?}, expected {want:?}",
                    b.shape(),
                    s.shape()
                )));
            }
            stored.push((b, s, column, rows, all));
        }
        let packed = self.device == DeviceKind::Cpu;
        let mut out = Vec::with_capacity(experts);
        for e in 0..experts {
            let (mut ggml, mut f, mut rows_total) = (Vec::new(), Vec::new(), 0);
            for (b, s, column, rows, all) in &stored {
                let pick = |i: usize| e * all + column.map_or(i, |c| 2 * i + c);
                let (bd, sd, per_row) = (b.data(), s.data(), cols / mxfp4::BLOCK);
                if packed {
                    ggml.extend(mxfp4::rows_to_ggml(bd, sd, per_row, (0..*rows).map(pick)));
                } else {
                    f.extend(mxfp4::rows_to_f32(bd, sd, per_row, (0..*rows).map(pick)));
                }
                rows_total += rows;
            }
            let linear = if packed {
                let m = QMatrix::new(QuantType::MXFP4, rows_total, cols, ggml).map_err(|x| {
                    Error::Corrupt {
                        path: hf.join(", "),
                        message: x.to_string(),
                    }
                })?;
                Linear::Packed(Arc::new(m))
            } else {
                let held = holding::safetensors(Role::Matrix, DType::BF16, self.device);
                Linear::Dense(Tensor::from_vec(f, (rows_total, cols), device)?.to_dtype(held)?)
            };
            out.push(Projection::Fused(linear));
        }
        Ok(Some(out))
    }
}
