//! The input of the first layer beyond the token embeddings, as the
//! model's [`InputSpec`] says: learned absolute positions, the token-type
//! embedding and a norm of their sum (an encoder's); for a decoder, Gemma
//! 4's per-layer inputs where it has them.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::linear::{Embedding, tensor_bytes};
use crate::per_layer_input::PerLayerInputs;
use crate::spec::{InputSpec, ModelSpec};
use crate::weights::source::WeightSource;

/// The input's weights beyond the token embeddings.
#[derive(Debug, Clone, Default)]
pub struct InputWeights {
    /// Rows by position (plus the spec's offset).
    positions: Option<Embedding>,
    /// The token-type table and its type 0's row, `(1, hidden)`: every
    /// token's segment unless a step names each token's.
    token_type: Option<(Embedding, Tensor)>,
    /// The norm of the sum: weight and bias.
    norm: Option<(Tensor, Option<Tensor>)>,
    /// Gemma 4's per-layer inputs.
    per_layer: Option<PerLayerInputs>,
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
                let first = table.forward(&[0], device)?;
                Some((table, first))
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
            per_layer: PerLayerInputs::load(src, spec, device)?,
        })
    }

    /// The first layer's input: token embeddings `x` `(tokens, hidden)`
    /// plus each token's position row (`positions`) and its type's row
    /// (`types`, one a token; type 0 for every token when absent), normed.
    pub(crate) fn apply(
        &self,
        x: Tensor,
        positions: &[u32],
        types: Option<&[u32]>,
        spec: &ModelSpec,
        device: &Device,
    ) -> Result<Tensor> {
        let mut x = x;
        if let (Some(table), Some(offset)) = (&self.positions, spec.input.positions) {
            let rows: Vec<u32> = positions.iter().map(|&p| p + offset as u32).collect();
            let dtype = x.dtype();
            x = (x + table.forward(&rows, device)?.to_dtype(dtype)?)?;
        }
        match (&self.token_type, types) {
            (Some((table, _)), Some(types)) => {
                if types.len() != positions.len() {
                    return Err(crate::error::Error::Input(format!(
                        "{} token types for {} tokens",
                        types.len(),
                        positions.len()
                    )));
                }
                x = (&x + table.forward(types, device)?.to_dtype(x.dtype())?)?;
            }
            (Some((_, first)), None) => x = x.broadcast_add(&first.to_dtype(x.dtype())?)?,
            (None, _) => {}
        }
        if let Some((w, b)) = &self.norm {
            x = crate::norm::apply(&x, w, b.as_ref(), &spec.norms)?;
        }
        Ok(x)
    }

    /// Every layer's per-layer input of `tokens`, whose first layer's
    /// input is `x`, where the model has them: `(tokens, layers, width)`.
    pub(crate) fn per_layer_inputs(
        &self,
        tokens: &[u32],
        x: &Tensor,
        spec: &ModelSpec,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        (self.per_layer.as_ref())
            .map(|p| p.inputs(tokens, x, spec, device))
            .transpose()
    }

    /// Bytes held.
    pub(crate) fn held_bytes(&self) -> u64 {
        let per_layer = self
            .per_layer
            .as_ref()
            .map_or(0, PerLayerInputs::held_bytes);
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        let norm = self
            .norm
            .as_ref()
            .map_or(0, |(w, b)| tensor_bytes(w) + opt(b));
        let types =
            (self.token_type.as_ref()).map_or(0, |(t, first)| t.held_bytes() + tensor_bytes(first));
        self.positions.as_ref().map_or(0, Embedding::held_bytes) + types + norm + per_layer
    }
}
