//! The one decoder every family runs, written for batching: every token of a
//! step carries its own position and its sequence's block tables (one per KV
//! group), so prefill chunks and decode rows of many sequences run through
//! one forward pass, and logits are computed only for the rows that will be
//! sampled. What differs between families is the [`ModelSpec`] it reads.

use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};
use ferrox_plan::KvDtype;

use crate::error::{Error, Result};
use crate::fused::{Dims, FusedAttention, FusedHead, FusedLayer, Scratch};
use crate::input::InputWeights;
use crate::kv_store::KvStore;
use crate::layer::{Ffn, Layer, MixerWeights};
use crate::linear::{Embedding, Linear, tensor_bytes};
use crate::lora::LoraStep;
use crate::mixer::attention::forward::AttentionWeights;
use crate::mixer::attention::paged::Heads;
use crate::rope::Rope;
use crate::seq_span::SeqSpan;
use crate::spec::{AttentionSpec, KvGroup, Mixer, ModelSpec, QueryTemperature};
use crate::state_store::StateStore;
use layer_range::{Kept, Run};
use op_by_op::LayerCtx;

mod layer_range;
mod op_by_op;

/// The whole decoder.
#[derive(Debug)]
pub struct Decoder {
    spec: ModelSpec,
    groups: Vec<KvGroup>,
    embed: Embedding,
    /// Positions, token types and a norm of the input (an encoder's).
    input: InputWeights,
    layers: Vec<Layer>,
    /// The final norm's weight and bias (none in BERT).
    norm: Option<(Tensor, Option<Tensor>)>,
    lm_head: Linear,
    /// One table per RoPE kind of the spec.
    ropes: Vec<Rope>,
    /// Positions served (`--max-model-len`, at most the trained context).
    context: usize,
    device: Device,
    fused_attention: bool,
    /// The CPU fast path, when every matrix is packed: one per layer, the head.
    /// The fused CPU path: each layer's fused form where it has one (the
    /// rest run op by op), and the head.
    fused: Option<(Vec<Option<FusedLayer>>, FusedHead)>,
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
    /// Each token's type (an encoder's segment: a cross-encoder's
    /// document is type 1); `None` is type 0 for every token.
    pub token_types: Option<&'a [u32]>,
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
    /// Assembles a decoder from loaded weights: the token embeddings and
    /// what the input adds to them, the layers, the final norm, the head.
    pub fn new(
        spec: ModelSpec,
        (embed, input): (Embedding, InputWeights),
        layers: Vec<Layer>,
        norm: Option<(Tensor, Option<Tensor>)>,
        lm_head: Linear,
        device: &Device,
    ) -> Result<Self> {
        let ropes = ropes(&spec, spec.context, device)?;
        // Each layer with a packed feed-forward (and its attention where
        // plain) takes the fused path; the others run op by op.
        let fused_layers = layers
            .iter()
            .zip(&spec.layers)
            .map(|(l, s)| FusedLayer::from_layer(l, s))
            .collect::<Result<Vec<_>>>()?;
        let fused_layers = Some(fused_layers).filter(|l| l.iter().any(Option::is_some));
        let head = match &norm {
            Some((w, None)) => FusedHead::new(w, &lm_head, spec.final_softcap)?,
            _ => None,
        };
        // Nor Granite's multipliers, nor LayerNorms or post-LN: those
        // models run op by op.
        // Nor Gemma 4's per-layer inputs, output scales or MLPs of
        // several widths.
        let plain = spec.residual_scale.is_none()
            && !spec.norms.layer_norm
            && !spec.norms.after_residual
            && spec.logit_scale.is_none()
            && spec.per_layer_input.is_none()
            && !spec.layer_out_scale
            && spec.ffn_widths.is_empty();
        let fused = match (fused_layers, head) {
            (Some(l), Some(h)) if device.is_cpu() && plain => Some((l, h)),
            _ => None,
        };
        let spec_context = spec.context;
        Ok(Decoder {
            groups: spec.kv_groups(),
            spec,
            embed,
            input,
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

    /// The kinds of cache the model's layers keep, in pool order: each KV
    /// group's, then the state slots' when it has recurrent layers.
    pub fn cache_kinds(&self) -> Vec<ferrox_plan::CacheKind> {
        let kv = self.groups.iter().map(KvGroup::kind);
        let recurrent = self.spec.layers.iter().any(|l| l.state_values().is_some());
        let state = recurrent.then_some(ferrox_plan::CacheKind::State);
        kv.chain(state).collect()
    }

    /// Serves positions `0..context` only (the server's `--max-model-len`):
    /// smaller RoPE tables, and LongRoPE's factors chosen for that context.
    pub fn set_context(&mut self, context: usize) -> Result<()> {
        self.context = context.clamp(1, self.spec.context);
        self.ropes = ropes(&self.spec, self.context, &self.device)?;
        Ok(())
    }

    /// Positions served (`--max-model-len`, at most the trained context).
    pub fn context(&self) -> usize {
        self.context
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
        let norm = self.norm.as_ref().map_or(0, |(w, b)| {
            tensor_bytes(w) + b.as_ref().map_or(0, tensor_bytes)
        });
        self.embed.held_bytes()
            + self.input.held_bytes()
            + self.layers.iter().map(Layer::held_bytes).sum::<u64>()
            + norm
            + head
    }

    /// Per layer, how often each of its experts was read (empty for a
    /// dense layer): an expert no token chose is never read.
    pub fn expert_reads(&self) -> Vec<Vec<u64>> {
        self.layers
            .iter()
            .map(|l| match l.ffn() {
                Some(Ffn::Moe(m)) => m.reads.counts(),
                Some(Ffn::DenseAndMoe(m)) => m.moe.reads.counts(),
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

    /// Whether steps run our paged-attention kernel (else the gather path).
    pub fn fused_attention(&self) -> bool {
        self.fused_attention
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

    /// The KV cache of this model, held in `dtype`: each group of
    /// [`Decoder::kv_groups`] gets the blocks of its kind's pool in `pools`.
    pub fn kv_store(
        &self,
        pools: &[ferrox_core::Pool],
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<KvStore> {
        let s = &self.spec;
        // A latent cache keeps its one vector a token as K alone.
        let values = s.latent_width().is_none();
        let dims = s.group_kv_dims();
        KvStore::with_widths(
            &self.groups,
            s.layers.len(),
            pools,
            (block_size, dims.as_slice(), values),
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
        let (x, logits_for) = self.run_layers(kv, state, (step, true))?;
        if logits_for.is_empty() {
            return Ok(None);
        }
        let head = self.fused.as_ref().filter(|_| self.use_fused);
        let head = head.map(|(_, head)| head);
        Ok(Some(self.logits(&x, &logits_for, head)?))
    }

    /// Runs `step` as [`Decoder::forward`] does and returns every token's
    /// last hidden state `(tokens, hidden)`, after the final norm where the
    /// model has one: what a pooling model pools.
    pub fn hidden(&self, kv: &KvStore, state: &StateStore, step: &Step<'_>) -> Result<Tensor> {
        let (x, _) = self.run_layers(kv, state, (step, false))?;
        match &self.norm {
            Some((w, b)) => crate::norm::apply(&x, w, b.as_ref(), &self.spec.norms),
            None => Ok(x),
        }
    }

    /// The residual stream after the last layer, `(tokens, hidden)`; where
    /// `narrow`, the model's last layers keep no KV (Gemma 4's shared-KV
    /// layers) and no LoRA runs, only the rows whose logits are wanted (and
    /// the rest of their spans) run through those layers: with the rows
    /// kept, `(kept, hidden)` and `logits_for` among them.
    fn run_layers(
        &self,
        kv: &KvStore,
        state: &StateStore,
        (step, narrow): (&Step<'_>, bool),
    ) -> Result<(Tensor, Vec<usize>)> {
        let positions = self.positions(step)?;
        state.check(&step.spans)?;
        let slot_index = kv.slot_indices(&step.spans, &self.device)?;
        let mut x = self.embed.forward(step.tokens, &self.device)?;
        if let Some(scale) = self.spec.embed_scale {
            x = (x * f64::from(scale))?;
        }
        let x = (self.input).apply(x, &positions, step.token_types, &self.spec, &self.device)?;
        let per_layer = (self.input).per_layer_inputs(step.tokens, &x, &self.spec, &self.device)?;
        let tail = self
            .spec
            .kv_shared_tail()
            .filter(|_| narrow && step.lora.is_none());
        let all = self.layers.len();
        let run = Run {
            kv,
            state,
            lora: step.lora,
            slot_index: &slot_index,
        };
        let at = (step.spans.clone(), positions.as_slice());
        let x = self.run_range(0..tail.unwrap_or(all), x, &run, at, per_layer.as_ref())?;
        let (x, logits_for) = match tail {
            Some(first) => {
                let kept = Kept::of(&step.spans, step.logits_for);
                match kept.rows.is_empty() {
                    true => (x, Vec::new()),
                    false => {
                        let (x, per_layer, positions) = kept.select(x, per_layer, &positions)?;
                        let at = (kept.spans.clone(), positions.as_slice());
                        let x = self.run_range(first..all, x, &run, at, per_layer.as_ref())?;
                        (x, kept.logits_for)
                    }
                }
            }
            None => (x, step.logits_for.to_vec()),
        };
        state.advance(&step.spans)?;
        Ok((x, logits_for))
    }

    /// Logits `(rows.len(), vocab)` of the residual stream `x`'s `rows`,
    /// through the fused head where there is one.
    fn logits(&self, x: &Tensor, rows: &[usize], fused: Option<&FusedHead>) -> Result<Tensor> {
        // Only the sampled rows pay for the norm and the vocabulary projection.
        let rows: Vec<u32> = rows.iter().map(|&i| i as u32).collect();
        let x = x.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
        let eps = self.spec.norms.eps as f32;
        if let Some(head) = fused {
            return head.forward(&x, eps, &self.scratch);
        }
        let x = match &self.norm {
            Some((w, b)) => crate::norm::apply(&x, w, b.as_ref(), &self.spec.norms)?,
            None => x,
        };
        let mut logits = self.lm_head.forward(&x)?;
        if let Some(s) = self.spec.logit_scale {
            logits = (logits * f64::from(s))?;
        }
        Ok(match self.spec.final_softcap {
            Some(cap) => ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?,
            None => logits,
        })
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

    /// Per distinct query temperature of the model's attention layers, its
    /// factor at each of the step's `positions`: made once a step, read by
    /// every layer of that kind.
    fn query_scales(&self, positions: &[u32]) -> Result<Vec<(QueryTemperature, Tensor)>> {
        let mut out: Vec<(QueryTemperature, Tensor)> = Vec::new();
        let kinds = self.spec.layers.iter().filter_map(|l| l.any_attention());
        for t in kinds.filter_map(|a| a.temperature) {
            if !out.iter().any(|(k, _)| *k == t) {
                out.push((t, t.factors(positions, &self.device)?));
            }
        }
        Ok(out)
    }

    /// The head layout of the model's attention.
    fn heads(&self) -> Heads {
        Heads {
            heads: self.spec.heads,
            kv_heads: self.spec.kv_heads,
            head_dim: self.spec.head_dim,
        }
    }

    /// Layer `index`'s attention: its weights and its kind.
    fn attention(&self, index: usize) -> Result<(&AttentionWeights, &AttentionSpec)> {
        match (&self.layers[index].mixer, &self.spec.layers[index].mixer) {
            (MixerWeights::Attention(w), Mixer::Attention(a)) => Ok((w, a)),
            _ => Err(Error::Config(format!(
                "layer {index} is not an attention layer"
            ))),
        }
    }

    /// The fused CPU layer: its attention (or its mixer op by op, where
    /// that is not plain attention), then its feed-forward on the residual
    /// stream in place.
    fn fused_layer_forward(
        &self,
        index: usize,
        (layer, l): (&Layer, &FusedLayer),
        x: Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let lora = ctx.lora.map(|step| (step, index));
        let x = match l.attention() {
            Some(a) => {
                self.fused_attention_forward(index, a, &x, ctx)?;
                x
            }
            None => self.mixer_block(index, layer, &x, ctx)?,
        };
        l.mlp(&x, self.dims(), lora, &self.scratch)?;
        Ok(x)
    }

    /// The fused attention half of a layer: updates `x` in place.
    fn fused_attention_forward(
        &self,
        index: usize,
        l: &FusedAttention,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<()> {
        let s = &self.spec;
        let tokens = x.dims()[0];
        let (q_dim, kv_dim) = (s.q_dim(), s.kv_dim());
        let dims = self.dims();
        let (w, a) = self.attention(index)?;
        let rows = ctx.attention.rope_rows(a);
        let lora = ctx.lora.map(|step| (step, index));
        let qkv = l.qkv(x, rows, dims, lora, &self.scratch)?;
        // Contiguous sections: views, no copies.
        let q = qkv
            .narrow(0, 0, tokens * q_dim)?
            .reshape((tokens, s.heads, s.head_dim))?;
        let q = ctx.attention.scale_queries(a, q)?;
        let k = qkv
            .narrow(0, tokens * q_dim, tokens * kv_dim)?
            .reshape((tokens, kv_dim))?;
        let v = qkv
            .narrow(0, tokens * (q_dim + kv_dim), tokens * kv_dim)?
            .reshape((tokens, kv_dim))?;
        let out = w.attend(a, &q, Some((&k, &v)), (index, &ctx.attention))?;
        l.attn_out(x, &out, dims.eps, lora, &self.scratch)
    }
}
