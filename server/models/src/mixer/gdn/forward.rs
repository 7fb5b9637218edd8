//! Gated DeltaNet (Qwen3-Next's and Qwen3.5's linear attention): the
//! in-projection to q, k, v, the output gate z and each value head's beta
//! and decay inputs; a causal depthwise convolution and SiLU over q, k, v
//! carrying its last inputs per sequence; L2-normed q and k; the gated delta
//! rule (`delta`) carrying a `key_dim x value_dim` state per value head and
//! sequence; a per-head RMSNorm of the output times `silu(z)`; and the
//! out-projection. Every op is candle's, so it runs on any device.
//!
//! Spans run as Mamba-2's do (`crate::mixer::recurrent::over_runs`): a prefill span alone,
//! in blocks of the spec's chunk carrying the state between them; decode
//! rows together, one block of one token each. States come from and go
//! back to the rows' slots of the [`StateStore`].

use candle_core::{D, DType, Tensor};

use super::delta;
use super::spec::GdnSpec;
use crate::error::Result;
use crate::linear::{Linear, tensor_bytes};
use crate::mixer::recurrent::conv::causal_conv;
use crate::mixer::recurrent::{over_runs, softplus};
use crate::projection::Projection;
use crate::seq_span::SeqSpan;
use crate::state_store::StateStore;

/// One Gated DeltaNet mixer's weights (vectors f32).
#[derive(Debug, Clone)]
pub struct GdnWeights {
    /// The in-projection's matrices, as the checkpoint stores them.
    pub in_proj: Projection,
    /// Where the projection's columns are not `[q k v | z | b | a]`
    /// (Qwen3-Next's per-key-head interleaving): the columns to take, in
    /// that order (u32).
    pub order: Option<Tensor>,
    /// The depthwise convolution, `(conv_dim, kernel)`.
    pub conv: Tensor,
    /// Added to each value head's decay input before the softplus.
    pub dt_bias: Tensor,
    /// Each value head's decay rate `A = -exp(A_log)` (negative).
    pub a: Tensor,
    /// The gated RMSNorm's weight, `value_dim` (shared by the heads).
    pub norm: Tensor,
    /// Back to the residual width.
    pub out_proj: Linear,
}

impl GdnWeights {
    pub(crate) fn held_bytes(&self) -> u64 {
        self.in_proj.held_bytes()
            + self.out_proj.held_bytes()
            + [&self.conv, &self.dt_bias, &self.a, &self.norm]
                .into_iter()
                .map(tensor_bytes)
                .sum::<u64>()
    }

    /// The mixer over `h` `(tokens, hidden)` (normed) of layer `layer`,
    /// whose tokens are `spans`' in order; reads and writes the spans'
    /// states in `state`.
    pub(crate) fn forward(
        &self,
        s: &GdnSpec,
        eps: f32,
        h: &Tensor,
        (layer, spans, state): (usize, &[SeqSpan], &StateStore),
    ) -> Result<Tensor> {
        let dtype = h.dtype();
        let mut proj = self.in_proj.forward(h)?.to_dtype(DType::F32)?;
        if let Some(order) = &self.order {
            proj = proj.index_select(order, 1)?;
        }
        let (conv_dim, vw, heads) = (s.conv_dim(), s.value_width(), s.value_heads);
        let qkv = proj.narrow(1, 0, conv_dim)?;
        let z = proj.narrow(1, conv_dim, vw)?;
        let beta = candle_nn::ops::sigmoid(&proj.narrow(1, conv_dim + vw, heads)?)?;
        let decay_in = proj.narrow(1, conv_dim + vw + heads, heads)?;
        let g = softplus(&decay_in.broadcast_add(&self.dt_bias)?)?.broadcast_mul(&self.a)?;
        let o = over_runs(spans, vw, |run, r| {
            let inputs = (r.take(&qkv)?, r.take(&beta)?, r.take(&g)?);
            self.run(s, inputs, (layer, run, state))
        })?;
        let o = gated_norm(&o, &z, &self.norm, s.value_heads, eps)?;
        self.out_proj.forward(&o.to_dtype(dtype)?)
    }

