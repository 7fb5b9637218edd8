//! The encoder mixer's forward: attention's projections, then each span's
//! queries over that span's own keys and values (nothing read from or
//! written to a cache), masked where the kind says a token does not see
//! another (causal, window). Scores in f32 whatever the weights' type.

use candle_core::{DType, Tensor};

use super::spec::EncoderSpec;
use crate::error::{Error, Result};
use crate::lora::LoraHook;
use crate::mixer::attention::forward::{AttentionStep, AttentionWeights};
use crate::mixer::attention::paged::Heads;

/// The encoder attention of kind `e` over `h` `(tokens, hidden)` (normed),
/// with `w`'s weights.
pub(crate) fn forward(
    w: &AttentionWeights,
    e: &EncoderSpec,
    h: &Tensor,
    step: &AttentionStep<'_>,
    hook: &LoraHook<'_>,
) -> Result<Tensor> {
    let attend = |q: &Tensor, kv: Option<(&Tensor, &Tensor)>| match kv {
        Some((k, v)) => attend_spans(e, (q, k, v), step),
        None => Err(Error::Config(
            "an encoder layer reads no other layer's KV".into(),
        )),
    };
    w.forward_with(&e.attention, h, step, hook, attend)
}

/// `q` `(tokens, heads, head_dim)` over `k`, `v` `(tokens, kv_dim)`, each
/// span alone; `(tokens, heads * head_dim)` in `q`'s type.
fn attend_spans(
    e: &EncoderSpec,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    step: &AttentionStep<'_>,
) -> Result<Tensor> {
    let dtype = q.dtype();
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let (q, k, v) = (f32(q)?, f32(k)?, f32(v)?);
    let mut outs = Vec::with_capacity(step.spans.len());
    let mut at = 0;
    for span in step.spans.iter() {
        let n = span.n_tokens;
        let part = |t: &Tensor| t.narrow(0, at, n);
        let mask = mask(e, span.start_pos, n, q.device())?;
        outs.push(attend_one(
            e,
            (&part(&q)?, &part(&k)?, &part(&v)?),
            mask,
            step.heads,
        )?);
        at += n;
    }
    Ok(Tensor::cat(&outs, 0)?.to_dtype(dtype)?)
}

/// One span's attention, `(n, heads * head_dim)`; grouped queries share
/// their KV head (query head `h` reads KV head `h / group`).
fn attend_one(
    e: &EncoderSpec,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    mask: Option<Tensor>,
    heads: Heads,
) -> Result<Tensor> {
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = heads;
    let (n, group) = (q.dim(0)?, heads / kv_heads);
    let by_head = |t: &Tensor, h: usize| -> Result<Tensor> {
        Ok(t.reshape((n, h, head_dim))?.transpose(0, 1)?.contiguous()?)
    };
    // (kv_heads, group * n, head_dim): each KV head's queries together.
    let q = by_head(q, heads)?.reshape((kv_heads, group * n, head_dim))?;
    let (k, v) = (by_head(k, kv_heads)?, by_head(v, kv_heads)?);
    let mut scores = (q.matmul(&k.t()?)? * f64::from(e.attention.scale))?;
    if let Some(cap) = e.attention.softcap {
        scores = ((scores / f64::from(cap))?.tanh()? * f64::from(cap))?;
    }
    if let Some(m) = mask {
        let s = scores.reshape((kv_heads, group, n, n))?.broadcast_add(&m)?;
        scores = s.reshape((kv_heads, group * n, n))?;
    }
    let p = candle_nn::ops::softmax_last_dim(&scores)?;
    let out = p.matmul(&v)?.reshape((heads, n, head_dim))?;
    Ok(out.transpose(0, 1)?.reshape((n, heads * head_dim))?)
}

/// The additive mask of a span of `n` tokens from position `start`: 0
/// where a query sees a key, -inf where it does not; `None` when every
/// query sees every key.
fn mask(
    e: &EncoderSpec,
    start: usize,
    n: usize,
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    let a = &e.attention;
    if !e.causal && a.window.is_none_or(|w| w >= n) && a.chunk.is_none() {
        return Ok(None);
    }
    let values: Vec<f32> = (0..n * n)
        .map(|i| {
            let (q, k) = (start + i / n, start + i % n);
            if e.sees(q, k) { 0.0 } else { f32::NEG_INFINITY }
        })
        .collect();
    Ok(Some(Tensor::from_vec(values, (n, n), device)?))
}
