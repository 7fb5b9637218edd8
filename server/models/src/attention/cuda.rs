//! Paged attention on a CUDA device: `paged_attention.cu`, compiled once per
//! process with NVRTC and run by candle as the CUDA side of the same custom
//! op the CPU kernel is. It reads K and V through the block tables on the
//! device; the host sends only the tables and each token's position.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::{CudaStorage, DType, Layout, Shape};

use super::PagedAttention;

/// The kernel's source, compiled at run time.
pub const SOURCE: &str = include_str!("paged_attention.cu");
const MODULE: &str = "ferrox_paged_attention";
/// Warps (one per query token and head) per thread block.
const WARPS_PER_BLOCK: u32 = 4;
/// The largest head the kernel holds in registers (8 dimensions a lane).
pub const MAX_HEAD_DIM: usize = 256;

/// The PTX of [`SOURCE`], compiled on first use (an error says why not).
pub fn ptx() -> Result<&'static str, String> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        let opts = nvrtc::CompileOptions {
            name: Some("paged_attention.cu".into()),
            ..Default::default()
        };
        nvrtc::compile_ptx_with_opts(SOURCE, opts)
            .map(|p| p.to_src())
            .map_err(|e| format!("NVRTC could not compile paged_attention.cu: {e:?}"))
    })
    .as_ref()
    .map(String::as_str)
    .map_err(Clone::clone)
}

/// Each token's table offset and position, and the tables, as the kernel
/// reads them.
fn metadata(op: &PagedAttention) -> candle_core::Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
    let (mut tables, mut table_of, mut pos_of) = (Vec::new(), Vec::new(), Vec::new());
    for s in op.spans.iter() {
        let start = u32::try_from(tables.len()).map_err(|_| {
            candle_core::Error::Msg("paged attention: block tables too long".into())
        })?;
        tables.extend_from_slice(&s.blocks);
        for i in 0..s.n_tokens {
            let pos = s.start_pos + i;
            if pos / op.geometry.block_size >= s.blocks.len() {
                candle_core::bail!("paged attention: position {pos} is past its block table");
            }
            table_of.push(start);
            pos_of.push(pos as u32);
        }
    }
    Ok((tables, table_of, pos_of))
}

fn offsets(l: &Layout, what: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!("paged attention: {what} must be contiguous"))
    })
}

/// The CUDA forward of [`PagedAttention`].
pub(super) fn forward(
    op: &PagedAttention,
    q: &CudaStorage,
    lq: &Layout,
    k: &CudaStorage,
    lk: &Layout,
    v: &CudaStorage,
    lv: &Layout,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let g = &op.geometry;
    if g.head_dim > MAX_HEAD_DIM || g.kv_heads == 0 || !g.heads.is_multiple_of(g.kv_heads) {
        candle_core::bail!(
            "paged attention: heads {}/{} of {} not supported",
            g.heads,
            g.kv_heads,
            g.head_dim
        );
    }
    let dev = q.device.clone();
    let (tables, table_of, pos_of) = metadata(op)?;
    let tokens = pos_of.len();
    let (qa, qb) = offsets(lq, "q")?;
    if qb - qa != tokens * g.heads * g.head_dim {
        candle_core::bail!(
            "paged attention: q holds {} values for {tokens} tokens",
            qb - qa
        );
    }
    // Every block the tokens reach must be inside the pool the kernel reads.
    let (ka, kb) = offsets(lk, "k cache")?;
    let pool_blocks = (kb - ka) / (g.kv_heads * g.head_dim * g.block_size).max(1);
    if let Some(bad) = tables.iter().find(|&&b| b as usize >= pool_blocks) {
        candle_core::bail!("paged attention: block {bad} outside the pool of {pool_blocks}");
    }
    if offsets(lv, "v cache")?.1 - offsets(lv, "v cache")?.0 != kb - ka {
        candle_core::bail!("paged attention: K and V pools differ in size");
    }
    let kernel = match k.dtype() {
        DType::F32 => "ferrox_paged_attention_f32",
        DType::F16 => "ferrox_paged_attention_f16",
        DType::BF16 => "ferrox_paged_attention_bf16",
        other => candle_core::bail!("paged attention: KV in {other:?}"),
    };
    if v.dtype() != k.dtype() {
        candle_core::bail!("paged attention: K and V must be held alike");
    }
    let func =
        dev.get_or_load_custom_func(kernel, MODULE, ptx().map_err(candle_core::Error::Msg)?)?;
    let mut out = dev.alloc_zeros::<f32>(tokens * g.heads * g.head_dim)?;
    if tokens == 0 {
        return Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((0, g.heads * g.head_dim)),
        ));
    }
    let tables = dev.clone_htod(&tables)?;
    let table_of = dev.clone_htod(&table_of)?;
    let pos_of = dev.clone_htod(&pos_of)?;
    let q = q.as_cuda_slice::<f32>()?.slice(qa..qb);
    let int = |n: usize| {
        i32::try_from(n)
            .map_err(|_| candle_core::Error::Msg("paged attention: size past i32".into()))
    };
    let (n_tokens, heads, kv_heads, head_dim, block_size) = (
        int(tokens)?,
        int(g.heads)?,
        int(g.kv_heads)?,
        int(g.head_dim)?,
        int(g.block_size)?,
    );
    let scale = 1.0f32 / (g.head_dim as f32).sqrt();
    let pairs = (tokens as u64) * (g.heads as u64);
    let blocks = u32::try_from(pairs.div_ceil(WARPS_PER_BLOCK as u64))
        .map_err(|_| candle_core::Error::Msg("paged attention: grid too large".into()))?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (32 * WARPS_PER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = func.builder();
    b.arg(&q);
    macro_rules! kv_args {
        ($t:ty) => {{
            let (ka, kb) = offsets(lk, "k cache")?;
            let (va, vb) = offsets(lv, "v cache")?;
            let kk = k.as_cuda_slice::<$t>()?.slice(ka..kb);
            let vv = v.as_cuda_slice::<$t>()?.slice(va..vb);
            b.arg(&kk)
                .arg(&vv)
                .arg(&mut out)
                .arg(&tables)
                .arg(&table_of)
                .arg(&pos_of);
            b.arg(&n_tokens)
                .arg(&heads)
                .arg(&kv_heads)
                .arg(&head_dim)
                .arg(&block_size)
                .arg(&scale);
            // SAFETY: the arguments are the kernel's, in its order and types;
            // every index it forms is inside the buffers checked above.
            unsafe { b.launch(cfg) }.w()?;
        }};
    }
    match k.dtype() {
        DType::F32 => kv_args!(f32),
        DType::F16 => kv_args!(half::f16),
        _ => kv_args!(half::bf16),
    }
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((tokens, g.heads * g.head_dim)),
    ))
}
