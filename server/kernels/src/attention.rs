//! Causal paged attention over a KV cache held in f32, f16 or bf16, for
//! decode and chunked prefill. Queries, scores and outputs are f32; each K/V
//! row is widened once and used for every query head of its group, so a
//! half-width cache halves the memory traffic that dominates long contexts.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use crate::Error;

#[path = "attention_math.rs"]
mod math;
#[cfg(test)]
use math::{axpy, exp_nonpositive};
use math::{dot, softmax, softmax_with_sink, weighted_sum};

/// An element type the KV cache may be held in.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// `src` as f32: `src` itself for f32, else widened into `buf`
    /// (f16 with F16C where the CPU has it; every conversion is exact).
    fn widen<'a>(src: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
}

impl KvElem for f32 {
    fn widen<'a>(src: &'a [f32], _buf: &'a mut [f32]) -> &'a [f32] {
        src
    }
}

impl KvElem for f16 {
    fn widen<'a>(src: &'a [f16], buf: &'a mut [f32]) -> &'a [f32] {
        let buf = &mut buf[..src.len()];
        #[cfg(target_arch = "x86_64")]
        if simd() {
            // SAFETY: `simd` checked the features; the lengths are equal.
            unsafe { x86::widen_f16(src, buf) };
            return buf;
        }
        src.convert_to_f32_slice(buf);
        buf
    }
}

impl KvElem for bf16 {
    fn widen<'a>(src: &'a [bf16], buf: &'a mut [f32]) -> &'a [f32] {
        let buf = &mut buf[..src.len()];
        src.convert_to_f32_slice(buf);
        buf
    }
}

/// Shapes shared by queries and the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnGeometry {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; `heads` must be a multiple of it (grouped-query attention).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Positions per KV block.
    pub block_size: usize,
}

/// How scores are formed and which positions a query sees: one layer's kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Multiplies `q . k` (`1/sqrt(head_dim)`, or a family's own query scale).
    pub scale: f32,
    /// Gemma 2's soft-cap: a scaled score `s` becomes `cap * tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// Sliding window: position `p` sees `p + 1 - window ..= p` only, and
    /// table entries before that window's first block are never read (they
    /// may already be released). `None`: full causal attention.
    pub window: Option<usize>,
    /// Chunked attention (Llama 4's): position `p` sees only its own chunk,
    /// `p - p % chunk ..= p`; entries before the chunk's first block are
    /// never read. `None`: no chunks.
    pub chunk: Option<usize>,
}

impl AttnParams {
    /// Plain causal attention scaled by `1/sqrt(head_dim)`.
    pub fn causal(head_dim: usize) -> Self {
        AttnParams {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
            chunk: None,
        }
    }

    /// The first position a query at `pos` sees.
    pub fn first_seen(&self, pos: usize) -> usize {
        let window = self.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let chunk = self.chunk.map_or(0, |c| pos - pos % c);
        window.max(chunk)
    }

    /// One past the last query position that sees the key at `pos` (the
    /// end of its window or chunk; `usize::MAX` where both are absent).
    pub fn seen_until(&self, pos: usize) -> usize {
        let window = self.window.map_or(usize::MAX, |w| pos.saturating_add(w));
        let chunk = self.chunk.map_or(usize::MAX, |c| {
            (pos / c).saturating_add(1).saturating_mul(c)
        });
        window.min(chunk)
    }

    /// The score of `q . k`, scaled and capped.
    #[inline(always)]
    fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        match self.softcap {
            Some(cap) => cap * (s / cap).tanh(),
            None => s,
        }
    }
}

/// Queries of one sequence: tokens at positions `start_pos..start_pos+n_tokens`;
/// its KV (already written, including these tokens) lives in `blocks` (block `b`
/// of the table holds positions `b*block_size..`). Position `p` attends to
/// `0..=p`, or to its window or chunk (see [`AttnParams::first_seen`]).
#[derive(Debug, Clone, Copy)]
pub struct AttnSeq<'a> {
    /// The sequence's block table.
    pub blocks: &'a [u32],
    /// Position of the first query token.
    pub start_pos: usize,
    /// Number of query tokens.
    pub n_tokens: usize,
}