    /// One run of `rows` spans of `len` tokens each: `qkv` `(rows, len,
    /// conv_dim)`, `beta` and `g` `(rows, len, value_heads)`; returns the
    /// output `(rows, len, value_heads, value_dim)`.
    fn run(
        &self,
        s: &GdnSpec,
        (qkv, beta, g): (Tensor, Tensor, Tensor),
        (layer, run, state): (usize, &[SeqSpan], &StateStore),
    ) -> Result<Tensor> {
        let (rows, len, _) = qkv.dims3()?;
        let (conv_state, held) = state.read(layer, run)?;
        let (conv, new_conv) = causal_conv(&qkv, &conv_state, &self.conv, None)?;
        let conv = candle_nn::ops::silu(&conv)?;
        let kw = s.key_width();
        let heads = |t: Tensor, n: usize, d: usize| t.reshape((rows, len, n, d));
        let q = heads(conv.narrow(2, 0, kw)?, s.key_heads, s.key_dim)?;
        let k = heads(conv.narrow(2, kw, kw)?, s.key_heads, s.key_dim)?;
        let v = heads(
            conv.narrow(2, 2 * kw, s.value_width())?,
            s.value_heads,
            s.value_dim,
        )?;
        let scale = 1.0 / (s.key_dim as f64).sqrt();
        let q = (to_value_heads(&l2norm(&q)?, s)? * scale)?;
        let k = to_value_heads(&l2norm(&k)?, s)?;
        let by_head = |t: Tensor| -> Result<Tensor> { Ok(t.transpose(1, 2)?.contiguous()?) };
        let (q, k, v) = (by_head(q)?, by_head(k)?, by_head(v)?);
        let (beta, g) = (by_head(beta)?, by_head(g)?);
        let mut st = held.reshape((rows, s.value_heads, s.key_dim, s.value_dim))?;
        let mut outs = Vec::new();
        let mut at = 0;
        while at < len {
            let n = s.chunk.min(len - at);
            let part = |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(2, at, n)?.contiguous()?) };
            let blk = delta::Block {
                q: part(&q)?,
                k: part(&k)?,
                v: part(&v)?,
                beta: part(&beta)?,
                g: part(&g)?,
            };
            let (o, next) = delta::block(&blk, &st)?;
            outs.push(o);
            st = next;
            at += n;
        }
        state.write(layer, run, &new_conv, Some(&st.reshape((rows, ()))?))?;
        Ok(Tensor::cat(&outs, 2)?.transpose(1, 2)?.contiguous()?)
    }
}

/// `x / sqrt(sum(x^2) + 1e-6)` over the last dimension (the FLA library's
/// L2 norm, which transformers matches).
fn l2norm(x: &Tensor) -> Result<Tensor> {
    let norm = (x.sqr()?.sum_keepdim(D::Minus1)? + 1e-6)?.sqrt()?;
    Ok(x.broadcast_div(&norm)?)
}

/// `(rows, len, key_heads, d)` to `(rows, len, value_heads, d)`: each key
/// head repeated for the value heads that read it (grouped, or tiled).
fn to_value_heads(t: &Tensor, s: &GdnSpec) -> Result<Tensor> {
    let per = s.value_heads / s.key_heads;
    if per == 1 {
        return Ok(t.clone());
    }
    let (rows, len, kh, d) = t.dims4()?;
    let t = match s.tiled {
        true => t
            .unsqueeze(2)?
            .broadcast_as((rows, len, per, kh, d))?
            .contiguous()?,
        false => t
            .unsqueeze(3)?
            .broadcast_as((rows, len, kh, per, d))?
            .contiguous()?,
    };
    Ok(t.reshape((rows, len, kh * per, d))?)
}

/// `rmsnorm(o) * w * silu(z)` over each value head's channels (the norm
/// before the gate, unlike Mamba-2's).
fn gated_norm(o: &Tensor, z: &Tensor, w: &Tensor, heads: usize, eps: f32) -> Result<Tensor> {
    let (tokens, width) = o.dims2()?;
    let o = o.reshape((tokens, heads, width / heads))?;
    let rms = (o.sqr()?.mean_keepdim(D::Minus1)? + f64::from(eps))?.sqrt()?;
    let normed = o.broadcast_div(&rms)?.broadcast_mul(w)?;
    Ok((normed.reshape((tokens, width))? * candle_nn::ops::silu(z)?)?)
}
