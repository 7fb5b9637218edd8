//! One decoder layer's weights: a token mixer and a feed-forward, each of
//! its kind (the kinds own what is inside: `crate::mixer`, `crate::ffn`),
//! with the norms around them.

use candle_core::Tensor;

use crate::ffn::dense_and_moe::DenseAndMoe;
use crate::ffn::mlp::Mlp;
use crate::ffn::moe::weights::MoeWeights;
use crate::linear::tensor_bytes;
use crate::mixer::attention::forward::AttentionWeights;
use crate::mixer::gdn::forward::GdnWeights;
use crate::mixer::latent::forward::LatentWeights;
use crate::mixer::mamba2::forward::Mamba2Weights;
use crate::mixer::short_conv::forward::ShortConvWeights;
use crate::per_layer_input::PerLayerGate;

/// A token mixer's weights, by its kind.
#[derive(Debug, Clone)]
pub enum MixerWeights {
    /// Attention's.
    Attention(Box<AttentionWeights>),
    /// Latent attention's.
    Latent(Box<LatentWeights>),
    /// Mamba-2's.
    Mamba2(Box<Mamba2Weights>),
    /// Gated DeltaNet's.
    GatedDeltaNet(Box<GdnWeights>),
    /// LFM2's short convolution's.
    ShortConv(Box<ShortConvWeights>),
    /// An encoder's (attention's weights, attending within each sequence).
    Encoder(Box<AttentionWeights>),
    /// None: a layer of its feed-forward alone.
    None,
}

impl MixerWeights {
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            MixerWeights::Attention(a) | MixerWeights::Encoder(a) => a.held_bytes(),
            MixerWeights::Latent(l) => l.held_bytes(),
            MixerWeights::Mamba2(m) => m.held_bytes(),
            MixerWeights::GatedDeltaNet(g) => g.held_bytes(),
            MixerWeights::ShortConv(c) => c.held_bytes(),
            MixerWeights::None => 0,
        }
    }
}

/// A layer's feed-forward weights, by its kind.
#[derive(Debug, Clone)]
pub enum Ffn {
    /// One MLP, gated (its `gate_up` both) or plain (up alone).
    Dense(Mlp),
    /// A mixture of experts.
    Moe(Box<MoeWeights>),
    /// An MLP and experts side by side (Gemma 4).
    DenseAndMoe(Box<DenseAndMoe>),
}

impl Ffn {
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            Ffn::Dense(m) => m.held_bytes(),
            Ffn::Moe(m) => m.held_bytes(),
            Ffn::DenseAndMoe(m) => m.held_bytes(),
        }
    }
}

/// A feed-forward and its norms.
#[derive(Debug, Clone)]
pub struct FfnBlock {
    /// The norm before it (after its residual add, with post-LN); none
    /// where the family has only post-norms (OLMo 2).
    pub norm: Option<Tensor>,
    /// That norm's bias (a LayerNorm's).
    pub norm_bias: Option<Tensor>,
    /// The feed-forward.
    pub ffn: Ffn,
    /// RMSNorm of its output (Gemma).
    pub post_norm: Option<Tensor>,
}

/// One decoder layer's weights (norm weights with any `(1 + w)` offset
/// already added).
#[derive(Debug, Clone)]
pub struct Layer {
    /// The norm before the mixer (after its residual add, with post-LN);
    /// none where the family has only post-norms (OLMo 2), or where the
    /// layer's input is normed already (ModernBERT's first, right after the
    /// embeddings' norm).
    pub norm: Option<Tensor>,
    /// That norm's bias (a LayerNorm's).
    pub norm_bias: Option<Tensor>,
    /// The token mixer.
    pub mixer: MixerWeights,
    /// RMSNorm of the mixer's output (Gemma).
    pub post_norm: Option<Tensor>,
    /// The feed-forward, where the layer has one (a Mamba-2 block has none).
    pub ffn: Option<FfnBlock>,
    /// Its gate of the per-layer inputs (Gemma 4's E2B/E4B), after the
    /// feed-forward.
    pub per_layer: Option<PerLayerGate>,
    /// Its output multiplied by this, last (Gemma 4's `layer_scalar`).
    pub out_scale: Option<f64>,
}

impl Layer {
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        let ffn = self.ffn.as_ref().map_or(0, |f| {
            opt(&f.norm) + opt(&f.norm_bias) + f.ffn.held_bytes() + opt(&f.post_norm)
        });
        let norm = opt(&self.norm) + opt(&self.norm_bias);
        let per_layer = self.per_layer.as_ref().map_or(0, PerLayerGate::held_bytes);
        // The output scale as stored, one f32.
        let per_layer = per_layer + 4 * u64::from(self.out_scale.is_some());
        norm + self.mixer.held_bytes() + opt(&self.post_norm) + ffn + per_layer
    }

    /// The layer's feed-forward, if it has one.
    pub(crate) fn ffn(&self) -> Option<&Ffn> {
        self.ffn.as_ref().map(|f| &f.ffn)
    }
}
