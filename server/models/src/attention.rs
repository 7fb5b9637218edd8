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
//! A layer attends through its KV group's cache and its group's block table
//! ([`SeqSpan::tables`]`[group]`, the group from [`KvStore::group_of`]). A
//! windowed group's layers read only their window, positions `p - window +
//! 1 ..= p`; the entries before it may be `RELEASED`. Provisional: a windowed
//! layer runs the gather path, which reads and masks its window; the
//! families' windowed kernel replaces that.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Shape, Tensor};
use ferrox_core::RELEASED;
use ferrox_kernels::{AttnGeometry, AttnSeq, KvElem};

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::kv_store::KvStore;

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
    /// The sequence's block tables, one per KV group (in the order of
    /// [`KvStore`]'s groups).
    pub tables: Vec<Vec<u32>>,
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

/// A step's block tables as a device kernel reads them, made once per step
/// (not per layer): every table concatenated, and for each token where its
/// table starts and its position (it attends to positions `0..=pos`).
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

/// The first table entry a span's tokens read in a group of `window`: the
/// block of position `start_pos - window + 1` (0 for full attention).
fn first_read(s: &SeqSpan, window: Option<usize>, block_size: usize) -> usize {
    window.map_or(0, |w| {
        (s.start_pos + 1).saturating_sub(w) / block_size.max(1)
    })
}

