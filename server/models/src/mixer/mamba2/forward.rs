//! Mamba-2's mixer: in-projection, a causal depthwise convolution carrying
//! its last inputs per sequence, the SSD scan with grouped B and C carrying
//! an SSM state per sequence, a gated RMSNorm, and the out-projection. Every
//! op is candle's, so it runs on any device.
//!
//! A step's spans run in runs: each prefill span alone (its tokens scanned
//! in blocks of the model's chunk, quadratic within a block and carrying the
//! state between blocks: the SSD form), consecutive single-token spans (the
//! decode rows) together as one batch, where the same form is one
//! recurrence step. States come from and go back to the rows' slots of the
//! [`StateStore`]. Gated DeltaNet (`crate::mixer::gdn`) runs its spans alike.

use candle_core::{D, DType, Tensor};

use super::scan;
use super::spec::SsmSpec;
use super::step::DecodeStep;
use crate::error::Result;
use crate::linear::{Linear, tensor_bytes};
use crate::mixer::recurrent::{conv, over_runs, softplus};
use crate::seq_span::SeqSpan;
use crate::state_store::StateStore;

/// One Mamba-2 mixer's weights (vectors f32).
#[derive(Debug, Clone)]
pub struct Mamba2Weights {
    /// `[z | x B C | dt]` from the normed input.
    pub in_proj: Linear,
    /// Its bias.
    pub in_bias: Option<Tensor>,
    /// The depthwise convolution, `(conv_dim, kernel)`.
    pub conv: Tensor,
    /// Its bias, `conv_dim`.
    pub conv_bias: Option<Tensor>,
    /// Added to each head's time step before the softplus.
    pub dt_bias: Tensor,
    /// Each head's decay rate `A = -exp(A_log)` (negative).
    pub a: Tensor,
    /// Each head's skip weight.
    pub d: Tensor,
    /// The gated RMSNorm's weight, `inner`.
    pub norm: Tensor,
    /// Back to the residual width.
    pub out_proj: Linear,
    /// Its bias.
    pub out_bias: Option<Tensor>,
}

impl Mamba2Weights {
    pub(crate) fn held_bytes(&self) -> u64 {
        let opt = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
        self.in_proj.held_bytes()
            + self.out_proj.held_bytes()
            + [&self.conv, &self.dt_bias, &self.a, &self.d, &self.norm]
                .into_iter()
                .map(tensor_bytes)
                .sum::<u64>()
            + opt(&self.in_bias)
            + opt(&self.conv_bias)
            + opt(&self.out_bias)
    }

    /// The mixer over `h` `(tokens, hidden)` (normed) of layer `layer`,
    /// whose tokens are `spans`' in order; reads and writes the spans'
    /// states in `state`.
    pub(crate) fn forward(
        &self,
        s: &SsmSpec,
        eps: f32,
        h: &Tensor,
        (layer, spans, state): (usize, &[SeqSpan], &StateStore),
    ) -> Result<Tensor> {
        let dtype = h.dtype();
        let mut proj = self.in_proj.forward(h)?.to_dtype(DType::F32)?;
        if let Some(b) = &self.in_bias {
            proj = proj.broadcast_add(b)?;
        }
        let (inner, conv_dim) = (s.inner(), s.conv_dim());
        let z = proj.narrow(1, 0, inner)?;
        let xbc = proj.narrow(1, inner, conv_dim)?;
        let dt = proj.narrow(1, inner + conv_dim, s.heads)?;
        let y = over_runs(spans, inner, |run, r| {
            self.run(s, (r.take(&xbc)?, r.take(&dt)?), (layer, run, state))
        })?;
        let y = gated_norm(&y, &z, &self.norm, s.groups, eps)?;
        let mut out = self.out_proj.forward(&y.to_dtype(dtype)?)?;
        if let Some(b) = &self.out_bias {
            out = out.broadcast_add(b)?;
        }
        Ok(out)
    }

