//! The one decoder every family runs, written for batching: every token of a
//! step carries its own position and its sequence's block tables (one per KV
//! group), so prefill chunks and decode rows of many sequences run through
//! one forward pass, and logits are computed only for the rows that will be
//! sampled. What differs between families is the [`ModelSpec`] it reads.

use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};
use ferrox_kernels::AttnParams;
use ferrox_plan::KvDtype;

use crate::error::{Error, Result};
use crate::fused::{Dims, FusedHead, FusedLayer, Scratch};
use crate::kv_store::KvStore;
use crate::layer::{Block, Ffn, Layer, RecurrentMixer, SsmLayer};
use crate::linear::{Embedding, Linear, tensor_bytes};
use crate::lora::{LoraStep, Target};
use crate::mixer::attention::paged::{Heads, LayerAttn, StepTables, attention};
use crate::rope::Rope;
use crate::seq_span::SeqSpan;
use crate::spec::{FeedForward, KvGroup, Mixer, ModelSpec};
use crate::state_store::StateStore;

/// The whole decoder.
#[derive(Debug)]
pub struct Decoder {
    spec: ModelSpec,
    groups: Vec<KvGroup>,
    embed: Embedding,
    layers: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    /// One table per RoPE kind of the spec.
    ropes: Vec<Rope>,
    /// Positions served (`--max-model-len`, at most the trained context).
    context: usize,
    device: Device,
    fused_attention: bool,
    /// The CPU fast path, when every matrix is packed: one per layer, the head.
    fused: Option<(Vec<FusedLayer>, FusedHead)>,
    use_fused: bool,
    scratch: Mutex<Scratch>,
}

/// One forward pass: the new tokens of several sequences.
#[derive(Debug, Clone)]
pub struct Step<'a> {
    /// All new tokens, span after span.
    pub tokens: &'a [u32],
    /// Which sequence each run of tokens belongs to.
    pub spans: Arc<[SeqSpan]>,
    /// Indices into `tokens` whose logits are wanted, in output order.
    pub logits_for: &'a [usize],
    /// The rows' LoRA adapters; `None` when no row has one.
    pub lora: Option<&'a LoraStep<'a>>,
}

/// One table per RoPE kind; kinds alike (Gemma 2's local and global) share
/// one (a clone shares the tensors).
fn ropes(spec: &ModelSpec, context: usize, device: &Device) -> Result<Vec<Rope>> {
    let mut out: Vec<Rope> = Vec::with_capacity(spec.ropes.len());
    for (i, r) in spec.ropes.iter().enumerate() {
        let table = match spec.ropes[..i].iter().position(|earlier| earlier == r) {
            Some(j) => out[j].clone(),
            None => Rope::new(r, context, device)?,
        };
        out.push(table);
    }
    Ok(out)
}

