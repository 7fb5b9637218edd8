//! One decoder layer's weights, and the projections that read one input.

use candle_core::Tensor;

use crate::error::Result;
use crate::ffn::moe::MoeWeights;
use crate::gdn::GdnWeights;
use crate::linear::{Linear, tensor_bytes};
use crate::lora::Target;
use crate::projection::Projection;
use crate::spec::Activation;
use crate::ssm::Mamba2Weights;

/// The op-by-op LoRA hook: `(targets, input, output)` to the output plus
/// each row's adapter update.
pub(crate) type LoraHook<'a> = dyn Fn(&[Target], &Tensor, Tensor) -> Result<Tensor> + 'a;

/// A gated MLP's weights: a dense layer's, or one expert's.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// `[gate | up]` projection.
    pub gate_up: Projection,
    /// Down projection.
    pub down: Linear,
    /// `[gate | up]` biases (gpt-oss's experts).
    pub gate_up_bias: Option<Tensor>,
    /// Down bias.
    pub down_bias: Option<Tensor>,
}

impl Mlp {
    /// The MLP of width `inter` over `h` `(tokens, hidden)`, op by op.
    pub(crate) fn forward(&self, h: &Tensor, inter: usize, act: Activation) -> Result<Tensor> {
        self.forward_hooked(h, inter, act, &|_, _, out| Ok(out))
    }

    /// [`Mlp::forward`] with a LoRA hook: `hook(targets, input, output)`
    /// returns a projection's output plus each row's adapter update.
    pub(crate) fn forward_hooked(
        &self,
        h: &Tensor,
        inter: usize,
        act: Activation,
        hook: &LoraHook<'_>,
    ) -> Result<Tensor> {
        let mut gu = hook(&[Target::Gate, Target::Up], h, self.gate_up.forward(h)?)?;
        if let Some(b) = &self.gate_up_bias {
            gu = gu.broadcast_add(b)?;
        }
        let a = activate(&gu, inter, act)?;
        let mut d = hook(&[Target::Down], &a, self.down.forward(&a)?)?;
        if let Some(b) = &self.down_bias {
            d = d.broadcast_add(b)?;
        }
        Ok(d)
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        self.gate_up.held_bytes()
            + self.down.held_bytes()
            + opt(&self.gate_up_bias)
            + opt(&self.down_bias)
    }
}

/// `act(gate) * up` of `gu` `(tokens, 2 * inter)` (`[gate | up]`).
pub(crate) fn activate(gu: &Tensor, inter: usize, act: Activation) -> Result<Tensor> {
    let (gate, up) = (gu.narrow(1, 0, inter)?, gu.narrow(1, inter, inter)?);
    Ok(match act {
        Activation::Silu => (candle_nn::ops::silu(&gate)? * up)?,
        Activation::GeluTanh => (gate.gelu()? * up)?,
        Activation::SwigluOai { alpha, limit } => {
            let limit = f64::from(limit);
            let gate = gate.minimum(limit)?;
            let up = up.clamp(-limit, limit)?;
            let glu = (&gate * candle_nn::ops::sigmoid(&(&gate * f64::from(alpha))?)?)?;
            ((up + 1.0)? * glu)?
        }
    })
}

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