    /// One run of `rows` spans of `len` tokens each: `xbc` `(rows, len,
    /// conv_dim)`, `dt` `(rows, len, heads)`; returns `y` `(rows, len, inner)`.
    fn run(
        &self,
        s: &SsmSpec,
        (xbc, dt): (Tensor, Tensor),
        (layer, run, state): (usize, &[SeqSpan], &StateStore),
    ) -> Result<Tensor> {
        let (rows, len, _) = xbc.dims3()?;
        // Decode rows on CPU step their states in place (step.rs).
        let in_place = len == 1 && xbc.device().is_cpu();
        let (conv_state, ssm_state) = match in_place {
            true => (state.read_conv(layer, run)?, None),
            false => state.read(layer, run).map(|(c, s)| (c, Some(s)))?,
        };
        let (conv, new_conv) =
            conv::causal_conv(&xbc, &conv_state, &self.conv, self.conv_bias.as_ref())?;
        let conv = candle_nn::ops::silu(&conv)?;
        let (inner, gn) = (s.inner(), s.groups * s.state);
        let x = conv
            .narrow(2, 0, inner)?
            .reshape((rows, len, s.heads, s.head_dim))?;
        let b = conv
            .narrow(2, inner, gn)?
            .reshape((rows, len, s.groups, s.state))?;
        let c = conv
            .narrow(2, inner + gn, gn)?
            .reshape((rows, len, s.groups, s.state))?;
        let dt = softplus(&dt.broadcast_add(&self.dt_bias)?)?
            .clamp(f64::from(s.dt_limit.0), f64::from(s.dt_limit.1))?;
        let skip = x.broadcast_mul(&self.d.reshape((1, 1, s.heads, 1))?)?;
        let Some(ssm_state) = ssm_state else {
            let y = self.step_in_place(s, (&x, &b, &c, &dt), (layer, run, state))?;
            state.write(layer, run, &new_conv, None)?;
            return Ok((y + skip)?.reshape((rows, len, inner))?);
        };
        let mut h = ssm_state.reshape((rows, s.heads, s.head_dim, s.state))?;
        let mut ys = Vec::new();
        let mut at = 0;
        while at < len {
            let n = s.chunk.min(len - at);
            let part = |t: &Tensor| t.narrow(1, at, n);
            let block = scan::Block {
                x: part(&x)?,
                b: part(&b)?,
                c: part(&c)?,
                dt: part(&dt)?,
            };
            let (y, next) = scan::ssd(&block, &self.a, &h, s.heads / s.groups)?;
            ys.push(y);
            h = next;
            at += n;
        }
        let y = (Tensor::cat(&ys, 1)? + skip)?;
        state.write(layer, run, &new_conv, Some(&h.reshape((rows, ()))?))?;
        Ok(y.reshape((rows, len, inner))?)
    }

    /// One token of each of `run`'s rows through the SSM, its state stepped
    /// in place in its slot; `y` `(rows, 1, heads, head_dim)` without the
    /// D skip.
    fn step_in_place(
        &self,
        s: &SsmSpec,
        (x, b, c, dt): (&Tensor, &Tensor, &Tensor, &Tensor),
        (layer, run, state): (usize, &[SeqSpan], &StateStore),
    ) -> Result<Tensor> {
        let flat = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let slots = run
            .iter()
            .map(|sp| {
                let slot = sp.state.ok_or_else(|| {
                    crate::error::Error::Input("a recurrent row without a state slot".into())
                })?;
                Ok((slot as usize, sp.start_pos == 0))
            })
            .collect::<Result<Vec<_>>>()?;
        let step = DecodeStep {
            slots,
            spec: *s,
            dt: flat(dt)?,
            a: flat(&self.a)?,
            x: flat(x)?,
            b: flat(b)?,
            c: flat(c)?,
            y: std::sync::Mutex::new(Vec::new()),
        };
        state.step_ssm(layer, &step)?;
        let y = step.y.into_inner().map_err(|_| {
            crate::error::Error::Input("a decode step's output was poisoned by a panic".into())
        })?;
        Ok(Tensor::from_vec(y, x.shape(), x.device())?)
    }
}

/// `rmsnorm(y * silu(z))` over each of `groups` equal slices of the width,
/// times `w` (Mamba-2's gated norm, the gate applied before the norm).
fn gated_norm(y: &Tensor, z: &Tensor, w: &Tensor, groups: usize, eps: f32) -> Result<Tensor> {
    let (tokens, width) = y.dims2()?;
    let g = (y * candle_nn::ops::silu(z)?)?.reshape((tokens, groups, width / groups))?;
    let rms = (g.sqr()?.mean_keepdim(D::Minus1)? + f64::from(eps))?.sqrt()?;
    Ok(g.broadcast_div(&rms)?
        .reshape((tokens, width))?
        .broadcast_mul(w)?)
}
