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

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    /// RMSNorm before attention.
    pub attn_norm: Tensor,
    /// `[q | k | v]` projection.
    pub qkv: Projection,
    /// Concatenated q, k, v biases (Qwen2).
    pub qkv_bias: Option<Tensor>,
    /// Attention output projection.
    pub o: Linear,
    /// RMSNorm before the MLP.
    pub ffn_norm: Tensor,
    /// `[gate | up]` projection.
    pub gate_up: Projection,
    /// MLP down projection.
    pub down: Linear,
}

impl Layer {
    pub(crate) fn held_bytes(&self) -> u64 {
        let bias = self.qkv_bias.as_ref().map_or(0, tensor_bytes);
        tensor_bytes(&self.attn_norm)
            + tensor_bytes(&self.ffn_norm)
            + bias
            + self.qkv.held_bytes()
            + self.o.held_bytes()
            + self.gate_up.held_bytes()
            + self.down.held_bytes()
    }
}
