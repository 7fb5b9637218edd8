//! The Llama-family decoder, written for batching: every token of a step
//! carries its own position and its sequence's block table, so prefill
//! chunks and decode rows of many sequences run through one forward pass,
//! and logits are computed only for the rows that will be sampled.

use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};
use ferrox_plan::KvDtype;

use crate::attention::{Heads, SeqSpan, StepTables, attention};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::fused::{Dims, FusedHead, FusedLayer, Scratch};
use crate::kv_groups::{KvGroup, canonical, kv_groups};
use crate::kv_store::KvStore;
use crate::layer::Layer;
use crate::linear::{Embedding, Linear, tensor_bytes};
use crate::rope::Rope;

/// The whole decoder.
#[derive(Debug)]
pub struct Llama {
    config: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
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
}

impl Llama {
    /// Assembles a decoder from loaded weights.
    pub fn new(
        config: ModelConfig,
        embed: Embedding,
        layers: Vec<Layer>,
        norm: Tensor,
        lm_head: Linear,
        device: &Device,
    ) -> Result<Self> {
        let factors = config.rope_freq_factors.as_deref();
        let rope = Rope::new(
            config.head_dim,
            config.rope_theta,
            config.context,
            factors,
            device,
        )?;
        let fused_layers = layers
            .iter()
            .map(FusedLayer::from_layer)
            .collect::<Result<Option<Vec<_>>>>()?;
        let fused = match (fused_layers, FusedHead::new(&norm, &lm_head)?) {
            (Some(l), Some(h)) if device.is_cpu() => Some((l, h)),
            _ => None,
        };
        Ok(Llama {
            config,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            device: device.clone(),
            fused_attention: true,
            fused,
            use_fused: true,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.config
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
            + self.layers.iter().map(Layer::held_bytes).sum::<u64>()
            + tensor_bytes(&self.norm)
            + head
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
        let c = &self.config;
        Dims {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate,
            eps: c.rms_eps as f32,
        }
    }

    /// The KV groups: the layers by attention kind, full attention first,
    /// then each window, smallest first.
    pub fn kv_groups(&self) -> Vec<KvGroup> {
        canonical(kv_groups(&self.config), self.config.context)
    }

    /// A KV cache for this model, held in `dtype`: group `g` of
    /// [`Llama::kv_groups`] gets `blocks[g]` blocks.
    pub fn kv_store(&self, blocks: &[usize], block_size: usize, dtype: KvDtype) -> Result<KvStore> {
        let c = &self.config;
        KvStore::new(
            &self.kv_groups(),
            c.layers,
            blocks,
            block_size,
            c.kv_dim(),
            dtype,
            &self.device,
        )
    }

    /// Runs `step`, writing its K/V into `kv`; returns logits
    /// `(logits_for.len(), vocab)`, or `None` when none were asked for.
    pub fn forward(&self, kv: &KvStore, step: &Step<'_>) -> Result<Option<Tensor>> {
        let positions = self.positions(step)?;
        let pos = Tensor::new(positions.as_slice(), &self.device)?;
        let (cos, sin) = self.rope.gather(&pos)?;
        let slot_index = kv.slot_indices(&step.spans, &self.device)?;
        let mut x = self.embed.forward(step.tokens, &self.device)?;
        let fused = self.fused.as_ref().filter(|_| self.use_fused);
        let tables = StepTables::for_step(&step.spans, kv, &self.device, self.fused_attention)?;
        let ctx = LayerCtx {
            kv,
            spans: &step.spans,
            tables: &tables,
            cos: &cos,
            sin: &sin,
            slot_index: &slot_index,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            match fused {
                Some((fl, _)) => self.fused_layer_forward(i, &fl[i], &x, &ctx)?,
                None => x = self.layer_forward(i, layer, &x, &ctx)?,
            }
        }
        if step.logits_for.is_empty() {
            return Ok(None);
        }
        // Only the sampled rows pay for the norm and the vocabulary projection.
        let rows: Vec<u32> = step.logits_for.iter().map(|&i| i as u32).collect();
        let x = x.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
        if let Some((_, head)) = fused {
            return Ok(Some(head.forward(
                &x,
                self.config.rms_eps as f32,
                &self.scratch,
            )?));
        }
        let x = candle_nn::ops::rms_norm(&x, &self.norm, self.config.rms_eps as f32)?;
        Ok(Some(self.lm_head.forward(&x)?))
    }

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
        let mut positions = Vec::with_capacity(total);
        for span in step.spans.iter() {
            let end = span.start_pos + span.n_tokens;
            if end > self.rope.context() {
                return Err(Error::Input(format!(
                    "position {} is past the model's context of {}",
                    end - 1,
                    self.rope.context()
                )));
            }
            positions.extend((span.start_pos..end).map(|p| p as u32));
        }
        Ok(positions)
    }

    fn layer_forward(
        &self,
        index: usize,
        l: &Layer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let tokens = x.dims()[0];
        let (q_dim, kv_dim) = (c.heads * c.head_dim, c.kv_dim());
        let eps = c.rms_eps as f32;
        let h = candle_nn::ops::rms_norm(x, &l.attn_norm, eps)?;
        let mut qkv = l.qkv.forward(&h)?;
        if let Some(b) = &l.qkv_bias {
            qkv = qkv.broadcast_add(b)?;
        }
        let q = qkv
            .narrow(1, 0, q_dim)?
            .reshape((tokens, c.heads, c.head_dim))?;
        let k = qkv
            .narrow(1, q_dim, kv_dim)?
            .reshape((tokens, c.kv_heads, c.head_dim))?;
        let v = qkv.narrow(1, q_dim + kv_dim, kv_dim)?;
        let q = Rope::apply(&q, ctx.cos, ctx.sin)?;
        let k = Rope::apply(&k, ctx.cos, ctx.sin)?.reshape((tokens, kv_dim))?;
        ctx.kv.write(index, ctx.slot_index, &k, &v)?;
        let a = self.attend(&q, index, ctx)?;
        let x = (x + l.o.forward(&a)?)?;
        let h = candle_nn::ops::rms_norm(&x, &l.ffn_norm, eps)?;
        let gu = l.gate_up.forward(&h)?;
        let gate = gu.narrow(1, 0, c.intermediate)?;
        let up = gu.narrow(1, c.intermediate, c.intermediate)?;
        let act = (candle_nn::ops::silu(&gate)? * up)?;
        Ok((x + l.down.forward(&act)?)?)
    }
}

impl Llama {
    /// The fused CPU layer: updates the residual stream `x` in place.
    fn fused_layer_forward(
        &self,
        index: usize,
        l: &FusedLayer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<()> {
        let c = &self.config;
        let tokens = x.dims()[0];
        let (q_dim, kv_dim) = (c.heads * c.head_dim, c.kv_dim());
        let dims = self.dims();
        let qkv = l.qkv(x, (ctx.cos, ctx.sin), dims, &self.scratch)?;
        // Contiguous sections: views, no copies.
        let q = qkv
            .narrow(0, 0, tokens * q_dim)?
            .reshape((tokens, c.heads, c.head_dim))?;
        let k = qkv
            .narrow(0, tokens * q_dim, tokens * kv_dim)?
            .reshape((tokens, kv_dim))?;
        let v = qkv
            .narrow(0, tokens * (q_dim + kv_dim), tokens * kv_dim)?
            .reshape((tokens, kv_dim))?;
        ctx.kv.write(index, ctx.slot_index, &k, &v)?;
        let a = self.attend(&q, index, ctx)?;
        l.attn_out(x, &a, &self.scratch)?;
        l.mlp(x, dims, &self.scratch)
    }
}

impl Llama {
    /// Layer `index`'s attention of `q` over the cache, by the step's spans.
    fn attend(&self, q: &Tensor, index: usize, ctx: &LayerCtx<'_>) -> Result<Tensor> {
        let c = &self.config;
        let heads = Heads {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        };
        attention(
            q,
            ctx.kv,
            index,
            ctx.spans,
            ctx.tables,
            heads,
            self.fused_attention,
        )
    }
}

struct LayerCtx<'a> {
    kv: &'a KvStore,
    spans: &'a Arc<[SeqSpan]>,
    /// Per KV group.
    tables: &'a [Option<Arc<StepTables>>],
    cos: &'a Tensor,
    sin: &'a Tensor,
    /// Per KV group: each token's slot.
    slot_index: &'a [Tensor],
}
