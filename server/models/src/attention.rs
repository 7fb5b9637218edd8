//! Attention over the paged KV cache for a batch of sequences, each with its
//! own block table, start position and number of new tokens.
//!
//! On CPU this runs ferrox-kernels' fused paged attention, which reads K and
//! V (f32, f16 or bf16) straight out of the blocks; on CUDA the same op runs
//! a kernel of ours compiled with NVRTC ([`cuda`]). The gather path (the
//! reference in tests, and `--attention-backend gather`) gathers each
//! sequence's slots, widens them to the queries' dtype and uses ordinary
//! tensor ops.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Tensor};
use ferrox_kernels::{AttnGeometry, AttnSeq, KvElem};

use crate::error::Result;
use crate::kv_cache::KvCache;

#[cfg(feature = "cuda")]
pub mod cuda;

/// How attention reads the paged KV (`--attention-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionBackend {
    /// Our kernel reads K and V through the block tables (CPU and CUDA).
    #[default]
    Paged,
    /// Gather each sequence's slots and use tensor ops: the reference, kept
    /// to measure the kernel against.
    Gather,
}

impl std::str::FromStr for AttentionBackend {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "paged" => Ok(AttentionBackend::Paged),
            "gather" => Ok(AttentionBackend::Gather),
            other => Err(format!(
                "`{other}` is not an attention backend (paged or gather)"
            )),
        }
    }
}

/// The new tokens of one sequence in a step.
#[derive(Debug, Clone)]
pub struct SeqSpan {
    /// The sequence's block table.
    pub blocks: Vec<u32>,
    /// Position of the first new token.
    pub start_pos: usize,
    /// New tokens (1 for a decode row, the chunk length for prefill).
    pub n_tokens: usize,
}

/// Head layout.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
}

/// `q`: `(tokens, heads, head_dim)`, the spans' tokens in order; returns
/// `(tokens, heads * head_dim)`. Causal: a token sees its own and earlier
/// positions of its own sequence only.
pub fn attention(
    q: &Tensor,
    cache: &KvCache,
    layer: usize,
    spans: &Arc<[SeqSpan]>,
    heads: Heads,
    fused: bool,
) -> Result<Tensor> {
    let (k, v) = cache.layer(layer);
    let has_kernel = q.device().is_cpu() || (cfg!(feature = "cuda") && q.device().is_cuda());
    if fused && has_kernel {
        let op = PagedAttention {
            spans: spans.clone(),
            geometry: AttnGeometry {
                heads: heads.heads,
                kv_heads: heads.kv_heads,
                head_dim: heads.head_dim,
                block_size: cache.block_size(),
            },
        };
        // Both kernels take f32 queries (the residual stream's type).
        let q = q.to_dtype(candle_core::DType::F32)?.contiguous()?;
        return Ok(q.apply_op3_no_bwd(k, v, &op)?);
    }
    gathered(q, cache, layer, spans, heads)
}

struct PagedAttention {
    spans: Arc<[SeqSpan]>,
    geometry: AttnGeometry,
}

fn contiguous<'a, T>(data: &'a [T], l: &Layout, what: &str) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("paged attention: {what} must be contiguous"),
    }
}

impl PagedAttention {
    /// Runs the kernel over a cache held in `T`.
    fn run<T: KvElem>(&self, q: &[f32], k: &[T], v: &[T]) -> candle_core::Result<Vec<f32>> {
        let seqs: Vec<AttnSeq<'_>> = self
            .spans
            .iter()
            .map(|s| AttnSeq {
                blocks: &s.blocks,
                start_pos: s.start_pos,
                n_tokens: s.n_tokens,
            })
            .collect();
        let mut out = vec![0f32; q.len()];
        ferrox_kernels::paged_attention(&self.geometry, q, k, v, &seqs, &mut out)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(out)
    }
}

impl CustomOp3 for PagedAttention {
    fn name(&self) -> &'static str {
        "ferrox-paged-attention"
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        cuda::forward(self, s1, l1, s2, l2, s3, l3)
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(q) = s1 else {
            candle_core::bail!("paged attention: q must be f32");
        };
        let q = contiguous(q, l1, "q")?;
        let (k, v) = ("k cache", "v cache");
        let out = match (s2, s3) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                self.run(q, contiguous(a, l2, k)?, contiguous(b, l3, v)?)?
            }
            (CpuStorage::F16(a), CpuStorage::F16(b)) => {
                self.run(q, contiguous(a, l2, k)?, contiguous(b, l3, v)?)?
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
                self.run(q, contiguous(a, l2, k)?, contiguous(b, l3, v)?)?
            }
            _ => candle_core::bail!("paged attention: K and V must be f32, f16 or bf16 alike"),
        };
        let tokens = q.len() / (self.geometry.heads * self.geometry.head_dim);
        Ok((
            CpuStorage::F32(out),
            Shape::from((tokens, self.geometry.heads * self.geometry.head_dim)),
        ))
    }
}

/// The device-generic path: gather each sequence's slots and attend with
/// tensor ops.
fn gathered(
    q: &Tensor,
    cache: &KvCache,
    layer: usize,
    spans: &[SeqSpan],
    h: Heads,
) -> Result<Tensor> {
    let (k_cache, v_cache) = cache.layer(layer);
    let device = q.device();
    let rep = h.heads / h.kv_heads;
    let scale = 1.0 / (h.head_dim as f64).sqrt();
    let mut outs = Vec::with_capacity(spans.len());
    let mut offset = 0;
    for span in spans {
        let ctx = span.start_pos + span.n_tokens;
        let slots: Vec<u32> = (0..ctx)
            .map(|p| cache.slot(&span.blocks, p).map(|s| s as u32))
            .collect::<Result<_>>()?;
        let idx = Tensor::new(slots.as_slice(), device)?;
        let expand = |t: &Tensor| -> Result<Tensor> {
            let t = t
                .index_select(&idx, 0)?
                .to_dtype(q.dtype())?
                .reshape((ctx, h.kv_heads, 1, h.head_dim))?;
            let t = t.broadcast_as((ctx, h.kv_heads, rep, h.head_dim))?;
            Ok(t.reshape((ctx, h.heads, h.head_dim))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let (k, v) = (expand(k_cache)?, expand(v_cache)?);
        let qs = q
            .narrow(0, offset, span.n_tokens)?
            .transpose(0, 1)?
            .contiguous()?;
        let scores = (qs.matmul(&k.t()?)? * scale)?;
        let mask = causal_mask(span.start_pos, span.n_tokens, device)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        let o = probs.matmul(&v)?.transpose(0, 1)?;
        outs.push(o.reshape((span.n_tokens, h.heads * h.head_dim))?);
        offset += span.n_tokens;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

fn causal_mask(start: usize, n: usize, device: &Device) -> Result<Tensor> {
    let ctx = start + n;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..ctx).map(move |j| {
                if j > start + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(mask, (1, n, ctx), device)?)
}

#[cfg(test)]
mod tests {
    use super::AttentionBackend;

    #[test]
    fn backends_parse() {
        assert_eq!("paged".parse(), Ok(AttentionBackend::Paged));
        assert_eq!("gather".parse(), Ok(AttentionBackend::Gather));
        assert_eq!(AttentionBackend::default(), AttentionBackend::Paged);
        let err = "flash".parse::<AttentionBackend>().unwrap_err();
        assert!(err.contains("paged or gather"), "{err}");
    }
}