impl Decoder {
    /// Assembles a decoder from loaded weights.
    pub fn new(
        spec: ModelSpec,
        embed: Embedding,
        layers: Vec<Block>,
        norm: Tensor,
        lm_head: Linear,
        device: &Device,
    ) -> Result<Self> {
        let ropes = ropes(&spec, spec.context, device)?;
        // The fused CPU path runs attention layers only.
        let fused_layers = layers
            .iter()
            .zip(&spec.layers)
            .map(|(l, s)| match l {
                Block::Attention(l) => FusedLayer::from_layer(l, s.ffn),
                Block::Ssm(_) => Ok(None),
            })
            .collect::<Result<Option<Vec<_>>>>()?;
        let head = FusedHead::new(&norm, &lm_head, spec.final_softcap)?;
        // Nor Granite's multipliers, NoPE or gated attention: those models
        // run op by op.
        let plain = spec.residual_scale.is_none()
            && spec.logit_scale.is_none()
            && !spec
                .layers
                .iter()
                .any(|l| l.attention().is_some_and(|a| a.nope || a.gated));
        let fused = match (fused_layers, head) {
            (Some(l), Some(h)) if device.is_cpu() && plain => Some((l, h)),
            _ => None,
        };
        let spec_context = spec.context;
        Ok(Decoder {
            groups: spec.kv_groups(),
            spec,
            embed,
            layers,
            norm,
            lm_head,
            ropes,
            context: spec_context,
            device: device.clone(),
            fused_attention: true,
            fused,
            use_fused: true,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The model's description.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The layers whose KV is kept alike: every full-attention layer in one
    /// group, each sliding window its own (a [`SeqSpan`] has one block table
    /// per group, in this order).
    pub fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }

    /// Serves positions `0..context` only (the server's `--max-model-len`):
    /// smaller RoPE tables, and LongRoPE's factors chosen for that context.
    pub fn set_context(&mut self, context: usize) -> Result<()> {
        self.context = context.clamp(1, self.spec.context);
        self.ropes = ropes(&self.spec, self.context, &self.device)?;
        Ok(())
    }

    /// Bytes of weights this decoder holds (a tied LM head counted once):
    /// what `inspect` must report for its device.
    pub fn held_bytes(&self) -> u64 {
        let tied = match (&self.embed, &self.lm_head) {
            (Embedding::Packed(a), Linear::Packed(b)) => Arc::ptr_eq(a, b),
            (Embedding::Dense(a), Linear::Dense(b)) => a.id() == b.id(),
            _ => false,
        };
        let head = if tied { 0 } else { self.lm_head.held_bytes() };
        self.embed.held_bytes()
            + self.layers.iter().map(Block::held_bytes).sum::<u64>()
            + tensor_bytes(&self.norm)
            + head
    }

    /// Per layer, how often each of its experts was read (empty for a
    /// dense layer): an expert no token chose is never read.
    pub fn expert_reads(&self) -> Vec<Vec<u64>> {
        self.layers
            .iter()
            .map(|l| match l.ffn() {
                Some(Ffn::Moe(m)) => m.reads.counts(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Our paged-attention kernel (on), or the gather path (off: the
    /// reference in tests, `--attention-backend gather`).
    pub fn set_fused_attention(&mut self, on: bool) {
        self.fused_attention = on;
    }

    /// Runs the op-by-op layers even where the fused CPU path exists (a
    /// reference for tests).
    pub fn set_fused_layers(&mut self, on: bool) {
        self.use_fused = on;
    }

    /// Whether steps take the fused CPU path.
    pub fn fused_layers(&self) -> bool {
        self.use_fused && self.fused.is_some()
    }

    fn dims(&self) -> Dims {
        let s = &self.spec;
        Dims {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            intermediate: s.intermediate,
            eps: s.norms.eps as f32,
        }
    }

    /// The KV cache of this model, held in `dtype`: group `g` of
    /// [`Decoder::kv_groups`] gets a pool of `blocks[g]` blocks.
    pub fn kv_store(&self, blocks: &[usize], block_size: usize, dtype: KvDtype) -> Result<KvStore> {
        let s = &self.spec;
        KvStore::new(
            &self.groups,
            s.layers.len(),
            blocks,
            block_size,
            s.kv_dim(),
            dtype,
            &self.device,
        )
    }

    /// The recurrent state of `slots` sequences, for this model's
    /// recurrent layers (an empty store when it has none).
    pub fn state_store(&self, slots: usize) -> Result<StateStore> {
        StateStore::new(&self.spec, slots, &self.device)
    }

    /// Runs `step`, writing its K/V into `kv` and its rows' recurrent
    /// states into their slots of `state`; returns logits
    /// `(logits_for.len(), vocab)`, or `None` when none were asked for.
    pub fn forward(
        &self,
        kv: &KvStore,
        state: &StateStore,
        step: &Step<'_>,
    ) -> Result<Option<Tensor>> {
        let positions = self.positions(step)?;
        state.check(&step.spans)?;
        let pos = Tensor::new(positions.as_slice(), &self.device)?;
        let rope_rows = self
            .ropes
            .iter()
            .map(|r| r.gather(&pos))
            .collect::<Result<Vec<_>>>()?;
        let slot_index = kv.slot_indices(&step.spans, &self.device)?;
        let mut x = self.embed.forward(step.tokens, &self.device)?;
        if let Some(scale) = self.spec.embed_scale {
            x = (x * f64::from(scale))?;
        }
        let fused = self.fused.as_ref().filter(|_| self.use_fused);
        let tables = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                let key = (g, group.window);
                let cache = kv.cache(g);
                StepTables::for_step(&step.spans, key, cache, &self.device, self.fused_attention)
            })
            .collect::<Result<Vec<_>>>()?;
        let ctx = LayerCtx {
            kv,
            state,
            spans: &step.spans,
            tables: &tables,
            rope_rows: &rope_rows,
            slot_index: &slot_index,
            lora: step.lora,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            match (fused, layer) {
                (Some((fl, _)), _) => self.fused_layer_forward(i, &fl[i], &x, &ctx)?,
                (None, Block::Attention(l)) => x = self.layer_forward(i, l, &x, &ctx)?,
                (None, Block::Ssm(l)) => x = self.ssm_layer_forward(i, l, &x, &ctx)?,
            }
        }
        state.advance(&step.spans)?;
        if step.logits_for.is_empty() {
            return Ok(None);
        }
        // Only the sampled rows pay for the norm and the vocabulary projection.
        let rows: Vec<u32> = step.logits_for.iter().map(|&i| i as u32).collect();
        let x = x.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
        let eps = self.spec.norms.eps as f32;
        if let Some((_, head)) = fused {
            return Ok(Some(head.forward(&x, eps, &self.scratch)?));
        }
        let x = candle_nn::ops::rms_norm(&x, &self.norm, eps)?;
        let mut logits = self.lm_head.forward(&x)?;
        if let Some(s) = self.spec.logit_scale {
            logits = (logits * f64::from(s))?;
        }
        Ok(Some(match self.spec.final_softcap {
            Some(cap) => ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?,
            None => logits,
        }))
    }

    /// Each token's position.
    fn positions(&self, step: &Step<'_>) -> Result<Vec<u32>> {
        let total: usize = step.spans.iter().map(|s| s.n_tokens).sum();
        if total != step.tokens.len() || total == 0 {
            return Err(Error::Input(format!(
                "step has {} tokens but its spans cover {total}",
                step.tokens.len()
            )));
        }
        if let Some(&bad) = step.logits_for.iter().find(|&&i| i >= total) {
            return Err(Error::Input(format!(
                "logits asked for token {bad} of {total}"
            )));
        }
        let context = self.context;
        let mut positions = Vec::with_capacity(total);
        for span in step.spans.iter() {
            let end = span.start_pos + span.n_tokens;
            if end > context {
                return Err(Error::Input(format!(
                    "position {} is past the model's context of {context}",
                    end - 1,
                )));
            }
            positions.extend((span.start_pos..end).map(|p| p as u32));
        }
        Ok(positions)
    }

    /// Layer `index`'s attention of `q` over its group's cache, by the
    /// step's spans.
    fn attend(&self, q: &Tensor, index: usize, ctx: &LayerCtx<'_>) -> Result<Tensor> {
        let (s, a) = (&self.spec, self.attention_spec(index)?);
        let (group, local) = ctx.kv.group_of(index)?;
        let at = LayerAttn {
            layer: local,
            group,
            heads: Heads {
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
            },
            params: AttnParams {
                scale: a.scale,
                softcap: a.softcap,
                window: a.window,
            },
        };
        let tables = ctx.tables[group].as_ref();
        let cache = ctx.kv.cache(group);
        let sinks = match &self.layers[index] {
            Block::Attention(l) => l.sinks.as_ref(),
            Block::Ssm(_) => None,
        };
        attention(
            q,
            cache,
            at,
            ctx.spans,
            (tables, sinks),
            self.fused_attention,
        )
    }

    /// Layer `index`'s attention kind.
    fn attention_spec(&self, index: usize) -> Result<&crate::spec::AttentionSpec> {
        self.spec
            .layers
            .get(index)
            .and_then(|l| l.attention())
            .ok_or_else(|| Error::Config(format!("layer {index} is not an attention layer")))
    }

    /// Layer `index`'s RoPE rows for this step.
    fn rope_rows<'c>(
        &self,
        index: usize,
        ctx: &'c LayerCtx<'_>,
    ) -> Result<(&'c Tensor, &'c Tensor)> {
        let (cos, sin) = &ctx.rope_rows[self.attention_spec(index)?.rope];
        Ok((cos, sin))
    }

    /// A recurrent layer: `x + mixer(norm(x))`, then its feed-forward where
    /// it has one.
    fn ssm_layer_forward(
        &self,
        index: usize,
        l: &SsmLayer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let s = &self.spec;
        let eps = s.norms.eps as f32;
        let h = candle_nn::ops::rms_norm(x, &l.norm, eps)?;
        let at = (index, &ctx.spans[..], ctx.state);
        let m = match (&l.mixer, &s.layers[index].mixer) {
            (RecurrentMixer::Mamba2(w), Mixer::Mamba2(spec)) => w.forward(spec, eps, &h, at)?,
            (RecurrentMixer::GatedDeltaNet(w), Mixer::GatedDeltaNet(spec)) => {
                w.forward(spec, eps, &h, at)?
            }
            _ => {
                return Err(Error::Config(format!(
                    "layer {index}: its weights are not its kind's"
                )));
            }
        };
        let x = (x + self.residual(m)?)?;
        let Some((norm, ffn)) = &l.ffn else {
            return Ok(x);
        };
        let h = candle_nn::ops::rms_norm(&x, norm, eps)?;
        let d = self.ffn_forward(index, ffn, &h, ctx)?;
        Ok((x + self.residual(d)?)?)
    }

    /// A mixer's or feed-forward's output as the residual stream adds it.
    fn residual(&self, out: Tensor) -> Result<Tensor> {
        Ok(match self.spec.residual_scale {
            Some(s) => (out * f64::from(s))?,
            None => out,
        })
    }

    /// Layer `index`'s feed-forward of `h` (normed).
    fn ffn_forward(
        &self,
        index: usize,
        ffn: &Ffn,
        h: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let s = &self.spec;
        let hook = |targets: &[Target], x: &Tensor, out: Tensor| ctx.lora(targets, index, x, out);
        match (ffn, s.layers[index].ffn) {
            (Ffn::Dense(m), FeedForward::Gated(act)) => {
                m.forward_hooked(h, s.intermediate, act, &hook)
            }
            (Ffn::Moe(m), FeedForward::Moe(_)) => crate::ffn::moe::forward(m, h),
            _ => Err(Error::Config(format!(
                "layer {index}: its weights are not its kind's"
            ))),
        }
    }

    /// The op-by-op layer: the reference, and the path of every device
    /// without the fused one.
    fn layer_forward(
        &self,
        index: usize,
        l: &Layer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let s = &self.spec;
        let tokens = x.dims()[0];
        let (q_dim, kv_dim) = (s.q_dim(), s.kv_dim());
        let eps = s.norms.eps as f32;
        let norm = |t: &Tensor, w: &Tensor| candle_nn::ops::rms_norm(t, w, eps);
        let h = norm(x, &l.attn_norm)?;
        let mut qkv = l.qkv.forward(&h)?;
        if let Some(b) = &l.qkv_bias {
            qkv = qkv.broadcast_add(b)?;
        }
        let qkv = ctx.lora(&[Target::Q, Target::K, Target::V], index, &h, qkv)?;
        let (mut q, gate, mut k, v) = self.split_qkv(index, &qkv)?;
        if let Some((qn, kn)) = &l.qk_norm {
            (q, k) = (norm(&q.contiguous()?, qn)?, norm(&k.contiguous()?, kn)?);
        }
        let (cos, sin) = self.rope_rows(index, ctx)?;
        let (q, k) = match self.attention_spec(index)?.nope {
            true => (q.contiguous()?, k),
            false => (Rope::apply(&q, cos, sin)?, Rope::apply(&k, cos, sin)?),
        };
        let k = k.contiguous()?.reshape((tokens, kv_dim))?;
        ctx.kv.write(index, ctx.slot_index, &k, &v)?;
        let mut a = self.attend(&q, index, ctx)?;
        if let Some(gate) = gate {
            let gate = candle_nn::ops::sigmoid(&gate.reshape((tokens, q_dim))?)?;
            let gate = gate.to_dtype(a.dtype())?;
            a = (a * gate)?;
        }
        let mut a = ctx.lora(&[Target::O], index, &a, l.o.forward(&a)?)?;
        if let Some(b) = &l.o_bias {
            a = a.broadcast_add(b)?;
        }
        if let Some(w) = &l.post_attn_norm {
            a = norm(&a, w)?;
        }
        let x = (x + self.residual(a)?)?;
        let h = norm(&x, &l.ffn_norm)?;
        let mut d = self.ffn_forward(index, &l.ffn, &h, ctx)?;
        if let Some(w) = &l.post_ffn_norm {
            d = norm(&d, w)?;
        }
        Ok((x + self.residual(d)?)?)
    }

    /// Layer `index`'s `(q (tokens, heads, head_dim), its output gate
    /// (tokens, heads, head_dim) where the layer is gated, k (tokens,
    /// kv_heads, head_dim), v (tokens, kv_dim))` from its projections.
    fn split_qkv(&self, index: usize, qkv: &Tensor) -> Result<QkvParts> {
        let s = &self.spec;
        let tokens = qkv.dim(0)?;
        let (q_dim, kv_dim) = (s.q_dim(), s.kv_dim());
        let gated = self.attention_spec(index)?.gated;
        // A gated projection's rows: each head's query, then its gate.
        let q_rows = if gated { 2 * q_dim } else { q_dim };
        let per_head = qkv
            .narrow(1, 0, q_rows)?
            .reshape((tokens, s.heads, q_rows / s.heads))?;
        let q = per_head.narrow(2, 0, s.head_dim)?;
        let gate = match gated {
            true => Some(per_head.narrow(2, s.head_dim, s.head_dim)?.contiguous()?),
            false => None,
        };
        let k = qkv
            .narrow(1, q_rows, kv_dim)?
            .reshape((tokens, s.kv_heads, s.head_dim))?;
        let v = qkv.narrow(1, q_rows + kv_dim, kv_dim)?;
        Ok((q, gate, k, v))
    }

    /// The fused CPU layer: updates the residual stream `x` in place.
    fn fused_layer_forward(
        &self,
        index: usize,
        l: &FusedLayer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<()> {
        let s = &self.spec;
        let tokens = x.dims()[0];
        let (q_dim, kv_dim) = (s.q_dim(), s.kv_dim());
        let dims = self.dims();
        let rows = self.rope_rows(index, ctx)?;
        let lora = ctx.lora.map(|step| (step, index));
        let qkv = l.qkv(x, rows, dims, lora, &self.scratch)?;
        // Contiguous sections: views, no copies.
        let q = qkv
            .narrow(0, 0, tokens * q_dim)?
            .reshape((tokens, s.heads, s.head_dim))?;
        let k = qkv
            .narrow(0, tokens * q_dim, tokens * kv_dim)?
            .reshape((tokens, kv_dim))?;
        let v = qkv
            .narrow(0, tokens * (q_dim + kv_dim), tokens * kv_dim)?
            .reshape((tokens, kv_dim))?;
        ctx.kv.write(index, ctx.slot_index, &k, &v)?;
        let a = self.attend(&q, index, ctx)?;
        l.attn_out(x, &a, dims.eps, lora, &self.scratch)?;
        l.mlp(x, dims, lora, &self.scratch)
    }
}

/// A layer's queries, their output gate where it has one, keys, values.
type QkvParts = (Tensor, Option<Tensor>, Tensor, Tensor);

/// What every layer of a step shares.
struct LayerCtx<'a> {
    kv: &'a KvStore,
    state: &'a StateStore,
    spans: &'a Arc<[SeqSpan]>,
    /// Per KV group: its tables on the device, where a kernel reads them.
    tables: &'a [Option<Arc<StepTables>>],
    /// Per RoPE kind: this step's `(cos, sin)` rows.
    rope_rows: &'a [(Tensor, Tensor)],
    /// Per KV group: this step's slot index.
    slot_index: &'a [Tensor],
    lora: Option<&'a LoraStep<'a>>,
}

impl LayerCtx<'_> {
    /// The LoRA hook of the op-by-op path: `out` (the base projections
    /// `targets` of `x`, concatenated) plus each row's adapter update.
    fn lora(&self, targets: &[Target], layer: usize, x: &Tensor, out: Tensor) -> Result<Tensor> {
        match self.lora {
            Some(step) => step.add(targets, layer, x, out),
            None => Ok(out),
        }
    }
}
