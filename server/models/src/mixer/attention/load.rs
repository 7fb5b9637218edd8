//! An attention mixer's weights from any source, by GGUF names: q, k, v as
//! three matrices or one (Phi-3's `attn_qkv`), their biases, the q/k norms,
//! the output projection and its bias, the sinks.

use candle_core::{DType, Device, Tensor};

use super::forward::AttentionWeights;
use super::spec::AttentionSpec;
use crate::error::Result;
use crate::projection::single;
use crate::spec::ModelSpec;
use crate::weights::source::{WeightSource, norm};

/// Layer `i`'s attention, of kind `attn`.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    spec: &ModelSpec,
    (attn, i): (&AttentionSpec, usize),
    device: &Device,
) -> Result<AttentionWeights> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let hidden = spec.hidden;
    let shape = spec.head_shape(attn);
    let (q_dim, kv_dim) = (spec.heads * shape.head_dim, shape.kv_heads * shape.head_dim);
    let layout = attn.kv;
    // A gated query projection's rows hold each head's query, then its gate.
    let q_rows = if attn.gated { 2 * q_dim } else { q_dim };
    // Phi-3 stores q, k, v as one matrix.
    let qkv = if src.has(&n("attn_qkv.weight")) {
        src.projection(
            &[(&n("attn_qkv.weight"), q_rows + 2 * kv_dim)],
            hidden,
            device,
        )?
    } else {
        let (q, k, v) = (n("attn_q.weight"), n("attn_k.weight"), n("attn_v.weight"));
        // A layer reading another's KV projects queries alone; one whose
        // values are its keys' projection has no v.
        let parts: &[(&str, usize)] = match (layout.shared_from, layout.values_from_keys) {
            (Some(_), _) => &[(&q, q_rows)],
            (None, true) => &[(&q, q_rows), (&k, kv_dim)],
            (None, false) => &[(&q, q_rows), (&k, kv_dim), (&v, kv_dim)],
        };
        src.projection(parts, hidden, device)?
    };
    let qkv_bias = if spec.qkv_bias {
        let parts = [
            src.vector(&n("attn_q.bias"), q_rows, device)?,
            src.vector(&n("attn_k.bias"), kv_dim, device)?,
            src.vector(&n("attn_v.bias"), kv_dim, device)?,
        ];
        Some(Tensor::cat(&parts, 0)?)
    } else {
        None
    };
    // Each head's width, or every head's at once (OLMo 2).
    let (q_len, k_len) = match attn.qk_norm_whole {
        true => (q_dim, kv_dim),
        false => (shape.head_dim, shape.head_dim),
    };
    let qk_norm = match attn.qk_norm {
        true if attn.qk_norm_weightless => Some((
            Tensor::ones(q_len, DType::F32, device)?,
            Tensor::ones(k_len, DType::F32, device)?,
        )),
        // A layer reading another's KV has no k norm (nor keys to norm).
        true => Some((
            norm(src, spec, &n("attn_q_norm.weight"), q_len, device)?,
            match layout.shared_from {
                Some(_) => Tensor::zeros(0, DType::F32, device)?,
                None => norm(src, spec, &n("attn_k_norm.weight"), k_len, device)?,
            },
        )),
        false => None,
    };
    let o_bias = match src.has(&n("attn_output.bias")) {
        true => Some(src.vector(&n("attn_output.bias"), hidden, device)?),
        false => None,
    };
    let sinks = match attn.sinks {
        true => Some(src.vector(&n("attn_sinks.weight"), spec.heads, device)?),
        false => None,
    };
    Ok(AttentionWeights {
        qkv,
        qkv_bias,
        qk_norm,
        o: single(src.projection(&[(&n("attn_output.weight"), hidden)], q_dim, device)?),
        o_bias,
        sinks,
    })
}
