//! Latent attention's weights and its forward in the weight-absorbed form:
//! each head's query without position is carried into the latent space
//! through its slice of `kv_b_proj` (the key half), so every head scores
//! the cached vector `[c_kv | k_pe]` directly, as one query head of MQA of
//! that width; the softmax-weighted latent then leaves through the value
//! half, per head, and `o_proj`. The paged kernel reads the cache as K and
//! as V alike: the output's `c_kv` columns are the weighted latent.

use candle_core::{D, Tensor};
use ferrox_kernels::AttnParams;

use super::spec::LatentSpec;
use crate::error::Result;
use crate::linear::{Linear, tensor_bytes};
use crate::mixer::attention::forward::AttentionStep;
use crate::mixer::attention::paged::{Heads, LayerAttn, attention};
use crate::rope::Rope;

/// Widest head our CUDA paged kernel takes (its `MAX_HEAD_DIM`); a wider
/// latent (DeepSeek-V3's 576) takes the gather path there.
const CUDA_MAX_HEAD_DIM: usize = 256;

/// The query projection: one matrix, or a low-rank pair with a norm between.
#[derive(Debug, Clone)]
pub enum LatentQuery {
    /// `q_proj` (DeepSeek-V2-Lite).
    Full(Linear),
    /// `q_b_proj(norm(q_a_proj(x)))`.
    LowRank {
        /// `q_a_proj`.
        a: Linear,
        /// `q_a_layernorm`'s weight.
        norm: Tensor,
        /// `q_b_proj`.
        b: Linear,
    },
}

/// One latent attention mixer's weights.
#[derive(Debug, Clone)]
pub struct LatentWeights {
    /// The queries, `heads * (nope + rope)` wide.
    pub q: LatentQuery,
    /// `kv_a_proj_with_mqa`: the latent then the shared rotary key.
    pub kv_a: Linear,
    /// `kv_a_layernorm`'s weight (the latent's norm).
    pub kv_norm: Tensor,
    /// `kv_b_proj`'s key half, `(heads, nope, kv_rank)`, f32.
    pub k_b: Tensor,
    /// `kv_b_proj`'s value half, `(heads, v_dim, kv_rank)`, f32.
    pub v_b: Tensor,
    /// `o_proj`.
    pub o: Linear,
}

/// One step's queries and cached rows, before attention: `q_nope` `(tokens,
/// heads, nope)`, `q_pe` `(tokens, heads, rope)` roped, `latent` `(tokens,
/// kv_rank + rope)` (the normed `c_kv` then the roped `k_pe`).
pub(crate) struct LatentParts {
    pub q_nope: Tensor,
    pub q_pe: Tensor,
    pub latent: Tensor,
}

impl LatentWeights {
    pub(crate) fn held_bytes(&self) -> u64 {
        let q = match &self.q {
            LatentQuery::Full(q) => q.held_bytes(),
            LatentQuery::LowRank { a, norm, b } => {
                a.held_bytes() + tensor_bytes(norm) + b.held_bytes()
            }
        };
        q + self.kv_a.held_bytes()
            + tensor_bytes(&self.kv_norm)
            + tensor_bytes(&self.k_b)
            + tensor_bytes(&self.v_b)
            + self.o.held_bytes()
    }

