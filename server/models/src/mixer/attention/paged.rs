//! Attention over the paged KV cache for a batch of sequences, each with its
//! own block table, start position and number of new tokens.
//!
//! On CPU this runs ferrox-kernels' fused paged attention, which reads K and
//! V (f32, f16 or bf16) straight out of the blocks; on CUDA the same op runs
//! a kernel of ours compiled with NVRTC ([`cuda`]). The gather path (the
//! reference in tests, and `--attention-backend gather`) gathers each
//! sequence's slots, widens them to the queries' dtype and uses ordinary
//! tensor ops.
//!
//! A layer attends through its KV group's cache (`KvStore::cache`) and its
//! group's block table ([`SeqSpan::tables`]`[group]`). A windowed layer
//! reads only its window on every path, so a windowed group's entries before
//! the window's first block may be `RELEASED` (given back to the pool).

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Tensor};
use ferrox_kernels::{AttnGeometry, AttnParams, AttnSeq, KvElem};

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::seq_span::SeqSpan;

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

/// One KV group's block tables of a step as a device kernel reads them, made
/// once per step (not per layer): every table concatenated, and for each
/// token where its table starts and its position (it attends to positions
/// `0..=pos`, or its window).
#[derive(Debug)]
pub struct StepTables {
    /// Every sequence's block table, concatenated (u32).
    pub tables: Tensor,
    /// Per token: where its sequence's table starts in `tables` (u32).
    pub table_of: Tensor,
    /// Per token: its position (u32).
    pub pos_of: Tensor,
    /// Blocks in the pool every table entry was checked to be inside.
    pub pool_blocks: usize,
}

/// The host side of group `group`'s [`StepTables`]: `(tables, table_of,
/// pos_of)`; an error when a position is past its table, a block the
/// window reads outside the pool of `pool_blocks`, or a figure past u32.
pub fn step_tables(
    spans: &[SeqSpan],
    (group, window): (usize, Option<usize>),
    block_size: usize,
    pool_blocks: usize,
) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
    let (mut tables, mut table_of, mut pos_of) = (Vec::new(), Vec::new(), Vec::new());
    let too_big = || crate::Error::Input("attention: block tables past u32".into());
    let bs = block_size.max(1);
    for s in spans {
        let blocks = span_table(s, group)?;
        let start = u32::try_from(tables.len()).map_err(|_| too_big())?;
        let first = window.map_or(0, |w| (s.start_pos + 1).saturating_sub(w)) / bs;
        let read = blocks.get(first..).unwrap_or_default();
        if let Some(bad) = read.iter().find(|&&b| b as usize >= pool_blocks) {
            return Err(crate::Error::Input(format!(
                "attention: block {bad} outside the pool of {pool_blocks}"
            )));
        }
        tables.extend_from_slice(blocks);
        for pos in s.start_pos..s.start_pos + s.n_tokens {
            if pos / bs >= blocks.len() {
                return Err(crate::Error::Input(format!(
                    "attention: position {pos} is past its {} blocks",
                    blocks.len()
                )));
            }
            table_of.push(start);
            pos_of.push(u32::try_from(pos).map_err(|_| too_big())?);
        }
    }
    Ok((tables, table_of, pos_of))
}

/// A span's table in `group`.
pub(crate) fn span_table(s: &SeqSpan, group: usize) -> Result<&[u32]> {
    s.tables.get(group).map(Vec::as_slice).ok_or_else(|| {
        crate::Error::Input(format!(
            "a sequence has {} block tables, KV group {group} needs one",
            s.tables.len()
        ))
    })
}

impl StepTables {
    /// Group `group`'s tables of `spans` on `device` (its layers attend
    /// within `window`), where a device kernel will read them; `None` where
    /// attention needs none (the CPU kernel reads the spans, the gather
    /// path its own index).
    pub fn for_step(
        spans: &[SeqSpan],
        (group, window): (usize, Option<usize>),
        cache: &KvCache,
        device: &Device,
        paged: bool,
    ) -> Result<Option<Arc<StepTables>>> {
        if !(paged && device.is_cuda()) {
            return Ok(None);
        }
        let pool_blocks = cache.num_blocks();
        let (tables, table_of, pos_of) =
            step_tables(spans, (group, window), cache.block_size(), pool_blocks)?;
        Ok(Some(Arc::new(StepTables {
            pool_blocks,
            tables: Tensor::new(tables.as_slice(), device)?,
            table_of: Tensor::new(table_of.as_slice(), device)?,
            pos_of: Tensor::new(pos_of.as_slice(), device)?,
        })))
    }
}

