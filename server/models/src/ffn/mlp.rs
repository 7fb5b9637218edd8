//! The MLP: gated, `down(act(gate(x)) * up(x))` (a dense decoder layer's
//! feed-forward, or one expert's), or plain, `down(act(up(x)))` with
//! biases (an encoder's); its weights, their loaders and its forward.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::ffn::activation::Activation;
use crate::linear::{Linear, tensor_bytes};
use crate::lora::{LoraHook, Target};
use crate::projection::{Projection, single};
use crate::weights::source::WeightSource;

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

    /// The plain MLP over `h`: `down(act(up(h) + b) ) + b` (its
    /// `gate_up` holds up alone).
    pub(crate) fn forward_plain(&self, h: &Tensor, act: Activation) -> Result<Tensor> {
        let mut u = self.gate_up.forward(h)?;
        if let Some(b) = &self.gate_up_bias {
            u = u.broadcast_add(b)?;
        }
        let a = act.apply(&u)?;
        let mut d = self.down.forward(&a)?;
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
        Activation::Gelu => (crate::ffn::activation::gelu_erf(&gate)? * up)?,
        Activation::Relu2 => (gate.relu()?.sqr()? * up)?,
        Activation::SwigluOai { alpha, limit } => {
            let limit = f64::from(limit);
            let gate = gate.minimum(limit)?;
            let up = up.clamp(-limit, limit)?;
            let glu = (&gate * candle_nn::ops::sigmoid(&(&gate * f64::from(alpha))?)?)?;
            ((up + 1.0)? * glu)?
        }
    })
}

/// Layer `i`'s gated MLP of width `inter` (`suffix`: `""`, or `_shexp`
/// for a shared expert); gate and up as two tensors or one `ffn_up`.
pub(crate) fn load(
    src: &mut dyn WeightSource,
    i: usize,
    suffix: &str,
    (hidden, inter): (usize, usize),
    device: &Device,
) -> Result<Mlp> {
    let n = |s: &str| format!("blk.{i}.{s}{suffix}.weight");
    // Phi-3 stores gate and up as one `ffn_up`.
    let gate_up = if src.has(&n("ffn_gate")) {
        let (gate, up) = (n("ffn_gate"), n("ffn_up"));
        src.projection(&[(&gate, inter), (&up, inter)], hidden, device)?
    } else {
        src.projection(&[(&n("ffn_up"), 2 * inter)], hidden, device)?
    };
    Ok(Mlp {
        gate_up,
        down: single(src.projection(&[(&n("ffn_down"), hidden)], inter, device)?),
        gate_up_bias: None,
        down_bias: None,
    })
}

/// Layer `i`'s plain MLP of width `inter` (`suffix`: `""`, or `_shexp`
/// for a shared expert): `ffn_up` and `ffn_down`, each with its bias
/// where stored.
pub(crate) fn load_plain(
    src: &mut dyn WeightSource,
    i: usize,
    suffix: &str,
    (hidden, inter): (usize, usize),
    device: &Device,
) -> Result<Mlp> {
    let n = |s: &str| {
        let (name, kind) = s.rsplit_once('.').unwrap_or((s, "weight"));
        format!("blk.{i}.{name}{suffix}.{kind}")
    };
    let mut bias = |name: String, len: usize| match src.has(&name) {
        true => src.vector(&name, len, device).map(Some),
        false => Ok(None),
    };
    let (up_bias, down_bias) = (
        bias(n("ffn_up.bias"), inter)?,
        bias(n("ffn_down.bias"), hidden)?,
    );
    Ok(Mlp {
        gate_up: src.projection(&[(&n("ffn_up.weight"), inter)], hidden, device)?,
        down: single(src.projection(&[(&n("ffn_down.weight"), hidden)], inter, device)?),
        gate_up_bias: up_bias,
        down_bias,
    })
}
