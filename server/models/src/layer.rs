//! One decoder layer's weights, and the projections that read one input.

use candle_core::Tensor;

use crate::error::Result;
use crate::linear::{Linear, tensor_bytes};

/// Linear layers that read the same input, run as one matmul where the
/// weights allow (their outputs are concatenated).
#[derive(Debug, Clone)]
pub enum Projection {
    /// One matrix holding all parts' rows.
    Fused(Linear),
    /// Separate matrices.
    Split(Vec<Linear>),
}

impl Projection {
    pub(crate) fn held_bytes(&self) -> u64 {
        match self {
            Projection::Fused(l) => l.held_bytes(),
            Projection::Split(parts) => parts.iter().map(Linear::held_bytes).sum(),
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Projection::Fused(l) => l.forward(x),
            Projection::Split(parts) => {
                let outs = parts
                    .iter()
                    .map(|l| l.forward(x))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Tensor::cat(&outs, 1)?)
            }
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
    /// RMSNorm of the attention output (Gemma).
    pub post_attn_norm: Option<Tensor>,
    /// RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// `[gate | up]` projection.
    pub gate_up: Projection,
    /// MLP down projection.
    pub down: Linear,
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
            + qk
            + self.qkv.held_bytes()
            + self.o.held_bytes()
            + self.gate_up.held_bytes()
            + self.down.held_bytes()
    }
}