    /// Layer `layer`'s latent attention of `h` `(tokens, hidden)` (normed),
    /// its kind `m`: `(tokens, hidden)`.
    pub(crate) fn forward(
        &self,
        m: &LatentSpec,
        h: &Tensor,
        (layer, step): (usize, &AttentionStep<'_>),
    ) -> Result<Tensor> {
        let parts = self.parts(m, h, step)?;
        let out = self.absorbed(m, &parts, (layer, step))?;
        self.o.forward(&out)
    }

    /// The queries and the rows to cache of `h`, roped at the step's
    /// positions.
    pub(crate) fn parts(
        &self,
        m: &LatentSpec,
        h: &Tensor,
        step: &AttentionStep<'_>,
    ) -> Result<LatentParts> {
        let tokens = h.dim(0)?;
        let heads = step.heads.heads;
        let norm = |t: &Tensor, w: &Tensor| candle_nn::ops::rms_norm(t, w, step.eps);
        let q = match &self.q {
            LatentQuery::Full(q) => q.forward(h)?,
            LatentQuery::LowRank { a, norm: w, b } => b.forward(&norm(&a.forward(h)?, w)?)?,
        };
        let q = q.reshape((tokens, heads, m.qk_dim()))?;
        let q_nope = q.narrow(2, 0, m.nope_dim)?.contiguous()?;
        let q_pe = q.narrow(2, m.nope_dim, m.rope_dim)?;
        let kv = self.kv_a.forward(h)?;
        let c = norm(&kv.narrow(1, 0, m.kv_rank)?.contiguous()?, &self.kv_norm)?;
        let k_pe = kv
            .narrow(1, m.kv_rank, m.rope_dim)?
            .reshape((tokens, 1, m.rope_dim))?;
        let (q_pe, k_pe) = match m.interleaved {
            true => (halves(&q_pe)?, halves(&k_pe)?),
            false => (q_pe.contiguous()?, k_pe.contiguous()?),
        };
        let (cos, sin) = step.rope_rows(&m.attention);
        let (q_pe, k_pe) = (Rope::apply(&q_pe, cos, sin)?, Rope::apply(&k_pe, cos, sin)?);
        let k_pe = k_pe.reshape((tokens, m.rope_dim))?;
        let latent = Tensor::cat(&[&c.to_dtype(k_pe.dtype())?, &k_pe], 1)?;
        Ok(LatentParts {
            q_nope: q_nope.to_dtype(candle_core::DType::F32)?,
            q_pe,
            latent,
        })
    }

    /// Writes `p.latent` into layer `layer`'s cache and attends in the
    /// latent space: `(tokens, heads * v_dim)`, before `o_proj`.
    pub(crate) fn absorbed(
        &self,
        m: &LatentSpec,
        p: &LatentParts,
        (layer, step): (usize, &AttentionStep<'_>),
    ) -> Result<Tensor> {
        let tokens = p.q_nope.dim(0)?;
        let heads = step.heads.heads;
        // Each head's query in the latent space: q_nope . W_uk, per head.
        let q_nope = p.q_nope.transpose(0, 1)?.contiguous()?;
        let q_lat = q_nope.matmul(&self.k_b)?.transpose(0, 1)?;
        let q = Tensor::cat(&[&q_lat, &p.q_pe.to_dtype(q_lat.dtype())?], 2)?.contiguous()?;
        step.kv
            .write(layer, step.slot_index, &p.latent, &p.latent)?;
        let (group, local) = step.kv.group_of(layer)?;
        let width = m.width();
        let at = LayerAttn {
            layer: local,
            group,
            heads: Heads {
                heads,
                kv_heads: 1,
                head_dim: width,
            },
            params: AttnParams {
                scale: m.attention.scale,
                softcap: None,
                window: None,
                chunk: None,
            },
        };
        let paged = step.paged && (q.device().is_cpu() || width <= CUDA_MAX_HEAD_DIM);
        let cache = step.kv.cache(group);
        let tables = step.tables[group].as_ref();
        let out = attention(&q, cache, at, step.spans, (tables, None), paged)?;
        // The weighted latent (the k_pe columns are the cache read as V).
        let lat = out
            .reshape((tokens, heads, width))?
            .narrow(2, 0, m.kv_rank)?;
        let lat = lat.to_dtype(candle_core::DType::F32)?.transpose(0, 1)?;
        let o = lat.contiguous()?.matmul(&self.v_b.t()?)?.transpose(0, 1)?;
        Ok(o.contiguous()?.reshape((tokens, heads * m.v_dim))?)
    }
}

/// `x` `(tokens, heads, dim)` with each head's adjacent pairs `(x0, x1),
/// (x2, x3), ...` reordered to halves `(x0, x2, ..., x1, x3, ...)`: the
/// layout whose half-split rotation equals the interleaved one (as
/// transformers' DeepSeek computes it).
pub(crate) fn halves(x: &Tensor) -> Result<Tensor> {
    let (t, h, d) = x.dims3()?;
    Ok(x.reshape((t, h, d / 2, 2))?
        .transpose(D::Minus1, D::Minus2)?
        .contiguous()?
        .reshape((t, h, d))?)
}

#[cfg(test)]
/// The expanded form over one sequence's every position from 0 (the
/// reference the absorbed form is checked against): each head's K and V
/// decompressed from the latent, causal softmax attention, `(tokens,
/// heads * v_dim)`. `k_b` `(heads, nope, rank)`, `v_b` `(heads, v, rank)`.
pub(crate) fn expanded(
    m: &LatentSpec,
    p: &LatentParts,
    (k_b, v_b): (&Tensor, &Tensor),
) -> Result<Tensor> {
    let f32 = candle_core::DType::F32;
    let (tokens, heads) = (p.q_nope.dim(0)?, p.q_nope.dim(1)?);
    let latent = p.latent.to_dtype(f32)?;
    let c = latent.narrow(1, 0, m.kv_rank)?.contiguous()?;
    let k_pe = latent.narrow(1, m.kv_rank, m.rope_dim)?.contiguous()?;
    // Per head: (heads, tokens, nope) and (heads, tokens, v).
    let c_h = c.unsqueeze(0)?.broadcast_as((heads, tokens, m.kv_rank))?;
    let k_nope = c_h.contiguous()?.matmul(&k_b.t()?)?;
    let v = c_h.contiguous()?.matmul(&v_b.t()?)?;
    let k_pe = k_pe
        .unsqueeze(0)?
        .broadcast_as((heads, tokens, m.rope_dim))?;
    let k = Tensor::cat(&[&k_nope, &k_pe.contiguous()?], 2)?;
    let q = Tensor::cat(&[&p.q_nope.to_dtype(f32)?, &p.q_pe.to_dtype(f32)?], 2)?;
    let q = q.transpose(0, 1)?.contiguous()?;
    let scores = (q.matmul(&k.t()?)? * f64::from(m.attention.scale))?;
    let mask: Vec<f32> = (0..tokens)
        .flat_map(|i| (0..tokens).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (1, tokens, tokens), q.device())?;
    let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
    let o = probs.matmul(&v)?.transpose(0, 1)?.contiguous()?;
    Ok(o.reshape((tokens, heads * m.v_dim))?)
}
