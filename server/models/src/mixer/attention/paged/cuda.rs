//! Paged attention on a CUDA device: `paged_attention.cu`, compiled once per
//! process with NVRTC and run by candle as the CUDA side of the same custom
//! op the CPU kernel is. It reads K and V through the block tables on the
//! device; the tables and each token's position go to the device once per
//! step ([`super::StepTables`]), not once per layer.

use std::sync::OnceLock;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::{CudaStorage, DType, Layout, Shape, Storage};

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

/// A u32 tensor's storage on the device, as the kernel reads it.
fn u32_view<'a>(storage: &'a Storage, layout: &Layout) -> candle_core::Result<CudaView<'a, u32>> {
    let (a, b) = offsets(layout, "step tables")?;
    match storage {
        Storage::Cuda(s) => Ok(s.as_cuda_slice::<u32>()?.slice(a..b)),
        _ => candle_core::bail!("paged attention: the step's tables are not on the GPU"),
    }
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
    let Some(t) = op.tables.as_ref() else {
        candle_core::bail!("paged attention on CUDA needs the step's tables");
    };
    let tokens = t.pos_of.dim(0)?;
    let (qa, qb) = offsets(lq, "q")?;
    if qb - qa != tokens * g.heads * g.head_dim {
        candle_core::bail!(
            "paged attention: q holds {} values for {tokens} tokens",
            qb - qa
        );
    }
    // The tables were checked against a pool of `pool_blocks`; these must
    // be that pool.
    let pool = t.pool_blocks * g.block_size * g.kv_heads * g.head_dim;
    let ((ka, kb), (va, vb)) = (offsets(lk, "k cache")?, offsets(lv, "v cache")?);
    if kb - ka != pool || vb - va != pool {
        candle_core::bail!(
            "paged attention: K/V pools of {} and {} values, tables for {pool}",
            kb - ka,
            vb - va
        );
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
    let guards = [&t.tables, &t.table_of, &t.pos_of].map(|x| x.storage_and_layout());
    let [tables, table_of, pos_of] = [0, 1, 2].map(|i| u32_view(&guards[i].0, guards[i].1));
    let (tables, table_of, pos_of) = (tables?, table_of?, pos_of?);
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
    let p = &op.params;
    let scale = p.scale;
    // 0: no cap; 0: no window; 0: no chunk (the kernel's encoding of `None`).
    let softcap = p.softcap.unwrap_or(0.0);
    let window = int(p.window.unwrap_or(0))?;
    let chunk = int(p.chunk.unwrap_or(0))?;
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
                .arg(&scale)
                .arg(&softcap)
                .arg(&window)
                .arg(&chunk);
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