/// The host side of [`StepTables`] for KV group `group` of window `window`:
/// `(tables, table_of, pos_of)`; an error when a position is past its table,
/// a block outside the pool of `pool_blocks` (`RELEASED` only before the
/// window), or a figure past u32.
pub fn step_tables(
    spans: &[SeqSpan],
    group: usize,
    window: Option<usize>,
    block_size: usize,
    pool_blocks: usize,
) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
    let (mut tables, mut table_of, mut pos_of) = (Vec::new(), Vec::new(), Vec::new());
    let too_big = || crate::Error::Input("attention: block tables past u32".into());
    for s in spans {
        let blocks = s.tables.get(group).ok_or_else(|| {
            crate::Error::Input(format!("attention: no block table for KV group {group}"))
        })?;
        let start = u32::try_from(tables.len()).map_err(|_| too_big())?;
        let read = first_read(s, window, block_size);
        let bad = blocks
            .iter()
            .enumerate()
            .find(|&(i, &b)| b as usize >= pool_blocks && !(b == RELEASED && i < read));
        if let Some((_, bad)) = bad {
            return Err(crate::Error::Input(format!(
                "attention: block {bad} outside the pool of {pool_blocks}"
            )));
        }
        tables.extend_from_slice(blocks);
        for pos in s.start_pos..s.start_pos + s.n_tokens {
            if pos / block_size.max(1) >= blocks.len() {
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

impl StepTables {
    /// Each KV group's tables of `spans` on `device`, where a device kernel
    /// will read them; `None` where attention needs none (the CPU kernel
    /// reads the spans, the gather path its own index; a windowed group runs
    /// the gather path for now).
    pub fn for_step(
        spans: &[SeqSpan],
        kv: &KvStore,
        device: &Device,
        paged: bool,
    ) -> Result<Vec<Option<Arc<StepTables>>>> {
        (0..kv.groups())
            .map(|g| {
                if !(paged && device.is_cuda()) || kv.window(g).is_some() {
                    return Ok(None);
                }
                let cache = kv.cache(g);
                let pool_blocks = cache.num_blocks();
                let (tables, table_of, pos_of) =
                    step_tables(spans, g, None, cache.block_size(), pool_blocks)?;
                Ok(Some(Arc::new(StepTables {
                    pool_blocks,
                    tables: Tensor::new(tables.as_slice(), device)?,
                    table_of: Tensor::new(table_of.as_slice(), device)?,
                    pos_of: Tensor::new(pos_of.as_slice(), device)?,
                })))
            })
            .collect()
    }
}

/// Layer `layer`'s attention. `q`: `(tokens, heads, head_dim)`, the spans'
/// tokens in order; returns `(tokens, heads * head_dim)`. Causal: a token
/// sees its own and earlier positions of its own sequence only, and in a
/// windowed layer only the last `window` of them. `tables`: the step's
/// tables on the device per KV group, for a device kernel (see
/// [`StepTables::for_step`]).
pub fn attention(
    q: &Tensor,
    kv: &KvStore,
    layer: usize,
    spans: &Arc<[SeqSpan]>,
    tables: &[Option<Arc<StepTables>>],
    heads: Heads,
    fused: bool,
) -> Result<Tensor> {
    let (group, local) = kv.group_of(layer)?;
    let cache = kv.cache(group);
    let window = kv.window(group);
    let (k, v) = cache.layer(local);
    let has_kernel = q.device().is_cpu() || (cfg!(feature = "cuda") && q.device().is_cuda());
    if fused && has_kernel && window.is_none() {
        let op = PagedAttention {
            spans: spans.clone(),
            group,
            tables: tables.get(group).cloned().flatten(),
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
    let group = Group {
        cache,
        layer: local,
        index: group,
        window,
    };
    gathered(q, &group, spans, heads)
}

struct PagedAttention {
    spans: Arc<[SeqSpan]>,
    /// The KV group whose tables it reads.
    group: usize,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tables: Option<Arc<StepTables>>,
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
                blocks: s.tables.get(self.group).map_or(&[], Vec::as_slice),
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

/// One layer's view of its KV group.
struct Group<'a> {
    cache: &'a KvCache,
    /// The layer's index in the group.
    layer: usize,
    /// The group's index (which of a span's tables).
    index: usize,
    window: Option<usize>,
}

/// The device-generic path: gather each sequence's slots (of its window,
/// in a windowed layer) and attend with tensor ops.
fn gathered(q: &Tensor, g: &Group<'_>, spans: &[SeqSpan], h: Heads) -> Result<Tensor> {
    let (k_cache, v_cache) = g.cache.layer(g.layer);
    let device = q.device();
    let rep = h.heads / h.kv_heads;
    let scale = 1.0 / (h.head_dim as f64).sqrt();
    let mut outs = Vec::with_capacity(spans.len());
    let mut offset = 0;
    for span in spans {
        let blocks = span.tables.get(g.index).ok_or_else(|| {
            crate::Error::Input(format!(
                "attention: no block table for KV group {}",
                g.index
            ))
        })?;
        let ctx = span.start_pos + span.n_tokens;
        // The first position any of the span's tokens reads.
        let from = g
            .window
            .map_or(0, |w| (span.start_pos + 1).saturating_sub(w));
        let seen = ctx - from;
        let slots: Vec<u32> = (from..ctx)
            .map(|p| g.cache.slot(blocks, p).map(|s| s as u32))
            .collect::<Result<_>>()?;
        let idx = Tensor::new(slots.as_slice(), device)?;
        let expand = |t: &Tensor| -> Result<Tensor> {
            let t = t
                .index_select(&idx, 0)?
                .to_dtype(q.dtype())?
                .reshape((seen, h.kv_heads, 1, h.head_dim))?;
            let t = t.broadcast_as((seen, h.kv_heads, rep, h.head_dim))?;
            Ok(t.reshape((seen, h.heads, h.head_dim))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let (k, v) = (expand(k_cache)?, expand(v_cache)?);
        let qs = q
            .narrow(0, offset, span.n_tokens)?
            .transpose(0, 1)?
            .contiguous()?;
        let scores = (qs.matmul(&k.t()?)? * scale)?;
        let mask = causal_mask(span.start_pos, span.n_tokens, from, g.window, device)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        let o = probs.matmul(&v)?.transpose(0, 1)?;
        outs.push(o.reshape((span.n_tokens, h.heads * h.head_dim))?);
        offset += span.n_tokens;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// The mask of `n` tokens from position `start` over the positions `from..`
/// gathered: a token at `p` sees `j <= p`, and in a window only `j > p -
/// window`.
fn causal_mask(
    start: usize,
    n: usize,
    from: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let ctx = start + n;
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            let p = start + i;
            (from..ctx).map(move |j| {
                let outside = window.is_some_and(|w| j + w <= p);
                if j > p || outside {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(mask, (1, n, ctx - from), device)?)
}

#[cfg(test)]
mod tests {
    use super::{AttentionBackend, RELEASED, SeqSpan, causal_mask, step_tables};

    #[test]
    fn step_tables_name_each_tokens_table_and_position() {
        let span = |blocks: &[u32], start_pos, n_tokens| SeqSpan {
            tables: vec![blocks.to_vec()],
            start_pos,
            n_tokens,
        };
        // A 3-token chunk at 4 (blocks of 4), then a decode row at 0.
        let spans = [span(&[7, 2], 4, 3), span(&[5], 0, 1)];
        let (tables, table_of, pos_of) = step_tables(&spans, 0, None, 4, 8).unwrap();
        assert_eq!(tables, [7, 2, 5]);
        assert_eq!(table_of, [0, 0, 0, 2]);
        assert_eq!(pos_of, [4, 5, 6, 0]);
        // What a kernel would read out of bounds is an error instead.
        let err = step_tables(&[span(&[1], 3, 2)], 0, None, 4, 8).unwrap_err();
        assert!(err.to_string().contains("position 4"), "{err}");
        let err = step_tables(&spans, 0, None, 4, 7).unwrap_err();
        assert!(err.to_string().contains("block 7 outside"), "{err}");
        assert!(
            step_tables(&spans, 1, None, 4, 8).is_err(),
            "no second group"
        );
        // A window's given-back entries pass only before what it reads: a
        // token at 9 with a window of 4 reads 6..=9, from entry 1.
        let windowed = [span(&[RELEASED, 3, 4], 9, 1)];
        assert!(step_tables(&windowed, 0, Some(4), 4, 8).is_ok());
        assert!(step_tables(&windowed, 0, Some(7), 4, 8).is_err());
        assert!(step_tables(&windowed, 0, None, 4, 8).is_err());
    }

    #[test]
    fn a_window_masks_what_it_has_left() {
        let mask = |start, n, from, window| {
            causal_mask(start, n, from, window, &candle_core::Device::Cpu)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap()
                .iter()
                .map(|r| r.iter().map(|&x| u8::from(x == 0.0)).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        // Two tokens at 5 and 6 over positions 3..7 with a window of 3: 5
        // sees 3..=5, 6 sees 4..=6.
        assert_eq!(mask(5, 2, 3, Some(3)), [vec![1, 1, 1, 0], vec![0, 1, 1, 1]]);
        // Full attention: everything up to itself.
        assert_eq!(mask(1, 2, 0, None), [vec![1, 1, 0], vec![1, 1, 1]]);
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