/// Causal attention for a batch of sequences over a paged KV cache.
///
/// `q`: `[total_tokens, heads, head_dim]`, the sequences' tokens concatenated in
/// order; `k_cache`, `v_cache`: `[num_blocks*block_size, kv_heads, head_dim]`;
/// `out`: like `q`. Scores and window by `p`; head `h` reads kv head
/// `h / (heads/kv_heads)`.
pub fn paged_attention<T: KvElem>(
    g: &AttnGeometry,
    p: &AttnParams,
    q: &[f32],
    k_cache: &[T],
    v_cache: &[T],
    seqs: &[AttnSeq<'_>],
    out: &mut [f32],
) -> Result<(), Error> {
    paged_attention_with_sinks(g, (p, None), q, (k_cache, v_cache), seqs, out)
}

/// [`paged_attention`] where each query head's softmax also has `sinks[h]`
/// (gpt-oss's learned sink: a logit that takes its share of the probability
/// and attends to nothing); `None` is plain attention, to the bit.
pub fn paged_attention_with_sinks<T: KvElem>(
    g: &AttnGeometry,
    (p, sinks): (&AttnParams, Option<&[f32]>),
    q: &[f32],
    (k_cache, v_cache): (&[T], &[T]),
    seqs: &[AttnSeq<'_>],
    out: &mut [f32],
) -> Result<(), Error> {
    if let Some(s) = sinks
        && s.len() != g.heads
    {
        return Err(Error::Length {
            what: "attention sinks",
            expected: g.heads,
            got: s.len(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    let fast = simd();
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
    attention_on(fast, (g, p, sinks), q, (k_cache, v_cache), seqs, out)
}

/// [`paged_attention`], its loops in AVX2 registers when `fast` (which the
/// caller has checked the CPU supports) or portable ones.
pub(crate) fn attention_on<T: KvElem>(
    fast: bool,
    (g, params, sinks): (&AttnGeometry, &AttnParams, Option<&[f32]>),
    q: &[f32],
    (k_cache, v_cache): (&[T], &[T]),
    seqs: &[AttnSeq<'_>],
    out: &mut [f32],
) -> Result<(), Error> {
    if params.window == Some(0) || params.chunk == Some(0) {
        return Err(Error::Geometry(
            "a sliding window or chunk must hold at least one position",
        ));
    }
    let tokens = plan(g, params, k_cache, v_cache, seqs)?;
    let expected = tokens.len() * g.heads * g.head_dim;
    if q.len() != expected {
        return Err(Error::Length {
            what: "attention queries",
            expected,
            got: q.len(),
        });
    }
    if out.len() != expected {
        return Err(Error::Length {
            what: "attention output",
            expected,
            got: out.len(),
        });
    }
    let width = g.heads / g.kv_heads * g.head_dim;
    // One task per (tile of a sequence's consecutive query tokens, kv head):
    // the query heads sharing a kv head are adjacent in `q` and `out`, and
    // each K/V row is widened once for every token and head of the tile.
    let tiles = query_tiles(&tokens);
    let mut tasks: Vec<(usize, Vec<&mut [f32]>)> = (0..tiles.len() * g.kv_heads)
        .map(|t| (t, Vec::with_capacity(tiles[t / g.kv_heads].1)))
        .collect();
    let mut tile_of = Vec::with_capacity(tokens.len());
    for (t, &(_, len)) in tiles.iter().enumerate() {
        tile_of.extend(std::iter::repeat_n(t, len));
    }
    for (c, o) in out.chunks_mut(width).enumerate() {
        let (token, kv_head) = (c / g.kv_heads, c % g.kv_heads);
        tasks[tile_of[token] * g.kv_heads + kv_head].1.push(o);
    }
    tasks.into_par_iter().for_each(|(t, mut outs)| {
        SCRATCH.with_borrow_mut(|scratch| {
            let ((first, _), kv_head) = (tiles[t / g.kv_heads], t % g.kv_heads);
            let (seq, pos0) = tokens[first];
            let kv = KvView {
                g,
                params,
                k: k_cache,
                v: v_cache,
                blocks: seqs[seq].blocks,
                kv_head,
                sinks,
            };
            let queries = QueryTile {
                q,
                base: (first * g.kv_heads + kv_head) * width,
                stride: g.kv_heads * width,
                width,
                pos0,
            };
            #[cfg(target_arch = "x86_64")]
            if fast {
                // SAFETY: the caller checked the features.
                return unsafe { x86::attend_tile(&kv, &queries, scratch, &mut outs) };
            }
            attend_tile(&kv, &queries, scratch, &mut outs);
        })
    });
    Ok(())
}

thread_local! {
    /// Each thread's buffers, kept between calls: a tile's scores grow with
    /// the context, and allocating them per task churned the heap (resident
    /// memory past the plan's reserve under a full pool).
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Checks the geometry and tables; returns `(seq index, position)` per query token.
fn plan<T>(
    g: &AttnGeometry,
    params: &AttnParams,
    k: &[T],
    v: &[T],
    seqs: &[AttnSeq<'_>],
) -> Result<Vec<(usize, usize)>, Error> {
    if g.heads == 0 || g.kv_heads == 0 || g.head_dim == 0 || g.block_size == 0 {
        return Err(Error::Geometry("all sizes must be positive"));
    }
    if !g.heads.is_multiple_of(g.kv_heads) {
        return Err(Error::Geometry("heads must be a multiple of kv_heads"));
    }
    let block_elems = g.block_size * g.kv_heads * g.head_dim;
    if !k.len().is_multiple_of(block_elems) {
        return Err(Error::Geometry("k_cache is not a whole number of blocks"));
    }
    if v.len() != k.len() {
        return Err(Error::Length {
            what: "v_cache",
            expected: k.len(),
            got: v.len(),
        });
    }
    let num_blocks = k.len() / block_elems;
    let mut tokens = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        if s.n_tokens == 0 {
            continue;
        }
        let last_pos = s
            .start_pos
            .checked_add(s.n_tokens - 1)
            .ok_or(Error::Overflow("start_pos + n_tokens"))?;
        let need = last_pos / g.block_size + 1;
        if s.blocks.len() < need {
            return Err(Error::BlockTable {
                seq: si,
                last_pos,
                need,
                have: s.blocks.len(),
            });
        }
        // Entries before the first token's window are never read: a
        // windowed group may have released them.
        let first = params.first_seen(s.start_pos) / g.block_size;
        if let Some(&block) = s.blocks[first..need]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(Error::BlockId {
                seq: si,
                block,
                num_blocks,
            });
        }
        tokens.extend((s.start_pos..=last_pos).map(|p| (si, p)));
    }
    Ok(tokens)
}

/// Query tokens per tile: K/V rows are widened once for this many tokens.
const QUERY_TILE: usize = 16;

/// Runs of up to [`QUERY_TILE`] consecutive tokens of one sequence, as
/// `(first token, count)`, over `tokens` (`(seq, position)`, in order).
fn query_tiles(tokens: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut tiles: Vec<(usize, usize)> = Vec::new();
    for (i, &(seq, _)) in tokens.iter().enumerate() {
        match tiles.last_mut() {
            Some((first, len)) if tokens[*first].0 == seq && *len < QUERY_TILE => *len += 1,
            _ => tiles.push((i, 1)),
        }
    }
    tiles
}

/// The queries of one tile for one kv head: token `i` (position `pos0 + i`)
/// has its group's heads at `q[base + i * stride..][..width]`.
struct QueryTile<'a> {
    q: &'a [f32],
    base: usize,
    stride: usize,
    width: usize,
    pos0: usize,
}

impl QueryTile<'_> {
    #[inline(always)]
    fn token(&self, i: usize) -> &[f32] {
        &self.q[self.base + i * self.stride..][..self.width]
    }
}

/// One kv head of one sequence, seen through its block table.
struct KvView<'a, T> {
    g: &'a AttnGeometry,
    params: &'a AttnParams,
    k: &'a [T],
    v: &'a [T],
    blocks: &'a [u32],
    kv_head: usize,
    /// Every query head's sink logit, if the layer has them.
    sinks: Option<&'a [f32]>,
}

impl<T> KvView<'_, T> {
    /// Calls `f(position, offset of the head's row)` for positions
    /// `from..=pos` of `cache` (K or V).
    #[inline(always)]
    fn for_each_row(
        &self,
        cache: &[T],
        (from, pos): (usize, usize),
        mut f: impl FnMut(usize, usize),
    ) {
        let row = self.g.kv_heads * self.g.head_dim;
        self.for_each_block(cache, (from, pos), |first, n, base| {
            for t in from.saturating_sub(first)..n {
                f(first + t, base + t * row);
            }
        });
    }

    /// Calls `f(first position, rows, offset of the first row)` for each
    /// block holding positions `from..=pos` of `cache` (rows `kv_heads *
    /// head_dim` apart; the first block's rows start at its own first
    /// position, which may be before `from`), asking for the next block's
    /// rows ahead: the blocks are scattered, so the hardware prefetcher
    /// cannot guess them. Table entries before `from`'s block are not read.
    #[inline(always)]
    fn for_each_block(
        &self,
        cache: &[T],
        (from, pos): (usize, usize),
        mut f: impl FnMut(usize, usize, usize),
    ) {
        let (bs, hd) = (self.g.block_size, self.g.head_dim);
        let row = self.g.kv_heads * hd;
        let base = |blk: u32| blk as usize * bs * row + self.kv_head * hd;
        let first_block = from / bs;
        let table = &self.blocks[first_block..=pos / bs];
        for (i, &blk) in table.iter().enumerate() {
            if let Some(&next) = table.get(i + 1) {
                prefetch_rows(cache, base(next), (row, bs), hd);
            }
            let first = (first_block + i) * bs;
            f(first, bs.min(pos + 1 - first), base(blk));
        }
    }
}

/// Hints the cache lines of `n` rows of `len` elements, `stride` apart from `at`.
#[inline(always)]
fn prefetch_rows<T>(cache: &[T], at: usize, (stride, n): (usize, usize), len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = len * std::mem::size_of::<T>();
        for t in 0..n {
            let p = cache.as_ptr().wrapping_add(at + t * stride).cast::<i8>();
            for line in (0..bytes).step_by(64) {
                // SAFETY: a prefetch never faults, whatever the address.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line)) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (cache, at, stride, n, len);
}

/// One task's reusable buffers: the scores and one widened K or V row.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
    /// One block's V rows, widened.
    block: Vec<f32>,
}

/// Whether the AVX2 + FMA + F16C versions run (the same arithmetic in wider
/// registers: no op is fused or reordered, so the results are the same bits).
#[cfg(target_arch = "x86_64")]
fn simd() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// A tile's query heads of one kv group: softmax(score(q.K^T)) . V over the
/// positions token `i` sees (`first_seen(pos0 + i)..=pos0 + i`), each head's
/// result into `outs[i]`. Every (token, head) sees exactly the operations, in
/// the order, it would alone: tiling saves widening and loads, never changes
/// a bit.
#[inline(always)]
fn attend_tile<T: KvElem>(
    kv: &KvView<'_, T>,
    q: &QueryTile<'_>,
    scratch: &mut Scratch,
    outs: &mut [&mut [f32]],
) {
    let (hd, p) = (kv.g.head_dim, kv.params);
    let (len, heads) = (outs.len(), q.width / hd);
    let last = q.pos0 + len - 1;
    // Scores are kept from `lo`, the first position any token of the tile
    // sees; each (token, head) row is `n` long.
    let lo = p.first_seen(q.pos0);
    let n = last + 1 - lo;
    let Scratch { scores, row, block } = scratch;
    scores.clear();
    scores.resize(len * heads * n, 0.0);
    row.resize(hd, 0.0);
    // The tokens of the tile that see position `p`: `seen_from(p)..seen_until(p)`.
    let seen_from = |pos: usize| pos.saturating_sub(q.pos0);
    let seen_until = |pos: usize| len.min(p.seen_until(pos) - q.pos0);
    kv.for_each_row(kv.k, (lo, last), |pos, off| {
        let k = T::widen(&kv.k[off..off + hd], row);
        for i in seen_from(pos)..seen_until(pos) {
            for (h, qh) in q.token(i).chunks_exact(hd).enumerate() {
                scores[(i * heads + h) * n + pos - lo] = p.score(dot(qh, k));
            }
        }
    });
    for i in 0..len {
        let from = p.first_seen(q.pos0 + i) - lo;
        for h in 0..heads {
            let row = &mut scores[(i * heads + h) * n..][from..=q.pos0 + i - lo];
            match kv.sinks {
                Some(s) => softmax_with_sink(row, s[kv.kv_head * heads + h]),
                None => softmax(row),
            }
        }
    }
    // V a block at a time: its rows widened once, then each (token, head)
    // adds the rows it sees in position order, its output held in registers.
    for o in outs.iter_mut() {
        o.fill(0.0);
    }
    block.resize(kv.g.block_size * hd, 0.0);
    let stride = kv.g.kv_heads * hd;
    kv.for_each_block(kv.v, (lo, last), |first, rows, base| {
        for t in 0..rows {
            let at = base + t * stride;
            let v = T::widen(&kv.v[at..at + hd], row);
            block[t * hd..(t + 1) * hd].copy_from_slice(v);
        }
        for (i, o) in outs.iter_mut().enumerate().skip(seen_from(first)) {
            let from = p.first_seen(q.pos0 + i).max(first);
            let end = (first + rows).min(q.pos0 + i + 1);
            if from >= end {
                continue;
            }
            for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
                let w = &scores[(i * heads + h) * n + from - lo..][..end - from];
                weighted_sum(oh, w, &block[(from - first) * hd..(end - first) * hd]);
            }
        }
    });
}

/// The hot loops compiled for AVX2 + FMA + F16C.
#[cfg(target_arch = "x86_64")]
#[path = "attention_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
