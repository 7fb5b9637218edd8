//! The op-by-op layer: the reference, and the path of every device (and
//! every layer kind) without the fused one. Each block's mixer and
//! feed-forward run by their kinds, with the norms around them where the
//! model has them (pre-norm, Gemma's post-norms, or BERT's post-LN).

use std::sync::Arc;

use candle_core::Tensor;

use super::Decoder;
use crate::error::{Error, Result};
use crate::layer::{Ffn, Layer, MixerWeights};
use crate::lora::{LoraStep, Target};
use crate::mixer::attention::forward::AttentionStep;
use crate::seq_span::SeqSpan;
use crate::spec::{FeedForward, Mixer};
use crate::state_store::StateStore;

impl Decoder {
    /// The op-by-op layer, `x + mixer(norm(x))` then `x + ffn(norm(x))`
    /// (each output through its post-norm where the family has one; with
    /// post-LN, `norm(x + mixer(x))` then `norm(x + ffn(x))`): the
    /// reference, and the path of every device without the fused one.
    pub(super) fn layer_forward(
        &self,
        index: usize,
        l: &Layer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let x = self.mixer_block(index, l, x, ctx)?;
        self.ffn_block(index, l, x, ctx)
    }

    /// `x + mixer(norm(x))` of layer `index` (through the mixer's post-norm
    /// where the family has one; post-LN: `norm(x + mixer(x))`), or `x`
    /// where the layer has no mixer (Nemotron-H's MLP layers).
    pub(super) fn mixer_block(
        &self,
        index: usize,
        l: &Layer,
        x: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        if matches!(l.mixer, MixerWeights::None) {
            return Ok(x.clone());
        }
        let post_ln = self.spec.norms.after_residual;
        let h = match post_ln {
            true => x.clone(),
            false => self.block_norm(x, l.norm.as_ref(), l.norm_bias.as_ref())?,
        };
        let mut m = self.mixer_forward(index, &l.mixer, &h, ctx)?;
        if let Some(w) = &l.post_norm {
            m = self.block_norm(&m, Some(w), None)?;
        }
        let x = (x + self.residual(m)?)?;
        match post_ln {
            true => self.block_norm(&x, l.norm.as_ref(), l.norm_bias.as_ref()),
            false => Ok(x),
        }
    }

    /// `x + ffn(norm(x))` of layer `index` (post-LN: `norm(x + ffn(x))`),
    /// or `x` where the layer has no feed-forward.
    fn ffn_block(&self, index: usize, l: &Layer, x: Tensor, ctx: &LayerCtx<'_>) -> Result<Tensor> {
        let Some(f) = &l.ffn else {
            return Ok(x);
        };
        let post_ln = self.spec.norms.after_residual;
        let h = match post_ln {
            true => x.clone(),
            false => self.block_norm(&x, f.norm.as_ref(), f.norm_bias.as_ref())?,
        };
        let mut d = self.ffn_forward(index, &f.ffn, (&x, &h), ctx)?;
        if let Some(w) = &f.post_norm {
            d = self.block_norm(&d, Some(w), None)?;
        }
        let x = (x + self.residual(d)?)?;
        match post_ln {
            true => self.block_norm(&x, f.norm.as_ref(), f.norm_bias.as_ref()),
            false => Ok(x),
        }
    }

    /// What follows layer `index`'s blocks: its gate of the per-layer
    /// inputs `per_layer` (`(tokens, layers, width)`), then its output
    /// scale, where it has them (Gemma 4).
    pub(super) fn layer_tail(
        &self,
        (index, l): (usize, &Layer),
        x: Tensor,
        per_layer: Option<&Tensor>,
    ) -> Result<Tensor> {
        let x = match (&l.per_layer, per_layer) {
            (Some(g), Some(inputs)) => g.apply(&x, (inputs, index), &self.spec)?,
            (None, _) => x,
            (Some(_), None) => {
                return Err(Error::Config(format!(
                    "layer {index}: no per-layer inputs for its gate"
                )));
            }
        };
        Ok(match l.out_scale {
            Some(s) => (x * s)?,
            None => x,
        })
    }

