//! One decoder layer's weights.

use candle_core::Tensor;

use crate::ffn::mlp::Mlp;
use crate::ffn::moe::weights::MoeWeights;
use crate::linear::{Linear, tensor_bytes};
use crate::mixer::gdn::forward::GdnWeights;
use crate::mixer::mamba2::forward::Mamba2Weights;
use crate::projection::Projection;

/// A layer's feed-forward weights.
#[derive(Debug, Clone)]
pub enum Ffn {
    /// One gated MLP.
    Dense(Mlp),
    /// A mixture of experts.
    Moe(Box<MoeWeights>),
}

impl Ffn {
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            Ffn::Dense(m) => m.held_bytes(),
            Ffn::Moe(m) => m.held_bytes(),
        }
    }
}

/// One decoder layer's weights (norm weights with any `(1 + w)` offset
/// already added).
#[derive(Debug, Clone)]
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: Tensor,
    /// `[q | k | v]` projection.
    pub qkv: Projection,
    /// Concatenated q, k, v biases (Qwen2).
    pub qkv_bias: Option<Tensor>,
    /// Per-head RMSNorms of q and k, `head_dim` each (Qwen3, Gemma 3).
    pub qk_norm: Option<(Tensor, Tensor)>,
    /// Attention output projection.
    pub o: Linear,
    /// Its bias (gpt-oss).
    pub o_bias: Option<Tensor>,
    /// Per query head, the learned logit of an attention sink (gpt-oss).
    pub sinks: Option<Tensor>,
    /// RMSNorm of the attention output (Gemma).
    pub post_attn_norm: Option<Tensor>,
    /// RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// The feed-forward.
    pub ffn: Ffn,
    /// RMSNorm of the MLP output (Gemma).
    pub post_ffn_norm: Option<Tensor>,
}

impl Layer {
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        let qk = self
            .qk_norm
            .as_ref()
            .map_or(0, |(q, k)| tensor_bytes(q) + tensor_bytes(k));
        tensor_bytes(&self.attn_norm)
            + tensor_bytes(&self.ffn_norm)
            + opt(&self.qkv_bias)
            + opt(&self.post_attn_norm)
            + opt(&self.post_ffn_norm)
            + opt(&self.o_bias)
            + opt(&self.sinks)
            + qk
            + self.qkv.held_bytes()
            + self.o.held_bytes()
            + self.ffn.held_bytes()
    }
}

/// A recurrent mixer's weights.
#[derive(Debug, Clone)]
pub enum RecurrentMixer {
    /// Mamba-2's.
    Mamba2(Mamba2Weights),
    /// Gated DeltaNet's.
    GatedDeltaNet(GdnWeights),
}

impl RecurrentMixer {
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            RecurrentMixer::Mamba2(m) => m.held_bytes(),
            RecurrentMixer::GatedDeltaNet(g) => g.held_bytes(),
        }
    }
}

/// One recurrent layer's weights: its pre-norm, its mixer, and its
/// feed-forward with its own pre-norm where it has one (a hybrid's).
#[derive(Debug, Clone)]
pub struct SsmLayer {
    /// RMSNorm before the mixer.
    pub norm: Tensor,
    /// The recurrent mixer.
    pub mixer: RecurrentMixer,
    /// RMSNorm before the feed-forward, and the feed-forward.
    pub ffn: Option<(Tensor, Ffn)>,
}

/// One decoder layer, by its mixer.
#[derive(Debug, Clone)]
pub enum Block {
    /// Attention and a feed-forward.
    Attention(Box<Layer>),
    /// A recurrent mixer.
    Ssm(Box<SsmLayer>),
}

impl Block {
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            Block::Attention(l) => l.held_bytes(),
            Block::Ssm(l) => {
                let ffn = l
                    .ffn
                    .as_ref()
                    .map_or(0, |(n, f)| tensor_bytes(n) + f.held_bytes());
                tensor_bytes(&l.norm) + l.mixer.held_bytes() + ffn
            }
        }
    }

    /// The layer's feed-forward, if it has one.
    pub(crate) fn ffn(&self) -> Option<&Ffn> {
        match self {
            Block::Attention(l) => Some(&l.ffn),
            Block::Ssm(l) => l.ffn.as_ref().map(|(_, f)| f),
        }
    }
}