/// Which layer attends, and how: its cache slice, its KV group (the block
/// table it reads), its scoring and window.
#[derive(Debug, Clone, Copy)]
pub struct LayerAttn {
    /// The layer's index in its group's cache.
    pub layer: usize,
    /// Its KV group: which of a span's tables it reads.
    pub group: usize,
    /// Head layout.
    pub heads: Heads,
    /// Scale, soft-cap and window.
    pub params: AttnParams,
}

/// `q`: `(tokens, heads, head_dim)`, the spans' tokens in order; returns
/// `(tokens, heads * head_dim)`. Causal: a token sees its own and earlier
/// positions of its own sequence only (within the layer's window).
/// `tables`: the layer's group's tables on the device, for a device kernel
/// (see [`StepTables::for_step`]). `sinks`: per query head, a learned
/// logit that joins each softmax and attends to nothing (gpt-oss): our CPU
/// kernel takes them; on CUDA such a layer takes the gather path.
pub fn attention(
    q: &Tensor,
    cache: &KvCache,
    at: LayerAttn,
    spans: &Arc<[SeqSpan]>,
    (tables, sinks): (Option<&Arc<StepTables>>, Option<&Tensor>),
    fused: bool,
) -> Result<Tensor> {
    let (k, v) = cache.layer(at.layer);
    let has_kernel = q.device().is_cpu() || (cfg!(feature = "cuda") && q.device().is_cuda());
    if fused && has_kernel && (sinks.is_none() || q.device().is_cpu()) {
        let sinks = match sinks {
            Some(t) => Some(t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        let op = PagedAttention {
            sinks,
            spans: spans.clone(),
            group: at.group,
            tables: tables.cloned(),
            geometry: AttnGeometry {
                heads: at.heads.heads,
                kv_heads: at.heads.kv_heads,
                head_dim: at.heads.head_dim,
                block_size: cache.block_size(),
            },
            params: at.params,
        };
        // Both kernels take f32 queries (the residual stream's type).
        let q = q.to_dtype(candle_core::DType::F32)?.contiguous()?;
        return Ok(q.apply_op3_no_bwd(k, v, &op)?);
    }
    gathered(q, cache, at, spans, sinks)
}

struct PagedAttention {
    /// Each query head's sink logit (CPU only).
    sinks: Option<Vec<f32>>,
    spans: Arc<[SeqSpan]>,
    group: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tables: Option<Arc<StepTables>>,
    geometry: AttnGeometry,
    params: AttnParams,
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
            .map(|s| {
                Ok(AttnSeq {
                    blocks: span_table(s, self.group)?,
                    start_pos: s.start_pos,
                    n_tokens: s.n_tokens,
                })
            })
            .collect::<Result<_>>()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let mut out = vec![0f32; q.len()];
        let p = (&self.params, self.sinks.as_deref());
        ferrox_kernels::paged_attention_with_sinks(&self.geometry, p, q, (k, v), &seqs, &mut out)
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

/// The device-generic path: gather each sequence's slots (those its
/// tokens' windows reach) and attend with tensor ops.
fn gathered(
    q: &Tensor,
    cache: &KvCache,
    at: LayerAttn,
    spans: &[SeqSpan],
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    let (k_cache, v_cache) = cache.layer(at.layer);
    let (h, p) = (at.heads, at.params);
    let device = q.device();
    let rep = h.heads / h.kv_heads;
    let mut outs = Vec::with_capacity(spans.len());
    let mut offset = 0;
    for span in spans {
        let blocks = span_table(span, at.group)?;
        let end = span.start_pos + span.n_tokens;
        let from = p.first_seen(span.start_pos);
        let n = end - from;
        let slots: Vec<u32> = (from..end)
            .map(|pos| cache.slot(blocks, pos).map(|s| s as u32))
            .collect::<Result<_>>()?;
        let idx = Tensor::new(slots.as_slice(), device)?;
        let expand = |t: &Tensor| -> Result<Tensor> {
            let t = t
                .index_select(&idx, 0)?
                .to_dtype(q.dtype())?
                .reshape((n, h.kv_heads, 1, h.head_dim))?;
            let t = t.broadcast_as((n, h.kv_heads, rep, h.head_dim))?;
            Ok(t.reshape((n, h.heads, h.head_dim))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let (k, v) = (expand(k_cache)?, expand(v_cache)?);
        let qs = q
            .narrow(0, offset, span.n_tokens)?
            .transpose(0, 1)?
            .contiguous()?;
        let mut scores = (qs.matmul(&k.t()?)? * f64::from(p.scale))?;
        if let Some(cap) = p.softcap {
            scores = ((scores / f64::from(cap))?.tanh()? * f64::from(cap))?;
        }
        let mask = window_mask(span, &p, device)?;
        let scores = scores.broadcast_add(&mask)?;
        let probs = match sinks {
            // The sink's column joins the softmax, then is dropped.
            Some(s) => {
                let ctx = scores.dim(2)?;
                let col = s
                    .to_dtype(scores.dtype())?
                    .reshape((h.heads, 1, 1))?
                    .broadcast_as((h.heads, span.n_tokens, 1))?;
                let all = Tensor::cat(&[&scores, &col], 2)?.contiguous()?;
                candle_nn::ops::softmax_last_dim(&all)?
                    .narrow(2, 0, ctx)?
                    .contiguous()?
            }
            None => candle_nn::ops::softmax_last_dim(&scores)?,
        };
        let o = probs.matmul(&v)?.transpose(0, 1)?;
        outs.push(o.reshape((span.n_tokens, h.heads * h.head_dim))?);
        offset += span.n_tokens;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// `(1, n_tokens, positions)`: 0 where a token sees a gathered position,
/// minus infinity elsewhere (later positions, or before its window).
fn window_mask(span: &SeqSpan, p: &AttnParams, device: &Device) -> Result<Tensor> {
    let (start, n) = (span.start_pos, span.n_tokens);
    let from = p.first_seen(start);
    let ctx = start + n - from;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            let (lo, hi) = (p.first_seen(start + i), start + i);
            (from..from + ctx).map(move |j| {
                if j < lo || j > hi {
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
    use ferrox_kernels::AttnParams;

    use super::{AttentionBackend, SeqSpan, step_tables, window_mask};

    fn span(blocks: &[u32], start_pos: usize, n_tokens: usize) -> SeqSpan {
        SeqSpan {
            tables: vec![blocks.to_vec()],
            start_pos,
            n_tokens,
            state: None,
        }
    }

    #[test]
    fn step_tables_name_each_tokens_table_and_position() {
        // A 3-token chunk at 4 (blocks of 4), then a decode row at 0.
        let spans = [span(&[7, 2], 4, 3), span(&[5], 0, 1)];
        let (tables, table_of, pos_of) = step_tables(&spans, (0, None), 4, 8).unwrap();
        assert_eq!(tables, [7, 2, 5]);
        assert_eq!(table_of, [0, 0, 0, 2]);
        assert_eq!(pos_of, [4, 5, 6, 0]);
        // What a kernel would read out of bounds is an error instead.
        let err = step_tables(&[span(&[1], 3, 2)], (0, None), 4, 8).unwrap_err();
        assert!(err.to_string().contains("position 4"), "{err}");
        let err = step_tables(&spans, (0, None), 4, 7).unwrap_err();
        assert!(err.to_string().contains("block 7 outside"), "{err}");
        let err = step_tables(&spans, (1, None), 4, 8).unwrap_err();
        assert!(err.to_string().contains("KV group 1"), "{err}");
    }

    #[test]
    fn a_windowed_group_s_released_entries_are_not_checked() {
        // Position 9 with a window of 3 sees 7..=9: blocks 1 and 2 of 4.
        let released = [ferrox_core::RELEASED, 6, 3];
        let spans = [span(&released, 9, 1)];
        let (tables, _, pos_of) = step_tables(&spans, (0, Some(3)), 4, 8).unwrap();
        assert_eq!((tables, pos_of), (released.to_vec(), vec![9]));
        assert!(
            step_tables(&spans, (0, Some(6)), 4, 8).is_ok(),
            "6 sees 4..=9: blocks 1, 2"
        );
        assert!(
            step_tables(&spans, (0, Some(7)), 4, 8).is_err(),
            "7 sees 3..=9: block 0 too"
        );
        assert!(step_tables(&spans, (0, None), 4, 8).is_err());
    }

    #[test]
    fn a_window_masks_what_it_has_left() {
        let mask = |start, n, window| {
            let p = AttnParams {
                window,
                ..AttnParams::causal(16)
            };
            window_mask(&span(&[0, 1], start, n), &p, &candle_core::Device::Cpu)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .map(|r| r.iter().map(|&x| u8::from(x == 0.0)).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        // Tokens at 5 and 6 with a window of 3 gather 3..=6: 5 sees 3..=5,
        // 6 sees 4..=6.
        assert_eq!(mask(5, 2, Some(3)), [vec![1, 1, 1, 0], vec![0, 1, 1, 1]]);
        // Full attention: everything up to itself.
        assert_eq!(mask(1, 2, None), [vec![1, 1, 0], vec![1, 1, 1]]);
    }

    #[test]
    fn backends_parse() {
        assert_eq!("paged".parse(), Ok(AttentionBackend::Paged));
        assert_eq!("gather".parse(), Ok(AttentionBackend::Gather));
        assert_eq!(AttentionBackend::default(), AttentionBackend::Paged);
        let err = "flash".parse::<AttentionBackend>().unwrap_err();
        assert!(err.contains("paged or gather"), "{err}");
    }
}
