//! Linear layers that read one input, held fused or split.

use candle_core::Tensor;

use crate::error::Result;
use crate::linear::Linear;

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

/// The matrix of a projection of one part.
pub(crate) fn single(p: Projection) -> Linear {
    match p {
        Projection::Fused(l) => l,
        Projection::Split(mut v) => v.remove(0),
    }
}
