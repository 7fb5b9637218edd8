//! The attention mixer op by op: its weights, and its forward over a step's
//! spans (the q, k, v projection, the q/k norms, RoPE, the K/V write into
//! the layer's group's cache, paged attention, the output gate and the
//! output projection). The fused CPU path (`crate::fused`) runs its own
//! projections and comes here only to write K/V and attend ([`attend`]).
//!
//! [`attend`]: AttentionWeights::attend

use std::sync::Arc;

use candle_core::Tensor;
use ferrox_kernels::AttnParams;

use super::paged::{Heads, LayerAttn, StepTables, attention};
use super::spec::AttentionSpec;
use super::temperature::QueryTemperature;
use crate::error::{Error, Result};
use crate::kv_store::KvStore;
use crate::linear::{Linear, tensor_bytes};
use crate::lora::{LoraHook, Target};
use crate::projection::Projection;
use crate::rope::Rope;
use crate::seq_span::SeqSpan;

/// One attention mixer's weights.
#[derive(Debug, Clone)]
pub struct AttentionWeights {
    /// `[q | k | v]` projection.
    pub qkv: Projection,
    /// Concatenated q, k, v biases (Qwen2).
    pub qkv_bias: Option<Tensor>,
    /// Per-head RMSNorms of q and k, `head_dim` each (Qwen3, Gemma 3); k's
    /// empty where the layer reads another layer's KV (Gemma 4).
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// Attention output projection.
    pub o: Linear,
    /// Its bias (gpt-oss).
    pub o_bias: Option<Tensor>,
    /// Per query head, the learned logit of an attention sink (gpt-oss).
    pub sinks: Option<Tensor>,
}

/// What every attention layer of a step shares.
pub(crate) struct AttentionStep<'a> {
    /// The KV cache, a pool per KV group.
    pub kv: &'a KvStore,
    /// The step's spans.
    pub spans: &'a Arc<[SeqSpan]>,
    /// Per KV group: its tables on the device, where a kernel reads them.
    pub tables: &'a [Option<Arc<StepTables>>],
    /// Per RoPE kind: this step's `(cos, sin)` rows.
    pub rope_rows: &'a [(Tensor, Tensor)],
    /// Per query temperature the model's layers have: this step's factors
    /// `(tokens, 1, 1)`.
    pub query_scales: &'a [(QueryTemperature, Tensor)],
    /// Per KV group: this step's slot index.
    pub slot_index: &'a [Tensor],
    /// Head layout.
    pub heads: Heads,
    /// The q/k norms' epsilon.
    pub eps: f32,
    /// Our paged-attention kernel (on), or the gather path (off).
    pub paged: bool,
}

impl AttentionStep<'_> {
    /// The heads of a layer of kind `a`: its own, or the model's.
    pub(crate) fn heads_for(&self, a: &AttentionSpec) -> Heads {
        match a.kv.shape {
            Some(h) => Heads {
                heads: self.heads.heads,
                kv_heads: h.kv_heads,
                head_dim: h.head_dim,
            },
            None => self.heads,
        }
    }

    /// This step's `(cos, sin)` rows of `a`'s RoPE.
    pub(crate) fn rope_rows(&self, a: &AttentionSpec) -> (&Tensor, &Tensor) {
        let (cos, sin) = &self.rope_rows[a.rope];
        (cos, sin)
    }

    /// `q` `(tokens, heads, head_dim)` scaled by `a`'s query temperature at
    /// each token's position (after RoPE, as Llama 4 does); as is where the
    /// kind has none.
    pub(crate) fn scale_queries(&self, a: &AttentionSpec, q: Tensor) -> Result<Tensor> {
        let Some(t) = a.temperature else {
            return Ok(q);
        };
        let Some((_, f)) = self.query_scales.iter().find(|(k, _)| *k == t) else {
            return Err(Error::Config(format!("no step factors for {t:?}")));
        };
        Ok(q.broadcast_mul(&f.to_dtype(q.dtype())?)?)
    }
}

/// A layer's queries, their output gate where it has one, and its keys
/// and values where it makes its own.
type QkvParts = (Tensor, Option<Tensor>, Option<(Tensor, Tensor)>);