    /// `t` through a block's norm; a block without its input norm (OLMo 2)
    /// passes its input as is.
    fn block_norm(&self, t: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>) -> Result<Tensor> {
        match w {
            Some(w) => crate::norm::apply(t, w, b, &self.spec.norms),
            None => Ok(t.clone()),
        }
    }

    /// Layer `index`'s mixer of `h` (normed), by its kind.
    fn mixer_forward(
        &self,
        index: usize,
        mixer: &MixerWeights,
        h: &Tensor,
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let eps = self.spec.norms.eps as f32;
        let at = (index, &ctx.spans[..], ctx.state);
        match (mixer, &self.spec.layers[index].mixer) {
            (MixerWeights::Attention(w), Mixer::Attention(a)) => {
                let hook =
                    |targets: &[Target], x: &Tensor, out: Tensor| ctx.lora(targets, index, x, out);
                w.forward(a, h, (index, &ctx.attention), &hook)
            }
            // No LoRA targets here: adapters name plain attention's q/k/v/o.
            (MixerWeights::Latent(w), Mixer::Latent(m)) => w.forward(m, h, (index, &ctx.attention)),
            (MixerWeights::Mamba2(w), Mixer::Mamba2(s)) => w.forward(s, eps, h, at),
            (MixerWeights::GatedDeltaNet(w), Mixer::GatedDeltaNet(g)) => w.forward(g, eps, h, at),
            (MixerWeights::ShortConv(w), Mixer::ShortConv(c)) => w.forward(c, h, at),
            (MixerWeights::Encoder(w), Mixer::Encoder(e)) => {
                let hook =
                    |targets: &[Target], x: &Tensor, out: Tensor| ctx.lora(targets, index, x, out);
                crate::mixer::encoder::forward::forward(w, e, h, &ctx.attention, &hook)
            }
            _ => Err(Error::Config(format!(
                "layer {index}: its weights are not its kind's"
            ))),
        }
    }

    /// A mixer's or feed-forward's output as the residual stream adds it.
    fn residual(&self, out: Tensor) -> Result<Tensor> {
        Ok(match self.spec.residual_scale {
            Some(s) => (out * f64::from(s))?,
            None => out,
        })
    }

    /// Layer `index`'s feed-forward of `h`, the block's input `x` normed,
    /// by its kind (Gemma 4's experts read `x` through norms of their own).
    fn ffn_forward(
        &self,
        index: usize,
        ffn: &Ffn,
        (x, h): (&Tensor, &Tensor),
        ctx: &LayerCtx<'_>,
    ) -> Result<Tensor> {
        let s = &self.spec;
        let hook = |targets: &[Target], x: &Tensor, out: Tensor| ctx.lora(targets, index, x, out);
        match (ffn, s.layers[index].ffn) {
            (Ffn::Dense(m), FeedForward::Gated(act)) => {
                m.forward_hooked(h, s.ffn_width(index), act, &hook)
            }
            (Ffn::Dense(m), FeedForward::Plain(act)) => m.forward_plain(h, act),
            (Ffn::Moe(m), FeedForward::Moe(_)) => crate::ffn::moe::forward(m, h),
            (Ffn::DenseAndMoe(m), FeedForward::DenseAndMoe(_)) => {
                m.forward((x, h), s.ffn_width(index), s)
            }
            _ => Err(Error::Config(format!(
                "layer {index}: its weights are not its kind's"
            ))),
        }
    }
}

/// What every layer of a step shares.
pub(super) struct LayerCtx<'a> {
    /// What the attention layers share.
    pub(super) attention: AttentionStep<'a>,
    /// The recurrent layers' states.
    pub(super) state: &'a StateStore,
    pub(super) spans: &'a Arc<[SeqSpan]>,
    pub(super) lora: Option<&'a LoraStep<'a>>,
}

impl LayerCtx<'_> {
    /// The LoRA hook of the op-by-op path: `out` (the base projections
    /// `targets` of `x`, concatenated) plus each row's adapter update.
    pub(super) fn lora(
        &self,
        targets: &[Target],
        layer: usize,
        x: &Tensor,
        out: Tensor,
    ) -> Result<Tensor> {
        match self.lora {
            Some(step) => step.add(targets, layer, x, out),
            None => Ok(out),
        }
    }
}
