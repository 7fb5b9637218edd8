//! A latent attention mixer's weights from any source, by GGUF names: the
//! query (`attn_q`, or `attn_q_a`, its norm and `attn_q_b`), the latent's
//! projection and norm (`attn_kv_a_mqa`, `attn_kv_a_norm`), its
//! decompression (`attn_kv_b`, or as llama.cpp's current converter splits
//! it per head: `attn_k_b` transposed and `attn_v_b`), `attn_output`. Each
//! shape is checked against the ranks the config names, so a file whose
//! ranks disagree is refused with the tensor's name.

use candle_core::{Device, Tensor};

use super::forward::{LatentQuery, LatentWeights};
use super::spec::LatentSpec;
use crate::error::Result;
use crate::linear::Linear;
use crate::projection::single;
use crate::spec::ModelSpec;
use crate::weights::source::{WeightSource, norm};

/// Layer `i`'s latent attention, of kind `m`.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    (m, i): (&LatentSpec, usize),
    device: &Device,
) -> Result<LatentWeights> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let (hidden, heads) = (spec.hidden, spec.heads);
    let q_rows = heads * m.qk_dim();
    let one = |src: &mut dyn WeightSource, name: &str, rows: usize, cols: usize| {
        let p = src.projection(&[(&n(name), rows)], cols, device)?;
        Ok::<Linear, crate::Error>(single(p))
    };
    let q = match m.q_rank {
        None => LatentQuery::Full(one(src, "attn_q", q_rows, hidden)?),
        Some(r) => {
            let a = one(src, "attn_q_a", r, hidden)?;
            let b = one(src, "attn_q_b", q_rows, r)?;
            let norm = norm(src, spec, &n("attn_q_a_norm"), r, device)?;
            LatentQuery::LowRank { a, norm, b }
        }
    };
    let kv_a = one(src, "attn_kv_a_mqa", m.width(), hidden)?;
    let o = one(src, "attn_output", hidden, heads * m.v_dim)?;
    let kv_norm = norm(src, spec, &n("attn_kv_a_norm"), m.kv_rank, device)?;
    let (k_b, v_b) = kv_b(src, m, (heads, i), device)?;
    Ok(LatentWeights {
        q,
        kv_a,
        kv_norm,
        k_b,
        v_b,
        o,
    })
}

/// `kv_b_proj`'s key and value halves per head, `(heads, nope, rank)` and
/// `(heads, v_dim, rank)`, from one matrix or llama.cpp's split pair.
fn kv_b(
    src: &mut dyn WeightSource,
    m: &LatentSpec,
    (heads, i): (usize, usize),
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let n = |s: &str| format!("blk.{i}.{s}.weight");
    let (rank, nope, v) = (m.kv_rank, m.nope_dim, m.v_dim);
    if src.has(&n("attn_k_b")) {
        // The converter stores each head's key half transposed, for
        // llama.cpp's absorbed product.
        let k = src.small(&n("attn_k_b"), &[heads, rank, nope], device)?;
        let v = src.small(&n("attn_v_b"), &[heads, v, rank], device)?;
        return Ok((k.transpose(1, 2)?.contiguous()?, v));
    }
    let kv = src.small(&n("attn_kv_b"), &[heads * (nope + v), rank], device)?;
    let kv = kv.reshape((heads, nope + v, rank))?;
    Ok((
        kv.narrow(1, 0, nope)?.contiguous()?,
        kv.narrow(1, nope, v)?.contiguous()?,
    ))
}