impl AttentionWeights {
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        let qk = self
            .qk_norm
            .as_ref()
            .map_or(0, |(q, k)| tensor_bytes(q) + tensor_bytes(k));
        opt(&self.qkv_bias)
            + opt(&self.o_bias)
            + opt(&self.sinks)
            + qk
            + self.qkv.held_bytes()
            + self.o.held_bytes()
    }

    /// Layer `layer`'s attention of `h` `(tokens, hidden)` (normed), its
    /// kind `a`; `hook` adds each row's LoRA update after the projections.
    pub(crate) fn forward(
        &self,
        a: &AttentionSpec,
        h: &Tensor,
        (layer, step): (usize, &AttentionStep<'_>),
        hook: &LoraHook<'_>,
    ) -> Result<Tensor> {
        let attend =
            |q: &Tensor, kv: Option<(&Tensor, &Tensor)>| self.attend(a, q, kv, (layer, step));
        self.forward_with(a, h, step, hook, attend)
    }

    /// The projections around an attention of kind `a`: q, k, v of `h`
    /// (normed and rotated as `a` says), then `attend(q, Some((k, v)))` (q
    /// `(tokens, heads, head_dim)`, k and v `(tokens, kv_dim)`, out `(tokens,
    /// q_dim)`; `None` for a layer reading another's KV), its output gate
    /// and the output projection. The cached kind attends over the paged
    /// KV; the encoder kind within each span.
    pub(crate) fn forward_with(
        &self,
        a: &AttentionSpec,
        h: &Tensor,
        step: &AttentionStep<'_>,
        hook: &LoraHook<'_>,
        attend: impl FnOnce(&Tensor, Option<(&Tensor, &Tensor)>) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let tokens = h.dims()[0];
        let heads = step.heads_for(a);
        let (q_dim, kv_dim) = (
            heads.heads * heads.head_dim,
            heads.kv_heads * heads.head_dim,
        );
        let norm = |t: &Tensor, w: &Tensor| candle_nn::ops::rms_norm(t, w, step.eps);
        let mut qkv = self.qkv.forward(h)?;
        if let Some(b) = &self.qkv_bias {
            qkv = qkv.broadcast_add(b)?;
        }
        let qkv = hook(&[Target::Q, Target::K, Target::V], h, qkv)?;
        let (mut q, gate, kv) = split_qkv(&qkv, heads, a)?;
        let (mut k, mut v) = kv.unzip();
        if let (true, Some(t)) = (a.kv.v_norm, &v) {
            let t = t.reshape((tokens, heads.kv_heads, heads.head_dim))?;
            let t = crate::norm::rms_unit(&t, f64::from(step.eps))?;
            v = Some(t.reshape((tokens, kv_dim))?);
        }
        if let Some((qn, kn)) = &self.qk_norm {
            // A whole-width norm (OLMo 2) sees every head of a token as one row.
            let by = |t: &Tensor, w: &Tensor| -> Result<Tensor> {
                let t = t.contiguous()?;
                Ok(match a.qk_norm_whole {
                    true => norm(&t.flatten_from(1)?, w)?.reshape(t.shape())?,
                    false => norm(&t, w)?,
                })
            };
            q = by(&q, qn)?;
            k = k.map(|k| by(&k, kn)).transpose()?;
        }
        let (q, k) = match a.nope {
            true => (q.contiguous()?, k),
            false => {
                let (cos, sin) = step.rope_rows(a);
                let k = k.map(|k| Rope::apply(&k, cos, sin)).transpose()?;
                (Rope::apply(&q, cos, sin)?, k)
            }
        };
        let q = step.scale_queries(a, q)?;
        let k = k
            .map(|k| k.contiguous()?.reshape((tokens, kv_dim)))
            .transpose()?;
        let mut out = attend(&q, k.as_ref().zip(v.as_ref()))?;
        if let Some(gate) = gate {
            let gate = candle_nn::ops::sigmoid(&gate.reshape((tokens, q_dim))?)?;
            let gate = gate.to_dtype(out.dtype())?;
            out = (out * gate)?;
        }
        let mut out = hook(&[Target::O], &out, self.o.forward(&out)?)?;
        if let Some(b) = &self.o_bias {
            out = out.broadcast_add(b)?;
        }
        Ok(out)
    }

    /// Writes the step's `k`, `v` `(tokens, kv_dim)` into layer `layer`'s
    /// cache, then attends `q` `(tokens, heads, head_dim)` over it, by the
    /// step's spans; `(tokens, heads * head_dim)`. A layer reading another
    /// layer's KV (`kv` `None`) writes nothing and attends over that one's.
    pub(crate) fn attend(
        &self,
        a: &AttentionSpec,
        q: &Tensor,
        kv: Option<(&Tensor, &Tensor)>,
        (layer, step): (usize, &AttentionStep<'_>),
    ) -> Result<Tensor> {
        let source = match (kv, a.kv.shared_from) {
            (Some((k, v)), None) => {
                step.kv.write(layer, step.slot_index, k, v)?;
                layer
            }
            (None, Some(from)) => from,
            _ => {
                return Err(Error::Config(format!(
                    "layer {layer}: keys and values where it reads another layer's, or none of its own"
                )));
            }
        };
        let (group, local) = step.kv.group_of(source)?;
        let at = LayerAttn {
            layer: local,
            group,
            heads: step.heads_for(a),
            params: AttnParams {
                scale: a.scale,
                softcap: a.softcap,
                window: a.window,
                chunk: a.chunk,
            },
        };
        let tables = step.tables[group].as_ref();
        let cache = step.kv.cache(group);
        attention(
            q,
            cache,
            at,
            step.spans,
            (tables, self.sinks.as_ref()),
            step.paged,
        )
    }
}

/// `(q (tokens, heads, head_dim), its output gate (tokens, heads,
/// head_dim) where the layer is `gated`, and (k (tokens, kv_heads,
/// head_dim), v (tokens, kv_dim)) where it makes its own)` from the
/// projections' output: the values are the keys' projection where `a`
/// says so.
fn split_qkv(qkv: &Tensor, heads: Heads, a: &AttentionSpec) -> Result<QkvParts> {
    let gated = a.gated;
    let tokens = qkv.dim(0)?;
    let Heads {
        heads,
        kv_heads,
        head_dim,
    } = heads;
    let (q_dim, kv_dim) = (heads * head_dim, kv_heads * head_dim);
    // A gated projection's rows: each head's query, then its gate.
    let q_rows = if gated { 2 * q_dim } else { q_dim };
    let per_head = qkv
        .narrow(1, 0, q_rows)?
        .reshape((tokens, heads, q_rows / heads))?;
    let q = per_head.narrow(2, 0, head_dim)?;
    let gate = match gated {
        true => Some(per_head.narrow(2, head_dim, head_dim)?.contiguous()?),
        false => None,
    };
    if a.kv.shared_from.is_some() {
        return Ok((q, gate, None));
    }
    let k = qkv.narrow(1, q_rows, kv_dim)?;
    let v = match a.kv.values_from_keys {
        true => k.clone(),
        false => qkv.narrow(1, q_rows + kv_dim, kv_dim)?,
    };
    let k = k.reshape((tokens, kv_heads, head_dim))?;
    Ok((q, gate, Some((k, v))))
}
