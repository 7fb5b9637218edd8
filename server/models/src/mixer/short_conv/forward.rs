//! LFM2's short convolution: the in-projection to B, C and x; `B * x`
//! through a causal depthwise convolution carrying its last inputs per
//! sequence ([`causal_conv`], Mamba-2's); the output gated by C; the
//! out-projection. Every op is candle's, so it runs on any device.
//!
//! Spans run as the other recurrent mixers' do ([`over_runs`]): a prefill
//! span alone, decode rows together; each run's convolution states come
//! from and go back to its rows' slots of the [`StateStore`].

use candle_core::{DType, Tensor};

use super::spec::ShortConvSpec;
use crate::error::Result;
use crate::linear::{Linear, tensor_bytes};
use crate::mixer::recurrent::conv::causal_conv;
use crate::mixer::recurrent::over_runs;
use crate::seq_span::SeqSpan;
use crate::state_store::StateStore;

/// One short-convolution mixer's weights (vectors f32).
#[derive(Debug, Clone)]
pub struct ShortConvWeights {
    /// `[B | C | x]` from the normed input.
    pub in_proj: Linear,
    /// Its bias.
    pub in_bias: Option<Tensor>,
    /// The depthwise convolution, `(channels, kernel)`.
    pub conv: Tensor,
    /// Its bias, `channels`.
    pub conv_bias: Option<Tensor>,
    /// Back to the residual width.
    pub out_proj: Linear,
    /// Its bias.
    pub out_bias: Option<Tensor>,
}

impl ShortConvWeights {
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        self.in_proj.held_bytes()
            + self.out_proj.held_bytes()
            + tensor_bytes(&self.conv)
            + opt(&self.in_bias)
            + opt(&self.conv_bias)
            + opt(&self.out_bias)
    }

    /// The mixer over `h` `(tokens, hidden)` (normed) of layer `layer`,
    /// whose tokens are `spans`' in order; reads and writes the spans'
    /// convolution states in `state`.
    pub(crate) fn forward(
        &self,
        s: &ShortConvSpec,
        h: &Tensor,
        (layer, spans, state): (usize, &[SeqSpan], &StateStore),
    ) -> Result<Tensor> {
        let dtype = h.dtype();
        let mut proj = self.in_proj.forward(h)?.to_dtype(DType::F32)?;
        if let Some(b) = &self.in_bias {
            proj = proj.broadcast_add(b)?;
        }
        let c = s.channels;
        let gate_in = proj.narrow(1, 0, c)?;
        let gate_out = proj.narrow(1, c, c)?;
        let bx = (gate_in * proj.narrow(1, 2 * c, c)?)?;
        let conv = over_runs(spans, c, |run, r| {
            let held = state.read_conv(layer, run)?;
            let (out, next) =
                causal_conv(&r.take(&bx)?, &held, &self.conv, self.conv_bias.as_ref())?;
            state.write(layer, run, &next, None)?;
            Ok(out)
        })?;
        let y = (gate_out * conv)?;
        let mut out = self.out_proj.forward(&y.to_dtype(dtype)?)?;
        if let Some(b) = &self.out_bias {
            // The bias is f32; the output is in the model's compute type.
            out = out.broadcast_add(&b.to_dtype(out.dtype())?)?;
        }
        Ok(out)
    }
}
