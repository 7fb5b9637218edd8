//! The input of the first layer beyond the token embeddings, as the
//! model's [`InputSpec`] says: learned absolute positions, the token-type
//! embedding and a norm of their sum (an encoder's); nothing for a decoder.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::linear::{Embedding, tensor_bytes};
use crate::spec::{InputSpec, ModelSpec};
use crate::weights::source::WeightSource;

/// The input's weights beyond the token embeddings.
#[derive(Debug, Clone, Default)]
pub struct InputWeights {
    /// Rows by position (plus the spec's offset).
    positions: Option<Embedding>,
    /// Token type 0's row, `(1, hidden)`: every token's segment.
    token_type: Option<Tensor>,
    /// The norm of the sum: weight and bias.
    norm: Option<(Tensor, Option<Tensor>)>,
}

impl InputWeights {
    /// What `spec.input` names, by GGUF names (`position_embd`,
    /// `token_types`, `token_embd_norm`).
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        spec: &ModelSpec,
        device: &Device,
    ) -> Result<Self> {
        let InputSpec {
            positions,
            token_types,
            norm,
        } = spec.input;
        let hidden = spec.hidden;
        let positions = positions
            .map(|offset| {
                let rows = spec.context.saturating_add(offset);
                src.embedding("position_embd.weight", rows, hidden, device)
            })
            .transpose()?;
        let token_type = match token_types {
            0 => None,
            n => {
                let table = src.embedding("token_types.weight", n, hidden, device)?;
                Some(table.forward(&[0], device)?)
            }
        };
        let norm = match norm {
            true => Some(crate::norm::load(
                src,
                spec,
                "token_embd_norm.weight",
                hidden,
                device,
            )?),
            false => None,
        };
        Ok(InputWeights {
            positions,
            token_type,
            norm,
        })
    }

    /// The first layer's input: token embeddings `x` `(tokens, hidden)`
    /// plus each token's position row (`positions`) and the type row,
    /// normed.
    pub(crate) fn apply(
        &self,
        x: Tensor,
        positions: &[u32],
        spec: &ModelSpec,
        device: &Device,
    ) -> Result<Tensor> {
        let mut x = x;
        if let (Some(table), Some(offset)) = (&self.positions, spec.input.positions) {
            let rows: Vec<u32> = positions.iter().map(|&p| p + offset as u32).collect();
            let dtype = x.dtype();
            x = (x + table.forward(&rows, device)?.to_dtype(dtype)?)?;
        }
        if let Some(t) = &self.token_type {
            x = x.broadcast_add(&t.to_dtype(x.dtype())?)?;
        }
        if let Some((w, b)) = &self.norm {
            x = crate::norm::apply(&x, w, b.as_ref(), &spec.norms)?;
        }
        Ok(x)
    }

    /// Bytes held.
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        let norm = self
            .norm
            .as_ref()
            .map_or(0, |(w, b)| tensor_bytes(w) + opt(b));
        self.positions.as_ref().map_or(0, Embedding::held_bytes) + opt(&self.token_type) + norm
    }
}
