//! Gemma 4's per-layer input embeddings (PLE): each token gets a small
//! vector for every layer, the mean of a row of a table of its own and a
//! normed projection of its embedding (made once a step), and each layer
//! gates its vector into its output (`x + norm(proj(act(gate(x)) * v))`).

use candle_core::{Device, IndexOp, Tensor};

use crate::error::Result;
use crate::linear::{Embedding, Linear, tensor_bytes};
use crate::projection::single;
use crate::spec::{ModelSpec, PerLayerInput};
use crate::weights::source::{WeightSource, norm};

/// The model's half: the table, the projection of the embeddings, its norm.
#[derive(Debug, Clone)]
pub struct PerLayerInputs {
    spec: PerLayerInput,
    /// `[vocab, layers * width]`.
    table: Embedding,
    /// `hidden -> layers * width`.
    proj: Linear,
    /// The projection's RMSNorm over one layer's `width`.
    norm: Tensor,
}

/// One layer's half: its gate, its projection back and their norm.
#[derive(Debug, Clone)]
pub struct PerLayerGate {
    /// `hidden -> width`.
    gate: Linear,
    /// `width -> hidden`.
    proj: Linear,
    /// RMSNorm of the projection's output.
    norm: Tensor,
}

impl PerLayerInputs {
    /// The model's tables where `spec` has per-layer inputs (GGUF names:
    /// `per_layer_token_embd`, `per_layer_model_proj`, `per_layer_proj_norm`).
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        spec: &ModelSpec,
        device: &Device,
    ) -> Result<Option<Self>> {
        let Some(p) = spec.per_layer_input else {
            return Ok(None);
        };
        let all = spec.layers.len() * p.width;
        let table = src.embedding("per_layer_token_embd.weight", p.vocab, all, device)?;
        let proj = src.projection(&[("per_layer_model_proj.weight", all)], spec.hidden, device)?;
        let norm = norm(src, spec, "per_layer_proj_norm.weight", p.width, device)?;
        Ok(Some(PerLayerInputs {
            spec: p,
            table,
            proj: single(proj),
            norm,
        }))
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        self.table.held_bytes() + self.proj.held_bytes() + tensor_bytes(&self.norm)
    }

    /// Every layer's vector for each of `tokens`, whose (scaled) embeddings
    /// are `x` `(tokens, hidden)`: `(tokens, layers, width)`.
    pub(crate) fn inputs(
        &self,
        tokens: &[u32],
        x: &Tensor,
        spec: &ModelSpec,
        device: &Device,
    ) -> Result<Tensor> {
        let (n, layers, width) = (tokens.len(), spec.layers.len(), self.spec.width);
        let own = self.table.forward(tokens, device)?;
        let own = (own * (width as f64).sqrt())?.reshape((n, layers, width))?;
        let projected = (self.proj.forward(x)? * (spec.hidden as f64).powf(-0.5))?;
        let projected = projected.reshape((n, layers, width))?;
        let projected = crate::norm::apply(&projected, &self.norm, None, &spec.norms)?;
        Ok(((projected + own)? * 0.5f64.sqrt())?)
    }
}

impl PerLayerGate {
    /// Layer `i`'s gate where `spec` has per-layer inputs (GGUF names:
    /// `inp_gate`, `proj`, `post_norm`).
    pub(crate) fn load(
        src: &mut dyn WeightSource,
        spec: &ModelSpec,
        i: usize,
        device: &Device,
    ) -> Result<Option<Self>> {
        let Some(p) = spec.per_layer_input else {
            return Ok(None);
        };
        let n = |t: &str| format!("blk.{i}.{t}");
        let gate = src.projection(&[(&n("inp_gate.weight"), p.width)], spec.hidden, device)?;
        let proj = src.projection(&[(&n("proj.weight"), spec.hidden)], p.width, device)?;
        Ok(Some(PerLayerGate {
            gate: single(gate),
            proj: single(proj),
            norm: norm(src, spec, &n("post_norm.weight"), spec.hidden, device)?,
        }))
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        self.gate.held_bytes() + self.proj.held_bytes() + tensor_bytes(&self.norm)
    }

    /// `x + norm(proj(act(gate(x)) * inputs[:, layer]))`, `inputs` from
    /// [`PerLayerInputs::inputs`].
    pub(crate) fn apply(
        &self,
        x: &Tensor,
        (inputs, layer): (&Tensor, usize),
        spec: &ModelSpec,
    ) -> Result<Tensor> {
        let Some(p) = spec.per_layer_input else {
            return Ok(x.clone());
        };
        let v = inputs.i((.., layer, ..))?;
        let g = p.activation.apply(&self.gate.forward(x)?)?;
        let h = self.proj.forward(&(g * v)?)?;
        let h = crate::norm::apply(&h, &self.norm, None, &spec.norms)?;
        Ok((x + h)?)
    }
}
